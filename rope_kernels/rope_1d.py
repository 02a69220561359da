"""RoPE, 1-D Triton kernel: the simplest correct design. One self-contained file (torch, triton, stdlib).

The input is seen as a flat list of rows, one row per (position, batch element, head), each a
vector of ``head_dim`` channels. A 1-D grid of programs each takes ``BLOCK_ROWS`` consecutive
rows, works out where each row lives (from its flat index and the strides), and rotates its
channel pairs. Every row computes its own cos/sin, so the same angles are recomputed for every
batch element and head: that waste is what the 2-D kernel in ``rope_2d.py`` removes.

Usage (TransformerEngine conventions)::

    out = rope_1d(t, freqs, tensor_format="sbhd")           # forward
    grad_t = rope_1d(grad_out, freqs, backward=True)        # backward: sin negated

Shapes: ``t`` is ``[s, b, h, d]`` (sbhd), ``[b, s, h, d]`` (bshd) or ``[total_tokens, h, d]``
(thd, with ``cu_seqlens``); ``freqs`` is float32 ``[max_seq_len, 1, 1, rotary_dim]``. Any strides
are accepted; the output is a new contiguous tensor in ``t``'s format (or ``out=`` if given).
On a machine without a GPU set ``TRITON_INTERPRET=1`` before importing this file.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import triton
import triton.language as tl

# Triton reads TRITON_INTERPRET when @triton.jit runs, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# Sizes and counts are not specialised (fewer recompilations); strides and channel counts are,
# because stride == 1 and multiples of 16 are what let Triton vectorise loads and stores.
@triton.jit(do_not_specialize=["n_rows", "seq_len", "batch", "heads", "n_seqs", "search_steps", "cp_size", "cp_rank"])
def rope_1d_kernel(
    x_ptr,
    freqs_ptr,
    out_ptr,
    cu_seqlens_ptr,
    start_positions_ptr,
    n_rows,  # seq_rows * batch * heads
    seq_len,  # rows of the "sequence" axis: s, or total tokens for thd
    batch,
    heads,
    rotary_dim,
    head_dim,
    x_stride_s,
    x_stride_b,
    x_stride_h,
    x_stride_d,
    o_stride_s,
    o_stride_b,
    o_stride_h,
    o_stride_d,
    f_stride_s,
    f_stride_d,
    n_seqs,
    search_steps,
    cp_size,
    cp_rank,
    IS_THD: tl.constexpr,
    HAS_START: tl.constexpr,
    USE_CP: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr,
    INT64: tl.constexpr,  # 64-bit offsets, for tensors past 2**31 elements
    BLOCK_ROWS: tl.constexpr,
    HALF: tl.constexpr,  # power of two >= rotary_dim // 2: pairs per row
    PASS: tl.constexpr,  # power of two >= head_dim - rotary_dim, or 0: channels copied through
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # [BLOCK_ROWS] flat row indices
    if INT64:
        rows = rows.to(tl.int64)
    row_mask = rows < n_rows
    # Flat row index -> (s, b, h), rows ordered as [s, b, h] (h fastest).
    h = rows % heads
    b = (rows // heads) % batch
    s = rows // (heads * batch)

    # 1. The angle-table row of each row's position.
    if IS_THD:
        # Binary search for the sequence holding token s: cu[lo] <= s < cu[hi].
        # (`s * 0` rather than tl.zeros_like: the latter breaks in the interpreter when
        # triton was imported before TRITON_INTERPRET was set.)
        lo = s * 0
        hi = s * 0 + n_seqs
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            go_right = tl.load(cu_seqlens_ptr + mid) // cp_size <= s
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid)
        seq_begin = tl.load(cu_seqlens_ptr + lo) // cp_size
        cur_len = tl.load(cu_seqlens_ptr + lo + 1) // cp_size - seq_begin
        local = s - seq_begin
        seq_id = lo
    else:
        cur_len = seq_len
        local = s
        seq_id = b
    if USE_CP:
        # Dual-chunk context parallelism: first half = chunk cp_rank, second half = chunk
        # 2*cp_size - 1 - cp_rank of the global sequence.
        half_len = cur_len // 2
        pos = tl.where(
            local < half_len,
            local + cp_rank * half_len,
            cur_len * cp_size - (cp_rank + 1) * half_len + (local - half_len),
        )
    else:
        pos = local
    if HAS_START:
        pos += tl.load(start_positions_ptr + seq_id, mask=row_mask, other=0)

    # 2. The two channels of each pair: (j, j + d2/2) half-split, or (2j, 2j+1) interleaved.
    j = tl.arange(0, HALF)
    j_mask = j < rotary_dim // 2
    if INT64:
        j = j.to(tl.int64)
    if INTERLEAVED:
        c1 = 2 * j
        c2 = 2 * j + 1
    else:
        c1 = j
        c2 = j + rotary_dim // 2
    mask = row_mask[:, None] & j_mask[None, :]  # [BLOCK_ROWS, HALF]

    # 3. cos/sin of each channel's own angle, recomputed for every row.
    f_row = pos[:, None] * f_stride_s
    f1 = tl.load(freqs_ptr + f_row + c1[None, :] * f_stride_d, mask=mask, other=0.0)
    f2 = tl.load(freqs_ptr + f_row + c2[None, :] * f_stride_d, mask=mask, other=0.0)
    cos1 = tl.cos(f1)
    cos2 = tl.cos(f2)
    if BACKWARD:  # transpose of the rotation: R(-theta)
        sin1 = -tl.sin(f2)
        sin2 = -tl.sin(f1)
    else:
        sin1 = tl.sin(f1)
        sin2 = tl.sin(f2)

    # 4. Rotate: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin), in float32.
    x_row = (s * x_stride_s + b * x_stride_b + h * x_stride_h)[:, None]
    o_row = (s * o_stride_s + b * o_stride_b + h * o_stride_h)[:, None]
    x1 = tl.load(x_ptr + x_row + c1[None, :] * x_stride_d, mask=mask).to(tl.float32)
    x2 = tl.load(x_ptr + x_row + c2[None, :] * x_stride_d, mask=mask).to(tl.float32)
    y1 = x1 * cos1 - x2 * sin1
    y2 = x2 * cos2 + x1 * sin2
    tl.store(out_ptr + o_row + c1[None, :] * o_stride_d, y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + o_row + c2[None, :] * o_stride_d, y2.to(out_ptr.dtype.element_ty), mask=mask)

    # 5. Channels past rotary_dim are copied unchanged.
    if PASS > 0:
        p = rotary_dim + tl.arange(0, PASS)
        p_mask = row_mask[:, None] & (p < head_dim)[None, :]
        xp = tl.load(x_ptr + x_row + p[None, :] * x_stride_d, mask=p_mask)
        tl.store(out_ptr + o_row + p[None, :] * o_stride_d, xp, mask=p_mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _canonical(t: torch.Tensor, tensor_format: str):
    """(seq_rows, batch, heads, head_dim) sizes and strides of ``t`` seen as [s, b, h, d]."""
    if tensor_format == "sbhd":
        s, b, h, d = t.shape
        return (s, b, h, d), t.stride()
    if tensor_format == "bshd":
        b, s, h, d = t.shape
        sb, ss, sh, sd = t.stride()
        return (s, b, h, d), (ss, sb, sh, sd)
    if tensor_format == "thd":
        n, h, d = t.shape
        sn, sh, sd = t.stride()
        return (n, 1, h, d), (sn, 0, sh, sd)
    raise ValueError(f"tensor_format must be 'sbhd', 'bshd' or 'thd', got {tensor_format!r}")


def _max_offset(sizes, strides) -> int:
    return sum((n - 1) * abs(st) for n, st in zip(sizes, strides) if n > 0)


def rope_1d(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    backward: bool = False,
    out: Optional[torch.Tensor] = None,
    block_rows: Optional[int] = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """Apply RoPE (or, with ``backward=True``, its transpose) to ``t`` with the 1-D kernel.

    Arguments are those of ``rope_2d.rope_2d``; ``block_rows`` (rows per program, a power of
    two) defaults to about 2K elements per program on a GPU and 64K in the interpreter, which
    pays for every program it runs.
    """
    if t.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "rope_1d got CPU tensors but the Triton interpreter is off. Either move the tensors "
            "to a GPU, or set the environment variable TRITON_INTERPRET=1 before this module is "
            "imported (e.g. `TRITON_INTERPRET=1 python ...`)."
        )
    (seq_rows, batch, heads, head_dim), x_strides = _canonical(t, tensor_format)
    rotary_dim = freqs.shape[-1]
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"freqs.shape[-1] (rotary_dim) must be even and <= head_dim={head_dim}, "
                         f"got {rotary_dim}")
    if out is None:
        out = torch.empty_like(t, memory_format=torch.contiguous_format)
    elif out.shape != t.shape or out.dtype != t.dtype or out.device != t.device:
        raise ValueError(f"out must match t (shape {tuple(t.shape)}, {t.dtype}, {t.device}), got "
                         f"shape {tuple(out.shape)}, {out.dtype}, {out.device}")
    _, o_strides = _canonical(out, tensor_format)
    n_rows = seq_rows * batch * heads
    if n_rows == 0 or head_dim == 0:
        return out
    half = _next_pow2(rotary_dim // 2)
    pass_width = _next_pow2(head_dim - rotary_dim) if head_dim > rotary_dim else 0
    if block_rows is None:
        budget = 65536 if INTERPRETED else 2048
        rows = budget // (2 * half + pass_width)
        # rounded down to a power of two: it is the size of a tl.arange
        block_rows = min(_next_pow2(n_rows), 1 << max(0, rows.bit_length() - 1))
    is_thd = tensor_format == "thd"
    # The kernel reads cu_seqlens and start_positions with stride 1: a strided view (such as
    # position_ids[:, 0]) is copied first.
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()
    if start_positions is not None:
        start_positions = start_positions.contiguous()
    n_seqs = cu_seqlens.numel() - 1 if is_thd else 1
    sizes = (seq_rows, batch, heads, head_dim)
    int64 = max(n_rows * head_dim, _max_offset(sizes, x_strides), _max_offset(sizes, o_strides),
                _max_offset(freqs.shape, freqs.stride())) >= 2**31 - 1
    grid = (triton.cdiv(n_rows, block_rows),)
    # Triton launches on the current CUDA device and its stream, not on the tensors' device:
    # make theirs current for the launch (a model spread over several GPUs in one process).
    # Device -1 (CPU tensors, the interpreter) leaves everything as it is.
    with torch.cuda.device(t.device if t.is_cuda else -1):
        # Unused pointer arguments get `t` as a placeholder; constexpr flags keep them unread.
        rope_1d_kernel[grid](
            t, freqs, out,
            cu_seqlens if is_thd else t,
            start_positions if start_positions is not None else t,
            n_rows, seq_rows, batch, heads, rotary_dim, head_dim,
            *x_strides, *o_strides,
            freqs.stride(0), freqs.stride(-1),
            n_seqs, max(1, (n_seqs - 1).bit_length()) if is_thd else 0, cp_size, cp_rank,
            IS_THD=is_thd,
            HAS_START=start_positions is not None,
            USE_CP=cp_size > 1,
            INTERLEAVED=bool(interleaved),
            BACKWARD=bool(backward),
            INT64=int64,
            BLOCK_ROWS=block_rows,
            HALF=half,
            PASS=pass_width,
            num_warps=num_warps,
            # Fused multiply-adds on, as Triton 3.6-3.9 compile by default (3.9 warns that the
            # default turns them off in 3.10).
            enable_fp_fusion=True,
        )
    return out
