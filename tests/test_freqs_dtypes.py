"""Angle tables of another float dtype, as TransformerEngine takes them: its fused function
converts them to float32 first (``FusedRoPEFunc``: ``if freqs.dtype != torch.float32: freqs =
freqs.float()``), and its unfused formula takes cos/sin in the table's dtype. A model cast to
bf16 casts ``RotaryPositionEmbedding``'s ``inv_freq`` buffer with it, so such tables reach RoPE.
"""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, randn
from rope_kernels import (RotaryPositionEmbedding, apply_fused_qkv_rotary_pos_emb,
                          apply_rotary_pos_emb)

S, B, H, D = 12, 2, 3, 32
OTHER_DTYPES = [torch.bfloat16, torch.float16, torch.float64]


def _table(rows=S, dim=D, rotary_percent=1.0, interleaved=False, base=10000.0):
    # Large positions (offset 900), so that a 16-bit table's rounding of the angles shows.
    return RotaryPositionEmbedding(dim, rotary_percent=rotary_percent, interleaved=interleaved,
                                   rotary_base=base, device=DEVICE)(rows, offset=900)


def _t(tensor_format, dtype):
    shape = {"sbhd": (S, B, H, D), "bshd": (B, S, H, D), "thd": (S, H, D)}[tensor_format]
    return randn(shape, dtype)


@pytest.mark.parametrize("freqs_dtype", OTHER_DTYPES, ids=str)
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
@pytest.mark.parametrize("kernel", ["2d", "1d"])
def test_fused_converts_to_float32(freqs_dtype, tensor_format, interleaved, kernel):
    """The fused call with a table of another float dtype gives the bits of the call with that
    table converted to float32, leaves the caller's table as it was, and does so again on the
    repeated calls that take the shortcut."""
    t = _t(tensor_format, torch.bfloat16)
    freqs = _table(rotary_percent=0.5, interleaved=interleaved).to(freqs_dtype)
    given = freqs.clone()
    kw = dict(tensor_format=tensor_format, interleaved=interleaved, fused=True, kernel=kernel,
              cu_seqlens=torch.tensor([0, 5, 5, S], dtype=torch.int32, device=DEVICE)
              if tensor_format == "thd" else None)
    want = apply_rotary_pos_emb(t, freqs.float(), **kw)
    for _ in range(3):  # the full path, then the shortcut, then its armed launch
        assert torch.equal(apply_rotary_pos_emb(t, freqs, **kw), want)
    assert freqs.dtype == freqs_dtype and torch.equal(freqs, given)
    if freqs_dtype != torch.float64:  # the conversion is not a no-op: the rounding shows
        assert not torch.equal(want, apply_rotary_pos_emb(t, _table(
            rotary_percent=0.5, interleaved=interleaved), **kw))


@pytest.mark.parametrize("freqs_dtype", OTHER_DTYPES, ids=str)
def test_fused_gradient_with_another_float_dtype(freqs_dtype):
    freqs, x, dy = _table().to(freqs_dtype), _t("sbhd", torch.float32), _t("sbhd", torch.float32)
    grads = []
    for table in (freqs, freqs.float()):
        t = x.clone().requires_grad_(True)
        out = apply_rotary_pos_emb(t, table, fused=True)
        (grad,) = torch.autograd.grad(out, t, dy)
        grads.append((out.detach(), grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def _te_formula(t, freqs):
    """TransformerEngine's unfused formula (sbhd, half-split, the whole head rotated), written
    out: cos/sin in the table's dtype, then cast to t's."""
    cos_, sin_ = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    x1, x2 = t.chunk(2, dim=-1)
    return t * cos_ + torch.cat((-x2, x1), dim=-1) * sin_


@pytest.mark.parametrize("freqs_dtype", [torch.bfloat16, torch.float16, torch.float32],
                         ids=str)
@pytest.mark.parametrize("t_dtype", [torch.float32, torch.bfloat16], ids=str)
def test_unfused_takes_cos_sin_in_the_tables_dtype(freqs_dtype, t_dtype):
    t, freqs = _t("sbhd", t_dtype), _table().to(freqs_dtype)
    assert torch.equal(apply_rotary_pos_emb(t, freqs, fused=False), _te_formula(t, freqs))


@pytest.mark.parametrize("freqs_dtype", OTHER_DTYPES, ids=str)
@pytest.mark.parametrize("one_table", [True, False], ids=["q_freqs is k_freqs", "two tables"])
def test_fused_qkv_converts_to_float32(freqs_dtype, one_table):
    qkv = randn((S, B, 2, 2 * D + D + D), torch.bfloat16)  # 2 groups of 2 q heads, k, v
    q_freqs = _table().to(freqs_dtype)
    k_freqs = q_freqs if one_table else _table(base=500.0).to(freqs_dtype)
    splits = [2 * D, D, D]
    want = apply_fused_qkv_rotary_pos_emb(qkv, q_freqs.float(), k_freqs.float(), splits)
    for _ in range(3):
        got = apply_fused_qkv_rotary_pos_emb(qkv, q_freqs, k_freqs, splits)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert q_freqs.dtype == k_freqs.dtype == freqs_dtype


def test_compiled_calls_convert_too():
    """Under torch.compile(fullgraph=True) the conversion is traced with the call (aot_eager on
    a CPU, Inductor on a GPU): the same bits as eager, no graph break."""
    torch._dynamo.reset()
    backend = "inductor" if ON_GPU else "aot_eager"
    table = _table().bfloat16()

    def calls(t, qkv):
        return (apply_rotary_pos_emb(t, table, fused=True),
                *apply_fused_qkv_rotary_pos_emb(qkv, table, table, [2 * D, D, D]))

    t, qkv = _t("sbhd", torch.bfloat16), randn((S, B, 2, 4 * D), torch.bfloat16)
    compiled = torch.compile(calls, fullgraph=True, backend=backend)
    for got, want in zip(compiled(t, qkv), calls(t, qkv), strict=True):
        assert torch.equal(got, want)
