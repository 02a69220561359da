"""Bad input raises TypeError/ValueError whose message names the argument and what was given."""

from __future__ import annotations

import re

import pytest
import torch

from conftest import DEVICE, randn
from rope_kernels import RotaryPositionEmbedding, _validate, apply_rotary_pos_emb

S, B, H, D = 8, 2, 3, 16


def _t(shape=(S, B, H, D), dtype=torch.float32):
    return randn(shape, dtype, seed=11)


def _emb(rows=S, dim=D):
    return RotaryPositionEmbedding(dim, device=DEVICE)(rows)


def _cu(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


# (id, kwargs for apply_rotary_pos_emb, exception, words the message must contain)
CASES = [
    ("t not a tensor", dict(t=[[1.0]]), TypeError, ["t must be a torch.Tensor", "list"]),
    ("integer t", dict(t=torch.ones(S, B, H, D, dtype=torch.int32, device=DEVICE)), TypeError,
     ["t must have", "dtype", "torch.int32"]),
    ("float64 t on the kernel path", dict(t=_t(dtype=torch.float64)), TypeError,
     ["t must have dtype float32, float16 or bfloat16", "torch.float64"]),
    ("unknown layout", dict(tensor_format="shbd"), ValueError, ["tensor_format", "'shbd'"]),
    ("3-D t for sbhd", dict(t=_t((S, H, D))), ValueError, ["t must be 4-D", "(8, 3, 16)"]),
    ("4-D t for thd", dict(tensor_format="thd", cu_seqlens=_cu([0, S])), ValueError,
     ["t must be 3-D", "(8, 2, 3, 16)"]),
    ("integer angles", dict(freqs=torch.ones(S, 1, 1, D, dtype=torch.int32, device=DEVICE)),
     TypeError, ["freqs must be a floating-point tensor of angles", "torch.int32"]),
    ("angles not a tensor", dict(freqs=3.0), TypeError, ["freqs must be a torch.Tensor", "3.0"]),
    ("angle table of wrong rank", dict(freqs=_emb().view(S, D)), ValueError,
     ["freqs must have shape [max_seq_len, 1, 1, rotary_dim]", "(8, 16)"]),
    ("odd rotary_dim", dict(freqs=torch.zeros(S, 1, 1, 5, device=DEVICE)), ValueError,
     ["rotary_dim", "even", "5"]),
    ("rotary_dim larger than head_dim", dict(freqs=_emb(dim=2 * D)), ValueError,
     ["rotary_dim", "head_dim = 16", "32"]),
    ("table shorter than the sequence", dict(freqs=_emb(rows=S - 1)), ValueError,
     ["freqs has 7 rows", "at least 8"]),
    ("table shorter than sequence x cp_size", dict(cp_size=2, cp_rank=0), ValueError,
     ["freqs has 8 rows", "at least 16", "cp_size"]),
    ("table shorter than sequence + start", dict(
        freqs=_emb(rows=S + 2), start_positions=torch.tensor([0, 3], dtype=torch.int32,
                                                             device=DEVICE)), ValueError,
     ["freqs has 10 rows", "at least 11", "start position"]),
    ("negative start position", dict(start_positions=torch.tensor([0, -1], dtype=torch.int32,
                                                                  device=DEVICE)), ValueError,
     ["start_positions must be >= 0", "-1"]),
    ("start_positions of wrong length", dict(start_positions=torch.zeros(3, dtype=torch.int32,
                                                                          device=DEVICE)),
     ValueError, ["start_positions must have shape [2]", "(3,)"]),
    ("float start_positions", dict(start_positions=torch.zeros(B, device=DEVICE)), TypeError,
     ["start_positions must have dtype", "torch.float32"]),
    ("table shorter than sequence x cp_size + start", dict(
        freqs=_emb(rows=2 * S + 2), cp_size=2, start_positions=torch.tensor(
            [3, 0], dtype=torch.int32, device=DEVICE)), ValueError,
     ["freqs has 18 rows", "at least 19", "cp_size 2", "start position"]),
    ("cp_rank out of range", dict(freqs=_emb(rows=2 * S), cp_size=2, cp_rank=2), ValueError,
     ["cp_rank must be an int in [0, cp_size=2)", "2"]),
    ("negative cp_rank", dict(cp_rank=-1), ValueError, ["cp_rank", "-1"]),
    ("cp_size zero", dict(cp_size=0), ValueError, ["cp_size must be an int >= 1", "0"]),
    ("odd sequence with cp", dict(t=_t((S - 1, B, H, D)), freqs=_emb(rows=2 * S), cp_size=2),
     ValueError, ["sequence length must be even", "7"]),
    ("thd without cu_seqlens", dict(t=_t((S, H, D)), tensor_format="thd"), ValueError,
     ["cu_seqlens is required", "None"]),
    ("cu_seqlens with sbhd", dict(cu_seqlens=_cu([0, S])), ValueError,
     ["cu_seqlens is only used with tensor_format='thd'", "'sbhd'"]),
    ("cu_seqlens decreasing", dict(t=_t((S, H, D)), tensor_format="thd",
                                   cu_seqlens=_cu([0, 5, 3, 8])), ValueError,
     ["cu_seqlens must be non-decreasing", "[0, 5, 3, 8]"]),
    ("cu_seqlens not ending at t.shape[0]", dict(t=_t((S, H, D)), tensor_format="thd",
                                                 cu_seqlens=_cu([0, 3, 7])), ValueError,
     ["cu_seqlens[-1] // cp_size must equal t.shape[0] = 8", "7"]),
    ("cu_seqlens not starting at 0", dict(t=_t((S, H, D)), tensor_format="thd",
                                          cu_seqlens=_cu([1, 3, 8])), ValueError,
     ["cu_seqlens must start at 0", "1"]),
    ("float cu_seqlens", dict(t=_t((S, H, D)), tensor_format="thd",
                              cu_seqlens=torch.tensor([0.0, 8.0], device=DEVICE)), TypeError,
     ["cu_seqlens must have dtype", "torch.float32"]),
    ("cu_seqlens not padded for cp", dict(t=_t((S, H, D)), tensor_format="thd", freqs=_emb(32),
                                          cu_seqlens=_cu([0, 6, 16]), cp_size=2), ValueError,
     ["cu_seqlens must be padded to multiples of 2 * cp_size = 4", "[0, 6, 16]"]),
    ("thd table too short", dict(t=_t((S, H, D)), tensor_format="thd", freqs=_emb(rows=5),
                                 cu_seqlens=_cu([0, 2, 8])), ValueError,
     ["freqs has 5 rows", "longest sequence needs 6"]),
    ("thd start_positions of wrong length", dict(
        t=_t((S, H, D)), tensor_format="thd", cu_seqlens=_cu([0, 2, 8]),
        start_positions=torch.zeros(3, dtype=torch.int32, device=DEVICE)), ValueError,
     ["start_positions must have shape [2]", "(3,)"]),
    ("interleaved not a bool", dict(interleaved="yes"), TypeError, ["interleaved must be a bool",
                                                                    "'yes'"]),
    ("unknown kernel", dict(kernel="3d"), ValueError, ["kernel must be one of", "'3d'"]),
]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("case,kwargs,exc,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_message(case, kwargs, exc, words, fused):
    if not fused and (case in ("float64 t on the kernel path", "unknown kernel")):
        pytest.skip("valid on the naive path (it runs in any float dtype, ignores `kernel`)")
    args = dict(t=_t(), freqs=_emb(), tensor_format="sbhd", fused=fused)
    args.update(kwargs)
    with pytest.raises(exc) as info:
        apply_rotary_pos_emb(**args)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in {message!r}"


def test_tensors_on_different_devices():
    if DEVICE.type != "cuda":
        pytest.skip("needs a second device")
    with pytest.raises(ValueError, match=re.escape("freqs must be on the same device as t")):
        apply_rotary_pos_emb(_t(), _emb().cpu(), fused=True)
    with pytest.raises(ValueError, match="cu_seqlens must be on the same device"):
        apply_rotary_pos_emb(_t((S, H, D)), _emb(), "thd", fused=True,
                             cu_seqlens=torch.tensor([0, S], dtype=torch.int32))


def test_freqs_requiring_grad_is_refused_not_ignored():
    emb = _emb().requires_grad_(True)
    with pytest.raises(ValueError, match="freqs requires grad"):
        apply_rotary_pos_emb(_t().requires_grad_(True), emb, fused=True)


def test_validate_false_skips_only_value_checks():
    """validate=False trusts cu_seqlens values (no host sync), still checks shapes and dtypes."""
    t = _t((S, H, D))
    out = apply_rotary_pos_emb(t, _emb(), "thd", fused=True, cu_seqlens=_cu([0, 3, 8]),
                               validate=False)
    assert out.shape == t.shape
    with pytest.raises(ValueError, match="cu_seqlens is required"):
        apply_rotary_pos_emb(t, _emb(), "thd", fused=True, validate=False)


def test_remembered_signature_still_checks_values_and_flags():
    """Metadata checks are remembered per call signature; values, and flag types that compare
    equal (1 == True), must still be checked on every call."""
    starts = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        apply_rotary_pos_emb(_t(), _emb(rows=S + 2), start_positions=starts, fused=True)
    with pytest.raises(ValueError, match="at least 11"):
        apply_rotary_pos_emb(_t(), _emb(rows=S + 2), fused=True,
                             start_positions=torch.tensor([0, 3], dtype=torch.int32, device=DEVICE))
    with pytest.raises(TypeError, match="interleaved must be a bool"):
        apply_rotary_pos_emb(_t(), _emb(rows=S + 2), start_positions=starts, interleaved=0,
                             fused=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 2, _validate._HOST_REDUCE_MAX, _validate._HOST_REDUCE_MAX + 1,
                               4099])
def test_min_max_of_device_values(n, dtype):
    """Both ways of _min_max (the values copied to the host whole, or reduced on the device
    first) give the extremes as Python ints wherever they lie, on a strided view too (as
    ``position_ids[:, 0]`` is), and int64 values past the int32 range unchanged."""
    g = torch.Generator().manual_seed(n)
    big = 2**40 if dtype == torch.int64 else 2**30
    base = torch.randint(-1000, 1000, (2 * n,), generator=g, dtype=torch.int64)
    low_at, high_at = torch.randperm(n, generator=g)[:2].tolist() if n > 1 else (0, 0)
    base[2 * low_at] = -big
    if n > 1:
        base[2 * high_at] = big
    x = base.to(dtype=dtype, device=DEVICE)[::2]
    lowest, highest = _validate._min_max(x)
    assert type(lowest) is int and type(highest) is int
    assert (lowest, highest) == (-big, big if n > 1 else -big)


@pytest.mark.parametrize("bad", [-1, S + 3])
def test_start_positions_checked_past_the_host_reduce_size(bad):
    """More sequences than _validate._HOST_REDUCE_MAX: their start positions are reduced on the
    device before the copy to the host, and a bad one is still found wherever it is."""
    n = _validate._HOST_REDUCE_MAX + 5
    starts = torch.randint(0, 3, (n,), dtype=torch.int32, device=DEVICE)
    starts[n // 3] = bad
    with pytest.raises(ValueError, match="start_positions must be >= 0" if bad < 0
                       else "freqs has 11 rows"):
        apply_rotary_pos_emb(_t((S, n, 1, D)), _emb(rows=S + 3), "sbhd", starts, fused=True)
