"""The eager shortcut of the public entry points (rope_kernels/api.py, ``_Shortcuts``): a repeated
call signature goes from its arguments to the one launch the first call made.

A shortcut is only right if it launches what the full path would have launched, for every
call it is taken on. These tests run each entry point several times per signature on fresh
values (the later calls take the shortcut) and compare with a float64 reference, check that the
shortcut is really taken (and where it must not be, that it is not), that calls it must not
answer (bad arguments, autograd, value checks) still get the full path, and that the interleaved
kernel's address-dependent plan gets a shortcut per address class.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import DEVICE, HF_FUNCTIONS, ON_GPU, assert_rope_close, hf_reference, randn
import rope_kernels.hf
from rope_kernels import (RotaryPositionEmbedding, _launch, api, apply_fused_qkv_rotary_pos_emb,
                          apply_rope_with_cos_sin_cache,
                          apply_rope_with_cos_sin_cache_inplace, apply_rotary_pos_emb, rope_qk,
                          rope_reference)
from test_serving import make_cache, reference as cache_reference
from test_qkv import _reference as qkv_reference


@pytest.fixture
def shortcuts(monkeypatch):
    """This test's shortcuts only, starting empty."""
    fresh = api._Shortcuts()
    monkeypatch.setattr(api, "_SHORTCUTS", fresh)
    return fresh


def _entries(shortcuts):
    return [e for e in shortcuts.entries.values() if e]


def _starts(n, high, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (n,), generator=g, dtype=torch.int32).to(DEVICE)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_start", [False, True])
def test_te_calls_through_the_shortcut_match_reference(fmt, dtype, with_start, shortcuts, seed):
    shape = {"sbhd": (6, 3, 4, 32), "bshd": (3, 6, 4, 32), "thd": (18, 4, 32)}[fmt]
    freqs = RotaryPositionEmbedding(24, device=DEVICE)(40)
    kw = {}
    if fmt == "thd":
        kw["cu_seqlens"] = torch.tensor([0, 5, 5, 18], dtype=torch.int32, device=DEVICE)
    n_seqs = 3 if fmt == "thd" else shape[1 if fmt == "sbhd" else 0]
    if with_start:
        kw["start_positions"] = _starts(n_seqs, 16, seed)
    # Values on the device are checked only by the full path: the shortcut needs validate=False.
    validate = not kw
    for call in range(3):
        t = randn(shape, dtype, seed + call)
        before = t.clone()
        out = apply_rotary_pos_emb(t, freqs, fmt, fused=True, validate=validate, **kw)
        assert torch.equal(t, before), "the input was modified"
        assert out.is_contiguous() and out.shape == t.shape
        assert_rope_close(out, rope_reference(t.double(), freqs, fmt, **kw), dtype,
                          f"call {call}")
    assert len(_entries(shortcuts)) == 1


def _qkv_reference(qkv, freqs, splits, start_positions=None, tensor_format="bshd"):
    """TE's unfused recipe (test_qkv's reference) in float64, one table for q and k."""
    return qkv_reference(qkv.double(), freqs, freqs, splits, tensor_format=tensor_format,
                         start_positions=start_positions)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("with_start", [False, True])
@pytest.mark.parametrize("one_table", [True, False])
def test_qkv_calls_through_the_shortcut_match_reference(fmt, with_start, one_table, shortcuts,
                                                        seed, monkeypatch):
    """Fused QKV takes the shortcut too: calls after the first launch from the remembered plan
    (the full path made to fail) and match TE's unfused recipe; the input is untouched, the
    outputs are new, and q and k reading one table or two are different signatures."""
    freqs = RotaryPositionEmbedding(16, device=DEVICE)(40)
    k_freqs = freqs if one_table else freqs.clone()
    splits = [48, 24, 16]  # 2 q heads a group, head size 24, rotary_dim 16 < 24
    shape = (5, 2, 3, sum(splits)) if fmt == "sbhd" else (2, 5, 3, sum(splits))
    starts = _starts(2, 30, seed) if with_start else None
    for call in range(3):
        qkv = randn(shape, torch.float32, seed + call)
        before = qkv.clone()
        outs = apply_fused_qkv_rotary_pos_emb(qkv, freqs, k_freqs, splits, fmt, starts,
                                              validate=False)
        assert type(outs) is tuple and len(outs) == 3
        assert torch.equal(qkv, before), "the input was modified"
        for out, expected, name in zip(outs, _qkv_reference(qkv, freqs, splits, starts, fmt),
                                       "qkv"):
            assert out.is_contiguous() and out.shape == expected.shape, name
            assert_rope_close(out, expected, torch.float32, f"{name}, call {call}")
        if call == 0:
            assert len(_entries(shortcuts)) == 1
            full_path = (api.validate_qkv_args, api._qk.rope_qkv)
            monkeypatch.setattr(api, "validate_qkv_args", _fail)
            monkeypatch.setattr(api._qk, "rope_qkv", _fail)
    monkeypatch.setattr(api, "validate_qkv_args", full_path[0])
    monkeypatch.setattr(api._qk, "rope_qkv", full_path[1])
    other = freqs.clone() if one_table else freqs  # the other table layout: a new signature
    apply_fused_qkv_rotary_pos_emb(qkv, freqs, other, splits, fmt, starts, validate=False)
    assert len(_entries(shortcuts)) == 2


def _fail(*args, **kwargs):
    raise AssertionError("the full path ran")


