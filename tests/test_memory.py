"""Writes land exactly where they should: every output element is written, nothing around it is.

The output is a window inside a larger NaN-filled buffer: after the call the window must hold no
NaN (every element written) and the margins must still be all NaN (no stray writes). The GPU
compiler does not bounds-check either, and the interpreter is lenient about out-of-range
accesses, so this is the check that catches a wrong mask on both.
"""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, randn
from rope_kernels import (RotaryPositionEmbedding, apply_rotary_pos_emb, rope_1d, rope_2d,
                          rope_reference)

MARGIN = 97  # elements of poison on each side of the output window


def _poisoned_out(shape, dtype, strides=None):
    numel = int(torch.tensor(shape).prod())
    span = numel if strides is None else sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    buf = torch.full((span + 2 * MARGIN,), float("nan"), dtype=dtype, device=DEVICE)
    if strides is None:
        out = buf[MARGIN:MARGIN + numel].view(shape)
    else:
        out = torch.as_strided(buf, shape, strides, MARGIN)
    return buf, out


def _assert_margins_untouched(buf):
    assert torch.isnan(buf[:MARGIN]).all(), "a write landed before the output"
    assert torch.isnan(buf[-MARGIN:]).all(), "a write landed after the output"


CASES = [
    # (format, shape, rotary_dim, kwargs)
    ("sbhd", (7, 3, 5, 24), 12, {}),
    ("sbhd", (7, 3, 5, 24), 24, {"interleaved": True}),
    ("bshd", (2, 9, 3, 10), 6, {}),
    ("thd", (19, 3, 14), 8, {"cu_seqlens": [0, 1, 8, 8, 19]}),
    ("thd", (10, 2, 8), 8, {"cu_seqlens": [0, 4, 12, 20], "cp_size": 2, "cp_rank": 1}),
]


@pytest.mark.parametrize("launcher", [rope_1d, rope_2d], ids=["1d", "2d"])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,shape,rotary_dim,kw", CASES)
def test_every_element_written_and_nothing_else(launcher, backward, dtype, fmt, shape, rotary_dim,
                                                kw, seed):
    kw = dict(kw)
    if "cu_seqlens" in kw:
        kw["cu_seqlens"] = torch.tensor(kw["cu_seqlens"], dtype=torch.int32, device=DEVICE)
    t = randn(shape, dtype, seed)
    emb = RotaryPositionEmbedding(rotary_dim, interleaved=kw.get("interleaved", False),
                                  device=DEVICE)(40)
    buf, out = _poisoned_out(shape, dtype)
    result = launcher(t, emb, fmt, out=out, backward=backward, **kw)
    assert result.data_ptr() == out.data_ptr()
    _assert_margins_untouched(buf)
    assert not torch.isnan(out).any(), "some output elements were never written"
    if not backward:
        assert_rope_close(out, rope_reference(t.double(), emb, fmt, **kw), dtype)


@pytest.mark.parametrize("launcher", [rope_1d, rope_2d], ids=["1d", "2d"])
def test_strided_output_gaps_untouched(launcher, seed):
    """An output with gaps between rows: the gaps keep their poison."""
    shape = (5, 2, 3, 8)
    strides = (2 * 3 * 16, 3 * 16, 16, 1)  # each head row has 8 unused elements after it
    t = randn(shape, torch.float32, seed)
    emb = RotaryPositionEmbedding(8, 0.5, device=DEVICE)(5)
    buf, out = _poisoned_out(shape, torch.float32, strides)
    launcher(t, emb, out=out)
    _assert_margins_untouched(buf)
    written = torch.zeros_like(buf, dtype=torch.bool)
    torch.as_strided(written, shape, strides, MARGIN).fill_(True)
    assert torch.isnan(buf[~written]).all(), "a write landed in a gap of the strided output"
    assert not torch.isnan(buf[written]).any()


@pytest.mark.parametrize("kernel", ["1d", "2d"])
def test_input_never_modified_and_output_is_new(kernel, seed):
    t = randn((6, 2, 3, 16), torch.float16, seed).requires_grad_(True)
    before = t.detach().clone()
    emb = RotaryPositionEmbedding(16, device=DEVICE)(6)
    out = apply_rotary_pos_emb(t, emb, fused=True, kernel=kernel)
    out.sum().backward()
    assert torch.equal(t.detach(), before)
    assert out.data_ptr() != t.data_ptr() and out.is_contiguous()


@pytest.mark.skipif(not ON_GPU, reason="needs > 2**31 elements on a GPU")
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["1d", "2d"])
def test_more_than_2_31_elements(kernel):
    """64-bit offsets: a bfloat16 tensor of 2**31 + 2**20 elements (4 GiB), checked at its end."""
    s, b, h, d = 2049, 64, 128, 128  # 2049 * 64 * 128 * 128 = 2**31 + 2**20 elements
    assert s * b * h * d > 2**31
    g = torch.Generator(device="cuda").manual_seed(0)
    t = torch.randn((s, b, h, d), device="cuda", dtype=torch.bfloat16, generator=g)
    emb = RotaryPositionEmbedding(d, device=DEVICE)(s)
    out = apply_rotary_pos_emb(t, emb, fused=True, kernel=kernel)
    # The last positions live past element 2**31: check them, and a slice at the start.
    for rows in (slice(s - 2, s), slice(0, 2)):
        ref = rope_reference(t[rows].double(), emb[rows])
        assert_rope_close(out[rows], ref, torch.bfloat16, f"rows {rows}")
    del out, t
    torch.cuda.empty_cache()
