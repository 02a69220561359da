"""Naive PyTorch RoPE: TransformerEngine's unfused formula, and its angle table.

This module is the ground truth of the package. Every line is plain PyTorch, it works in any
floating dtype (float64 included, which is what the tests use), and it follows the semantics of
NVIDIA TransformerEngine's ``apply_rotary_pos_emb(..., fused=False)``:

    out = cat(t[..., :d2] * cos(freqs) + rotate_half(t[..., :d2]) * sin(freqs), t[..., d2:])

Shapes (letters used throughout the package):
    s  sequence length            b  batch size           h  number of heads
    d  head_dim                   d2 rotary_dim (<= d, even)
    t  total tokens of a packed (thd) batch
    freqs: [max_seq_len, 1, 1, d2] float32 angles, position-major.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = [
    "RotaryPositionEmbedding",
    "rotate_half",
    "rope_reference",
    "freqs_on_cp_rank",
    "cos_sin_cache_reference",
    "pos_ids_reference",
]


class RotaryPositionEmbedding(torch.nn.Module):
    """Angle table ``theta[m, i] = m * base^(-2i / d2)`` for positions ``m`` (RoFormer, eq. 15):
    TransformerEngine's module, with its arguments in its order and its semantics.

    Args:
        dim: head_dim ``d`` of the tensors the table will be applied to.
        rotary_percent: fraction of ``dim`` that is rotated; ``d2 = int(dim * rotary_percent)``.
        seq_len_interpolation_factor, pretrained_max_position_embeddings: position
            interpolation (arXiv 2306.15595), as TE applies it, only when both are set: positions
            are multiplied by ``1 / seq_len_interpolation_factor``, or, for a ``max_seq_len``
            longer than ``pretrained_max_position_embeddings * seq_len_interpolation_factor``,
            by ``1 / (max_seq_len / pretrained_max_position_embeddings)`` (dynamic scaling).
        rotary_base: the base of the geometric progression of frequencies.
        interleaved: lay the table out for interleaved (GPT-J) pairs ``[f0, f0, f1, f1, ...]``
            instead of half-split (GPT-NeoX) pairs ``[f0, f1, ..., f0, f1, ...]``.
        device: where ``inv_freq`` lives (keyword only; TE's module takes the current CUDA
            device, this one the current CUDA device or else the CPU).

    Calling it as ``emb(max_seq_len, offset=0)`` returns angles ``[max_seq_len, 1, 1, d2]``,
    contiguous, in ``inv_freq``'s dtype (float32 unless the module was cast), as TE's module
    does. ``inv_freq`` is a buffer of the state dict, as in TE.
    """

    def __init__(
        self,
        dim: int,
        rotary_percent: float = 1.0,
        seq_len_interpolation_factor: Optional[float] = None,
        pretrained_max_position_embeddings: Optional[int] = None,
        rotary_base: float = 10000.0,
        interleaved: bool = False,
        *,
        device: Optional[torch.device] = None,
    ):
        super().__init__()
        if not isinstance(dim, int) or dim <= 0:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if not 0.0 < rotary_percent <= 1.0:
            raise ValueError(f"rotary_percent must be in (0, 1], got {rotary_percent!r}")
        rotary_dim = int(dim * rotary_percent) if rotary_percent < 1.0 else dim
        if rotary_dim % 2 != 0 or rotary_dim == 0:
            raise ValueError(
                f"rotary_dim = int(dim * rotary_percent) must be even and positive, got "
                f"{rotary_dim} (dim={dim}, rotary_percent={rotary_percent})"
            )
        self.rotary_dim = rotary_dim
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        self.pretrained_max_position_embeddings = pretrained_max_position_embeddings
        self.rotary_base = rotary_base
        self.interleaved = interleaved
        if device is None:
            device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
        self.register_buffer("inv_freq", 1.0 / (rotary_base**exponents))

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        # Positions in inv_freq's dtype and scaled by multiplying with a reciprocal, as TE's
        # module computes them, so that the tables are TE's bit for bit.
        positions = torch.arange(max_seq_len, device=self.inv_freq.device,
                                 dtype=self.inv_freq.dtype) + offset
        factor = self.seq_len_interpolation_factor
        pretrained = self.pretrained_max_position_embeddings
        if pretrained is not None and factor is not None:
            if max_seq_len > pretrained * factor:
                positions *= 1 / (max_seq_len / pretrained)  # dynamic linear scaling
            else:
                positions *= 1 / factor  # fixed linear scaling
        freqs = torch.outer(positions, self.inv_freq)  # [s, d2/2]
        if self.interleaved:
            emb = freqs.repeat_interleave(2, dim=-1)  # [f0, f0, f1, f1, ...]
        else:
            emb = torch.cat((freqs, freqs), dim=-1)  # [f0, f1, ..., f0, f1, ...]
        return emb.reshape(max_seq_len, 1, 1, self.rotary_dim).contiguous()


def rotate_half(x: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """The "multiply by i" of each channel pair: (x1, x2) -> (-x2, x1).

    Half-split pairs are channels (j, j + d2/2); interleaved pairs are channels (2j, 2j + 1).
    """
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def freqs_on_cp_rank(freqs: torch.Tensor, seq_len: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Rows of the angle table that a context-parallel rank needs (dual-chunk, as TE does).

    With context parallelism the full sequence of length ``seq_len * cp_size`` is cut into
    ``2 * cp_size`` chunks; rank r holds chunk r and chunk ``2 * cp_size - 1 - r`` (this balances
    causal attention work). Its local sequence of length ``seq_len`` therefore uses positions
    ``[r * seq_len/2, (r+1) * seq_len/2)`` followed by the mirrored chunk from the end.
    """
    if cp_size == 1:
        return freqs
    chunk = seq_len // 2
    full = seq_len * cp_size
    return torch.cat(
        [
            freqs[cp_rank * chunk : (cp_rank + 1) * chunk],
            freqs[full - (cp_rank + 1) * chunk : full - cp_rank * chunk],
        ]
    )