def test_qkv_shortcut_leaves_checks_to_the_full_path(shortcuts, seed):
    """No shortcut where the full path checks values or gets a flag or split of another type."""
    freqs = RotaryPositionEmbedding(16, device=DEVICE)(16)
    qkv = randn((4, 2, 3, 40), torch.float32, seed)
    good = torch.tensor([0, 12], dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 8], start_positions=good)
    assert not shortcuts.entries  # validate=True with start_positions: values checked each time
    with pytest.raises(ValueError, match="freqs has 16 rows"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 8], start_positions=good + 1)
    for _ in range(2):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 8])
    assert len(_entries(shortcuts)) == 1
    with pytest.raises(ValueError, match="cp_size"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 8], cp_size=True)
    with pytest.raises(TypeError, match="interleaved must be a bool"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16, 16, 8], interleaved=0)
    with pytest.raises((TypeError, ValueError), match="qkv_split_arg_list"):
        apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [16.0, 16, 8])


def test_te_shortcut_is_taken(shortcuts, seed, monkeypatch):
    """The second call launches through the remembered plan without the checks or the launcher's
    planning: with both made to fail, it still gives the right result."""
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.bfloat16, seed)
    apply_rotary_pos_emb(t, freqs, fused=True)
    monkeypatch.setattr(api, "validate_rope_args", _fail)
    monkeypatch.setattr(api, "KERNELS", {"2d": _fail})
    t2 = randn(t.shape, torch.bfloat16, seed + 1)
    assert_rope_close(apply_rotary_pos_emb(t2, freqs, fused=True),
                      rope_reference(t2.double(), freqs), torch.bfloat16)


def test_value_checks_are_never_skipped(shortcuts, seed):
    """validate=True with start_positions checks their values on every call: no shortcut."""
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    good = torch.tensor([0, 8], dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=good)
    assert not shortcuts.entries
    with pytest.raises(ValueError, match="freqs has 16 rows"):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=good + 1)


def test_other_signatures_still_get_checked(shortcuts, seed):
    """A shortcut belongs to one signature: a call differing in any checked property (here the
    dtype of start_positions, the device of freqs, the type of cp_size) takes the full path."""
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    starts = torch.tensor([0, 3], dtype=torch.int32, device=DEVICE)
    for _ in range(2):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=starts, validate=False)
    with pytest.raises(TypeError, match="start_positions"):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=starts.float(),
                             validate=False)
    # Flags that merely equal the remembered ones (1.0 == True == 1, 0 == False) are other
    # signatures: the checks name them.
    with pytest.raises(ValueError, match="cp_size"):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=starts, validate=False,
                             cp_size=1.0)
    with pytest.raises(ValueError, match="cp_size"):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=starts, validate=False,
                             cp_size=True)
    with pytest.raises(ValueError, match="cp_rank"):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=starts, validate=False,
                             cp_rank=False)
    with pytest.raises(TypeError, match="interleaved must be a bool"):
        apply_rotary_pos_emb(t, freqs, fused=True, start_positions=starts, validate=False,
                             interleaved=0)
    if DEVICE.type == "cuda":
        with pytest.raises(ValueError, match="device"):
            apply_rotary_pos_emb(t, freqs.cpu(), fused=True, start_positions=starts,
                                 validate=False)


def test_a_non_bool_interleaved_reaches_the_checks(shortcuts, seed):
    """The shortcut's key must not evaluate arguments the checks have not seen yet."""
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    bad = torch.tensor([True, False], device=DEVICE)
    with pytest.raises(TypeError, match="interleaved must be a bool"):
        apply_rotary_pos_emb(t, freqs, fused=True, interleaved=bad)


def test_autograd_takes_the_full_path(shortcuts, seed):
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    apply_rotary_pos_emb(t, freqs, fused=True)
    apply_rotary_pos_emb(t, freqs, fused=True)  # the shortcut exists now
    x = t.clone().requires_grad_()
    out = apply_rotary_pos_emb(x, freqs, fused=True)
    assert out.grad_fn is not None
    grad = randn(out.shape, torch.float32, seed + 1)
    (dx,) = torch.autograd.grad(out, x, grad)
    # The gradient of a rotation is the inverse rotation: R^T g.
    x64 = x.detach().double().requires_grad_()
    (ref,) = torch.autograd.grad(rope_reference(x64, freqs), x64, grad.double())
    assert_rope_close(dx, ref, torch.float32, "grad")


def test_several_launches_are_not_remembered(shortcuts, monkeypatch, seed):
    """thd with many sequences runs a pre-pass and then the main kernel: two launches, and a
    tensor the launcher made itself. The full path stays in charge of every such call."""
    import importlib

    r2 = importlib.import_module("rope_kernels.rope_2d")
    monkeypatch.setattr(r2, "TOKEN_ROWS_ABOVE", 1)
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    cu = torch.tensor([0, 3, 9, 12], dtype=torch.int32, device=DEVICE)
    for call in range(2):
        t = randn((12, 2, 32), torch.float32, seed + call)
        out = apply_rotary_pos_emb(t, freqs, "thd", fused=True, cu_seqlens=cu, validate=False)
        assert_rope_close(out, rope_reference(t.double(), freqs, "thd", cu_seqlens=cu),
                          torch.float32)
    assert list(shortcuts.entries.values()) == [False]


def test_interleaved_pairs_get_a_shortcut_per_address_class(shortcuts, seed):
    """Interleaved pairs are read as words only at even element addresses: same shape and
    strides at an odd address is another plan, and so another shortcut."""
    freqs = RotaryPositionEmbedding(32, interleaved=True, device=DEVICE)(16)
    shape = (8, 2, 4, 32)
    n = 8 * 2 * 4 * 32
    for call in range(4):
        flat = randn((n + 1,), torch.bfloat16, seed + call)
        t = (flat[:-1] if call % 2 == 0 else flat[1:]).view(shape)
        out = apply_rotary_pos_emb(t, freqs, fused=True, interleaved=True)
        assert_rope_close(out, rope_reference(t.double(), freqs, interleaved=True),
                          torch.bfloat16, f"call {call}")
    assert len(_entries(shortcuts)) == 2


