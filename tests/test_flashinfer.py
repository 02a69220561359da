"""rope_kernels.flashinfer: FlashInfer's apply_rope_pos_ids, apply_rope (ragged, indptr and
offsets) and their Llama 3.1 and in-place twins, the angles computed in the kernel.

Checked against a float64 reference built from FlashInfer's documented semantics
(``reference.pos_ids_reference``: the angle a float32 product of position and frequency, its
rotation in float64), the frequency tables against transformers' own rotary modules ("linear"
and "llama3" rope types), and the whole call against transformers' Llama rotary module and
apply_rotary_pos_emb. FlashInfer itself cannot run here (CUDA code compiled at first use)."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, count_qk_launches, randn
import rope_kernels.api
import rope_kernels.flashinfer as fi
from rope_kernels import rope_qk
from rope_kernels.reference import pos_ids_reference

SHAPES = ([(64, 32, 8, 128, None), (300, 12, 4, 64, 32), (7, 4, 4, 96, 64), (33, 8, 1, 80, 80)]
          if ON_GPU else [(9, 4, 2, 24, None), (5, 3, 1, 20, 12)])
LLAMA31 = dict(rope_scale=8, rope_theta=5e5, low_freq_factor=1, high_freq_factor=4,
               old_context_len=8192)


def _table(head_dim, rotary_dim, llama31, rope_scale=1, rope_theta=1e4):
    r = head_dim if rotary_dim is None else rotary_dim
    if llama31:
        return rope_qk.inv_freq_table(r, 8, 5e5, DEVICE, (1, 4, 8192))
    return rope_qk.inv_freq_table(r, rope_scale, rope_theta, DEVICE)


@pytest.mark.parametrize("nnz,q_heads,k_heads,head_dim,rotary_dim", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("llama31", [False, True])
def test_pos_ids_match_reference_out_of_place_and_in_place(nnz, q_heads, k_heads, head_dim,
                                                           rotary_dim, dtype, interleave,
                                                           llama31, seed):
    g = torch.Generator().manual_seed(seed)
    pos_dtype = torch.int32 if seed % 2 else torch.int64
    # Any order, repeats, up to 2**17 (past FlashInfer's usual contexts; no table to stay inside).
    pos_ids = torch.randint(0, 2**17, (nnz,), generator=g, dtype=pos_dtype).to(DEVICE)
    # q and k as views into one packed qkv buffer, as FlashInfer's example passes them.
    qkv = randn((nnz, q_heads + 2 * k_heads, head_dim), dtype, seed)
    q, k = qkv[:, :q_heads], qkv[:, q_heads:q_heads + k_heads]
    before = qkv.clone()
    if llama31:
        args = dict(rotary_dim=rotary_dim, interleave=interleave, **LLAMA31)
        q_rope, k_rope = fi.apply_llama31_rope_pos_ids(q, k, pos_ids, **args)
    else:
        args = dict(rotary_dim=rotary_dim, interleave=interleave, rope_scale=2, rope_theta=1e4)
        q_rope, k_rope = fi.apply_rope_pos_ids(q, k, pos_ids, **args)
    assert torch.equal(qkv, before), "the out-of-place call modified its inputs"
    assert q_rope.shape == q.shape and k_rope.shape == k.shape and q_rope.dtype == dtype
    table = _table(head_dim, rotary_dim, llama31, rope_scale=2)
    assert_rope_close(q_rope, pos_ids_reference(pos_ids, q, table, interleave), dtype, "q")
    assert_rope_close(k_rope, pos_ids_reference(pos_ids, k, table, interleave), dtype, "k")
    inplace = fi.apply_llama31_rope_pos_ids_inplace if llama31 else fi.apply_rope_pos_ids_inplace
    assert inplace(q, k, pos_ids, **args) is None
    assert torch.equal(q, q_rope) and torch.equal(k, k_rope), "in place differs from out of place"
    v = qkv[:, q_heads + k_heads:]
    assert torch.equal(v, before[:, q_heads + k_heads:]), "in place wrote past k"


@pytest.mark.parametrize("llama31", [False, True])
@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("dtypes", [(torch.int32, torch.int32), (torch.int64, torch.int32)])
def test_ragged_batch_matches_its_positions(llama31, interleave, dtypes, seed):
    """apply_rope's segments (an empty one among them) rotate each token at its segment's offset
    plus its place in the segment; the in-place twin writes the same bits."""
    lengths, offsets = [5, 0, 11, 1, 7], [3, 900, 0, 70000, 12]
    indptr = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=dtypes[0],
                          device=DEVICE)
    offsets_t = torch.tensor(offsets, dtype=dtypes[1], device=DEVICE)
    expected_positions = [o + i for o, n in zip(offsets, lengths) for i in range(n)]
    nnz = len(expected_positions)
    positions = rope_qk.ragged_positions(indptr, offsets_t, nnz)
    assert positions.tolist() == expected_positions
    assert positions.dtype == (torch.int64 if torch.int64 in dtypes else torch.int32)
    q, k = randn((nnz, 4, 32), torch.float32, seed), randn((nnz, 2, 32), torch.float32, seed + 1)
    fn, fn_ = ((fi.apply_llama31_rope, fi.apply_llama31_rope_inplace) if llama31
               else (fi.apply_rope, fi.apply_rope_inplace))
    q_rope, k_rope = fn(q, k, indptr, offsets_t, rotary_dim=16, interleave=interleave)
    table = _table(32, 16, llama31)
    pos = torch.tensor(expected_positions, device=DEVICE)
    assert_rope_close(q_rope, pos_ids_reference(pos, q, table, interleave), torch.float32, "q")
    assert_rope_close(k_rope, pos_ids_reference(pos, k, table, interleave), torch.float32, "k")
    assert fn_(q, k, indptr, offsets_t, rotary_dim=16, interleave=interleave) is None
    assert torch.equal(q, q_rope) and torch.equal(k, k_rope)


def test_ragged_positions_many_segments(seed):
    """The binary search over a long indptr (1000 segments, many empty) against a Python loop."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (1000,), generator=g)
    offsets = torch.randint(0, 10**6, (1000,), generator=g)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    expected = [int(o) + i for o, n in zip(offsets, lengths) for i in range(int(n))]
    got = rope_qk.ragged_positions(indptr.to(DEVICE), offsets.to(DEVICE), len(expected))
    assert got.tolist() == expected


