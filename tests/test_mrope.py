"""apply_mrope_with_cos_sin_cache(_inplace): vLLM's and SGLang's MRotaryEmbedding (multimodal
RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V) with FlashInfer's cache arguments, against a
float64 reference written from vLLM's ``forward_native`` and against transformers' own Qwen2-VL
and Qwen3-VL rotary modules with its ``apply_rotary_pos_emb``."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, randn
from rope_kernels import (apply_mrope_with_cos_sin_cache, apply_mrope_with_cos_sin_cache_inplace,
                          apply_rope_with_cos_sin_cache, rope_mrope)
from rope_kernels.reference import mrope_cos_sin_cache_reference as reference


def make_cache(max_position: int, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """vLLM's RotaryEmbedding._compute_cos_sin_cache: [max_position, rotary_dim] float32."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


def thw_positions(tokens: int, max_position: int, generator, dtype=torch.int64):
    """[3, tokens]: T, H and W positions that differ (an image's patches), in any order."""
    return torch.randint(0, max_position, (3, tokens), generator=generator, dtype=dtype).to(DEVICE)


# (tokens, q heads, k heads, head_size, rotary_dim, mrope_section, interleaved sections):
# Qwen2.5-VL-7B's 28 q / 4 k heads of 128 and [16, 24, 24]; Qwen3-VL's [24, 20, 20]
# interleaved; GLM-4V's half-rotated heads; sections with an empty axis.
SHAPES = ([(77, 28, 4, 128, 128, [16, 24, 24], False), (64, 32, 8, 128, 128, [24, 20, 20], True),
           (33, 12, 2, 128, 64, [8, 12, 12], False), (20, 6, 6, 80, 64, [0, 16, 16], True)]
          if ON_GPU else
          [(9, 4, 2, 16, 16, [2, 3, 3], False), (7, 3, 1, 24, 24, [6, 3, 3], True),
           (5, 2, 2, 24, 16, [4, 0, 4], False)])


@pytest.mark.parametrize("tokens,q_heads,k_heads,head_size,rotary_dim,section,interleaved",
                         SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("pos_dtype", [torch.int32, torch.int64])
def test_matches_reference_out_of_place_and_in_place(tokens, q_heads, k_heads, head_size,
                                                     rotary_dim, section, interleaved, dtype,
                                                     is_neox, pos_dtype, seed):
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(4096, rotary_dim)
    positions = thw_positions(tokens, 4096, g, pos_dtype)
    # q and k as views into one packed qkv buffer, as vLLM passes them (row stride > width).
    qkv = randn((tokens, (q_heads + 2 * k_heads) * head_size), dtype, seed)
    query = qkv[:, : q_heads * head_size]
    key = qkv[:, q_heads * head_size: (q_heads + k_heads) * head_size]
    before = qkv.clone()
    kwargs = dict(mrope_section=section, mrope_interleaved=interleaved)
    q_out, k_out = apply_mrope_with_cos_sin_cache(positions, query, key, head_size, cache, is_neox,
                                                  **kwargs)
    assert torch.equal(qkv, before), "the out-of-place call modified its inputs"
    assert q_out.shape == query.shape and k_out.shape == key.shape and q_out.is_contiguous()
    for name, out, x in (("query", q_out, query), ("key", k_out, key)):
        ref = reference(positions, x, head_size, cache, section, interleaved, is_neox)
        assert_rope_close(out, ref, dtype, name)
    assert apply_mrope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache,
                                                  is_neox, **kwargs) is None
    assert torch.equal(query, q_out) and torch.equal(key, k_out)
    v = qkv[:, (q_heads + k_heads) * head_size:]
    assert torch.equal(v, before[:, (q_heads + k_heads) * head_size:]), "in place wrote past key"