def _sequence_rows(freqs: torch.Tensor, seq_len: int, cp_size: int, cp_rank: int,
                   start: int = 0) -> torch.Tensor:
    """Angle rows ``[seq_len, 1, 1, d2]`` of one local sequence, as TransformerEngine takes them:
    the table is first offset by the sequence's start position, then this rank's two chunks of
    the ``seq_len * cp_size`` rows that follow are taken (``freqs_on_cp_rank``)."""
    return freqs_on_cp_rank(freqs[start:], seq_len, cp_size, cp_rank)[:seq_len]


def _rope_dense(t: torch.Tensor, rows: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """RoPE on t: [s, b, h, d] with angle rows [s, 1 or b, 1, d2]."""
    rotary_dim = rows.shape[-1]
    # cos/sin first, in the table's dtype as TE's formula takes them (float64 for a float64 t),
    # then the cast to t's dtype.
    angles = rows.double() if t.dtype == torch.float64 else rows
    cos = torch.cos(angles).to(t.dtype)
    sin = torch.sin(angles).to(t.dtype)
    t_rot, t_pass = t[..., :rotary_dim], t[..., rotary_dim:]
    t_rot = t_rot * cos + rotate_half(t_rot, interleaved) * sin
    return torch.cat((t_rot, t_pass), dim=-1)


def _dense_rows(freqs, seq_len, start_positions, cp_size, cp_rank):
    """[s, 1, 1, d2], or [s, b, 1, d2] with one table slice per batch element's start."""
    if start_positions is None:
        return _sequence_rows(freqs, seq_len, cp_size, cp_rank)
    return torch.cat([_sequence_rows(freqs, seq_len, cp_size, cp_rank, int(p))
                      for p in start_positions.tolist()], dim=1)


def rope_reference(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
) -> torch.Tensor:
    """Naive RoPE, differentiable by autograd; ground truth for every kernel in this package.

    Args:
        t: ``[s, b, h, d]`` (sbhd), ``[b, s, h, d]`` (bshd) or ``[t, h, d]`` (thd).
        freqs: angles ``[max_seq_len, 1, 1, d2]``; cos/sin are taken in freqs' dtype, as
            TransformerEngine's formula takes them (float64 when ``t`` is float64: pass a
            float64 ``t`` for an exact reference), and cast to ``t.dtype``.
        start_positions: int ``[b]`` (or ``[n_seqs]`` for thd): position offset per sequence.
            With ``cp_size > 1`` the offset applies to the global sequence: the rows of
            sequence i are ``freqs[start_i : start_i + len_i * cp_size]``, of which this rank
            takes its two chunks (TransformerEngine's order).
        cu_seqlens: int ``[n_seqs + 1]`` cumulative (padded, global) sequence lengths, for thd.
        cp_size, cp_rank: context-parallel world size and rank (dual-chunk slicing).

    Returns a new tensor of ``t``'s shape and dtype. Performs no input validation.
    """
    if tensor_format == "sbhd":
        rows = _dense_rows(freqs, t.shape[0], start_positions, cp_size, cp_rank)
        return _rope_dense(t, rows, interleaved)
    if tensor_format == "bshd":
        rows = _dense_rows(freqs, t.shape[1], start_positions, cp_size, cp_rank)
        return _rope_dense(t.transpose(0, 1), rows, interleaved).transpose(0, 1)
    if tensor_format == "thd":
        local_cu = (cu_seqlens // cp_size).tolist()
        pieces = []
        for i, (begin, end) in enumerate(zip(local_cu[:-1], local_cu[1:])):
            x = t[begin:end].unsqueeze(1)  # [len_i, 1, h, d]
            start = 0 if start_positions is None else int(start_positions[i])
            pieces.append(_rope_dense(x, _sequence_rows(freqs, end - begin, cp_size, cp_rank,
                                                        start), interleaved))
        return torch.cat(pieces).squeeze(1)
    raise ValueError(f"tensor_format must be 'sbhd', 'bshd' or 'thd', got {tensor_format!r}")


def cos_sin_cache_reference(positions: torch.Tensor, x: torch.Tensor, head_size: int,
                            cos_sin_cache: torch.Tensor, is_neox: bool = True) -> torch.Tensor:
    """FlashInfer's ``apply_rope_with_cos_sin_cache`` for one of q or k, in float64.

    Args:
        positions: int ``[num_tokens]``, any order: each token's row of the cache.
        x: ``[num_tokens, heads * head_size]`` (query or key).
        cos_sin_cache: ``[max_position, rotary_dim]``: a row holds the cos of the rotary_dim / 2
            pairs, then their sin.
        is_neox: half-split pairs (channel j with j + rotary_dim / 2); False: interleaved pairs
            (2j with 2j + 1).

    Returns x rotated, float64 ``[num_tokens, heads * head_size]``; the channels past rotary_dim
    as they were. Performs no input validation."""
    n = x.shape[0]
    cos, sin = cos_sin_cache.double()[positions.long()].chunk(2, dim=-1)  # [T, R/2] each
    return _rotate_pairs(x.reshape(n, -1, head_size), cos, sin, not is_neox).reshape(n, -1)


def mrope_cos_sin_cache_reference(positions: torch.Tensor, x: torch.Tensor, head_size: int,
                                  cos_sin_cache: torch.Tensor, mrope_section, mrope_interleaved:
                                  bool = False, is_neox: bool = True) -> torch.Tensor:
    """vLLM's ``MRotaryEmbedding.forward_native`` for one of q or k, in float64.

    Args:
        positions: int ``[3, num_tokens]``: each token's T, H and W rows of the cache.
        x: ``[num_tokens, heads * head_size]`` (query or key).
        cos_sin_cache: ``[max_position, rotary_dim]``, cos of the pairs then their sin.
        mrope_section: ``[t, h, w]`` pairs per axis, adding up to rotary_dim / 2.
        mrope_interleaved: pair j on H where ``j % 3 == 1 and j < 3h``, on W where ``j % 3 == 2
            and j < 3w``, else on T (Qwen3-VL); False: the first t pairs on T, the next h on H,
            the last w on W.
        is_neox: half-split pairs; False: interleaved pairs (2j, 2j + 1).

    Returns x rotated, float64 ``[num_tokens, heads * head_size]``; the channels past rotary_dim
    as they were. Performs no input validation."""
    n = x.shape[0]
    cos, sin = cos_sin_cache.double()[positions.long()].chunk(2, dim=-1)  # [3, T, R/2] each
    pair = torch.arange(cos.shape[-1], device=cos.device)
    if mrope_interleaved:
        on_h = (pair % 3 == 1) & (pair < 3 * mrope_section[1])
        on_w = (pair % 3 == 2) & (pair < 3 * mrope_section[2])
        axis = torch.where(on_w, 2, torch.where(on_h, 1, 0))
    else:
        axis = torch.repeat_interleave(torch.arange(3, device=cos.device),
                                       torch.tensor(list(mrope_section), device=cos.device))
    # Pair j's cos and sin from the row of its axis: [T, R/2].
    cos, sin = (t.gather(0, axis.expand(1, n, -1))[0] for t in (cos, sin))
    return _rotate_pairs(x.reshape(n, -1, head_size), cos, sin, not is_neox).reshape(n, -1)


def _rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  interleaved: bool) -> torch.Tensor:
    """x ``[tokens, heads, head_dim]`` rotated in float64 by one angle per pair and token (cos
    and sin ``[tokens, rotary_dim / 2]``): pairs (2j, 2j + 1) if ``interleaved``, else (j, j +
    rotary_dim / 2); the channels past rotary_dim as they were."""
    x = x.double()
    cos, sin = cos.double()[:, None], sin.double()[:, None]  # [tokens, 1, R/2]
    rotary_dim = 2 * cos.shape[-1]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = rot.chunk(2, dim=-1)
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rot, rest), dim=-1)