@pytest.mark.parametrize("entry", ["cache", "cache in place", "interleaved", "glm", "qkv"])
def test_qk_interleaved_pairs_get_a_shortcut_per_address_class(entry, shortcuts, seed,
                                                               monkeypatch):
    """The q+k kernel reads interleaved pairs as words only where q's and k's addresses are even
    in elements: calls of one signature alternating between an even and an odd address of q
    (of qkv for fused QKV) are two plans, two shortcuts, each right from its second call on."""
    monkeypatch.setattr(rope_qk, "_PLANS", {})

    def at(x, odd):  # x's values at an even or an odd element address, same shape and strides
        flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)
        return (flat[1:] if odd else flat[:-1]).view(x.shape).copy_(x)

    for call in range(4):
        odd, s = call % 2 == 1, seed + 10 * call
        if entry == "qkv":
            qkv = at(randn((4, 2, 3, 4 * 16), torch.bfloat16, s), odd)
            freqs = RotaryPositionEmbedding(16, interleaved=True, device=DEVICE)(4)
            q, k, v = apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [32, 16, 16],
                                                     interleaved=True)
            want_q, want_k, want_v = qkv_reference(qkv.double(), freqs, freqs, [32, 16, 16],
                                                   interleaved=True)
            for got, want, name in ((q, want_q, "q"), (k, want_k, "k"), (v, want_v, "v")):
                assert_rope_close(got, want, torch.bfloat16, f"{name}, call {call}")
        elif entry.startswith("cache"):
            positions = _starts(5, 32, s)
            cache = make_cache(32, 24)
            query = at(randn((5, 4 * 24), torch.bfloat16, s), odd)
            key = randn((5, 2 * 24), torch.bfloat16, s + 1)
            want = (cache_reference(positions, query, 24, cache, False),
                    cache_reference(positions, key, 24, cache, False))
            # (validate=False: a call whose positions are checked takes the full path)
            if entry == "cache in place":
                apply_rope_with_cos_sin_cache_inplace(positions, query, key, 24, cache, False,
                                                      validate=False)
                got = (query, key)
            else:
                got = apply_rope_with_cos_sin_cache(positions, query, key, 24, cache, False,
                                                    validate=False)
            for x, ref, name in zip(got, want, ("query", "key")):
                assert_rope_close(x, ref, torch.bfloat16, f"{name}, call {call}")
        else:
            q, k, cos, sin = _hf_inputs(s, rotary_dim=24)
            q = at(q.transpose(1, 2), odd).transpose(1, 2)  # the [b, h, s, d] view, moved
            q_embed, k_embed = HF_FUNCTIONS[entry](q, k, cos, sin)
            assert_rope_close(q_embed, hf_reference(q, cos, sin, pairs=entry), torch.bfloat16,
                              f"q, call {call}")
            assert_rope_close(k_embed, hf_reference(k, cos, sin, pairs=entry), torch.bfloat16,
                              f"k, call {call}")
    assert len(_entries(shortcuts)) == 2
    assert sorted(p.constexprs["INTERLEAVED"] for p in rope_qk._PLANS.values()) == [1, 2]


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("is_neox", [True, False])
def test_cache_calls_through_the_shortcut_match_reference(in_place, is_neox, shortcuts, seed):
    tokens, q_heads, k_heads, head_size = 9, 4, 2, 24
    cache = make_cache(64, 16)
    for call in range(3):
        g = torch.Generator().manual_seed(seed + call)
        positions = torch.randint(0, 64, (tokens,), generator=g).to(DEVICE)
        qkv = randn((tokens, (q_heads + 2 * k_heads) * head_size), torch.bfloat16, seed + call)
        query = qkv[:, : q_heads * head_size]
        key = qkv[:, q_heads * head_size: (q_heads + k_heads) * head_size]
        q_ref = cache_reference(positions, query, head_size, cache, is_neox)
        k_ref = cache_reference(positions, key, head_size, cache, is_neox)
        if in_place:
            apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache,
                                                  is_neox, validate=False)
            q_out, k_out = query, key
        else:
            before = qkv.clone()
            q_out, k_out = apply_rope_with_cos_sin_cache(positions, query, key, head_size,
                                                         cache, is_neox, validate=False)
            assert torch.equal(qkv, before), "the out-of-place call modified its inputs"
        assert_rope_close(q_out, q_ref, torch.bfloat16, f"query, call {call}")
        assert_rope_close(k_out, k_ref, torch.bfloat16, f"key, call {call}")
    assert len(_entries(shortcuts)) == 1