@pytest.mark.parametrize("rotary_dim", [16, 8])
def test_every_element_written_and_positions_strided(rotary_dim, seed):
    """Outputs poisoned with NaN, written whole (the channels past rotary_dim copied); positions
    as the transposed view of a [tokens, 3] tensor (strides (1, 3)), with heads as a 3-D view."""
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(300, rotary_dim)
    positions = thw_positions(11, 300, g).T.contiguous().T  # [3, 11] with strides (1, 3)
    assert positions.stride() == (1, 3)
    query = randn((11, 5, 16), torch.float32, seed)  # [T, H, D] is accepted
    key = randn((11, 2 * 16), torch.float32, seed + 1)
    section = [rotary_dim // 2 - 2, 1, 1]
    q_out = torch.full_like(query, float("nan"))
    k_out = torch.full_like(key, float("nan"))
    rope_mrope.rope_mrope(positions, query, key, 16, cache, section, query_out=q_out,
                          key_out=k_out)
    assert_rope_close(q_out.reshape(11, -1), reference(positions, query.reshape(11, -1), 16,
                                                       cache, section), torch.float32, "query")
    assert_rope_close(k_out, reference(positions, key, 16, cache, section), torch.float32, "key")


def test_text_positions_are_the_cache_call(seed):
    """positions [num_tokens]: vLLM's text-only path, plain RoPE (the cache call's results);
    three equal rows through the M-RoPE kernel give the same numbers."""
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(128, 16)
    positions = torch.randint(0, 128, (10,), generator=g).to(DEVICE)
    query, key = randn((10, 3 * 16), torch.float32, seed), randn((10, 16), torch.float32, seed + 1)
    kwargs = dict(mrope_section=[2, 3, 3])
    text = apply_mrope_with_cos_sin_cache(positions, query, key, 16, cache, **kwargs)
    plain = apply_rope_with_cos_sin_cache(positions, query, key, 16, cache)
    assert all(torch.equal(a, b) for a, b in zip(text, plain))
    rows = apply_mrope_with_cos_sin_cache(positions.expand(3, -1), query, key, 16, cache, **kwargs)
    for a, b in zip(rows, plain):
        assert_rope_close(a, b, torch.float32)
    with pytest.raises(ValueError, match="mrope_section must add up"):
        apply_mrope_with_cos_sin_cache(positions, query, key, 16, cache, mrope_section=[2, 3, 2])


@pytest.mark.parametrize("model", ["qwen2_vl", "qwen3_vl"])
def test_matches_transformers_rotary_modules(model, seed):
    """transformers' Qwen2-VL (contiguous sections) and Qwen3-VL (interleaved) rotary modules and
    apply_rotary_pos_emb at random T/H/W position ids, in float32: a cache built from the
    module's inv_freq (the float32 products the module forms) gives the same results."""
    transformers = pytest.importorskip("transformers")
    if model == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as modeling
        config = transformers.Qwen2VLTextConfig(
            hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": [4, 6, 6]})
        rotary = modeling.Qwen2VLRotaryEmbedding(config)
        section, interleaved = [4, 6, 6], False
    else:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as modeling
        config = transformers.Qwen3VLTextConfig(
            hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
            rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                             "mrope_section": [6, 5, 5], "mrope_interleaved": True})
        rotary = modeling.Qwen3VLTextRotaryEmbedding(config)
        section, interleaved = [6, 5, 5], True
    b, s, d = 2, 9, 32
    g = torch.Generator().manual_seed(seed)
    position_ids = torch.randint(0, 500, (3, b, s), generator=g)
    q = torch.randn(b, 4, s, d, generator=g)  # [b, h, s, d], as the model's attention has them
    k = torch.randn(b, 2, s, d, generator=g)
    cos, sin = rotary(q, position_ids)
    q_hf, k_hf = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    inv_freq = rotary.inv_freq.float().cpu()
    freqs = torch.arange(500, dtype=torch.float32)[:, None] * inv_freq
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)
    flat = lambda x: x.transpose(1, 2).reshape(b * s, -1).to(DEVICE)  # noqa: E731
    q_out, k_out = apply_mrope_with_cos_sin_cache(
        position_ids.reshape(3, b * s).to(DEVICE), flat(q), flat(k), d, cache,
        mrope_section=section, mrope_interleaved=interleaved)
    assert_rope_close(q_out.cpu(), flat(q_hf).cpu(), torch.float32, "query")
    assert_rope_close(k_out.cpu(), flat(k_hf).cpu(), torch.float32, "key")


