"""apply_rope_with_cos_sin_cache(_inplace): FlashInfer's convention (what vLLM and SGLang call),
against a float64 reference built from FlashInfer's documented semantics: per-token positions in
any order, a float32 cos/sin cache [max_position, rotary_dim] (cos first, sin second), q and k
with their own head counts, rotary_dim <= head_size, half-split (is_neox) or interleaved pairs."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, randn
from rope_kernels import (_validate, apply_rope_with_cos_sin_cache,
                          apply_rope_with_cos_sin_cache_inplace, rope_qk)
from rope_kernels.reference import cos_sin_cache_reference


def make_cache(max_position: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """vLLM's RotaryEmbedding._compute_cos_sin_cache: [max_position, rotary_dim] float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


reference = cos_sin_cache_reference  # float64: x [T, H * D] rotated at per-token positions


SHAPES = ([(64, 32, 8, 128, 128), (300, 12, 4, 64, 32), (7, 4, 4, 96, 64)] if ON_GPU
          else [(9, 4, 2, 24, 24), (5, 3, 1, 20, 12)])


@pytest.mark.parametrize("tokens,q_heads,k_heads,head_size,rotary_dim", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_matches_reference_out_of_place_and_in_place(tokens, q_heads, k_heads, head_size,
                                                     rotary_dim, dtype, is_neox, pos_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(4096, rotary_dim)
    positions = torch.randint(0, 4096, (tokens,), generator=g, dtype=pos_dtype).to(DEVICE)
    # q and k as views into one packed qkv buffer, as vLLM passes them (row stride > width).
    qkv = randn((tokens, (q_heads + 2 * k_heads) * head_size), dtype, seed)
    query = qkv[:, : q_heads * head_size]
    key = qkv[:, q_heads * head_size: (q_heads + k_heads) * head_size]
    before = qkv.clone()
    q_out, k_out = apply_rope_with_cos_sin_cache(positions, query, key, head_size, cache, is_neox)
    assert torch.equal(qkv, before), "the out-of-place call modified its inputs"
    assert q_out.shape == query.shape and k_out.shape == key.shape and q_out.is_contiguous()
    assert_rope_close(q_out, reference(positions, query, head_size, cache, is_neox), dtype, "query")
    assert_rope_close(k_out, reference(positions, key, head_size, cache, is_neox), dtype, "key")
    assert apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache,
                                                 is_neox) is None
    assert torch.equal(query, q_out) and torch.equal(key, k_out)
    v = qkv[:, (q_heads + k_heads) * head_size:]
    assert torch.equal(v, before[:, (q_heads + k_heads) * head_size:]), "in place wrote past key"


def test_one_launch_3d_heads_and_gradient(seed, monkeypatch):
    launches = []
    real = rope_qk.launch
    monkeypatch.setattr(rope_qk, "launch", lambda *a: launches.append(1) or real(*a))
    cache = make_cache(64, 16)
    positions = torch.tensor([5, 0, 63, 5, 17], device=DEVICE)
    query = randn((5, 4, 16), torch.float32, seed).requires_grad_(True)  # [T, H, D] is accepted
    key = randn((5, 2 * 16), torch.float32, seed + 1).requires_grad_(True)
    q_out, k_out = apply_rope_with_cos_sin_cache(positions, query, key, 16, cache, True)
    assert len(launches) == 1
    wq, wk = randn(q_out.shape, torch.float32, 1), randn(k_out.shape, torch.float32, 2)
    ((q_out * wq).sum() + (k_out * wk).sum()).backward()
    assert len(launches) == 2
    q64 = query.detach().double().requires_grad_(True)
    k64 = key.detach().double().requires_grad_(True)
    ((reference(positions, q64.reshape(5, -1), 16, cache, True).view(5, 4, 16) * wq).sum()
     + (reference(positions, k64, 16, cache, True) * wk).sum()).backward()
    assert_rope_close(query.grad, q64.grad, torch.float32, "query gradient")
    assert_rope_close(key.grad, k64.grad, torch.float32, "key gradient")


def _args(**changes):
    args = dict(positions=torch.tensor([0, 3, 1], device=DEVICE),
                query=randn((3, 4 * 16), torch.float32, 1), key=randn((3, 2 * 16), torch.float32, 2),
                head_size=16, cos_sin_cache=make_cache(8, 16), is_neox=True)
    args.update(changes)
    return args


BAD = [
    ("position past the cache", dict(positions=torch.tensor([0, 8, 1])), ValueError,
     ["positions must lie in [0, 8)", "to 8"]),
    ("negative position", dict(positions=torch.tensor([0, -1, 1])), ValueError,
     ["positions must lie in [0, 8)", "from -1"]),
    ("float positions", dict(positions=torch.tensor([0.0, 1.0, 2.0])), TypeError,
     ["positions must have dtype", "torch.float32"]),
    ("token counts differ", dict(positions=torch.tensor([0, 1])), ValueError,
     ["one row per position", "2 tokens", "query has 3"]),
    ("head_size does not divide", dict(head_size=24), ValueError,
     ["head_size (24) must divide query's width", "(3, 64)"]),
    ("rotary_dim > head_size", dict(cos_sin_cache=make_cache(8, 32)), ValueError,
     ["rotary_dim = 32", "<= head_size (16)"]),
    ("odd rotary_dim", dict(cos_sin_cache=torch.zeros(8, 7)), ValueError,
     ["rotary_dim) must be even", "7"]),
    ("float16 cache", dict(cos_sin_cache=make_cache(8, 16).half()), TypeError,
     ["cos_sin_cache must be float32", "torch.float16"]),
    ("float64 query", dict(query=torch.zeros(3, 64, dtype=torch.float64)), TypeError,
     ["query must have dtype", "torch.float64"]),
    ("key of another dtype", dict(key=torch.zeros(3, 32, dtype=torch.float16)), TypeError,
     ["key must have query's dtype", "torch.float16"]),
    ("is_neox not a bool", dict(is_neox="yes"), TypeError, ["is_neox must be a bool"]),
    ("strided channels", dict(query=torch.zeros(64, 3).t()), ValueError,
     ["last axis must be contiguous"]),
]


@pytest.mark.parametrize("case,changes,exc,words", BAD, ids=[c[0] for c in BAD])
@pytest.mark.parametrize("inplace", [False, True])
def test_bad_input(case, changes, exc, words, inplace):
    args = _args(**{k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)
                    for k, v in changes.items()})
    fn = apply_rope_with_cos_sin_cache_inplace if inplace else apply_rope_with_cos_sin_cache
    with pytest.raises(exc) as info:
        fn(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("bad", [-1, 8])
def test_positions_checked_past_the_host_reduce_size(bad):
    """More tokens than _validate._HOST_REDUCE_MAX: the positions are reduced on the device
    before the copy to the host, and a bad one is still found wherever it is."""
    n = _validate._HOST_REDUCE_MAX + 44
    positions = torch.randint(0, 8, (n,), device=DEVICE)
    positions[2 * n // 3] = bad
    args = _args(positions=positions, query=randn((n, 4 * 16), torch.float32, 1),
                 key=randn((n, 2 * 16), torch.float32, 2))
    with pytest.raises(ValueError, match=rf"positions must lie in \[0, 8\)(.|\n)*{bad}"):
        apply_rope_with_cos_sin_cache(**args)


def test_devices_must_match():
    if not ON_GPU:
        pytest.skip("needs a second device")
    with pytest.raises(ValueError, match="cos_sin_cache must be on the same device"):
        apply_rope_with_cos_sin_cache(**_args(cos_sin_cache=make_cache(8, 16).cpu()))


def test_in_place_refuses_what_it_cannot_do():
    """Clear errors naming the function, the argument and what to do instead: query or key that
    need a gradient (fine under no_grad), one tensor for both, a query whose rows share memory
    (an expanded row: every token's programs would write the same elements). Nothing is written
    by a refused call; query and key as views of one packed qkv buffer are accepted."""
    args = _args()
    query, key = args["query"], args["key"]
    before = query.clone(), key.clone()
    name = "apply_rope_with_cos_sin_cache_inplace"
    with pytest.raises(ValueError, match=rf"{name} cannot rotate query and key that require "
                                         r"grad.*use apply_rope_with_cos_sin_cache, which"):
        apply_rope_with_cos_sin_cache_inplace(**_args(key=key.clone().requires_grad_(True)))
    with torch.no_grad():
        apply_rope_with_cos_sin_cache_inplace(**_args(query=query.clone().requires_grad_(True)))
    with pytest.raises(ValueError, match=rf"{name} needs query and key to be different tensors"):
        apply_rope_with_cos_sin_cache_inplace(**_args(query=query, key=query))
    shared = randn((1, 4 * 16), torch.float32, 3).expand(3, -1)
    with pytest.raises(ValueError, match=r"writes into query, whose elements share memory.*"
                                         r"strides \(0, 1\)"):
        apply_rope_with_cos_sin_cache_inplace(**_args(query=shared))
    assert torch.equal(query, before[0]) and torch.equal(key, before[1])
    # One packed [num_tokens, (4 + 2 + 2) heads x 16] buffer: q and k are its first 6 heads.
    qkv = randn((3, 8 * 16), torch.float32, 4)
    expected = apply_rope_with_cos_sin_cache(**_args(query=qkv[:, :64], key=qkv[:, 64:96]))
    v = qkv[:, 96:].clone()
    apply_rope_with_cos_sin_cache_inplace(**_args(query=qkv[:, :64], key=qkv[:, 64:96]))
    assert torch.equal(qkv[:, :64], expected[0]) and torch.equal(qkv[:, 64:96], expected[1])
    assert torch.equal(qkv[:, 96:], v)