def _hf_inputs(seed, rotary_dim=16):
    """q [2, 4, 5, 24] and k [2, 2, 5, 24] as transposed views of [b, s, h, d] projections (as in
    transformers' attention), cos/sin [2, 5, rotary_dim] at random positions."""
    b, s, q_heads, k_heads, head_dim = 2, 5, 4, 2, 24
    q = randn((b, s, q_heads, head_dim), torch.bfloat16, seed).transpose(1, 2)
    k = randn((b, s, k_heads, head_dim), torch.bfloat16, seed + 1).transpose(1, 2)
    angles = randn((b, s, rotary_dim // 2), torch.float32, seed + 2) * 8
    angles = torch.cat((angles, angles), -1)
    return q, k, angles.cos(), angles.sin()


def test_hf_calls_through_the_shortcut_match_reference(shortcuts, seed):
    for call in range(3):
        q, k, cos, sin = _hf_inputs(seed + 10 * call)
        before = (q.clone(), k.clone())
        q_embed, k_embed = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
        assert torch.equal(q, before[0]) and torch.equal(k, before[1]), "an input was modified"
        assert q_embed.is_contiguous() and q_embed.shape == q.shape and k_embed.shape == k.shape
        assert_rope_close(q_embed, hf_reference(q, cos, sin), torch.bfloat16, f"q, call {call}")
        assert_rope_close(k_embed, hf_reference(k, cos, sin), torch.bfloat16, f"k, call {call}")
    assert len(_entries(shortcuts)) == 1


def test_hf_shortcut_is_taken_and_autograd_is_not(shortcuts, seed, monkeypatch):
    """After the first call, a call of the same signature skips the checks and the planning
    (both made to fail here); a call that needs autograd still takes the full path."""
    q, k, cos, sin = _hf_inputs(seed)
    rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
    with monkeypatch.context() as m:
        m.setattr(rope_kernels.hf, "validate_hf_args", _fail)
        m.setattr(rope_kernels.hf._qk, "rope_cos_sin", _fail)
        q2, k2, cos2, sin2 = _hf_inputs(seed + 1)
        q_embed, _ = rope_kernels.hf.apply_rotary_pos_emb(q2, k2, cos2, sin2)
    assert_rope_close(q_embed, hf_reference(q2, cos2, sin2), torch.bfloat16)
    x = q2.detach().float().requires_grad_()
    q_embed, _ = rope_kernels.hf.apply_rotary_pos_emb(x, k2.float(), cos2, sin2)
    assert q_embed.grad_fn is not None


def test_deepseek_v4_shortcut_is_taken_and_autograd_is_not(shortcuts, seed, monkeypatch):
    """DeepSeek V4's function and its in-place variant (one launch each:
    ``rope_qk.rope_trailing``) remember their launches too: a call of the same signature on fresh
    values skips the checks and the planning (both made to fail) and matches the float64
    reference; a call that needs autograd, and one of another signature with a bad cos, still
    take the full path."""
    for n, entry_point in enumerate(["hf_deepseek_v4", "hf_deepseek_v4_inplace"]):
        make = _calls(entry_point, seed)
        run, ref = make(0)
        run()
        assert len(_entries(shortcuts)) == n + 1
        with monkeypatch.context() as m:
            m.setattr(rope_kernels.hf, "validate_hf_args", _fail)
            m.setattr(rope_kernels.hf._qk, "rope_trailing", _fail)
            for call in (1, 2):
                run, ref = make(call)
                (out,), (expected,) = run(), ref()
                assert out.is_contiguous()  # (in place: x, whose one token makes it so too)
                assert_rope_close(out, expected, torch.bfloat16, f"{entry_point}, call {call}")
    x = randn((2, 1, 4, 48), torch.float32, seed).transpose(1, 2).requires_grad_()
    cos = randn((1, 1, 8), torch.float32, seed + 1)
    out = rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4(x, cos, cos)
    assert out.grad_fn is not None
    with pytest.raises(ValueError, match="0 < 2 \\* cos.shape\\[-1\\] <= head_dim"):
        rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4(x.detach(), cos.repeat(1, 1, 4),
                                                         cos.repeat(1, 1, 4))


def test_hf_pairings_do_not_share_a_shortcut(shortcuts, seed, monkeypatch):
    """rope_kernels.hf's functions take the same tensors: calls of one signature through each,
    repeated (the shortcut from the second call on), must each rotate their own pairs, not the
    remembered launch of another's. cos and sin cover the whole head (every convention with one
    entry per channel accepts them), or half of it for GPT-OSS's functions, which Llama's takes
    too (rotating part of the head). Each against transformers' convention in float64."""
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    q, k, cos, sin = _hf_inputs(seed, rotary_dim=24)
    narrow = cos[..., :12].contiguous(), sin[..., :12].contiguous()
    calls = [(pairs, fn, narrow if pairs.endswith("_per_pair") else (cos, sin))
             for pairs, fn in HF_FUNCTIONS.items()] + [("half", HF_FUNCTIONS["half"], narrow)]
    for call in range(3):
        for pairs, fn, (c, s) in calls:
            q_embed, k_embed = fn(q, k, c, s)
            assert_rope_close(q_embed, hf_reference(q, c, s, pairs=pairs), torch.bfloat16,
                              f"{pairs} q {call}, cos {c.shape[-1]} wide")
            assert_rope_close(k_embed, hf_reference(k, c, s, pairs=pairs), torch.bfloat16,
                              f"{pairs} k {call}, cos {c.shape[-1]} wide")
    assert len(_entries(shortcuts)) == len(calls)


def test_hf_calls_differing_only_in_sin_dtype_get_their_own_plan(shortcuts, seed, monkeypatch):
    """cos and sin may have different dtypes (each is read as it is). A call that differs from
    earlier ones only in sin's dtype must get its own plan: on a GPU the package's thin launch
    reuses the kernel compiled for a plan, and that kernel reads sin as the earlier dtype."""
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    q, k, cos, sin = _hf_inputs(seed)
    cos16, sin16 = cos.to(torch.bfloat16), sin.to(torch.bfloat16)
    for _ in range(3):  # from the third call on, the plan's kernel is reused without dispatch
        rope_kernels.hf.apply_rotary_pos_emb(q, k, cos16, sin16)
    assert len(rope_qk._PLANS) == 1
    q_embed, k_embed = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos16, sin)  # sin float32
    assert len(rope_qk._PLANS) == 2
    assert_rope_close(q_embed, hf_reference(q, cos16, sin), torch.bfloat16, "q")
    assert_rope_close(k_embed, hf_reference(k, cos16, sin), torch.bfloat16, "k")


def test_cache_and_hf_flags_of_other_types_get_checked(shortcuts, seed):
    """After a cache or HF call has its shortcut, a flag that merely equals the remembered one
    (1 for is_neox=True, True for unsqueeze_dim=1) takes the full path, whose checks name it."""
    cache = make_cache(64, 16)
    q = randn((4, 2 * 24), torch.float32, seed)
    k = randn((4, 24), torch.float32, seed + 1)
    positions = torch.tensor([0, 1, 2, 63], device=DEVICE)
    for _ in range(2):
        apply_rope_with_cos_sin_cache(positions, q, k, 24, cache, True, validate=False)
    assert _entries(shortcuts)
    with pytest.raises(TypeError, match="is_neox must be a bool"):
        apply_rope_with_cos_sin_cache(positions, q, k, 24, cache, 1, validate=False)
    qh, kh, cos, sin = _hf_inputs(seed)
    for _ in range(2):
        rope_kernels.hf.apply_rotary_pos_emb(qh, kh, cos, sin, 1)
    with pytest.raises(ValueError, match="unsqueeze_dim"):
        rope_kernels.hf.apply_rotary_pos_emb(qh, kh, cos, sin, True)


def test_cache_positions_are_checked_unless_validate_is_false(shortcuts):
    cache = make_cache(64, 16)
    q = randn((4, 2 * 24), torch.float32, 1)
    k = randn((4, 24), torch.float32, 2)
    good = torch.tensor([0, 1, 2, 63], device=DEVICE)
    for _ in range(2):
        apply_rope_with_cos_sin_cache(good, q, k, 24, cache)
    assert not shortcuts.entries
    with pytest.raises(ValueError, match="positions must lie in"):
        apply_rope_with_cos_sin_cache(good + 1, q, k, 24, cache)


def test_shortcuts_off(shortcuts, seed):
    shortcuts.enabled = False
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    for _ in range(2):
        assert_rope_close(apply_rotary_pos_emb(t, freqs, fused=True),
                          rope_reference(t.double(), freqs), torch.float32)
    assert not shortcuts.entries


# --- The recent signatures: flags and a tensor check before the key (api._Shortcuts.recent) ---


def _te_variants(seed):
    """The remembered TE call (sbhd bf16 with start_positions, validate=False) as keyword
    arguments, and calls that each differ from it in one property the key holds."""
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    t = randn((8, 2, 4, 32), torch.bfloat16, seed)
    starts = _starts(2, 8, seed)
    base = dict(t=t, freqs=freqs, tensor_format="sbhd", start_positions=starts)
    variants = {
        "dtype": dict(base, t=t.float()),
        "shape": dict(base, t=randn((8, 2, 3, 32), torch.bfloat16, seed + 1)),
        "strides": dict(base, t=randn((2, 8, 4, 32), torch.bfloat16, seed + 2).transpose(0, 1)),
        "table rows": dict(base, freqs=RotaryPositionEmbedding(32, device=DEVICE)(24)),
        "table width": dict(base, freqs=RotaryPositionEmbedding(16, device=DEVICE)(16)),
        "no start_positions": dict(base, start_positions=None),
        "int64 start_positions": dict(base, start_positions=starts.long()),
        "tensor_format": dict(base, tensor_format="bshd",
                              start_positions=_starts(8, 8, seed)),
        "interleaved": dict(base, interleaved=True),
        "cp_rank": dict(base, cp_size=2, cp_rank=1),
        "kernel": dict(base, kernel="1d"),
    }
    return base, variants


def _te_call(kw):
    return apply_rotary_pos_emb(fused=True, validate=False, **kw)


def _te_expected(kw):
    kw = {k: v for k, v in kw.items() if k != "kernel"}
    return rope_reference(kw.pop("t").double(), kw.pop("freqs"), **kw)


@pytest.mark.parametrize("entry_point", ["te", "te_start", "cache", "cache_inplace", "hf",
                                         "hf_inplace", "qkv", "hf_deepseek_v4",
                                         "hf_deepseek_v4_inplace"])
def test_recent_signature_answers_without_the_key(entry_point, shortcuts, seed):
    """The second call finds its entry by key and puts it among the recent signatures; the
    third is answered by flags and tensor check alone (the key's dict made to fail), for every
    entry point, with None tensors (te) and one table for q and k (qkv: the same object
    twice, which the guard alone would refuse)."""
    if _launch.tensor_check((torch.empty(1),)) is None:
        pytest.skip("this torch has no tensor guards that keep the contract")
    make = _calls(entry_point, seed)
    for call in range(2):
        make(call)[0]()
    assert len(shortcuts.recent) == 1

    class NoLookups(dict):
        def get(self, key, default=None):
            raise AssertionError("the key was built and looked up")

    shortcuts.entries = NoLookups(shortcuts.entries)
    run, reference = make(2)
    for out, expected in zip(run(), reference()):
        assert_rope_close(out, expected, torch.bfloat16, entry_point)


@pytest.mark.parametrize("variant", list(_te_variants(0)[1]))
def test_recent_signature_refuses_a_call_that_differs(variant, shortcuts, seed):
    """A call that differs from a recent signature in one property of its key is not answered
    by it: it takes the full path (a new entry) and matches the reference."""
    base, variants = _te_variants(seed)
    for _ in range(2):
        _te_call(base)
    known = len(shortcuts.entries)
    kw = variants[variant]
    out = _te_call(kw)
    assert len(shortcuts.entries) == known + 1, "a recent signature answered the call"
    dtype = kw["t"].dtype
    assert_rope_close(out, _te_expected(kw), dtype, variant)


def test_recent_signatures_are_the_last_four_found(shortcuts, seed):
    """Calls alternating over five signatures keep the four found last, the latest first, and
    every call is right."""
    guarded = _launch.tensor_check((torch.empty(1),)) is not None
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    for step in range(3):
        for heads in range(1, 6):
            t = randn((4, 2, heads, 32), torch.float32, seed + 10 * step + heads)
            out = apply_rotary_pos_emb(t, freqs, fused=True)
            assert_rope_close(out, rope_reference(t.double(), freqs), torch.float32)
            if step and guarded:  # (a TE key holds the flags, then t's shape)
                key = next(k for k in shortcuts.entries if k[1] == t.shape)
                assert shortcuts.recent[0][2] is shortcuts.entries[key]
    assert len(shortcuts.recent) == (4 if guarded else 0)


def test_recent_signatures_off_when_tensor_guards_break_their_contract(shortcuts, seed,
                                                                       monkeypatch):
    """torch's tensor guards are private: if they do not refuse what they must (here a fake
    whose check accepts anything), no signature is remembered by them, and calls of other
    shapes still get their own plans."""

    class Lenient:
        def __init__(self, *tensors, **kwargs):
            pass

        def check(self, *tensors):
            return True

    monkeypatch.setattr(_launch, "_TENSOR_GUARDS", Lenient)
    monkeypatch.setattr(_launch, "_GUARDS_KEPT", None)
    freqs = RotaryPositionEmbedding(32, device=DEVICE)(16)
    for heads in (2, 2, 2, 3, 3):
        t = randn((4, 2, heads, 32), torch.float32, seed + heads)
        assert_rope_close(apply_rotary_pos_emb(t, freqs, fused=True),
                          rope_reference(t.double(), freqs), torch.float32)
    assert _launch._GUARDS_KEPT is False and shortcuts.recent == ()


def test_tensor_guards_keep_their_contract_here():
    """On this torch, its tensor guards pass the contract test (else the recent signatures
    would be silently off)."""
    if _launch._TENSOR_GUARDS is None:
        pytest.skip("this torch has no torch._C._dynamo.guards.TensorGuards")
    assert _launch._guards_keep_contract()
    check = _launch.tensor_check((randn((3, 4), torch.bfloat16, 1), _starts(3, 5, 2)))
    assert check(randn((3, 4), torch.bfloat16, 3), _starts(3, 5, 4))
    assert not check(randn((3, 4), torch.float16, 3), _starts(3, 5, 4))


def test_cache_and_hf_recent_signatures_refuse_other_calls(shortcuts, seed):
    """The cache call's flags hold in_place: after the out-of-place call is recent, the in-place
    call of the same tensors takes its own path (and writes in place); a cache call with
    fewer k heads or HF calls with other cos dtype are other signatures too."""
    cache = make_cache(64, 16)
    positions = torch.tensor([0, 5, 2, 63], device=DEVICE)
    q = randn((4, 2 * 24), torch.float32, seed)
    k = randn((4, 2 * 24), torch.float32, seed + 1)
    for _ in range(2):
        q_out, _ = apply_rope_with_cos_sin_cache(positions, q, k, 24, cache, validate=False)
    q_ref = cache_reference(positions, q, 24, cache, True)
    k_ref = cache_reference(positions, k, 24, cache, True)
    apply_rope_with_cos_sin_cache_inplace(positions, q, k, 24, cache, validate=False)
    assert_rope_close(q, q_ref, torch.float32, "query in place")
    assert_rope_close(k, k_ref, torch.float32, "key in place")
    k1 = randn((4, 24), torch.float32, seed + 2)
    _, k_out = apply_rope_with_cos_sin_cache(positions, q, k1, 24, cache, validate=False)
    assert_rope_close(k_out, cache_reference(positions, k1, 24, cache, True), torch.float32,
                      "one k head")
    qh, kh, cos, sin = _hf_inputs(seed)
    for _ in range(2):
        rope_kernels.hf.apply_rotary_pos_emb(qh, kh, cos, sin)
    cos16 = cos.to(torch.bfloat16)
    q_embed, _ = rope_kernels.hf.apply_rotary_pos_emb(qh, kh, cos16, sin)
    assert_rope_close(q_embed, hf_reference(qh, cos16, sin), torch.bfloat16, "bf16 cos")
    assert len(_entries(shortcuts)) == 5  # cache out / in place / one k head, HF twice


# --- The shortest path (GPU, triton 3.6 to 3.9): an armed shortcut calls the package's own C
# launcher ---

gpu = pytest.mark.skipif(not ON_GPU, reason="the shortest path launches compiled kernels only")


def _calls(entry_point, seed, aligned=True):
    """make(call) -> (run, reference): a decode-like call of the entry point on fresh values per
    call, as two functions of no argument that return the call's outputs and their float64
    reference. ``aligned=False`` starts the rotated tensor one element into its storage (not
    16-byte aligned)."""
    cache, freqs = make_cache(64, 32), RotaryPositionEmbedding(32, device=DEVICE)(64)

    def fresh(shape, call):
        flat = randn((math.prod(shape) + 1,), torch.bfloat16, seed + call)
        return (flat[:-1] if aligned else flat[1:]).view(shape)

    if entry_point == "qkv":
        starts = _starts(4, 48, seed)

        def make(call):
            # [b, s, h, q_split + k_split + v_split]: 2 groups of 2 q heads, one k, one v.
            qkv = fresh((4, 1, 2, 4 * 32), call)
            return (lambda: apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [64, 32, 32],
                                                           "bshd", starts, validate=False),
                    lambda: _qkv_reference(qkv, freqs, [64, 32, 32], starts))
    elif entry_point.startswith("te"):
        starts = _starts(4, 48, seed) if entry_point == "te_start" else None

        def make(call):
            t = fresh((4, 1, 3, 32), call)
            return (lambda: (apply_rotary_pos_emb(t, freqs, "bshd", starts, fused=True,
                                                  validate=False),),
                    lambda: (rope_reference(t.double(), freqs, "bshd", starts),))
    elif entry_point.startswith("cache"):
        g = torch.Generator().manual_seed(seed)
        positions = torch.randint(0, 64, (5,), generator=g).to(DEVICE)

        def make(call):
            q, k = fresh((5, 4 * 32), call), randn((5, 2 * 32), torch.bfloat16, seed + 99 + call)
            refs = (cache_reference(positions, q, 32, cache, True),
                    cache_reference(positions, k, 32, cache, True))
            if entry_point == "cache_inplace":
                def run():
                    apply_rope_with_cos_sin_cache_inplace(positions, q, k, 32, cache,
                                                          validate=False)
                    return q, k
            else:
                def run():
                    return apply_rope_with_cos_sin_cache(positions, q, k, 32, cache,
                                                         validate=False)
            return run, lambda: refs
    elif entry_point.startswith("hf_deepseek_v4"):
        def make(call):
            # DeepSeek V4's [b, h, s, d] view, its last 16 of 48 channels rotated
            x = fresh((2, 1, 4, 48), call).transpose(1, 2)
            _, _, cos, sin = _hf_inputs(seed + call, rotary_dim=16)
            cos, sin = cos[:, :1, :8], sin[:, :1, :8]
            ref = torch.cat((x[..., :32].double(), hf_reference(
                x[..., 32:], cos, sin, pairs="interleaved_per_pair")), -1)
            if entry_point.endswith("_inplace"):
                def run():
                    assert rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4_inplace(
                        x, cos, sin) is x
                    return (x,)
                return run, lambda: (ref,)
            return (lambda: (rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4(x, cos, sin),),
                    lambda: (ref,))
    else:
        def make(call):
            q = fresh((2, 1, 4, 32), call).transpose(1, 2)
            k = randn((2, 1, 2, 32), torch.bfloat16, seed + 99 + call).transpose(1, 2)
            _, _, cos, sin = _hf_inputs(seed + call, rotary_dim=32)
            cos, sin = cos[:, :1], sin[:, :1]
            refs = (hf_reference(q, cos, sin), hf_reference(k, cos, sin))
            if entry_point == "hf_inplace":
                def run():
                    out = rope_kernels.hf.apply_rotary_pos_emb_inplace(q, k, cos, sin)
                    assert out[0] is q and out[1] is k
                    return out
                return run, lambda: refs
            return (lambda: rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin),
                    lambda: refs)
    return make


