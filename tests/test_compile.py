"""torch.compile and CUDA graphs: every entry point traced with fullgraph=True (no graph break),
forward and backward equal to eager, no recompilation per shape, and (GPU) the default call,
value checks on, captured in a CUDA graph and compiled with mode="reduce-overhead".

On a CPU the graphs are compiled with the "aot_eager" backend (Dynamo and AOTAutograd trace
exactly as on a GPU; the operator then runs the interpreted kernel); Inductor, CUDA graphs and
reduce-overhead need a GPU and are skipped there with that reason."""

from __future__ import annotations

import pytest
import torch

from conftest import DEVICE, ON_GPU, randn
import rope_kernels.flashinfer
import rope_kernels.hf
from rope_kernels import (RotaryPositionEmbedding, apply_fused_qkv_rotary_pos_emb,
                          apply_mrope_with_cos_sin_cache, apply_rope_with_cos_sin_cache,
                          apply_rope_with_cos_sin_cache_inplace, apply_rotary_pos_emb)

BACKEND = "inductor" if ON_GPU else "aot_eager"
gpu = pytest.mark.skipif(not ON_GPU, reason="CUDA graphs and Inductor's GPU code need a GPU; CPU "
                                            "CI checks the tracing with the aot_eager backend")
D = 32


def _cache(rows=64, rotary_dim=D):
    f = torch.outer(torch.arange(rows, dtype=torch.float32),
                    1.0 / 10000 ** (torch.arange(0, rotary_dim, 2) / rotary_dim))
    return torch.cat((f.cos(), f.sin()), -1).to(DEVICE)


