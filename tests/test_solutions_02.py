"""Checks the solutions of notebook 02 (notebooks/solutions/02_naive_pytorch_rope.py).

The module is loaded by conftest.load_solution (its file name starts with a digit). Byte
counts are checked against an independent count: every ATen operation that ``rope_reference``
really runs is intercepted (TorchDispatchMode) and the sizes of its tensor inputs and outputs
are added up, views excepted.
"""


import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from conftest import load_solution

from conftest import DEVICE, assert_rope_close, randn  # noqa: E402
from rope_kernels import (RotaryPositionEmbedding, apply_rotary_pos_emb,  # noqa: E402
                          rope_reference)

sol = load_solution("02_naive_pytorch_rope")


class OpRecorder(TorchDispatchMode):
    """Records every ATen op that runs, and the bytes read and written by those that move data:
    the sizes of their tensor operands and results. Views (results that alias an input without
    writing it, per the op's schema) and allocations move nothing."""

    def __init__(self):
        super().__init__()
        self.ops, self.bytes = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        self.ops.append(name)
        returns = func._schema.returns
        is_view = bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                        for r in returns)
        if not is_view and not name.startswith("empty"):
            ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
            self.bytes += sum(x.numel() * x.element_size() for x in ins + outs)
        return out


def _table(d2, rows, interleaved=False):
    return RotaryPositionEmbedding(d2, interleaved=interleaved, device=DEVICE)(rows)