def _hf_inv_freq(rope_parameters, head_dim):
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    config = modeling_llama.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4,
                                        head_dim=head_dim, rope_parameters=rope_parameters,
                                        max_position_embeddings=131072)
    return modeling_llama.LlamaRotaryEmbedding(config).to(DEVICE)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kind", ["linear", "llama3"])
def test_frequencies_match_transformers(head_dim, kind):
    """The frequency tables against transformers' own rotary modules, which compute them in
    float32 (ours float64, rounded once): equal within 4 float32 ulps (transformers rounds the
    power, then each step of Llama 3.1's blend)."""
    if kind == "linear":
        params = dict(rope_type="linear", rope_theta=1e4, factor=2.0)
        ours = rope_qk.inv_freq_table(head_dim, 2.0, 1e4, DEVICE)
    else:
        params = dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                      high_freq_factor=4.0, original_max_position_embeddings=8192)
        ours = rope_qk.inv_freq_table(head_dim, 8.0, 5e5, DEVICE, (1.0, 4.0, 8192))
    theirs = _hf_inv_freq(params, head_dim).inv_freq
    assert ours.dtype == torch.float32 and ours.shape == theirs.shape
    torch.testing.assert_close(ours, theirs.to(ours.device), rtol=4 * 2**-23, atol=0)
    if kind == "llama3":  # the three regimes are all present at these sizes
        plain = rope_qk.inv_freq_table(head_dim, 1.0, 5e5, DEVICE)
        scaled = torch.isclose(ours, plain / 8, rtol=1e-6)
        unscaled = torch.isclose(ours, plain, rtol=1e-6)
        assert scaled.any() and unscaled.any() and (~scaled & ~unscaled).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama31_call_matches_transformers_llama(dtype, seed):
    """Llama 3.1's rotary module and transformers' apply_rotary_pos_emb (their code, their
    float32 angles) against apply_llama31_rope_pos_ids on the same q and k. Positions under 256
    keep the two float32 angle computations within 3e-5 rad of each other."""
    modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    params = dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=8192)
    module = _hf_inv_freq(params, 64)
    nnz = 40
    pos_ids = torch.randint(0, 256, (nnz,), generator=torch.Generator().manual_seed(seed))
    pos_ids = pos_ids.to(DEVICE)
    q, k = randn((nnz, 4, 64), dtype, seed), randn((nnz, 2, 64), dtype, seed + 1)
    cos, sin = module(q, pos_ids[None])  # [1, nnz, 64] in q's dtype
    hq, hk = modeling_llama.apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                 cos, sin)
    ours = fi.apply_llama31_rope_pos_ids(q, k, pos_ids)
    # bf16: transformers rounds cos/sin to bf16 and each product too; one ulp of the result
    tol = dict(rtol=0, atol=1e-4) if dtype == torch.float32 else dict(rtol=2**-7, atol=2e-2)
    torch.testing.assert_close(ours[0], hq[0].transpose(0, 1), **tol)
    torch.testing.assert_close(ours[1], hk[0].transpose(0, 1), **tol)