def test_one_launch_and_gradient(seed, monkeypatch):
    launches = []
    real = rope_mrope.launch
    monkeypatch.setattr(rope_mrope, "launch", lambda *a: launches.append(1) or real(*a))
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(64, 16)
    positions = thw_positions(6, 64, g)
    query = randn((6, 4 * 16), torch.float32, seed).requires_grad_(True)
    key = randn((6, 2, 16), torch.float32, seed + 1).requires_grad_(True)
    kwargs = dict(mrope_section=[2, 3, 3], mrope_interleaved=True)
    q_out, k_out = apply_mrope_with_cos_sin_cache(positions, query, key, 16, cache, **kwargs)
    assert len(launches) == 1
    wq, wk = randn(q_out.shape, torch.float32, 1), randn(k_out.shape, torch.float32, 2)
    ((q_out * wq).sum() + (k_out * wk).sum()).backward()
    assert len(launches) == 2
    q64 = query.detach().double().requires_grad_(True)
    k64 = key.detach().double().requires_grad_(True)
    ((reference(positions, q64, 16, cache, [2, 3, 3], True) * wq).sum()
     + (reference(positions, k64.reshape(6, -1), 16, cache, [2, 3, 3], True).view(6, 2, 16)
        * wk).sum()).backward()
    assert_rope_close(query.grad, q64.grad, torch.float32, "query gradient")
    assert_rope_close(key.grad, k64.grad, torch.float32, "key gradient")
    # An expanded gradient (stride 0 on every axis) is read correctly too.
    query.grad = None
    apply_mrope_with_cos_sin_cache(positions, query, key.detach(), 16, cache,
                                   **kwargs)[0].sum().backward()
    q64.grad = None
    reference(positions, q64, 16, cache, [2, 3, 3], True).sum().backward()
    assert_rope_close(query.grad, q64.grad, torch.float32, "query gradient of a sum")


def _args(**changes):
    args = dict(positions=torch.tensor([[0, 3, 1], [2, 2, 5], [1, 0, 7]], device=DEVICE),
                query=randn((3, 4 * 16), torch.float32, 1), key=randn((3, 2 * 16), torch.float32, 2),
                head_size=16, cos_sin_cache=make_cache(8, 16), is_neox=True,
                mrope_section=[2, 3, 3], mrope_interleaved=False)
    args.update(changes)
    return args