def _spy(entry):
    """Record the armed shortcut's launches through its own launcher (the calls that launched;
    one that returns False handed the call to thin_launch)."""
    calls = []
    driver, device, stream_of, launch, plan = entry.ready

    def counted(*args):
        result = launch(*args)
        if result is None:
            calls.append(args)
        return result

    entry.ready = (driver, device, stream_of, counted, plan)
    return calls


ENTRY_POINTS = ["te", "te_start", "cache", "cache_inplace", "hf", "hf_inplace", "qkv",
                "hf_deepseek_v4", "hf_deepseek_v4_inplace"]


@gpu
@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_armed_shortcut_matches_reference(entry_point, shortcuts, seed, monkeypatch):
    """The thin path confirms a kernel on its second dispatch, so a shortcut is armed by the end
    of its second call on triton 3.6 to 3.9 (the launchers it was checked against; elsewhere it
    never arms).
    Later calls take the shortest path and still match the float64 reference on fresh values."""
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(_launch, "ENABLED", True)
    make = _calls(entry_point, seed)
    for call in range(3):
        run, ref = make(call)
        for out, expected in zip(run(), ref()):
            assert_rope_close(out, expected, torch.bfloat16, f"call {call}")
    (entry,) = _entries(shortcuts)
    if not triton.__version__.startswith(_launch._DIRECT_TRITON):
        assert entry.ready is None
        return
    assert entry.ready is not None
    launches = _spy(entry)
    for call in range(3, 6):
        run, ref = make(call)
        for out, expected in zip(run(), ref()):
            assert out.is_contiguous()
            assert_rope_close(out, expected, torch.bfloat16, f"call {call}")
    assert len(launches) == 3