# ---------------------------------------------------------------- exercise 1: rope_no_cat


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("shape,d2", [((6, 2, 3, 16), 16), ((5, 3, 2, 24), 12), ((4, 1, 1, 8), 2)])
def test_rope_no_cat_float64_matches_reference(shape, d2, interleaved):
    t = randn(shape, torch.float64, seed=1)
    freqs = _table(d2, shape[0] + 3, interleaved)
    out = sol.rope_no_cat(t, freqs, interleaved)
    ref = rope_reference(t, freqs, "sbhd", interleaved=interleaved)
    assert out.shape == t.shape and out.dtype == t.dtype
    assert (out - ref).abs().max().item() < 1e-12
    assert torch.equal(out[..., d2:], t[..., d2:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_no_cat_low_precision(dtype):
    t = randn((7, 2, 3, 32), dtype, seed=2)
    freqs = _table(16, 7)
    out = sol.rope_no_cat(t, freqs)
    # Like the unfused formula, it rounds cos/sin and the products to the dtype: each output
    # is within a few eps of the exact result, relative to the largest |x| of its row.
    exact = rope_reference(t.double(), freqs, "sbhd")
    bound = 3 * torch.finfo(dtype).eps * t.double().abs().amax(-1, keepdim=True)
    assert ((out.double() - exact).abs() <= bound).all()
    formula = rope_reference(t, freqs, "sbhd")  # the bound holds for the formula itself
    assert ((formula.double() - exact).abs() <= bound).all()
    assert not torch.equal(out[1:], t[1:])  # it did rotate


def test_rope_no_cat_strided_input_and_output():
    base = randn((3, 6, 2, 16), torch.float64, seed=3)
    t = base.transpose(0, 1)  # [6, 3, 2, 16] sbhd view, not contiguous
    freqs = _table(8, 6)
    buf = torch.full((3, 6, 2, 16), float("nan"), dtype=torch.float64, device=DEVICE)
    out = buf.transpose(0, 1)
    result = sol.rope_no_cat(t, freqs, out=out)
    assert result.data_ptr() == out.data_ptr()
    assert not torch.isnan(buf).any(), "some output elements were never written"
    assert (out - rope_reference(t, freqs, "sbhd")).abs().max().item() < 1e-12


def test_rope_no_cat_runs_no_concatenation():
    t = randn((4, 2, 2, 16), torch.float32, seed=4)
    freqs = _table(8, 4)
    with OpRecorder() as rec:
        sol.rope_no_cat(t, freqs)
    assert not {"cat", "stack"} & set(rec.ops), rec.ops
    with OpRecorder() as ref_rec:  # the guard itself: the reference does concatenate
        rope_reference(t, freqs, "sbhd")
    assert "cat" in ref_rec.ops


# ---------------------------------------------------------------- exercise 2: unfused_bytes


def _measured_bytes(shape, d2, dtype, interleaved):
    t = randn(shape, dtype, seed=5)
    freqs = _table(d2, shape[0], interleaved)
    rope_reference(t, freqs, "sbhd", interleaved=interleaved)  # warm-up outside the count
    with OpRecorder() as rec:
        rope_reference(t, freqs, "sbhd", interleaved=interleaved)
    return rec.bytes


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("shape,d2", [((8, 2, 3, 16), 16), ((5, 3, 2, 24), 8), ((3, 1, 4, 64), 32)])
def test_unfused_bytes_matches_intercepted_ops(shape, d2, dtype, interleaved):
    s, b, h, d = shape
    expected = _measured_bytes(shape, d2, dtype, interleaved)
    assert sol.unfused_bytes(s, b, h, d, d2, dtype, interleaved) == expected


def test_unfused_bytes_te_default_by_hand():
    s, b, h, d = 4096, 16, 32, 128
    n, table = s * b * h * d, s * d  # elements of t, of the angle table
    # Six bf16 passes over t (2 bytes each, read and write) and the small table ops.
    assert sol.unfused_bytes(s, b, h, d) == 24 * n + 32 * table
    minimum = 2 * 2 * n + 4 * table  # read t, write out, read the float32 table once
    assert 5.9 < sol.unfused_bytes(s, b, h, d) / minimum < 6.1
    assert isinstance(sol.unfused_bytes(s, b, h, d), int)


def test_unfused_bytes_default_rotary_dim_is_head_dim():
    assert sol.unfused_bytes(16, 2, 4, 64) == sol.unfused_bytes(16, 2, 4, 64, 64)
    assert sol.unfused_bytes(16, 2, 4, 64, 32) < sol.unfused_bytes(16, 2, 4, 64, 64)


# ---------------------------------------------------------------- exercise 3: rope_thd_by_loop


def _per_token(t, freqs, cu, interleaved, starts=None):
    """Independent thd: gather one table row per token, then one vectorised formula."""
    cu = cu.tolist()
    pos = []
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        start = 0 if starts is None else int(starts[i])
        pos += [start + k for k in range(b - a)]
    f = freqs[torch.tensor(pos, device=freqs.device), 0, 0].to(torch.float64)[:, None, :]  # [t, 1, d2]
    d2 = f.shape[-1]
    x = t.double()
    x_rot = x[..., :d2]
    if interleaved:
        rot = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), -1).flatten(-2)
    else:
        rot = torch.cat((-x_rot[..., d2 // 2:], x_rot[..., : d2 // 2]), -1)
    return torch.cat((x_rot * f.cos() + rot * f.sin(), x[..., d2:]), -1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("cu,d2", [([0, 3, 8, 10], 16), ([0, 5, 5, 6, 13], 8), ([0, 1], 16)])
def test_rope_thd_by_loop(cu, d2, interleaved):
    cu = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
    t = randn((int(cu[-1]), 3, 16), torch.float64, seed=6)
    freqs = _table(d2, 16, interleaved)
    out = sol.rope_thd_by_loop(t, freqs, cu, interleaved)
    assert out.shape == t.shape
    assert (out - _per_token(t, freqs, cu, interleaved)).abs().max().item() < 1e-12
    ref = rope_reference(t, freqs, "thd", interleaved=interleaved, cu_seqlens=cu)
    assert (out - ref).abs().max().item() < 1e-12


def test_rope_thd_by_loop_start_positions_and_fused_kernel():
    cu = torch.tensor([0, 4, 6, 11], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([2, 0, 7], dtype=torch.int32, device=DEVICE)
    freqs = _table(8, 24)
    t32 = randn((11, 2, 12), torch.float32, seed=7)
    out = sol.rope_thd_by_loop(t32.double(), freqs, cu, start_positions=starts)
    assert (out - _per_token(t32, freqs, cu, False, starts.tolist())).abs().max().item() < 1e-12
    fused = apply_rotary_pos_emb(t32, freqs, "thd", start_positions=starts, fused=True,
                                 cu_seqlens=cu)
    assert_rope_close(fused, out, torch.float32)
