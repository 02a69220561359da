"""Hugging Face transformers' convention: ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)``.

transformers' Llama-family models (and GPT-NeoX, whose cos may be narrower than head_dim for
partial rotary) rotate q and k with cos and sin that the model's rotary module has already
computed, attention scaling folded in, in the model's dtype. This function has the same
signature and results, runs q and k in one launch, is differentiable and traceable by
``torch.compile``, so a model can use it by assignment::

    import transformers.models.llama.modeling_llama as llama
    import rope_kernels.hf
    llama.apply_rotary_pos_emb = rope_kernels.hf.apply_rotary_pos_emb
"""

from __future__ import annotations

import torch

from . import _ops
from . import api as _api
from . import rope_qk as _qk
from ._validate import validate_hf_args

__all__ = ["apply_rotary_pos_emb"]

_Tensor = torch.Tensor


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
    # A repeated eager call takes the shortcut of rope_kernels.api (a decode step calls this once
    # per layer with the same signature): its key is everything the checks and the plan depend on.
    shortcuts = _api._SHORTCUTS
    sig = None
    if (type(q) is _Tensor and type(k) is _Tensor and type(cos) is _Tensor
            and type(sin) is _Tensor and type(unsqueeze_dim) is int  # (others: the checks)
            and shortcuts.enabled and not _api._is_compiling()
            and not (_api._grad_enabled() and (q.requires_grad or k.requires_grad
                                               or cos.requires_grad or sin.requires_grad))):
        flags = ("hf", unsqueeze_dim)
        for known, check, entry in shortcuts.recent:  # (see rope_kernels.api._Shortcuts)
            if known == flags and check(q, k, cos, sin):
                q_embed, k_embed = entry((q, k, cos, sin))
                return q_embed, k_embed
        sig = (flags, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype,
               k.device, cos.shape, cos.stride(), cos.dtype, cos.device, sin.shape, sin.stride(),
               sin.dtype, sin.device)
        entry = shortcuts.entries.get(sig)
        if entry:
            shortcuts.remember(flags, (q, k, cos, sin), entry)
            q_embed, k_embed = entry((q, k, cos, sin))
            return q_embed, k_embed
        if entry is False:  # its full path is not one launch
            sig = None
    validate_hf_args(q, k, cos, sin, unsqueeze_dim)
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        raise ValueError("cos/sin require grad, but the fused kernel gives no gradient for them: "
                         "pass cos.detach() and sin.detach() (transformers' rotary module "
                         "computes them from a buffer, without gradient)")
    if torch.compiler.is_compiling() or (torch.is_grad_enabled()
                                         and (q.requires_grad or k.requires_grad)):
        return _ops.rope_cos_sin(q, k, cos, sin, unsqueeze_dim, False)
    return shortcuts.full_path(sig, lambda: _qk.rope_cos_sin(q, k, cos, sin, unsqueeze_dim),
                               (q, k, cos, sin), lambda out: out)
