"""rope_qk's two shapes of program, forced for every entry point that uses the kernel: one head
block of one part per program, and ``all_heads`` (a program loops over every head block of q, k
and v for its tokens, with their cos/sin computed once, or once per table when q and k have
their own); each with the pairs' tiles and with whole rows (``whole_rows``: half-split pairs
only, interleaved ones keep the pairs' tiles). Head counts that block sizes do not divide leave
a partly masked last block in each loop; head sizes that are not powers of two, a partly
masked row; float64 references, NaN-poisoned outputs where the API takes them."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, assert_rope_close, hf_cos_width, hf_reference, randn
from rope_kernels import RotaryPositionEmbedding, rope_qk, rope_reference
from test_serving import make_cache, reference as cache_reference

MODES = [dict(block_s=2, block_h=2, num_warps=4, all_heads=True),
         dict(block_s=1, block_h=4, block_hk=2, num_warps=4, all_heads=True),
         dict(block_s=1, block_h=1, num_warps=2, all_heads=True),
         dict(block_s=2, block_h=2, num_warps=4, all_heads=False),
         # loads first: q (5 heads) in one block, k (3) in another; with 4-head blocks q needs
         # two, and the program takes the all-heads loop instead
         dict(block_s=1, block_h=8, block_hk=4, num_warps=2, all_heads=True, loads_first=True),
         dict(block_s=2, block_h=4, block_hk=4, num_warps=2, all_heads=True, loads_first=True),
         dict(block_s=2, block_h=2, num_warps=4, all_heads=False, whole_rows=True),
         dict(block_s=1, block_h=4, block_hk=2, num_warps=4, all_heads=True, whole_rows=True),
         dict(block_s=1, block_h=8, block_hk=4, num_warps=2, all_heads=True, loads_first=True,
              whole_rows=True)]


@pytest.fixture(params=MODES, ids=lambda m: f"s{m['block_s']}h{m['block_h']}"
                + (f"hk{m['block_hk']}" if "block_hk" in m else "")
                + ("-all_heads" if m["all_heads"] else "-one_block")
                + ("-loads_first" if m.get("loads_first") else "")
                + ("-whole_rows" if m.get("whole_rows") else ""))
def mode(request, monkeypatch):
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    monkeypatch.setattr(rope_qk, "default_config", lambda *args, **kwargs: dict(request.param))
    return request.param


# (is_neox, interleaved pairs read as words): the three ways the kernel reads pairs
PAIRINGS = [(True, False), (False, True), (False, False)]


def _backward_cache(cache: torch.Tensor) -> torch.Tensor:
    """The cache whose forward is ``cache``'s backward: a rotation by -theta, its sin half
    negated."""
    half = cache.shape[-1] // 2
    return torch.cat((cache[:, :half], -cache[:, half:]), -1)


def _cache_switched(monkeypatch, switch, shape, dtype, backward, seed):
    """The cache's half-split call at ``shape`` (tokens, q_heads, k_heads, head_size,
    rotary_dim), positions in any order, forward or backward, into NaN-poisoned outputs, with
    rope_qk's module switch ``switch`` on, then off: asserts the results are the same bits
    either way and match the float64 reference (tolerances of ``dtype``). Returns the plan
    either way, keyed by the switch."""
    tokens, q_heads, k_heads, head_size, rotary_dim = shape
    cache = make_cache(64, rotary_dim)
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 64, (tokens,), generator=g).to(DEVICE)
    query = randn((tokens, q_heads * head_size), dtype, seed)
    key = randn((tokens, k_heads * head_size), dtype, seed + 1)
    results, plans = {}, {}
    for flag in (True, False):
        monkeypatch.setattr(rope_qk, switch, flag)
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        q_out = torch.full_like(query, float("nan"))
        k_out = torch.full_like(key, float("nan"))
        rope_qk.rope_cos_sin_cache(positions, query, key, head_size, cache, True,
                                   query_out=q_out, key_out=k_out, backward=backward)
        (plans[flag],) = rope_qk._PLANS.values()
        results[flag] = q_out, k_out
    for got, before in zip(results[True], results[False]):
        assert torch.equal(got, before)
    ref_cache = _backward_cache(cache) if backward else cache
    for got, x, name in zip(results[True], (query, key), ("query", "key")):
        assert_rope_close(got, cache_reference(positions, x, head_size, ref_cache, True),
                          dtype, name)
    return plans


@pytest.mark.parametrize("is_neox,words", PAIRINGS,
                         ids=["half-split", "interleaved-words", "interleaved-split"])
@pytest.mark.parametrize("backward", [False, True])
def test_cache(mode, is_neox, words, backward, seed):
    tokens, q_heads, k_heads, head_size = 5, 5, 3, 20
    cache = make_cache(32, 12)
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 32, (tokens,), generator=g).to(DEVICE)
    query = randn((tokens, q_heads * head_size), torch.float32, seed)
    key = randn((tokens, k_heads * head_size), torch.float32, seed + 1)
    if not is_neox and not words:  # query at an odd address: the pairs split from a tile
        flat = torch.empty(query.numel() + 1, device=DEVICE)
        query = flat[1:].view(query.shape).copy_(query)
    q_out = torch.full_like(query, float("nan"))
    k_out = torch.full_like(key, float("nan"))
    rope_qk.rope_cos_sin_cache(positions, query, key, head_size, cache, is_neox,
                               query_out=q_out, key_out=k_out, backward=backward)
    (plan,) = rope_qk._PLANS.values()
    assert plan.constexprs["INTERLEAVED"] == (0 if is_neox else 2 if words else 1)
    assert plan.constexprs["LOADS_FIRST"] == (mode.get("loads_first", False)
                                              and mode["block_h"] >= q_heads
                                              and mode.get("block_hk", mode["block_h"]) >= k_heads)
    assert plan.constexprs["ROW"] == (32 if mode.get("whole_rows") and is_neox else 0)
    ref_cache = _backward_cache(cache) if backward else cache
    assert_rope_close(q_out, cache_reference(positions, query, head_size, ref_cache, is_neox),
                      torch.float32, "query")
    assert_rope_close(k_out, cache_reference(positions, key, head_size, ref_cache, is_neox),
                      torch.float32, "key")


# The q+k calls of ``_q_k_call``: the cache's two pairings and every Hugging Face convention.
CALLS = ["cache half-split", "cache interleaved"] + [f"hf {p}" for p in rope_qk.HF_PAIRS]


def _q_k_call(call, tokens, q_heads, k_heads, head_size, rotary_dim, seed, dtype=torch.float32):
    """q and k (float32 unless ``dtype``) of one q+k call, rotary_dim of head_size channels
    rotated: "cache half-split", "cache interleaved" (``[tokens, heads * head_size]``), "hf
    <pairs>" of rope_qk.HF_PAIRS (``[1, h, s, d]`` views of ``[1, s, h, d]`` projections; cos
    and sin rotary_dim / 2 wide for GPT-OSS's pairs, which the kernel rotates as the rest, part
    of the head too). Returns q, k, their float64 references, ``rows`` (a view with heads and
    channels last) and ``run(q_out=None, k_out=None, q_in=None, k_in=None)``, the call on
    ``q_in`` and ``k_in`` (q and k if None) writing into the outputs given (new ones if None;
    the inputs for in place), which returns its results."""
    g = torch.Generator().manual_seed(seed)
    if call.startswith("hf"):
        pairs = call.split()[1]
        if pairs == "deepseek" and rotary_dim < head_size:
            pytest.skip("DeepSeek V3's function rotates the whole head")
        q = randn((1, tokens, q_heads, head_size), dtype, seed).transpose(1, 2)
        k = randn((1, tokens, k_heads, head_size), dtype, seed + 1).transpose(1, 2)
        angles = torch.rand((1, tokens, rotary_dim // 2), generator=g) * 6.3
        per_pair = pairs.endswith("_per_pair")
        emb = (angles if per_pair else torch.cat((angles, angles), -1)).to(DEVICE)
        cos, sin = emb.cos(), emb.sin()
        want = [hf_reference(x, cos, sin, pairs=pairs) for x in (q, k)]

        def run(q_out=None, k_out=None, q_in=None, k_in=None):
            return rope_qk.rope_cos_sin(q if q_in is None else q_in, k if k_in is None else k_in,
                                        cos, sin, 1, pairs=pairs, q_out=q_out, k_out=k_out)
        return q, k, want, lambda x: x, run
    neox = call.endswith("half-split")
    positions = torch.randint(0, 32, (tokens,), generator=g).to(DEVICE)
    cache = make_cache(32, rotary_dim)
    q = randn((tokens, q_heads * head_size), dtype, seed)
    k = randn((tokens, k_heads * head_size), dtype, seed + 1)
    want = [cache_reference(positions, x, head_size, cache, neox) for x in (q, k)]

    def run(q_out=None, k_out=None, q_in=None, k_in=None):
        return rope_qk.rope_cos_sin_cache(positions, q if q_in is None else q_in,
                                          k if k_in is None else k_in, head_size, cache, neox,
                                          query_out=q_out, key_out=k_out)
    return q, k, want, lambda x: x.reshape(tokens, -1, head_size), run


BOTH_WAYS = ("q", "k", "q in place", "k in place")


def _both_ways(run, q, k):
    """``run`` (``_q_k_call``'s) into NaN-poisoned outputs, then in place on copies of q and k,
    each planned afresh (rope_qk's plan table emptied before): the four results (``BOTH_WAYS``)
    and the two plans."""
    rope_qk._PLANS.clear()
    q_out, k_out = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    run(q_out, k_out)
    (out_plan,) = rope_qk._PLANS.values()
    rope_qk._PLANS.clear()
    q_in, k_in = q.clone(), k.clone()
    run(q_in, k_in, q_in, k_in)  # in place
    (in_plan,) = rope_qk._PLANS.values()
    return (q_out, k_out, q_in, k_in), out_plan, in_plan


def _switch_both_ways(monkeypatch, switch, run, q, k, want, rows, dtype=torch.float32,
                      off=False):
    """``_both_ways`` with rope_qk's module switch ``switch`` on (True; a table as it is), then
    off (set to ``off``: False, or an empty table): asserts that the four results are the same bits either
    way and that those with it on match the float64 references ``want`` (through ``rows``;
    tolerances of ``dtype``). Returns the results and the plans (out of place, in place) with it
    on and with it off, keyed by True and False."""
    on = True if off is False else getattr(rope_qk, switch)
    results, plans, values = {}, {}, {True: on, False: off}
    for flag in (True, False):
        monkeypatch.setattr(rope_qk, switch, values[flag])
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        results[flag], *plans[flag] = _both_ways(run, q, k)
    for got, before, name in zip(results[True], results[False], BOTH_WAYS):
        assert torch.equal(got, before), name
    for got, ref, name in zip(results[True], want * 2, BOTH_WAYS):
        assert_rope_close(rows(got), rows(ref), dtype, name)
    return results, plans


@pytest.mark.parametrize("call", CALLS)
def test_in_place_leaves_the_channels_past_rotary_dim(mode, call, seed):
    """In place with part of the head rotated (12 of 20 channels), the plan is that of heads
    narrowed to rotary_dim (PASS 0, head_dim 12: the channels past it are neither read nor
    written, as vLLM's and FlashInfer's in-place kernels leave them): the rotated channels
    against the float64 reference, the rest bit for bit as they were. Out of place the same call
    copies them (PASS 8 channels, 4 words for pairs read as words; head_dim 20)."""
    tokens, q_heads, k_heads, head_size, rotary_dim = 5, 5, 3, 20, 12
    q, k, want, rows, run = _q_k_call(call, tokens, q_heads, k_heads, head_size, rotary_dim, seed)
    for in_place, passed, width in ((False, 8, head_size), (True, 0, rotary_dim)):
        before = q.clone(), k.clone()
        rope_qk._PLANS.clear()
        run(q, k) if in_place else run()
        (plan,) = rope_qk._PLANS.values()
        words = plan.constexprs["INTERLEAVED"] == 2  # (pairs as words: PASS counts words)
        assert plan.constexprs["PASS"] == passed // (2 if words else 1)
        assert plan.scalars[7:9] == (rotary_dim, width)
    for got, ref, old, name in zip((q, k), want, before, "qk"):
        got, ref, old = rows(got), rows(ref), rows(old)
        assert_rope_close(got[..., :rotary_dim], ref[..., :rotary_dim], torch.float32, name)
        assert torch.equal(got[..., rotary_dim:], old[..., rotary_dim:]), name


@pytest.mark.parametrize("backward", [False, True])
def test_hf(mode, backward, seed):
    b, s, q_heads, k_heads, d, r = 2, 3, 5, 3, 20, 12
    q = randn((b, s, q_heads, d), torch.bfloat16, seed).transpose(1, 2)  # HF's [b, h, s, d] view
    k = randn((b, s, k_heads, d), torch.bfloat16, seed + 1).transpose(1, 2)
    angles = randn((b, s, r // 2), torch.float32, seed + 2)
    emb = torch.cat((angles, angles), -1)
    cos, sin = emb.cos().bfloat16(), emb.sin().bfloat16()
    q_out, k_out = rope_qk.rope_cos_sin(q, k, cos, sin, heads_axis=1, backward=backward)
    # The backward rotates by -theta (the tables' two halves are equal): sin negated.
    ref_sin = -sin if backward else sin
    assert_rope_close(q_out, hf_reference(q, cos, ref_sin), torch.bfloat16, "q")
    assert_rope_close(k_out, hf_reference(k, cos, ref_sin), torch.bfloat16, "k")


@pytest.mark.parametrize("pairs", list(rope_qk.HF_PAIRS))
@pytest.mark.parametrize("backward", [False, True])
def test_hf_conventions(mode, pairs, backward, seed):
    """Every Hugging Face convention in every program shape, forward and backward, on random
    cos and sin (a pair's two entries unrelated, so that the backward must be the exact
    transpose and each entry must be read where the convention puts it), the whole head
    rotated, against the float64 formula and its gradient."""
    b, s, q_heads, k_heads, d = 2, 3, 5, 3, 16
    q = randn((b, s, q_heads, d), torch.float32, seed).transpose(1, 2)
    k = randn((b, s, k_heads, d), torch.float32, seed + 1).transpose(1, 2)
    width = hf_cos_width(pairs, d, d)
    cos, sin = randn((b, s, width), torch.float32, seed + 2), randn((b, s, width), torch.float32,
                                                                    seed + 3)
    outs = rope_qk.rope_cos_sin(q, k, cos, sin, 1, backward=backward, pairs=pairs)
    (plan,) = rope_qk._PLANS.values()
    interleaved = rope_qk.HF_PAIRS[pairs][1]
    assert plan.constexprs["ROW"] == (16 if mode.get("whole_rows") and not interleaved else 0)
    for x, out, name in zip((q, k), outs, "qk"):
        ref = (_hf_backward_reference if backward else hf_reference)(x, cos, sin, pairs=pairs)
        assert_rope_close(out, ref, torch.float32, name)


@pytest.mark.parametrize("same_table", [True, False])
def test_qkv(mode, same_table, seed):
    """q and k from their own tables (or one shared one), v copied: 3 groups of 2 query heads."""
    s, b, groups, d = 4, 2, 3, 16
    splits = [2 * d, d, d]
    qkv = randn((s, b, groups, sum(splits)), torch.float32, seed)
    q_freqs = RotaryPositionEmbedding(12, device=DEVICE)(s)
    k_freqs = q_freqs if same_table else RotaryPositionEmbedding(12, rotary_base=500.0, device=DEVICE)(s)
    q, k, v = rope_qk.rope_qkv(qkv, q_freqs, k_freqs, splits)
    q_in, k_in, v_in = torch.split(qkv, splits, dim=3)
    assert_rope_close(q, rope_reference(q_in.reshape(s, b, -1, d).double(), q_freqs),
                      torch.float32, "q")
    assert_rope_close(k, rope_reference(k_in.double(), k_freqs), torch.float32, "k")
    assert torch.equal(v, v_in)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qkv_backward(mode, dtype, seed):
    """The gradient of fused QKV: q's and k's rotated back by R(-theta) (their tables' two halves
    are equal: the forward with the angles negated), v's copied, into one qkv-shaped tensor."""
    s, b, groups, d = 4, 2, 3, 20
    splits = [2 * d, d, d]
    q_grad = randn((s, b, 2 * groups, d), dtype, seed)
    k_grad = randn((s, b, groups, d), dtype, seed + 1)
    v_grad = randn((s, b, groups, d), dtype, seed + 2)
    q_freqs = RotaryPositionEmbedding(12, device=DEVICE)(s)
    k_freqs = RotaryPositionEmbedding(12, rotary_base=500.0, device=DEVICE)(s)
    grad = rope_qk.rope_qkv_backward(q_grad, k_grad, v_grad, q_freqs, k_freqs, splits)
    dq, dk, dv = torch.split(grad, splits, dim=3)
    assert_rope_close(dq.reshape(s, b, -1, d), rope_reference(q_grad.double(), -q_freqs),
                      dtype, "q")
    assert_rope_close(dk, rope_reference(k_grad.double(), -k_freqs), dtype, "k")
    assert torch.equal(dv, v_grad)


def _interleaved_layouts(dtype, seed, tokens=5, q_heads=5, k_heads=3, head_size=20):
    """(name, query, key, query_out or None, pairs as words?) for the cache's interleaved pairs:
    [tokens, heads * head_size] and [tokens, heads, head_size] q and k whose pairs can be read
    as one word each, and layouts that fall back to splitting a [..., HALF, 2] tile."""
    q = randn((tokens, q_heads * head_size), dtype, seed)
    k = randn((tokens, k_heads * head_size), dtype, seed + 1)

    def at_odd_address(x):
        flat = torch.empty(x.numel() + 1, dtype=dtype, device=DEVICE)
        return flat[1:].view(x.shape).copy_(x)

    def odd_row_stride(x):
        wide = torch.empty((x.shape[0], x.shape[1] + 1), dtype=dtype, device=DEVICE)
        return wide[:, : x.shape[1]].copy_(x)

    heads_outer = q.view(tokens, q_heads, head_size).transpose(0, 1).contiguous().transpose(0, 1)
    channels_strided = (q.view(tokens, q_heads, head_size).transpose(1, 2).contiguous()
                        .transpose(1, 2))
    nan_at_odd_address = at_odd_address(torch.full_like(q, float("nan")))
    return [
        ("contiguous", q, k, None, True),
        ("3-D, heads the outer axis", heads_outer, k.view(tokens, k_heads, head_size), None, True),
        ("odd address of query", at_odd_address(q), k, None, False),
        ("odd address of key", q, at_odd_address(k), None, False),
        ("odd address of query_out", q, k, nan_at_odd_address, False),
        ("odd row stride of key", q, odd_row_stride(k), None, False),
        ("3-D, channels strided", channels_strided, k.view(tokens, k_heads, head_size), None,
         False),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backward", [False, True])
def test_cache_interleaved_pairs_as_words_and_fallback(dtype, backward, seed, monkeypatch):
    """Interleaved pairs are read and written as one 32-bit (64-bit for float32) word each where
    every row of q and k, read and written, starts at an even element with contiguous channels,
    and split from a [..., HALF, 2] tile otherwise. Both paths, with channels past rotary_dim
    copied through (as words on the first), against the float64 reference, outputs poisoned;
    the chosen path is checked, so neither can be silently lost; the inputs are not modified."""
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    head_size, rotary_dim = 20, 12
    cache = make_cache(32, rotary_dim)
    ref_cache = _backward_cache(cache) if backward else cache
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 32, (5,), generator=g).to(DEVICE)
    for name, query, key, query_out, words in _interleaved_layouts(dtype, seed):
        before = query.clone(), key.clone()
        if query_out is None:
            query_out = torch.full_like(query, float("nan"))
        key_out = torch.full_like(key, float("nan"))
        rope_qk._PLANS.clear()  # so that the one plan left afterwards is this call's
        rope_qk.rope_cos_sin_cache(positions, query, key, head_size, cache, False,
                                   query_out=query_out, key_out=key_out, backward=backward)
        (plan,) = rope_qk._PLANS.values()
        assert plan.constexprs["INTERLEAVED"] == (2 if words else 1), name
        assert plan.constexprs["PASS"] == (4 if words else 8), name  # 8 channels: 4 words
        path = f"{name} ({'words' if words else 'split'})"
        flat = lambda x: x.reshape(x.shape[0], -1)  # noqa: E731
        assert_rope_close(flat(query_out), cache_reference(positions, flat(query), head_size,
                                                           ref_cache, False), dtype, path)
        assert_rope_close(flat(key_out), cache_reference(positions, flat(key), head_size,
                                                         ref_cache, False), dtype, path)
        assert torch.equal(query, before[0]) and torch.equal(key, before[1]), path


@pytest.mark.parametrize("pairs", ["interleaved", "glm"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("backward", [False, True])
def test_hf_interleaved_pairs_as_words_and_fallback(pairs, dtype, backward, seed, monkeypatch):
    """Hugging Face's interleaved pairings (Cohere's, GLM's with part of the head rotated) on
    the [b, h, s, d] views models hand over (pairs as words) and on a view of a tensor at an odd
    address (split): both against the float64 formula."""
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    b, s, q_heads, k_heads, d = 2, 3, 5, 3, 20
    r = d if pairs == "interleaved" else 12  # GLM's partial rotary: cos/sin 12 wide, 6 pairs
    q = randn((b, s, q_heads, d), dtype, seed).transpose(1, 2)
    k = randn((b, s, k_heads, d), dtype, seed + 1).transpose(1, 2)
    angles = randn((b, s, r), torch.float32, seed + 2)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    flat = torch.empty(k.numel() + 1, dtype=dtype, device=DEVICE)
    k_odd = flat[1:].view(b, s, k_heads, d).copy_(k.transpose(1, 2)).transpose(1, 2)
    for name, kk, words in (("views", k, True), ("k at an odd address", k_odd, False)):
        rope_qk._PLANS.clear()
        q_out, k_out = rope_qk.rope_cos_sin(q, kk, cos, sin, 1, backward=backward, pairs=pairs)
        (plan,) = rope_qk._PLANS.values()
        assert plan.constexprs["INTERLEAVED"] == (2 if words else 1), name
        # The backward is the transpose of the forward (Cohere's tables give a pair's two
        # channels angles of their own here, so it is not the forward with sin negated).
        for x, out in ((q, q_out), (kk, k_out)):
            ref = (_hf_backward_reference if backward else hf_reference)(x, cos, sin, pairs=pairs)
            assert_rope_close(out, ref, dtype, f"{name} ({'words' if words else 'split'})")


def _hf_backward_reference(grad, cos, sin, pairs="half"):
    """float64: the gradient of transformers' formula (``hf_reference``) with respect to its input
    for the output gradient ``grad``, through autograd: the exact transpose of the forward, also
    where a pair's two channels have angles of their own."""
    x64 = torch.zeros(grad.shape, dtype=torch.float64, device=DEVICE, requires_grad=True)
    hf_reference(x64, cos, sin, pairs=pairs).backward(grad.double())
    return x64.grad


def _loads_first(q_heads, k_heads, warps, tokens=1):
    """The loads-first config (``tokens`` a program, all of their q in one block, all of their
    k in another)."""
    return dict(block_s=tokens, block_h=1 << (q_heads - 1).bit_length(),
                block_hk=1 << (k_heads - 1).bit_length(), num_warps=warps, all_heads=True,
                loads_first=True)


def _blocks(block_s, block_h, warps):
    """A config of one head block a program."""
    return dict(block_s=block_s, block_h=block_h, num_warps=warps, all_heads=False)


def _gathered(block_s, block_h, warps=2):
    """A config of whole rows with the partners gathered (``GATHERED_PARTNERS``), on 2 warps
    unless said."""
    return dict(_blocks(block_s, block_h, warps), whole_rows=True, gather=True)


def _own_k(block_s, block_h, warps, block_hk):
    """A gathered config whose k blocks have k's own head count (``block_hk``, named where it
    differs from ``block_h``): the few-k-head rules' tiles."""
    cfg = _gathered(block_s, block_h, warps)
    return cfg if block_hk == block_h else dict(cfg, block_hk=block_hk)


def test_default_config_of_hugging_face_tables(monkeypatch):
    """Hugging Face's cos/sin where a row is 256 B or more, k fills 2 KB and the whole head is
    rotated: one head block per program on 2 warps, 4 KB where q's heads fill 4 KB blocks and
    2 KB otherwise; loads first on 4 warps where all of q fits 4 KB and k is no bigger. Partial
    rotary, interleaved pairs and the interpreter keep their tiles (the measured reasons are in
    default_config's docstring). These are the rules below ``HEAD_COUNT_TILES``, switched off
    here; test_default_config_of_head_counts has what it changes of them in 16-bit."""
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", False)  # the pairs' tiles (16-bit: below)
    monkeypatch.setattr(rope_qk, "HEAD_COUNT_TILES", False)
    hf_tables = rope_qk.ANGLES["cos_sin"]

    def blocks(heads):
        return _blocks(1, heads, 2)

    def loads_first(q_heads, k_heads):
        return _loads_first(q_heads, k_heads, 4)

    cases = {  # (q_heads, k_heads, head_dim, element size): config
        (32, 8, 128, 2): blocks(16), (64, 8, 128, 2): blocks(16), (32, 32, 128, 2): blocks(16),
        (24, 8, 128, 2): blocks(8), (40, 8, 128, 2): blocks(8), (8, 16, 128, 2): blocks(8),
        (32, 8, 128, 4): blocks(8), (12, 4, 128, 4): blocks(4), (32, 8, 64, 4): blocks(16),
        (8, 8, 128, 2): loads_first(8, 8), (16, 8, 128, 2): loads_first(16, 8),
        (16, 16, 128, 2): loads_first(16, 16), (8, 8, 128, 4): loads_first(8, 8),
    }
    for (q_heads, k_heads, head_dim, esize), want in cases.items():
        for rotary_dim in (head_dim, None):
            got = rope_qk.default_config(4096, q_heads, k_heads, head_dim, esize, True, False,
                                         hf_tables, rotary_dim)
            assert got == want, (q_heads, k_heads, head_dim, esize, rotary_dim, got)
        for on_gpu, interleaved, rotary_dim in ((True, False, head_dim // 2), (False, False, None),
                                                (True, True, None)):
            got = rope_qk.default_config(4096, q_heads, k_heads, head_dim, esize, on_gpu,
                                         interleaved, hf_tables, rotary_dim)
            assert got != want and not got.get("loads_first"), (q_heads, k_heads, got)
    # k does not fill 2 KB: loads first on 2 warps (test_default_config_loads_first)
    assert rope_qk.default_config(4096, 16, 4, 128, 2, True, False, hf_tables, 128)["num_warps"] == 2


def test_default_config_of_interleaved_hugging_face_tables():
    """Cohere's and GLM's pairings (interleaved pairs, Hugging Face's tables) in 16-bit: the 2 KB
    interleaved tile on 2 warps; float32, the interpreter and TE's tables keep 4."""
    for angles in (rope_qk.ANGLES["cos_sin"], rope_qk.ANGLES["cos_sin_half"]):
        got = rope_qk.default_config(4096, 32, 8, 128, 2, True, True, angles, 128)
        assert got == dict(block_s=1, block_h=8, num_warps=2, all_heads=False,
                           whole_rows=False), got
        assert rope_qk.default_config(4096, 32, 8, 64, 2, True, True, angles, 64)["block_s"] == 2
        for esize, on_gpu in ((4, True), (2, False)):
            got = rope_qk.default_config(4096, 32, 8, 128, esize, on_gpu, True, angles, 128)
            assert got["num_warps"] == 4, (esize, on_gpu, got)
    got = rope_qk.default_config(4096, 32, 8, 128, 2, True, True, rope_qk.ANGLES["freqs"], 128)
    assert got["num_warps"] == 4


def test_default_config_of_pairs_as_words():
    """Interleaved pairs read as words: at head_dim 65 to 128 (rows of 128 channels) on a GPU, one
    token's 8 heads a program, a warp per KB (2 warps in 16-bit, 4 in float32), for every table;
    Hugging Face's tables at head_dim 64 in 16-bit: test_default_config_of_words_in_128_byte_rows;
    elsewhere the tile the same call gets for half-split pairs (scripts/qk_pairs_as_words.py)."""
    hf_tables = (rope_qk.ANGLES["cos_sin"], rope_qk.ANGLES["cos_sin_half"])
    for angles in rope_qk.ANGLES.values():
        for element_size, warps in ((2, 2), (4, 4)):
            for q_heads, block_h in ((32, 8), (4, 4)):
                for head_dim in (128, 96):
                    args = (4096, q_heads, 4, head_dim, element_size, True, True, angles)
                    assert rope_qk.default_config(*args, words=True) == dict(
                        block_s=1, block_h=block_h, num_warps=warps, all_heads=False), args
        for head_dim, element_size, on_gpu in ((64, 2, True), (64, 4, True), (256, 2, True),
                                               (128, 2, False)):
            if (head_dim, element_size, on_gpu) == (64, 2, True) and angles in hf_tables:
                continue
            for in_place in (False, True):
                args = (4096, 32, 8, head_dim, element_size, on_gpu)
                rest = (angles, head_dim, in_place, False)
                assert (rope_qk.default_config(*args, True, *rest, words=True)
                        == rope_qk.default_config(*args, False, *rest)), (args, rest)


def test_other_conventions_take_llamas_tiles():
    """GPT-OSS's tables (one entry per pair, half-split pairs) and NanoChat's (sin negated) are
    planned with the tiles of Llama's tables, FlashInfer's frequencies per pair (no rows: the
    positions and q and k read as the cache's calls read them) with the cache's; every other
    table keeps its own rules (GLM's and the privacy filter's, one entry per pair with
    interleaved pairs, among them)."""
    angles = rope_qk.ANGLES
    assert rope_qk._tile_angles(angles["cos_sin_half"], False) == angles["cos_sin"]
    assert rope_qk._tile_angles(angles["cos_sin_neg"], False) == angles["cos_sin"]
    for interleaved in (False, True):
        assert rope_qk._tile_angles(angles["inv_freq"], interleaved) == angles["cache"]
    for name, value in angles.items():
        if name not in ("cos_sin_neg", "inv_freq"):
            assert rope_qk._tile_angles(value, True) == value, name
        if name not in ("cos_sin_half", "cos_sin_neg", "inv_freq"):
            assert rope_qk._tile_angles(value, False) == value, name


def test_default_config_of_narrowed_heads(monkeypatch):
    """In place with part of the head rotated, float32, half-split pairs, 8 q and k heads or more,
    on a GPU: whole rows, 1 token x 8 heads on 2 warps for rows of 64 channels (256 B), 2 x 8 for
    32 (scripts/qk_in_place_narrow_tiles.py). 16-bit, interleaved pairs, fewer heads, other row
    widths, whole heads in place, the interpreter and the flag turned off keep the other rules."""
    cache, hf_tables = rope_qk.ANGLES["cache"], rope_qk.ANGLES["cos_sin"]

    def config(q_heads=32, k_heads=8, width=64, esize=4, on_gpu=True, interleaved=False,
               angles=cache, narrowed=True):
        return rope_qk.default_config(4096, q_heads, k_heads, width, esize, on_gpu, interleaved,
                                      angles, width, True, narrowed=narrowed)

    for angles in (cache, hf_tables):
        for k_heads in (8, 32):
            assert config(k_heads=k_heads, angles=angles) == dict(
                block_s=1, block_h=8, num_warps=2, all_heads=False, whole_rows=True)
            assert config(k_heads=k_heads, width=32, angles=angles) == dict(
                block_s=2, block_h=8, num_warps=2, all_heads=False, whole_rows=True)
        rule = config(angles=angles)
        for other in (dict(esize=2), dict(interleaved=True), dict(k_heads=4), dict(q_heads=4),
                      dict(width=128), dict(width=16), dict(on_gpu=False), dict(narrowed=False)):
            assert config(**{"angles": angles, **other}) != rule, other
        monkeypatch.setattr(rope_qk, "NARROWED_ROWS", False)
        assert config(angles=angles) != rule
        monkeypatch.setattr(rope_qk, "NARROWED_ROWS", True)


@pytest.mark.parametrize("rotary_dim", [64, 32])
@pytest.mark.parametrize("call", ["cache half-split", "hf half"])
def test_in_place_narrowed_heads_default_plan(call, rotary_dim, seed):
    """The default plan of an in-place float32 call with part of the head rotated at 8 q and k
    heads of 128 (on a GPU: whole rows on the narrowed rule's tile): the rotated channels against
    float64, the rest bit for bit as they were, and the same values as the out-of-place call."""
    q, k, want, rows, run = _q_k_call(call, 3, 8, 8, 128, rotary_dim, seed)
    rope_qk._PLANS.clear()
    outside = run()
    before = q.clone(), k.clone()
    rope_qk._PLANS.clear()
    run(q, k)
    (plan,) = rope_qk._PLANS.values()
    on_gpu = q.is_cuda
    assert plan.scalars[7:9] == (rotary_dim, rotary_dim) and plan.constexprs["PASS"] == 0
    assert plan.constexprs["ROW"] == (rotary_dim if on_gpu else 0)
    if on_gpu:
        assert (plan.constexprs["BLOCK_S"], plan.constexprs["BLOCK_H"], plan.num_warps) == (
            1 if rotary_dim == 64 else 2, 8, 2)
    for got, ref, old, out, name in zip((q, k), want, before, outside, "qk"):
        got, ref, old, out = rows(got), rows(ref), rows(old), rows(out)
        assert_rope_close(got[..., :rotary_dim], ref[..., :rotary_dim], torch.float32, name)
        assert torch.equal(got[..., rotary_dim:], old[..., rotary_dim:]), name
        torch.testing.assert_close(got, out, rtol=2e-7, atol=2e-7)


def test_default_config_of_words_in_128_byte_rows(monkeypatch):
    """Cohere's and GLM's calls (Hugging Face's tables, pairs read as words) at head_dim 64 in
    16-bit on a GPU (``WORDS_128B_HF_TILES``). The whole head rotated: loads first where q fills 4
    KB (2 warps under 2 KB of k, 4 from 2 KB), else 2 tokens x 8 heads on 2 warps, 4 x 4 with 1-3
    k heads. Half of it rotated with the results transposed: GLM's call 2 x 8 on 2 warps, either
    call 4 x 4 on 1 warp with 1-3 k heads. Cohere's half rotary with 4 k heads or more, results
    laid out like the inputs with part of the head rotated, float32, split pairs, the cache and
    the interpreter keep the rules before; so does everything with the flag turned off."""
    cos_sin, glm = rope_qk.ANGLES["cos_sin"], rope_qk.ANGLES["cos_sin_half"]

    def config(q_heads, k_heads, angles=cos_sin, rotary_dim=64, esize=2, on_gpu=True,
               words=True, seq_len=4096, transposed=False):
        return rope_qk.default_config(seq_len, q_heads, k_heads, 64, esize, on_gpu, True, angles,
                                      rotary_dim, False, transposed, words)

    def tile(block_s, block_h, num_warps=2):
        return dict(block_s=block_s, block_h=block_h, num_warps=num_warps, all_heads=False)

    def loads_first(k_heads, num_warps=2):
        return dict(block_s=1, block_h=32, block_hk=k_heads, num_warps=num_warps,
                    all_heads=True, loads_first=True)

    whole = {(32, 8): loads_first(8), (32, 4): loads_first(4), (32, 2): loads_first(2),
             (32, 16): loads_first(16, 4), (32, 32): loads_first(32, 4), (24, 8): tile(2, 8),
             (16, 8): tile(2, 8), (16, 4): tile(2, 8), (8, 8): tile(2, 8), (8, 4): tile(2, 8),
             (16, 16): tile(2, 8), (48, 8): tile(2, 8), (64, 8): tile(2, 8),
             (64, 16): tile(2, 8), (16, 2): tile(4, 4), (8, 2): tile(4, 4), (8, 1): tile(4, 4),
             (12, 3): tile(4, 4), (64, 2): tile(4, 4)}
    # (angles, rotary_dim, transposed, q_heads, k_heads) -> tile
    rule = {(angles, rotary_dim, False, *heads): want for angles in (cos_sin, glm)
            for rotary_dim in (64, None) for heads, want in whole.items()}
    for angles in (cos_sin, glm):
        for heads in ((8, 2), (16, 1), (32, 2)):
            rule[(angles, 32, True, *heads)] = tile(4, 4, 1)
    for heads in ((32, 8), (16, 4), (8, 8), (64, 16)):
        rule[(glm, 32, True, *heads)] = tile(2, 8)
    for (angles, rotary_dim, transposed, q_heads, k_heads), want in rule.items():
        got = config(q_heads, k_heads, angles, rotary_dim, transposed=transposed)
        assert got == want, (angles, rotary_dim, transposed, q_heads, k_heads, got)
    for angles in (cos_sin, glm):
        assert config(16, 4, angles, seq_len=1)["block_s"] == 1
        assert config(8, 2, angles, seq_len=3)["block_s"] == 4
    controls = [dict(q_heads=32, k_heads=8, rotary_dim=32, transposed=True),  # Cohere's
                dict(q_heads=16, k_heads=4, rotary_dim=32, transposed=True)]
    for angles in (cos_sin, glm):
        controls += [dict(angles=angles, **case) for case in (
            dict(q_heads=32, k_heads=8, rotary_dim=32), dict(q_heads=8, k_heads=2, rotary_dim=32),
            dict(q_heads=32, k_heads=8, esize=4), dict(q_heads=32, k_heads=8, words=False),
            dict(q_heads=32, k_heads=8, on_gpu=False),
            dict(q_heads=32, k_heads=8, transposed=True, esize=4))]
    controls.append(dict(q_heads=32, k_heads=8, angles=rope_qk.ANGLES["cache"]))
    with_rule = [config(**case) for case in controls]
    # Turned off: the half-split pairs' rules, as before it; the controls as with it. (The
    # rules below HEAD_COUNT_TILES: pairs read as words do not take its tiles.)
    monkeypatch.setattr(rope_qk, "WORDS_128B_HF_TILES", False)
    monkeypatch.setattr(rope_qk, "HEAD_COUNT_TILES", False)
    monkeypatch.setattr(rope_qk, "FEW_K_HEAD_TILES", False)  # (nor those of FEW_K_HEAD_TILES)
    for angles, rotary_dim, transposed, q_heads, k_heads in rule:
        half_split = rope_qk.default_config(4096, q_heads, k_heads, 64, 2, True, False, angles,
                                            rotary_dim, False, transposed)
        got = config(q_heads, k_heads, angles, rotary_dim, transposed=transposed)
        assert got == half_split, (angles, rotary_dim, transposed, q_heads, k_heads)
        # (Cohere's call took loads first on 4 warps from the half-split rules already.)
        if not (angles == cos_sin and (q_heads, k_heads) in ((32, 16), (32, 32))):
            assert got != rule[(angles, rotary_dim, transposed, q_heads, k_heads)]
    assert [config(**case) for case in controls] == with_rule


def test_default_config_of_the_cache_in_place(monkeypatch):
    """The cache written in place at head_dim 128 (vLLM's call): one token's 8 heads a program,
    2 warps; out of place, interleaved or on the interpreter the other rules decide."""
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", False)  # the pairs' tiles (16-bit: below)
    cache = rope_qk.ANGLES["cache"]
    in_place = dict(block_s=1, block_h=8, num_warps=2, all_heads=False)
    for element_size in (2, 4):
        for q_heads, k_heads in ((16, 4), (32, 8), (32, 32)):
            if element_size == 2 and q_heads == 16:
                continue  # loads first (test_default_config_loads_first)
            got = rope_qk.default_config(4096, q_heads, k_heads, 128, element_size, True, False,
                                         cache, 128, True)
            assert got == in_place, (element_size, q_heads, k_heads)
    assert rope_qk.default_config(4096, 16, 4, 128, 2, True, False, cache, 128) != in_place
    assert rope_qk.default_config(4096, 16, 4, 128, 2, True, True, cache, 128, True) != in_place
    assert rope_qk.default_config(4096, 16, 4, 128, 2, False, False, cache, 128, True) != in_place
    assert rope_qk.default_config(4096, 32, 8, 64, 2, True, False, cache, 64, True) != in_place


def test_default_config_loads_first(monkeypatch):
    """Loads first where a token's q fits 4 KB and k does not fill 2 KB, the whole head rotated:
    the cache with rows of 256 B or more (in place too), Hugging Face's tables (4 warps for 128 B
    rows); not where k fills 2 KB (except Hugging Face's, test_default_config_of_hugging_face_tables),
    nor for partial rotary, interleaved pairs or the interpreter."""
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", False)  # the pairs' tiles (16-bit: below)
    cache, hf_tables = rope_qk.ANGLES["cache"], rope_qk.ANGLES["cos_sin"]

    for angles in (cache, hf_tables):
        for q_heads, k_heads in ((16, 4), (16, 2), (12, 2)):
            assert rope_qk.default_config(4096, q_heads, k_heads, 128, 2, True, False, angles,
                                          128) == _loads_first(q_heads, k_heads, 2)
            assert rope_qk.default_config(4096, q_heads, k_heads, 128, 2, True, False, angles,
                                          64) != _loads_first(q_heads, k_heads, 2)
            assert rope_qk.default_config(4096, q_heads, k_heads, 128, 2, True, True, angles,
                                          128) != _loads_first(q_heads, k_heads, 2)
            assert rope_qk.default_config(4096, q_heads, k_heads, 128, 2, False, False, angles,
                                          128) != _loads_first(q_heads, k_heads, 2)
    assert rope_qk.default_config(4096, 16, 4, 128, 2, True, False, cache, 128,
                                  True) == _loads_first(16, 4, 2)
    assert rope_qk.default_config(4096, 32, 8, 64, 2, True, False, hf_tables,
                                  64) == _loads_first(32, 8, 4)
    assert not rope_qk.default_config(4096, 32, 8, 64, 2, True, False, cache, 64).get("loads_first")
    assert not rope_qk.default_config(4096, 8, 8, 128, 2, True, False, cache,
                                      128).get("loads_first")  # (Hugging Face's: on 4 warps)
    for angles in (cache, hf_tables):
        assert not rope_qk.default_config(4096, 32, 8, 128, 2, True, False, angles,
                                          128).get("loads_first")
        assert not rope_qk.default_config(4096, 16, 4, 128, 4, True, False, angles,
                                          128).get("loads_first")


# (q_heads, k_heads, head_dim, table) -> the tile of HEAD_COUNT_TILES (_head_count_tile's
# docstring), out of place and in place, in bf16 and fp16, on a GPU.
HEAD_COUNT_CASES = {
    (14, 2, 64, "hf"): _loads_first(14, 2, 2, tokens=2),
    (14, 2, 64, "cache"): _loads_first(14, 2, 2, tokens=2),
    (9, 3, 64, "hf"): _loads_first(9, 3, 1, tokens=2),
    (15, 5, 64, "cache"): _loads_first(15, 5, 2, tokens=2),
    (28, 4, 64, "hf"): _loads_first(28, 4, 2), (12, 12, 64, "cache"): _loads_first(12, 12, 2),
    (24, 8, 64, "cache"): _loads_first(24, 8, 2),
    (40, 8, 64, "cache"): _blocks(2, 8, 2), (64, 8, 64, "cache"): _blocks(2, 8, 2),
    (40, 40, 64, "hf"): _blocks(2, 8, 2),
    (10, 10, 128, "hf"): _loads_first(10, 10, 2), (16, 8, 128, "hf"): _loads_first(16, 8, 2),
    (20, 20, 128, "hf"): _loads_first(20, 20, 2), (24, 8, 128, "hf"): _loads_first(24, 8, 2),
    (40, 10, 128, "hf"): _blocks(1, 16, 2), (40, 40, 128, "hf"): _blocks(1, 16, 2),
    (10, 10, 128, "cache"): _loads_first(10, 10, 4),
    (20, 20, 128, "cache"): _loads_first(20, 20, 4),
    (40, 40, 128, "cache"): _blocks(1, 8, 2), (28, 4, 128, "cache"): _blocks(2, 4, 2),
    # head_dim 96 (Phi-3 mini's 32 / 32), rows padded to 128 channels
    (32, 32, 96, "hf"): _loads_first(32, 32, 2), (32, 32, 96, "cache"): _loads_first(32, 32, 4),
    (32, 8, 96, "hf"): _loads_first(32, 8, 2), (16, 16, 96, "cache"): _loads_first(16, 16, 4),
}
# Calls it leaves as the rules below plan them, (q_heads, k_heads, head_dim, tables): the
# benchmark's head counts and others where those rules were measured best
# (scripts/qk_head_counts.py).
HEAD_COUNTS_LEFT = [(*shape, ("hf", "cache")) for shape in (
    (32, 8, 128), (16, 4, 128), (32, 32, 128), (64, 8, 128), (32, 8, 64), (16, 16, 128),
    (8, 8, 128), (12, 2, 128), (20, 20, 64))] + [
    (40, 10, 128, ("cache",)), (24, 8, 128, ("cache",)), (16, 8, 128, ("cache",)),
    (40, 40, 64, ("cache",)), (40, 8, 64, ("hf",)), (28, 4, 128, ("hf",)),
    # head_dim 96 past 32 q heads or with more k heads than q, other padded rows (not measured)
    (40, 8, 96, ("hf", "cache")), (8, 16, 96, ("hf", "cache")), (32, 8, 80, ("hf", "cache")),
    (32, 8, 112, ("hf", "cache"))]


def test_default_config_of_head_counts(monkeypatch):
    """``HEAD_COUNT_TILES``: 16-bit half-split calls of the cos/sin cache and Hugging Face's
    tables (GPT-OSS's and NanoChat's too, which take Llama's tiles) with the whole head rotated
    at head_dim 64, 96 and 128, on a GPU, at head counts the rules below fit badly, take the
    tiles of ``_head_count_tile`` (HEAD_COUNT_CASES), out of place and in place; with the
    switch off, or in float32, with interleaved pairs, part of the head rotated, results
    transposed or on the interpreter, the rules below decide; and the calls of HEAD_COUNTS_LEFT
    (the benchmark's head counts among them) get the same tile either way."""
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", False)
    tables = {"hf": rope_qk.ANGLES["cos_sin"], "cache": rope_qk.ANGLES["cache"]}

    def config(q_heads, k_heads, head_dim, angles, switch, esize=2, on_gpu=True,
               interleaved=False, rotary_dim=None, in_place=False, transposed=False,
               seq_len=4096):
        monkeypatch.setattr(rope_qk, "HEAD_COUNT_TILES", switch)
        return rope_qk.default_config(seq_len, q_heads, k_heads, head_dim, esize, on_gpu,
                                      interleaved, angles, rotary_dim or head_dim, in_place,
                                      transposed)

    for (q_heads, k_heads, head_dim, table), want in HEAD_COUNT_CASES.items():
        shape = (q_heads, k_heads, head_dim, tables[table])
        for in_place in (False, True):
            assert config(*shape, True, in_place=in_place) == want, (shape, in_place)
        assert config(*shape, False) != want, shape  # the rules below plan it otherwise
        for other in (dict(esize=4), dict(on_gpu=False), dict(interleaved=True),
                      dict(rotary_dim=head_dim // 2), dict(transposed=True)):
            assert config(*shape, True, **other) == config(*shape, False, **other), (shape, other)
        # a call of fewer tokens than the tile's
        assert config(*shape, True, seq_len=1)["block_s"] == 1
    for *shape, left in HEAD_COUNTS_LEFT:
        for table in left:
            for in_place in (False, True):
                assert (config(*shape, tables[table], True, in_place=in_place)
                        == config(*shape, tables[table], False, in_place=in_place)), (table, shape)
    for angles in (rope_qk.ANGLES["cos_sin_half"], rope_qk.ANGLES["cos_sin_neg"]):
        # GPT-OSS's and NanoChat's tables, mapped to Llama's by _plan
        assert (config(20, 20, 128, rope_qk._tile_angles(angles, False), True)
                == HEAD_COUNT_CASES[(20, 20, 128, "hf")])


@pytest.mark.parametrize("call", ["cache half-split", "hf half"])
@pytest.mark.parametrize("q_heads,k_heads,head_dim",
                         sorted({shape[:3] for shape in HEAD_COUNT_CASES}))
def test_head_count_tiles(monkeypatch, call, q_heads, k_heads, head_dim, seed):
    """The calls of HEAD_COUNT_CASES in bf16 (3 tokens): out of place into NaN-poisoned outputs
    and in place, against float64, the same bits with ``HEAD_COUNT_TILES`` off; on a GPU their
    plans are the cases' tiles (the interpreter plans its own)."""
    q, k, want, rows, run = _q_k_call(call, 3, q_heads, k_heads, head_dim, head_dim, seed,
                                      dtype=torch.bfloat16)
    results, plans = _switch_both_ways(monkeypatch, "HEAD_COUNT_TILES", run, q, k, want, rows,
                                       dtype=torch.bfloat16)
    case = HEAD_COUNT_CASES.get((q_heads, k_heads, head_dim, call.split()[0]))
    if DEVICE == "cuda" and case is not None:
        for plan in plans[True]:
            c = plan.constexprs
            got = dict(block_s=c["BLOCK_S"], block_h=c["BLOCK_H"], block_hk=c["BLOCK_HK"],
                       num_warps=plan.num_warps, all_heads=bool(c["ALL_HEADS"]),
                       loads_first=bool(c["LOADS_FIRST"]))
            assert got == dict(block_s=min(case["block_s"], 4), block_h=case["block_h"],
                               block_hk=case.get("block_hk", case["block_h"]),
                               num_warps=case["num_warps"], all_heads=case["all_heads"],
                               loads_first=case.get("loads_first", False)), (got, case)


# Models' shapes with tiles of their own (rope_qk's switches since 683f4f5; figures/
# qk_model_shapes_h200.json): (switch, table, q_heads, k_heads, head_dim, rotary_dim) -> the GPU
# config. Hugging Face's calls with part of the head rotated have their results transposed.
MODEL_SHAPE_CASES = {
    # few k heads, q over 4 KB: 4 tokens x 1 KB of heads on 2 warps (Falcon 7B's 71 / 1)
    ("FEW_K_HEAD_TILES", "hf", 71, 1, 64, 64): _blocks(4, 8, 2),
    ("FEW_K_HEAD_TILES", "cache", 71, 1, 64, 64): _blocks(4, 8, 2),
    ("FEW_K_HEAD_TILES", "hf", 48, 2, 64, 64): _blocks(4, 8, 2),
    ("FEW_K_HEAD_TILES", "hf", 24, 2, 128, 128): _blocks(4, 4, 2),
    ("FEW_K_HEAD_TILES", "cache", 32, 1, 128, 128): _blocks(4, 4, 2),
    # rotary_dim not a multiple of 16: whole rows, the partners gathered in registers; on 1 warp
    # (GATHERED_ONE_WARP_TILES): transposed results with 8 q heads or more 2 tokens x 4 heads at
    # rows of up to 256 B, 4 x 4 up to 320 B; else with 16 q heads or more 16 rows of up to 192 B
    # (q's heads first), 8 of up to 320 B; the rest on 2 warps, transposed 4 x 4, else 32 rows
    # of up to 192 B (16 of more)
    ("GATHERED_PARTNERS", "hf", 32, 32, 80, 20): _gathered(2, 4, 1),
    ("GATHERED_PARTNERS", "cache", 32, 32, 80, 20): _gathered(1, 16, 1),
    ("GATHERED_PARTNERS", "hf", 16, 16, 96, 24): _gathered(2, 4, 1),
    ("GATHERED_PARTNERS", "cache", 64, 64, 96, 24): _gathered(1, 16, 1),
    ("GATHERED_PARTNERS", "cache", 32, 8, 128, 24): _gathered(1, 8, 1),
    ("GATHERED_PARTNERS", "cache", 32, 8, 160, 40): _gathered(1, 8, 1),
    ("GATHERED_PARTNERS", "hf", 32, 2, 160, 40): _gathered(4, 2, 1),  # FEW_K_TRANSPOSED_TILES
    ("GATHERED_PARTNERS", "hf", 8, 8, 80, 20): _gathered(2, 4, 1),
    ("GATHERED_PARTNERS", "hf", 32, 8, 160, 40): _gathered(4, 4, 1),
    ("GATHERED_PARTNERS", "hf", 4, 4, 80, 20): _gathered(4, 4),
    ("GATHERED_PARTNERS", "cache", 8, 8, 80, 20): _gathered(4, 8),
    # Hugging Face's partial rotary in rows padded to a power of two (Phi-2's 32 of 80)
    ("PADDED_TRANSPOSED_PAIRS", "hf", 32, 32, 80, 32): _blocks(4, 4, 4),
    # the cache, a quarter of 128 B rows rotated (StableLM 2 1.6B's 32 / 32, 16 of 64)
    ("PARTIAL_128B_CACHE_TILES", "cache", 32, 32, 64, 16): _blocks(1, 16, 2),
    ("PARTIAL_128B_CACHE_TILES", "cache", 16, 16, 64, 16): _blocks(1, 16, 2),
}
# Calls these switches leave alone, (table, q_heads, k_heads, head_dim, rotary_dim): the
# benchmark's (half of 128 and of 64 rotated among them) and neighbours of the cases.
MODEL_SHAPES_LEFT = [
    ("hf", 32, 8, 128, 128), ("cache", 32, 8, 128, 128), ("hf", 32, 8, 128, 64),
    ("cache", 32, 8, 128, 64), ("hf", 16, 4, 64, 32), ("cache", 16, 4, 64, 32),
    ("cache", 32, 8, 64, 32), ("hf", 28, 4, 128, 128), ("cache", 28, 4, 128, 128),
    ("hf", 12, 2, 128, 128), ("hf", 32, 32, 128, 32), ("cache", 32, 32, 80, 32),
    ("hf", 14, 2, 64, 64), ("cache", 40, 8, 64, 64)]
MODEL_SWITCHES = ("FEW_K_HEAD_TILES", "GATHERED_PARTNERS", "PADDED_TRANSPOSED_PAIRS",
                  "PARTIAL_128B_CACHE_TILES")


def _model_shape_config(table, q_heads, k_heads, head_dim, rotary_dim, esize=2, on_gpu=True,
                        interleaved=False, in_place=False):
    """default_config as ``_plan`` calls it for the case's call (Hugging Face's partial rotary
    transposed; in place with part of the head rotated, the heads narrowed)."""
    angles = rope_qk.ANGLES["cos_sin" if table == "hf" else "cache"]
    narrowed = in_place and rotary_dim < head_dim
    transposed = table == "hf" and rotary_dim < head_dim and not in_place
    if narrowed:
        head_dim = rotary_dim
    return rope_qk.default_config(4096, q_heads, k_heads, head_dim, esize, on_gpu, interleaved,
                                  angles, rotary_dim, in_place, transposed, False, narrowed)


def test_default_config_of_model_shapes(monkeypatch):
    """MODEL_SHAPE_CASES take their tiles on a GPU, out of place, with every switch on, and
    another with their own switch off, and in place Hugging Face's few-k-head calls too (the
    cache's keep their in-place tiles); with interleaved pairs, in place with part of the head
    rotated (the narrowed heads' rules decide), and but for GATHERED_PARTNERS in float32 or on
    the interpreter the switches change nothing (GATHERED_PARTNERS's calls take whole rows with
    the partners gathered in float32 and in the interpreter too: ``_gathered_tile``; in place,
    the narrowed heads' rows gathered in 4 x 4 tiles on 2 warps, as before with
    ``IN_PLACE_GATHER`` off); MODEL_SHAPES_LEFT get the same config either way, in place too."""
    for (switch, *shape), want in MODEL_SHAPE_CASES.items():
        assert _model_shape_config(*shape) == want, (switch, shape)
        monkeypatch.setattr(rope_qk, switch, False)
        assert _model_shape_config(*shape) != want, (switch, shape)
        partial = [dict(in_place=True)] if shape[-1] < shape[-2] else []
        same = [dict(interleaved=True)]
        if switch != "GATHERED_PARTNERS":
            same += [dict(esize=4), dict(on_gpu=False)] + partial
        else:
            in_place_before = _model_shape_config(*shape, in_place=True)
            monkeypatch.setattr(rope_qk, switch, True)
            for other in (dict(esize=4), dict(on_gpu=False)):
                got = _model_shape_config(*shape, **other)
                assert got["whole_rows"] and got["gather"], (shape, other, got)
            for esize in (2, 4):
                got = _model_shape_config(*shape, esize=esize, in_place=True)
                assert got == _gathered(4, 4), (shape, esize, got)
            monkeypatch.setattr(rope_qk, "IN_PLACE_GATHER", False)
            assert _model_shape_config(*shape, in_place=True) == in_place_before, shape
            monkeypatch.setattr(rope_qk, "IN_PLACE_GATHER", True)
            monkeypatch.setattr(rope_qk, switch, False)
        for other in same:
            got_off = _model_shape_config(*shape, **other)
            monkeypatch.setattr(rope_qk, switch, True)
            assert _model_shape_config(*shape, **other) == got_off, (switch, shape, other)
            monkeypatch.setattr(rope_qk, switch, False)
        monkeypatch.setattr(rope_qk, switch, True)
    # Few k heads in place: Hugging Face's in-place functions take the tile, the cache in place
    # keeps its own (measured 2.2% ahead at 71 q / 1 k of 64).
    for (switch, *shape), want in MODEL_SHAPE_CASES.items():
        if switch == "FEW_K_HEAD_TILES":
            got = _model_shape_config(*shape, in_place=True)
            assert (got == want) == (shape[0] == "hf"), (shape, got)
    for shape in MODEL_SHAPES_LEFT:
        for in_place in (False, True):
            on = _model_shape_config(*shape, in_place=in_place)
            for switch in MODEL_SWITCHES:
                monkeypatch.setattr(rope_qk, switch, False)
            assert _model_shape_config(*shape, in_place=in_place) == on, (shape, in_place)
            for switch in MODEL_SWITCHES:
                monkeypatch.setattr(rope_qk, switch, True)


def test_gathered_tiles_on_one_warp(monkeypatch):
    """``_gathered_tile`` out of place on a GPU in 16-bit takes ``GATHERED_ONE_WARP_TILES``' 1-warp
    tiles, transposed results with 8 q heads or more, the rest with 16 or more
    (figures/qk_gathered_one_warp_h200.json, figures/qk_transposed_one_warp_h200.json); the
    cache's calls with 8 q heads, transposed ones with 4 (or at 320 B with fewer than 4 k heads),
    float32, rows past the table's (384 B) and the table emptied the 2-warp tiles before; in place
    the narrowed heads' 4 x 4 on 2 warps. (``FEW_K_TRANSPOSED_TILES`` emptied: its own test.)"""
    tile = rope_qk._gathered_tile
    monkeypatch.setattr(rope_qk, "FEW_K_TRANSPOSED_TILES", ())
    for q, k, head_dim, transposed, want in (
            (32, 32, 80, False, (1, 16, 1)), (32, 8, 80, False, (1, 16, 1)),
            (64, 64, 96, False, (1, 16, 1)), (16, 16, 112, False, (1, 8, 1)),
            (32, 2, 160, False, (1, 8, 1)), (32, 8, 192, False, (2, 8, 2)),
            (8, 8, 80, False, (4, 8, 2)), (32, 32, 80, True, (2, 4, 1)),
            (16, 16, 128, True, (2, 4, 1)), (32, 2, 128, True, (4, 2, 1)),
            (32, 8, 160, True, (4, 4, 1)), (16, 16, 160, True, (4, 4, 1)),
            (32, 2, 160, True, (8, 2, 2)), (8, 4, 160, True, (4, 4, 1)),
            (32, 8, 192, True, (4, 4, 2)), (8, 8, 80, True, (2, 4, 1)),
            (8, 8, 128, True, (2, 4, 1)), (8, 2, 80, True, (4, 2, 1)),
            (4, 4, 80, True, (4, 4, 2))):
        got = tile(4096, q, k, head_dim, 2, True, transposed)
        assert got == _gathered(*want), (q, k, head_dim, transposed, got)
        assert tile(4096, q, k, head_dim, 2, True, transposed, True)["num_warps"] == 2
        two_warps = tile(4096, q, k, head_dim // 2, 4, True, transposed)  # the same row bytes
        assert two_warps["num_warps"] == 2, (q, k, head_dim, transposed, two_warps)
        with monkeypatch.context() as patch:
            patch.setattr(rope_qk, "GATHERED_ONE_WARP_TILES", {"cache": (), "transposed": ()})
            assert tile(4096, q, k, head_dim, 2, True, transposed)["num_warps"] == 2
    # fewer tokens than the tile: its tokens shrink to their next power of two
    assert tile(1, 32, 32, 80, 2, True, True)["block_s"] == 1


def test_few_k_head_gathered_blocks(monkeypatch):
    """``FEW_K_HEAD_GATHERED_BLOCKS``: the cache's gathered calls out of place on a GPU in 16-bit,
    rows of 160-320 B but 256 B, 4 q heads or more and k's heads fewer than q's block would take,
    run 8 tokens x 4 q heads on 2 warps with k's blocks of its own heads; with the switch off q's
    blocks are cut to k's head count. Float32, transposed results, in place, rows of 128, 256 or
    384 B, 2 q heads, k's heads as many as the block and the interpreter keep the tile they had
    (at 256 B the first recording measured it behind, ..._run1.json)."""
    tile = rope_qk._gathered_tile
    for q, k, head_dim, want, before in (
            (8, 1, 80, _own_k(8, 4, 2, 1), _gathered(32, 1)),
            (4, 1, 160, _own_k(8, 4, 2, 1), _gathered(16, 1)),
            (8, 2, 80, _own_k(8, 4, 2, 2), _gathered(16, 2)),
            (8, 2, 160, _own_k(8, 4, 2, 2), _gathered(8, 2)),
            (12, 4, 112, _own_k(8, 4, 2, 4), _gathered(4, 4)),
            (12, 2, 96, _own_k(8, 4, 2, 2), _gathered(16, 2)),
            (4, 2, 80, _own_k(8, 4, 2, 2), _gathered(16, 2))):
        assert tile(4096, q, k, head_dim, 2, True, False) == want, (q, k, head_dim)
        assert tile(5, q, k, head_dim, 2, True, False)["block_s"] == 8  # 5 tokens: 8 is next
        monkeypatch.setattr(rope_qk, "FEW_K_HEAD_GATHERED_BLOCKS", False)
        assert tile(4096, q, k, head_dim, 2, True, False) == before, (q, k, head_dim)
        monkeypatch.undo()
    for args in ((4096, 8, 2, 40, 4, True, False),  # float32: 320 B rows
                 (4096, 8, 1, 80, 2, True, True),  # transposed (Hugging Face's views)
                 (4096, 8, 1, 80, 2, True, False, True),  # in place, the heads narrowed
                 (4096, 8, 2, 64, 2, True, False),  # 128 B rows
                 (4096, 8, 2, 192, 2, True, False),  # 384 B rows
                 (4096, 8, 2, 128, 2, True, False),  # 256 B rows: a power of two
                 (4096, 2, 1, 80, 2, True, False),  # 2 q heads
                 (4096, 8, 8, 80, 2, True, False), (4096, 4, 4, 80, 2, True, False),
                 (4096, 16, 1, 80, 2, True, False),  # 16 q heads: 1 warp
                 (4096, 8, 1, 80, 2, False, False)):  # the interpreter
        on = tile(*args)
        monkeypatch.setattr(rope_qk, "FEW_K_HEAD_GATHERED_BLOCKS", False)
        assert tile(*args) == on, args
        monkeypatch.undo()


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("shape", [(11, 8, 1, 80, 20), (9, 12, 4, 112, 28), (10, 4, 2, 80, 20)],
                         ids=lambda s: "{}t-{}q-{}k-{}of{}".format(*s[:3], s[4], s[3]))
def test_few_k_head_gathered_blocks_results(shape, backward, seed, monkeypatch):
    """The cache's call in bf16 with the GPU's plan (``default_config`` told it runs on a GPU, in
    the interpreter too) at few k heads, positions in any order, forward and backward, into
    NaN-poisoned outputs: with ``FEW_K_HEAD_GATHERED_BLOCKS`` blocks of 4 q heads and k's own
    (``BLOCK_HK``), without it q's blocks cut to k's head count; the same bits either way, and
    the float64 reference's values."""
    config = rope_qk.default_config
    monkeypatch.setattr(rope_qk, "default_config",
                        lambda *args: config(*args[:5], True, *args[6:]))
    plans = _cache_switched(monkeypatch, "FEW_K_HEAD_GATHERED_BLOCKS", shape, torch.bfloat16,
                            backward, seed)
    k_block = 1 << (shape[2] - 1).bit_length()
    for flag, plan in plans.items():
        c = plan.constexprs
        assert c["GATHER"] and plan.num_warps == 2, c
        want = (8, 4, k_block) if flag else (c["BLOCK_S"], k_block, k_block)
        assert (c["BLOCK_S"], c["BLOCK_H"], c["BLOCK_HK"]) == want, (flag, c)


def test_few_k_transposed_tiles(monkeypatch):
    """``FEW_K_TRANSPOSED_TILES``: Hugging Face's gathered calls out of place (results transposed)
    on a GPU in 16-bit with 1 or 2 k heads and 4 q heads or more, at rows of 160-320 B but 256 B,
    take the entry for their row size and k's head count, k's blocks of k's own heads, and q's
    block halved (its tokens doubled) until it divides q's heads; emptied, q's blocks are cut to
    k's head count as before. Float32, the cache's calls, in place, rows of 128, 256 or 384 B, 2
    q heads, an odd number of q heads (blocks of one head, not measured), 3 k heads or more and
    the interpreter keep the tile they had."""
    tile = rope_qk._gathered_tile
    for q, k, head_dim, want, before in (
            (8, 1, 80, _own_k(8, 4, 2, 1), _gathered(8, 1, 1)),  # 160 B
            (4, 1, 96, _own_k(8, 4, 2, 1), _gathered(16, 1)),  # 192 B
            (6, 1, 80, _own_k(16, 2, 2, 1), _gathered(16, 1)),  # 6 q heads: blocks of 2
            (16, 1, 112, _own_k(4, 2, 1, 1), _gathered(8, 1, 1)),  # 224 B
            (12, 1, 160, _own_k(2, 4, 1, 1), _gathered(16, 1)),  # 320 B
            (6, 1, 160, _own_k(4, 2, 1, 1), _gathered(16, 1)),
            (8, 1, 144, _own_k(2, 4, 1, 1), _gathered(16, 1)),  # 288 B
            (8, 2, 80, _own_k(4, 4, 2, 2), _gathered(4, 2, 1)),
            (4, 2, 96, _own_k(4, 2, 1, 2), _gathered(8, 2)),
            (32, 2, 160, _own_k(4, 2, 1, 2), _gathered(8, 2))):
        assert tile(4096, q, k, head_dim, 2, True, True) == want, (q, k, head_dim)
        assert tile(3, q, k, head_dim, 2, True, True)["block_s"] == min(4, want["block_s"])
        with monkeypatch.context() as patch:
            patch.setattr(rope_qk, "FEW_K_TRANSPOSED_TILES", ())
            assert tile(4096, q, k, head_dim, 2, True, True) == before, (q, k, head_dim)
    for args in ((4096, 8, 1, 40, 4, True, True),  # float32: 160 B rows
                 (4096, 8, 1, 80, 2, True, False),  # the cache's call (results not transposed)
                 (4096, 8, 1, 80, 2, True, True, True),  # in place, the heads narrowed
                 (4096, 8, 1, 64, 2, True, True),  # 128 B rows
                 (4096, 8, 1, 128, 2, True, True),  # 256 B rows: a power of two
                 (4096, 8, 1, 192, 2, True, True),  # 384 B rows
                 (4096, 2, 1, 80, 2, True, True),  # 2 q heads
                 (4096, 5, 1, 80, 2, True, True), (4096, 7, 2, 160, 2, True, True),  # odd q
                 (4096, 12, 3, 80, 2, True, True), (4096, 8, 8, 80, 2, True, True),
                 (4096, 8, 2, 112, 2, True, True),  # 224 B, 2 k heads: the same tile as before
                 (4096, 8, 1, 80, 2, False, True)):  # the interpreter
        on = tile(*args)
        with monkeypatch.context() as patch:
            patch.setattr(rope_qk, "FEW_K_TRANSPOSED_TILES", ())
            assert tile(*args) == on, args


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("shape", [(11, 8, 1, 80, 20), (9, 6, 1, 160, 40), (10, 8, 2, 80, 20),
                                   (7, 4, 2, 160, 40)],
                         ids=lambda s: "{}t-{}q-{}k-{}of{}".format(*s[:3], s[4], s[3]))
def test_few_k_transposed_tiles_results(shape, backward, seed, monkeypatch):
    """Hugging Face's call in bf16 as its function makes it, q and k ``[b, h, s, d]`` views of
    ``[b, s, h, d]`` projections and results contiguous (transposed against them), with the
    GPU's plan (``default_config`` told it runs on a GPU, in the interpreter too) at 1 or 2 k
    heads, forward and backward (sin negated), into NaN-poisoned outputs: with
    ``FEW_K_TRANSPOSED_TILES`` the entry's tile with k's blocks of its own heads (``BLOCK_HK``),
    emptied q's blocks cut to k's head count; the same bits either way, and the float64
    reference's values."""
    tokens, q_heads, k_heads, head_dim, rotary_dim = shape
    config = rope_qk.default_config
    monkeypatch.setattr(rope_qk, "default_config",
                        lambda *args: config(*args[:5], True, *args[6:]))
    dtype = torch.bfloat16
    q = randn((1, tokens, q_heads, head_dim), dtype, seed).transpose(1, 2)
    k = randn((1, tokens, k_heads, head_dim), dtype, seed + 1).transpose(1, 2)
    angles = torch.rand((1, tokens, rotary_dim // 2),
                        generator=torch.Generator().manual_seed(seed)) * 6.3
    emb = torch.cat((angles, angles), -1).to(DEVICE)
    cos, sin = emb.cos(), emb.sin()
    tile = rope_qk._few_k_transposed_tile(2 * head_dim, 2, q_heads, k_heads, True)
    results, plans = {}, {}
    for flag, table in ((True, rope_qk.FEW_K_TRANSPOSED_TILES), (False, ())):
        monkeypatch.setattr(rope_qk, "FEW_K_TRANSPOSED_TILES", table)
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        outs = [torch.full(x.shape, float("nan"), dtype=dtype, device=DEVICE) for x in (q, k)]
        rope_qk.rope_cos_sin(q, k, cos, sin, 1, backward=backward, q_out=outs[0],
                             k_out=outs[1])
        (plans[flag],) = rope_qk._PLANS.values()
        results[flag] = outs
    for got, before in zip(results[True], results[False]):
        assert torch.equal(got, before)
    for got, x, name in zip(results[True], (q, k), ("q", "k")):
        assert_rope_close(got, hf_reference(x, cos, -sin if backward else sin), dtype, name)
    tokens_a_block, block_h, warps = tile  # q's block already divides q's heads
    assert q_heads % block_h == 0, tile
    k_block = 1 << (k_heads - 1).bit_length()
    for flag, plan in plans.items():
        c = plan.constexprs
        got = (c["BLOCK_S"], c["BLOCK_H"], c["BLOCK_HK"], plan.num_warps)
        assert c["GATHER"], c
        want = ((min(tokens_a_block, 1 << (tokens - 1).bit_length()), block_h, k_block, warps)
                if flag else (c["BLOCK_S"], k_block, k_block, got[3]))
        assert got == want, (flag, got)


@pytest.mark.parametrize("case", list(MODEL_SHAPE_CASES), ids=lambda c: "-".join(map(str, c)))
def test_model_shape_tiles(monkeypatch, case, seed):
    """The calls of MODEL_SHAPE_CASES in bf16 (5 tokens): out of place into NaN-poisoned outputs
    and in place, against float64, the same bits with the case's switch off (GATHERED_PARTNERS's
    in float32 too). With GATHERED_PARTNERS the out-of-place plan takes whole rows cut at the
    rotary block (``GATHER``; ``ROW`` the power of two >= rotary_dim, at least 16, and ``PASS``
    the one >= the channels after it), in the interpreter too; on a GPU the plan is the case's
    tile."""
    switch, table, q_heads, k_heads, head_dim, rotary_dim = case
    call = "hf half" if table == "hf" else "cache half-split"
    dtypes = [torch.bfloat16] + ([torch.float32] if switch == "GATHERED_PARTNERS" else [])
    for dtype in dtypes:
        q, k, want, rows, run = _q_k_call(call, 5, q_heads, k_heads, head_dim, rotary_dim, seed,
                                          dtype=dtype)
        results, plans = _switch_both_ways(monkeypatch, switch, run, q, k, want, rows,
                                           dtype=dtype)
        out_of_place = plans[True][0]
        c = out_of_place.constexprs
        in_place = plans[True][1].constexprs
        if switch == "GATHERED_PARTNERS":
            block = max(16, 1 << (rotary_dim - 1).bit_length())
            assert c["GATHER"] and c["ROW"] == block, c
            assert c["PASS"] == 1 << (head_dim - block - 1).bit_length(), c
            assert not plans[False][0].constexprs["GATHER"]
            # In place the narrowed heads' rows are the rotary block, masked at rotary_dim, a
            # multiple of 4 or 8 the kernel is told of; nothing after it.
            assert in_place["GATHER"] and in_place["ROW"] == block and in_place["PASS"] == 0
            assert in_place["CHANNEL_MULTIPLE"] == min(8, rotary_dim & -rotary_dim)
            assert plans[True][1].scalars[7:9] == (rotary_dim, rotary_dim)
            assert not plans[False][1].constexprs["GATHER"]
        else:
            assert not c["GATHER"] and not in_place["GATHER"]
    if DEVICE == "cuda":
        want_tile = MODEL_SHAPE_CASES[case]
        got = dict(block_s=c["BLOCK_S"], block_h=c["BLOCK_H"], num_warps=out_of_place.num_warps,
                   all_heads=bool(c["ALL_HEADS"]))
        assert got == {key: min(want_tile[key], 8) if key == "block_s" else want_tile[key]
                       for key in got}, (got, want_tile)
        if switch == "GATHERED_PARTNERS":
            assert (in_place["BLOCK_S"], in_place["BLOCK_H"], plans[True][1].num_warps) == (
                4, 4, 2), in_place


def test_gathered_partners_only_where_rotary_dim_is_unaligned(monkeypatch):
    """``_gathered_partners``: half-split calls of the cache and Hugging Face's tables with part of
    the head rotated and rotary_dim not a multiple of 16, in any dtype; not with the whole head
    rotated, a multiple of 16, interleaved pairs (split or as words), TE's angle tables, or the
    switch off."""
    cache, hf_tables = rope_qk.ANGLES["cache"], rope_qk.ANGLES["cos_sin"]
    for head_dim, rotary_dim in ((80, 20), (96, 24), (160, 40), (128, 24), (20, 12), (64, 8)):
        for angles in (cache, hf_tables):
            assert rope_qk._gathered_partners(head_dim, rotary_dim, False, False, angles)
            for other in ((True, False, angles), (True, True, angles), (False, True, angles),
                          (False, False, rope_qk.ANGLES["freqs"])):
                assert not rope_qk._gathered_partners(head_dim, rotary_dim, *other), other
            monkeypatch.setattr(rope_qk, "GATHERED_PARTNERS", False)
            assert not rope_qk._gathered_partners(head_dim, rotary_dim, False, False, angles)
            monkeypatch.setattr(rope_qk, "GATHERED_PARTNERS", True)
    for head_dim, rotary_dim in ((80, 32), (128, 64), (64, 16), (64, 64), (80, 80)):
        assert not rope_qk._gathered_partners(head_dim, rotary_dim, False, False, cache)
    # In place the heads are narrowed to rotary_dim (head_dim is rotary_dim): gathered where it
    # is not a multiple of 16 (IN_PLACE_GATHER), with the same exclusions.
    for rotary_dim, gathered in ((20, True), (24, True), (40, True), (12, True), (32, False),
                                 (64, False)):
        for angles in (cache, hf_tables):
            got = rope_qk._gathered_partners(rotary_dim, rotary_dim, False, False, angles, True)
            assert got == gathered, rotary_dim
            assert not rope_qk._gathered_partners(rotary_dim, rotary_dim, False, False, angles)
            assert not rope_qk._gathered_partners(rotary_dim, rotary_dim, True, False, angles,
                                                  True)
            monkeypatch.setattr(rope_qk, "IN_PLACE_GATHER", False)
            assert not rope_qk._gathered_partners(rotary_dim, rotary_dim, False, False, angles,
                                                  True)
            monkeypatch.setattr(rope_qk, "IN_PLACE_GATHER", True)


def test_channel_multiple(monkeypatch):
    """``_channel_multiple``: the largest power of two up to 8 dividing rotary_dim and head_dim
    where a mask stops at one that is not a multiple of 16 (the pairs' tiles: either; GATHER's
    whole rows: head_dim); 0 where there is nothing to tell (multiples of 16, odd, the switch
    off)."""
    cm = rope_qk._channel_multiple
    assert [cm(20, 80, False), cm(24, 96, False), cm(40, 160, False), cm(12, 20, False)] == [
        4, 8, 8, 4]
    assert [cm(20, 20, True), cm(24, 24, True), cm(10, 10, True), cm(40, 40, True)] == [4, 8, 2, 8]
    assert [cm(20, 80, True), cm(64, 128, False), cm(16, 16, True), cm(64, 72, False)] == [
        0, 0, 0, 8]
    assert cm(18, 81, False) == 0  # gcd 9: odd
    monkeypatch.setattr(rope_qk, "CHANNEL_MULTIPLES", False)
    assert cm(20, 20, True) == cm(12, 20, False) == 0


@pytest.mark.parametrize("switch", ["IN_PLACE_GATHER", "CHANNEL_MULTIPLES"])
@pytest.mark.parametrize("call", ["cache half-split", "hf half", "cache interleaved"])
@pytest.mark.parametrize("head_size,rotary_dim", [(80, 20), (96, 24), (20, 12), (72, 18)])
def test_unaligned_rotary_dim_switches_keep_the_bits(monkeypatch, switch, call, head_size,
                                                     rotary_dim, seed):
    """rotary_dim (and head_dim) not a multiple of 16: out of place into NaN-poisoned outputs and
    in place (the narrowed heads' rows gathered, ``IN_PLACE_GATHER``; the kernel told of their
    multiple of 2-8, ``CHANNEL_MULTIPLES``), bf16 and float32, against float64, the same bits with
    the switch off; in place the channels past rotary_dim as they were."""
    for dtype in (torch.bfloat16, torch.float32):
        q, k, want, rows, run = _q_k_call(call, 5, 3, 2, head_size, rotary_dim, seed, dtype=dtype)
        results, plans = _switch_both_ways(monkeypatch, switch, run, q, k, want, rows,
                                           dtype=dtype)
        for got, old in zip(results[True][2:], (q, k)):
            assert torch.equal(rows(got)[..., rotary_dim:], rows(old)[..., rotary_dim:])
        on, off = plans[True][1].constexprs, plans[False][1].constexprs
        if switch == "IN_PLACE_GATHER":
            assert on["GATHER"] == (call != "cache interleaved") and not off["GATHER"]
        else:
            assert on["CHANNEL_MULTIPLE"] == min(8, rotary_dim & -rotary_dim)
            assert off["CHANNEL_MULTIPLE"] == 0


def test_default_config_whole_rows(monkeypatch):
    """With ``WHOLE_ROWS`` on (off by default: an H200 measured them slower), 16-bit half-split
    rows of 256 B or more take whole rows, for every table and in place too: on a GPU 8 heads
    (fewer where q has fewer) x the tokens that fill 4 KB of input (8 KB for the cos/sin cache)
    on 4 warps, one head block per program. fp32, interleaved pairs and rows of 128 B keep the
    pairs' tiles (scripts/qk_whole_rows.py measured whole rows behind at head_dim 64)."""
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", True)

    def whole(block_s, block_h):
        return dict(block_s=block_s, block_h=block_h, num_warps=4, all_heads=False,
                    whole_rows=True)

    cache, hf_tables, freqs = (rope_qk.ANGLES[a] for a in ("cache", "cos_sin", "freqs"))
    for angles in (cache, hf_tables, freqs):
        tile = 8192 if angles == cache else 4096
        for in_place in (False, True):
            for q_heads, k_heads, head_dim, rotary_dim in ((32, 8, 128, 128), (16, 4, 128, 64),
                                                           (8, 8, 128, None), (4, 4, 128, 128),
                                                           (16, 16, 256, 256), (32, 8, 160, 80)):
                width = 1 << (head_dim - 1).bit_length()
                block_h = min(8, q_heads)
                want = whole(max(1, min(tile // (2 * width * block_h), 4096)), block_h)
                got = rope_qk.default_config(4096, q_heads, k_heads, head_dim, 2, True, False,
                                             angles, rotary_dim, in_place)
                assert got == want, (angles, in_place, q_heads, head_dim, got)
                assert rope_qk.default_config(4096, q_heads, k_heads, head_dim, 2, False, False,
                                              angles, rotary_dim, in_place)["whole_rows"]
            for esize, head_dim, interleaved in ((4, 128, False), (2, 64, False), (2, 128, True)):
                got = rope_qk.default_config(4096, 32, 8, head_dim, esize, True, interleaved,
                                             angles, head_dim, in_place)
                assert not got.get("whole_rows"), (angles, esize, head_dim, interleaved)
    # Decode: one token a sequence, 2 KB of 8 heads a program.
    assert rope_qk.default_config(1, 32, 8, 128, 2, True, False, hf_tables, 128) == whole(1, 8)


def test_whole_rows_switch(monkeypatch):
    """By default (``WHOLE_ROWS = False``) the cache's and Hugging Face's tiles are the pairs', on
    a GPU and in the interpreter (but for transposed outputs: test_default_config_transposed),
    fused QKV's too in the interpreter, whole rows on a GPU (test_default_config_fused_qkv);
    ``WHOLE_ROWS = True`` takes whole rows for every table, and the plan's ``ROW`` follows the
    config: the next power of two of head_dim, 0 for interleaved pairs."""
    assert rope_qk.WHOLE_ROWS is False
    for angles in rope_qk.ANGLES.values():
        for on_gpu in (True, False):
            for in_place in (False, True):
                args = (4096, 32, 8, 128, 2, on_gpu, False, angles, 128, in_place)
                want = on_gpu and angles == rope_qk.ANGLES["freqs"]
                assert bool(rope_qk.default_config(*args).get("whole_rows")) == want, args
    args = (4096, 32, 8, 128, 2, True, False, rope_qk.ANGLES["cache"], 128)
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", True)
    assert rope_qk.default_config(*args)["whole_rows"]
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    query = randn((3, 2 * 80), torch.bfloat16, 0)
    key = randn((3, 80), torch.bfloat16, 1)
    positions = torch.arange(3, device=DEVICE)
    for is_neox, row in ((True, 128), (False, 0)):
        rope_qk.rope_cos_sin_cache(positions, query, key, 80, make_cache(8, 64), is_neox)
        plan = next(p for sig, p in rope_qk._PLANS.items() if sig[-4] is is_neox)
        assert plan.constexprs["ROW"] == row


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("q_heads,k_heads", [(16, 4), (12, 3)])
def test_cache_in_place_at_head_dim_128(dtype, q_heads, k_heads, seed):
    """The shapes of the in-place rule (on a GPU), 12 heads leaving a partly masked block:
    float64 reference, every element written (the inputs are the outputs), nothing else
    touched."""
    tokens, head_size = 9, 128
    cache = make_cache(64, head_size)
    g = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 64, (tokens,), generator=g).to(DEVICE)
    # Views into wider rows: the columns past each view must stay as they were.
    q_buf = randn((tokens, q_heads * head_size + 8), dtype, seed)
    k_buf = randn((tokens, k_heads * head_size + 8), dtype, seed + 1)
    query, key = q_buf[:, : q_heads * head_size], k_buf[:, : k_heads * head_size]
    q_ref = cache_reference(positions, query, head_size, cache, True)
    k_ref = cache_reference(positions, key, head_size, cache, True)
    q_tail, k_tail = q_buf[:, -8:].clone(), k_buf[:, -8:].clone()
    rope_qk.rope_cos_sin_cache(positions, query, key, head_size, cache, True,
                               query_out=query, key_out=key)
    assert_rope_close(query, q_ref, dtype, "query")
    assert_rope_close(key, k_ref, dtype, "key")
    assert torch.equal(q_buf[:, -8:], q_tail) and torch.equal(k_buf[:, -8:], k_tail)


def test_default_config_transposed(monkeypatch):
    """Outputs whose tokens and heads are in the other memory order than the inputs' (Hugging
    Face's partial rotary on transposed views): on a GPU, half-split rows of 64 or 128 channels
    with at least 4 heads in q and in k take whole rows in tiles of 4 tokens x 4 heads on 2 warps,
    in every dtype, but where 16-bit rows are padded (head_dim 80 in 128 channels: the pairs'
    tiles, on 4 warps), and where rotary_dim is not a multiple of 16 (40 of 80 channels, in
    every dtype) whole rows with the partners gathered, 4 x 4 too, in 16-bit 2 x 4 on 1 warp
    (``_gathered_tile``);
    fewer k heads, head_dim 256, interleaved pairs, the interpreter and outputs in the inputs'
    order keep the other rules."""
    monkeypatch.setattr(rope_qk, "WHOLE_ROWS", False)
    hf_tables = rope_qk.ANGLES["cos_sin"]
    rows = dict(block_s=4, block_h=4, num_warps=2, all_heads=False, whole_rows=True)
    for esize in (2, 4):
        for q_heads, k_heads, head_dim in ((32, 8, 128), (16, 4, 128), (64, 8, 64), (8, 8, 80)):
            args = (4096, q_heads, k_heads, head_dim, esize, True, False, hf_tables,
                    head_dim // 2, False)
            want = rows
            if head_dim == 80:  # 40 of 80 rotated: the partners gathered, in 16-bit on 1 warp
                want = _gathered(2, 4, 1) if esize == 2 else _gathered(4, 4)
            if esize == 2 and head_dim == 80:
                padded = rope_qk.default_config(*args[:8], 32, False, True)
                assert padded == _blocks(4, 4, 4), padded  # 32 of 80
                monkeypatch.setattr(rope_qk, "PADDED_TRANSPOSED_PAIRS", False)
                assert rope_qk.default_config(*args[:8], 32, False, True) == rows
                monkeypatch.setattr(rope_qk, "PADDED_TRANSPOSED_PAIRS", True)
            assert rope_qk.default_config(*args, True) == want, args
            assert rope_qk.default_config(*args, False) != want, args
            assert rope_qk.default_config(*args[:5], False, *args[6:], True) != want, args
            assert rope_qk.default_config(*args[:6], True, *args[7:], True) != want, args
        for q_heads, k_heads, head_dim in ((16, 2, 128), (8, 1, 128), (16, 4, 256), (16, 4, 32)):
            got = rope_qk.default_config(4096, q_heads, k_heads, head_dim, esize, True, False,
                                         hf_tables, head_dim // 2, False, True)
            assert not got.get("whole_rows"), (q_heads, k_heads, head_dim, got)
    # Fewer tokens than a tile: the tile's tokens shrink to their next power of two.
    assert rope_qk.default_config(3, 32, 8, 128, 2, True, False, hf_tables, 64, False,
                                  True) == rows
    assert rope_qk.default_config(2, 32, 8, 128, 2, True, False, hf_tables, 64, False,
                                  True) == dict(rows, block_s=2)


def test_default_config_fused_qkv():
    """Fused QKV (TransformerEngine's angle tables) on a GPU: whole rows on the pairs' tiles for
    16-bit half-split rows of 256 B or more; fp32, 128 B rows, interleaved pairs and the
    interpreter keep the pairs."""
    freqs = rope_qk.ANGLES["freqs"]
    for q_heads, k_heads, head_dim in ((32, 8, 128), (8, 8, 128), (16, 4, 256), (8, 8, 160)):
        got = rope_qk.default_config(4096, q_heads, k_heads, head_dim, 2, True, False, freqs,
                                     head_dim)
        pairs = rope_qk.default_config(4096, q_heads, k_heads, head_dim, 2, False, False, freqs,
                                       head_dim)
        assert got["whole_rows"] is True and not pairs.get("whole_rows"), (q_heads, head_dim)
    for esize, head_dim, interleaved in ((4, 128, False), (2, 64, False), (2, 128, True)):
        got = rope_qk.default_config(4096, 32, 8, head_dim, esize, True, interleaved, freqs,
                                     head_dim)
        assert not got.get("whole_rows"), (esize, head_dim, interleaved)


def test_plan_sees_transposed_outputs(monkeypatch):
    """What ``_plan`` passes default_config as ``transposed``: true only where the results' tokens
    and heads are in the other memory order than the inputs' (Hugging Face's partial rotary on
    the transposed views models hand over); there, with rows of 256 B or more, token blocks are
    the programs' fastest axis (``TOKEN_BLOCKS_FASTEST``), and nowhere else."""
    seen = []
    real = rope_qk.default_config

    def spy(*args):
        seen.append(args[10])
        return real(*args)

    monkeypatch.setattr(rope_qk, "default_config", spy)
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    b, s, hq, hk, d = 2, 5, 4, 4, 64  # float32: rows of 256 B
    q_mem, k_mem = randn((b, s, hq, d), torch.float32, 0), randn((b, s, hk, d), torch.float32, 1)
    angles = randn((b, s, d // 2), torch.float32, 2)

    def tables(r):
        emb = torch.cat((angles[..., : r // 2], angles[..., : r // 2]), -1)
        return emb.cos(), emb.sin()

    def token_blocks_fastest():
        return [plan.constexprs["TOKEN_BLOCKS_FASTEST"] for plan in rope_qk._PLANS.values()]

    narrow = lambda x: x[..., : d // 2].to(torch.bfloat16)  # noqa: E731 (rows of 64 B)
    cases = [  # (q, k, rotary_dim, heads_axis, transposed, token blocks fastest)
        (q_mem.transpose(1, 2), k_mem.transpose(1, 2), 8, 1, True, True),
        (narrow(q_mem).transpose(1, 2), narrow(k_mem).transpose(1, 2), 8, 1, True, False),
        (q_mem.transpose(1, 2), k_mem.transpose(1, 2), d, 1, False, False),  # as the inputs
        (q_mem.transpose(1, 2).contiguous(), k_mem.transpose(1, 2).contiguous(), 8, 1, False,
         False),
        (q_mem, k_mem, 8, 2, False, False),
    ]
    for q, k, r, axis, transposed, fastest in cases:
        seen.clear()
        rope_qk._PLANS.clear()
        rope_qk.rope_cos_sin(q, k, *tables(r), axis)
        assert seen == [transposed], (q.stride(), r, axis)
        assert token_blocks_fastest() == [fastest], (q.stride(), q.dtype, r, axis)
    seen.clear()
    rope_qk._PLANS.clear()
    positions = torch.arange(s, device=DEVICE)
    rope_qk.rope_cos_sin_cache(positions, q_mem[0].reshape(s, -1), k_mem[0].reshape(s, -1), d,
                               make_cache(8, 8))
    qkv = randn((s, b, 2, 3 * d), torch.float32, 3)
    rope_qk.rope_qkv(qkv, RotaryPositionEmbedding(8, device=DEVICE)(s),
                     RotaryPositionEmbedding(8, device=DEVICE)(s), [d, d, d])
    assert seen == [False, False]
    assert token_blocks_fastest() == [False, False]


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("config", [
    dict(block_s=2, block_h=2, num_warps=4, all_heads=False, whole_rows=True),
    dict(block_s=4, block_h=4, num_warps=2, all_heads=False, whole_rows=True),  # transposed tiles
    dict(block_s=2, block_h=2, num_warps=4, all_heads=False)], ids=["rows", "rows4x4", "pairs"])
def test_hf_tables_whose_halves_differ(config, backward, seed, monkeypatch):
    """Hugging Face's cos and sin as given, whose two halves differ (transformers' formula does
    not need them equal): the forward takes each channel's own cos and sin, the backward is its
    exact transpose (checked with autograd through the float64 formula), with whole rows and
    pairs, partial rotary on transposed views. A kernel that took the partner's sine where the
    channel's own is meant (or the other way round) passes with RoPE's tables, not here."""
    monkeypatch.setattr(rope_qk, "_PLANS", {})
    monkeypatch.setattr(rope_qk, "default_config", lambda *args, **kwargs: dict(config))
    b, s, hq, hk, d, r = 2, 5, 4, 4, 16, 12
    q = randn((b, s, hq, d), torch.bfloat16, seed).transpose(1, 2)
    k = randn((b, s, hk, d), torch.bfloat16, seed + 1).transpose(1, 2)
    cos = randn((b, s, r), torch.float32, seed + 2)
    sin = randn((b, s, r), torch.float32, seed + 3)
    q_out, k_out = rope_qk.rope_cos_sin(q, k, cos, sin, heads_axis=1, backward=backward)
    (plan,) = rope_qk._PLANS.values()
    assert plan.constexprs["ROW"] == (16 if config.get("whole_rows") else 0)
    for name, x, out in (("q", q, q_out), ("k", k, k_out)):
        # (backward: x is the output's gradient, the reference the input's)
        want = (_hf_backward_reference if backward else hf_reference)(x, cos, sin)
        assert_rope_close(out, want, torch.bfloat16, name)


def test_hf_outputs_both_or_neither(seed):
    """rope_cos_sin writes into q_out and k_out, both or neither: one of them alone is refused
    before anything is written."""
    q = randn((1, 2, 3, 8), torch.float32, seed)
    k = randn((1, 1, 3, 8), torch.float32, seed + 1)
    cos, sin = torch.ones(1, 3, 8, device=DEVICE), torch.zeros(1, 3, 8, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    for given in (dict(q_out=out), dict(k_out=torch.full_like(k, float("nan")))):
        with pytest.raises(ValueError, match="both or neither"):
            rope_qk.rope_cos_sin(q, k, cos, sin, **given)
    assert out.isnan().all()


def test_parts_outer_rule(monkeypatch):
    """The program order by part (all of q's programs, then k's) where the programs take one head
    block and q's and k's heads fill their blocks; not for programs of all heads, token blocks
    fastest, fused QKV (v), blocks that k or q fills in part, or with the switch off."""
    rule = rope_qk._parts_outer  # (all_heads, token_blocks_fastest, has_v, q, k, block_h, block_hk)
    assert rule(False, False, False, 32, 8, 8, 8)  # the cache's 2 KB blocks at 32q/8k, bf16
    assert rule(False, False, False, 32, 32, 16, 16)  # Hugging Face's 4 KB blocks at 32q/32k
    assert not rule(False, False, False, 32, 8, 16, 16)  # ... at 32q/8k: k fills half a block
    assert rule(False, False, False, 32, 8, 16, 8)  # ... unless k's blocks are sized to k
    assert not rule(False, False, False, 24, 8, 16, 8)  # q's last block half empty
    assert not rule(True, False, False, 32, 8, 8, 8)
    assert not rule(False, True, False, 32, 8, 8, 8)
    assert not rule(False, False, True, 32, 8, 8, 8)
    monkeypatch.setattr(rope_qk, "PARTS_OUTER", False)
    assert not rule(False, False, False, 32, 8, 8, 8)


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("rotary_dim", [20, 12])
def test_every_program_shape_the_same_bits(call, rotary_dim, seed, monkeypatch):
    """One call (5 q and 3 k heads of 20 channels, 20 or 12 rotated) in every program shape of
    ``MODES`` (pairs' tiles, whole rows, all heads with q's first block apart from the loop,
    loads first, heads narrowed in place), out of place and in place: the same bits each time.
    The rotation is written as fused multiply-adds; left to contract ``x1 * cos - x2 * sin`` and
    ``x2 * cos + x1 * sin`` itself, the compiler fused one product or the other depending on the
    code around it, and in place (heads narrowed) differed from out of place (q's first block
    apart) in the last bit in 6 of the 36 cases of tests/test_serving.py's
    test_matches_reference_out_of_place_and_in_place on an H200."""
    q, k, want, rows, run = _q_k_call(call, 7, 5, 3, 20, rotary_dim, seed)
    first = None
    for m in MODES:
        monkeypatch.setattr(rope_qk, "default_config", lambda *args, m=m, **kwargs: dict(m))
        results, _, _ = _both_ways(run, q, k)
        if first is None:
            first = results[:2]
            for got, ref, name in zip(first, want, "qk"):
                assert_rope_close(rows(got), rows(ref), torch.float32, name)
        for got, ref, name in zip(results, first * 2, BOTH_WAYS):
            assert torch.equal(got, ref), f"{name}, {m}"


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("block_s,block_hk", [(1, 2), (2, 2), (2, 1)])
def test_program_order_by_part(call, block_s, block_hk, seed, monkeypatch):
    """Grouped-query q and k (6 and 2 heads) on blocks of 2 heads of q and ``block_hk`` of k, 7
    tokens (a part-filled last token block at block_s 2): the plan orders its programs by part,
    and its results, in place and not, equal the order before's bit for bit and the float64
    reference."""
    tokens, q_heads, k_heads, head_size = 7, 6, 2, 16
    monkeypatch.setattr(rope_qk, "default_config", lambda *args, **kwargs: dict(
        block_s=block_s, block_h=2, block_hk=block_hk, num_warps=2, all_heads=False))
    q, k, want, rows, run = _q_k_call(call, tokens, q_heads, k_heads, head_size, head_size, seed)
    _, plans = _switch_both_ways(monkeypatch, "PARTS_OUTER", run, q, k, want, rows)
    for parts_outer, (plan, _) in plans.items():
        assert plan.constexprs["PARTS_OUTER"] == parts_outer


def test_loads_before_positions_rule(monkeypatch):
    """q's and k's loads before the positions' (``X_FIRST``) for calls with per-token positions
    and half-split pairs, not for interleaved pairs, heads narrowed in place, calls without
    positions, or with the switch off."""
    rule = rope_qk._x_first  # (has_positions, interleaved, narrowed)
    assert rule(True, False, False)
    assert not rule(True, True, False)
    assert not rule(True, False, True)
    assert not rule(False, False, False)
    monkeypatch.setattr(rope_qk, "LOADS_BEFORE_POSITIONS", False)
    assert not rule(True, False, False)


@pytest.mark.parametrize("rotary_dim", [20, 12])
def test_loads_before_positions(mode, rotary_dim, seed, monkeypatch):
    """Every program shape (``mode``) of the cache call, grouped-query q and k (5 and 3 heads of
    20, 12 or 20 channels rotated) at positions in any order, into NaN-poisoned outputs and in
    place: with q's and k's loads before the positions' the plan says so where the rule takes
    it (not in place with part of the head rotated: the heads are narrowed), and the results
    equal the order before's bit for bit, in place equals out of place, and both the float64
    reference."""
    tokens, q_heads, k_heads, head_size = 7, 5, 3, 20
    q, k, want, rows, run = _q_k_call("cache half-split", tokens, q_heads, k_heads, head_size,
                                      rotary_dim, seed)
    # The same bits every way: the rotation is written as fused multiply-adds, so that neither
    # the order of the loads nor q's first block rotated apart from the loop (all heads) nor
    # the narrowed heads of in place (no X_FIRST) lets the compiler contract it otherwise.
    results, plans = _switch_both_ways(monkeypatch, "LOADS_BEFORE_POSITIONS", run, q, k, want,
                                       rows)
    for flag, (out_plan, in_plan) in plans.items():
        assert out_plan.constexprs["X_FIRST"] == flag
        assert in_plan.constexprs["X_FIRST"] == (flag and rotary_dim == head_size)
    q_out, k_out, q_in_place, k_in_place = results[True]
    assert torch.equal(q_in_place, q_out) and torch.equal(k_in_place, k_out), "in place"


def test_positions_first_rule(monkeypatch):
    """The positions' load before the tile's too (``POSITIONS_FIRST``) for programs of one head
    block with ``X_FIRST`` whose rows are gathered, on more than one warp, 4 tokens or more: not
    on one warp, not in tiles of 2 tokens, not for rows that are not gathered or all-heads
    programs, not without ``X_FIRST``, not with the switch off."""
    rule = rope_qk._positions_first  # (x_first, gather, all_heads, num_warps, block_s)
    assert rule(True, True, False, 2, 4) and rule(True, True, False, 4, 16)
    assert not rule(True, True, False, 1, 16)
    assert not rule(True, True, False, 2, 2)
    assert not rule(True, False, False, 2, 4)
    assert not rule(True, True, True, 2, 4)
    assert not rule(False, True, False, 2, 4)
    monkeypatch.setattr(rope_qk, "GATHERED_POSITIONS_FIRST", False)
    assert not rule(True, True, False, 2, 4)


@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("block_s,num_warps", [(4, 2), (4, 1), (2, 2)])
def test_positions_first(block_s, num_warps, backward, seed, monkeypatch):
    """The cache's gathered rows (12 of 20 channels rotated, 5 q / 3 k heads in blocks of 2, 7
    tokens at positions in any order), forward and backward, into NaN-poisoned outputs, with the
    switch on and off: the plan loads the positions first in 4 tokens on 2 warps, not on 1 warp
    nor in 2 tokens, the results
    are the same bits either way (the order of the loads changes no arithmetic) and match the
    float64 reference."""
    tokens, q_heads, k_heads, head_size, rotary_dim = 7, 5, 3, 20, 12
    monkeypatch.setattr(rope_qk, "default_config", lambda *args, **kwargs: dict(
        block_s=block_s, block_h=2, num_warps=num_warps, all_heads=False, whole_rows=True,
        gather=True))
    plans = _cache_switched(monkeypatch, "GATHERED_POSITIONS_FIRST",
                            (tokens, q_heads, k_heads, head_size, rotary_dim), torch.float32,
                            backward, seed)
    for flag, plan in plans.items():
        assert plan.constexprs["GATHER"] and plan.constexprs["X_FIRST"]
        assert plan.constexprs["POSITIONS_FIRST"] == (flag and num_warps > 1 and block_s >= 4)


@pytest.mark.parametrize("backward", [False, True])
def test_complex_angles(mode, backward, seed):
    """Llama 4's and DeepSeek V2's angles (``rope_qk.COMPLEX_PAIRS``): cos and sin the real and
    imaginary parts of one complex tensor, which the kernel reads through cos's pointer
    (``SIN_OFFSET`` 1), in every program shape, forward and backward, on random angles of
    random magnitude, against the float64 formula and its gradient."""
    b, s, q_heads, k_heads, d = 2, 3, 5, 3, 16
    q = randn((b, s, q_heads, d), torch.float32, seed).transpose(1, 2)
    k = randn((b, s, k_heads, d), torch.float32, seed + 1).transpose(1, 2)
    freqs = torch.polar(randn((b, s, d // 2), torch.float32, seed + 2).abs() + 0.5,
                        randn((b, s, d // 2), torch.float32, seed + 3) * 3)
    table = torch.view_as_real(freqs)
    cos, sin = table[..., 0], table[..., 1]
    rope_qk._PLANS.clear()
    outs = rope_qk.rope_cos_sin(q, k, cos, sin, 1, backward=backward, pairs="interleaved_complex")
    (plan,) = rope_qk._PLANS.values()
    assert plan.constexprs["SIN_OFFSET"] == 1
    for x, out, name in zip((q, k), outs, "qk"):
        ref = (_hf_backward_reference if backward else hf_reference)(
            x, cos, sin, pairs="interleaved_per_pair")
        assert_rope_close(out, ref, torch.float32, name)
