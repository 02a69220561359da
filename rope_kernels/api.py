"""``apply_rotary_pos_emb``: TransformerEngine's signature over this package's kernels.

``fused=False`` runs the naive PyTorch formula (``reference.rope_reference``); ``fused=True`` runs a
Triton kernel, the 2-D batch-reusing one unless ``kernel="1d"``. The Triton path is differentiable
through ``RoPEFunction``, whose backward is the same kernel with sin negated.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ._validate import validate_rope_args
from .reference import rope_reference
from .rope_1d import rope_1d
from .rope_2d import rope_2d

KERNELS: dict[str, Callable[..., torch.Tensor]] = {"1d": rope_1d, "2d": rope_2d}


class RoPEFunction(torch.autograd.Function):
    """Autograd wrapper: forward applies R(theta), backward applies R(theta)^T = R(-theta)."""

    @staticmethod
    def forward(ctx, t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size,
                cp_rank, launcher):
        ctx.save_for_backward(freqs, start_positions, cu_seqlens)
        ctx.args = (tensor_format, interleaved, cp_size, cp_rank, launcher)
        return launcher(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                        cp_size, cp_rank)

    @staticmethod
    def backward(ctx, grad_out):
        freqs, start_positions, cu_seqlens = ctx.saved_tensors
        tensor_format, interleaved, cp_size, cp_rank, launcher = ctx.args
        # grad_out may have any strides, stride 0 included (e.g. from `out.sum()`): the kernels
        # read it through its strides, no copy needed.
        grad_t = launcher(grad_out, freqs, tensor_format, start_positions, interleaved,
                          cu_seqlens, cp_size, cp_rank, backward=True)
        return grad_t, None, None, None, None, None, None, None, None


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    *,
    kernel: str = "2d",
    validate: bool = True,
) -> torch.Tensor:
    """Apply rotary position embedding to ``t``; a drop-in for TransformerEngine's function.

    Args:
        t: ``[s, b, h, d]`` (sbhd), ``[b, s, h, d]`` (bshd) or ``[total_tokens, h, d]`` (thd),
            float32, float16 or bfloat16 (any float dtype with ``fused=False``), any strides.
        freqs: float32 angles ``[max_seq_len, 1, 1, rotary_dim]`` from ``RotaryPositionEmbedding``;
            ``rotary_dim`` even and <= d. Channels past ``rotary_dim`` are passed through.
        tensor_format: ``"sbhd"``, ``"bshd"`` or ``"thd"``.
        start_positions: int ``[b]`` (``[n_seqs]`` for thd): position of the first token of each
            sequence in the table (inference with a KV cache). Not with ``cp_size > 1``.
        interleaved: rotate channel pairs (2j, 2j+1) (GPT-J) instead of (j, j + rotary_dim/2).
        fused: run a Triton kernel (True) or the naive PyTorch code (False), as in TE.
        cu_seqlens: int32 ``[n_seqs + 1]`` cumulative sequence lengths, required for thd (the
            padded global lengths when ``cp_size > 1``).
        cp_size, cp_rank: context-parallel world size and this rank (dual-chunk slicing).
        kernel: ``"2d"`` (batch-reusing, the fast path) or ``"1d"`` (the simple kernel).
        validate: check argument values that live on the device (cu_seqlens, start_positions);
            this copies them to the host. Shapes, dtypes and devices are always checked.

    Returns:
        A new contiguous tensor of ``t``'s shape and dtype; ``t`` is never modified.
    """
    validate_rope_args(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size,
                       cp_rank, kernel_dtypes_only=fused, check_values=validate)
    if not fused:
        return rope_reference(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                              cp_size, cp_rank)
    launcher = KERNELS.get(kernel)
    if launcher is None:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    if freqs.requires_grad and torch.is_grad_enabled():
        raise ValueError("freqs requires grad, but the fused kernels give no gradient for the "
                         "angles: pass freqs.detach(), or use fused=False to learn them")
    if t.requires_grad and torch.is_grad_enabled():
        return RoPEFunction.apply(t, freqs, tensor_format, start_positions, interleaved,
                                  cu_seqlens, cp_size, cp_rank, launcher)
    return launcher(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size,
                    cp_rank)