def test_large_positions_in_float32(seed):
    """Positions up to 2**20 in float32: the kernel's cos/sin of the float32 angle (accurate
    ones for float32 tensors) within the float32 tolerance of the reference's."""
    pos_ids = torch.tensor([0, 1, 2**20 - 1, 999_983, 65_537, 2**19], device=DEVICE)
    q, k = randn((6, 2, 128), torch.float32, seed), randn((6, 1, 128), torch.float32, seed + 1)
    q_rope, k_rope = fi.apply_rope_pos_ids(q, k, pos_ids, rope_theta=5e5)
    table = rope_qk.inv_freq_table(128, 1, 5e5, DEVICE)
    assert_rope_close(q_rope, pos_ids_reference(pos_ids, q, table), torch.float32, "q")
    assert_rope_close(k_rope, pos_ids_reference(pos_ids, k, table), torch.float32, "k")


def test_one_launch_shortcut_and_gradient(seed, monkeypatch):
    """One launch a call; repeated eager calls take the shortcut (no planning) and give the same
    bits; the out-of-place call is differentiable (the backward one more launch), its gradient
    that of the float64 reference."""
    launches = count_qk_launches(monkeypatch)
    monkeypatch.setattr(rope_qk, "_INV_FREQ", {})  # the first call makes its table
    pos_ids = torch.tensor([5, 0, 63, 5, 17000], device=DEVICE)
    q, k = randn((5, 4, 16), torch.float32, seed), randn((5, 2, 16), torch.float32, seed + 1)
    first = fi.apply_rope_pos_ids(q, k, pos_ids, interleave=True)
    assert len(launches) == 1
    for _ in range(3):
        again = fi.apply_rope_pos_ids(q, k, pos_ids, interleave=True)
        assert type(again) is tuple and all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(launches) == 1, "the first call records its launch; later ones take the shortcut"
    assert any(rope_kernels.api._SHORTCUTS.entries.values())
    qg, kg = q.clone().requires_grad_(True), k.clone().requires_grad_(True)
    q_rope, k_rope = fi.apply_rope_pos_ids(qg, kg, pos_ids, interleave=True)
    wq, wk = randn(q_rope.shape, torch.float32, 7), randn(k_rope.shape, torch.float32, 8)
    ((q_rope * wq).sum() + (k_rope * wk).sum()).backward()
    assert len(launches) == 3
    table = rope_qk.inv_freq_table(16, 1, 1e4, DEVICE)
    q64, k64 = q.double().requires_grad_(True), k.double().requires_grad_(True)
    ((pos_ids_reference(pos_ids, q64, table, True) * wq).sum()
     + (pos_ids_reference(pos_ids, k64, table, True) * wk).sum()).backward()
    assert_rope_close(qg.grad, q64.grad, torch.float32, "q gradient")
    assert_rope_close(kg.grad, k64.grad, torch.float32, "k gradient")


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("interleave", [True, False])
def test_calls_through_the_shortcut_match_reference(in_place, interleave, seed, monkeypatch):
    """Calls of one signature with new values each time, q at an even and then an odd address
    (interleaved pairs are read as words only from even ones: two signatures), through the
    shortcut from the second call of each, against the reference."""
    monkeypatch.setattr(rope_kernels.api, "_SHORTCUTS", rope_kernels.api._Shortcuts())
    table = rope_qk.inv_freq_table(24, 1, 1e4, DEVICE)
    for call in range(6):
        odd, s = call % 2 == 1, seed + call
        pos_ids = torch.randint(0, 5000, (9,), generator=torch.Generator().manual_seed(s))
        pos_ids = pos_ids.to(DEVICE)
        flat = randn((9 * 4 * 24 + 1,), torch.bfloat16, s)
        q = (flat[1:] if odd else flat[:-1]).view(9, 4, 24)
        k = randn((9, 2, 24), torch.bfloat16, s + 1)
        want = (pos_ids_reference(pos_ids, q, table, interleave),
                pos_ids_reference(pos_ids, k, table, interleave))
        if in_place:
            fi.apply_rope_pos_ids_inplace(q, k, pos_ids, interleave=interleave)
            got = (q, k)
        else:
            got = fi.apply_rope_pos_ids(q, k, pos_ids, interleave=interleave)
        for x, ref, name in zip(got, want, ("q", "k")):
            assert_rope_close(x, ref, torch.bfloat16, f"{name}, call {call}")
    entries = [e for e in rope_kernels.api._SHORTCUTS.entries.values() if e]
    assert len(entries) == (2 if interleave else 1)


