"""Hugging Face transformers' convention: ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``.

transformers' models rotate q and k with cos and sin that the model's rotary module has already
computed, attention scaling folded in, in the model's dtype, through a module-level function of
this signature. Six conventions share it (which channels are paired, how wide cos and sin are,
the sign of the rotation), so there are six such functions here, each with the signature and
results of transformers' own, q and k in one launch, differentiable and traceable by
``torch.compile``, so that a model can use it by assignment::

    import transformers.models.llama.modeling_llama as llama
    import rope_kernels.hf
    llama.apply_rotary_pos_emb = rope_kernels.hf.apply_rotary_pos_emb

- ``apply_rotary_pos_emb``: Llama's (and GPT-NeoX's, whose cos may be narrower than head_dim):
  channel j paired with j + rotary_dim/2 (``rotate_half`` of the two halves). Most models: Llama,
  Mistral, Qwen, Gemma, Phi-3, GPT-NeoX and the many that copy Llama's function.
- ``apply_rotary_pos_emb_interleaved``: Cohere's (Cohere, Cohere2, BLT, GLM-4V, GLM-OCR, Ernie 4.5
  VL): channels 2j and 2j+1 paired, cos and sin of each channel as given (their rotary module
  repeat_interleaves them); cos narrower than the head rotates part of it (GLM-4V's, GLM-OCR's).
- ``apply_rotary_pos_emb_glm``: GLM's (GLM, GLM-4, Helium, Ernie 4.5, Moonshine): channels 2j
  and 2j+1 paired over the first ``cos.shape[-1]`` channels, pair j's cos and sin read at channel
  j of cos and sin in Llama's layout (their function takes the first half and repeat_interleaves
  it), the rest of the head copied.
- ``apply_rotary_pos_emb_gpt_oss``: GPT-OSS's: channel j paired with j + head_dim/2, by cos and
  sin of one entry per pair, ``[b, s, head_dim / 2]`` (its rotary module does not duplicate
  them), the whole head rotated.
- ``apply_rotary_pos_emb_gpt_oss_interleaved``: OpenAI's privacy filter's: the same cos and sin,
  channels 2j and 2j+1 paired.
- ``apply_rotary_pos_emb_nanochat``: NanoChat's: Llama's pairs and tables, rotated by -theta (its
  ``rotate_half`` returns ``cat(x2, -x1)``, the opposite sign of Llama's).

One more takes q and k, under a name of its own:

- ``apply_rotary_pos_emb_deepseek(q, k, cos, sin, position_ids=None, unsqueeze_dim=1)``: DeepSeek
  V3's ``apply_rotary_pos_emb_interleave``, which 11 more of transformers 5.24's modeling modules
  copy (``deepseek_v32``, ``glm4_moe_lite``, ``glm_moe_dsa``, ``longcat_flash``, ``mistral4``,
  ``mistral_large4``, ``bailing_hybrid``, ``youtu``, ``axk1``, ``axk2``, ``dots3_note``;
  ``tests/test_hf.py`` checks each): their attention calls it, not
  ``apply_rotary_pos_emb``, when ``config.rope_interleave`` is set (DeepSeek V3's default), on the
  rotary slice of q and k. Channels 2j and 2j+1 paired by pair j's cos and sin read at channel j
  (GLM's), and each pair's results written to channels j and j + d/2: the rotation, then the
  channels de-interleaved (the same permutation of q and k leaves q . k unchanged). The whole
  head is rotated; k may be None (Mistral Large 4's layers that share another's keys), then
  ``(q_embed, None)``.

Two more rotate the patches of a vision encoder, transformers' ``apply_rotary_pos_emb_vision(q,
k, cos, sin)``: q and k ``[tokens, heads, head_dim]`` (the patches of every image packed, no batch
axis), cos and sin ``[tokens, rotary_dim]`` (float32: the vision rotary modules compute them so),
computed in float32 and returned in q's dtype:

- ``apply_rotary_pos_emb_vision``: Llama's pairing, the function of Qwen2-VL's vision encoder
  that 24 more of transformers 5.24's modeling modules copy (``qwen2_5_vl``, ``qwen2_5_omni``,
  ``qwen3_vl``, ``qwen3_vl_moe``, ``qwen3_omni_moe``, ``qwen3_5``, ``qwen3_5_moe``,
  ``qwen4_exp``, ``glm4v``, ``glm4v_moe``, ``glm5_next``, ``glm_ocr``, ``kimi_k25``,
  ``paddleocr_vl``, ``ernie4_5_vl_moe``, ``exaone4_5``, ``lfm3_vl``, ``mlcd``, ``step3p7``,
  ``video_llama_3``, ``dots3_note``, ``cohere_compass``, ``muse_glimmer``, ``muse_spark``), and
  MiniMax M3 VL's (``minimax_m3_vl``: cos narrower than the head, the rest copied; it computes
  in the model's dtype, so 16-bit results may differ from it by rounding);
- ``apply_rotary_pos_emb_vision_interleaved``: Inkling 2's (``inkling2``): channels 2j and 2j+1
  paired, cos and sin repeat_interleaved (Cohere's pairing).

Three more rotate one tensor a call, with signatures of their own:

- ``apply_rotary_pos_emb_gemma4(x, cos, sin, unsqueeze_dim=1)``: Gemma 3n's and Gemma 4's (Gemma 4
  unified's, DiffusionGemma's): Llama's pairing and cos, q and k rotated by separate calls (each
  after its own norm; k may come from another layer's cache).
- ``apply_rotary_pos_emb_gptj(tensor, sin, cos)``: GPT-J's and CodeGen's: channels 2j and 2j+1
  paired by sin and cos of one entry per pair, ``[b, s, d / 2]``, sin first; ``tensor``
  ``[b, s, h, d]``, the rotated slice of q or k.
- ``apply_rotary_pos_emb_deepseek_v4(x, cos, sin, unsqueeze_dim=1)``: DeepSeek V4's: heads laid
  out ``[nope | rope]``, the last ``2 * cos.shape[-1]`` channels rotated with channels 2j and
  2j+1 of that slice paired by cos and sin of one entry per pair, the rest copied.

Three more take the model's angles as complex numbers, ``cos + i sin`` of each pair's angle
(complex64, the rotary module's ``torch.polar``), and rotate channels 2j and 2j+1 as a complex
number times it (GPT-J's interleaved pairs), in float32; the kernel reads the real and imaginary
parts in place as its cos and sin:

- ``apply_rotary_emb_llama4(xq, xk, freqs_cis)``: Llama 4's text model's ``apply_rotary_emb``,
  xq ``[b, s, h, d]``, freqs_cis ``[b, s, d / 2]``;
- ``apply_rotary_emb_deepseek_v2(xq, xk, freqs_cis)``: DeepSeek V2's ``apply_rotary_emb`` (the
  same name and signature), xq ``[b, h, s, d]``, the rotary slice of the queries;
- ``apply_rotary_emb_llama4_vision(query, key, freqs_ci)``: Llama 4's vision encoder's
  ``vision_apply_rotary_emb``, query ``[images, patches, h, d]``, one angle per patch and pair.

And the SAM family's ``apply_rotary_pos_emb_2d(q, k, cos, sin, num_k_exclude_rope=0,
repeat_freqs_k=False)`` (SAM 3's ViT; SAM 2 Video's and SAM 3 Tracker Video's memory attention,
which may leave k's last tokens unrotated and repeat the angles over the frames of its memory):
Cohere's pairing with one row of cos and sin per token, ``[1, s, d]``.

Assigning one over a model's function of another convention gives wrong results without an error
(the signatures are the same; GPT-OSS's narrower cos would pass for Llama's partial rotary):
check the model's ``rotate_half`` (``x[..., ::2]`` is interleaved, ``cat(x2, -x1)`` NanoChat's
sign), whether its function repeat_interleaves cos, and how wide cos is. ``tests/test_hf.py``
checks each family named here against transformers' own function, and that the other functions
do not compute it.

Each has an ``_inplace`` variant for inference (generation under ``torch.no_grad()``, serving),
which rotates q and k where they lie and returns them, as Liger-Kernel's ``liger_rotary_pos_emb``
does: no new tensors, and it too can be assigned over a model's function, but it refuses q and k
that need a gradient (the out-of-place function is the differentiable one).

``patch(model)`` does the choosing and the assigning for a model instance: it runs the model once
on a few tokens, takes the arguments of the first call its attention makes to its module's
``apply_rotary_pos_emb`` (``apply_rotary_pos_emb_interleave``, ``apply_rotary_pos_emb_vision``,
``apply_rotary_emb``, ``vision_apply_rotary_emb``, ``apply_rotary_pos_emb_2d``), and assigns
the one function of ours that computes transformers' result on them (checked against
transformers' function in float64); it raises, and changes nothing, where none does or where
the call cannot tell them apart. ``unpatch(model)`` puts transformers' functions back.
"""

