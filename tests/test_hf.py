"""rope_kernels.hf's functions against Hugging Face transformers' own code: its Llama and
GPT-NeoX (partial rotary) functions, those of the interleaved pairings (Cohere's, GLM's,
Helium's) and of the other conventions (GPT-OSS's and OpenAI's privacy filter's tables of one
entry per pair, NanoChat's -theta), on the cos/sin their rotary modules produce, and tiny
randomly initialised Llama, GPT-NeoX, Cohere, GLM, GPT-OSS, privacy-filter and NanoChat models
(no downloads) whose logits and gradients must not change when our function is assigned over
theirs."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import (DEVICE, HF_FUNCTIONS, assert_rope_close, count_qk_launches, hf_cos_width,
                      hf_reference, randn)
import rope_kernels.hf
from rope_kernels import rope_qk

transformers = pytest.importorskip("transformers", reason="transformers is a test extra")
from transformers.models.cohere import modeling_cohere  # noqa: E402
from transformers.models.glm import modeling_glm  # noqa: E402
from transformers.models.gpt_neox import modeling_gpt_neox  # noqa: E402
from transformers.models.helium import modeling_helium  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402


def _modeling(name):
    """transformers.models.<name>.modeling_<name>; the test skips where this transformers has no
    such model (NanoChat and OpenAI's privacy filter are recent)."""
    return pytest.importorskip(f"transformers.models.{name}.modeling_{name}",
                               reason=f"{name} is not in transformers {transformers.__version__}")


class _Modeling:
    """A family's modeling module, imported when a test first uses it (``_modeling``)."""

    def __init__(self, name):
        self.name = name

    def __getattr__(self, attr):
        return getattr(_modeling(self.name), attr)


modeling_gpt_oss = _Modeling("gpt_oss")
modeling_privacy_filter = _Modeling("openai_privacy_filter")
modeling_nanochat = _Modeling("nanochat")

_SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _llama_config(**kw):
    return transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, max_position_embeddings=128, **kw)


def _neox_config():
    return transformers.GPTNeoXConfig(vocab_size=96, hidden_size=64, intermediate_size=96,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      max_position_embeddings=128, rotary_pct=0.5)


def _cos_sin(module, b, s, dtype, seed):
    """cos/sin from the model's own rotary module at non-trivial per-sequence positions."""
    g = torch.Generator().manual_seed(seed)
    position_ids = (torch.arange(s)[None] + torch.randint(0, 60, (b, 1), generator=g)).to(DEVICE)
    x = torch.zeros(b, s, 1, dtype=dtype, device=DEVICE)
    return module.to(DEVICE)(x, position_ids)


def _cohere_config():
    return transformers.CohereConfig(**_SMALL)


def _glm_config(head_dim=16):  # partial_rotary_factor 0.5 by default: cos covers half the head
    return transformers.GlmConfig(head_dim=head_dim, **_SMALL)


def _helium_config(head_dim=16):
    return transformers.HeliumConfig(head_dim=head_dim, **_SMALL)


# GPT-OSS's YaRN scaling (cos and sin carry its attention factor), its factor 32 over the tiny
# models' 128 positions (transformers warns where the two disagree)
_YARN = dict(rope_type="yarn", rope_theta=150000.0, factor=32.0, beta_fast=32.0, beta_slow=1.0,
             truncate=False, original_max_position_embeddings=4)


def _gpt_oss_config():
    return modeling_gpt_oss.GptOssConfig(head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                         rope_parameters=dict(_YARN), **_SMALL)


def _privacy_filter_config():  # token classification: a label per token id of the tiny vocab
    return modeling_privacy_filter.OpenAIPrivacyFilterConfig(
        head_dim=16, num_local_experts=4, num_experts_per_tok=2, num_labels=_SMALL["vocab_size"],
        **_SMALL)


def _nanochat_config():
    return modeling_nanochat.NanoChatConfig(**_SMALL)


# family -> (transformers' module, its rotary module, our function)
INTERLEAVED = {
    "cohere": (modeling_cohere, lambda: modeling_cohere.CohereRotaryEmbedding(_cohere_config()),
               HF_FUNCTIONS["interleaved"]),
    "glm": (modeling_glm, lambda: modeling_glm.GlmRotaryEmbedding(_glm_config()),
            HF_FUNCTIONS["glm"]),
    "helium": (modeling_helium, lambda: modeling_helium.HeliumRotaryEmbedding(_helium_config()),
               HF_FUNCTIONS["glm"]),
}
# ... and the other conventions: cos and sin of one entry per pair (GPT-OSS's with half-split
# pairs, OpenAI's privacy filter's with interleaved ones), and NanoChat's rotation by -theta.
OTHERS = {
    **INTERLEAVED,
    "gpt_oss": (modeling_gpt_oss, lambda: modeling_gpt_oss.GptOssRotaryEmbedding(
        _gpt_oss_config()), HF_FUNCTIONS["half_per_pair"]),
    "openai_privacy_filter": (
        modeling_privacy_filter, lambda: modeling_privacy_filter.OpenAIPrivacyFilterRotaryEmbedding(
            _privacy_filter_config()), HF_FUNCTIONS["interleaved_per_pair"]),
    "nanochat": (modeling_nanochat, lambda: modeling_nanochat.NanoChatRotaryEmbedding(
        _nanochat_config()), HF_FUNCTIONS["half_negated"]),
}
# Families whose function ends in torch.cat (or stack and flatten): contiguous results, where
# ours are laid out like q (the same values).
_CONTIGUOUS_RESULTS = {"glm", "gpt_oss", "openai_privacy_filter"}


def _layout(x):
    """Sizes and strides of the dimensions of more than one element (where the memory is)."""
    return [(n, st) for n, st in zip(x.shape, x.stride()) if n > 1]


@pytest.mark.parametrize("view", ["transposed", "fused projection", "contiguous", "decode"])
def test_output_layout_as_transformers(view, seed):
    """The results are laid out as transformers' function lays out its own: in the inputs'
    memory order (torch's elementwise ops), dense, also for views with gaps."""
    b, s, hq, hk, d = 2, 1 if view == "decode" else 5, 4, 2, 16
    module = modeling_llama.LlamaRotaryEmbedding(_llama_config(head_dim=d))
    cos, sin = _cos_sin(module, b, s, torch.float32, seed)
    if view == "fused projection":  # q, k, v from one [b, s, (hq + 2 hk) * d] projection
        qkv = randn((b, s, (hq + 2 * hk) * d), torch.float32, seed)
        q = qkv[..., : hq * d].view(b, s, hq, d).transpose(1, 2)
        k = qkv[..., hq * d: (hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
    elif view == "contiguous":
        q, k = randn((b, hq, s, d), torch.float32, seed), randn((b, hk, s, d), torch.float32, seed)
    else:
        q = randn((b, s, hq, d), torch.float32, seed).transpose(1, 2)
        k = randn((b, s, hk, d), torch.float32, seed + 1).transpose(1, 2)
    ours = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
    ref = modeling_llama.apply_rotary_pos_emb(q, k, cos, sin)
    for name, o, r in zip("qk", ours, ref):
        assert _layout(o) == _layout(r), (name, o.stride(), r.stride())
        torch.testing.assert_close(o, r, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("model", ["llama", "gpt_neox"])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_matches_transformers_function(dtype, model, unsqueeze_dim, seed):
    b, s, hq, hk, d = 2, 5, 4, 2, 16
    if model == "llama":
        module = modeling_llama.LlamaRotaryEmbedding(_llama_config(head_dim=d))
        theirs = modeling_llama.apply_rotary_pos_emb
    else:
        module = modeling_gpt_neox.GPTNeoXRotaryEmbedding(_neox_config())
        theirs = modeling_gpt_neox.apply_rotary_pos_emb
    cos, sin = _cos_sin(module, b, s, dtype, seed)
    # The layout models hand over: projections viewed as [b, s, h, d], transposed to [b, h, s, d].
    q = randn((b, s, hq, d), dtype, seed)
    k = randn((b, s, hk, d), dtype, seed + 1)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    before = (q.clone(), k.clone())
    ours = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim)
    ref = theirs(q, k, cos, sin, unsqueeze_dim)
    assert torch.equal(q, before[0]) and torch.equal(k, before[1])
    for name, o, r, x in zip("qk", ours, ref, (q, k)):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert _layout(o) == _layout(r), name  # laid out as transformers lays its result out
        # Against the exact result: within the output's rounding (we compute in float32).
        assert_rope_close(o, hf_reference(x, cos, sin, unsqueeze_dim), dtype, name)
        # Against transformers' own arithmetic, which rounds each product in 16-bit dtypes.
        tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
        torch.testing.assert_close(o, r, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", list(OTHERS))
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
def test_other_families_match_transformers(dtype, family, unsqueeze_dim, seed):
    """The conventions other than Llama's, on cos/sin from each family's own rotary module:
    Cohere's (repeat_interleaved, per channel), GLM's (Llama's layout, half the head rotated),
    Helium's (GLM's function, the whole head), GPT-OSS's and OpenAI's privacy filter's (one
    entry per pair, head_dim / 2 wide; YaRN's attention factor folded in) and NanoChat's (Llama's
    tables, rotated by -theta). Values against transformers' function run in float64 and in the
    dtype; the layout as transformers lays its results out (where its function does not end in
    torch.cat); gradients against autograd through transformers' function in float64."""
    module, rotary, ours_fn = OTHERS[family]
    b, s, hq, hk, d = 2, 5, 4, 2, 16
    cos, sin = _cos_sin(rotary(), b, s, dtype, seed)
    assert cos.shape[-1] == (d // 2 if family in ("glm", "gpt_oss", "openai_privacy_filter")
                             else d)
    q = randn((b, s, hq, d), dtype, seed)
    k = randn((b, s, hk, d), dtype, seed + 1)
    if unsqueeze_dim == 1:
        q, k = q.transpose(1, 2), k.transpose(1, 2)
    q.requires_grad_(True)
    k.requires_grad_(True)
    ours = ours_fn(q, k, cos, sin, unsqueeze_dim)
    assert all(o.requires_grad for o in ours)
    ref = module.apply_rotary_pos_emb(q.detach(), k.detach(), cos, sin, unsqueeze_dim)
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
    exact = module.apply_rotary_pos_emb(q64, k64, cos.double(), sin.double(), unsqueeze_dim)
    for name, o, r, e in zip("qk", ours, ref, exact):
        assert o.shape == r.shape and o.dtype == dtype
        if family not in _CONTIGUOUS_RESULTS:
            assert _layout(o) == _layout(r), name
        assert_rope_close(o.detach(), e.detach(), dtype, name)
        tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
        torch.testing.assert_close(o.detach(), r.to(dtype), rtol=tol, atol=tol)
    # Llama's function would rotate other channel pairs, or by other angles (GPT-OSS's narrow
    # cos as part of the head), or the other way (NanoChat's): these tables tell them apart.
    wrong = rope_kernels.hf.apply_rotary_pos_emb(q.detach(), k.detach(), cos, sin, unsqueeze_dim)
    assert (wrong[0].double() - exact[0].detach()).abs().max() > 0.1
    weights = [randn(o.shape, torch.float32, seed + 5 + i) for i, o in enumerate(ours)]
    sum((o * w).sum() for o, w in zip(ours, weights)).backward()
    sum((e * w.to(dtype).double()).sum() for e, w in zip(exact, weights)).backward()
    for name, x, x64 in (("q", q, q64), ("k", k, k64)):
        assert_rope_close(x.grad, x64.grad, dtype, "d" + name)


def test_one_launch_and_gradient(seed, monkeypatch):
    launches = count_qk_launches(monkeypatch)
    module = modeling_llama.LlamaRotaryEmbedding(_llama_config(head_dim=16))
    cos, sin = _cos_sin(module, 2, 6, torch.float32, seed)
    q = randn((2, 6, 4, 16), torch.float32, seed).transpose(1, 2).requires_grad_(True)
    k = randn((2, 2, 6, 16), torch.float32, seed + 1).requires_grad_(True)
    qo, ko = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
    assert len(launches) == 1
    wq, wk = randn(qo.shape, torch.float32, 7), randn(ko.shape, torch.float32, 8)
    ((qo * wq).sum() + (ko * wk).sum()).backward()
    assert len(launches) == 2
    q2, k2 = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    rq, rk = modeling_llama.apply_rotary_pos_emb(q2, k2, cos, sin)
    ((rq * wq).sum() + (rk * wk).sum()).backward()
    torch.testing.assert_close(q.grad, q2.grad)
    torch.testing.assert_close(k.grad, k2.grad)


def _against_float64(apply, q, k, cos, sin, ours, dtype, seed):
    """``ours``, q and k rotated from ``q`` and ``k`` (leaves that require grad), against
    transformers' function ``apply`` in float64: values, the results' layout, and the gradients
    of a random weighting of the results, against autograd through ``apply`` (which gets the
    weights in ``dtype``, as autograd hands our backward the output's gradient)."""
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
    exact = apply(q64, k64, cos.double(), sin.double())
    for name, o, e in zip("qk", ours, exact):
        assert _layout(o) == _layout(e), name
        assert_rope_close(o.detach(), e.detach(), dtype, name)
    weights = [randn(o.shape, torch.float32, seed + 5 + i) for i, o in enumerate(ours)]
    sum((o * w).sum() for o, w in zip(ours, weights)).backward()
    sum((e * w.to(dtype).double()).sum() for e, w in zip(exact, weights)).backward()
    for name, x, x64 in (("q", q, q64), ("k", k, k64)):
        assert_rope_close(x.grad, x64.grad, dtype, "d" + name)


@pytest.fixture
def trailing_gpu_plans(monkeypatch):
    """rope_qk.rope_trailing plans the tile a GPU takes (``trailing_config``'s ``on_gpu``), in
    the interpreter too, from an empty plan cache."""
    real = rope_qk.trailing_config
    monkeypatch.setattr(rope_qk, "trailing_config", lambda on_gpu, *a: real(True, *a))
    monkeypatch.setattr(rope_qk, "_PLANS", {})


@pytest.fixture
def gpu_plans(monkeypatch):
    """rope_qk plans the tiles a GPU takes (``default_config``'s ``on_gpu``), in the interpreter
    too, from an empty plan cache (the test reads its one plan from ``rope_qk._PLANS``)."""
    real = rope_qk.default_config
    monkeypatch.setattr(rope_qk, "default_config", lambda *a: real(*a[:5], True, *a[6:]))
    monkeypatch.setattr(rope_qk, "_PLANS", {})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_partial_rotary_transposed_tiles(dtype, head_dim, seed, gpu_plans):
    """GPT-NeoX's partial rotary on the transposed views models hand over, whose contiguous
    results are transposed against them: the tiles a GPU takes there (whole rows, 4 tokens x 4
    heads: test_default_config_transposed), in the interpreter too; 7 tokens leave a masked tile.
    Results against transformers' function and the float64 formula, gradients against autograd
    through the float64 formula."""
    b, s, hq, hk = 2, 7, 8, 4
    config = transformers.GPTNeoXConfig(vocab_size=96, hidden_size=hq * head_dim,
                                        intermediate_size=96, num_hidden_layers=1,
                                        num_attention_heads=hq, max_position_embeddings=128,
                                        rotary_pct=0.5)
    cos, sin = _cos_sin(modeling_gpt_neox.GPTNeoXRotaryEmbedding(config), b, s, dtype, seed)
    assert cos.shape[-1] == head_dim // 2
    q = randn((b, s, hq, head_dim), dtype, seed).transpose(1, 2).requires_grad_(True)
    k = randn((b, s, hk, head_dim), dtype, seed + 1).transpose(1, 2).requires_grad_(True)
    ours = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)
    (plan,) = rope_qk._PLANS.values()
    c = plan.constexprs
    assert (c["ROW"], c["BLOCK_S"], c["BLOCK_H"], plan.num_warps) == (head_dim, 4, 4, 2)
    theirs = modeling_gpt_neox.apply_rotary_pos_emb(q.detach(), k.detach(), cos, sin)
    tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]
    for name, o, r, x in zip("qk", ours, theirs, (q, k)):
        assert _layout(o) == _layout(r), name
        assert_rope_close(o, hf_reference(x.detach(), cos, sin), dtype, name)
        torch.testing.assert_close(o.detach(), r, rtol=tol, atol=tol)
    weights = [randn(o.shape, torch.float32, seed + 5 + i) for i, o in enumerate(ours)]
    sum((o * w).sum() for o, w in zip(ours, weights)).backward()
    for name, x, w in zip("qk", (q, k), weights):
        x64 = x.detach().double().requires_grad_(True)
        # (autograd hands our backward the output's gradient in the output's dtype)
        (hf_reference(x64, cos, sin) * w.to(dtype).double()).sum().backward()
        assert_rope_close(x.grad, x64.grad, dtype, "d" + name)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_glm_transposed_token_blocks_fastest(dtype, seed, gpu_plans):
    """GLM's partial rotary on the transposed views, heads of 128 (rows of 256 B or more): the
    results are transposed, so token blocks are the programs' fastest axis; with the GPU's tiles
    (one token x 8 heads, pairs read as words), in the interpreter too, 7 tokens and a half-masked
    block of k. Results against transformers' function in float64, gradients against autograd
    through it."""
    b, s, hq, hk, d = 2, 7, 8, 4, 128
    cos, sin = _cos_sin(modeling_glm.GlmRotaryEmbedding(_glm_config(head_dim=d)), b, s, dtype,
                        seed)
    assert cos.shape[-1] == d // 2
    q = randn((b, s, hq, d), dtype, seed).transpose(1, 2).requires_grad_(True)
    k = randn((b, s, hk, d), dtype, seed + 1).transpose(1, 2).requires_grad_(True)
    ours = rope_kernels.hf.apply_rotary_pos_emb_glm(q, k, cos, sin)
    (plan,) = rope_qk._PLANS.values()
    c = plan.constexprs
    assert (c["TOKEN_BLOCKS_FASTEST"], c["INTERLEAVED"], c["BLOCK_S"], c["BLOCK_H"]) == (
        True, 2, 1, 8)
    # (contiguous results, as GLM's function returns them (torch.cat): transposed)
    _against_float64(modeling_glm.apply_rotary_pos_emb, q, k, cos, sin, ours, dtype, seed)


# (family, q heads, k heads) -> the tile a GPU takes at head_dim 64 in bf16: (BLOCK_S, BLOCK_H,
# LOADS_FIRST, num_warps). GLM's call rotates half the head.
WORDS_128B_TILES = {
    **{(family, *heads): want for family in ("cohere", "helium") for heads, want in (
        ((32, 8), (1, 32, True, 2)), ((32, 16), (1, 32, True, 4)), ((16, 4), (2, 8, False, 2)),
        ((64, 16), (2, 8, False, 2)), ((8, 2), (4, 4, False, 2)))},
    ("glm", 32, 8): (2, 8, False, 2), ("glm", 16, 4): (2, 8, False, 2),
    ("glm", 8, 2): (4, 4, False, 1),
}


@pytest.mark.parametrize("family, hq, hk", list(WORDS_128B_TILES))
def test_words_in_128_byte_rows_gpu_tiles(family, hq, hk, seed, gpu_plans):
    """Cohere's, Helium's (GLM's pairing, the whole head) and GLM's (half the head) calls at
    head_dim 64 in bf16 with the tiles a GPU takes there (``WORDS_128B_HF_TILES``: loads first
    at 32 q heads, 2 tokens x 8 heads, whose k block is half masked at 16q/4k, 4 x 4 with 2 k
    heads), in the interpreter too; 7 tokens leave a masked token. Against transformers' function
    in float64, gradients against autograd through it."""
    module, _, fn = INTERLEAVED[family]
    b, s, d, dtype = 2, 7, 64, torch.bfloat16
    small = dict(_SMALL, hidden_size=hq * d, num_attention_heads=hq, num_key_value_heads=hk)
    config = {"cohere": lambda: transformers.CohereConfig(**small),
              "helium": lambda: transformers.HeliumConfig(head_dim=d, **small),
              "glm": lambda: transformers.GlmConfig(head_dim=d, **small)}[family]()
    rotary = {"cohere": modeling_cohere.CohereRotaryEmbedding,
              "helium": modeling_helium.HeliumRotaryEmbedding,
              "glm": modeling_glm.GlmRotaryEmbedding}[family](config)
    cos, sin = _cos_sin(rotary, b, s, dtype, seed)
    assert cos.shape[-1] == (d // 2 if family == "glm" else d)
    q = randn((b, s, hq, d), dtype, seed).transpose(1, 2).requires_grad_(True)
    k = randn((b, s, hk, d), dtype, seed + 1).transpose(1, 2).requires_grad_(True)
    ours = fn(q, k, cos, sin)
    (plan,) = rope_qk._PLANS.values()
    c = plan.constexprs
    assert (c["BLOCK_S"], c["BLOCK_H"], c["LOADS_FIRST"], plan.num_warps) == (
        WORDS_128B_TILES[(family, hq, hk)])
    assert c["INTERLEAVED"] == 2  # pairs read as words
    _against_float64(module.apply_rotary_pos_emb, q, k, cos, sin, ours, dtype, seed)


def _logits_and_grads(model, ids):
    model.zero_grad()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                 if p.grad is not None}


def _tiny_model(arch, seed):
    """(config, a tiny random fp32 model with eager attention, its transformers module, token
    ids): Llama, GPT-NeoX, Cohere, GLM, GPT-OSS, OpenAI's privacy filter (token classification,
    the ids as labels) or NanoChat."""
    torch.manual_seed(seed)
    if arch == "llama":
        config, cls, module = _llama_config(), transformers.LlamaForCausalLM, modeling_llama
    elif arch == "cohere":
        config, cls, module = _cohere_config(), transformers.CohereForCausalLM, modeling_cohere
    elif arch == "glm":
        config, cls, module = _glm_config(), transformers.GlmForCausalLM, modeling_glm
    elif arch in ("gpt_oss", "openai_privacy_filter", "nanochat"):
        module = _modeling(arch)  # (the module itself: the tests assign over its function)
        config, cls = {
            "gpt_oss": (_gpt_oss_config, "GptOssForCausalLM"),
            "openai_privacy_filter": (_privacy_filter_config,
                                      "OpenAIPrivacyFilterForTokenClassification"),
            "nanochat": (_nanochat_config, "NanoChatForCausalLM")}[arch]
        config, cls = config(), getattr(module, cls)
    else:
        config, cls, module = _neox_config(), transformers.GPTNeoXForCausalLM, modeling_gpt_neox
    config._attn_implementation = "eager"
    ids = torch.randint(0, config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(seed))
    return config, cls(config).to(DEVICE), module, ids.to(DEVICE)


# arch -> our function for its module's apply_rotary_pos_emb
OURS = {"llama": HF_FUNCTIONS["half"], "gpt_neox": HF_FUNCTIONS["half"],
        "cohere": HF_FUNCTIONS["interleaved"], "glm": HF_FUNCTIONS["glm"],
        "gpt_oss": HF_FUNCTIONS["half_per_pair"],
        "openai_privacy_filter": HF_FUNCTIONS["interleaved_per_pair"],
        "nanochat": HF_FUNCTIONS["half_negated"]}


def _swapped_calls_match(model, module, ids, monkeypatch, ours_fn=OURS["llama"],
                         name="apply_rotary_pos_emb", run=None) -> int:
    """Logits and every parameter's gradient of ``model`` with transformers' function, then with
    ``ours_fn`` assigned over it (the way a user swaps it in; ``name``: the function's name in
    ``module``): they must match. ``run``: what computes them, ``(output, {name: grad})``, where
    the model takes other inputs than ``ids`` (by default ``_logits_and_grads``). Returns how
    many times ours was called."""
    run = run or (lambda: _logits_and_grads(model, ids))
    logits, grads = run()
    calls = []

    def ours(*args, **kw):
        calls.append(1)
        return ours_fn(*args, **kw)

    monkeypatch.setattr(module, name, ours)
    logits2, grads2 = run()
    torch.testing.assert_close(logits2, logits, rtol=1e-5, atol=1e-5)
    assert grads2.keys() == grads.keys() and grads
    for name in grads:
        torch.testing.assert_close(grads2[name], grads[name], rtol=1e-4, atol=1e-5, msg=name)
    return len(calls)


@pytest.mark.parametrize("arch", list(OURS))
def test_tiny_model_unchanged(arch, seed, monkeypatch):
    """A tiny random model (fp32, eager attention): logits and every parameter's gradient match
    with our function of its pairing assigned over transformers' (the way a user swaps it in)."""
    config, model, module, ids = _tiny_model(arch, seed)
    calls = _swapped_calls_match(model, module, ids, monkeypatch, OURS[arch])
    assert calls == config.num_hidden_layers


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_tiny_model_with_gradient_checkpointing(arch, reentrant, seed, monkeypatch):
    """Training with activation (gradient) checkpointing, both of torch's modes: each
    layer's forward runs once without keeping activations and again during the backward, so our
    function is called twice per layer; logits and every gradient match transformers' own."""
    config, model, module, ids = _tiny_model(arch, seed)
    model.train()
    model.config.use_cache = False
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):  # 5.24: the other is a deprecated alias
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    calls = _swapped_calls_match(model, module, ids, monkeypatch)
    assert calls == 2 * config.num_hidden_layers  # forward, then recomputed in backward