def _args(**changes):
    args = dict(q=randn((3, 4, 16), torch.float32, 1), k=randn((3, 2, 16), torch.float32, 2),
                pos_ids=torch.tensor([0, 3, 1], device=DEVICE))
    args.update(changes)
    return args


BAD = [
    ("2-D q", dict(q=torch.zeros(3, 64)), ValueError, ["q must be 3-D", "(3, 64)"]),
    ("float64 q", dict(q=torch.zeros(3, 4, 16, dtype=torch.float64)), TypeError,
     ["q must have dtype", "torch.float64"]),
    ("k of another dtype", dict(k=torch.zeros(3, 2, 16, dtype=torch.float16)), TypeError,
     ["k must have q's dtype", "torch.float16"]),
    ("k of another head_dim", dict(k=torch.zeros(3, 2, 32)), ValueError,
     ["k must have q's tokens and head_dim", "(3, 2, 32)"]),
    ("token counts differ", dict(pos_ids=torch.tensor([0, 1])), ValueError,
     ["pos_ids must have shape [3]", "(2,)"]),
    ("float positions", dict(pos_ids=torch.tensor([0.0, 1.0, 2.0])), TypeError,
     ["pos_ids must have dtype torch.int32 or torch.int64", "torch.float32"]),
    ("odd rotary_dim", dict(rotary_dim=7), ValueError, ["rotary_dim must be even", "got 7"]),
    ("rotary_dim > head_dim", dict(rotary_dim=32), ValueError, ["<= head_dim (16)", "got 32"]),
    ("rotary_dim not an int", dict(rotary_dim=8.0), TypeError, ["rotary_dim must be an int"]),
    ("interleave not a bool", dict(interleave=1), TypeError, ["interleave must be a bool"]),
    ("rope_theta 0", dict(rope_theta=0), ValueError, ["rope_theta must be a finite number > 0"]),
    ("rope_scale NaN", dict(rope_scale=float("nan")), ValueError, ["rope_scale must be a finite"]),
    ("rope_scale a tensor", dict(rope_scale=torch.tensor(2.0)), TypeError,
     ["rope_scale must be a number"]),
]
LLAMA31_BAD = [
    ("high_freq_factor <= low", dict(low_freq_factor=4, high_freq_factor=4), ValueError,
     ["high_freq_factor must be > low_freq_factor", "4 and 4"]),
    ("old_context_len 0", dict(old_context_len=0), ValueError, ["old_context_len must be"]),
]


@pytest.mark.parametrize("case,changes,exc,words", BAD + LLAMA31_BAD,
                         ids=[c[0] for c in BAD + LLAMA31_BAD])
