"""apply_fused_qkv_rotary_pos_emb: TransformerEngine's fused QKV RoPE (tests/pytorch/
test_fused_rope.py::test_fused_qkv_rope's matrix) against the float64 reference applied to the
split q and k, plus what TE's test does not check: one launch forward and backward, any strides,
the caller's tensor untouched, every output element written."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, randn, strided_with_poison
from rope_kernels import (RotaryPositionEmbedding, apply_fused_qkv_rotary_pos_emb,
                          apply_rotary_pos_emb, rope_qk, rope_reference)

if ON_GPU:
    # TE's seq lengths 2 and 8 and hidden sizes; 512 instead of 2048 and 16 heads instead of 64:
    # the float64 reference with autograd at TE's full size, 8 workers at once, does not fit in
    # 80 GB. TE's own test runs at its full size through ../shared/te/run.sh.
    SEQ_LENGTHS, HIDDEN_SIZES, BATCH, HEADS = [2, 8, 512], [64, 128, 256], 2, 16
else:
    # One size in the interpreter (about a second a case); 24 channels: 6 or 12 pairs, no power
    # of two, so the channel masks are exercised.
    SEQ_LENGTHS, HIDDEN_SIZES, BATCH, HEADS = [12], [24], 2, 3


def _reference(qkv, q_freqs, k_freqs, splits, **kw):
    """TE's unfused recipe: split, q reshaped to its heads, RoPE on q and k; here in float64."""
    q, k, v = torch.split(qkv, splits, dim=3)
    q = q.reshape(*q.shape[:2], -1, splits[1])
    return rope_reference(q, q_freqs, **kw), rope_reference(k, k_freqs, **kw), v


def _loss(outputs, weights):
    return sum((o * w).sum() for o, w in zip(outputs, weights))


@pytest.mark.parametrize("start_positions", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq_length", SEQ_LENGTHS)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("rotary_percent", [0.5, 1.0])
@pytest.mark.parametrize("margin", [0, 10])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("cp_size", [1, 2])
@pytest.mark.parametrize("interleaved", [True, False])
def test_fused_qkv_rope(dtype, seq_length, hidden_size, rotary_percent, margin, tensor_format,
                        cp_size, interleaved, start_positions, seed):
    if margin == 0 and start_positions:
        pytest.skip("TE: start_positions needs a table longer than the sequence (margin > 0)")
    if seq_length - margin <= 0 or (cp_size > 1 and (seq_length - margin) % 2):
        pytest.skip("no tokens, or an odd local sequence with context parallelism")
    g = torch.Generator().manual_seed(seed)
    splits = [hidden_size * 4, hidden_size, hidden_size]
    qkv = randn((seq_length - margin, BATCH, HEADS, hidden_size * 6), dtype, seed)
    if tensor_format == "bshd":
        qkv = qkv.transpose(0, 1).contiguous()
    starts = (torch.randint(0, margin, (BATCH,), generator=g, dtype=torch.int32).to(DEVICE)
              if start_positions else None)
    emb = RotaryPositionEmbedding(hidden_size, rotary_percent, interleaved=interleaved,
                                  device=DEVICE)(seq_length * cp_size)
    for cp_rank in range(cp_size):
        kw = dict(tensor_format=tensor_format, start_positions=starts, interleaved=interleaved,
                  cp_size=cp_size, cp_rank=cp_rank)
        x = qkv.detach().requires_grad_(True)
        x64 = qkv.detach().double().requires_grad_(True)
        outs = apply_fused_qkv_rotary_pos_emb(x, emb, emb, splits, **kw)
        refs = _reference(x64, emb, emb, splits, **kw)
        for name, o, r in zip("qkv", outs, refs):
            assert o.shape == r.shape and o.dtype == dtype and o.is_contiguous(), name
            assert_rope_close(o, r, dtype, name)
        # Incoming gradients in the output dtype; the reference gets the same values.
        weights = [randn(o.shape, dtype, seed + i) for i, o in enumerate(outs)]
        _loss(outs, weights).backward()
        _loss(refs, [w.double() for w in weights]).backward()
        assert x.grad.is_contiguous()
        assert_rope_close(x.grad, x64.grad, dtype, "gradient")


@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
def test_strided_start_positions(tensor_format, seed):
    """start_positions as a strided view (``position_ids[:, 0]``; the entries between are
    poison), forward and backward."""
    splits = [48, 24, 24]
    qkv = randn((5, 2, 2, 96), torch.float32, seed)
    if tensor_format == "bshd":
        qkv = qkv.transpose(0, 1).contiguous()
    starts = strided_with_poison([3, 11])
    assert starts.stride() == (2,)
    emb = RotaryPositionEmbedding(24, device=DEVICE)(20)
    kw = dict(tensor_format=tensor_format, start_positions=starts)
    x = qkv.detach().requires_grad_(True)
    x64 = qkv.detach().double().requires_grad_(True)
    outs = apply_fused_qkv_rotary_pos_emb(x, emb, emb, splits, **kw)
    refs = _reference(x64, emb, emb, splits, **kw)
    for name, o, r in zip("qkv", outs, refs):
        assert_rope_close(o, r, torch.float32, name)
    weights = [randn(o.shape, torch.float32, seed + i) for i, o in enumerate(outs)]
    _loss(outs, weights).backward()
    _loss(refs, [w.double() for w in weights]).backward()
    assert_rope_close(x.grad, x64.grad, torch.float32, "gradient")


def test_one_launch_each_way_any_strides_input_untouched(seed, monkeypatch):
    """Forward and backward are one launch each; qkv given as a strided view (heads and batch
    transposed in memory) is read through its strides and never modified; outputs poisoned
    beforehand show every element written."""
    launches = []
    real = rope_qk.launch
    monkeypatch.setattr(rope_qk, "launch", lambda *a: launches.append(1) or real(*a))
    s, b, h, d = 6, 3, 2, 8
    splits = [2 * d, d, 3]  # v narrower than a head: copied as is
    base = randn((s, h, b, 3 * d + 3), torch.float32, seed)
    qkv = base.transpose(1, 2).requires_grad_(True)  # [s, b, h, w], not contiguous
    before = qkv.detach().clone()
    emb = RotaryPositionEmbedding(d, 0.5, device=DEVICE)(s)
    poisoned = torch.empty  # outputs are new tensors: fill them with NaN before the kernel
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poisoned(*a, **k).fill_(float("nan")))
    q, k, v = apply_fused_qkv_rotary_pos_emb(qkv, emb, emb, splits)
    monkeypatch.setattr(torch, "empty", poisoned)
    assert len(launches) == 1
    refs = _reference(qkv.detach().double(), emb, emb, splits)
    for name, o, r in zip("qkv", (q, k, v), refs):
        assert_rope_close(o, r, torch.float32, name)
    (q.sum() + (k * k).sum() + 2 * v.sum()).backward()
    assert len(launches) == 2
    x64 = qkv.detach().double().requires_grad_(True)
    rq, rk, rv = _reference(x64, emb, emb, splits)
    (rq.sum() + (rk * rk).sum() + 2 * rv.sum()).backward()
    assert_rope_close(qkv.grad, x64.grad, torch.float32, "gradient")
    assert torch.equal(qkv.detach(), before)