BAD = [
    ("unsqueeze_dim 3", dict(unsqueeze_dim=3), ValueError, ["unsqueeze_dim must be 1", "3"]),
    ("cos wider than head_dim", dict(cos="wide", sin="wide"), ValueError,
     ["rotary_dim) must be even, positive and <= head_dim (16)", "32"]),
    ("cos of another length", dict(cos="short", sin="short"), ValueError,
     ["cos must be [b or 1, s, rotary_dim]", "s = 5"]),
    ("k of another head_dim", dict(k="narrow"), ValueError, ["k must match q"]),
    ("float64 q", dict(q="f64"), TypeError, ["q must have dtype", "torch.float64"]),
    ("sin of another shape", dict(sin="short"), ValueError, ["cos and sin must have one shape"]),
    ("interleaved, cos wider than head_dim", dict(cos="wide", sin="wide", fn="interleaved"),
     ValueError, ["rotary_dim) must be even, positive and <= head_dim (16)", "32"]),
    ("glm, cos wider than head_dim", dict(cos="wide", sin="wide", fn="glm"), ValueError,
     ["rotary_dim) must be even, positive and <= head_dim (16)", "32"]),
    ("gpt_oss, cos of one entry per channel", dict(fn="half_per_pair"), ValueError,
     ["cos.shape[-1] must be head_dim / 2 (8) for apply_rotary_pos_emb_gpt_oss", "got 16",
      "rope_kernels.hf.apply_rotary_pos_emb"]),
    ("gpt_oss interleaved, cos of a quarter head", dict(cos="quarter", sin="quarter",
                                                         fn="interleaved_per_pair"), ValueError,
     ["cos.shape[-1] must be head_dim / 2 (8) for apply_rotary_pos_emb_gpt_oss_interleaved",
      "got 4"]),
    ("nanochat, cos wider than head_dim", dict(cos="wide", sin="wide", fn="half_negated"),
     ValueError, ["rotary_dim) must be even, positive and <= head_dim (16)", "32"]),
]


@pytest.mark.parametrize("case,changes,exc,words", BAD, ids=[c[0] for c in BAD])
def test_bad_input(case, changes, exc, words):
    q, k = randn((2, 4, 5, 16), torch.float32, 1), randn((2, 2, 5, 16), torch.float32, 2)
    cos = sin = randn((2, 5, 16), torch.float32, 3)
    made = {"wide": randn((2, 5, 32), torch.float32, 4), "short": randn((2, 4, 16), torch.float32, 5),
            "narrow": randn((2, 2, 5, 8), torch.float32, 6), "f64": q.double(),
            "half": randn((2, 5, 8), torch.float32, 7), "quarter": randn((2, 5, 4), torch.float32, 8)}
    changes = dict(changes)
    fn = HF_FUNCTIONS[changes.pop("fn", "half")]
    args = dict(q=q, k=k, cos=cos, sin=sin)
    args.update({n: made.get(v, v) if isinstance(v, str) else v for n, v in changes.items()})
    with pytest.raises(exc) as info:
        fn(**args)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"


@pytest.mark.parametrize("pairs,rotary_dim", [(p, r) for p in rope_qk.HF_PAIRS for r in (16, 8)
                                              if r == 16 or not (p.endswith("_per_pair")
                                                                 or p == "deepseek")])
def test_operator_fake_matches_real(rotary_dim, pairs, seed):
    """torch.compile traces the operator through its fake implementation: shapes, dtypes and
    strides of the fake results must be the real ones (torch.library.opcheck compares them),
    with the whole head rotated and half of it (laid out otherwise), for every convention
    (GPT-OSS's rotates the whole head with cos half as wide; DeepSeek's only the whole head)."""
    from rope_kernels import _ops

    b, s, hq, hk, d = 2, 3, 4, 2, 16
    q = randn((b, s, hq, d), torch.float32, seed).transpose(1, 2)
    k = randn((b, s, hk, d), torch.float32, seed + 1).transpose(1, 2)
    width = hf_cos_width(pairs, d, rotary_dim)
    cos = randn((b, s, width), torch.float32, seed + 2)
    sin = randn((b, s, width), torch.float32, seed + 3)
    result = torch.library.opcheck(_ops.rope_cos_sin, (q, k, cos, sin, 1, False, pairs),
                                   test_utils=("test_faketensor", "test_schema"))
    assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_tiny_model_under_autocast(arch, seed, monkeypatch):
    """Mixed precision as transformers' Trainer runs it with ``bf16=True``: an fp32 model under
    ``torch.autocast(dtype=torch.bfloat16)``. q and k come out of the projections in bf16 while
    the rotary module's cos and sin follow the hidden states, fp32, so transformers' function
    returns fp32 results and ours bf16 (q's dtype); the attention's matmuls cast both to bf16.
    The first layer's rotated q and k (the same inputs in both runs) are transformers' rounded
    to bf16; logits and every gradient stay within bf16 rounding of transformers' own."""
    config, model, module, ids = _tiny_model(arch, seed)
    results = {}

    def recorded(name, fn):
        def call(q, k, cos, sin, *args, **kw):
            out = fn(q, k, cos, sin, *args, **kw)
            results.setdefault(name, [(q.dtype, cos.dtype), *[o.detach() for o in out]])
            return out
        return call

    monkeypatch.setattr(module, "apply_rotary_pos_emb",
                        recorded("theirs", module.apply_rotary_pos_emb))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        logits, grads = _logits_and_grads(model, ids)
    monkeypatch.setattr(module, "apply_rotary_pos_emb",
                        recorded("ours", rope_kernels.hf.apply_rotary_pos_emb))
    with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
        logits2, grads2 = _logits_and_grads(model, ids)
    (kinds, *theirs), (_, *ours) = results["theirs"], results["ours"]
    assert kinds == (torch.bfloat16, torch.float32)  # the mixed case is the one tested
    for name, got, want in zip("qk", ours, theirs):
        assert (got.dtype, want.dtype) == (torch.bfloat16, torch.float32)
        assert_rope_close(got, want.double(), torch.bfloat16, "layer 0 " + name)
    # Through the attention and two layers, those roundings stay within a few bf16 ulps of each
    # tensor's largest element (2.3 at most over 24 seeds in the interpreter, which truncates
    # where a GPU rounds to nearest).
    bound = 4 * torch.finfo(torch.bfloat16).eps
    assert (logits2 - logits).abs().max() <= bound * logits.abs().max()
    assert grads2.keys() == grads.keys()
    for name in grads:
        diff = (grads2[name] - grads[name]).abs().max()
        assert diff <= bound * grads[name].abs().max(), (name, diff.item())


# --- In place (``*_inplace``): Liger-Kernel's contract, for inference -----------------------------
IN_PLACE = {"half": rope_kernels.hf.apply_rotary_pos_emb_inplace,
            "interleaved": rope_kernels.hf.apply_rotary_pos_emb_interleaved_inplace,
            "glm": rope_kernels.hf.apply_rotary_pos_emb_glm_inplace,
            "half_per_pair": rope_kernels.hf.apply_rotary_pos_emb_gpt_oss_inplace,
            "interleaved_per_pair": rope_kernels.hf.apply_rotary_pos_emb_gpt_oss_interleaved_inplace,
            "half_negated": rope_kernels.hf.apply_rotary_pos_emb_nanochat_inplace,
            "deepseek": rope_kernels.hf.apply_rotary_pos_emb_deepseek_inplace}
# pairs -> (transformers' module, its rotary module) whose function the in-place call must match:
# with part of the head rotated where the family has it (GPT-NeoX's, GLM's), and the whole head.
_TRANSFORMERS = {"half": (modeling_gpt_neox, lambda: modeling_gpt_neox.GPTNeoXRotaryEmbedding(
                     _neox_config())),
                 "interleaved": INTERLEAVED["cohere"][:2], "glm": INTERLEAVED["glm"][:2],
                 "half_per_pair": OTHERS["gpt_oss"][:2],
                 "interleaved_per_pair": OTHERS["openai_privacy_filter"][:2],
                 "half_negated": OTHERS["nanochat"][:2]}
_WHOLE_HEAD = {"half": (modeling_llama, lambda: modeling_llama.LlamaRotaryEmbedding(
                   _llama_config(head_dim=16))),
               "interleaved": INTERLEAVED["cohere"][:2], "glm": INTERLEAVED["helium"][:2],
               "half_per_pair": OTHERS["gpt_oss"][:2],
               "interleaved_per_pair": OTHERS["openai_privacy_filter"][:2],
               "half_negated": OTHERS["nanochat"][:2]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pairs", list(_TRANSFORMERS))  # (DeepSeek's: test_deepseek_*)
@pytest.mark.parametrize("view", ["fused projection", "transposed", "unsqueeze_dim 2",
                                  "whole head"])
def test_inplace_matches_out_of_place_and_transformers(dtype, pairs, view, seed):
    """The in-place call returns the tensors it was given, holding what the out-of-place call
    returns (the same bits) and within rounding of transformers' own function; in a fused
    projection's buffer, v and the channels past rotary_dim are left exactly as they were."""
    module, rotary = (_WHOLE_HEAD if view == "whole head" else _TRANSFORMERS)[pairs]
    b, s, hq, hk, d = 2, 5, 4, 2, 16
    unsqueeze_dim = 2 if view == "unsqueeze_dim 2" else 1
    cos, sin = _cos_sin(rotary(), b, s, dtype, seed)
    if view == "fused projection":  # q, k, v from one [b, s, (hq + 2 hk) * d] projection
        qkv = randn((b, s, (hq + 2 * hk) * d), dtype, seed)
        q = qkv[..., : hq * d].view(b, s, hq, d).transpose(1, 2)
        k = qkv[..., hq * d: (hq + hk) * d].view(b, s, hk, d).transpose(1, 2)
    else:
        q, k = randn((b, s, hq, d), dtype, seed), randn((b, s, hk, d), dtype, seed + 1)
        qkv = None
        if unsqueeze_dim == 1:
            q, k = q.transpose(1, 2), k.transpose(1, 2)
    before = [x.clone() for x in (q, k)] + ([qkv.clone()] if qkv is not None else [])
    out_of_place = HF_FUNCTIONS[pairs](q, k, cos, sin, unsqueeze_dim)
    theirs = module.apply_rotary_pos_emb(before[0], before[1], cos, sin, unsqueeze_dim)
    got = IN_PLACE[pairs](q, k, cos, sin, unsqueeze_dim)
    assert got[0] is q and got[1] is k
    r = rope_qk.hf_rotary_dim(cos, pairs)
    for name, x, o, t, b4 in zip("qk", got, out_of_place, theirs, before):
        assert torch.equal(x, o), name
        assert_rope_close(x, hf_reference(b4, cos, sin, unsqueeze_dim, pairs), dtype, name)
        tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2}[dtype]
        torch.testing.assert_close(x, t.to(dtype), rtol=tol, atol=tol)
        assert torch.equal(x[..., r:], b4[..., r:]), name  # past rotary_dim: untouched
        assert not torch.equal(x[..., :r], b4[..., :r]), name
    if qkv is not None:  # v's columns of the projection, never a pointer of the call
        assert torch.equal(qkv[..., (hq + hk) * d:], before[2][..., (hq + hk) * d:])