@pytest.mark.parametrize("inplace", [False, True])
def test_bad_input(case, changes, exc, words, inplace):
    llama31 = any(c[0] == case for c in LLAMA31_BAD)
    fn = {(False, False): fi.apply_rope_pos_ids, (False, True): fi.apply_rope_pos_ids_inplace,
          (True, False): fi.apply_llama31_rope_pos_ids,
          (True, True): fi.apply_llama31_rope_pos_ids_inplace}[llama31, inplace]
    args = _args(**{k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)
                    for k, v in changes.items()})
    with pytest.raises(exc) as info:
        fn(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("indptr,offsets,words", [
    ([0, 2, 4], [0, 1, 2], ["indptr must have shape [4]", "(3,)"]),
    ([0, 2, 4], [0], ["indptr must have shape [2]"]),
    ([1, 2, 3], [0, 0], ["indptr must run non-decreasing from 0 to nnz = 3", "[1, 2, 3]"]),
    ([0, 2, 1, 3], [0, 0, 0], ["non-decreasing", "[0, 2, 1, 3]"]),
    ([0, 2, 4], [0, 0], ["from 0 to nnz = 3", "[0, 2, 4]"]),
])
def test_bad_indptr(indptr, offsets, words):
    q, k = randn((3, 4, 16), torch.float32, 1), randn((3, 2, 16), torch.float32, 2)
    before = q.clone()
    with pytest.raises(ValueError) as info:
        fi.apply_rope_inplace(q, k, torch.tensor(indptr, device=DEVICE),
                              torch.tensor(offsets, device=DEVICE))
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"
    assert torch.equal(q, before)


def test_in_place_refuses_what_it_cannot_do():
    args = _args()
    name = "apply_rope_pos_ids_inplace"
    with pytest.raises(ValueError, match=rf"{name} cannot rotate q and k that require grad.*"
                                         r"use apply_rope_pos_ids, which"):
        fi.apply_rope_pos_ids_inplace(**_args(k=args["k"].clone().requires_grad_(True)))
    same = _args()
    same["k"] = same["q"]
    with pytest.raises(ValueError, match=rf"{name} needs q and k to be different tensors"):
        fi.apply_rope_pos_ids_inplace(**same)
    shared = randn((1, 4, 16), torch.float32, 3).expand(3, -1, -1)
    with pytest.raises(ValueError, match=r"writes into q, whose elements share memory"):
        fi.apply_rope_pos_ids_inplace(**_args(q=shared))


def test_devices_must_match():
    if not ON_GPU:
        pytest.skip("needs a second device")
    with pytest.raises(ValueError, match="pos_ids must be on the same device as q"):
        fi.apply_rope_pos_ids(**_args(pos_ids=torch.tensor([0, 3, 1])))


def test_cos_sin_cache_functions_are_the_packages():
    """The module carries FlashInfer's cos/sin-cache pair too: the package's own functions."""
    assert fi.apply_rope_with_cos_sin_cache is rope_kernels.apply_rope_with_cos_sin_cache
    assert (fi.apply_rope_with_cos_sin_cache_inplace
            is rope_kernels.apply_rope_with_cos_sin_cache_inplace)
    assert sorted(fi.__all__) == sorted(n for n in dir(fi) if n.startswith("apply_"))


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_captured_in_a_cuda_graph_with_a_table_made_there(seed):
    """A call whose frequency table is first made inside capture: the table is made by the graph
    (and not kept), so replays rotate by the right angles; the ragged call too."""
    rope_qk._INV_FREQ.clear()
    pos_ids = torch.randint(0, 4096, (64,), device=DEVICE)
    q, k = randn((64, 8, 64), torch.bfloat16, seed), randn((64, 2, 64), torch.bfloat16, seed + 1)
    indptr = torch.tensor([0, 30, 64], device=DEVICE, dtype=torch.int32)
    offsets = torch.tensor([7, 1000], device=DEVICE, dtype=torch.int32)
    qs, ks = q.clone(), k.clone()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fi.apply_llama31_rope_pos_ids_inplace(qs, ks, pos_ids, rotary_dim=32)
        ragged = fi.apply_rope(q, k, indptr, offsets)
    assert not rope_qk._INV_FREQ, "a table made during capture was kept"
    for _ in range(2):
        qs.copy_(q)
        ks.copy_(k)
        graph.replay()
    torch.cuda.synchronize()
    table = rope_qk.inv_freq_table(32, 8, 5e5, DEVICE, (1, 4, 8192))
    assert_rope_close(qs, pos_ids_reference(pos_ids, q, table), torch.bfloat16, "q")
    assert_rope_close(ks, pos_ids_reference(pos_ids, k, table), torch.bfloat16, "k")
    positions = torch.cat([torch.arange(30) + 7, torch.arange(34) + 1000]).to(DEVICE)
    table = rope_qk.inv_freq_table(64, 1, 1e4, DEVICE)
    assert_rope_close(ragged[0], pos_ids_reference(positions, q, table), torch.bfloat16, "q")
    assert_rope_close(ragged[1], pos_ids_reference(positions, k, table), torch.bfloat16, "k")