from __future__ import annotations

import sys
import types
from typing import Callable, NamedTuple, Optional

import torch

from . import _ops
from . import api as _api
from . import rope_qk as _qk
from ._validate import (validate_2d_args, validate_complex_args, validate_hf_args,
                        validate_in_place, validate_vision_args)

__all__ = ["apply_rotary_pos_emb", "apply_rotary_pos_emb_glm", "apply_rotary_pos_emb_interleaved",
           "apply_rotary_pos_emb_gpt_oss", "apply_rotary_pos_emb_gpt_oss_interleaved",
           "apply_rotary_pos_emb_nanochat",
           "apply_rotary_pos_emb_inplace", "apply_rotary_pos_emb_glm_inplace",
           "apply_rotary_pos_emb_interleaved_inplace", "apply_rotary_pos_emb_gpt_oss_inplace",
           "apply_rotary_pos_emb_gpt_oss_interleaved_inplace",
           "apply_rotary_pos_emb_nanochat_inplace", "apply_rotary_pos_emb_gemma4",
           "apply_rotary_pos_emb_gemma4_inplace", "apply_rotary_pos_emb_gptj",
           "apply_rotary_pos_emb_gptj_inplace", "apply_rotary_pos_emb_deepseek_v4",
           "apply_rotary_pos_emb_deepseek_v4_inplace", "apply_rotary_pos_emb_deepseek",
           "apply_rotary_pos_emb_deepseek_inplace", "apply_rotary_pos_emb_vision",
           "apply_rotary_pos_emb_vision_inplace", "apply_rotary_pos_emb_vision_interleaved",
           "apply_rotary_pos_emb_vision_interleaved_inplace", "apply_rotary_emb_llama4",
           "apply_rotary_emb_llama4_inplace", "apply_rotary_emb_deepseek_v2",
           "apply_rotary_emb_deepseek_v2_inplace", "apply_rotary_emb_llama4_vision",
           "apply_rotary_emb_llama4_vision_inplace", "apply_rotary_pos_emb_2d",
           "apply_rotary_pos_emb_2d_inplace", "patch", "unpatch", "Patched"]

_Tensor = torch.Tensor
_INTERLEAVED = frozenset(pairs for pairs, (_, interleaved, _) in _qk.HF_PAIRS.items() if interleaved)
_INTERLEAVED |= {key for key, pairs in (*_qk.VISION_PAIRS.items(), *_qk.COMPLEX_PAIRS.items())
                 if pairs in _INTERLEAVED}
