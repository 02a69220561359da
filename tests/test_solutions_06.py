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


def test_complex_tables_are_views_that_rotate_as_llama_4():
    """Exercise 4: cos and sin share the angles' memory (changing the angles in place changes
    them), have a stride of 2, sin starts one element on; the q+k call of GPT-OSS's interleaved
    pairs on them gives the bits of ``apply_rotary_emb_llama4`` and transformers' Llama 4 result
    within rounding. A copy (``freqs_cis.real.contiguous()``) would fail the first check."""
    import rope_kernels.hf
    from transformers.models.llama4 import modeling_llama4

    g = torch.Generator().manual_seed(6)
    freqs = torch.polar(torch.rand((2, 5, 8), generator=g) + 0.5,
                        torch.randn((2, 5, 8), generator=g) * 3).to(DEVICE)
    cos, sin, offset = sol.complex_tables(freqs)
    assert offset == 1 and cos.shape == sin.shape == freqs.shape
    assert cos.stride()[-1] == sin.stride()[-1] == 2
    torch.testing.assert_close(torch.complex(cos, sin), freqs, rtol=0, atol=0)
    before = cos.clone()
    freqs.mul_(torch.polar(torch.ones(()), torch.tensor(0.3)).to(DEVICE))  # the views follow
    assert not torch.equal(cos, before)
    torch.testing.assert_close(torch.complex(cos, sin), freqs, rtol=0, atol=0)
    xq = torch.randn((2, 5, 4, 16), generator=g).to(DEVICE)
    xk = torch.randn((2, 5, 2, 16), generator=g).to(DEVICE)
    ours = rope_kernels.hf.apply_rotary_pos_emb_gpt_oss_interleaved(xq, xk, cos, sin,
                                                                   unsqueeze_dim=2)
    for a, b in zip(ours, rope_kernels.hf.apply_rotary_emb_llama4(xq, xk, freqs)):
        assert torch.equal(a, b)
    for a, b in zip(ours, modeling_llama4.apply_rotary_emb(xq, xk, freqs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