def _own_launch_or_skip(monkeypatch):
    """Skip where the shortest path never arms; else switch the thin path on. Returns triton."""
    triton = pytest.importorskip("triton")
    if not triton.__version__.startswith(_launch._DIRECT_TRITON):
        pytest.skip(f"the shortest path arms on triton {_launch._DIRECT_TRITON} only")
    monkeypatch.setattr(_launch, "ENABLED", True)
    return triton


@gpu
@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_armed_shortcut_steps_aside(entry_point, shortcuts, seed, monkeypatch):
    """An armed shortcut hands the call to thin_launch (right results, no C call of its own) for
    a pointer that is not 16-byte aligned (Triton compiled the kernel for aligned ones), with
    SHORTEST off, and with a launch hook installed (which must then see the launch)."""
    triton = _own_launch_or_skip(monkeypatch)
    make = _calls(entry_point, seed)
    for call in range(3):
        make(call)[0]()
    (entry,) = _entries(shortcuts)
    launches = _spy(entry)
    misaligned = _calls(entry_point, seed + 7, aligned=False)
    for call in range(3):  # the thin path confirms the misaligned kernel meanwhile
        run, ref = misaligned(call)
        for out, expected in zip(run(), ref()):
            assert_rope_close(out, expected, torch.bfloat16, f"misaligned, call {call}")
    with monkeypatch.context() as m:
        m.setattr(_launch, "SHORTEST", False)
        run, ref = make(3)
        for out, expected in zip(run(), ref()):
            assert_rope_close(out, expected, torch.bfloat16, "SHORTEST off")
    seen = []
    chain = triton.knobs.runtime.launch_enter_hook
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    chain.add(hook)
    try:
        run, ref = make(4)
        outs = run()
    finally:
        chain.remove(hook)
    for out, expected in zip(outs, ref()):
        assert_rope_close(out, expected, torch.bfloat16, "hook")
    assert len(seen) == 1 and launches == []
    make(5)[0]()
    assert len(launches) == 1  # and back on the shortest path