_IN_PLACE_NAMES = {"half": "apply_rotary_pos_emb_inplace",
                   "interleaved": "apply_rotary_pos_emb_interleaved_inplace",
                   "glm": "apply_rotary_pos_emb_glm_inplace",
                   "half_per_pair": "apply_rotary_pos_emb_gpt_oss_inplace",
                   "interleaved_per_pair": "apply_rotary_pos_emb_gpt_oss_interleaved_inplace",
                   "half_negated": "apply_rotary_pos_emb_nanochat_inplace",
                   "deepseek": "apply_rotary_pos_emb_deepseek_inplace"}


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' Llama function.

    Args:
        q: ``[b, h_q, s, d]`` (``unsqueeze_dim=1``) or ``[b, s, h_q, d]`` (``unsqueeze_dim=2``),
            float32/float16/bfloat16, any strides (the usual transposed projection views too).
        k: the same with its own head count (grouped-query attention).
        cos, sin: ``[b, s, rotary_dim]`` (or ``[s, rotary_dim]``, or batch 1 for all), the
            rotary module's output: half-split layout ``cat(freqs, freqs)``, any float dtype;
            ``rotary_dim <= d``, channels past it are copied (GPT-NeoX's partial rotary).
        unsqueeze_dim: the axis of q and k that holds the heads.

    Returns:
        New ``(q_embed, k_embed)`` of q's and k's shapes and dtype, laid out as transformers'
        functions lay out theirs: like q and k where cos covers the whole head (Llama's: for the
        usual transposed projection views, each token's heads side by side), contiguous where
        it covers part of it (GPT-NeoX's). Computed in float32 from the given cos and sin
        (transformers computes in the model's dtype, so 16-bit results may differ from it by an
        ulp). Differentiable with respect to q and k.
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "half")


def apply_rotary_pos_emb_interleaved(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                     sin: torch.Tensor, unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' Cohere function:
    channels 2j and 2j+1 rotated together, each channel by its own cos and sin entry (the
    model's rotary module repeat_interleaves them, so both channels of a pair read the same
    angle). With cos narrower than the head, the first ``cos.shape[-1]`` channels are rotated and
    the rest copied, as GLM-4V's and GLM-OCR's function does (Cohere's multiplies q by cos whole,
    so its cos covers the head).

    Args and returns as ``apply_rotary_pos_emb``. Computed in float32 and returned in q's dtype,
    as Cohere's function does.
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "interleaved")


def apply_rotary_pos_emb_glm(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                             sin: torch.Tensor, unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' GLM function: cos and
    sin in Llama's layout ``[b, s, rotary_dim]`` (``cat(freqs, freqs)``), of which pair j takes
    entry j; channels 2j and 2j+1 rotated together over the first ``rotary_dim`` channels, the
    rest copied (GLM's partial rotary; Helium's and Ernie 4.5's function is the same with the
    whole head rotated).

    Args and returns as ``apply_rotary_pos_emb``: results laid out like q where cos covers the
    whole head, contiguous where it covers part of it (GLM's function ends in ``torch.cat``, so
    its results are contiguous even with the whole head rotated; the values are the same).
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "glm")


def apply_rotary_pos_emb_gpt_oss(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                 sin: torch.Tensor, unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' GPT-OSS function:
    channel j rotated with j + head_dim/2 by pair j's cos and sin, which are ``[b, s,
    head_dim / 2]`` (``[s, head_dim / 2]`` and batch 1 too): one entry per pair, not duplicated
    as Llama's are. The whole head is rotated.

    Args and returns as ``apply_rotary_pos_emb``, but ``cos.shape[-1]`` must be head_dim / 2
    (raises ValueError otherwise). The results are laid out like q (transformers' ends in
    ``torch.cat``, so its are contiguous; the values are the same). Computed in float32.
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "half_per_pair")


def apply_rotary_pos_emb_gpt_oss_interleaved(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                             sin: torch.Tensor, unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' function of OpenAI's
    privacy filter (``openai_privacy_filter``): GPT-OSS's cos and sin, ``[b, s, head_dim / 2]``,
    one entry per pair, with channels 2j and 2j+1 paired.

    Args and returns as ``apply_rotary_pos_emb_gpt_oss``.
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "interleaved_per_pair")


def apply_rotary_pos_emb_nanochat(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                  sin: torch.Tensor, unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' NanoChat function:
    Llama's pairs and layout of cos and sin, rotated the other way (by -theta: NanoChat's
    ``rotate_half`` is ``cat(x2, -x1)``, Llama's ``cat(-x2, x1)``). Equal to
    ``apply_rotary_pos_emb(q, k, cos, -sin)`` without computing ``-sin``.

    Args and returns as ``apply_rotary_pos_emb`` (cos narrower than head_dim rotates part of the
    head, as there).
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "half_negated")


def apply_rotary_pos_emb_deepseek(q: torch.Tensor, k: Optional[torch.Tensor], cos: torch.Tensor,
                                  sin: torch.Tensor, position_ids=None, unsqueeze_dim: int = 1):
    """RoPE on q and k with the model's cos and sin, as ``transformers``' DeepSeek V3 function
    ``apply_rotary_pos_emb_interleave`` (called where ``config.rope_interleave`` is set): channels
    2j and 2j+1 rotated together by pair j's cos and sin, read at channel j of cos and sin in
    Llama's layout (``cat(freqs, freqs)``: the first half), and the pair's two results written
    to channels j and j + d/2 (``cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin])`` of the even
    and odd channels q1, q2). Assign it over that name::

        import transformers.models.deepseek_v3.modeling_deepseek_v3 as deepseek_v3
        deepseek_v3.apply_rotary_pos_emb_interleave = rope_kernels.hf.apply_rotary_pos_emb_deepseek

    Args:
        q: ``[b, h_q, s, d]`` (``unsqueeze_dim=1``) or ``[b, s, h_q, d]`` (``unsqueeze_dim=2``): the
            rotary slice of the queries (``qk_rope_head_dim`` channels), any strides.
        k: the same with its own head count (DeepSeek's one shared key head), or None (Mistral
            Large 4's function, which takes None where a layer reuses another's rotated keys).
        cos, sin: ``[b, s, d]`` (or ``[s, d]``, or batch 1 for all), Llama's layout; only the
            first half is read, as transformers' function reads it. ``cos.shape[-1]`` must be d
            (transformers' function broadcasts its first half against q's d/2 even channels).
        position_ids: ignored, as transformers' function ignores it (it is in its signature).
        unsqueeze_dim: the axis of q and k that holds the heads.

    Returns:
        New ``(q_embed, k_embed)`` (``k_embed`` None where k is None), laid out like q and k
        (transformers' end in ``torch.cat``, so are contiguous; the values are the same).
        Computed in float32. Differentiable with respect to q and k.
    """
    if k is None:
        return _apply_one(q, cos, sin, unsqueeze_dim, "deepseek", "q"), None
    return _apply(q, k, cos, sin, unsqueeze_dim, "deepseek")


def apply_rotary_pos_emb_deepseek_inplace(q: torch.Tensor, k: Optional[torch.Tensor],
                                          cos: torch.Tensor, sin: torch.Tensor, position_ids=None,
                                          unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_deepseek`` writing into q and k (k may be None), as
    ``apply_rotary_pos_emb_inplace``: returns ``(q, k)``, the tensors given, rotated, with each
    pair's results in channels j and j + d/2 of its head."""
    if k is None:
        return _apply_one(q, cos, sin, unsqueeze_dim, "deepseek", "q",
                          "apply_rotary_pos_emb_deepseek_inplace"), None
    return _apply(q, k, cos, sin, unsqueeze_dim, "deepseek", True)


def apply_rotary_pos_emb_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                 sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb`` writing into q and k: one launch, no allocation.

    Args as ``apply_rotary_pos_emb``. q and k must not need a gradient (raises ValueError: use
    ``apply_rotary_pos_emb``, which is differentiable), nor have elements that share memory
    (a stride of 0, or k the same tensor as q).

    Returns:
        ``(q, k)``, the tensors given, rotated; channels past ``rotary_dim`` are neither read
        nor written (so an in-place call with half the head rotated moves half the bytes).
    """
    return _apply(q, k, cos, sin, unsqueeze_dim, "half", True)


def apply_rotary_pos_emb_interleaved_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                             sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_interleaved`` (Cohere's) writing into q and k, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "interleaved", True)


def apply_rotary_pos_emb_glm_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                     sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_glm`` (GLM's) writing into q and k, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "glm", True)


def apply_rotary_pos_emb_gpt_oss_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                         sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_gpt_oss`` writing into q and k, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "half_per_pair", True)


def apply_rotary_pos_emb_gpt_oss_interleaved_inplace(q: torch.Tensor, k: torch.Tensor,
                                                     cos: torch.Tensor, sin: torch.Tensor,
                                                     unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_gpt_oss_interleaved`` (OpenAI's privacy filter's) writing into q
    and k, as ``apply_rotary_pos_emb_inplace``."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "interleaved_per_pair", True)


def apply_rotary_pos_emb_nanochat_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                          sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_nanochat`` writing into q and k, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply(q, k, cos, sin, unsqueeze_dim, "half_negated", True)


def apply_rotary_pos_emb_gemma4(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                unsqueeze_dim: int = 1):
    """RoPE on one tensor with the model's cos and sin, as ``transformers``' Gemma 3n and Gemma 4
    function (Gemma 4 unified's and DiffusionGemma's are the same): Llama's pairing and layout of
    cos and sin, ``x * cos + rotate_half(x) * sin``, one tensor a call (their attention rotates
    q and k apart, each after its own norm).

    Args:
        x: ``[b, h, s, d]`` (``unsqueeze_dim=1``) or ``[b, s, h, d]`` (``unsqueeze_dim=2``, what
            their attention passes), float32/float16/bfloat16, any strides.
        cos, sin: as ``apply_rotary_pos_emb``'s (narrower than d: the rest of the head copied).
        unsqueeze_dim: the axis of x that holds the heads.

    Returns:
        A new tensor of x's shape and dtype, laid out like x where cos covers the whole head
        (contiguous where it covers part of it). Computed in float32. Differentiable with
        respect to x.
    """
    return _apply_one(x, cos, sin, unsqueeze_dim, "half", "x")


def apply_rotary_pos_emb_gptj(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor):
    """RoPE on one tensor, as ``transformers``' GPT-J function (CodeGen's is the same): channels 2j
    and 2j+1 rotated together by pair j's sin and cos (``rotate_every_two``; the function
    repeat_interleaves them). Note the order: sin, then cos.

    Args:
        tensor: ``[b, s, h, d]``: the part of q or k that GPT-J rotates (``q[..., :rotary_dim]``,
            a view), float32/float16/bfloat16, any strides.
        sin, cos: ``[b, s, d / 2]`` (or ``[s, d / 2]``, or batch 1 for all), one entry per pair.

    Returns:
        A new tensor of ``tensor``'s shape and dtype, laid out like it. Computed in float32.
        Differentiable with respect to ``tensor``.
    """
    return _apply_one(tensor, cos, sin, 2, "interleaved_per_pair", "tensor")


def apply_rotary_pos_emb_deepseek_v4(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                     unsqueeze_dim: int = 1):
    """RoPE on one tensor, as ``transformers``' DeepSeek V4 function (its module's
    ``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=1)``): each head is laid out ``[nope |
    rope]``, and its last ``2 * cos.shape[-1]`` channels are rotated, channels 2j and 2j+1 of
    that slice paired by pair j's cos and sin (one entry per pair; their function
    repeat_interleaves them), as ``apply_rotary_pos_emb_gpt_oss_interleaved`` pairs them. The
    channels before the slice are copied. Its attention calls it on q, on the shared key-value
    head, on the compressed keys, and with ``-sin`` on the attention's output.

    Args:
        x: ``[b, h, s, d]`` (``unsqueeze_dim=1``, what its attention passes) or ``[b, s, h, d]``
            (``unsqueeze_dim=2``), float32/float16/bfloat16, any strides.
        cos, sin: ``[b, s, rope / 2]`` (or ``[s, rope / 2]``, or batch 1 for all), one entry
            per pair of the ``rope = 2 * cos.shape[-1] <= d`` rotated channels, any float dtype.
        unsqueeze_dim: the axis of x that holds the heads.

    Returns:
        A new contiguous tensor of x's shape and dtype (theirs ends in ``torch.cat``): one
        launch reads x once and writes it, the rotary slice rotated in float32 and the rest
        copied (``rope_qk.rope_trailing``). Differentiable with respect to x.
    """
    return _deepseek_v4(x, cos, sin, unsqueeze_dim, False)


def _deepseek_v4(x, cos, sin, unsqueeze_dim, in_place):
    """DeepSeek V4's function and its in-place variant (``in_place``: x's rotary slice rotated
    where it lies, x returned). One launch either way (``rope_qk.rope_trailing``), whose
    pointers are x, cos, sin and the new result: a repeated eager call takes the shortcut of
    rope_kernels.api, as ``_apply``'s calls do."""
    pairs = "interleaved_per_pair"
    shortcuts = _api._SHORTCUTS
    sig = None
    if (type(x) is _Tensor and type(cos) is _Tensor and type(sin) is _Tensor
            and type(unsqueeze_dim) is int and shortcuts.enabled and not _api._is_compiling()
            and not (_api._grad_enabled() and (x.requires_grad or cos.requires_grad
                                               or sin.requires_grad))):
        flags = ("hf deepseek_v4", unsqueeze_dim, _qk._aligned(x), in_place)
        for known, check, entry in shortcuts.recent:
            if known == flags and check(x, cos, sin):
                out = entry((x, cos, sin))
                return x if in_place else out[0]
        sig = (flags, x.shape, x.stride(), x.dtype, x.device, cos.shape, cos.stride(),
               cos.dtype, cos.device, sin.shape, sin.stride(), sin.dtype, sin.device)
        entry = shortcuts.entries.get(sig)
        if entry:
            shortcuts.remember(flags, (x, cos, sin), entry)
            out = entry((x, cos, sin))
            return x if in_place else out[0]
        if entry is False:
            sig = None
    name = "apply_rotary_pos_emb_deepseek_v4" + ("_inplace" if in_place else "")
    rope = _trailing_rope(x, cos, name)
    # The slice's checks (not tensors: the checks of x itself, which say what is wrong)
    validate_hf_args(x if rope is None else rope, None, cos, sin, unsqueeze_dim, pairs, one="x")
    _refuse_angle_gradients(cos, sin)
    if in_place:
        validate_in_place(name, "apply_rotary_pos_emb_deepseek_v4", x=rope)
        if torch.compiler.is_compiling():
            # torch.compile: the q+k functions' in-place operator, on the slice
            _apply_one(rope, cos, sin, unsqueeze_dim, pairs, "x", name)
            return x
        shortcuts.full_path(
            sig, lambda: _qk.rope_trailing(x, cos, sin, unsqueeze_dim, pairs=pairs, out=x),
            (x, cos, sin), lambda _: ())
        return x
    if torch.compiler.is_compiling() or _api._needs_grad(x):
        return _ops.rope_trailing(x, cos, sin, unsqueeze_dim, False, pairs)
    return shortcuts.full_path(
        sig, lambda: _qk.rope_trailing(x, cos, sin, unsqueeze_dim, pairs=pairs), (x, cos, sin),
        lambda out: (out,))


