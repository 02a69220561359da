"""torch.export and inference mode: what a deployment path and a serving loop do with a model.

``torch.export.export`` (strict, through Dynamo; and non-strict, the default, through Python
tracing) must keep each entry point as its ``torch.ops.rope_kernels`` operator, the exported
program must compute on new inputs what eager mode computes (bit for bit: the same kernel), with
dynamic sizes where the caller asks for them, and survive ``torch.export.save``/``load``.
``torch.inference_mode()``, where serving stacks run their forward, must give the bits of
``torch.no_grad()``, on the first call and on the repeated calls that take the eager shortcut.

Not covered, and why: AOTInductor (``torch._inductor.aoti_compile_and_package``) runs the
exported graph in a C++ runtime, and these operators are Python functions (``torch.library.
custom_op``), which that runtime cannot call; see the README.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch.export import Dim

from conftest import DEVICE, randn
from test_compile import D, _cache, _cases, _flat, _fresh
import rope_kernels.hf
from rope_kernels import (RotaryPositionEmbedding, apply_rope_with_cos_sin_cache,
                          apply_rope_with_cos_sin_cache_inplace, apply_rotary_pos_emb)


class _Module(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _our_ops(ep) -> set:
    return {str(n.target) for n in ep.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("rope_kernels.")}


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("name", list(_cases()))
def test_exported_program_is_our_operator_and_matches_eager(name, strict):
    fn, inputs = _cases()[name]
    ep = torch.export.export(_Module(fn), tuple(inputs), strict=strict)
    assert _our_ops(ep), f"no rope_kernels operator in the exported graph:\n{ep.graph}"
    fresh = _fresh(inputs, 40)
    with torch.no_grad():
        expected = _flat(fn(*fresh))
    torch.testing.assert_close(_flat(ep.module()(*fresh)), expected, rtol=0, atol=0)


def test_exported_program_survives_save_and_load():
    """A saved program names the operators; loading it needs only ``import rope_kernels``."""
    fn, inputs = _cases()["hf"]
    ep = torch.export.export(_Module(fn), tuple(inputs))
    buffer = io.BytesIO()
    torch.export.save(ep, buffer)
    buffer.seek(0)
    loaded = torch.export.load(buffer)
    assert _our_ops(loaded) == _our_ops(ep)
    fresh = _fresh(inputs, 50)
    with torch.no_grad():
        expected = _flat(fn(*fresh))
    torch.testing.assert_close(_flat(loaded.module()(*fresh)), expected, rtol=0, atol=0)


def _dynamic_cases():
    """name -> (function, example inputs of length 8 builder, dynamic_shapes builder)."""
    emb = RotaryPositionEmbedding(D, device=DEVICE)(64)
    cache = _cache()
    tokens = Dim("tokens", min=2, max=64)
    return {
        "te bshd": (lambda t: apply_rotary_pos_emb(t, emb, "bshd", fused=True),
                    lambda n, s: [randn((2, n, 3, D), torch.float32, s)],
                    ({1: tokens},)),
        "flashinfer cos_sin_cache": (
            lambda pos, q, k: apply_rope_with_cos_sin_cache(pos, q, k, D, cache, False),
            lambda n, s: [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(s)
                                        ).to(DEVICE),
                          randn((n, 4 * D), torch.float32, s), randn((n, 2 * D), torch.float32,
                                                                      s + 1)],
            ({0: tokens}, {0: tokens}, {0: tokens})),
        "hf, partial rotary": (
            lambda q, k, cos, sin: rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin),
            lambda n, s: [randn((2, 4, n, D), torch.float32, s),
                          randn((2, 2, n, D), torch.float32, s + 1),
                          randn((2, n, D // 2), torch.float32, s + 2).cos(),
                          randn((2, n, D // 2), torch.float32, s + 2).sin()],
            ({2: tokens}, {2: tokens}, {1: tokens}, {1: tokens})),
    }


@pytest.mark.parametrize("name", list(_dynamic_cases()))
def test_one_export_serves_every_length(name):
    fn, make, dynamic = _dynamic_cases()[name]
    # forward(*args): the positional arguments are one tuple, so their shapes are nested once more
    ep = torch.export.export(_Module(fn), tuple(make(8, 0)), dynamic_shapes=(dynamic,))
    run = ep.module()
    for n in (3, 8, 21):
        inputs = make(n, n)
        with torch.no_grad():
            expected = _flat(fn(*inputs))
        torch.testing.assert_close(_flat(run(*inputs)), expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", list(_cases()))
def test_inference_mode_gives_the_bits_of_no_grad(name):
    fn, inputs = _cases(dtype=torch.bfloat16)[name]
    for seed in (60, 61, 62):  # the later calls take the eager shortcut
        fresh = _fresh(inputs, seed)
        with torch.no_grad():
            expected = _flat(fn(*fresh))
        with torch.inference_mode():
            fresh_inf = [x.clone() for x in fresh]  # inference tensors, as a server's are
            out = fn(*fresh_inf)
        outs = out if isinstance(out, tuple) else (out,)
        assert all(o.is_inference() for o in outs)
        torch.testing.assert_close(_flat(out), expected, rtol=0, atol=0)


def test_inplace_cache_call_on_inference_tensors():
    pos = torch.tensor([1, 5, 2, 0, 63], device=DEVICE)
    cache = _cache()
    for seed in (70, 71, 72):
        q, k = randn((5, 4 * D), torch.bfloat16, seed), randn((5, 2 * D), torch.bfloat16, seed + 1)
        with torch.no_grad():
            expected = apply_rope_with_cos_sin_cache(pos, q, k, D, cache)
        with torch.inference_mode():
            q_inf, k_inf = q.clone(), k.clone()
            apply_rope_with_cos_sin_cache_inplace(pos, q_inf, k_inf, D, cache)
        torch.testing.assert_close(q_inf, expected[0], rtol=0, atol=0)
        torch.testing.assert_close(k_inf, expected[1], rtol=0, atol=0)


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_hf_inplace_exports_as_a_mutation_of_its_inputs(strict):
    """Hugging Face's in-place function exports as its mutating operator; the exported program
    writes the rotation into the q and k it is given, as eager mode does."""
    def fn(q, k, cos, sin):
        return rope_kernels.hf.apply_rotary_pos_emb_inplace(q, k, cos, sin)

    def make(seed):
        return [randn((2, 5, 4, D), torch.float32, seed).transpose(1, 2),
                randn((2, 5, 2, D), torch.float32, seed + 1).transpose(1, 2),
                randn((2, 5, D), torch.float32, seed + 2).cos(),
                randn((2, 5, D), torch.float32, seed + 2).sin()]

    ep = torch.export.export(_Module(fn), tuple(make(0)), strict=strict)
    assert _our_ops(ep) == {"rope_kernels.rope_cos_sin_.default"}, ep.graph
    q, k, cos, sin = make(80)
    expected = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
    out = ep.module()(q, k, cos, sin)
    for x, o, e in zip((q, k), out, expected):
        torch.testing.assert_close(x, e, rtol=0, atol=0)
        torch.testing.assert_close(o, e, rtol=0, atol=0)


def test_hf_inplace_call_on_inference_tensors():
    """Three calls in a row under inference mode (the later ones through the eager shortcut), on
    inference tensors: the bits of the out-of-place call under no_grad."""
    for seed in (90, 91, 92):
        q = randn((2, 3, 4, D), torch.bfloat16, seed).transpose(1, 2)
        k = randn((2, 3, 2, D), torch.bfloat16, seed + 1).transpose(1, 2)
        cos = randn((1, 3, D), torch.bfloat16, seed + 2).cos()
        sin = randn((1, 3, D), torch.bfloat16, seed + 2).sin()
        with torch.no_grad():
            expected = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
        with torch.inference_mode():
            q_inf, k_inf = q.clone(), k.clone()
            got = rope_kernels.hf.apply_rotary_pos_emb_inplace(q_inf, k_inf, cos, sin)
        assert got[0] is q_inf and got[1] is k_inf and q_inf.is_inference()
        torch.testing.assert_close(q_inf, expected[0], rtol=0, atol=0)
        torch.testing.assert_close(k_inf, expected[1], rtol=0, atol=0)
