"""Solutions to the exercises of notebook 05, "The backward pass: the forward with sin negated".

``tests/test_solutions_05.py`` checks every function against autograd of the float64 reference
``rope_kernels.rope_reference``, on symmetric RoPE tables and on random non-symmetric ones.

Exercise 1: ``adjoint_pair``          the adjoint identity <R x, g> = <x, R^T g> with a kernel.
Exercise 2: ``te_unfused_backward``   the backward of TE's unfused formula, by hand.
Exercise 3: ``round_trip``            forward then backward: R^T R x = x for a RoPE table.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

__all__ = ["adjoint_pair", "te_unfused_backward", "round_trip"]


def _default_launcher():
    from rope_kernels import rope_2d

    return rope_2d


def adjoint_pair(x: torch.Tensor, g: torch.Tensor, freqs: torch.Tensor,
                 launcher: Optional[Callable[..., torch.Tensor]] = None, **kw):
    """Exercise 1: both sides of the adjoint identity ``<R x, g> = <x, R^T g>``.

    ``R x`` is the kernel's forward ``launcher(x, freqs, **kw)`` and ``R^T g`` its backward
    ``launcher(g, freqs, backward=True, **kw)``; the inner products are summed in float64 over
    every element. The identity is what makes the backward correct: a linear map's gradient is
    the map ``g -> R^T g`` defined by exactly this identity.

    Args:
        x, g: tensors of the same shape (any format the launcher takes).
        freqs: the angle table (float32 ``[max_seq_len, 1, 1, rotary_dim]``).
        launcher: ``rope_kernels.rope_2d`` (default) or ``rope_kernels.rope_1d``.
        kw: passed to the launcher (``tensor_format``, ``interleaved``, ``cu_seqlens``, ...).

    Returns ``(lhs, rhs)`` as Python floats.
    """
    launcher = _default_launcher() if launcher is None else launcher
    rx = launcher(x, freqs, **kw)
    rtg = launcher(g, freqs, backward=True, **kw)
    lhs = (rx.double() * g.double()).sum().item()
    rhs = (x.double() * rtg.double()).sum().item()
    return lhs, rhs


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    # (x1, x2) -> (-x2, x1) for every pair: halves (j, j + d/2), or neighbours (2j, 2j+1).
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def te_unfused_backward(grad_out: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                        interleaved: bool = False) -> torch.Tensor:
    """Exercise 2: the gradient of TE's unfused RoPE with respect to ``t``, without autograd.

    Forward (TE, ``fused=False``): ``out = cat(t1 * cos F + rotate_half(t1) * sin F, t2)`` with
    ``t1 = t[..., :d2]``, ``t2 = t[..., d2:]``. ``rotate_half`` is a fixed linear map ``J`` with
    ``J^T = -J`` (it is "multiply by i" on each pair), and ``cos F``, ``sin F`` are diagonal, so
    with ``g = grad_out``::

        dL/dt1 = cos F * g1 + J^T (sin F * g1) = g1 * cos F - rotate_half(g1 * sin F)
        dL/dt2 = g2

    This holds for any table ``F``. Note where the sine lands: ``rotate_half`` moves each
    channel's ``sin F * g`` onto the *other* channel of its pair, which is the exchange of the
    two channels' sines that the kernels' backward does. For the symmetric tables RoPE uses it
    equals RoPE with negated angles, ``g * cos F + rotate_half(g) * sin(-F)``.

    cos/sin are taken in float32 (float64 for float64 inputs) and cast to ``grad_out``'s dtype,
    as the reference forward does.

    Args:
        grad_out: ``[s, b, h, d]`` (sbhd) or ``[b, s, h, d]`` (bshd).
        freqs: angle table ``[>= s, 1, 1, d2]``.
        interleaved: pairs (2j, 2j+1) instead of (j, j + d2/2).

    Returns the gradient, a new tensor of ``grad_out``'s shape and dtype.
    """
    if tensor_format == "bshd":
        return te_unfused_backward(grad_out.transpose(0, 1), freqs, "sbhd",
                                   interleaved).transpose(0, 1)
    if tensor_format != "sbhd":
        raise ValueError(f"tensor_format must be 'sbhd' or 'bshd', got {tensor_format!r}")
    seq_len, d2 = grad_out.shape[0], freqs.shape[-1]
    angles = freqs[:seq_len].to(torch.promote_types(freqs.dtype, grad_out.dtype))
    cos = torch.cos(angles).to(grad_out.dtype)
    sin = torch.sin(angles).to(grad_out.dtype)
    g1, g2 = grad_out[..., :d2], grad_out[..., d2:]
    return torch.cat((g1 * cos - _rotate_half(g1 * sin, interleaved), g2), dim=-1)


def round_trip(x: torch.Tensor, freqs: torch.Tensor,
               launcher: Optional[Callable[..., torch.Tensor]] = None, **kw) -> torch.Tensor:
    """Exercise 3: apply the kernel's forward, then its backward: ``R^T (R x)``.

    For a RoPE table (both channels of a pair share one angle) ``R`` is a rotation, so
    ``R^T R = I`` and the result equals ``x`` up to float32 rounding (bf16/fp16 inputs add one
    rounding of the intermediate to their dtype). For a table whose two halves differ, the
    per-pair matrix ``[[cos f1, -sin f1], [sin f2, cos f2]]`` is not orthogonal and the round
    trip does not return ``x``: the backward is the transpose, not the inverse.

    Args:
        x: input tensor; freqs: angle table; launcher: ``rope_2d`` (default) or ``rope_1d``;
        kw: passed to both calls (``tensor_format``, ``interleaved``, ...).

    Returns ``launcher(launcher(x, freqs, **kw), freqs, backward=True, **kw)``.
    """
    launcher = _default_launcher() if launcher is None else launcher
    return launcher(launcher(x, freqs, **kw), freqs, backward=True, **kw)