BAD = {
    "section sum": (dict(mrope_section=[2, 3, 2]), ValueError, "mrope_section must add up to "
                    r"rotary_dim / 2 = 8"),
    "section length": (dict(mrope_section=[4, 4]), ValueError, "list of 3 non-negative ints"),
    "section negative": (dict(mrope_section=[10, -1, -1]), ValueError, "non-negative"),
    "section floats": (dict(mrope_section=[2.0, 3, 3]), ValueError, "non-negative ints"),
    "interleaved not bool": (dict(mrope_interleaved=1), TypeError, "mrope_interleaved must be a "
                             "bool"),
    "positions rows": (dict(positions=torch.zeros(2, 3, dtype=torch.int64, device=DEVICE)),
                       ValueError, r"positions must be \[3, num_tokens\]"),
    "positions 3-D": (dict(positions=torch.zeros(3, 3, 1, dtype=torch.int64, device=DEVICE)),
                      ValueError, r"positions must be \[3, num_tokens\]"),
    "positions float": (dict(positions=torch.zeros(3, 3, device=DEVICE)), TypeError,
                        "positions must have dtype torch.int32 or torch.int64"),
    "positions tokens": (dict(positions=torch.zeros(3, 4, dtype=torch.int64, device=DEVICE)),
                         ValueError, "query must have one row per position"),
    "positions outside": (dict(positions=torch.tensor([[0, 3, 1], [2, 8, 5], [1, 0, 7]],
                                                      device=DEVICE)),
                          ValueError, r"positions must lie in \[0, 8\).*from 0 to 8"),
    "head_size": (dict(head_size=24), ValueError, "head_size .24. must divide query's width"),
    "rotary_dim": (dict(cos_sin_cache=make_cache(8, 32)), ValueError, "must be <= head_size"),
    "cache dtype": (dict(cos_sin_cache=make_cache(8, 16).half()), TypeError,
                    "cos_sin_cache must be float32"),
    "channels strided": (dict(query=randn((3, 4, 32), torch.float32, 1)[..., ::2]), ValueError,
                         "query's last axis must be contiguous"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("in_place", [False, True])
def test_bad_input_names_the_argument(case, in_place):
    changes, error, message = BAD[case]
    function = apply_mrope_with_cos_sin_cache_inplace if in_place else apply_mrope_with_cos_sin_cache
    args = _args(**changes)
    positions, query, key = args.pop("positions"), args.pop("query"), args.pop("key")
    before = (query.clone(), key.clone())
    with pytest.raises(error, match=message):
        function(positions, query, key, **args)
    assert torch.equal(query, before[0]) and torch.equal(key, before[1])


def test_in_place_refuses_what_it_cannot_write():
    args = _args()
    positions, query, key = args.pop("positions"), args.pop("query"), args.pop("key")
    with pytest.raises(ValueError, match="different tensors"):
        apply_mrope_with_cos_sin_cache_inplace(positions, query, query, **args)
    with pytest.raises(ValueError, match="require grad"):
        apply_mrope_with_cos_sin_cache_inplace(positions, query.requires_grad_(True), key, **args)


def test_torch_compile_fullgraph(seed):
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(64, 16)
    positions = thw_positions(5, 64, g)
    query, key = randn((5, 2 * 16), torch.float32, seed), randn((5, 16), torch.float32, seed + 1)
    kwargs = dict(mrope_section=[4, 2, 2], mrope_interleaved=True)

    def step(p, q, k):
        q_out, k_out = apply_mrope_with_cos_sin_cache(p, q, k, 16, cache, **kwargs)
        apply_mrope_with_cos_sin_cache_inplace(p, q, k, 16, cache, **kwargs)
        return q_out, k_out

    eager_q, eager_k = query.clone(), key.clone()
    want = step(positions, eager_q, eager_k)
    torch._dynamo.reset()
    got = torch.compile(step, fullgraph=True)(positions, query, key)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(query, eager_q) and torch.equal(key, eager_k)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_with_new_positions(seed):
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(4096, 128)
    positions = thw_positions(64, 4096, g)
    query = randn((64, 32 * 128), torch.bfloat16, seed)
    key = randn((64, 8 * 128), torch.bfloat16, seed + 1)
    kwargs = dict(mrope_section=[16, 24, 24])
    q0, k0 = query.clone(), key.clone()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up (compiles) off the capture
        apply_mrope_with_cos_sin_cache_inplace(positions, q0.clone(), k0.clone(), 128, cache,
                                               **kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_mrope_with_cos_sin_cache_inplace(positions, query, key, 128, cache, **kwargs)
    positions.copy_(thw_positions(64, 4096, g))
    query.copy_(q0)
    key.copy_(k0)
    graph.replay()
    torch.cuda.synchronize()
    assert_rope_close(query, reference(positions, q0, 128, cache, [16, 24, 24]), torch.bfloat16)
    assert_rope_close(key, reference(positions, k0, 128, cache, [16, 24, 24]), torch.bfloat16)


@pytest.mark.parametrize("config", [
    dict(BLOCK_S=1, BLOCK_H=1, num_warps=1, X_FIRST=False),
    dict(BLOCK_S=4, BLOCK_H=2, num_warps=4, X_FIRST=True),
    dict(BLOCK_S=16, BLOCK_H=4, num_warps=8, X_FIRST=True),
    dict(BLOCK_S=2, BLOCK_H=8, num_warps=2, X_FIRST=False),
])
def test_every_tile_gives_the_reference(config, seed):
    """The tiles scripts/mrope.py sweeps (and any a caller passes) rotate alike: token blocks
    past the end and head blocks past a part's heads (3 q, 6 k heads here) masked."""
    g = torch.Generator().manual_seed(seed)
    cache = make_cache(100, 16)
    positions = thw_positions(13, 100, g)
    query = randn((13, 3 * 24), torch.bfloat16, seed)
    key = randn((13, 6 * 24), torch.bfloat16, seed + 1)
    q_out, k_out = rope_mrope.rope_mrope(positions, query, key, 24, cache, [2, 3, 3], True,
                                         config=config)
    assert_rope_close(q_out, reference(positions, query, 24, cache, [2, 3, 3], True),
                      torch.bfloat16, "query")
    assert_rope_close(k_out, reference(positions, key, 24, cache, [2, 3, 3], True),
                      torch.bfloat16, "key")


@pytest.fixture
def shortcuts(monkeypatch):
    """This test's eager shortcuts only, starting empty (``api._Shortcuts``)."""
    from rope_kernels import api

    fresh = api._Shortcuts()
    monkeypatch.setattr(api, "_SHORTCUTS", fresh)
    return fresh


@pytest.mark.parametrize("in_place", [False, True])
def test_repeated_calls_take_the_shortcut_and_match_the_reference(in_place, shortcuts, seed):
    """With ``validate=False`` a repeated signature takes the eager shortcut (one recorded
    launch); every call still matches the reference, and calls that differ only in their
    sections, or in a section given as floats, are not answered by it."""
    cache = make_cache(64, 16)
    tokens, head_size = 7, 24
    for call, section in enumerate(([2, 3, 3], [2, 3, 3], [2, 3, 3], [4, 2, 2], [2, 3, 3])):
        g = torch.Generator().manual_seed(seed + call)
        positions = thw_positions(tokens, 64, g)
        qkv = randn((tokens, 8 * head_size), torch.bfloat16, seed + call)
        query, key = qkv[:, :4 * head_size], qkv[:, 4 * head_size:6 * head_size]
        refs = [reference(positions, x, head_size, cache, section) for x in (query, key)]
        kwargs = dict(mrope_section=section, validate=False)
        if in_place:
            apply_mrope_with_cos_sin_cache_inplace(positions, query, key, head_size, cache,
                                                   **kwargs)
            outs = (query, key)
        else:
            outs = apply_mrope_with_cos_sin_cache(positions, query, key, head_size, cache,
                                                  **kwargs)
        for out, ref in zip(outs, refs):
            assert_rope_close(out, ref, torch.bfloat16, f"call {call}")
    assert len([e for e in shortcuts.entries.values() if e]) == 2  # the two sections
    with pytest.raises(ValueError, match="non-negative ints"):
        apply_mrope_with_cos_sin_cache(positions, query, key, head_size, cache,
                                       mrope_section=[2.0, 3, 3], validate=False)
    with pytest.raises(ValueError, match="positions must lie in"):
        apply_mrope_with_cos_sin_cache(positions + 64, query, key, head_size, cache,
                                       mrope_section=[2, 3, 3])


def test_no_tokens_and_no_heads(seed):
    """Empty calls give empty results (no launch of an empty grid); a k of no heads leaves q's
    rotation as it is."""
    cache = make_cache(16, 16)
    empty = apply_mrope_with_cos_sin_cache(torch.zeros(3, 0, dtype=torch.long, device=DEVICE),
                                           randn((0, 32), torch.float32, seed),
                                           randn((0, 16), torch.float32, seed), 16, cache,
                                           mrope_section=[2, 3, 3])
    assert [tuple(x.shape) for x in empty] == [(0, 32), (0, 16)]
    positions = thw_positions(4, 16, torch.Generator().manual_seed(seed))
    query = randn((4, 32), torch.float32, seed)
    q_out, k_out = apply_mrope_with_cos_sin_cache(positions, query, randn((4, 0), torch.float32),
                                                  16, cache, mrope_section=[2, 3, 3])
    assert k_out.shape == (4, 0)
    assert_rope_close(q_out, reference(positions, query, 16, cache, [2, 3, 3]), torch.float32)


def test_text_positions_take_the_cache_calls_shortcut(shortcuts, seed, monkeypatch):
    """Text-only positions go to the plain cache call whole: with validate=False a repeated call
    is answered by its shortcut (no launch through rope_qk.launch, no M-RoPE launch), and bad
    sections still raise on every call."""
    from rope_kernels import rope_qk

    cache = make_cache(64, 16)
    positions = torch.randint(0, 64, (5,), generator=torch.Generator().manual_seed(seed))
    positions = positions.to(DEVICE)
    query, key = randn((5, 2 * 16), torch.float32, seed), randn((5, 16), torch.float32, seed + 1)
    kwargs = dict(mrope_section=[2, 3, 3], validate=False)
    first = apply_mrope_with_cos_sin_cache(positions, query, key, 16, cache, **kwargs)
    launches = []
    for module in (rope_qk, rope_mrope):
        real = module.launch
        monkeypatch.setattr(module, "launch",
                            lambda *a, real=real: launches.append(1) or real(*a))
    again = apply_mrope_with_cos_sin_cache(positions, query, key, 16, cache, **kwargs)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert [e for e in shortcuts.entries.values() if e] and not launches
    with pytest.raises(ValueError, match="mrope_section must add up"):
        apply_mrope_with_cos_sin_cache(positions, query, key, 16, cache,
                                       mrope_section=[2, 3, 2], validate=False)