# arch -> our in-place function for its module's apply_rotary_pos_emb (the causal LMs)
OURS_IN_PLACE = {"llama": IN_PLACE["half"], "gpt_neox": IN_PLACE["half"],
                 "gpt_oss": IN_PLACE["half_per_pair"], "nanochat": IN_PLACE["half_negated"]}


@pytest.mark.parametrize("arch", list(OURS_IN_PLACE))
def test_inplace_in_a_tiny_model_generating(arch, seed, monkeypatch):
    """Generation (``torch.no_grad``, a KV cache, prefill then one token a step) with the
    in-place function assigned over transformers': the same tokens and, at each step, the same
    logits as with transformers' own."""
    config, model, module, ids = _tiny_model(arch, seed)
    model.eval()
    kw = dict(max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True,
              pad_token_id=0)
    with torch.no_grad():
        theirs = model.generate(ids, **kw)
        calls = []

        def ours(*args, **kwargs):
            calls.append(1)
            return OURS_IN_PLACE[arch](*args, **kwargs)

        monkeypatch.setattr(module, "apply_rotary_pos_emb", ours)
        mine = model.generate(ids, **kw)
    assert len(calls) == 4 * config.num_hidden_layers  # prefill and 3 decode steps
    assert torch.equal(mine.sequences, theirs.sequences)
    for a, b in zip(mine.logits, theirs.logits):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_inplace_refuses_what_it_cannot_do(seed):
    """Clear errors, naming the function and what to do instead: q or k that need a gradient
    (not under no_grad, where they are fine), one tensor for q and k, and a q whose elements share
    memory. The out-of-place checks apply as well."""
    fn = rope_kernels.hf.apply_rotary_pos_emb_glm_inplace
    q, k = randn((2, 4, 5, 16), torch.float32, 1), randn((2, 2, 5, 16), torch.float32, 2)
    cos, sin = randn((2, 5, 16), torch.float32, 3), randn((2, 5, 16), torch.float32, 4)
    before = q.clone()
    with pytest.raises(ValueError, match=r"apply_rotary_pos_emb_glm_inplace cannot rotate q and k "
                                         r"that require grad.*apply_rotary_pos_emb_glm, which"):
        fn(q.clone().requires_grad_(True), k, cos, sin)
    with torch.no_grad():
        fn(q.clone().requires_grad_(True), k.clone(), cos, sin)
    with pytest.raises(ValueError, match="different tensors"):
        fn(q, q, cos, sin)
    wide = randn((2, 1, 5, 16), torch.float32, 5).expand(2, 4, 5, 16)
    with pytest.raises(ValueError, match=r"writes into q, whose elements share memory.*"
                                         r"\(80, 0, 16, 1\)"):
        fn(wide, k, cos, sin)
    with pytest.raises(ValueError, match="unsqueeze_dim must be 1"):
        fn(q, k, cos, sin, 3)
    assert torch.equal(q, before)  # nothing was written by a refused call


@pytest.mark.parametrize("pairs", list(rope_qk.HF_PAIRS))
def test_inplace_operator_under_compile(pairs, seed):
    """torch.compile with fullgraph: the in-place operator mutates the traced q and k, which
    come back rotated as in eager mode."""
    from rope_kernels import _ops

    b, s, hq, hk, d = 2, 3, 4, 2, 16
    q = randn((b, s, hq, d), torch.float32, seed).transpose(1, 2)
    k = randn((b, s, hk, d), torch.float32, seed + 1).transpose(1, 2)
    width = 8 if pairs == "glm" else hf_cos_width(pairs, d, d)  # (GLM's: half the head)
    cos = randn((b, s, width), torch.float32, seed + 2)
    sin = randn((b, s, width), torch.float32, seed + 3)
    expected = HF_FUNCTIONS[pairs](q, k, cos, sin)
    result = torch.library.opcheck(_ops.rope_cos_sin_, (q.clone(), k.clone(), cos, sin, 1, pairs),
                                   test_utils=("test_faketensor", "test_schema"))
    assert set(result.values()) == {"SUCCESS"}, result
    torch._dynamo.reset()
    backend = "inductor" if DEVICE.type == "cuda" else "aot_eager"
    compiled = torch.compile(IN_PLACE[pairs], fullgraph=True, backend=backend)
    q2, k2 = q.clone(), k.clone()
    got = compiled(q2, k2, cos, sin)
    for x, o, e in zip((q2, k2), got, expected):
        torch.testing.assert_close(x, e, rtol=0, atol=0)
        torch.testing.assert_close(o, e, rtol=0, atol=0)


# Model families (transformers.models.<name>.modeling_<name>) and the function of ours the
# documentation names for each: rope_kernels.hf's docstring and the README list them.
_FAMILIES = {
    "apply_rotary_pos_emb": ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                             "phi3", "gpt_neox"],
    "apply_rotary_pos_emb_interleaved": ["cohere", "cohere2", "blt", "glm4v", "glm_ocr",
                                         "ernie4_5_vl_moe"],
    "apply_rotary_pos_emb_glm": ["glm", "glm4", "helium", "ernie4_5", "moonshine"],
    "apply_rotary_pos_emb_gpt_oss": ["gpt_oss"],
    "apply_rotary_pos_emb_gpt_oss_interleaved": ["openai_privacy_filter"],
    "apply_rotary_pos_emb_nanochat": ["nanochat"],
}


def _their_function(name):
    return _modeling(name).apply_rotary_pos_emb


def _random_call(seed, width=16):
    """q [2, 4, 5, 16], k [2, 2, 5, 16], cos and sin [2, 5, width]: random, cos and sin too."""
    return [randn(shape, seed=seed + i) for i, shape in
            enumerate([(2, 4, 5, 16), (2, 2, 5, 16), (2, 5, width), (2, 5, width)])]


@pytest.mark.parametrize("ours,name", [(f, n) for f, names in _FAMILIES.items() for n in names],
                         ids=lambda v: v)
def test_named_families_use_the_pairing_we_name(ours, name, seed):
    """Each family the documentation names computes what our function for it computes, on the
    same arguments (random cos and sin, so that no property of a real table hides a pairing;
    head_dim / 2 wide for GPT-OSS's functions, head_dim for the others); each other function
    of ours gives other numbers or refuses the call (so the choice matters: GPT-OSS's narrow cos
    would pass for Llama's partial rotary)."""
    theirs = _their_function(name)
    q, k, cos, sin = _random_call(seed, width=8 if "gpt_oss" in ours else 16)
    want = theirs(q, k, cos, sin)
    got = getattr(rope_kernels.hf, ours)(q, k, cos, sin)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    for other in _FAMILIES:
        if other == ours:
            continue
        try:
            wrong = getattr(rope_kernels.hf, other)(q, k, cos, sin)
        except ValueError:  # (cos of the other width)
            continue
        assert not all(torch.allclose(o, w, atol=1e-3) for o, w in zip(wrong, want)), other


@pytest.mark.parametrize("name", ["glm4v", "glm_ocr"])
def test_glm4v_partial_rotary_is_the_interleaved_function(name, seed):
    """GLM-4V's and GLM-OCR's function pairs adjacent channels by cos and sin of each channel,
    as Cohere's, and with cos narrower than the head rotates its first ``cos.shape[-1]``
    channels and copies the rest (a ``partial_rotary_factor`` under 1): ours computes it at half
    the head, values and gradients, results contiguous as theirs (``torch.cat``); GLM's function
    of ours, which reads pair j's angle at channel j of Llama's layout, gives other numbers."""
    theirs = _their_function(name)
    q, k, cos, sin = _random_call(seed, width=8)
    q.requires_grad_(True)
    k.requires_grad_(True)
    got = rope_kernels.hf.apply_rotary_pos_emb_interleaved(q, k, cos, sin)
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
    exact = theirs(q64, k64, cos.double(), sin.double())
    want = theirs(q.detach(), k.detach(), cos, sin)
    for g, w, e in zip(got, want, exact, strict=True):
        torch.testing.assert_close(g.detach(), w, rtol=1e-5, atol=1e-5)
        assert_rope_close(g.detach(), e.detach(), torch.float32)
        assert g.is_contiguous()
    weights = [randn(g.shape, seed=seed + 7 + i) for i, g in enumerate(got)]
    sum((g * w).sum() for g, w in zip(got, weights)).backward()
    sum((e * w.double()).sum() for e, w in zip(exact, weights)).backward()
    for x, x64 in ((q, q64), (k, k64)):
        assert_rope_close(x.grad, x64.grad, torch.float32, "grad")
    wrong = rope_kernels.hf.apply_rotary_pos_emb_glm(q.detach(), k.detach(), cos, sin)
    assert not torch.allclose(wrong[0], want[0], atol=1e-3)


# --- DeepSeek V3's apply_rotary_pos_emb_interleave ------------------------------------------------
# The modeling modules of transformers 5.24 that define it (DeepSeek V3's, and the copies of it:
# Mistral Large 4's also takes k None); rope_kernels.hf's docstring lists them.
DEEPSEEK_MODULES = ["deepseek_v3", "deepseek_v32", "glm4_moe_lite", "glm_moe_dsa", "longcat_flash",
                    "mistral4", "mistral_large4", "bailing_hybrid", "youtu", "axk1", "axk2",
                    "dots3_note"]


def _deepseek_views(dtype, seed, unsqueeze_dim, b=2, s=5, heads=4, nope=8, rope=16, lora=24):
    """q_rot and k_rot as DeepSeek V3's attention makes them: q's rotary slice of a
    [b, s, h, nope + rope] projection, k's of the compressed kv [b, s, lora + rope] (one head);
    [b, h, s, rope] views (``unsqueeze_dim`` 1) or [b, s, h, rope] (2, Mistral Large 4's
    indexer). Also cos and sin [b, s, rope], random, their two halves unrelated (the functions
    read the first: a kernel that read the second would show)."""
    q_states = randn((b, s, heads, nope + rope), dtype, seed)
    kv = randn((b, s, lora + rope), dtype, seed + 1)
    q_rot, k_rot = q_states[..., nope:], kv[..., lora:].view(b, s, 1, rope)
    if unsqueeze_dim == 1:
        q_rot, k_rot = q_rot.transpose(1, 2), k_rot.transpose(1, 2)
    cos, sin = (randn((b, s, rope), torch.float32, seed + i).to(dtype) for i in (2, 3))
    return q_rot, k_rot, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", DEEPSEEK_MODULES)
