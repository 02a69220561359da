"""Solutions to the exercises of notebook 02, "The naive PyTorch RoPE: what eager mode costs".

Plain PyTorch only; ``tests/test_solutions_02.py`` checks every function against the package's
ground truth, ``rope_kernels.rope_reference``, and against independent counts.

Exercise 1: ``rope_no_cat``        RoPE written into a preallocated output: no ``torch.cat``, no
                                   ``rotate_half`` temporaries.
Exercise 2: ``unfused_bytes``      bytes read + written by the unfused formula, for any shape,
                                   dtype, rotary_dim and pair layout.
Exercise 3: ``rope_thd_by_loop``   the packed ``thd`` layout, one sequence at a time through the
                                   ``sbhd`` formula.
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["rope_no_cat", "unfused_bytes", "rope_thd_by_loop"]


def _cos_sin(freqs: torch.Tensor, dtype: torch.dtype):
    """cos/sin of the angle rows exactly as TE's unfused code takes them: in float32 (float64 for a
    float64 input), then cast to the input's dtype."""
    angles = freqs.to(torch.promote_types(freqs.dtype, dtype))
    return torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


def rope_no_cat(
    t: torch.Tensor,
    freqs: torch.Tensor,
    interleaved: bool = False,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Exercise 1: RoPE of an sbhd tensor without concatenations.

    The two channels of every pair are written straight into their place in ``out``:

        out[c1] = x[c1] * cos[c1] - x[c2] * sin[c1]
        out[c2] = x[c2] * cos[c2] + x[c1] * sin[c2]

    with ``(c1, c2) = (j, j + d2/2)`` (half-split) or ``(2j, 2j + 1)`` (interleaved), and the
    channels past ``d2`` are copied. ``torch.mul(..., out=view)`` and ``addcmul_`` write into
    views of ``out``, so neither ``rotate_half``'s negated copy and concatenation nor the final
    ``cat`` exist: 4 elementwise kernels on half-size views (plus a copy for partial rotary)
    instead of 6 kernels on ``t``-sized tensors. It moves about 5x the bytes of ``t`` instead of
    12x (the minimum, read ``t`` and write ``out``, is 2x): better, but still not one pass.

    Args:
        t: ``[s, b, h, d]``, any floating dtype, any strides.
        freqs: angles ``[>= s, 1, 1, d2]`` (``d2`` even, ``<= d``), as from
            ``RotaryPositionEmbedding``; row ``m`` is used for sequence index ``m``.
        interleaved: pairs ``(2j, 2j + 1)`` instead of ``(j, j + d2/2)``.
        out: optional output of ``t``'s shape and dtype (any strides); a new tensor if None.

    Returns ``out``. In float64 it equals ``rope_reference`` to rounding; in low precision it
    differs by at most about one unit in the last place, because ``addcmul_`` rounds once where
    the formula rounds the two products and their sum separately.
    """
    s, d, d2 = t.shape[0], t.shape[-1], freqs.shape[-1]
    if d2 % 2 or d2 > d:
        raise ValueError(f"rotary_dim must be even and <= head_dim={d}, got {d2}")
    if out is None:
        out = torch.empty_like(t)
    cos, sin = _cos_sin(freqs[:s], t.dtype)  # [s, 1, 1, d2], broadcast over b and h
    if interleaved:
        i1, i2 = slice(0, d2, 2), slice(1, d2, 2)
    else:
        i1, i2 = slice(0, d2 // 2), slice(d2 // 2, d2)
    x1, x2 = t[..., i1], t[..., i2]
    o1, o2 = out[..., i1], out[..., i2]
    torch.mul(x1, cos[..., i1], out=o1)
    o1.addcmul_(x2, sin[..., i1], value=-1)
    torch.mul(x2, cos[..., i2], out=o2)
    o2.addcmul_(x1, sin[..., i2])
    if d2 < d:
        out[..., d2:].copy_(t[..., d2:])
    return out


def unfused_bytes(
    seq_len: int,
    batch: int,
    heads: int,
    head_dim: int,
    rotary_dim: Optional[int] = None,
    dtype: torch.dtype = torch.bfloat16,
    interleaved: bool = False,
) -> int:
    """Exercise 2: bytes read plus bytes written by ``rope_reference`` on an sbhd tensor.

    Counts every operation of ``_rope_dense`` that produces new data (views move nothing), each
    operand counted at its own size (a broadcast ``[s, 1, 1, d2]`` table once, not once per
    head). No ``start_positions``, the table is float32 ``[>= seq_len, 1, 1, rotary_dim]``.

    Steps (``e`` = element size of ``dtype``, ``a`` = that of the angle dtype, float32 or, for a
    float64 input, float64; ``T = seq_len * rotary_dim`` table entries, ``N = seq_len * batch *
    heads * rotary_dim`` rotated elements, ``P`` the pass-through elements):

    - float64 input only: table to float64 (read ``4T``, write ``8T``);
    - cos and sin (read ``aT``, write ``aT`` each), then the casts to ``dtype`` unless it is the
      angle dtype (read ``aT``, write ``eT`` each);
    - ``t_rot * cos`` (read ``eN + eT``, write ``eN``);
    - rotate_half: negate half the channels (read and write ``eN/2``), then ``cat`` (half-split)
      or ``stack`` (interleaved) (read ``eN``, write ``eN``);
    - ``* sin`` (read ``eN + eT``, write ``eN``); the sum (read ``2eN``, write ``eN``);
    - the final ``cat`` with the pass-through channels (read ``e(N + P)``, write ``e(N + P)``).
    """
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    e = torch.tensor([], dtype=dtype).element_size()
    angle_dtype = torch.promote_types(torch.float32, dtype)
    a = torch.tensor([], dtype=angle_dtype).element_size()
    T = seq_len * rotary_dim
    N = seq_len * batch * heads * rotary_dim
    P = seq_len * batch * heads * (head_dim - rotary_dim)
    total = 0
    if angle_dtype != torch.float32:
        total += 4 * T + a * T  # freqs.to(float64)
    total += 2 * (a * T + a * T)  # cos, sin
    if dtype != angle_dtype:
        total += 2 * (a * T + e * T)  # .to(dtype) of cos and of sin
    total += e * (N + T) + e * N  # t_rot * cos
    total += e * (N // 2) + e * (N // 2)  # -x2 (half-split) or -x[..., 1::2] (interleaved)
    total += e * N + e * N  # cat((-x2, x1)) or stack((-x_odd, x_even))
    total += e * (N + T) + e * N  # rotate_half(t_rot) * sin
    total += 2 * e * N + e * N  # the sum
    total += e * (N + P) + e * (N + P)  # cat((t_rot, t_pass))
    # `interleaved` changes which ops run (stack instead of cat) but not their sizes.
    del interleaved
    return total


def rope_thd_by_loop(
    t: torch.Tensor,
    freqs: torch.Tensor,
    cu_seqlens: torch.Tensor,
    interleaved: bool = False,
    start_positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Exercise 3: RoPE of a packed ``[total_tokens, h, d]`` batch, one sequence at a time.

    Sequence ``i`` holds tokens ``cu_seqlens[i]:cu_seqlens[i+1]``; its tokens are at positions
    ``0, 1, ...`` (plus ``start_positions[i]`` if given). Each sequence is viewed as an sbhd
    tensor ``[len_i, 1, h, d]`` and rotated with the unfused formula using table rows
    ``start : start + len_i``; the results are written into one preallocated output (a slice
    assignment per sequence, no final ``cat``). Empty sequences are skipped.

    This is correct but launches about ten kernels per sequence: with thousands of short
    sequences the launches, not the bytes, set the time, which is why a fused kernel finds each
    token's sequence itself (a binary search over ``cu_seqlens``, notebook 03).
    """
    out = torch.empty_like(t)
    cu = [int(c) for c in cu_seqlens.tolist()]
    starts = [0] * (len(cu) - 1) if start_positions is None else start_positions.tolist()
    d2 = freqs.shape[-1]
    for i, (begin, end) in enumerate(zip(cu[:-1], cu[1:])):
        if end == begin:
            continue
        x = t[begin:end].unsqueeze(1)  # [len_i, 1, h, d]: an sbhd view, no copy
        f = freqs[int(starts[i]): int(starts[i]) + (end - begin)]
        cos, sin = _cos_sin(f, t.dtype)
        x_rot = x[..., :d2]
        if interleaved:
            rot = torch.stack((-x_rot[..., 1::2], x_rot[..., ::2]), dim=-1).flatten(-2)
        else:
            x1, x2 = torch.chunk(x_rot, 2, dim=-1)
            rot = torch.cat((-x2, x1), dim=-1)
        out[begin:end, :, :d2] = (x_rot * cos + rot * sin).squeeze(1)
        out[begin:end, :, d2:] = t[begin:end, :, d2:]
    return out