def _trailing_rope(x, cos, name):
    """DeepSeek V4's rotary slice of x, the last ``2 * cos.shape[-1]`` channels of each head (a
    view); None where x or cos is not a tensor of at least one axis (the shared checks then
    name what is wrong)."""
    if not (isinstance(x, torch.Tensor) and isinstance(cos, torch.Tensor) and x.dim() >= 1
            and cos.dim() >= 1):
        return None
    width = 2 * cos.shape[-1]
    if not 0 < width <= x.shape[-1]:
        raise ValueError(
            f"{name}: cos must have one entry per pair of x's rotated channels, the last "
            f"2 * cos.shape[-1] of each head, so 0 < 2 * cos.shape[-1] <= head_dim "
            f"({x.shape[-1]}); got cos {tuple(cos.shape)} (2 * {cos.shape[-1]} = {width}) for "
            f"x {tuple(x.shape)}")
    return x.narrow(-1, x.shape[-1] - width, width)


def apply_rotary_pos_emb_gemma4_inplace(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                        unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_gemma4`` writing into x and returning it, as
    ``apply_rotary_pos_emb_inplace`` (x must not need a gradient)."""
    return _apply_one(x, cos, sin, unsqueeze_dim, "half", "x",
                      "apply_rotary_pos_emb_gemma4_inplace")


def apply_rotary_pos_emb_gptj_inplace(tensor: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor):
    """``apply_rotary_pos_emb_gptj`` writing into ``tensor`` and returning it, as
    ``apply_rotary_pos_emb_inplace`` (``tensor`` must not need a gradient). GPT-J's attention
    passes a view of q's or k's first channels; those are written where they lie."""
    return _apply_one(tensor, cos, sin, 2, "interleaved_per_pair", "tensor",
                      "apply_rotary_pos_emb_gptj_inplace")


def apply_rotary_pos_emb_deepseek_v4_inplace(x: torch.Tensor, cos: torch.Tensor,
                                             sin: torch.Tensor, unsqueeze_dim: int = 1):
    """``apply_rotary_pos_emb_deepseek_v4`` writing into x's rotary slice and returning x, as
    ``apply_rotary_pos_emb_inplace`` (x must not need a gradient): the channels before the slice
    are neither read nor written (one launch on the slices: ``rope_qk.rope_trailing`` with
    ``out=x``)."""
    return _deepseek_v4(x, cos, sin, unsqueeze_dim, True)


def apply_rotary_pos_emb_vision(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                sin: torch.Tensor):
    """RoPE on a vision encoder's q and k, as ``transformers``' Qwen2-VL function
    ``apply_rotary_pos_emb_vision`` (and its 24 copies, and MiniMax M3 VL's): Llama's pairing,
    channel j with j + rotary_dim/2, ``q * cos + rotate_half(q) * sin`` with cos and sin
    broadcast over the heads (``cos.unsqueeze(-2)``). Assign it over that name::

        import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as qwen2_5_vl
        qwen2_5_vl.apply_rotary_pos_emb_vision = rope_kernels.hf.apply_rotary_pos_emb_vision

    Args:
        q: ``[tokens, h_q, d]``: every image's patches packed, float32/float16/bfloat16, any
            strides (Qwen's are views of one fused qkv projection, ``[tokens, 3, h, d]``).
        k: ``[tokens, h_k, d]``, q's dtype.
        cos, sin: ``[tokens, rotary_dim]``, any float dtype (transformers' vision rotary modules
            give float32), half-split layout ``cat(freqs, freqs)``; ``rotary_dim <= d``, the
            channels past it copied (MiniMax M3 VL's, whose cos covers part of the head).

    Returns:
        New ``(q_embed, k_embed)`` of q's and k's shapes and dtype, laid out like q and k where cos
        covers the whole head (transformers' are contiguous; the values are the same),
        contiguous where it covers part of it. Computed in float32, as transformers' function
        computes. Differentiable with respect to q and k.
    """
    return _apply_vision(q, k, cos, sin, "vision", "apply_rotary_pos_emb_vision")


def apply_rotary_pos_emb_vision_interleaved(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                            sin: torch.Tensor):
    """RoPE on a vision encoder's q and k, as ``transformers``' Inkling 2 function
    ``apply_rotary_pos_emb_vision``: channels 2j and 2j+1 rotated together (its
    ``rotate_pairwise``), each channel by its own entry of cos and sin (its rotary module
    repeat_interleaves them, so both channels of a pair read one angle), as Cohere's pairing.

    Args and returns as ``apply_rotary_pos_emb_vision``.
    """
    return _apply_vision(q, k, cos, sin, "vision_interleaved",
                         "apply_rotary_pos_emb_vision_interleaved")


def apply_rotary_pos_emb_vision_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                        sin: torch.Tensor):
    """``apply_rotary_pos_emb_vision`` writing into q and k (views of the fused qkv projection
    too) and returning them, as ``apply_rotary_pos_emb_inplace`` (q and k must not need a
    gradient)."""
    return _apply_vision(q, k, cos, sin, "vision", "apply_rotary_pos_emb_vision_inplace")


def apply_rotary_pos_emb_vision_interleaved_inplace(q: torch.Tensor, k: torch.Tensor,
                                                    cos: torch.Tensor, sin: torch.Tensor):
    """``apply_rotary_pos_emb_vision_interleaved`` writing into q and k and returning them, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply_vision(q, k, cos, sin, "vision_interleaved",
                         "apply_rotary_pos_emb_vision_interleaved_inplace")


def _apply_vision(q, k, cos, sin, pairs, name):
    """The vision functions' body: ``[tokens, heads, d]`` q and k are a batch of one of the q+k
    functions' ``[b, s, h, d]`` (``unsqueeze_dim`` 2), cos and sin ``[s, rotary_dim]``;
    ``pairs``: rope_qk.VISION_PAIRS' key (the kernel plans these calls on tiles of their own);
    ``name``: our function's (it ends in ``_inplace`` for the in-place ones)."""
    validate_vision_args(q, k, cos, sin, name)
    in_place = name.endswith("_inplace")
    q_embed, k_embed = _apply(q.unsqueeze(0), k.unsqueeze(0), cos, sin, 2, pairs, in_place,
                              in_place_name=name if in_place else None)
    return (q, k) if in_place else (q_embed.squeeze(0), k_embed.squeeze(0))


def apply_rotary_pos_emb_2d(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                            num_k_exclude_rope: int = 0, repeat_freqs_k: bool = False):
    """RoPE on q and k as ``transformers``' SAM-family function ``apply_rotary_pos_emb_2d``: SAM
    3's (its ViT backbone's attention) and SAM 2 Video's, EdgeTAM Video's and SAM 3 Tracker
    Video's (their memory attention, with the two keyword arguments). Channels 2j and 2j+1
    rotated together (``rotate_pairwise``), each channel by its own entry of cos and sin (the
    axial rotary module repeat_interleaves them: Cohere's pairing), one row of cos and sin per
    token, broadcast over batch and heads. Assign it over that name::

        import transformers.models.sam3.modeling_sam3 as sam3
        sam3.apply_rotary_pos_emb_2d = rope_kernels.hf.apply_rotary_pos_emb_2d

    Args:
        q: ``[b, h, s, d]`` (the transposed view of a projection), float32/float16/bfloat16, any
            strides.
        k: ``[b, h, s_k, d]``, q's dtype.
        cos, sin: ``[1, s, d]`` (the rotary module's output) or ``[s, d]``, any float dtype,
            covering the whole head.
        num_k_exclude_rope: k's last ``num_k_exclude_rope`` tokens are not rotated (SAM 2
            Video's object pointers): passed through.
        repeat_freqs_k: where k's rotated tokens are r times q's (the memories of r frames),
            token j of them takes the angles of q's token j mod s (cos and sin repeated).

    Returns:
        New ``(q_embed, k_embed)`` of q's and k's shapes and dtype, computed in float32 as
        transformers' function computes (laid out like q and k; in an eager call that records
        no gradient, with k's tokens passed through or its frames, ``k_embed`` contiguous as
        transformers' ``torch.cat`` returns it; the values are the same either way). One launch
        for q and k: k's frames are viewed as heads of their own (k ``[b, h * frames, s, d]``,
        so that cos's rows cover each frame), which k's strides allow for one head (SAM 2
        Video's memory attention) or a contiguous k; where they do not (several heads of a
        transposed projection), two, q and then k on cos and sin repeated. Differentiable with
        respect to q and k.
    """
    return _apply_2d(q, k, cos, sin, num_k_exclude_rope, repeat_freqs_k, False)


def apply_rotary_pos_emb_2d_inplace(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                                    sin: torch.Tensor, num_k_exclude_rope: int = 0,
                                    repeat_freqs_k: bool = False):
    """``apply_rotary_pos_emb_2d`` writing into q and k's rotated tokens and returning (q, k), as
    ``apply_rotary_pos_emb_inplace`` (q and k must not need a gradient): k's last
    ``num_k_exclude_rope`` tokens are neither read nor written."""
    return _apply_2d(q, k, cos, sin, num_k_exclude_rope, repeat_freqs_k, True)


def _apply_2d(q, k, cos, sin, num_k_exclude_rope, repeat_freqs_k, in_place):
    """The SAM functions' body: Cohere's pairs (``"interleaved"``), heads on axis 1."""
    name = "apply_rotary_pos_emb_2d" + ("_inplace" if in_place else "")
    in_place_name = name if in_place else None
    if (type(num_k_exclude_rope) is int and num_k_exclude_rope == 0 and type(q) is _Tensor
            and type(k) is _Tensor and type(cos) is _Tensor and q.dim() == k.dim() == 4
            and k.shape[2] == q.shape[2] and cos.shape[-1] == q.shape[3]
            and (cos.dim() == 2 or cos.dim() == 3 and cos.shape[0] == 1)):
        # All of k rotated, as many tokens as q: the q+k path, one launch (and the shortcut).
        # (Not for cos of more than one batch row, which SAM's function broadcasts over the
        # heads, nor narrower than the head, which it refuses: the checks below name them.)
        return _apply(q, k, cos, sin, 1, "interleaved", in_place, in_place_name=in_place_name,
                      validate=lambda: validate_2d_args(q, k, cos, sin, num_k_exclude_rope,
                                                        repeat_freqs_k, name))
    validate_2d_args(q, k, cos, sin, num_k_exclude_rope, repeat_freqs_k, name)
    if in_place:  # both refused, or neither written
        validate_in_place(name, "apply_rotary_pos_emb_2d", q=q, k=k)
    tokens, rotated = q.shape[2], k.shape[2] - num_k_exclude_rope
    k_rot, k_pass = k.narrow(2, 0, rotated), k.narrow(2, rotated, num_k_exclude_rope)
    if rotated == 0:  # no key rotated: q alone
        q_embed = _apply_one(q, cos, sin, 1, "interleaved", "q", in_place_name)
        return (q, k) if in_place else (q_embed, torch.cat([k_rot, k_pass], dim=2))
    frames = rotated // tokens
    k_heads = _frames_as_heads(k_rot, frames, tokens)
    if k_heads is None:
        # (k's strides allow no such view: several heads of a transposed projection) q, then k
        # with the angles repeated, token j of k's rotated ones at q's token j mod s
        q_embed = _apply_one(q, cos, sin, 1, "interleaved", "q", in_place_name)
        cos_k, sin_k = (t.reshape(t.shape[-2:]).repeat(frames, 1) for t in (cos, sin))
        k_embed = _apply_one(k_rot, cos_k, sin_k, 1, "interleaved", "k", in_place_name)
    elif in_place:
        _apply(q, k_heads, cos, sin, 1, "interleaved", True, in_place_name=name)
        return q, k
    else:
        if not (torch.compiler.is_compiling() or _api._needs_grad(q, k)):
            # Eager inference: k's rotated tokens written straight into the concatenated result
            # (as transformers' torch.cat lays it out), the passed ones copied beside them.
            k_embed = torch.empty(k.shape, dtype=k.dtype, device=k.device)
            k_out = _frames_as_heads(k_embed.narrow(2, 0, rotated), frames, tokens)
            if k_out is not None:
                validate_hf_args(q, k_heads, cos, sin, 1, "interleaved")
                _refuse_angle_gradients(cos, sin)
                q_embed = torch.empty_like(q)
                _qk.rope_cos_sin(q, k_heads, cos, sin, 1, pairs="interleaved", q_out=q_embed,
                                 k_out=k_out)
                k_embed.narrow(2, rotated, num_k_exclude_rope).copy_(k_pass)
                return q_embed, k_embed
        q_embed, k_embed = _apply(q, k_heads, cos, sin, 1, "interleaved")
        k_embed = k_embed.reshape(k_rot.shape)
    if in_place:
        return q, k
    return q_embed, torch.cat([k_embed, k_pass], dim=2) if num_k_exclude_rope else k_embed


def _frames_as_heads(x, frames, tokens):
    """x ``[b, h, frames * tokens, d]`` as a view ``[b, h * frames, tokens, d]``: each frame of
    a memory its own heads, so that cos and sin of ``tokens`` rows cover every frame, and q and
    k go in one launch (SAM 2 Video's memory attention, one head, views so in any layout); None
    where x's strides allow no such view."""
    if frames == 1:
        return x
    b, h, _, d = x.shape
    # heads and frames make one axis where a head's stride is the frames' (tokens rows each)
    if h > 1 and x.stride(1) != frames * tokens * x.stride(2):
        return None
    return x.view(b, h * frames, tokens, d)


def apply_rotary_emb_llama4(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """RoPE on q and k with the model's complex angles, as ``transformers``' Llama 4 text function
    ``apply_rotary_emb(xq, xk, freqs_cis)``: channels 2j and 2j+1 taken as the complex number
    ``xq[2j] + i xq[2j+1]`` and multiplied by ``freqs_cis[..., j]`` (``cos + i sin`` of pair j's
    angle, the attention scaling folded in), which is GPT-J's interleaved rotation. Assign it
    over that name::

        import transformers.models.llama4.modeling_llama4 as llama4
        llama4.apply_rotary_emb = rope_kernels.hf.apply_rotary_emb_llama4

    Args:
        xq: ``[b, s, h_q, d]`` (Llama 4's attention rotates before it transposes), float32,
            float16 or bfloat16, any strides.
        xk: ``[b, s, h_k, d]``, xq's dtype (fewer heads: grouped-query attention).
        freqs_cis: ``[b, s, d / 2]`` or ``[1, s, d / 2]``, complex64 (its rotary module's
            ``torch.polar``), broadcast over the heads (``freqs_cis[:, :, None, :]``). Read in
            place: its real and imaginary parts are the kernel's cos and sin tables.

    Returns:
        New ``(xq_out, xk_out)`` of xq's and xk's shapes and dtype, laid out like them
        (transformers' are contiguous; the values are the same). Computed in float32, as
        transformers' function computes. Differentiable with respect to xq and xk.
    """
    return _apply_complex(xq, xk, freqs_cis, 2, "apply_rotary_emb_llama4",
                          ("xq", "xk", "freqs_cis"))


def apply_rotary_emb_deepseek_v2(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """RoPE on q and k with the model's complex angles, as ``transformers``' DeepSeek V2 function
    ``apply_rotary_emb(xq, xk, freqs_cis)``: Llama 4's rotation (``apply_rotary_emb_llama4``) on
    q and k with the heads on axis 1, ``freqs_cis.unsqueeze(1)``. Assign it over that name::

        import transformers.models.deepseek_v2.modeling_deepseek_v2 as deepseek_v2
        deepseek_v2.apply_rotary_emb = rope_kernels.hf.apply_rotary_emb_deepseek_v2

    Args:
        xq: ``[b, h_q, s, d]``: the rotary slice of the queries (``q_pe``, a view of the
            projection), any strides.
        xk: ``[b, h_k, s, d]`` (DeepSeek V2's one shared key head, ``k_pe``), xq's dtype.
        freqs_cis: ``[b, s, d / 2]`` or ``[1, s, d / 2]``, complex64.

    Returns:
        As ``apply_rotary_emb_llama4``.
    """
    return _apply_complex(xq, xk, freqs_cis, 1, "apply_rotary_emb_deepseek_v2",
                          ("xq", "xk", "freqs_cis"))


def apply_rotary_emb_llama4_vision(query: torch.Tensor, key: torch.Tensor, freqs_ci: torch.Tensor):
    """RoPE on a vision encoder's q and k with complex angles, as ``transformers``' Llama 4
    function ``vision_apply_rotary_emb(query, key, freqs_ci)``: Llama 4's rotation
    (``apply_rotary_emb_llama4``), the same angles for every image. Assign it over that name::

        import transformers.models.llama4.modeling_llama4 as llama4
        llama4.vision_apply_rotary_emb = rope_kernels.hf.apply_rotary_emb_llama4_vision

    Args:
        query: ``[images, patches, h, d]``, any strides.
        key: ``[images, patches, h_k, d]``, query's dtype.
        freqs_ci: complex64, one angle per patch and pair in any shape of ``patches * d / 2``
            entries (its rotary module's ``[patches, 1, d / 2]``), taken as ``[patches, d / 2]``.

    Returns:
        As ``apply_rotary_emb_llama4``.
    """
    return _apply_complex(query, key, freqs_ci, 2, "apply_rotary_emb_llama4_vision",
                          ("query", "key", "freqs_ci"), vision=True)


def apply_rotary_emb_llama4_inplace(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor):
    """``apply_rotary_emb_llama4`` writing into xq and xk and returning them, as
    ``apply_rotary_pos_emb_inplace`` (xq and xk must not need a gradient)."""
    return _apply_complex(xq, xk, freqs_cis, 2, "apply_rotary_emb_llama4_inplace",
                          ("xq", "xk", "freqs_cis"))


def apply_rotary_emb_deepseek_v2_inplace(xq: torch.Tensor, xk: torch.Tensor,
                                         freqs_cis: torch.Tensor):
    """``apply_rotary_emb_deepseek_v2`` writing into xq and xk and returning them, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply_complex(xq, xk, freqs_cis, 1, "apply_rotary_emb_deepseek_v2_inplace",
                          ("xq", "xk", "freqs_cis"))


def apply_rotary_emb_llama4_vision_inplace(query: torch.Tensor, key: torch.Tensor,
                                           freqs_ci: torch.Tensor):
    """``apply_rotary_emb_llama4_vision`` writing into query and key and returning them, as
    ``apply_rotary_pos_emb_inplace``."""
    return _apply_complex(query, key, freqs_ci, 2, "apply_rotary_emb_llama4_vision_inplace",
                          ("query", "key", "freqs_ci"), vision=True)


def _apply_complex(xq, xk, freqs, heads_axis, name, names, vision=False):
    """The complex-angle functions' body: the real and imaginary parts of ``freqs`` (views, no
    copy) are the cos and sin of one entry per pair of GPT-OSS's interleaved function, passed
    as the pairs "interleaved_complex" (the kernel reads both through the real parts' aligned
    address; Llama 4's vision encoder's on the vision tiles), q's heads on ``heads_axis``;
    ``name``: our function's (ending in ``_inplace`` for the in-place ones), ``names``: the
    caller's argument names. Angles whose pairs' two parts are not adjacent (a conjugate view, a
    last axis of stride other than 1) are read from a copy."""
    global _LAST_ANGLES

    def check():
        validate_complex_args(xq, xk, freqs, name, names, heads_axis, vision)

    last = _LAST_ANGLES
    compiling = torch.compiler.is_compiling()
    same = freqs is last[0] and not compiling
    if same and vision:  # (the views' shape is xq's patches by pairs)
        same = (type(xq) is _Tensor and xq.dim() == 4
                and last[1].shape == (1, xq.shape[1], xq.shape[3] // 2))
    if same:
        # The angles of the call before (a model's layers share them): its views; the checks are
        # left to _apply, which runs them where its shortcut, whose key holds every shape and
        # stride they depend on, does not match.
        cos, sin = last[1], last[2]
        validate = check
    else:
        check()
        shape = (1, xq.shape[1], xq.shape[3] // 2) if vision else freqs.shape
        given = freqs
        if compiling:  # (Dynamo cannot trace is_conj(); resolve_conj is a no-op where false)
            freqs = freqs.resolve_conj()
        if freqs.stride(-1) != 1 or (not compiling and freqs.is_conj()):
            freqs = freqs.resolve_conj().contiguous()  # (view_as_real takes neither)
        table = torch.view_as_real(freqs.reshape(shape))  # [..., d/2, 2]: cos, sin side by side
        cos, sin = table[..., 0], table[..., 1]
        if freqs is given and freqs.numel() <= _KEPT_ANGLES_NUMEL and not compiling:
            _LAST_ANGLES = (freqs, cos, sin)
        validate = None
    if _api._needs_grad(freqs):
        raise ValueError(f"{name}: {names[2]} requires grad, but the fused kernel gives no "
                         f"gradient for it: pass {names[2]}.detach() (transformers' rotary "
                         f"module computes it from a buffer, without gradient)")
    in_place = name.endswith("_inplace")
    pairs = "vision_interleaved_complex" if vision else "interleaved_complex"
    return _apply(xq, xk, cos, sin, heads_axis, pairs, in_place,
                  in_place_name=name if in_place else None, names=names[:2], validate=validate)


# The last angle tensor and its cos and sin views, kept while it is small (decode-sized: a larger
# one is not kept alive): every layer of a model's forward passes the same freqs_cis object, and
# making the views and checking the call cost more than the rest of a decode-sized call's host
# time.
_LAST_ANGLES: tuple = (None, None, None)  # (freqs, cos, sin)
_KEPT_ANGLES_NUMEL = 1 << 16


def _apply_one(x, cos, sin, unsqueeze_dim, pairs, one, in_place_name=None):
    """The single-tensor functions' body: x rotated as q with a k of no heads (a view of none of
    x's), through the q+k functions' path; ``one``: x's argument name (for errors);
    ``in_place_name``: the in-place function's name, None out of place."""
    if not (isinstance(x, torch.Tensor) and x.dim() == 4
            and not isinstance(unsqueeze_dim, (bool, torch.Tensor)) and unsqueeze_dim in (1, 2)):
        validate_hf_args(x, None, cos, sin, unsqueeze_dim, pairs, one=one)  # says what is wrong
        raise AssertionError("unreachable: the checks above raise")
    k = x.narrow(unsqueeze_dim, 0, 0)
    return _apply(x, k, cos, sin, unsqueeze_dim, pairs, in_place_name is not None, one,
                  in_place_name)[0]


def _refuse_angle_gradients(cos, sin):
    if _api._needs_grad(cos, sin):
        raise ValueError("cos/sin require grad, but the fused kernel gives no gradient for them: "
                         "pass cos.detach() and sin.detach() (transformers' rotary module "
                         "computes them from a buffer, without gradient)")


def _launch_entry(entry, q, k, cos, sin, in_place):
    """A shortcut's launch: (q, k) rotated where they lie, or the new (q_embed, k_embed)."""
    if in_place:
        entry((q, k, cos, sin))
        return q, k
    q_embed, k_embed = entry((q, k, cos, sin))
    return q_embed, k_embed


def _apply(q, k, cos, sin, unsqueeze_dim, pairs, in_place=False, one=None, in_place_name=None,
           names=("q", "k"), validate=None):
    """The functions' body: ``pairs`` is rope_qk.HF_PAIRS' key; ``in_place``: write into q
    and k and return them. ``one``: the argument name of a single-tensor function's tensor (q;
    k is then a view of none of its heads), ``in_place_name`` its in-place function's name;
    ``names``: q's and k's argument names in the caller's signature (for the in-place checks'
    messages); ``validate``: the caller's own checks, run first where the shortcut does not take
    the call (the complex-angle functions')."""
    # A repeated eager call takes the shortcut of rope_kernels.api (a decode step calls this once
    # per layer with the same signature): its key is everything the checks and the plan depend on.
    shortcuts = _api._SHORTCUTS
    sig = None
    if (type(q) is _Tensor and type(k) is _Tensor and type(cos) is _Tensor
            and type(sin) is _Tensor and type(unsqueeze_dim) is int  # (others: the checks)
            and shortcuts.enabled and not _api._is_compiling()
            and not (_api._grad_enabled() and (q.requires_grad or k.requires_grad
                                               or cos.requires_grad or sin.requires_grad))):
        # (Interleaved pairs: whether the addresses allow reading them as words decides the plan.)
        flags = ("hf", unsqueeze_dim, pairs, pairs in _INTERLEAVED and _qk._aligned(q, k),
                 in_place)
        for known, check, entry in shortcuts.recent:  # (see rope_kernels.api._Shortcuts)
            if known == flags and check(q, k, cos, sin):
                return _launch_entry(entry, q, k, cos, sin, in_place)
        sig = (flags, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
               k.device, cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(),
               sin.dtype, sin.device)
        entry = shortcuts.entries.get(sig)
        if entry:
            shortcuts.remember(flags, (q, k, cos, sin), entry)
            return _launch_entry(entry, q, k, cos, sin, in_place)
        if entry is False:  # its full path is not one launch
            sig = None
    if validate is not None:
        validate()
    validate_hf_args(q, k, cos, sin, unsqueeze_dim, pairs, one=one)
    _refuse_angle_gradients(cos, sin)
    if in_place:
        name = in_place_name or _IN_PLACE_NAMES[pairs]
        validate_in_place(name, name[:-len("_inplace")],
                          **({one: q} if one else {names[0]: q, names[1]: k}))
        if torch.compiler.is_compiling():
            _ops.rope_cos_sin_(q, k, cos, sin, unsqueeze_dim, pairs)
            return q, k
        shortcuts.full_path(
            sig, lambda: _qk.rope_cos_sin(q, k, cos, sin, unsqueeze_dim, pairs=pairs, q_out=q,
                                          k_out=k),
            (q, k, cos, sin), lambda _: ())
        return q, k
    if torch.compiler.is_compiling() or _api._needs_grad(q, k):
        return _ops.rope_cos_sin(q, k, cos, sin, unsqueeze_dim, False, pairs)
    return shortcuts.full_path(
        sig, lambda: _qk.rope_cos_sin(q, k, cos, sin, unsqueeze_dim, pairs=pairs),
        (q, k, cos, sin), lambda out: out)


# ---------------------------------------------------------------------------------------------
# patch(model): the function of ours that computes the model's, chosen by computing both
# ---------------------------------------------------------------------------------------------
# Our out-of-place functions -> their in-place variants: patch's candidates.
_IN_PLACE_OF = {
    **{globals()[name[:-len("_inplace")]]: globals()[name] for name in _IN_PLACE_NAMES.values()},
    apply_rotary_pos_emb_gemma4: apply_rotary_pos_emb_gemma4_inplace,
    apply_rotary_pos_emb_gptj: apply_rotary_pos_emb_gptj_inplace,
    apply_rotary_pos_emb_deepseek_v4: apply_rotary_pos_emb_deepseek_v4_inplace,
    apply_rotary_pos_emb_vision: apply_rotary_pos_emb_vision_inplace,
    apply_rotary_pos_emb_vision_interleaved: apply_rotary_pos_emb_vision_interleaved_inplace,
    apply_rotary_emb_llama4: apply_rotary_emb_llama4_inplace,
    apply_rotary_emb_deepseek_v2: apply_rotary_emb_deepseek_v2_inplace,
    apply_rotary_emb_llama4_vision: apply_rotary_emb_llama4_vision_inplace,
    apply_rotary_pos_emb_2d: apply_rotary_pos_emb_2d_inplace,
}
_ALL_OURS = frozenset(_IN_PLACE_OF) | frozenset(_IN_PLACE_OF.values())
# How far from transformers' function, computed in float64, a result of ours may be, relative to
# the largest result: the rounding of the result to q's dtype and of transformers' own cos and
# sin (in the model's dtype), with room; a function of the other pairing or sign is off by about
# the size of the results themselves.
_PATCH_TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}
# The names under which transformers' attention calls a modeling module's rotation of q and k:
# DeepSeek V3's (and its copies') calls the second where ``config.rope_interleave`` is set, the
# vision encoders of Qwen2-VL and its kind the third, Llama 4's text model and DeepSeek V2's (by
# complex angles) the fourth, Llama 4's vision encoder the fifth, the SAM family's (SAM 3's ViT,
# SAM 2 Video's memory attention) the sixth.
_NAMES = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_pos_emb_vision",
          "apply_rotary_emb", "vision_apply_rotary_emb", "apply_rotary_pos_emb_2d")
# (modeling module, name) -> transformers' function, while one of ours is assigned there
_ORIGINALS: dict = {}


class Patched(NamedTuple):
    """One function of a modeling module that ``patch`` replaced: ``ours`` is there now under
    ``name`` (``apply_rotary_pos_emb``, DeepSeek V3's ``apply_rotary_pos_emb_interleave``, a
    vision encoder's ``apply_rotary_pos_emb_vision``, Llama 4's or DeepSeek V2's
    ``apply_rotary_emb``, Llama 4's ``vision_apply_rotary_emb``, SAM's
    ``apply_rotary_pos_emb_2d``), ``theirs`` (transformers' function) was."""

    module: types.ModuleType
    ours: Callable
    theirs: Callable
    name: str = "apply_rotary_pos_emb"


def _modeling_functions(model: torch.nn.Module) -> list:
    """(module, name) for each function of ``_NAMES`` in the Python modules of the model's
    submodules' classes (where their attention looks it up), in the model's order."""
    found = []
    for sub in model.modules():
        module = sys.modules.get(type(sub).__module__)
        for name in _NAMES:
            if (module is not None and (module, name) not in found
                    and callable(getattr(module, name, None))):
                found.append((module, name))
    return found


def _example_inputs(model: torch.nn.Module) -> dict:
    """8 token ids (1..8, within the vocabulary) on the device of the model's first parameter."""
    param = next(model.parameters(), None)
    device = param.device if param is not None else torch.device("cpu")
    vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 9
    return {"input_ids": (torch.arange(1, 9) % vocab)[None].to(device)}


def _as_float64(x):
    if isinstance(x, torch.Tensor) and x.is_complex():
        return x.to(torch.complex128)
    return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _as_tuple(result) -> tuple:
    return result if isinstance(result, tuple) else (result,)


def _candidates(name: str) -> list:
    """The out-of-place functions of ours that ``patch`` tries where a model calls ``name``.
    Llama 4's vision function and the SAM function are tried only for their own names, and only
    they there: on the angles of a batch of one, ``[1, s, d / 2]``, Llama 4's vision function
    computes what Llama 4's text function computes, and on cos and sin of a batch of one the
    SAM function what Cohere's computes, so each pair can be told apart only by the name
    called."""
    own = {"vision_apply_rotary_emb": apply_rotary_emb_llama4_vision,
           "apply_rotary_pos_emb_2d": apply_rotary_pos_emb_2d}
    if name in own:
        return [own[name]]
    return [f for f in _IN_PLACE_OF if f not in own.values()]


def _distances(theirs: Callable, args: tuple, kwargs: dict,
               name: str = "apply_rotary_pos_emb") -> dict:
    """For each function of ours that ``patch`` tries for ``name`` (``_candidates``): its
    largest distance from ``theirs`` on the call's arguments, computed in float64, relative to
    the largest element of that result; or why ours refused the call (the exception's first 160
    characters)."""
    expected = _as_tuple(theirs(*map(_as_float64, args),
                                **{n: _as_float64(v) for n, v in kwargs.items()}))
    # (Mistral Large 4's function returns None for a k of None)
    scale = max(float(e.abs().max()) for e in expected if e is not None)
    distances = {}
    for ours in _candidates(name):
        try:
            got = _as_tuple(ours(*args, **kwargs))
        except (TypeError, ValueError) as e:
            reason = f"{type(e).__name__}: {e}"
            distances[ours] = reason if len(reason) <= 160 else reason[:157] + "..."
            continue
        if len(got) != len(expected) or any((g is None) != (e is None)
                                            for g, e in zip(got, expected)):
            distances[ours] = (f"{len(got)} results, transformers' function {len(expected)}, "
                               f"or None in other places")
            continue
        distances[ours] = (max(float((g.double() - e.double()).abs().max())
                               for g, e in zip(got, expected) if e is not None) / scale)
    return distances


def patch(model: torch.nn.Module, inplace: bool = False,
          example_inputs: Optional[dict] = None) -> list:
    """Assign over a ``transformers`` model's ``apply_rotary_pos_emb`` the function of ours that
    computes it, chosen by computing both.

    Runs ``model(**example_inputs)`` once under ``torch.no_grad()`` (by default 8 token ids,
    ``input_ids`` [1, 8]) with a recorder around the ``apply_rotary_pos_emb`` (DeepSeek V3's
    ``apply_rotary_pos_emb_interleave``, a vision encoder's ``apply_rotary_pos_emb_vision``,
    Llama 4's and DeepSeek V2's ``apply_rotary_emb``, Llama 4's ``vision_apply_rotary_emb``, the
    SAM family's ``apply_rotary_pos_emb_2d``) of each module that defines the model's classes,
    and takes the arguments of the first call to each: q, k and the model's own cos and sin (or
    complex angles), as its attention passes them. Each of our sixteen functions (Llama 4's
    vision function and the SAM function for their own names only, the others for the others)
    is called on them and compared with transformers' function on the same arguments
    in float64; the one within the rounding of q's dtype is assigned (its ``_inplace`` variant
    with ``inplace=True``: for generation and serving, no gradient). Calling it again re-chooses;
    ``unpatch`` undoes it.

    Args:
        model: a ``torch.nn.Module`` whose attention calls its module's ``apply_rotary_pos_emb``
            or another of the names above (the eager and SDPA attention of transformers'
            models).
        inplace: assign the ``_inplace`` variant (it refuses q and k that need a gradient).
        example_inputs: keyword arguments for ``model``'s forward, in place of the 8 token ids
            (a model that needs other inputs; a vision-language model's vision encoder runs,
            and is patched, only on inputs with an image: ``pixel_values`` and its grid). Its
            tokens must include positions other than 0 (at position 0 every rotation is the
            identity).

    Returns:
        A ``Patched(module, ours, theirs, name)`` for each function that was replaced (the
        functions its forward did not call are left as they are).

    Raises:
        TypeError: ``model`` is not a ``torch.nn.Module``.
        ValueError: no module of the model's has ``apply_rotary_pos_emb``, the forward called
            none, none of ours computes a module's function (the error lists how far each is
            from it, or why it refused the call), or more than one does (the inputs cannot tell
            the conventions apart: use more tokens). Nothing is assigned then.
        RuntimeError: the forward failed on the default inputs (pass ``example_inputs``).
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"patch: model must be a torch.nn.Module (a transformers model), got "
                        f"{type(model).__name__}")
    functions = _modeling_functions(model)
    if not functions:
        raise ValueError(
            f"patch: none of the modules that define {type(model).__name__}'s classes has an "
            f"apply_rotary_pos_emb function (nor DeepSeek V3's apply_rotary_pos_emb_interleave, "
            f"nor a vision encoder's apply_rotary_pos_emb_vision, nor Llama 4's "
            f"apply_rotary_emb or vision_apply_rotary_emb, nor SAM's apply_rotary_pos_emb_2d): "
            f"this model does not rotate q and k through one "
            f"(no RoPE, or RoPE computed another way), so there is nothing to replace")
    current = {(module, name): getattr(module, name) for module, name in functions}
    captured: dict = {}

    def recorder(where, fn):
        def record(*args, **kwargs):
            captured.setdefault(where, (args, kwargs))
            return fn(*args, **kwargs)
        return record

    inputs = example_inputs if example_inputs is not None else _example_inputs(model)
    try:
        for module, name in functions:
            setattr(module, name, recorder((module, name), current[module, name]))
        with torch.no_grad():
            model(**inputs)
    except Exception as e:
        if example_inputs is not None:
            raise
        raise RuntimeError(f"patch: {type(model).__name__}'s forward failed on 8 token ids "
                           f"(input_ids [1, 8]): pass example_inputs, the keyword arguments of "
                           f"a forward that runs its attention") from e
    finally:
        for module, name in functions:
            setattr(module, name, current[module, name])
    if not captured:
        raise ValueError(
            f"patch: {type(model).__name__}'s forward called none of "
            f"{[f'{m.__name__}.{n}' for m, n in functions]}: its attention rotates q and k "
            f"another way (an attention implementation with RoPE of its own?), so there is "
            f"nothing to replace")
    chosen = []
    for (module, name), (args, kwargs) in captured.items():
        # transformers' function, if ours is there now
        theirs = _ORIGINALS.get((module, name), current[module, name])
        distances = _distances(theirs, args, kwargs, name)
        q = args[0] if args else kwargs.get("q")
        tolerance = _PATCH_TOLERANCE.get(getattr(q, "dtype", None), 1e-4)
        matches = [ours for ours, d in distances.items()
                   if not isinstance(d, str) and d <= tolerance]
        shown = "; ".join(f"{ours.__name__}: {d if isinstance(d, str) else format(d, '.2g')}"
                          for ours, d in distances.items())
        if not matches:
            raise ValueError(
                f"patch: no function of rope_kernels.hf computes {module.__name__}."
                f"{name} on the call its model made (distance from it, relative to "
                f"the largest result, tolerance {tolerance:g}; or why it refused: {shown}); "
                f"nothing was assigned")
        if len(matches) > 1:
            raise ValueError(
                f"patch: {[ours.__name__ for ours in matches]} all compute "
                f"{module.__name__}.{name} on the call its model made, so it cannot "
                f"tell which one the model's is: pass example_inputs with more tokens (at position "
                f"0 every rotation is the identity); nothing was assigned")
        ours = _IN_PLACE_OF[matches[0]] if inplace else matches[0]
        chosen.append(Patched(module, ours, theirs, name))
    for module, ours, theirs, name in chosen:
        setattr(module, name, ours)
        _ORIGINALS[module, name] = theirs
    return chosen


def unpatch(model: torch.nn.Module) -> list:
    """Put transformers' functions back in every module of ``model``'s where ``patch`` assigned
    one of ours; returns those modules (none if it was not patched)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"unpatch: model must be a torch.nn.Module, got {type(model).__name__}")
    restored = []
    for module, name in _modeling_functions(model):
        if (module, name) in _ORIGINALS and getattr(module, name) in _ALL_OURS:
            setattr(module, name, _ORIGINALS.pop((module, name)))
            if module not in restored:
                restored.append(module)
    return restored