def test_deepseek_matches_every_copy_of_transformers_function(name, dtype, seed):
    """``apply_rotary_pos_emb_deepseek`` on DeepSeek's own views, with the heads on axis 1 and 2:
    within rounding of each module's ``apply_rotary_pos_emb_interleave`` and of the float64
    formula; the inputs unchanged; the in-place variant returns the tensors given holding the
    same bits (in place, each pair's results land on other channels than it was read from)."""
    theirs = _modeling(name).apply_rotary_pos_emb_interleave
    for unsqueeze_dim in (1, 2):
        q, k, cos, sin = _deepseek_views(dtype, seed, unsqueeze_dim)
        before = q.clone(), k.clone()
        got = rope_kernels.hf.apply_rotary_pos_emb_deepseek(q, k, cos, sin,
                                                            unsqueeze_dim=unsqueeze_dim)
        want = theirs(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
        for g, w, x, b4, part in zip(got, want, (q, k), before, "qk"):
            assert g.dtype == dtype and g.shape == x.shape
            torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=part)
            assert_rope_close(g, hf_reference(b4, cos, sin, unsqueeze_dim, "deepseek"), dtype,
                              part)
            assert torch.equal(x, b4), part  # out of place: the inputs as they were
        in_place = rope_kernels.hf.apply_rotary_pos_emb_deepseek_inplace(
            q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        assert in_place[0] is q and in_place[1] is k
        for x, g, part in zip((q, k), got, "qk"):
            assert torch.equal(x, g), f"{part} in place, unsqueeze_dim {unsqueeze_dim}"


def test_deepseek_modules_are_the_ones_documented():
    """rope_kernels.hf's docstring names each module the tests check (and no test checks fewer)."""
    doc = " ".join(rope_kernels.hf.__doc__.split())
    named = [name for name in DEEPSEEK_MODULES[1:] if f"``{name}``" in doc]
    assert named == DEEPSEEK_MODULES[1:]
    assert "DeepSeek V3's ``apply_rotary_pos_emb_interleave``" in doc
    assert f"{len(DEEPSEEK_MODULES) - 1} more of transformers" in doc


def test_deepseek_without_k_as_mistral_large_4(seed):
    """Mistral Large 4's copy takes ``k=None`` (a layer that reuses another's rotated keys) and
    returns ``(q_embed, None)``: so does ours, out of place and in place."""
    theirs = _modeling("mistral_large4").apply_rotary_pos_emb_interleave
    q, _, cos, sin = _deepseek_views(torch.float32, seed, 1)
    want, none = theirs(q, None, cos, sin)
    assert none is None
    got, none = rope_kernels.hf.apply_rotary_pos_emb_deepseek(q, None, cos, sin)
    assert none is None
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    q2 = q.clone()
    got2, none = rope_kernels.hf.apply_rotary_pos_emb_deepseek_inplace(q2, None, cos, sin)
    assert got2 is q2 and none is None and torch.equal(q2, got)
    # patch's comparison on such a call: ours matches, the others refuse a k of None
    distances = rope_kernels.hf._distances(theirs, (q, None, cos, sin), {})
    assert distances.pop(rope_kernels.hf.apply_rotary_pos_emb_deepseek) < 1e-5
    assert all(isinstance(d, str) for d in distances.values()), distances


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deepseek_views_whose_pairs_are_not_words(dtype, seed):
    """The kernel reads DeepSeek's pairs (and writes its backward's) as words: a q that starts at
    an odd element, or whose token stride is odd, goes through dense copies instead. Values,
    gradients and in place as for any other q, NaN-poisoned outputs written whole."""
    b, s, h, d = 2, 5, 3, 16

    def q_view(case):
        if case == "odd address":
            return randn((b * s * h * d + 1,), dtype, seed)[1:].view(b, s, h, d).transpose(1, 2)
        # [b, s, h, d] with a token stride of h * d + 1
        return randn((b, s, h * d + 1), dtype, seed)[..., : h * d].view(b, s, h, d).transpose(1, 2)

    for case in ("odd address", "odd stride"):
        q = q_view(case)
        k = randn((b, 1, s, d), dtype, seed + 1)
        cos, sin = (randn((b, s, d), torch.float32, seed + i) for i in (2, 3))
        want = [hf_reference(x, cos, sin, 1, "deepseek") for x in (q, k)]
        outs = [torch.full_like(x, float("nan")) for x in (q, k)]
        rope_qk.rope_cos_sin(q, k, cos, sin, 1, pairs="deepseek", q_out=outs[0], k_out=outs[1])
        for o, w, part in zip(outs, want, "qk"):
            assert_rope_close(o, w, dtype, f"{case}: {part}")
        qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        got = rope_kernels.hf.apply_rotary_pos_emb_deepseek(qg, kg, cos, sin)
        weights = [randn(x.shape, dtype, seed + 5 + i) for i, x in enumerate(got)]
        sum((g * w).sum() for g, w in zip(got, weights)).backward()
        for x, xg, w, part in ((q, qg, weights[0], "q"), (k, kg, weights[1], "k")):
            x64 = x.detach().double().requires_grad_(True)
            (hf_reference(x64, cos, sin, 1, "deepseek") * w.double()).sum().backward()
            assert_rope_close(xg.grad, x64.grad, dtype, f"{case}: {part}.grad")
        q_in, k2 = q_view(case), k.clone()  # (q's values and layout again)
        got = rope_kernels.hf.apply_rotary_pos_emb_deepseek_inplace(q_in, k2, cos, sin)
        assert got[0] is q_in and got[1] is k2
        assert torch.equal(q_in, outs[0]) and torch.equal(k2, outs[1]), case


def test_deepseek_gradients(seed):
    """The backward (half-split pairs read, interleaved pairs written, rotated by -theta) against
    the float64 gradient of DeepSeek V3's own function, for q and for k."""
    theirs = _modeling("deepseek_v3").apply_rotary_pos_emb_interleave
    q, k, cos, sin = _deepseek_views(torch.float32, seed, 1)
    q, k = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
    got = rope_kernels.hf.apply_rotary_pos_emb_deepseek(q, k, cos, sin)
    exact = theirs(q64, k64, cos.double(), sin.double())
    weights = [randn(g.shape, seed=seed + 7 + i) for i, g in enumerate(got)]
    sum((g * w).sum() for g, w in zip(got, weights)).backward()
    sum((e * w.double()).sum() for e, w in zip(exact, weights)).backward()
    for x, x64, part in ((q, q64, "q"), (k, k64, "k")):
        assert_rope_close(x.grad, x64.grad, torch.float32, f"{part}.grad")


def test_no_other_function_of_ours_computes_deepseeks(seed):
    """On DeepSeek's call every other function of ours refuses or gives other numbers (GLM's
    computes its values in the other order of channels), and ours gives none of theirs on their
    calls' arguments: ``patch`` can tell them apart."""
    theirs = _modeling("deepseek_v3").apply_rotary_pos_emb_interleave
    q, k, cos, sin = _deepseek_views(torch.float32, seed, 1)
    distances = rope_kernels.hf._distances(theirs, (q, k, cos, sin), {})
    ours = rope_kernels.hf.apply_rotary_pos_emb_deepseek
    assert distances.pop(ours) < 1e-5
    assert all(isinstance(d, str) or d > 0.1 for d in distances.values()), distances
    q, k, cos, sin = _random_call(seed)
    for name in ("llama", "cohere", "glm", "helium", "nanochat"):
        d = rope_kernels.hf._distances(_their_function(name), (q, k, cos, sin), {})
        assert d[ours] > 0.1, name


# A tiny multi-head latent attention model's configuration (DeepSeek V2's and V3's): q's rotary
# slice 8 of 24 channels, one shared key head, a mixture of 4 experts after one dense layer.
_TINY_MLA = dict(
    vocab_size=96, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
    num_hidden_layers=2, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4,
    n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1,
    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16,
    max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _tiny_deepseek(seed, rope_interleave=True):
    """(a tiny random DeepSeek V3 causal LM, fp32, eager attention; its module; token ids):
    ``_TINY_MLA``, q through a low-rank projection."""
    torch.manual_seed(seed)
    module = _modeling("deepseek_v3")
    config = module.DeepseekV3Config(**_TINY_MLA, q_lora_rank=32,
                                     rope_interleave=rope_interleave)
    config._attn_implementation = "eager"
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(seed))
    return module.DeepseekV3ForCausalLM(config).to(DEVICE), module, ids.to(DEVICE)


def _patched_under_its_name(model, module, ids, ours, name):
    """``patch`` on a tiny fp32 model assigns ``ours`` over its module's function ``name``
    (transformers', as it is now) and the logits stay transformers'; ``unpatch`` puts it back;
    ``inplace=True`` assigns its in-place variant, whose greedy generation gives transformers'
    tokens; in bf16 ``patch`` chooses ``ours`` again (logits within bf16's rounding). Leaves the
    model in bf16 and transformers' function in place."""
    theirs = getattr(module, name)
    logits = _logits(model, ids)
    assert rope_kernels.hf.patch(model) == [(module, ours, theirs, name)]
    assert getattr(module, name) is ours
    torch.testing.assert_close(_logits(model, ids), logits, rtol=1e-5, atol=1e-5)
    assert rope_kernels.hf.unpatch(model) == [module]
    assert getattr(module, name) is theirs

    patched = _patched_in_place_generates_the_same(model, ids)
    assert patched.ours is getattr(rope_kernels.hf, ours.__name__ + "_inplace")
    rope_kernels.hf.unpatch(model)

    bf16 = model.to(torch.bfloat16)
    expected = _logits(bf16, ids)
    (patched,) = rope_kernels.hf.patch(bf16)
    assert (patched.ours, patched.name) == (ours, name)
    torch.testing.assert_close(_logits(bf16, ids), expected, rtol=0.05, atol=0.05)
    rope_kernels.hf.unpatch(bf16)
    assert getattr(module, name) is theirs


def test_deepseek_tiny_model_unchanged_and_patched(seed, monkeypatch):
    """A tiny DeepSeek V3 (``rope_interleave``, its default): logits and every parameter's
    gradient match with ours assigned over ``apply_rotary_pos_emb_interleave`` (called once a
    layer); ``patch`` assigns it there under that name (in bf16 too), ``inplace=True`` its
    in-place variant, whose greedy generation gives transformers' tokens; ``unpatch`` undoes it.
    With ``rope_interleave=False`` the attention calls ``apply_rotary_pos_emb`` instead, and
    ``patch`` assigns Llama's function there."""
    model, module, ids = _tiny_deepseek(seed)
    theirs = module.apply_rotary_pos_emb_interleave
    monkeypatch.setattr(module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb)
    ours = rope_kernels.hf.apply_rotary_pos_emb_deepseek
    calls = _swapped_calls_match(model, module, ids, monkeypatch, ours,
                                 "apply_rotary_pos_emb_interleave")
    assert calls == model.config.num_hidden_layers
    monkeypatch.setattr(module, "apply_rotary_pos_emb_interleave", theirs)
    _patched_under_its_name(model, module, ids, ours, "apply_rotary_pos_emb_interleave")

    model, module, ids = _tiny_deepseek(seed, rope_interleave=False)
    (patched,) = rope_kernels.hf.patch(model)
    assert (patched.ours, patched.name) == (rope_kernels.hf.apply_rotary_pos_emb,
                                            "apply_rotary_pos_emb")
    rope_kernels.hf.unpatch(model)
    assert module.apply_rotary_pos_emb is patched.theirs


def test_deepseek_bad_input(seed):
    """cos narrower than the head (DeepSeek's function rotates it whole): a ValueError naming
    cos.shape[-1], the function and what to pass; in place, q that needs a gradient."""
    q, k, cos, sin = _deepseek_views(torch.float32, seed, 1)
    with pytest.raises(ValueError, match=r"cos.shape\[-1\] must be head_dim \(16\) for "
                                         r"apply_rotary_pos_emb_deepseek.*got 8"):
        rope_kernels.hf.apply_rotary_pos_emb_deepseek(q, k, cos[..., :8], sin[..., :8])
    with pytest.raises(ValueError, match="apply_rotary_pos_emb_deepseek_inplace cannot rotate q "
                                         "and k that require grad"):
        rope_kernels.hf.apply_rotary_pos_emb_deepseek_inplace(q.requires_grad_(True), k, cos, sin)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


# Every family in float32; in bf16, one of each layout of cos (Llama's, GLM's, GPT-OSS's).
PATCH_CASES = ([(arch, torch.float32) for arch in OURS]
               + [(arch, torch.bfloat16) for arch in ("llama", "glm", "gpt_oss")])


@pytest.mark.parametrize("arch,dtype", PATCH_CASES,
                         ids=[f"{a}-{str(d)[6:]}" for a, d in PATCH_CASES])
def test_patch_chooses_the_models_function(arch, dtype, seed, monkeypatch):
    """``hf.patch`` on a tiny random model of each family assigns our function of its pairing
    over its module's (and nothing else), the logits stay transformers' (bf16: within the
    rounding of a bf16 model), a second call chooses the same, and ``unpatch`` puts
    transformers' function back."""
    config, model, module, ids = _tiny_model(arch, seed)
    model = model.to(dtype)
    theirs = module.apply_rotary_pos_emb
    monkeypatch.setattr(module, "apply_rotary_pos_emb", theirs)  # back after the test, whatever
    expected = _logits(model, ids)
    patched = rope_kernels.hf.patch(model)
    assert patched == [(module, OURS[arch], theirs, "apply_rotary_pos_emb")]
    assert module.apply_rotary_pos_emb is OURS[arch]
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=0.05, atol=0.05)
    torch.testing.assert_close(_logits(model, ids), expected, **tol)
    assert rope_kernels.hf.patch(model) == patched  # again: transformers' function still known
    assert rope_kernels.hf.unpatch(model) == [module]
    assert module.apply_rotary_pos_emb is theirs
    assert rope_kernels.hf.unpatch(model) == []


def _patched_in_place_generates_the_same(model, ids):
    """Greedy generation (4 tokens, eval mode) after ``patch(model, inplace=True)`` gives the
    tokens transformers' own function gave; returns the one ``Patched``."""
    model.eval()
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        theirs = model.generate(ids, **kw)
    (patched,) = rope_kernels.hf.patch(model, inplace=True)
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **kw), theirs)
    return patched


def test_patch_inplace_generates_the_same(seed, monkeypatch):
    """``patch(model, inplace=True)`` assigns the in-place variant: greedy generation gives
    transformers' tokens; a forward that needs gradients is then refused by name."""
    config, model, module, ids = _tiny_model("llama", seed)
    monkeypatch.setattr(module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb)
    patched = _patched_in_place_generates_the_same(model, ids)
    assert patched.ours is rope_kernels.hf.apply_rotary_pos_emb_inplace
    with pytest.raises(ValueError, match="apply_rotary_pos_emb_inplace cannot rotate q and k "
                                         "that require grad"):
        model(input_ids=ids)
    rope_kernels.hf.unpatch(model)
    assert module.apply_rotary_pos_emb is patched.theirs


def _double_angle(theirs):
    """A rotation no function of ours computes: by 2 theta (cos 2t, sin 2t from cos t, sin t)."""
    def rotate(q, k, cos, sin, unsqueeze_dim=1):
        return theirs(q, k, cos * cos - sin * sin, 2 * sin * cos, unsqueeze_dim)
    return rotate


def _close_to_theirs_with_gradient(ours, theirs, exact, x, x64, dtype, seed, name):
    """A one-tensor function's result ``ours`` (of ``x``, which requires grad) against
    transformers' in float64 (``exact``, of ``x64``) and in the dtype (``theirs``), within the
    dtype's rounding; then the gradient through ours against autograd through theirs in float64,
    for random weights of the result."""
    assert_rope_close(ours.detach(), exact.detach(), dtype, name)
    tol = {torch.float32: 1e-6, torch.bfloat16: 2e-2, torch.float16: 3e-3}[dtype]
    torch.testing.assert_close(ours.detach(), theirs, rtol=tol, atol=tol)
    weights = randn(ours.shape, torch.float32, seed + 5)
    (ours * weights).sum().backward()
    (exact * weights.to(dtype).double()).sum().backward()
    assert_rope_close(x.grad, x64.grad, dtype, "dx")


def _deepseek_v4_x(dtype, seed, unsqueeze_dim, b=2, s=5, heads=4, d=32):
    """x as DeepSeek V4's attention passes it: ``[b, h, s, d]``, the transposed view of a
    projection ``[b, s, h, d]`` (``unsqueeze_dim=2``: that projection itself)."""
    x = randn((b, s, heads, d), dtype, seed)
    return x.transpose(1, 2) if unsqueeze_dim == 1 else x