@gpu
def test_armed_shortcut_falls_back_when_its_launcher_rejects_the_call(shortcuts, seed,
                                                                      monkeypatch):
    _own_launch_or_skip(monkeypatch)
    make = _calls("te", seed)
    for call in range(3):
        make(call)[0]()
    (entry,) = _entries(shortcuts)

    def changed(*args):  # a launch function that takes other arguments
        raise TypeError(f"function takes exactly {len(args) + 1} arguments")

    driver, device, stream_of, _, plan = entry.ready
    entry.ready = (driver, device, stream_of, changed, plan)
    run, ref = make(3)
    with pytest.warns(RuntimeWarning, match="thin launch path off"):
        (out,) = run()
    assert_rope_close(out, ref()[0], torch.bfloat16)
    assert _launch.ENABLED is False


def _assert_right_but_not_armed(shortcuts, seed):
    """Five TE-style calls of one signature match the reference, and its shortcut never arms."""
    make = _calls("te", seed)
    for call in range(5):
        run, ref = make(call)
        (out,) = run()
        assert_rope_close(out, ref()[0], torch.bfloat16, f"call {call}")
    (entry,) = _entries(shortcuts)
    assert entry.ready is None


@gpu
@pytest.mark.parametrize("allocation", ["raises", "wrong"])
def test_shortcut_not_armed_when_the_allocation_breaks_its_contract(allocation, shortcuts, seed,
                                                                   monkeypatch):
    """The shortest path allocates through inductor's empty_strided_cuda (a private torch
    function); arming checks once that it gives what torch.empty_strided would."""
    pytest.importorskip("triton")
    monkeypatch.setattr(_launch, "ENABLED", True)

    def broken(shape, stride, dtype):
        if allocation == "raises":
            raise TypeError("empty_strided_cuda() takes other arguments")
        return torch.empty(0, dtype=dtype, device=DEVICE)

    monkeypatch.setattr(_launch, "_EMPTY_STRIDED_CUDA", broken)
    _assert_right_but_not_armed(shortcuts, seed)


