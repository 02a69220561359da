"""Rotary Position Embedding (RoPE) in Triton: drop-ins where models call RoPE.

    from rope_kernels import RotaryPositionEmbedding, apply_rotary_pos_emb
    freqs = RotaryPositionEmbedding(head_dim)(max_seq_len)
    out = apply_rotary_pos_emb(t, freqs, tensor_format="sbhd", fused=True)   # TransformerEngine
    q, k, v = apply_fused_qkv_rotary_pos_emb(qkv, freqs, freqs, [4 * d, d, d])  # TE, fused QKV
    q, k = apply_rope_with_cos_sin_cache(positions, q, k, d, cos_sin_cache)  # FlashInfer / vLLM
    q, k = apply_mrope_with_cos_sin_cache(positions_thw, q, k, d, cos_sin_cache,
                                          mrope_section=[16, 24, 24])          # vLLM's M-RoPE
    q, k = rope_kernels.hf.apply_rotary_pos_emb(q, k, cos, sin)               # transformers
    q, k = rope_kernels.flashinfer.apply_rope_pos_ids(q, k, pos_ids)  # FlashInfer, angles in-kernel

Without a GPU, importing this package turns on Triton's interpreter (unless TRITON_INTERPRET is
already set), so the same kernels run on CPU tensors; ``MODE`` says which mode is active.
"""

import os as _os
import sys as _sys
import warnings as _warnings

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    # Must happen before the kernel modules run @triton.jit.
    if "triton" in _sys.modules:
        _warnings.warn("triton was imported before rope_kernels turned Triton's interpreter on: "
                       "kernels of your own defined before this point will not be interpreted. "
                       "Import rope_kernels first, or set TRITON_INTERPRET=1 in the environment.",
                       stacklevel=2)
    _os.environ["TRITON_INTERPRET"] = "1"

from . import _launch, flashinfer, hf, rope_mrope, rope_qk  # noqa: E402
from . import rope_2d as _rope_2d_module  # noqa: E402
from .api import (  # noqa: E402
    RoPEFunction,
    apply_fused_qkv_rotary_pos_emb,
    apply_mrope_with_cos_sin_cache,
    apply_mrope_with_cos_sin_cache_inplace,
    apply_rope_with_cos_sin_cache,
    apply_rope_with_cos_sin_cache_inplace,
    apply_rotary_pos_emb,
)
from .reference import RotaryPositionEmbedding, rope_reference, rotate_half  # noqa: E402
from .rope_1d import rope_1d  # noqa: E402
from .rope_2d import INTERPRETED, rope_2d  # noqa: E402

# The kernel files launch through Triton's dispatch; the package swaps in its thin launch path.
_rope_2d_module.launch = _launch.thin_launch
rope_qk.launch = _launch.thin_launch
rope_mrope.launch = _launch.thin_launch

MODE = "triton-interpreter (CPU)" if INTERPRETED else "compiled (GPU)"

__all__ = [
    "MODE",
    "INTERPRETED",
    "RoPEFunction",
    "RotaryPositionEmbedding",
    "apply_fused_qkv_rotary_pos_emb",
    "apply_mrope_with_cos_sin_cache",
    "apply_mrope_with_cos_sin_cache_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
    "apply_rotary_pos_emb",
    "flashinfer",
    "hf",
    "rope_1d",
    "rope_2d",
    "rope_reference",
    "rotate_half",
]
