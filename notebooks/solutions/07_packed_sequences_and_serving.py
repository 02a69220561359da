"""Solutions to the exercises of notebook 07, "Packed sequences and the serving conventions".

``tests/test_solutions_07.py`` checks them against the package's kernels and its float64
reference.

Exercise 1: ``token_rows``          each packed token's angle-table row, in PyTorch, without a
                                    Python loop over sequences (what thd_positions_kernel writes).
Exercise 2: ``grid_waste``          the share of programs of a max_seqlen x sequences grid that
                                    have no token to work on.
Exercise 3: ``make_cos_sin_cache``  vLLM's cos/sin cache, and ``rope_with_cache`` the float64
                                    rotation it stands for.
Exercise 4: ``llama31_inv_freq``    Llama 3.1's frequency per pair, from the wavelengths (what
                                    apply_llama31_rope_pos_ids turns each pair by, per position).
Exercise 5: ``mrope_axes``          each rotary pair's axis (T, H or W) in multimodal RoPE's
                                    sections, and ``mrope_with_cache`` the float64 rotation.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

__all__ = ["token_rows", "grid_waste", "make_cos_sin_cache", "rope_with_cache", "llama31_inv_freq",
           "mrope_axes", "mrope_with_cache"]


def token_rows(cu_seqlens: torch.Tensor, cp_size: int = 1, cp_rank: int = 0,
               start_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Exercise 1: int64 [total_tokens // cp_size]: for each local token, the row of the angle
    table it uses (its position within its sequence, mapped for context parallelism as
    TransformerEngine does, plus its sequence's start position)."""
    cu = cu_seqlens.long() // cp_size
    lengths = cu[1:] - cu[:-1]
    n_tokens = int(cu[-1])
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths,
                                  output_size=n_tokens)
    local = torch.arange(n_tokens, device=cu.device) - cu[:-1][seq]
    if cp_size > 1:
        half = lengths[seq] // 2
        local = torch.where(local < half, local + cp_rank * half,
                            lengths[seq] * cp_size - (cp_rank + 1) * half + (local - half))
    if start_positions is not None:
        local = local + start_positions.long()[seq]
    return local


def grid_waste(lengths: Sequence[int], block_m: int = 4) -> float:
    """Exercise 2: with a grid of cdiv(max_len, block_m) position blocks for every sequence (as
    flash-attn's rotary launches for packed input), the fraction of programs that start past the
    end of their sequence and return at once."""
    if not lengths:
        return 0.0
    per_seq = math.ceil(max(lengths) / block_m)
    busy = sum(math.ceil(n / block_m) for n in lengths)
    return 1.0 - busy / (per_seq * len(lengths)) if per_seq else 0.0


def make_cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0,
                       device=None) -> torch.Tensor:
    """Exercise 3a: float32 [max_position, rotary_dim]: cos of the angles in the first half of a
    row, sin in the second (vLLM's RotaryEmbedding._compute_cos_sin_cache)."""
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angles = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(device)


def rope_with_cache(positions: torch.Tensor, x: torch.Tensor, head_size: int,
                    cache: torch.Tensor, is_neox: bool = True) -> torch.Tensor:
    """Exercise 3b: float64 x [tokens, heads * head_size] rotated at per-token positions."""
    n = x.shape[0]
    x = x.double().reshape(n, -1, head_size)
    rotary_dim = cache.shape[1]
    cos, sin = cache.double()[positions.long()].chunk(2, dim=-1)
    cos, sin = cos[:, None], sin[:, None]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if is_neox:
        x1, x2 = rot.chunk(2, dim=-1)
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    return torch.cat((rot, rest), dim=-1).reshape(n, -1)


def llama31_inv_freq(rotary_dim: int, rope_scale: float = 8, rope_theta: float = 5e5,
                     low_freq_factor: float = 1, high_freq_factor: float = 4,
                     old_context_len: float = 8192) -> torch.Tensor:
    """Exercise 4: float64 [rotary_dim / 2], pair j's frequency under Llama 3.1's scaling, regime
    by regime: long wavelengths slowed by rope_scale, short ones kept, the ones between blended."""
    j = torch.arange(rotary_dim // 2, dtype=torch.float64)
    freq = rope_theta ** (-2 * j / rotary_dim)
    wavelength = 2 * math.pi / freq
    low_wavelength = old_context_len / low_freq_factor  # longer than this: scaled
    high_wavelength = old_context_len / high_freq_factor  # shorter than this: kept
    smooth = (old_context_len / wavelength - low_freq_factor) / (high_freq_factor
                                                                 - low_freq_factor)
    blended = (1 - smooth) * freq / rope_scale + smooth * freq
    return torch.where(wavelength > low_wavelength, freq / rope_scale,
                       torch.where(wavelength < high_wavelength, freq, blended))


def mrope_axes(rotary_dim: int, mrope_section: Sequence[int], interleaved: bool = False,
               device=None) -> torch.Tensor:
    """Exercise 5: int64 [rotary_dim // 2]: the axis of each rotary pair, 0 (T), 1 (H) or 2 (W).
    Contiguous sections give the first ``t`` pairs to T, the next ``h`` to H, the last ``w`` to W;
    Qwen3-VL's interleaved ones give pair j to H where ``j % 3 == 1 and j < 3h``, to W where
    ``j % 3 == 2 and j < 3w``, and the rest to T."""
    pairs = torch.arange(rotary_dim // 2, device=device)
    if interleaved:
        on_h = (pairs % 3 == 1) & (pairs < 3 * mrope_section[1])
        on_w = (pairs % 3 == 2) & (pairs < 3 * mrope_section[2])
        return torch.where(on_w, 2, torch.where(on_h, 1, 0))
    t, h, _ = mrope_section
    return (pairs >= t).long() + (pairs >= t + h).long()


def mrope_with_cache(positions: torch.Tensor, x: torch.Tensor, head_size: int,
                     cache: torch.Tensor, mrope_section: Sequence[int],
                     interleaved: bool = False) -> torch.Tensor:
    """Exercise 5, the rotation: x [tokens, heads * head_size] turned (half-split pairs, in
    float64) by each pair's cos and sin from the cache row of its axis' position; positions
    [3, tokens]."""
    rotary_dim = cache.shape[1]
    axes = mrope_axes(rotary_dim, mrope_section, interleaved, device=cache.device)
    rows = positions.long()[axes]  # [pairs, tokens]: each pair's position, token by token
    pair = torch.arange(rotary_dim // 2, device=cache.device)
    cos = cache.double()[rows, pair[:, None]].T  # [tokens, pairs]
    sin = cache.double()[rows, rotary_dim // 2 + pair[:, None]].T
    return rope_with_cache(torch.arange(x.shape[0], device=x.device), x, head_size,
                           torch.cat((cos, sin), -1), is_neox=True)