def test_matches_two_separate_calls(seed):
    """Fused QKV == apply_rotary_pos_emb on the q and k views (TE's own test compares these)."""
    s, b, h, d = 8, 2, 2, 16
    qkv = randn((b, s, h, 6 * d), torch.bfloat16, seed)
    emb = RotaryPositionEmbedding(d, interleaved=True, device=DEVICE)(s + 4)
    starts = torch.tensor([4, 1], dtype=torch.int32, device=DEVICE)
    q, k, v = apply_fused_qkv_rotary_pos_emb(qkv, emb, emb, [4 * d, d, d], "bshd", starts, True)
    qq, kk, vv = torch.split(qkv, [4 * d, d, d], dim=3)
    q2 = apply_rotary_pos_emb(qq.reshape(b, s, -1, d), emb, "bshd", starts, True, fused=True)
    k2 = apply_rotary_pos_emb(kk, emb, "bshd", starts, True, fused=True)
    assert torch.equal(q, q2) and torch.equal(k, k2) and torch.equal(v, vv)


BAD = [
    ("thd", dict(tensor_format="thd"), ValueError, ["'thd' is not supported", "sbhd"]),
    ("cu_seqlens given", dict(cu_seqlens=torch.tensor([0, 4], dtype=torch.int32)), ValueError,
     ["cu_seqlens must be None"]),
    ("splits do not add up", dict(qkv_split_arg_list=[64, 16, 8]), ValueError,
     ["must add up to qkv.shape[-1] = 96", "[64, 16, 8]"]),
    ("q not whole heads", dict(qkv_split_arg_list=[40, 16, 40]), ValueError,
     ["q_split = 40", "multiple of", "k_split = 16"]),
    ("two splits", dict(qkv_split_arg_list=[64, 32]), ValueError, ["three positive ints"]),
    ("k_freqs of another shape", dict(k_freqs="short"), ValueError,
     ["q_freqs and k_freqs must have the same shape"]),
    ("3-D qkv", dict(qkv="3d"), ValueError, ["qkv must be 4-D", "(4, 2, 96)"]),
    ("float64 qkv", dict(qkv="f64"), TypeError, ["qkv must have dtype", "torch.float64"]),
    ("table too short", dict(q_freqs="short", k_freqs="short"), ValueError,
     ["freqs has 3 rows", "at least 4"]),
]


@pytest.mark.parametrize("case,kwargs,exc,words", BAD, ids=[c[0] for c in BAD])
def test_bad_input(case, kwargs, exc, words):
    d = 16
    qkv = randn((4, 2, 2, 6 * d), torch.float32, 3)
    emb = RotaryPositionEmbedding(d, device=DEVICE)(4)
    args = dict(qkv=qkv, q_freqs=emb, k_freqs=emb, qkv_split_arg_list=[4 * d, d, d])
    for name, value in kwargs.items():
        if value == "short":
            value = RotaryPositionEmbedding(d, device=DEVICE)(3)
        elif value == "3d":
            value = qkv[:, :, 0]
        elif value == "f64":
            value = qkv.double()
        elif isinstance(value, torch.Tensor):
            value = value.to(DEVICE)
        args[name] = value
    with pytest.raises(exc) as info:
        apply_fused_qkv_rotary_pos_emb(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"
