"""Solutions to the exercises of notebook 01, "RoFormer math: rotary position embedding from first
principles".

Plain PyTorch only (no ``rope_kernels``), so that ``tests/test_solutions_01.py`` can check every
function against the package's ground truth, ``rope_kernels.rope_reference``, in float64.

Exercise 1: ``rope_complex``            RoPE as complex multiplication (interleaved pairs).
Exercise 2: ``last_pair_angle``,        the angle and wavelength of the slowest pair, and why
            ``pair_wavelengths``        long-context models raise the base.
Exercise 3: ``rope_partial``            RoPE with ``rotary_percent < 1`` (half-split pairs).
"""

from __future__ import annotations

import math

import torch

__all__ = ["inv_freq", "rope_complex", "last_pair_angle", "pair_wavelengths", "rope_partial"]


def inv_freq(d: int, base: float = 10000.0, device=None) -> torch.Tensor:
    """Frequencies ``theta_i = base^(-2i/d)`` for ``i = 0..d/2-1`` (RoFormer eq. 15), float64 ``[d/2]``."""
    if d <= 0 or d % 2 != 0:
        raise ValueError(f"d must be even and positive, got {d}")
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)


def rope_complex(x: torch.Tensor, positions, base: float = 10000.0) -> torch.Tensor:
    """Exercise 1: RoPE through complex numbers.

    Channel pair ``(2i, 2i+1)`` of the vector at sequence index ``s`` is read as the complex
    number ``z_i = x[2i] + 1j * x[2i+1]`` and multiplied by ``exp(1j * positions[s] * theta_i)``.

    Args:
        x: ``[s, ...,  d]`` (for instance sbhd ``[s, b, h, d]``), ``d`` even; any float dtype, the
            arithmetic is done in float64 (complex128) and cast back to ``x.dtype``.
        positions: ``[s]`` positions (ints or floats) of the ``s`` rows of ``x``.
        base: base of the geometric progression of frequencies.

    Returns a tensor of ``x``'s shape and dtype. Because the pairs are adjacent channels, this is
    the *interleaved* (GPT-J, Meta Llama reference) layout: it matches
    ``rope_reference(x, freqs, interleaved=True)`` with the ``[f0, f0, f1, f1, ...]`` table, not the
    default half-split one (for that, permute channels with ``P = [0, 2, ..., d-2, 1, 3, ..., d-1]``
    before and after, see section 6 of the notebook).
    """
    d = x.shape[-1]
    positions = torch.as_tensor(positions, dtype=torch.float64, device=x.device).reshape(-1)
    if positions.numel() != x.shape[0]:
        raise ValueError(f"need one position per row of x: {positions.numel()} vs {x.shape[0]}")
    angles = positions[:, None] * inv_freq(d, base, device=x.device)[None, :]  # [s, d/2]
    rotation = torch.polar(torch.ones_like(angles), angles)  # e^{i m theta_i}, complex128 [s, d/2]
    rotation = rotation.reshape(x.shape[0], *([1] * (x.dim() - 2)), d // 2)  # broadcast over the middle dims
    z = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * rotation).reshape(x.shape).to(x.dtype)


def last_pair_angle(position: int = 8191, d: int = 128, base: float = 10000.0) -> float:
    """Exercise 2: angle (radians) of the slowest pair ``i = d/2 - 1`` at ``position``.

    ``position * base^(-(d-2)/d)``. For position 8191, d = 128, base 10000 this is about 0.9459 rad,
    less than a sixth of a turn, while the pair's wavelength ``2*pi / theta_{d/2-1}`` is about
    54,410 tokens (``pair_wavelengths``).

    Why long-context models raise the base (two usual explanations):

    * Angles seen in training. Pairs whose wavelength is longer than the training context never
      complete a turn during training: the model only ever sees a small arc of their angles.
      Running past the training length puts those pairs at angles it never saw. Raising the base
      (10000 -> 500000 in Llama 3, 1,000,000 in Code Llama) slows every pair, so a longer context
      stays inside the range of angles that the model can learn (or was fine-tuned on).
    * Long-term decay. The relative upper bound of section 5 decays with the relative distance on a
      scale set by the frequencies; a larger base lowers them and stretches the curve, so distant
      tokens are not damped as quickly.
    """
    return position * base ** (-(d - 2) / d)


def pair_wavelengths(d: int = 128, base: float = 10000.0) -> torch.Tensor:
    """Exercise 2: wavelength in tokens ``2*pi / theta_i`` of every pair, float64 ``[d/2]``.

    It runs from ``2*pi`` (pair 0, one radian per token) up to ``2*pi * base^((d-2)/d)``.
    """
    return 2 * math.pi / inv_freq(d, base)


def rope_partial(x: torch.Tensor, rotary_percent: float = 0.5, base: float = 10000.0) -> torch.Tensor:
    """Exercise 3: RoPE of an sbhd tensor where only the first ``d2`` channels rotate.

    ``d2 = int(d * rotary_percent)`` (``d`` when ``rotary_percent == 1``). Position of row ``m`` of
    ``x`` (shape ``[s, b, h, d]``) is ``m``. The first ``d2`` channels use half-split pairs
    ``(j, j + d2/2)`` and frequencies ``base^(-2j/d2)`` (the exponent uses ``d2``, as
    TransformerEngine's ``RotaryPositionEmbedding`` does); channels ``d2:`` are copied unchanged.
    The arithmetic is done in float64 and cast back to ``x.dtype``.
    """
    d = x.shape[-1]
    d2 = int(d * rotary_percent) if rotary_percent < 1.0 else d
    if d2 <= 0 or d2 % 2 != 0:
        raise ValueError(f"rotary dim {d2} must be even and positive")
    half = d2 // 2
    positions = torch.arange(x.shape[0], dtype=torch.float64, device=x.device)
    angles = positions[:, None] * inv_freq(d2, base, device=x.device)[None, :]  # [s, d2/2]
    angles = angles.reshape(x.shape[0], *([1] * (x.dim() - 2)), half)
    cos, sin = torch.cos(angles), torch.sin(angles)
    xf = x.to(torch.float64)
    x1, x2, x_pass = xf[..., :half], xf[..., half:d2], xf[..., d2:]
    out1 = x1 * cos - x2 * sin  # each pair (x1_j, x2_j) is rotated by R(m * theta_j)
    out2 = x2 * cos + x1 * sin
    return torch.cat((out1, out2, x_pass), dim=-1).to(x.dtype)
