"""The README's Python blocks run as written, on the names they leave to the reader, and give the
rotation they promise (against the float64 reference, on fresh random inputs): a reader copies
them first. A new block fails here until it gets its inputs and its check."""

from __future__ import annotations

import re

import pytest
import torch

import rope_kernels.hf
from rope_kernels.reference import (cos_sin_cache_reference, mrope_cos_sin_cache_reference,
                                    rope_reference)

from conftest import DEVICE, ROOT, assert_rope_close, hf_reference, randn

BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)


def block(first_line: str) -> str:
    """The README's one Python block that starts with ``first_line``."""
    found = [b for b in BLOCKS if b.startswith(first_line)]
    assert len(found) == 1, (first_line, [b.splitlines()[0] for b in BLOCKS])
    return found[0]


FIRST_LINES = ["from rope_kernels import RotaryPositionEmbedding, apply_rotary_pos_emb",
               "import transformers.models.llama.modeling_llama as llama",
               "from rope_kernels import apply_rope_with_cos_sin_cache_inplace",
               "from rope_kernels import apply_mrope_with_cos_sin_cache_inplace"]


def test_every_block_is_checked_here():
    assert sorted(b.splitlines()[0] for b in BLOCKS) == sorted(FIRST_LINES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_te_style_block(dtype):
    """Each of its three calls rotates ``t`` ([s, b, h, d], sbhd) by the table it builds: the
    kernels within the dtype's tolerance of the float64 rotation, the naive call as TE's formula."""
    head_dim, max_seq_len = 32, 12
    t = randn((max_seq_len, 3, 4, head_dim), dtype)
    outs = []
    scope = {"head_dim": head_dim, "max_seq_len": max_seq_len, "t": t}
    for line in block(FIRST_LINES[0]).splitlines():
        exec(line, scope)  # noqa: S102 (the README's own lines)
        if line.startswith("out ="):
            outs.append(scope["out"])
    assert len(outs) == 3
    freqs = scope["freqs"]
    assert freqs.shape == (max_seq_len, 1, 1, head_dim) and freqs.dtype == torch.float32
    ref = rope_reference(t.double(), freqs, "sbhd")
    for what, out in zip(("2-D kernel", "1-D kernel"), outs):
        assert out.dtype == dtype and out.shape == t.shape, what
        assert_rope_close(out, ref, dtype, what)
    # TE's unfused formula rounds every product to t's dtype, as TE's own does: it is the
    # reference's formula run in that dtype, not within one ulp of the exact rotation
    assert torch.equal(outs[2], rope_reference(t, freqs, "sbhd"))


def test_hugging_face_block(monkeypatch):
    """The assignment puts ours in Llama's module, and the name the attention calls then gives
    transformers' results."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    monkeypatch.setattr(llama, "apply_rotary_pos_emb", llama.apply_rotary_pos_emb)  # restored after
    exec(block(FIRST_LINES[1]), {})  # noqa: S102
    assert llama.apply_rotary_pos_emb is rope_kernels.hf.apply_rotary_pos_emb
    b, heads, kv_heads, s, d = 2, 4, 2, 6, 16
    q, k = randn((b, heads, s, d)), randn((b, kv_heads, s, d))
    cos, sin = randn((b, s, d)), randn((b, s, d))
    q_out, k_out = llama.apply_rotary_pos_emb(q, k, cos, sin)
    cos64, sin64 = cos.double(), sin.double()
    assert_rope_close(q_out, hf_reference(q.double(), cos64, sin64), torch.float32, "q")
    assert_rope_close(k_out, hf_reference(k.double(), cos64, sin64), torch.float32, "k")


@pytest.mark.parametrize("is_neox", [True, False])
def test_serving_block(is_neox):
    """The in-place call rotates the step's q and k views where they lie, by their positions'
    rows of the cache, and leaves the rest of the buffer alone."""
    tokens, heads, kv_heads, head_size, rotary_dim, max_position = 5, 4, 2, 16, 8, 32
    angles = torch.rand(max_position, rotary_dim // 2, dtype=torch.float64, device=DEVICE) * 6
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float()
    positions = torch.randperm(max_position, device=DEVICE)[:tokens]
    qkv = randn((tokens, (heads + 2 * kv_heads) * head_size), torch.bfloat16)
    q, k = qkv[:, :heads * head_size], qkv[:, heads * head_size:(heads + kv_heads) * head_size]
    before = qkv.clone()
    scope = {"positions": positions, "q": q, "k": k, "head_size": head_size,
             "cos_sin_cache": cos_sin_cache}
    exec(block(FIRST_LINES[2]).replace("is_neox=True", f"is_neox={is_neox}"), scope)  # noqa: S102
    for what, x, x0 in (("q", q, before[:, :heads * head_size]),
                        ("k", k, before[:, heads * head_size:(heads + kv_heads) * head_size])):
        ref = cos_sin_cache_reference(positions, x0, head_size, cos_sin_cache, is_neox)
        assert_rope_close(x, ref, torch.bfloat16, what)
    v = slice((heads + kv_heads) * head_size, None)
    assert torch.equal(qkv[:, v], before[:, v]), "v was written"


def test_mrope_block(seed):
    """The M-RoPE call rotates the step's q and k views where they lie, each pair by the cache row
    of its section's position (T, H or W; sections [16, 24, 24] of 64 pairs), and leaves the
    rest of the buffer alone."""
    tokens, heads, kv_heads, head_size, max_position = 6, 2, 1, 128, 40
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(max_position, head_size // 2, dtype=torch.float64, generator=g) * 6
    cos_sin_cache = torch.cat((angles.cos(), angles.sin()), dim=-1).float().to(DEVICE)
    positions_thw = torch.randint(0, max_position, (3, tokens), generator=g).to(DEVICE)
    qkv = randn((tokens, (heads + 2 * kv_heads) * head_size), torch.bfloat16, seed)
    q, k = qkv[:, :heads * head_size], qkv[:, heads * head_size:(heads + kv_heads) * head_size]
    before = qkv.clone()
    scope = {"positions_thw": positions_thw, "q": q, "k": k, "head_size": head_size,
             "cos_sin_cache": cos_sin_cache}
    exec(block(FIRST_LINES[3]), scope)  # noqa: S102
    for what, x, x0 in (("q", q, before[:, :heads * head_size]),
                        ("k", k, before[:, heads * head_size:(heads + kv_heads) * head_size])):
        ref = mrope_cos_sin_cache_reference(positions_thw, x0, head_size, cos_sin_cache,
                                            [16, 24, 24])
        assert_rope_close(x, ref, torch.bfloat16, what)
    v = slice((heads + kv_heads) * head_size, None)
    assert torch.equal(qkv[:, v], before[:, v]), "v was written"