def _cases(seq=8, dtype=torch.float32, seed=0):
    """name -> (function of tensors only, tensors that need grad, other tensors)."""
    emb = RotaryPositionEmbedding(D, device=DEVICE)(64)
    starts = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    cu = torch.tensor([0, 3, seq], dtype=torch.int32, device=DEVICE)
    # 150 sequences of 1-3 tokens: past TOKEN_ROWS_ABOVE, so the thd pre-pass runs first (and on
    # a Hopper GPU the main kernel is its programmatic dependent)
    lens = torch.randint(1, 4, (150,), generator=torch.Generator().manual_seed(seed + 7))
    cu_many = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32).to(DEVICE)
    cache = _cache()
    pos = torch.randint(0, 64, (seq,), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    pos_thw = torch.randint(0, 64, (3, seq),
                            generator=torch.Generator().manual_seed(seed + 3)).to(DEVICE)
    hf_cos = randn((2, seq, D), dtype, seed + 5)
    # Llama 4's cos + i sin, made in the graph from float32 parts made outside it (exactly: the
    # parts' bits whatever computes them, so compiled and exported calls match eager's bits)
    cis = (hf_cos[..., : D // 2].float().cos(), hf_cos[..., : D // 2].float().sin())
    return {
        "te sbhd + start_positions": (
            lambda t: apply_rotary_pos_emb(t, emb, "sbhd", starts, fused=True),
            [randn((seq, 2, 3, D), dtype, seed)]),
        "te thd": (
            lambda t: apply_rotary_pos_emb(t, emb, "thd", fused=True, cu_seqlens=cu),
            [randn((seq, 3, D), dtype, seed)]),
        "te thd, many sequences": (
            lambda t: apply_rotary_pos_emb(t, emb, "thd", fused=True, cu_seqlens=cu_many),
            [randn((int(cu_many[-1]), 3, D), dtype, seed + 2)]),
        "te fused qkv": (
            lambda qkv: torch.cat([x.flatten() for x in apply_fused_qkv_rotary_pos_emb(
                qkv, emb, emb, [2 * D, D, D], "bshd", starts)]),
            [randn((2, seq, 2, 4 * D), dtype, seed)]),
        "flashinfer cos_sin_cache": (
            lambda q, k: apply_rope_with_cos_sin_cache(pos, q, k, D, cache, False),
            [randn((seq, 4 * D), dtype, seed), randn((seq, 2 * D), dtype, seed + 1)]),
        "vllm mrope (positions [3, tokens], Qwen3-VL's interleaved sections)": (
            lambda q, k: apply_mrope_with_cos_sin_cache(
                pos_thw, q, k, D, cache, mrope_section=[6, 5, 5],
                mrope_interleaved=True),
            [randn((seq, 4 * D), dtype, seed), randn((seq, 2 * D), dtype, seed + 1)]),
        "flashinfer pos_ids (Llama 3.1's frequencies, interleaved, half the head rotated)": (
            lambda q, k: rope_kernels.flashinfer.apply_llama31_rope_pos_ids(
                q, k, pos, rotary_dim=D // 2, interleave=True),
            [randn((seq, 4, D), dtype, seed), randn((seq, 2, D), dtype, seed + 1)]),
        "flashinfer apply_rope (a ragged batch: indptr, offsets)": (
            lambda q, k: rope_kernels.flashinfer.apply_rope(q, k, cu, starts),
            [randn((seq, 4, D), dtype, seed), randn((seq, 2, D), dtype, seed + 1)]),
        "hf": (
            lambda q, k: rope_kernels.hf.apply_rotary_pos_emb(q, k, hf_cos.cos(), hf_cos.sin()),
            [randn((2, 4, seq, D), dtype, seed), randn((2, 2, seq, D), dtype, seed + 1)]),
        "hf interleaved (Cohere)": (
            lambda q, k: rope_kernels.hf.apply_rotary_pos_emb_interleaved(
                q, k, hf_cos.cos(), hf_cos.sin()),
            [randn((2, 4, seq, D), dtype, seed), randn((2, 2, seq, D), dtype, seed + 1)]),
        "hf glm, partial rotary": (
            lambda q, k: rope_kernels.hf.apply_rotary_pos_emb_glm(
                q, k, hf_cos[..., : D // 2].cos(), hf_cos[..., : D // 2].sin()),
            [randn((2, 4, seq, D), dtype, seed), randn((2, 2, seq, D), dtype, seed + 1)]),
        "hf gpt_oss (a cos entry per pair)": (
            lambda q, k: rope_kernels.hf.apply_rotary_pos_emb_gpt_oss(
                q, k, hf_cos[..., : D // 2].cos(), hf_cos[..., : D // 2].sin()),
            [randn((2, 4, seq, D), dtype, seed), randn((2, 2, seq, D), dtype, seed + 1)]),
        "hf nanochat (-theta)": (
            lambda q, k: rope_kernels.hf.apply_rotary_pos_emb_nanochat(
                q, k, hf_cos.cos(), hf_cos.sin()),
            [randn((2, 4, seq, D), dtype, seed), randn((2, 2, seq, D), dtype, seed + 1)]),
        "hf deepseek (pairs in, halves out; one k head)": (
            lambda q, k: rope_kernels.hf.apply_rotary_pos_emb_deepseek(
                q, k, hf_cos.cos(), hf_cos.sin()),
            [randn((2, 4, seq, D), dtype, seed), randn((2, 1, seq, D), dtype, seed + 1)]),
        "hf vision (Qwen2-VL's; q, k [tokens, h, d] views of one qkv)": (
            lambda qkv: _vision(qkv, hf_cos[0].cos(), hf_cos[0].sin()),
            [randn((seq, 3 * 4 * D), dtype, seed)]),
        "hf llama4 (complex angles made in the graph, [b, s, h, d])": (
            lambda q, k: rope_kernels.hf.apply_rotary_emb_llama4(
                q, k, torch.complex(*cis)),
            [randn((2, seq, 4, D), dtype, seed), randn((2, seq, 2, D), dtype, seed + 1)]),
        "hf gemma4 (one tensor, [b, s, h, d])": (
            lambda x: rope_kernels.hf.apply_rotary_pos_emb_gemma4(
                x, hf_cos.cos(), hf_cos.sin(), unsqueeze_dim=2),
            [randn((2, seq, 4, D), dtype, seed)]),
        "hf gptj (one tensor, sin first)": (
            lambda x: rope_kernels.hf.apply_rotary_pos_emb_gptj(
                x, hf_cos[..., : D // 2].sin(), hf_cos[..., : D // 2].cos()),
            [randn((2, seq, 4, D), dtype, seed)]),
        "hf deepseek_v4 (one tensor, its last 8 channels rotated, [b, h, s, d] view)": (
            lambda x: rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4(
                x.transpose(1, 2), hf_cos[..., : D // 8].cos(), hf_cos[..., : D // 8].sin()),
            [randn((2, seq, 4, D), dtype, seed)]),
        "hf 2d (SAM 2 Video's memory attention: angles over 2 frames, k's last 3 tokens passed)": (
            lambda q, k: _flat(rope_kernels.hf.apply_rotary_pos_emb_2d(
                q.transpose(1, 2), k.transpose(1, 2), hf_cos[:1].cos(), hf_cos[:1].sin(),
                num_k_exclude_rope=3, repeat_freqs_k=True)),
            [randn((2, seq, 4, D), dtype, seed), randn((2, 2 * seq + 3, 4, D), dtype, seed + 1)]),
    }


def _vision(qkv, cos, sin):
    """A vision encoder's call on its fused projection [tokens, 3 * 4 * D]: q and k rotated, v as
    it is, all flattened (the output as large as the input, as test_properties' double backward
    needs)."""
    q, k, v = qkv.view(qkv.shape[0], 3, 4, D).unbind(1)
    return _flat((*rope_kernels.hf.apply_rotary_pos_emb_vision(q, k, cos, sin), v))


def _flat(out):
    return torch.cat([o.flatten() for o in out]) if isinstance(out, tuple) else out.flatten()


def _fresh(inputs, seed):
    """New random values of the inputs' shapes and dtypes (one seed per input)."""
    return [randn(x.shape, x.dtype, seed + i) for i, x in enumerate(inputs)]


@pytest.mark.parametrize("name", list(_cases()))
def test_fullgraph_forward_and_backward_match_eager(name):
    torch._dynamo.reset()
    fn, inputs = _cases()[name]
    compiled = torch.compile(fn, fullgraph=True, backend=BACKEND)
    eager_in = [x.clone().requires_grad_(True) for x in inputs]
    comp_in = [x.clone().requires_grad_(True) for x in inputs]
    ref, out = _flat(fn(*eager_in)), _flat(compiled(*comp_in))
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    for a, b in zip(comp_in, eager_in):
        torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(_cases()))
def test_no_graph_break(name):
    torch._dynamo.reset()
    fn, inputs = _cases()[name]
    explanation = torch._dynamo.explain(fn)(*inputs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def test_new_shapes_do_not_recompile_each_time():
    """Automatic dynamic shapes: one static graph, then one dynamic graph for every later length
    (the operator's fake implementation derives output shapes from input shapes)."""
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    emb = RotaryPositionEmbedding(D, device=DEVICE)(256)
    compiled = torch.compile(lambda t: apply_rotary_pos_emb(t, emb, "bshd", fused=True),
                             fullgraph=True, backend=BACKEND)
    for seq in (8, 12, 16, 24, 40, 72):
        t = randn((2, seq, 3, D), torch.float32, seq)
        torch.testing.assert_close(compiled(t), apply_rotary_pos_emb(t, emb, "bshd", fused=True))
    assert counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


def test_inplace_variant_under_compile():
    torch._dynamo.reset()
    pos = torch.tensor([1, 5, 2, 0], device=DEVICE)
    cache = _cache()
    q, k = randn((4, 2 * D), torch.float32, 1), randn((4, D), torch.float32, 2)
    expected = apply_rope_with_cos_sin_cache(pos, q, k, D, cache)

    def step(q, k):
        apply_rope_with_cos_sin_cache_inplace(pos, q, k, D, cache)
        return q, k

    q2, k2 = torch.compile(step, fullgraph=True, backend=BACKEND)(q.clone(), k.clone())
    torch.testing.assert_close(q2, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(k2, expected[1], rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("name", list(_cases()))
def test_default_call_captured_in_a_cuda_graph(name):
    """The default call (validate=True) makes no host copy while a graph is being captured: it
    captures, and replays on new data correctly."""
    fn, inputs = _cases(dtype=torch.bfloat16)[name]
    static = [x.clone() for x in inputs]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile and warm up outside the capture
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static)
    for seed in (11, 12):
        fresh = _fresh(inputs, seed)
        for s, f in zip(static, fresh):
            s.copy_(f)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(_flat(out), _flat(fn(*fresh)), rtol=0, atol=0)


@gpu
@pytest.mark.parametrize("name", list(_cases()))
def test_reduce_overhead_mode(name):
    torch._dynamo.reset()
    fn, inputs = _cases(dtype=torch.bfloat16)[name]
    compiled = torch.compile(fn, mode="reduce-overhead", fullgraph=True)
    for seed in (21, 22, 23):  # the later calls replay the CUDA graph
        fresh = _fresh(inputs, seed)
        out = _flat(compiled(*fresh)).clone()
        torch.testing.assert_close(out, _flat(fn(*fresh)), rtol=0, atol=0)


def test_eager_mode_still_checks_values():
    """What compile and capture skip (a host copy), eager mode keeps: out-of-range positions."""
    with pytest.raises(ValueError, match="positions must lie in"):
        apply_rope_with_cos_sin_cache(torch.tensor([0, 64], device=DEVICE),
                                      randn((2, D), torch.float32, 1),
                                      randn((2, D), torch.float32, 2), D, _cache())