V4 = rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("unsqueeze_dim", [1, 2])
@pytest.mark.parametrize("rope", [8, 32], ids=["rope 8 of 32", "whole head"])
def test_deepseek_v4_matches_transformers_function(dtype, unsqueeze_dim, rope, seed):
    """DeepSeek V4's ``apply_rotary_pos_emb(x, cos, sin)``: the last ``2 * cos.shape[-1]``
    channels of each head rotated in adjacent pairs by cos and sin of one entry per pair, the
    rest copied; also with ``-sin``, as its attention undoes the rotation on its output. Against
    transformers' function in float64 and in the dtype, on random cos and sin: the values, a
    contiguous result (theirs ends in ``torch.cat``), the nope channels bit for bit, x unchanged,
    the gradient against autograd through theirs in float64; the in-place variant's bits, the
    nope channels of x left as they were."""
    theirs_fn = _modeling("deepseek_v4").apply_rotary_pos_emb
    x = _deepseek_v4_x(dtype, seed, unsqueeze_dim)
    before = x.clone()
    cos, sin = (randn((2, 5, rope // 2), torch.float32, seed + i) for i in (1, 2))
    for sin_ in (sin, -sin):
        x.requires_grad_(True)
        ours = V4(x, cos, sin_, unsqueeze_dim)
        theirs = theirs_fn(x.detach(), cos, sin_, unsqueeze_dim)
        x64 = x.detach().double().requires_grad_(True)
        exact = theirs_fn(x64, cos.double(), sin_.double(), unsqueeze_dim)
        assert ours.shape == x.shape and ours.dtype == dtype and ours.is_contiguous()
        assert ours.requires_grad
        nope = 32 - rope
        assert torch.equal(ours[..., :nope].detach(), x[..., :nope].detach())
        _close_to_theirs_with_gradient(ours, theirs, exact, x, x64, dtype, seed, "deepseek_v4")
        x = x.detach()
        assert torch.equal(x, before)
        x_in = x.clone()
        assert rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4_inplace(
            x_in, cos, sin_, unsqueeze_dim) is x_in
        assert torch.equal(x_in, ours.detach())
    # the rotation is the one named: GPT-OSS interleaved pairs on the slice
    ref = hf_reference(x[..., 32 - rope:], cos, sin, unsqueeze_dim, "interleaved_per_pair")
    assert_rope_close(V4(x, cos, sin, unsqueeze_dim)[..., 32 - rope:], ref, dtype, "slice")


@pytest.mark.parametrize("plans", ["interpreter's", "a GPU's"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads_axis", [1, 2])
@pytest.mark.parametrize("d,rope", [(64, 16), (40, 8), (16, 16)],
                         ids=["48 copied + 16", "32 copied + 8 (not powers of 2)", "whole head"])
def test_deepseek_v4_one_launch_writes_every_element(plans, dtype, heads_axis, d, rope, seed,
                                                     monkeypatch, request):
    """``rope_qk.rope_trailing``, the function's kernel call: one launch, the rotary slice as q
    and the copied channels as fused QKV's v part, into a NaN-poisoned result inside a larger
    NaN buffer: every element written (the rotary channels against the float64 formula, the
    others x's bits), nothing outside it; forward and backward (the transpose: the same call on
    -sin, as the per-pair tables make it); with the plans a GPU takes, in the interpreter too."""
    if plans == "a GPU's":
        request.getfixturevalue("trailing_gpu_plans")
    x = randn((2, 5, 3, d), dtype, seed)
    if heads_axis == 1:
        x = x.transpose(1, 2)
    cos, sin = (randn((2, 5, rope // 2), torch.float32, seed + i) for i in (1, 2))
    for backward in (False, True):
        buf = torch.full((x.numel() + 64,), float("nan"), dtype=dtype, device=DEVICE)
        out = buf[32:32 + x.numel()].view(x.shape)
        launches = []
        real_launch = rope_qk.launch
        monkeypatch.setattr(rope_qk, "launch", lambda *a: launches.append(1) or real_launch(*a))
        assert rope_qk.rope_trailing(x, cos, sin, heads_axis, backward, out=out) is out
        monkeypatch.setattr(rope_qk, "launch", real_launch)
        assert launches == [1]
        assert buf[:32].isnan().all() and buf[32 + x.numel():].isnan().all()
        assert torch.equal(out[..., :d - rope], x[..., :d - rope])
        ref = hf_reference(x[..., d - rope:], cos, -sin if backward else sin, heads_axis,
                           "interleaved_per_pair")
        assert_rope_close(out[..., d - rope:], ref, dtype, "rotary slice")
    if plans == "a GPU's":
        # 4 KB of x a program: as many of a token's 3 heads as fit (a power of two), then tokens
        rows = 4096 // (d * x.element_size())
        rows = 1 << (rows.bit_length() - 1)
        heads = min(4, rows)
        for plan in rope_qk._PLANS.values():  # forward and backward
            assert (plan.constexprs["BLOCK_S"], plan.constexprs["BLOCK_HK"], plan.num_warps,
                    plan.constexprs["HAS_V"]) == (rows // heads, heads, 4, d > rope)


@pytest.mark.parametrize("heads_axis", [1, 2])
def test_deepseek_v4_in_place_path(heads_axis, seed, monkeypatch, trailing_gpu_plans):
    """The in-place variant is one launch of ``rope_qk.rope_trailing`` with ``out=x`` (x rotated
    where it lies) for one head, one token and many of both, planned on the GPU's in-place tile
    (in the interpreter too): ``TRAILING_IN_PLACE_BYTES`` of the rotary slices a program on 2
    warps. Each rotates the slice as the out-of-place call does, the copied channels' bits
    kept."""
    monkeypatch.setattr(rope_kernels.api, "_SHORTCUTS", rope_kernels.api._Shortcuts())  # (none)
    trailing = []
    real_trailing = rope_qk.rope_trailing
    monkeypatch.setattr(rope_qk, "rope_trailing",
                        lambda *a, **kw: trailing.append(kw.get("out")) or real_trailing(*a, **kw))
    for heads, tokens in [(1, 5), (4, 1), (4, 5)]:
        x = randn((2, tokens, heads, 40), torch.bfloat16, seed)
        if heads_axis == 1:
            x = x.transpose(1, 2)
        cos, sin = (randn((2, tokens, 8), torch.float32, seed + i) for i in (1, 2))
        want = V4(x, cos, sin, heads_axis)
        x_in = x.clone()
        rope_qk._PLANS.clear()  # (the in-place call's plan alone)
        trailing.clear()
        assert rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4_inplace(
            x_in, cos, sin, heads_axis) is x_in
        assert len(trailing) == 1 and trailing[0] is x_in, (heads, tokens)
        assert torch.equal(x_in[..., :24], x[..., :24])
        assert_rope_close(x_in, want.double(), torch.bfloat16, f"{heads} heads, {tokens} tokens")
        # 2 KB of 16-channel rows: 64 rows, as many of the heads as there are, then tokens
        (plan,) = rope_qk._PLANS.values()
        assert (plan.constexprs["BLOCK_S"], plan.constexprs["BLOCK_HK"], plan.num_warps,
                plan.constexprs["HAS_V"]) == (64 // heads, heads, 2, False)


def test_only_ours_computes_deepseek_v4s(seed):
    """On DeepSeek V4's call, of the functions ``patch`` tries, only ours computes it: every
    other refuses it or is far off (so ``patch`` assigns it and no other)."""
    theirs = _modeling("deepseek_v4").apply_rotary_pos_emb
    for rope_channels in (8, 16):
        x = randn((1, 4, 8, 16), torch.float32, seed)
        cos, sin = (randn((1, 8, rope_channels // 2), torch.float32, seed + i) for i in (1, 2))
        distances = rope_kernels.hf._distances(theirs, (x, cos, sin), {})
        assert len(distances) == len(rope_kernels.hf._IN_PLACE_OF) - 2 == 14  # (not their own names)
        assert distances.pop(V4) < 1e-6
        assert all(isinstance(d, str) or d > 0.1 for d in distances.values()), distances


def _tiny_deepseek_v4(seed):
    """(a tiny random fp32 DeepSeek V4 with eager attention: a heavily compressed layer and a
    compressed sparse one, heads of 32 with 8 rotary channels, its module, token ids)."""
    module = _modeling("deepseek_v4")
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}
    config = module.DeepseekV4Config(
        vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=32, qk_rope_head_dim=8, q_lora_rank=32, o_lora_rank=32,
        n_routed_experts=4, num_experts_per_tok=2, index_n_heads=2, index_head_dim=16,
        index_topk=8, moe_intermediate_size=32, intermediate_size=64,
        layer_types=["heavily_compressed_attention", "compressed_sparse_attention"],
        mlp_layer_types=["hash_moe", "moe"], sliding_window=8, num_nextn_predict_layers=0,
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
        rope_parameters={"main": rope, "compress": dict(rope, rope_theta=160000.0)})
    config._attn_implementation = "eager"
    ids = torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(seed))
    return module.DeepseekV4ForCausalLM(config).to(DEVICE), module, ids.to(DEVICE)


def test_deepseek_v4_tiny_model_unchanged_and_patched(seed, monkeypatch):
    """A tiny DeepSeek V4 (its compressors rotate their compressed keys, its indexer its
    queries, its attention q, the shared key-value head and, with ``-sin``, the output): logits
    and every parameter's gradient match with ours assigned (every call, 20 tokens, so that the
    compressors' windows close); ``patch`` chooses it (fp32 and bf16), ``inplace=True`` its
    in-place variant, whose greedy generation gives transformers' tokens."""
    model, module, ids = _tiny_deepseek_v4(seed)
    calls = _swapped_calls_match(model, module, ids, monkeypatch, V4)
    assert calls == 10  # q, kv, output per layer; compressed keys; the indexer's keys and q
    monkeypatch.undo()
    monkeypatch.setattr(module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb)
    _patched_under_its_name(model, module, ids, V4, "apply_rotary_pos_emb")


@pytest.mark.parametrize("case,exc,words", [
    ("cos wider than the head", ValueError,
     ["apply_rotary_pos_emb_deepseek_v4: cos must have one entry per pair", "head_dim (32)",
      "got cos (2, 5, 17) (2 * 17 = 34) for x (2, 4, 5, 32)"]),
    ("cos of no entries", ValueError, ["0 < 2 * cos.shape[-1] <= head_dim", "(2, 5, 0)"]),
    ("x 3-D", ValueError, ["x must be 4-D"]),
    ("x float64", TypeError, ["x must have dtype", "torch.float64"]),
    ("sin of another shape", ValueError, ["cos and sin must have one shape"]),
    ("in place, x requires grad", ValueError,
     ["apply_rotary_pos_emb_deepseek_v4_inplace cannot rotate x that requires grad",
      "use apply_rotary_pos_emb_deepseek_v4"]),
    ("x not a tensor", TypeError, ["x must be a torch.Tensor"]),
])
def test_deepseek_v4_bad_input(case, exc, words, seed):
    """Errors name DeepSeek V4's arguments (x, cos, sin) and what was given."""
    x = _deepseek_v4_x(torch.float32, seed, 1)
    cos = sin = randn((2, 5, 4), torch.float32, seed + 1)
    fn = V4
    if case == "cos wider than the head":
        cos = sin = randn((2, 5, 17), torch.float32, seed + 1)
    elif case == "cos of no entries":
        cos = sin = randn((2, 5, 0), torch.float32, seed + 1)
    elif case == "x 3-D":
        x = x[0]
    elif case == "x float64":
        x = x.double()
    elif case == "sin of another shape":
        sin = randn((2, 5, 2), torch.float32, seed + 2)
    elif case == "in place, x requires grad":
        x = x.clone().requires_grad_(True)
        fn = rope_kernels.hf.apply_rotary_pos_emb_deepseek_v4_inplace
    elif case == "x not a tensor":
        x = x.tolist()
    with pytest.raises(exc) as info:
        fn(x, cos, sin)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_patch_refuses_what_it_cannot_match(seed, monkeypatch):
    """Where no function of ours computes the model's (a rotation by 2 theta), or the call cannot
    tell them apart (one token), or the model has no such function (GPT-2), ``patch`` raises a
    ValueError that says so, and the module's function stays as it was."""
    config, model, module, ids = _tiny_model("llama", seed)
    monkeypatch.setattr(module, "apply_rotary_pos_emb", _double_angle(module.apply_rotary_pos_emb))
    before = module.apply_rotary_pos_emb
    with pytest.raises(ValueError, match=r"no function of rope_kernels\.hf computes "
                                         r"transformers\.models\.llama\.modeling_llama"):
        rope_kernels.hf.patch(model)
    assert module.apply_rotary_pos_emb is before

    monkeypatch.undo()
    theirs = module.apply_rotary_pos_emb
    one_token = {"input_ids": ids[:1, :1]}  # position 0 only: every rotation is the identity
    with pytest.raises(ValueError, match="cannot tell which one"):
        rope_kernels.hf.patch(model, example_inputs=one_token)
    assert module.apply_rotary_pos_emb is theirs

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=96, n_positions=128, n_embd=32, n_layer=1, n_head=2, bos_token_id=1,
        eos_token_id=2)).to(DEVICE)
    with pytest.raises(ValueError, match="has an apply_rotary_pos_emb function \\(nor DeepSeek"):
        rope_kernels.hf.patch(gpt2)
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        rope_kernels.hf.patch(modeling_llama)


# Functions that rotate one tensor a call: family -> (transformers' module name, ours, whether
# cos and sin have one entry per pair: GPT-J's order, (tensor, sin, cos), heads on axis 2)
ONE_TENSOR = {
    "gemma4": ("gemma4", rope_kernels.hf.apply_rotary_pos_emb_gemma4, False),
    "gemma3n": ("gemma3n", rope_kernels.hf.apply_rotary_pos_emb_gemma4, False),
    "diffusion_gemma": ("diffusion_gemma", rope_kernels.hf.apply_rotary_pos_emb_gemma4, False),
    "gptj": ("gptj", rope_kernels.hf.apply_rotary_pos_emb_gptj, True),
    "codegen": ("codegen", rope_kernels.hf.apply_rotary_pos_emb_gptj, True),
}


def _one_tensor_call(family, fn, x, cos, sin, unsqueeze_dim):
    """``fn`` (ours or transformers') called as the family's attention calls it."""
    if ONE_TENSOR[family][2]:  # GPT-J's order: (tensor, sin, cos), heads on axis 2
        return fn(x, sin, cos)
    return fn(x, cos, sin, unsqueeze_dim=unsqueeze_dim)


# GPT-J's function has no unsqueeze_dim (heads on axis 2); Gemma's both layouts
ONE_TENSOR_CASES = [(family, u) for family, (_, _, per_pair) in ONE_TENSOR.items()
                    for u in ((2,) if per_pair else (1, 2))]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family,unsqueeze_dim", ONE_TENSOR_CASES)
def test_one_tensor_functions_match_transformers(dtype, family, unsqueeze_dim, seed):
    """Gemma 3n's and Gemma 4's function (Llama's pairing, one tensor) and GPT-J's (interleaved
    pairs by sin and cos of one entry per pair, sin first; CodeGen's the same), on x as their
    attention passes it (GPT-J: the rotated slice, a view) and as the other layout (Gemma), on
    random cos and sin: values against transformers' function in float64 and in the dtype, the
    layout of its result, and the gradient against autograd through it in float64."""
    name, ours_fn, per_pair = ONE_TENSOR[family]
    module = _modeling(name)
    b, s, h, d = 2, 5, 4, 16
    x = randn((b, s, h, 2 * d), dtype, seed)[..., :d]  # (a view, as GPT-J's q[..., :rotary_dim])
    if unsqueeze_dim == 1:
        x = x.transpose(1, 2)
    cos, sin = (randn((b, s, d // 2 if per_pair else d), dtype, seed + i) for i in (1, 2))
    x.requires_grad_(True)
    ours = _one_tensor_call(family, ours_fn, x, cos, sin, unsqueeze_dim)
    theirs = _one_tensor_call(family, module.apply_rotary_pos_emb, x.detach(), cos, sin,
                              unsqueeze_dim)
    x64 = x.detach().double().requires_grad_(True)
    exact = _one_tensor_call(family, module.apply_rotary_pos_emb, x64, cos.double(),
                             sin.double(), unsqueeze_dim)
    pairs = "interleaved_per_pair" if per_pair else "half"
    ref = hf_reference(x.detach(), cos, sin, unsqueeze_dim, pairs)
    torch.testing.assert_close(exact.detach(), ref, rtol=1e-12, atol=1e-12)  # the same rotation
    assert ours.shape == theirs.shape and ours.dtype == dtype and ours.requires_grad
    assert _layout(ours) == _layout(theirs)
    _close_to_theirs_with_gradient(ours, theirs, exact, x, x64, dtype, seed, family)
    # the in-place variant: x's values, where x lies
    inplace_fn = getattr(rope_kernels.hf, ours_fn.__name__ + "_inplace")
    x_in = x.detach().clone()
    assert _one_tensor_call(family, inplace_fn, x_in, cos, sin, unsqueeze_dim) is x_in
    assert torch.equal(x_in, ours.detach())


def _tiny_one_tensor_model(family, seed):
    """(a tiny random fp32 model with eager attention of a family whose function rotates one
    tensor, its transformers module, token ids)."""
    torch.manual_seed(seed)
    module = _modeling(ONE_TENSOR[family][0])
    if family == "gemma4":
        config = module.Gemma4TextConfig(head_dim=16, **_SMALL)
        cls = module.Gemma4ForCausalLM
    elif family == "gptj":
        config = transformers.GPTJConfig(vocab_size=96, n_positions=128, n_embd=64, n_layer=2,
                                         n_head=4, rotary_dim=8)
        cls = module.GPTJForCausalLM
    else:
        raise ValueError(family)
    config._attn_implementation = "eager"
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(seed))
    return cls(config).to(DEVICE), module, ids.to(DEVICE)


@pytest.mark.parametrize("family", ["gemma4", "gptj"])
def test_one_tensor_models_unchanged_and_patched(family, seed, monkeypatch):
    """A tiny Gemma 4 (a sliding layer with Llama's RoPE, a full one with its proportional RoPE,
    a quarter of the head rotated) and a tiny GPT-J (8 of 16 channels rotated): logits and every
    gradient match with ours assigned (two calls a layer, q and k); ``patch`` chooses it, and
    with ``inplace=True`` greedy generation gives transformers' tokens."""
    model, module, ids = _tiny_one_tensor_model(family, seed)
    ours_fn = ONE_TENSOR[family][1]
    calls = _swapped_calls_match(model, module, ids, monkeypatch, ours_fn)
    assert calls == 2 * 2  # two layers, q and k
    monkeypatch.undo()
    monkeypatch.setattr(module, "apply_rotary_pos_emb", module.apply_rotary_pos_emb)
    model.eval()
    kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        theirs = model.generate(ids, **kw)
    (patched,) = rope_kernels.hf.patch(model, inplace=True)
    assert (patched.module, patched.ours) == (module, getattr(rope_kernels.hf,
                                                               ours_fn.__name__ + "_inplace"))
    with torch.no_grad():
        assert torch.equal(model.generate(ids, **kw), theirs)
    assert rope_kernels.hf.unpatch(model) == [module]


@pytest.mark.parametrize("fn,args,exc,words", [
    ("gemma4", dict(x="3d"), ValueError, ["x must be 4-D", "(4, 5, 16)"]),
    ("gemma4", dict(unsqueeze_dim=3), ValueError, ["unsqueeze_dim must be 1 (x as", "got 3"]),
    ("gemma4", dict(unsqueeze_dim="cos"), ValueError, ["unsqueeze_dim must be 1", "got a Tensor"]),
    ("gemma4", dict(x="f64"), TypeError, ["x must have dtype", "torch.float64"]),
    ("gemma4_inplace", dict(x="grad"), ValueError,
     ["apply_rotary_pos_emb_gemma4_inplace cannot rotate x that requires grad",
      "use apply_rotary_pos_emb_gemma4"]),
    ("gptj", dict(cos="wide"), ValueError,
     ["cos and sin must have one shape", "(2, 5, 16) and (2, 5, 8)"]),
    ("gptj", dict(cos="wide", sin="wide"), ValueError,
     ["cos.shape[-1] must be head_dim / 2 (8)", "got 16"]),
    ("gptj_inplace", dict(x="grad"), ValueError,
     ["apply_rotary_pos_emb_gptj_inplace cannot rotate tensor that requires grad"]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_one_tensor_bad_input(fn, args, exc, words):
    """Errors of the one-tensor functions name their own argument (x, tensor), not q and k."""
    gptj = fn.startswith("gptj")
    x = randn((2, 5, 4, 16) if gptj else (2, 4, 5, 16), torch.float32, 1)
    made = {"3d": x[0], "f64": x.double(), "grad": x.clone().requires_grad_(True),
            "wide": randn((2, 5, 16), torch.float32, 2)}
    cos = sin = randn((2, 5, 8 if gptj else 16), torch.float32, 3)
    x = made.get(args.get("x"), x)
    cos, sin = made.get(args.get("cos"), cos), made.get(args.get("sin"), sin)
    f = getattr(rope_kernels.hf, "apply_rotary_pos_emb_" + fn)
    unsqueeze_dim = cos if args.get("unsqueeze_dim") == "cos" else args.get("unsqueeze_dim", 1)
    with pytest.raises(exc) as info:
        f(x, sin, cos) if gptj else f(x, cos, sin, unsqueeze_dim)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("family,heads,head_dim,tile", [
    ("gemma4", 8, 256, (1, 4, 2)),  # 2 KB of 4 heads
    ("gemma4", 2, 256, (1, 2, 2)),  # all of its heads (1 KB), 2 warps at least
    ("gemma4", 8, 512, (1, 4, 4)),  # 4 heads at least: 4 KB, a warp a KB
    ("gemma4", 16, 128, (1, 8, 2)),  # 2 KB
    ("gptj", 16, 64, (1, 16, 2)),  # 2 KB of 128 B rows (64 rotated channels, as words)
])
def test_one_tensor_tiles(family, heads, head_dim, tile, seed, gpu_plans, monkeypatch):
    """The one-tensor calls (k of no heads) take ``ONE_TENSOR_TILES``' tile where a GPU plans
    them (one token's heads a program: at least 4 heads and 2 KB, a warp a KB), in the
    interpreter too, with results against transformers' function in float64 and gradients
    against autograd through it; with the switch off, the tile of the q+k rules, the same values;
    in place the same tile, not in float32."""
    name, ours_fn, per_pair = ONE_TENSOR[family]
    module = _modeling(name)
    b, s = 2, 3
    x = randn((b, s, heads, 2 * head_dim), torch.bfloat16, seed)[..., :head_dim]
    cos, sin = (randn((b, s, head_dim // 2 if per_pair else head_dim), torch.bfloat16, seed + i)
                for i in (1, 2))
    results = {}
    for switch in (True, False):
        monkeypatch.setattr(rope_qk, "ONE_TENSOR_TILES", switch)
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        xg = x.clone().requires_grad_(True)
        out = _one_tensor_call(family, ours_fn, xg, cos, sin, 2)
        (plan,) = rope_qk._PLANS.values()
        c = plan.constexprs
        if switch:
            assert (c["BLOCK_S"], c["BLOCK_H"], plan.num_warps, c["ALL_HEADS"]) == (*tile, False)
        x64 = x.double().requires_grad_(True)
        exact = _one_tensor_call(family, module.apply_rotary_pos_emb, x64, cos.double(),
                                 sin.double(), 2)
        assert_rope_close(out.detach(), exact.detach(), torch.bfloat16, family)
        weights = randn(out.shape, torch.float32, seed + 5)
        (out * weights).sum().backward()
        (exact * weights.to(torch.bfloat16).double()).sum().backward()
        assert_rope_close(xg.grad, x64.grad, torch.bfloat16, "dx")
        results[switch] = out.detach()
    torch.testing.assert_close(results[True], results[False], rtol=0, atol=0)
    gpu = lambda *a, **kw: rope_qk.default_config(*a[:5], True, *a[6:], **kw)
    monkeypatch.setattr(rope_qk, "ONE_TENSOR_TILES", True)
    for dtype_bytes, in_place in ((4, False), (2, True)):
        cfg = gpu(s, heads, 0, head_dim, dtype_bytes, False, per_pair,
                  rope_qk._tile_angles(3 if per_pair else 2, per_pair), head_dim, in_place)
        ours = cfg == rope_qk._one_tensor_tile(heads, head_dim * dtype_bytes)
        assert ours == (dtype_bytes == 2), (dtype_bytes, in_place, cfg)
    x_in = x.clone()
    assert _one_tensor_call(family, getattr(rope_kernels.hf, ours_fn.__name__ + "_inplace"),
                            x_in, cos, sin, 2) is x_in
    assert torch.equal(x_in, results[True])  # (the plan above, in place: the same bits)


@pytest.mark.parametrize("heads", [128, 16])
def test_deepseek_backward_k_blocks(heads, seed, gpu_plans, monkeypatch):
    """DeepSeek's backward with its one k head, where a GPU plans programs of one head block:
    k's blocks of 1 head (``DEEPSEEK_BACKWARD_K_BLOCKS``), q's as the rules give them; with the
    switch off k's blocks are q's size; the forward keeps them either way. Gradients against
    float64 through DeepSeek V3's own function both ways, the same bits."""
    theirs = _modeling("deepseek_v3").apply_rotary_pos_emb_interleave
    q, k, cos, sin = _deepseek_views(torch.bfloat16, seed, 1, b=1, s=3, heads=heads, rope=64)
    weights = [randn(x.shape, torch.bfloat16, seed + 5 + i) for i, x in enumerate((q, k))]
    grads = {}
    for switch in (True, False):
        monkeypatch.setattr(rope_qk, "DEEPSEEK_BACKWARD_K_BLOCKS", switch)
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        qg, kg = q.detach().requires_grad_(True), k.detach().requires_grad_(True)
        got = rope_kernels.hf.apply_rotary_pos_emb_deepseek(qg, kg, cos, sin)
        sum((g * w).sum() for g, w in zip(got, weights)).backward()
        forward, backward = rope_qk._PLANS.values()
        assert (forward.constexprs["INTERLEAVED"], backward.constexprs["INTERLEAVED"]) == (3, 4)
        assert not backward.constexprs["ALL_HEADS"]
        block_h = backward.constexprs["BLOCK_H"]
        assert backward.constexprs["BLOCK_HK"] == (1 if switch else block_h) and block_h > 1
        assert forward.constexprs["BLOCK_HK"] == forward.constexprs["BLOCK_H"]
        q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
        exact = theirs(q64, k64, cos.double(), sin.double())
        sum((e * w.double()).sum() for e, w in zip(exact, weights)).backward()
        for x, x64, part in ((qg, q64, "q"), (kg, k64, "k")):
            assert_rope_close(x.grad, x64.grad, torch.bfloat16, f"{part}.grad")
        grads[switch] = (qg.grad, kg.grad)
    for a, b in zip(grads[True], grads[False]):
        assert torch.equal(a, b)


# Vision encoders' apply_rotary_pos_emb_vision(q, k, cos, sin): module -> (ours, rotary_dim of a
# head of 16 channels, whether cos and sin come in the model's dtype). Qwen2-VL's function and
# its 24 copies; MiniMax M3 VL's rotates part of the head and computes in the model's dtype;
# Inkling 2's pairs adjacent channels.
_VISION_COPIES = ["qwen2_vl", "qwen2_5_vl", "qwen2_5_omni", "qwen3_vl", "qwen3_vl_moe",
                  "qwen3_omni_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp", "glm4v", "glm4v_moe",
                  "glm5_next", "glm_ocr", "kimi_k25", "paddleocr_vl", "ernie4_5_vl_moe",
                  "exaone4_5", "lfm3_vl", "mlcd", "step3p7", "video_llama_3", "dots3_note",
                  "cohere_compass", "muse_glimmer", "muse_spark"]
VISION_MODULES = {
    **{name: (rope_kernels.hf.apply_rotary_pos_emb_vision, 16, False) for name in _VISION_COPIES},
    "minimax_m3_vl": (rope_kernels.hf.apply_rotary_pos_emb_vision, 12, True),
    "inkling2": (rope_kernels.hf.apply_rotary_pos_emb_vision_interleaved, 16, False),
}
_VISION_PAIRS = {rope_kernels.hf.apply_rotary_pos_emb_vision: "half",
                 rope_kernels.hf.apply_rotary_pos_emb_vision_interleaved: "interleaved"}


def _vision_views(dtype, seed, fused, tokens=7, heads=3, k_heads=3, head_dim=16, rotary_dim=16,
                  table_dtype=torch.float32):
    """q and k [tokens, heads, head_dim] as a vision encoder makes them: views of one fused qkv
    projection ``[tokens, 3, heads, head_dim]`` (Qwen's, ``fused``) or of separate projections
    (MiniMax's, Inkling's; k may have fewer heads); cos and sin [tokens, rotary_dim], random,
    in ``table_dtype``."""
    if fused:
        qkv = randn((tokens, 3 * heads * head_dim), dtype, seed)
        q, k, _ = qkv.reshape(tokens, 3, heads, head_dim).permute(1, 0, 2, 3).unbind(0)
    else:
        q = randn((tokens, heads * head_dim), dtype, seed).view(tokens, heads, head_dim)
        k = randn((tokens, k_heads * head_dim), dtype, seed + 1).view(tokens, k_heads, head_dim)
    cos, sin = (randn((tokens, rotary_dim), torch.float32, seed + i).to(table_dtype)
                for i in (2, 3))
    return q, k, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(VISION_MODULES))
def test_vision_matches_every_copy_of_transformers_function(name, dtype, seed):
    """Ours against each module's ``apply_rotary_pos_emb_vision`` on a fused qkv's views and on
    separate projections (k of fewer heads): within rounding of theirs (both compute in float32
    and round once; MiniMax's computes in the model's dtype) and of the float64 formula; the
    inputs unchanged; the in-place variant returns the tensors given, holding the same bits."""
    theirs = _modeling(name).apply_rotary_pos_emb_vision
    ours, rotary_dim, model_dtype = VISION_MODULES[name]
    in_place = getattr(rope_kernels.hf, ours.__name__ + "_inplace")
    for fused in (True, False):
        q, k, cos, sin = _vision_views(dtype, seed, fused, k_heads=2, rotary_dim=rotary_dim,
                                       table_dtype=dtype if model_dtype else torch.float32)
        before = q.clone(), k.clone()
        got = ours(q, k, cos, sin)
        want = theirs(q, k, cos, sin)
        tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
        for g, w, x, b4, part in zip(got, want, (q, k), before, "qk"):
            assert g.dtype == dtype and g.shape == x.shape
            torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=f"{part}, fused {fused}")
            assert_rope_close(g, hf_reference(b4, cos, sin, -2, _VISION_PAIRS[ours]), dtype, part)
            assert torch.equal(x, b4), part  # out of place: the inputs as they were
        result = in_place(q, k, cos, sin)
        assert result[0] is q and result[1] is k
        for x, g, part in zip((q, k), got, "qk"):
            assert torch.equal(x, g), f"{part} in place, fused {fused}"


def test_vision_modules_are_the_ones_documented():
    """rope_kernels.hf's docstring names each module the tests check, and the count of copies."""
    doc = " ".join(rope_kernels.hf.__doc__.split())
    names = _VISION_COPIES[1:] + ["minimax_m3_vl", "inkling2"]
    assert [name for name in names if f"``{name}``" in doc] == names
    assert f"{len(_VISION_COPIES) - 1} more of transformers 5.24's modeling modules" in doc


@pytest.mark.parametrize("ours", list(_VISION_PAIRS), ids=lambda f: f.__name__)
def test_vision_gradients(ours, seed):
    """The backward against the float64 gradient of the formula, for q and for k, on a fused
    qkv's views (their gradient lands in the projection's gradient, v's part zero)."""
    qkv = randn((9, 3 * 2 * 16), torch.float32, seed).requires_grad_(True)
    q, k, _ = qkv.view(9, 3, 2, 16).unbind(1)
    cos, sin = (randn((9, 16), torch.float32, seed + i) for i in (2, 3))
    got = ours(q, k, cos, sin)
    weights = [randn(g.shape, seed=seed + 7 + i) for i, g in enumerate(got)]
    sum((g * w).sum() for g, w in zip(got, weights)).backward()
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (q, k))
    exact = [hf_reference(x, cos, sin, -2, _VISION_PAIRS[ours]) for x in (q64, k64)]
    sum((e * w.double()).sum() for e, w in zip(exact, weights)).backward()
    grad = qkv.grad.view(9, 3, 2, 16)
    assert_rope_close(grad[:, 0], q64.grad, torch.float32, "q.grad")
    assert_rope_close(grad[:, 1], k64.grad, torch.float32, "k.grad")
    assert torch.equal(grad[:, 2], torch.zeros_like(grad[:, 2]))


def test_no_other_function_of_ours_computes_visions(seed):
    """On a vision call (3-D q and k) every function of ours but the one of its pairing refuses
    or gives other numbers, and the vision functions refuse the text functions' calls: ``patch``
    can tell them apart."""
    q, k, cos, sin = _vision_views(torch.float32, seed, True)
    for name, ours in (("qwen2_vl", rope_kernels.hf.apply_rotary_pos_emb_vision),
                       ("inkling2", rope_kernels.hf.apply_rotary_pos_emb_vision_interleaved)):
        distances = rope_kernels.hf._distances(_modeling(name).apply_rotary_pos_emb_vision,
                                               (q, k, cos, sin), {})
        assert distances.pop(ours) < 1e-5, name
        assert all(isinstance(d, str) or d > 0.1 for d in distances.values()), distances
    q, k, cos, sin = _random_call(seed)
    for name in ("llama", "cohere"):
        d = rope_kernels.hf._distances(_their_function(name), (q, k, cos, sin), {})
        for ours in _VISION_PAIRS:
            assert isinstance(d[ours], str) and "must be 3-D" in d[ours], (name, d[ours])


def _tiny_qwen2_5_vl(seed):
    """(a tiny random Qwen2.5-VL, fp32, eager attention; its module; inputs with one 4 x 4-patch
    image): a vision encoder of 2 blocks (one windowed, one full), heads of 16 channels, then the
    text model's 2 layers over 3 text tokens, the image's 4 merged tokens and 4 more."""
    torch.manual_seed(seed)
    module = _modeling("qwen2_5_vl")
    config = module.Qwen2_5_VLConfig(
        text_config=dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                              mrope_section=[2, 3, 3]),
                         bos_token_id=1, eos_token_id=2, pad_token_id=0),
        vision_config=dict(depth=2, hidden_size=64, intermediate_size=96, num_heads=4,
                           out_hidden_size=64, patch_size=2, spatial_merge_size=2,
                           temporal_patch_size=2, window_size=4, fullatt_block_indexes=[1],
                           in_chans=3),
        image_token_id=90, video_token_id=91, vision_start_token_id=92, vision_end_token_id=93,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    config._attn_implementation = "eager"
    g = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.tensor([1, 5, 92] + [90] * 4 + [93]),
                     torch.randint(3, 90, (4,), generator=g)])[None]
    inputs = dict(input_ids=ids, pixel_values=torch.randn((16, 3 * 2 * 2 * 2), generator=g),
                  image_grid_thw=torch.tensor([[1, 4, 4]]))
    model = module.Qwen2_5_VLForConditionalGeneration(config).to(DEVICE)
    return model, module, {n: v.to(DEVICE) for n, v in inputs.items()}


def test_vision_tiny_model_unchanged_and_patched(seed, monkeypatch):
    """A tiny Qwen2.5-VL with an image: logits and every parameter's gradient match with ours
    assigned over ``apply_rotary_pos_emb_vision`` (called once a vision block); ``patch`` given
    the image assigns it there and Llama's function over the text model's, ``inplace=True``
    their in-place variants (the same logits); without an image (the default 8 token ids) the
    vision encoder does not run and only the text function is replaced; ``unpatch`` undoes it."""
    model, module, inputs = _tiny_qwen2_5_vl(seed)
    theirs, theirs_text = module.apply_rotary_pos_emb_vision, module.apply_rotary_pos_emb
    monkeypatch.setattr(module, "apply_rotary_pos_emb", theirs_text)
    monkeypatch.setattr(module, "apply_rotary_pos_emb_vision", theirs)

    def logits_and_grads():
        model.zero_grad()
        out = model(**inputs, labels=inputs["input_ids"])
        out.loss.backward()
        return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                     if p.grad is not None}

    assert any(n.startswith("model.visual.") for n in logits_and_grads()[1])  # (the image ran)
    calls = _swapped_calls_match(model, module, None, monkeypatch,
                                 rope_kernels.hf.apply_rotary_pos_emb_vision,
                                 "apply_rotary_pos_emb_vision", logits_and_grads)
    assert calls == model.config.vision_config.depth
    monkeypatch.setattr(module, "apply_rotary_pos_emb_vision", theirs)

    model.eval()
    with torch.no_grad():
        expected = model(**inputs).logits
    for inplace in (False, True):
        patched = rope_kernels.hf.patch(model, inplace=inplace, example_inputs=inputs)
        suffix = "_inplace" if inplace else ""
        assert sorted((p.name, p.ours.__name__, p.theirs) for p in patched) == [
            ("apply_rotary_pos_emb", "apply_rotary_pos_emb" + suffix, theirs_text),
            ("apply_rotary_pos_emb_vision", "apply_rotary_pos_emb_vision" + suffix, theirs)]
        with torch.no_grad():
            torch.testing.assert_close(model(**inputs).logits, expected, rtol=1e-5, atol=1e-5)
        assert rope_kernels.hf.unpatch(model) == [module]
        assert module.apply_rotary_pos_emb_vision is theirs
        assert module.apply_rotary_pos_emb is theirs_text

    (patched,) = rope_kernels.hf.patch(model)  # text only: 8 token ids run no image
    assert (patched.name, patched.ours) == ("apply_rotary_pos_emb",
                                            rope_kernels.hf.apply_rotary_pos_emb)
    assert module.apply_rotary_pos_emb_vision is theirs
    rope_kernels.hf.unpatch(model)


@pytest.mark.parametrize("case,exc,words", [
    ("q 4-D", ValueError, ["apply_rotary_pos_emb_vision: q and k must be 3-D, [tokens, heads, "
                           "head_dim]", "got shapes (1, 7, 3, 16) and (7, 3, 16)"]),
    ("k of other tokens", ValueError, ["k must match q in tokens and head_dim",
                                       "got q (7, 3, 16) and k (6, 3, 16)"]),
    ("cos 3-D", ValueError, ["cos and sin must have one shape, [tokens, rotary_dim] with tokens "
                             "= 7", "got (1, 7, 16) and (1, 7, 16)"]),
    ("cos of other tokens", ValueError, ["with tokens = 7", "got (6, 16) and (6, 16)"]),
    ("cos wider than the head", ValueError, ["cos.shape[-1] (rotary_dim) must be even, positive "
                                             "and <= head_dim (16), got 18"]),
    ("k float64", TypeError, ["k must have dtype float32, float16 or bfloat16"]),
    ("sin a list", TypeError, ["sin must be a torch.Tensor (see rope_kernels.hf."
                               "apply_rotary_pos_emb_vision)"]),
    ("in place, q requires grad", ValueError, ["apply_rotary_pos_emb_vision_inplace cannot "
                                               "rotate q and k that require grad",
                                               "use apply_rotary_pos_emb_vision"]),
])
def test_vision_bad_input(case, exc, words, seed):
    """Errors name the argument, what the vision function takes and what it was given."""
    q, k, cos, sin = _vision_views(torch.float32, seed, False)
    fn = rope_kernels.hf.apply_rotary_pos_emb_vision
    if case == "q 4-D":
        q = q[None]
    elif case == "k of other tokens":
        k = k[:6]
    elif case == "cos 3-D":
        cos, sin = cos[None], sin[None]
    elif case == "cos of other tokens":
        cos, sin = cos[:6], sin[:6]
    elif case == "cos wider than the head":
        cos = sin = randn((7, 18), torch.float32, seed)
    elif case == "k float64":
        k = k.double()
    elif case == "sin a list":
        sin = sin.tolist()
    else:
        q, fn = q.requires_grad_(True), rope_kernels.hf.apply_rotary_pos_emb_vision_inplace
    with pytest.raises(exc) as info:
        fn(q, k, cos, sin)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("heads,head_dim,interleaved,tile", [
    (16, 80, False, (1, 16, 2, True)),  # Qwen2.5-VL: loads first on 2 warps
    (16, 72, False, (1, 16, 2, False)),  # Qwen3-VL: whole rows (ROW 128)
    (16, 104, False, (1, 16, 2, False)),  # MLCD: whole rows
    (16, 64, True, (1, 16, 2, True)),  # Inkling 2: pairs as words, loads first on 2 warps
    (16, 96, False, None),  # Step 3.7: the rules' tile
    (12, 128, False, None),  # GLM-4V: the rules' tile
])
def test_vision_tiles(heads, head_dim, interleaved, tile, seed, gpu_plans, monkeypatch):
    """The vision functions' calls where a GPU plans them take ``_vision_tile``'s tile (None: the
    rules'), in the interpreter too, on a fused qkv's views whose strides are multiples of 8
    (``STRIDE_MULTIPLE`` 8 where the head is not a multiple of 16): results and gradients
    against float64; with ``VISION_TILES`` and ``STRIDE_MULTIPLES`` off, the same bits."""
    ours = (rope_kernels.hf.apply_rotary_pos_emb_vision_interleaved if interleaved
            else rope_kernels.hf.apply_rotary_pos_emb_vision)
    tokens = 3
    qkv = randn((tokens, 3 * heads * head_dim), torch.bfloat16, seed)
    cos, sin = (randn((tokens, head_dim), torch.float32, seed + i) for i in (1, 2))
    pairs = _VISION_PAIRS[ours]
    results = {}
    for switch in (True, False):
        monkeypatch.setattr(rope_qk, "VISION_TILES", switch)
        monkeypatch.setattr(rope_qk, "STRIDE_MULTIPLES", switch)
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        qkv_g = qkv.clone().requires_grad_(True)
        q, k, _ = qkv_g.view(tokens, 3, heads, head_dim).unbind(1)
        got = ours(q, k, cos, sin)
        (plan,) = rope_qk._PLANS.values()
        c = plan.constexprs
        found = (c["BLOCK_S"], c["BLOCK_H"], plan.num_warps, c["ALL_HEADS"])
        if switch:
            assert c["STRIDE_MULTIPLE"] == (8 if head_dim % 16 else 0)
            if tile is not None:
                assert found == tile
                assert c["ROW"] == (128 if head_dim % 16 else 0)
                assert c["LOADS_FIRST"] == tile[3]
            rules = found
        elif tile is None:
            assert found == rules  # (controls: the rules' tile either way)
        weights = [randn(g.shape, torch.float32, seed + 5 + i) for i, g in enumerate(got)]
        sum((g * w).sum() for g, w in zip(got, weights)).backward()
        q0, k0, _ = qkv.view(tokens, 3, heads, head_dim).unbind(1)
        q64, k64 = (x.double().requires_grad_(True) for x in (q0, k0))
        exact = [hf_reference(x, cos, sin, -2, pairs) for x in (q64, k64)]
        sum((e * w.to(torch.bfloat16).double()).sum() for e, w in zip(exact, weights)).backward()
        grad = qkv_g.grad.view(tokens, 3, heads, head_dim)
        for g, e, part in zip(got, exact, "qk"):
            assert_rope_close(g.detach(), e.detach(), torch.bfloat16, part)
        assert_rope_close(grad[:, 0], q64.grad, torch.bfloat16, "q.grad")
        assert_rope_close(grad[:, 1], k64.grad, torch.bfloat16, "k.grad")
        results[switch] = [g.detach() for g in got] + [grad.clone()]
    for a, b in zip(results[True], results[False]):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# Complex angles: Llama 4's and DeepSeek V2's apply_rotary_emb, Llama 4's vision_apply_rotary_emb
# ---------------------------------------------------------------------------------------------
modeling_llama4 = _Modeling("llama4")
modeling_deepseek_v2 = _Modeling("deepseek_v2")
# ours -> (transformers' module, the function's name there, q's heads axis, whether vision)
COMPLEX = {
    rope_kernels.hf.apply_rotary_emb_llama4: ("llama4", "apply_rotary_emb", 2, False),
    rope_kernels.hf.apply_rotary_emb_deepseek_v2: ("deepseek_v2", "apply_rotary_emb", 1, False),
    rope_kernels.hf.apply_rotary_emb_llama4_vision: ("llama4", "vision_apply_rotary_emb", 2, True),
}


def _complex_call(ours, dtype, seed, fused, b=2, s=7, heads=4, k_heads=2, head_dim=16):
    """xq, xk and the complex angles as the model of ``ours`` makes them. Llama 4's text and
    vision attention: ``[b, s, h, d]`` views of the projections, here of one fused qkv
    projection ``[b, s, (h + 2 h_k) d]`` (``fused``) or of separate ones; DeepSeek V2's: the
    rotary slice of the query heads ``[b, h, s, nope + d]`` and of the compressed kv ``[b, s,
    lora + d]`` (one key head), transposed. The angles: ``polar(r, theta)`` of random theta and
    magnitude r (the attention scaling), ``[b, s, d / 2]``; the vision function's of one image,
    ``[s, 1, d / 2]`` (its rotary module's shape). Returns (xq, xk, angles, their cos, sin as
    ``[b or 1, s, d / 2]`` float32, for the float64 formula)."""
    _, _, heads_axis, vision = COMPLEX[ours]
    if heads_axis == 1:
        nope, lora = 8, 24
        xq = randn((b, s, heads, nope + head_dim), dtype, seed)[..., nope:].transpose(1, 2)
        xk = randn((b, s, lora + head_dim), dtype, seed + 1)[..., lora:]
        xk = xk.reshape(b, s, 1, head_dim).transpose(1, 2)
    elif fused:
        qkv = randn((b, s, (heads + 2 * k_heads) * head_dim), dtype, seed)
        xq = qkv[..., : heads * head_dim].view(b, s, heads, head_dim)
        xk = qkv[..., heads * head_dim: (heads + k_heads) * head_dim].view(b, s, k_heads, head_dim)
    else:
        xq = randn((b, s, heads, head_dim), dtype, seed)
        xk = randn((b, s, k_heads, head_dim), dtype, seed + 1)
    tb = 1 if vision else b
    theta = randn((tb, s, head_dim // 2), torch.float32, seed + 2) * 3
    r = 0.5 + randn((tb, s, head_dim // 2), torch.float32, seed + 3).abs()
    freqs = torch.polar(r, theta)
    cos, sin = freqs.real.contiguous(), freqs.imag.contiguous()
    if vision:
        freqs = freqs.reshape(s, 1, head_dim // 2)
    return xq, xk, freqs, cos, sin


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "separate"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ours", list(COMPLEX), ids=lambda f: f.__name__)
def test_complex_matches_transformers_function(ours, dtype, fused, seed):
    """Ours against transformers' own function on the views its attention passes: within
    rounding of theirs (both compute in float32 and round once) and of the float64 formula; the
    inputs and the angles unchanged; the in-place variant returns the tensors given, holding the
    same bits."""
    module, name, heads_axis, _ = COMPLEX[ours]
    theirs = getattr(_modeling(module), name)
    in_place = getattr(rope_kernels.hf, ours.__name__ + "_inplace")
    xq, xk, freqs, cos, sin = _complex_call(ours, dtype, seed, fused)
    before = xq.clone(), xk.clone(), freqs.clone()
    got = ours(xq, xk, freqs)
    want = theirs(xq, xk, freqs)
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]
    for g, w, x, b4, part in zip(got, want, (xq, xk), before, "qk"):
        assert g.dtype == dtype and g.shape == x.shape
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=part)
        assert_rope_close(g, hf_reference(b4, cos, sin, heads_axis, "interleaved_per_pair"),
                          dtype, part)
        assert torch.equal(x, b4), part  # out of place: the inputs as they were
    assert torch.equal(freqs, before[2])
    result = in_place(xq, xk, freqs)
    assert result[0] is xq and result[1] is xk
    for x, g, part in zip((xq, xk), got, "qk"):
        assert torch.equal(x, g), f"{part} in place"


@pytest.mark.parametrize("ours", list(COMPLEX), ids=lambda f: f.__name__)
def test_complex_gradients(ours, seed):
    """The backward against the float64 gradient of the formula, for xq and for xk, through the
    views of their projections (the gradient lands in the projection's, the other parts zero)."""
    _, _, heads_axis, _ = COMPLEX[ours]
    xq, xk, freqs, cos, sin = _complex_call(ours, torch.float32, seed, True)
    base_q, base_k = xq._base, xk._base  # the projections the views are of
    leaves = [t.detach().clone().requires_grad_(True) for t in {id(base_q): base_q,
                                                                id(base_k): base_k}.values()]
    views = {id(base_q): leaves[0], id(base_k): leaves[-1]}
    q = views[id(base_q)].as_strided(xq.shape, xq.stride(), xq.storage_offset())
    k = views[id(base_k)].as_strided(xk.shape, xk.stride(), xk.storage_offset())
    got = ours(q, k, freqs)
    weights = [randn(g.shape, seed=seed + 7 + i) for i, g in enumerate(got)]
    sum((g * w).sum() for g, w in zip(got, weights)).backward()
    q64, k64 = (x.detach().double().requires_grad_(True) for x in (xq, xk))
    exact = [hf_reference(x, cos, sin, heads_axis, "interleaved_per_pair") for x in (q64, k64)]
    sum((e * w.double()).sum() for e, w in zip(exact, weights)).backward()
    for leaf, x, x64, part in ((views[id(base_q)], xq, q64, "xq"),
                               (views[id(base_k)], xk, k64, "xk")):
        grad = leaf.grad.as_strided(x.shape, x.stride(), x.storage_offset())
        assert_rope_close(grad, x64.grad, torch.float32, part + ".grad")
    total = sum(float(leaf.grad.abs().sum()) for leaf in leaves)
    assert total == pytest.approx(float(q64.grad.abs().sum() + k64.grad.abs().sum()), rel=1e-5)


def test_only_ours_computes_the_complex_functions(seed):
    """On each complex-angle call every function of ours that ``patch`` tries for that name but
    the matching one refuses or gives other numbers (Llama 4's text and vision functions are
    tried for their own names only: on one image's angles they compute the same), and the
    complex functions refuse the cos/sin functions' calls."""
    for ours, (module, name, _, _) in COMPLEX.items():
        xq, xk, freqs, _, _ = _complex_call(ours, torch.float32, seed, True)
        distances = rope_kernels.hf._distances(getattr(_modeling(module), name),
                                               (xq, xk, freqs), {}, name)
        assert distances.pop(ours) < 1e-5, ours.__name__
        assert all(isinstance(d, str) or d > 0.1 for d in distances.values()), distances
    assert rope_kernels.hf._candidates("vision_apply_rotary_emb") == [
        rope_kernels.hf.apply_rotary_emb_llama4_vision]
    q, k, cos, sin = _random_call(seed)
    d = rope_kernels.hf._distances(_their_function("llama"), (q, k, cos, sin), {})
    for ours in COMPLEX:
        assert isinstance(d.get(ours, "not tried"), str), (ours.__name__, d.get(ours))


def _tiny_llama4(seed):
    """(a tiny random Llama 4 text model, fp32, eager attention; token ids): 4 layers (3 of
    chunked attention with RoPE and qk-norm, one without RoPE), mixture of 2 experts, 4 query
    heads and 2 key heads of 16 channels."""
    torch.manual_seed(seed)
    module = _modeling("llama4")
    config = module.Llama4TextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, intermediate_size_mlp=96,
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_local_experts=2, num_experts_per_tok=1, max_position_embeddings=128,
        attention_chunk_size=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "eager"
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(seed))
    return module.Llama4ForCausalLM(config).to(DEVICE), ids.to(DEVICE)


def _tiny_deepseek_v2(seed):
    """(a tiny random DeepSeek V2, fp32, eager attention; token ids): ``_TINY_MLA``, q through a
    full-rank projection."""
    torch.manual_seed(seed)
    module = _modeling("deepseek_v2")
    config = module.DeepseekV2Config(**_TINY_MLA, q_lora_rank=None)
    config._attn_implementation = "eager"
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(seed))
    return module.DeepseekV2ForCausalLM(config).to(DEVICE), ids.to(DEVICE)


@pytest.mark.parametrize("arch", ["llama4", "deepseek_v2"])
def test_complex_tiny_models_unchanged_and_patched(arch, seed, monkeypatch):
    """A tiny Llama 4 (text) and DeepSeek V2: logits and every parameter's gradient match with
    ours assigned over ``apply_rotary_emb`` (called once a layer with RoPE: Llama 4's layers
    without RoPE skip it); ``patch`` assigns it there under that name (in bf16 too; Llama 4's
    ``vision_apply_rotary_emb``, not called, stays), ``inplace=True`` its in-place variant,
    whose greedy generation gives transformers' tokens; ``unpatch`` undoes it."""
    model, ids = _tiny_llama4(seed) if arch == "llama4" else _tiny_deepseek_v2(seed)
    module = _modeling(arch)
    ours = (rope_kernels.hf.apply_rotary_emb_llama4 if arch == "llama4"
            else rope_kernels.hf.apply_rotary_emb_deepseek_v2)
    theirs = module.apply_rotary_emb
    monkeypatch.setattr(module, "apply_rotary_emb", theirs)
    if arch == "llama4":
        monkeypatch.setattr(module, "vision_apply_rotary_emb", module.vision_apply_rotary_emb)
    calls = _swapped_calls_match(model, module, ids, monkeypatch, ours, "apply_rotary_emb")
    with_rope = (sum(model.config.no_rope_layers) if arch == "llama4"
                 else model.config.num_hidden_layers)
    assert calls == with_rope and 0 < with_rope
    monkeypatch.setattr(module, "apply_rotary_emb", theirs)
    _patched_under_its_name(model, module, ids, ours, "apply_rotary_emb")


def test_llama4_vision_encoder_unchanged_and_patched(seed, monkeypatch):
    """A tiny Llama 4 vision encoder (2 blocks, 4 heads of 16, 16 patches of a 32 x 32 image
    and the class token, 2 images): its output and every parameter's gradient match with ours
    assigned over ``vision_apply_rotary_emb``; ``patch`` given the images assigns it there (its
    in-place variant with ``inplace=True``); ``unpatch`` undoes it."""
    torch.manual_seed(seed)
    module = _modeling("llama4")
    config = module.Llama4VisionConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       intermediate_size=256, image_size=32, patch_size=8,
                                       vision_output_dim=64, projector_input_dim=64,
                                       projector_output_dim=64)
    config._attn_implementation = "eager"
    model = module.Llama4VisionModel(config).to(DEVICE)
    pixels = torch.randn((2, 3, 32, 32), generator=torch.Generator().manual_seed(seed))
    inputs = {"pixel_values": pixels.to(DEVICE)}
    theirs = module.vision_apply_rotary_emb
    monkeypatch.setattr(module, "vision_apply_rotary_emb", theirs)
    monkeypatch.setattr(module, "apply_rotary_emb", module.apply_rotary_emb)
    weights = randn((2, 16, 64), seed=seed + 1)  # (the encoder's output: 16 patches of 64)

    def output_and_grads():
        model.zero_grad()
        out = model(**inputs).last_hidden_state
        (out * weights[:, : out.shape[1]]).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                              if p.grad is not None}

    calls = _swapped_calls_match(model, module, None, monkeypatch,
                                 rope_kernels.hf.apply_rotary_emb_llama4_vision,
                                 "vision_apply_rotary_emb", output_and_grads)
    assert calls == config.num_hidden_layers
    monkeypatch.setattr(module, "vision_apply_rotary_emb", theirs)
    with torch.no_grad():
        out = model(**inputs).last_hidden_state

    for inplace in (False, True):
        patched = rope_kernels.hf.patch(model, inplace=inplace, example_inputs=inputs)
        suffix = "_inplace" if inplace else ""
        assert [(p.name, p.ours.__name__, p.theirs) for p in patched] == [
            ("vision_apply_rotary_emb", "apply_rotary_emb_llama4_vision" + suffix, theirs)]
        with torch.no_grad():
            torch.testing.assert_close(model(**inputs).last_hidden_state, out, rtol=1e-5,
                                       atol=1e-5)
        assert rope_kernels.hf.unpatch(model) == [module]
        assert module.vision_apply_rotary_emb is theirs


@pytest.mark.parametrize("case,exc,words", [
    ("freqs_cis real", TypeError, ["apply_rotary_emb_llama4: freqs_cis must be complex64",
                                   "got torch.float32"]),
    ("freqs_cis complex128", TypeError, ["freqs_cis must be complex64", "got torch.complex128"]),
    ("freqs_cis of other tokens", ValueError, [
        "freqs_cis must be [b or 1, s, head_dim / 2] with b = 2, s = 7, head_dim / 2 = 8",
        "got (2, 6, 8)"]),
    ("freqs_cis of the head's width", ValueError, ["head_dim / 2 = 8", "got (2, 7, 16)"]),
    ("xq 3-D", ValueError, ["xq and xk must be 4-D, [b, s, h, d]", "got shapes (7, 4, 16) and "
                                                                     "(2, 7, 2, 16)"]),
    ("xk of other tokens", ValueError, ["xk must match xq in batch, sequence and head_dim",
                                        "(2, 6, 2, 16)"]),
    ("xk float16", TypeError, ["xk must have xq's dtype (torch.float32), got torch.float16"]),
    ("xq float64", TypeError, ["xq must have dtype float32, float16 or bfloat16"]),
    ("odd head_dim", ValueError, ["head_dim must be even", "(2, 7, 4, 15)"]),
    ("freqs_cis a list", TypeError, ["freqs_cis must be a torch.Tensor (complex64 angles"]),
    ("freqs_cis requires grad", ValueError, ["freqs_cis requires grad", "freqs_cis.detach()"]),
    ("in place, xq requires grad", ValueError, ["apply_rotary_emb_llama4_inplace cannot rotate "
                                                "xq and xk that require grad",
                                                "use apply_rotary_emb_llama4"]),
    ("vision: freqs_ci of other patches", ValueError, [
        "apply_rotary_emb_llama4_vision: freqs_ci must hold one angle per patch and pair, "
        "s * head_dim / 2 = 7 * 8 entries", "got shape (6, 1, 8)"]),
    ("vision: key of other patches", ValueError, ["key must match query in batch, sequence",
                                                  "(2, 6, 2, 16)"]),
])
def test_complex_bad_input(case, exc, words, seed):
    """Errors name the argument as the caller's signature names it (xq, xk, freqs_cis; Llama 4
    vision's query, key, freqs_ci), what it must be and what it was given."""
    fn = rope_kernels.hf.apply_rotary_emb_llama4
    if case.startswith("vision"):
        fn = rope_kernels.hf.apply_rotary_emb_llama4_vision
    xq, xk, freqs, _, _ = _complex_call(fn, torch.float32, seed, False)
    if case == "freqs_cis real":
        freqs = freqs.real
    elif case == "freqs_cis complex128":
        freqs = freqs.to(torch.complex128)
    elif case == "freqs_cis of other tokens":
        freqs = freqs[:, :6]
    elif case == "freqs_cis of the head's width":
        freqs = torch.cat((freqs, freqs), -1)
    elif case == "xq 3-D":
        xq = xq[0]
    elif case == "xk of other tokens":
        xk = xk[:, :6]
    elif case == "xk float16":
        xk = xk.half()
    elif case == "xq float64":
        xq = xq.double()
    elif case == "odd head_dim":
        xq, xk = xq[..., :15], xk[..., :15]
    elif case == "freqs_cis a list":
        freqs = freqs.tolist()
    elif case == "freqs_cis requires grad":
        freqs = freqs.requires_grad_(True)
    elif case == "in place, xq requires grad":
        xq, fn = xq.requires_grad_(True), rope_kernels.hf.apply_rotary_emb_llama4_inplace
    elif case == "vision: freqs_ci of other patches":
        freqs = freqs[:6]
    elif case == "vision: key of other patches":
        xk = xk[:, :6]
    with pytest.raises(exc) as info:
        fn(xq, xk, freqs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("ours", list(COMPLEX), ids=lambda f: f.__name__)
def test_complex_gpu_plans(ours, seed, gpu_plans, monkeypatch):
    """The tiles a GPU plans for these calls, in the interpreter too: the angles' real and
    imaginary parts are read in place (float32 tables of stride 2, the sine one element after
    the cosine), at Llama 4's vision heads of 88 too (strides of 8 elements; the vision
    function on ``_vision_tile``'s tile); results against
    the float64 formula, the same bits as the cos/sin call of GPT-OSS's interleaved function on
    contiguous tables (which is what the complex functions are)."""
    heads_axis = COMPLEX[ours][2]
    for head_dim in (16, 88):
        monkeypatch.setattr(rope_qk, "_PLANS", {})
        xq, xk, freqs, cos, sin = _complex_call(ours, torch.bfloat16, seed, True, s=5,
                                                heads=3, head_dim=head_dim)
        got = ours(xq, xk, freqs)
        (plan,) = rope_qk._PLANS.values()
        c = plan.constexprs
        assert c["SIN_OFFSET"] == 1  # (sin read through cos's tensor: one address, aligned)
        if head_dim == 88:  # (pairs as words: strides of 44 words, 4 told)
            assert c["STRIDE_MULTIPLE"] == 4
            if COMPLEX[ours][3]:  # Llama 4's encoder: _vision_tile's, one token's 3 heads (4)
                assert (c["BLOCK_S"], c["BLOCK_H"], plan.num_warps, c["ALL_HEADS"]) == (
                    1, 4, 2, False)
        for g, x, part in zip(got, (xq, xk), "qk"):
            assert_rope_close(g, hf_reference(x, cos, sin, heads_axis, "interleaved_per_pair"),
                              torch.bfloat16, f"{part}, head_dim {head_dim}")
        same = rope_kernels.hf.apply_rotary_pos_emb_gpt_oss_interleaved(xq, xk, cos, sin,
                                                                       heads_axis)
        for g, w in zip(got, same):
            assert torch.equal(g, w), head_dim


def test_complex_angles_reused_across_layers(seed):
    """A model's layers pass one angle tensor: the second call reuses its cos and sin views
    (kept while the tensor is small), with the checks still made for the call's own xq and xk
    (named as before) and the angles' values as they are now (changed in place: the views see
    it); a tensor past ``_KEPT_ANGLES_NUMEL`` entries is not kept alive."""
    ours = rope_kernels.hf.apply_rotary_emb_llama4
    xq, xk, freqs, cos, sin = _complex_call(ours, torch.float32, seed, False)
    first = ours(xq, xk, freqs)
    assert rope_kernels.hf._LAST_ANGLES[0] is freqs
    again = ours(xq, xk, freqs)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    with pytest.raises(TypeError, match="xk must have xq's dtype"):
        ours(xq, xk.half(), freqs)
    with pytest.raises(ValueError, match=r"freqs_cis must be \[b or 1, s, head_dim / 2\]"):
        ours(xq[:, :5], xk[:, :5], freqs)
    freqs.mul_(torch.polar(torch.ones(()), torch.tensor(0.5)).to(freqs.device))  # in place
    turned = ours(xq, xk, freqs)
    for t, x in zip(turned, (xq, xk)):
        exact = hf_reference(x, freqs.real, freqs.imag, 2, "interleaved_per_pair")
        assert_rope_close(t, exact, torch.float32)
    vision = rope_kernels.hf.apply_rotary_emb_llama4_vision
    vq, vk, vfreqs, vcos, vsin = _complex_call(vision, torch.float32, seed, False)
    vision(vq, vk, vfreqs)
    assert rope_kernels.hf._LAST_ANGLES[0] is vfreqs
    with pytest.raises(ValueError, match="freqs_ci must hold one angle per patch and pair"):
        vision(vq[:, :5], vk[:, :5], vfreqs)
    big = torch.polar(torch.ones(1, 7, 8), torch.zeros(1, 7, 8)).to(xq.device)
    limit = rope_kernels.hf._KEPT_ANGLES_NUMEL
    try:
        rope_kernels.hf._KEPT_ANGLES_NUMEL = big.numel() - 1
        ours(xq[:1], xk[:1], big)
        assert rope_kernels.hf._LAST_ANGLES[0] is not big
    finally:
        rope_kernels.hf._KEPT_ANGLES_NUMEL = limit


def test_complex_angles_of_any_layout(seed):
    """Angles whose two parts are not side by side in memory (a conjugate view, a transposed
    tensor: transformers' function takes both) are read from a copy; and ``rope_cos_sin`` given
    the complex pairs with cos and sin that are not one tensor's parts (as torch.compile may pass
    them) reads them as two tables (``SIN_OFFSET`` 0), where one tensor's parts take 1: the same
    results, against transformers' function and the float64 formula."""
    theirs = _modeling("llama4").apply_rotary_emb
    ours = rope_kernels.hf.apply_rotary_emb_llama4
    xq, xk, freqs, cos, sin = _complex_call(ours, torch.float32, seed, False)
    transposed = freqs.transpose(1, 2).contiguous().transpose(1, 2)
    for case, angles in (("conjugate", freqs.conj()), ("transposed", transposed)):
        got = ours(xq, xk, angles)
        for g, w in zip(got, theirs(xq, xk, angles)):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=case)
    offsets = {}
    for case, (c, s_) in (("one tensor's parts", (freqs.real, freqs.imag)),
                          ("two tensors", (cos, sin))):
        rope_qk._PLANS.clear()
        got = rope_qk.rope_cos_sin(xq, xk, c, s_, 2, pairs="interleaved_complex")
        (plan,) = rope_qk._PLANS.values()
        offsets[case] = plan.constexprs["SIN_OFFSET"]
        for g, x in zip(got, (xq, xk)):
            assert_rope_close(g, hf_reference(x, cos, sin, 2, "interleaved_per_pair"),
                              torch.float32, case)
    assert offsets == {"one tensor's parts": 1, "two tensors": 0}


# ---------------------------------------------------------------------------------------------
# The SAM family's apply_rotary_pos_emb_2d: SAM 3's ViT, SAM 2 Video's memory attention
# ---------------------------------------------------------------------------------------------
SAM_2D = rope_kernels.hf.apply_rotary_pos_emb_2d
SAM_2D_INPLACE = rope_kernels.hf.apply_rotary_pos_emb_2d_inplace
# transformers' modules that define it: SAM 3's takes (q, k, cos, sin), the video models' two
# keyword arguments more
SAM_FAMILIES = ["sam3", "sam2_video", "sam3_tracker_video"]
_SAM_TOL = {torch.float32: 1e-6, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _sam_inputs(dtype, seed, k_tokens=6, tokens=6, heads=3, head_dim=16):
    """q ``[2, h, tokens, d]`` and k ``[2, h, k_tokens, d]``, the transposed views of ``[b, s, h,
    d]`` projections, as SAM's attention makes them; cos and sin ``[1, tokens, d]`` of random
    angles, one per pair repeat_interleaved, as its axial rotary module lays them out."""
    q = randn((2, tokens, heads, head_dim), dtype, seed).transpose(1, 2)
    k = randn((2, k_tokens, heads, head_dim), dtype, seed + 1).transpose(1, 2)
    angles = (3 * randn((1, tokens, head_dim // 2), torch.float32, seed + 2)).repeat_interleave(
        2, -1)
    return q, k, angles.cos(), angles.sin()


def _sam_reference(q, k, cos, sin, num_k_exclude_rope=0):
    """The float64 formula: Cohere's pairs, cos and sin one row per token (repeated over the
    frames of k's rotated tokens), k's last ``num_k_exclude_rope`` tokens as they are."""
    rotated = k.shape[2] - num_k_exclude_rope
    frames = rotated // q.shape[2]
    k_cos, k_sin = cos.repeat(1, frames, 1), sin.repeat(1, frames, 1)
    k_rot = hf_reference(k[:, :, :rotated], k_cos, k_sin, 1, "interleaved")
    return (hf_reference(q, cos, sin, 1, "interleaved"),
            torch.cat((k_rot, k[:, :, rotated:].double()), 2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("family", SAM_FAMILIES)
def test_sam_2d_matches_transformers(family, dtype, seed, monkeypatch):
    """SAM 3's ViT call (k's tokens q's, all rotated) in one launch, against each family's
    function in float64 and in the dtype and against the float64 formula; the in-place variant
    writes the same bits into q and k and returns them."""
    theirs = _modeling(family).apply_rotary_pos_emb_2d
    q, k, cos, sin = _sam_inputs(dtype, seed)
    launches = count_qk_launches(monkeypatch)
    ours = SAM_2D(q, k, cos, sin)
    assert len(launches) == 1
    exact = theirs(q.double(), k.double(), cos.double(), sin.double())
    in_dtype = theirs(q, k, cos, sin)
    for name, o, e, r, ref in zip("qk", ours, exact, in_dtype, _sam_reference(q, k, cos, sin)):
        assert o.dtype == dtype and o.shape == e.shape, name
        assert_rope_close(o, e, dtype, f"{name} against theirs in float64")
        assert_rope_close(o, ref, dtype, f"{name} against the formula")
        torch.testing.assert_close(o, r, rtol=_SAM_TOL[dtype], atol=_SAM_TOL[dtype])
    q_in, k_in = q.clone(), k.clone()
    launches.clear()
    got = SAM_2D_INPLACE(q_in, k_in, cos, sin)
    assert got[0] is q_in and got[1] is k_in and len(launches) == 1
    assert torch.equal(q_in, ours[0]) and torch.equal(k_in, ours[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["sam2_video", "sam3_tracker_video"])
@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("frames, excluded", [
    (1, 4),  # object pointers passed through
    (3, 0),  # a memory of 3 frames, the angles repeated over them
    (3, 4),  # both, as the memory attention's cross-attention calls it
    (0, 5),  # every key passed through: q alone
])
def test_sam_2d_memory_attention(family, dtype, heads, frames, excluded, seed, monkeypatch):
    """SAM 2 Video's memory attention (``num_k_exclude_rope``: k's last tokens not rotated;
    ``repeat_freqs_k``: k's rotated tokens the frames of a memory, each frame at q's angles)
    against transformers' function in float64 and in the dtype and the float64 formula: k's
    passed tokens bit for bit. One launch, the frames viewed as heads of k (its one head, as
    SAM 2 Video's); two (q, then k on repeated angles) where k's strides allow no such view
    (several heads of a transposed projection). In place the same bits and launches, k's passed
    tokens neither read nor written."""
    launched = 2 if heads > 1 and frames > 1 else 1
    theirs = _modeling(family).apply_rotary_pos_emb_2d
    q, k, cos, sin = _sam_inputs(dtype, seed, k_tokens=frames * 6 + excluded, heads=heads)
    kw = dict(num_k_exclude_rope=excluded, repeat_freqs_k=True)
    launches = count_qk_launches(monkeypatch)
    ours = SAM_2D(q, k, cos, sin, **kw)
    assert len(launches) == launched
    exact = theirs(q.double(), k.double(), cos.double(), sin.double(), **kw)
    in_dtype = theirs(q, k, cos, sin, **kw)
    for name, o, e, r, ref in zip("qk", ours, exact, in_dtype,
                                  _sam_reference(q, k, cos, sin, excluded)):
        assert o.dtype == dtype and o.shape == e.shape, name
        assert_rope_close(o, e, dtype, f"{name} against theirs in float64")
        assert_rope_close(o, ref, dtype, f"{name} against the formula")
        torch.testing.assert_close(o, r, rtol=_SAM_TOL[dtype], atol=_SAM_TOL[dtype])
    passed = k.shape[2] - excluded
    assert torch.equal(ours[1][:, :, passed:], k[:, :, passed:])
    # in place: k's passed tokens NaN, so that reading them would show
    q_in, k_in = q.clone(), k.clone()
    k_in[:, :, passed:] = float("nan")
    launches.clear()
    got = SAM_2D_INPLACE(q_in, k_in, cos, sin, **kw)
    assert got[0] is q_in and got[1] is k_in and len(launches) == launched
    assert torch.equal(q_in, ours[0]) and torch.equal(k_in[:, :, :passed], ours[1][:, :, :passed])
    assert k_in[:, :, passed:].isnan().all()


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("frames, excluded", [(1, 0), (3, 4)])
def test_sam_2d_gradient(frames, excluded, heads, seed):
    """The gradient with respect to q and k against autograd through transformers' SAM 2 Video
    function in float64: SAM 3's call and the memory attention's (the passed tokens' gradient
    the incoming one)."""
    theirs = _modeling("sam2_video").apply_rotary_pos_emb_2d
    q, k, cos, sin = _sam_inputs(torch.float32, seed, k_tokens=frames * 6 + excluded,
                                 heads=heads)
    kw = dict(num_k_exclude_rope=excluded, repeat_freqs_k=True)
    ours = [x.clone().requires_grad_(True) for x in (q, k)]
    ref = [x.double().requires_grad_(True) for x in (q, k)]
    weights = [randn(x.shape, torch.float32, seed + 5 + i) for i, x in enumerate((q, k))]
    sum((o * w).sum() for o, w in zip(SAM_2D(*ours, cos, sin, **kw), weights)).backward()
    sum((o * w.double()).sum() for o, w in zip(theirs(*ref, cos.double(), sin.double(), **kw),
                                               weights)).backward()
    for name, o, r in zip("qk", ours, ref):
        assert_rope_close(o.grad, r.grad, torch.float32, f"d{name}")


def test_sam_2d_bad_input(seed):
    """Each bad argument named, with what was expected and what was given."""
    q, k, cos, sin = _sam_inputs(torch.float32, seed)
    cases = [
        (dict(num_k_exclude_rope=-1), ValueError, r"num_k_exclude_rope must be in \[0, 6\]"),
        (dict(num_k_exclude_rope=7), ValueError, r"num_k_exclude_rope must be in \[0, 6\]"),
        (dict(num_k_exclude_rope=True), TypeError, "num_k_exclude_rope must be an int"),
        (dict(k=randn((2, 3, 12, 16), torch.float32, seed)), ValueError,
         r"k's rotated tokens \(12 less num_k_exclude_rope = 0: 12\) must be q's 6, or, with "
         r"repeat_freqs_k=True, a multiple"),
        (dict(k=randn((2, 3, 10, 16), torch.float32, seed), repeat_freqs_k=True), ValueError,
         "a multiple of them"),
        (dict(cos=cos.expand(2, 6, 16), sin=sin.expand(2, 6, 16)), ValueError,
         r"cos and sin must have one shape, \[1, tokens, head_dim\]"),
        (dict(cos=cos[..., :8], sin=sin[..., :8]), ValueError, "covering the whole head"),
        (dict(q=q[0]), ValueError, "q and k must be 4-D"),
        (dict(k=k[:, :2]), ValueError, "k must match q in batch, heads and head_dim"),
        (dict(cos=cos.tolist()), TypeError, "cos must be a torch.Tensor"),
    ]
    for changes, exc, words in cases:
        args = {**dict(q=q, k=k, cos=cos, sin=sin), **changes}
        for fn in (SAM_2D, SAM_2D_INPLACE):
            with pytest.raises(exc, match=words):
                fn(**{n: (v.clone() if isinstance(v, torch.Tensor) and n in "qk" else v)
                      for n, v in args.items()})
    with pytest.raises(ValueError, match="apply_rotary_pos_emb_2d_inplace cannot rotate q and "
                                         "k that require grad"):
        SAM_2D_INPLACE(q.clone().requires_grad_(True), k.clone(), cos, sin)
    k_long = randn((2, 3, 14, 16), torch.float32, seed)
    q_in = q.clone()
    with pytest.raises(ValueError, match="cannot rotate q and k that require grad"):
        SAM_2D_INPLACE(q_in, k_long.requires_grad_(True), cos, sin, num_k_exclude_rope=2,
                       repeat_freqs_k=True)
    assert torch.equal(q_in, q)  # refused before anything was written


def test_only_ours_computes_sams_and_only_for_its_name(seed):
    """``patch`` tries the SAM function for ``apply_rotary_pos_emb_2d`` alone, and it computes
    SAM 3's and the memory attention's calls; for the other names it is not tried (on cos of
    one batch row it computes what Cohere's function computes)."""
    q, k, cos, sin = _sam_inputs(torch.float32, seed, k_tokens=16)
    assert rope_kernels.hf._candidates("apply_rotary_pos_emb_2d") == [SAM_2D]
    assert SAM_2D not in rope_kernels.hf._candidates("apply_rotary_pos_emb")
    theirs = _modeling("sam2_video").apply_rotary_pos_emb_2d
    kw = dict(num_k_exclude_rope=4, repeat_freqs_k=True)
    distances = rope_kernels.hf._distances(theirs, (q, k, cos, sin), kw,
                                           "apply_rotary_pos_emb_2d")
    assert list(distances) == [SAM_2D] and distances[SAM_2D] < 1e-6
    cohere = rope_kernels.hf.apply_rotary_pos_emb_interleaved
    same = rope_kernels.hf._distances(_modeling("sam3").apply_rotary_pos_emb_2d,
                                      (q, k[:, :, :6], cos, sin), {}, "apply_rotary_pos_emb")
    assert same[cohere] < 1e-6  # (hence tried for its own name only)


def test_tiny_sam3_vit_through_patch(seed):
    """A tiny random SAM 3 ViT (a windowed and a global layer) patched: its call found, ours
    assigned, the last hidden state as transformers' in fp32 and in place; unpatched after.
    transformers' SAM 3 classes need torchvision: skipped where it is missing."""
    pytest.importorskip("torchvision", reason="transformers' SAM 3 classes need torchvision")
    module = _modeling("sam3")
    config = transformers.models.sam3.configuration_sam3.Sam3ViTConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        image_size=56, patch_size=14, window_size=2, global_attn_indexes=[1],
        pretrain_image_size=56)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = module.Sam3ViTModel(config).to(DEVICE).eval()
    pixels = randn((1, 3, 56, 56), torch.float32, seed)
    with torch.no_grad():
        want = model(pixel_values=pixels).last_hidden_state
    for inplace in (False, True):
        chosen = rope_kernels.hf.patch(model, inplace=inplace,
                                       example_inputs={"pixel_values": pixels})
        try:
            assert [(p.module, p.name) for p in chosen] == [(module, "apply_rotary_pos_emb_2d")]
            assert chosen[0].ours is (SAM_2D_INPLACE if inplace else SAM_2D)
            with torch.no_grad():
                got = model(pixel_values=pixels).last_hidden_state
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        finally:
            assert rope_kernels.hf.unpatch(model) == [module]
    assert module.apply_rotary_pos_emb_2d is chosen[0].theirs
