"""Hugging Face transformers' convention: ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``.

transformers' models rotate q and k with cos and sin that the model's rotary module has already
computed, attention scaling folded in, in the model's dtype, through a module-level function of
this signature. Six conventions share it (which channels are paired, how wide cos and sin are,
the sign of the rotation), so there are six functions here, each with the signature and results
of transformers' own, q and k in one launch, differentiable and traceable by ``torch.compile``,
so that a model can use it by assignment::

    import transformers.models.llama.modeling_llama as llama
    import rope_kernels.hf
    llama.apply_rotary_pos_emb = rope_kernels.hf.apply_rotary_pos_emb

- ``apply_rotary_pos_emb``: Llama's (and GPT-NeoX's, whose cos may be narrower than head_dim):
  channel j paired with j + rotary_dim/2 (``rotate_half`` of the two halves). Most models: Llama,
  Mistral, Qwen, Gemma, Phi-3, GPT-NeoX and the many that copy Llama's function.
- ``apply_rotary_pos_emb_interleaved``: Cohere's (Cohere, Cohere2, BLT, GLM-4V, GLM-OCR, Ernie 4.5
  VL): channels 2j and 2j+1 paired, cos and sin of each channel as given (their rotary module
  repeat_interleaves them).
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
"""

from __future__ import annotations

import torch

from . import _ops
from . import api as _api
from . import rope_qk as _qk
from ._validate import validate_hf_args, validate_in_place

__all__ = ["apply_rotary_pos_emb", "apply_rotary_pos_emb_glm", "apply_rotary_pos_emb_interleaved",
           "apply_rotary_pos_emb_gpt_oss", "apply_rotary_pos_emb_gpt_oss_interleaved",
           "apply_rotary_pos_emb_nanochat",
           "apply_rotary_pos_emb_inplace", "apply_rotary_pos_emb_glm_inplace",
           "apply_rotary_pos_emb_interleaved_inplace", "apply_rotary_pos_emb_gpt_oss_inplace",
           "apply_rotary_pos_emb_gpt_oss_interleaved_inplace",
           "apply_rotary_pos_emb_nanochat_inplace"]

_Tensor = torch.Tensor
_INTERLEAVED = frozenset(pairs for pairs, (_, interleaved, _) in _qk.HF_PAIRS.items() if interleaved)
_IN_PLACE_NAMES = {"half": "apply_rotary_pos_emb_inplace",
                   "interleaved": "apply_rotary_pos_emb_interleaved_inplace",
                   "glm": "apply_rotary_pos_emb_glm_inplace",
                   "half_per_pair": "apply_rotary_pos_emb_gpt_oss_inplace",
                   "interleaved_per_pair": "apply_rotary_pos_emb_gpt_oss_interleaved_inplace",
                   "half_negated": "apply_rotary_pos_emb_nanochat_inplace"}


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
    angle).

    Args and returns as ``apply_rotary_pos_emb``, but ``cos`` and ``sin`` cover the whole head
    (``rotary_dim == head_dim``: transformers multiplies q by cos whole). Computed in float32
    and returned in q's dtype, as Cohere's function does.
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


def _launch_entry(entry, q, k, cos, sin, in_place):
    """A shortcut's launch: (q, k) rotated where they lie, or the new (q_embed, k_embed)."""
    if in_place:
        entry((q, k, cos, sin))
        return q, k
    q_embed, k_embed = entry((q, k, cos, sin))
    return q_embed, k_embed


def _apply(q, k, cos, sin, unsqueeze_dim, pairs, in_place=False):
    """The functions' body: ``pairs`` is rope_qk.HF_PAIRS' key; ``in_place``: write into q
    and k and return them."""
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
    validate_hf_args(q, k, cos, sin, unsqueeze_dim, pairs)
    if _api._needs_grad(cos, sin):
        raise ValueError("cos/sin require grad, but the fused kernel gives no gradient for them: "
                         "pass cos.detach() and sin.detach() (transformers' rotary module "
                         "computes them from a buffer, without gradient)")
    if in_place:
        name = _IN_PLACE_NAMES[pairs]
        validate_in_place(name, name[:-len("_inplace")], q=q, k=k)
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
