"""Checks the solutions of notebook 06 (notebooks/solutions/06_rope_in_a_real_model.py): the swap
against transformers' own model, graph-break counting against torch._dynamo, and the latency
budget against the recorded run."""

import json

import pytest
import torch

from conftest import DEVICE, ROOT, load_solution

sol = load_solution("06_rope_in_a_real_model")
transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
from transformers.models.llama import modeling_llama  # noqa: E402

import rope_kernels  # noqa: E402
from rope_kernels import RotaryPositionEmbedding, apply_rotary_pos_emb  # noqa: E402


def _tiny_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "eager"
    return transformers.LlamaForCausalLM(config).to(DEVICE), config


def test_swap_rope_uses_ours_matches_and_restores():
    model, config = _tiny_llama()
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    original = modeling_llama.apply_rotary_pos_emb
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with sol.swap_rope(modeling_llama) as calls:
            assert modeling_llama.apply_rotary_pos_emb is not original
            got = model(input_ids=ids).logits
    assert len(calls) == config.num_hidden_layers
    assert modeling_llama.apply_rotary_pos_emb is original
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_swap_rope_restores_after_an_error():
    original = modeling_llama.apply_rotary_pos_emb
    with pytest.raises(RuntimeError):
        with sol.swap_rope(modeling_llama):
            raise RuntimeError("inside the block")
    assert modeling_llama.apply_rotary_pos_emb is original


def test_swap_rope_with_a_wrong_replacement_changes_the_logits():
    """The check is able to fail: a 'RoPE' that does nothing gives other logits."""
    model, _ = _tiny_llama()
    ids = torch.randint(0, 64, (1, 9), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with sol.swap_rope(modeling_llama, lambda q, k, cos, sin, unsqueeze_dim=1: (q, k)):
            got = model(input_ids=ids).logits
    assert not torch.allclose(got, expected, rtol=1e-3, atol=1e-3)


def test_count_graph_breaks():
    emb = RotaryPositionEmbedding(16, device=DEVICE)(8)
    t = torch.randn(8, 2, 2, 16, device=DEVICE)
    assert sol.count_graph_breaks(lambda t: apply_rotary_pos_emb(t, emb, fused=True), t) == (0, 1)

    def host_copy(t):
        n = int(t.sum() > 0)  # data-dependent Python: a graph break
        return t * 2 + n

    breaks, graphs = sol.count_graph_breaks(host_copy, t)
    assert breaks >= 1 and graphs >= 2


def test_latency_budget_adds_up_on_the_recorded_run():
    rows = json.loads((ROOT / "figures" / "launch_latency.json").read_text())["us_per_call"]
    for with_start in (True, False):
        b = sol.latency_budget(rows, with_start)
        assert b["parts"][:2] == ["Triton's launcher", "thin-launch wrapper"]
        assert len(b["parts"]) == (5 if with_start else 3)
        assert sum(b[p] for p in b["parts"]) == pytest.approx(b["total, default call"])
        assert all(b[p] > 0 for p in b["parts"]), b
        assert b["CUDA-graph replay"] < b["total, default call"]
