"""Solutions to the exercises of notebook 03, "A 1-D Triton kernel".

Device-agnostic: on a machine without a GPU, importing ``rope_kernels`` (first line below) turns on
Triton's interpreter before the ``@triton.jit`` of this file runs, so the kernel runs on CPU
tensors; on a GPU it is compiled. ``tests/test_solutions_03.py`` checks every function.

Exercise 1: ``copy_passthrough``       a Triton kernel that copies only the channels past
                                       ``rotary_dim`` (the 1-D kernel's step 5 on its own).
Exercise 2: ``grid_info``              programs of a 1-D launch and masked-off rows of the last.
Exercise 3: ``cos_sin_evaluations``    cos/sin evaluations of the 1-D and the 2-D design.
"""

from __future__ import annotations

from typing import Optional

import rope_kernels  # noqa: F401  (turns on the interpreter when there is no GPU: import it first)
import torch
import triton
import triton.language as tl

__all__ = ["copy_passthrough", "grid_info", "cos_sin_evaluations"]


@triton.jit
def passthrough_kernel(
    x_ptr,
    out_ptr,
    n_rows,
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
    BLOCK_ROWS: tl.constexpr,
    PASS: tl.constexpr,  # power of two >= head_dim - rotary_dim
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)  # flat row indices, rows ordered [s, b, h]
    row_mask = rows < n_rows  # the last program may run past the end
    h = rows % heads
    b = (rows // heads) % batch
    s = rows // (heads * batch)
    p = rotary_dim + tl.arange(0, PASS)  # pass-through channels
    mask = row_mask[:, None] & (p < head_dim)[None, :]  # PASS is rounded up to a power of two
    x_row = (s * x_stride_s + b * x_stride_b + h * x_stride_h)[:, None]
    o_row = (s * o_stride_s + b * o_stride_b + h * o_stride_h)[:, None]
    x = tl.load(x_ptr + x_row + p[None, :] * x_stride_d, mask=mask)
    tl.store(out_ptr + o_row + p[None, :] * o_stride_d, x, mask=mask)


def _as_sbhd(t: torch.Tensor, tensor_format: str) -> torch.Tensor:
    """A ``[s, b, h, d]`` view of ``t`` (no copy): bshd is transposed, thd gets a batch of 1."""
    if tensor_format == "sbhd":
        return t
    if tensor_format == "bshd":
        return t.transpose(0, 1)
    if tensor_format == "thd":
        return t.unsqueeze(1)
    raise ValueError(f"tensor_format must be 'sbhd', 'bshd' or 'thd', got {tensor_format!r}")


def copy_passthrough(
    t: torch.Tensor,
    rotary_dim: int,
    out: torch.Tensor,
    tensor_format: str = "sbhd",
    block_rows: int = 16,
) -> torch.Tensor:
    """Exercise 1: copy channels ``rotary_dim:`` of every row of ``t`` into ``out``; nothing else.

    One program per ``block_rows`` rows, exactly the row arithmetic of the 1-D kernel (flat row
    -> ``(s, b, h)`` -> memory offset through the strides), with a ``[block_rows, PASS]`` tile of
    channels. Channels ``:rotary_dim`` of ``out`` are left as they were (the NaN-poison test
    checks it), as is everything outside ``out``.

    Args:
        t: ``[s, b, h, d]`` (sbhd), ``[b, s, h, d]`` (bshd) or ``[tokens, h, d]`` (thd); any strides.
        rotary_dim: first channel to copy (``0 <= rotary_dim <= d``).
        out: tensor of ``t``'s shape and dtype, any strides, on ``t``'s device.
        tensor_format: the layout of ``t`` and ``out``.
        block_rows: rows per program, a power of two.

    Returns ``out``. Offsets are 32-bit: tensors must be smaller than 2**31 elements.
    """
    if out.shape != t.shape or out.dtype != t.dtype:
        raise ValueError(f"out must match t: {tuple(out.shape)} {out.dtype} vs "
                         f"{tuple(t.shape)} {t.dtype}")
    if block_rows <= 0 or block_rows & (block_rows - 1):
        raise ValueError(f"block_rows must be a power of two, got {block_rows}")
    x4, o4 = _as_sbhd(t, tensor_format), _as_sbhd(out, tensor_format)
    s, b, h, d = x4.shape
    if not 0 <= rotary_dim <= d:
        raise ValueError(f"rotary_dim must be in [0, {d}], got {rotary_dim}")
    n_rows = s * b * h
    if n_rows == 0 or rotary_dim == d:
        return out
    pass_width = triton.next_power_of_2(d - rotary_dim)
    grid = (triton.cdiv(n_rows, block_rows),)
    passthrough_kernel[grid](
        x4, o4, n_rows, b, h, rotary_dim, d,
        *x4.stride(), *o4.stride(),
        BLOCK_ROWS=block_rows, PASS=pass_width,
    )
    return out


def grid_info(n_rows: int, block_rows: int) -> tuple[int, int]:
    """Exercise 2: ``(programs, masked-off rows of the last program)`` of a 1-D launch.

    ``programs = ceil(n_rows / block_rows)`` (``triton.cdiv``); the last program covers rows up
    to ``programs * block_rows - 1``, of which those ``>= n_rows`` are masked off. Zero rows
    launch nothing: ``(0, 0)``.
    """
    if n_rows < 0 or block_rows <= 0:
        raise ValueError(f"need n_rows >= 0 and block_rows > 0, got {n_rows}, {block_rows}")
    programs = -(-n_rows // block_rows)
    return programs, programs * block_rows - n_rows


def cos_sin_evaluations(
    seq_len: int,
    batch: int,
    heads: int,
    rotary_dim: int,
    design: str = "1d",
    block_h: int = 8,
    batch_per_program: Optional[int] = None,
    has_start: bool = False,
) -> int:
    """Exercise 3: ``tl.cos`` + ``tl.sin`` element evaluations of one forward (sbhd or bshd).

    Both kernels evaluate cos and sin of *both* channels of every pair (four per pair; the
    unfused formula's table holds each angle twice). Only unmasked lanes are counted.

    - ``"1d"``: every row (position, batch element, head) computes its own:
      ``4 * seq_len * batch * heads * rotary_dim/2``.
    - ``"2d"``: one evaluation per position and pair in each program, reused by the
      ``block_h`` heads of the tile and the ``batch_per_program`` batch elements it loops over:
      ``4 * seq_len * rotary_dim/2 * ceil(heads/block_h) * ceil(batch/batch_per_program)``
      (``batch_per_program`` defaults to ``batch``: one program per tile covers the whole
      batch). With ``has_start`` (a per-batch position offset) the reuse over the batch is lost:
      every batch element needs its own angles.
    - ``"min"``: one cos and one sin per position and pair, ``2 * seq_len * rotary_dim/2``.

    For TransformerEngine's default shape (4096, 16, 32, 128): 536,870,912 (1-D), 4,194,304 (2-D
    with 8-head tiles over the whole batch), 524,288 (minimum).
    """
    pairs = rotary_dim // 2
    if design == "1d":
        return 4 * seq_len * batch * heads * pairs
    if design == "2d":
        bpp = batch if batch_per_program is None else batch_per_program
        head_tiles = -(-heads // block_h)
        batch_steps = batch if has_start else -(-batch // bpp)
        return 4 * seq_len * pairs * head_tiles * batch_steps
    if design == "min":
        return 2 * seq_len * pairs
    raise ValueError(f"design must be '1d', '2d' or 'min', got {design!r}")