def pos_ids_reference(positions: torch.Tensor, x: torch.Tensor, inv_freq: torch.Tensor,
                      interleave: bool = False) -> torch.Tensor:
    """FlashInfer's ``apply_rope_pos_ids`` for one of q or k, in float64.

    Args:
        positions: int ``[nnz]``, each token's position.
        x: ``[nnz, heads, head_dim]`` (q or k).
        inv_freq: float32 ``[rotary_dim / 2]``, each pair's frequency
            (``rope_qk.inv_freq_table``).
        interleave: pairs (2j, 2j + 1); False: (j, j + rotary_dim / 2).

    The angle of pair j is ``float32(position) * inv_freq[j]`` rounded to float32, as FlashInfer's
    kernel and transformers' rotary modules form it: that product is the definition the
    functions implement (at position 1e5 its rounding alone is up to 4e-3 rad, far above any
    error of the kernels' cos and sin). Its cos and sin, and the rotation, are float64.

    Returns x rotated, float64 ``[nnz, heads, head_dim]``; the channels past rotary_dim as they
    were. Performs no input validation."""
    angles = (positions.to(torch.float32)[:, None] * inv_freq.to(torch.float32)[None, :])
    return _rotate_pairs(x, angles.double().cos(), angles.double().sin(), interleave)