@gpu
def test_shortcut_not_armed_when_the_driver_reports_other_parameters(shortcuts, seed,
                                                                     monkeypatch):
    """The own launcher's plan fixes the kernel's parameters as triton 3.6-3.9 pass them; arming
    compares that list with the parameter sizes the CUDA driver reports for the kernel and does
    not arm on any difference."""
    _own_launch_or_skip(monkeypatch)
    module = _launch._own_launcher()
    assert module is not None

    class OneMore:  # the same launcher, but the driver reports one more parameter
        launch, make_plan = module.launch, module.make_plan

        @staticmethod
        def param_sizes(function):
            return module.param_sizes(function) + [8]

    monkeypatch.setattr(_launch, "_own_launcher", lambda: OneMore)
    _assert_right_but_not_armed(shortcuts, seed)


@gpu
def test_own_launcher_refuses_a_misaligned_address_and_wrong_tensors(shortcuts, seed,
                                                                     monkeypatch):
    """The C launcher checks what the Python side no longer does per call: every address it
    reads is 16-byte aligned (else it launches nothing and returns False), and the call has the
    tensors the plan reads (else TypeError, launching nothing)."""
    _own_launch_or_skip(monkeypatch)
    make = _calls("te_start", seed)
    for call in range(3):
        make(call)[0]()
    (entry,) = _entries(shortcuts)
    launches = _spy(entry)
    make(3)[0]()
    ((plan, stream, inputs, outputs),) = launches
    launch = entry.ready[3]
    tensors = (*inputs, *outputs)
    read = sorted(set(entry.tensors))
    assert read == [0, 1, 2, 4]  # t, freqs, start_positions (not cu_seqlens: None), output
    with pytest.raises(TypeError, match="launch"):
        launch(plan, stream, inputs)
    with pytest.raises(TypeError, match="tensor 4 of the call, which has 3"):
        launch(plan, stream, inputs[:3], [])
    with pytest.raises(TypeError, match="data_ptr"):
        launch(plan, stream, (None, *inputs[1:]), outputs)
    for i in read:
        # The same dtype 4 or 8 bytes into a larger allocation: not 16-byte aligned.
        x = tensors[i]
        shifted = torch.empty(x.numel() + 16, dtype=x.dtype, device=x.device)[
            max(1, 4 // x.element_size()):]
        assert shifted.data_ptr() % 16
        moved = [shifted if j == i else y for j, y in enumerate(tensors)]
        assert launch(plan, stream, tuple(moved[:len(inputs)]), moved[len(inputs):]) is False
    assert len(launches) == 1


@gpu
@pytest.mark.parametrize("entry_point", ["te_start", "cache_inplace"])
def test_armed_shortcut_called_from_another_thread(entry_point, shortcuts, seed, monkeypatch):
    """A thread other than the one that armed the shortcut gets right results (the launcher
    launches only while the plan's CUDA context is current, else the call takes thin_launch)."""
    import threading

    _own_launch_or_skip(monkeypatch)
    make = _calls(entry_point, seed)
    for call in range(3):
        make(call)[0]()
    (entry,) = _entries(shortcuts)
    assert entry.ready is not None
    results = []

    def work():
        for call in range(3, 6):
            run, ref = make(call)
            results.append((run(), ref()))
            torch.cuda.synchronize()

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert len(results) == 3
    for call, (outs, refs) in enumerate(results):
        for out, expected in zip(outs, refs):
            assert_rope_close(out, expected, torch.bfloat16, f"thread call {call}")


@gpu
def test_shortcut_stays_on_thin_launch_when_its_launcher_does_not_build(shortcuts, seed,
                                                                        monkeypatch):
    """No C compiler (or another Triton layout): a warning, and the shortcut keeps calling
    thin_launch with right results."""
    _own_launch_or_skip(monkeypatch)
    import triton.runtime.build as build

    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C compiler")

    monkeypatch.setattr(build, "compile_module_from_src", no_compiler)
    monkeypatch.setattr(_launch, "_OWN_LAUNCHER", None)
    with pytest.warns(RuntimeWarning, match="did not build"):
        _assert_right_but_not_armed(shortcuts, seed)
    assert _launch.ENABLED
