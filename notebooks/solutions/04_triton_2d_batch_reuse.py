"""Solutions to the exercises of notebook 04, "The 2-D batch-reusing kernel".

``tests/test_solutions_04.py`` checks every function against the package: the launch plan against
``rope_kernels.rope_2d.default_config`` and the grid ``rope_2d`` really launches, the tile check
against the float64 reference, the byte count against the recorded benchmark in ``figures/``.

Exercise 1: ``launch_plan``     the grid and config ``rope_2d`` picks for a shape.
Exercise 2: ``check_config``    run ``rope_2d`` with a given tile on partial tiles and check that
                                every element is right and nothing outside the output is written.
Exercise 3: ``ideal_time``      the bytes a RoPE call must move, and its time at copy bandwidth.
Exercise 4: ``whole_row_rotate`` section 3.8's whole-row rotation in PyTorch, forward and backward.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch

__all__ = ["launch_plan", "check_config", "ideal_time", "whole_row_rotate"]


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _floor_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def launch_plan(shape, tensor_format: str = "sbhd", rotary_dim: Optional[int] = None,
                element_size: int = 2, interleaved: bool = False,
                sm_count: Optional[int] = None, whole_rows: bool = False):
    """Exercise 1: the grid and config that ``rope_2d`` launches for a tensor of ``shape``.

    Mirrors ``rope_kernels.rope_2d.default_config`` and the grid formula of ``rope_2d``:

    * the input is first seen as ``[seq_rows, batch, heads, d]``; thd (``[tokens, h, d]``) is a
      batch of one;
    * a tile of ``block_s`` positions x ``block_b`` batch elements x ``block_h`` heads (powers of
      two) holds about 8 KB of input on a GPU: heads first (at most half the rows; 4 for bshd),
      then up to 8 positions, then batch elements;
    * thd tiles hold 2048 elements: up to 16 heads of one token in 16-bit (2 warps), 4 tokens x 4
      heads in fp32 (4 warps);
    * bshd rows of all heads of at most 4 KB are tiled whole: one row a tile, or as many as make
      2 KB, of one batch element, 2 warps, ``group_b`` 1;
    * ``group_b``: 2 for other bshd tiles, else every batch block; 4 warps;
    * interleaved pairs of a contiguous tensor are read one word per pair, so they tile like
      half-split pairs (``interleaved`` changes nothing here);
    * on a GPU, 16-bit half-split rows of 256 B or more (head_dim 128 and up) move as whole
      rows, on the tile's own warps (with ``whole_rows``, i.e. ``rope_2d.WHOLE_ROWS``, off by
      default: on twice the warps, at most 8); bshd tiles of 4 positions or more gather the
      backward's partner sines in registers (``gather_sines``) where ``rotary_dim`` is a power
      of two. Interleaved pairs, fp32, narrower rows and, by default, bshd rows of more than
      256 B keep the pairs;
    * half-split pairs whose rotary_dim is not a multiple of 16 (20 of 80, say) move as whole
      rows cut at the rotary block, the partners gathered in registers (``gather``), on at most 2
      warps, in every dtype, on a GPU and in the interpreter;
    * in the interpreter (``sm_count=None``) the tile holds up to 16384 channels.

    ``sm_count`` only says "GPU or not" now (the heuristic no longer depends on the SM count).

    Returns ``(grid, config)``: ``grid`` = ``(programs, 1, 1)`` (a 1-D grid), ``config`` a dict with
    ``block_s``, ``block_b``, ``block_h``, ``group_b``, ``num_warps``, ``whole_rows``,
    ``gather_sines`` and ``gather``.
    """
    if tensor_format == "sbhd":
        seq_rows, batch, heads, d = shape
    elif tensor_format == "bshd":
        batch, seq_rows, heads, d = shape
    elif tensor_format == "thd":
        seq_rows, heads, d = shape
        batch = 1
    else:
        raise ValueError(f"unknown tensor_format {tensor_format!r}")
    rotary_dim = d if rotary_dim is None else rotary_dim
    half = _next_pow2(rotary_dim // 2)
    width = 2 * half + (_next_pow2(d - rotary_dim) if d > rotary_dim else 0)
    on_gpu = sm_count is not None
    num_warps = 4
    max_positions = 8 if on_gpu else None
    group_b = 2 if tensor_format == "bshd" else None  # None: every batch block
    if not on_gpu:
        rows = max(1, 16384 // width)
        head_share = rows
    elif tensor_format == "thd":
        # 2048 elements: one token's run of up to 16 heads (16-bit, 2 warps), 4 tokens x 4 heads
        # (fp32, 4 warps); no cap on the tokens but the budget
        rows = max(1, 2048 // width)
        head_share = rows if element_size < 4 else 4
        max_positions = None
        num_warps = 2 if element_size < 4 else 4
    elif tensor_format == "bshd" and _next_pow2(heads) * width * element_size <= 4096:
        rows = max(1, 2048 // (width * element_size))  # whole rows of all heads
        head_share = _next_pow2(heads)
        max_positions = None
        num_warps = 2
        group_b = 1
    elif tensor_format == "bshd":
        rows = max(1, 8192 // (width * element_size))
        head_share = 4
    else:
        rows = max(1, 8192 // (width * element_size))
        head_share = rows // 2
    block_h = min(_next_pow2(max(1, heads)), _floor_pow2(max(1, head_share)))
    rows = max(1, rows // block_h)
    block_s = min(_next_pow2(max(1, seq_rows)), _floor_pow2(rows),
                  rows if max_positions is None else max_positions)
    rows = max(1, rows // block_s)
    block_b = min(_next_pow2(max(1, batch)), _floor_pow2(rows))
    b_blocks = _cdiv(batch, block_b)
    if group_b is None:
        group_b = max(1, b_blocks)
    rows_fit = on_gpu and element_size == 2 and not interleaved and d * element_size >= 256
    if tensor_format == "bshd" and d * element_size > 256 and not whole_rows:
        rows_fit = False  # longer bshd rows keep the pairs (their whole-row backward is slow)
    if rows_fit and whole_rows:  # the opt-in: twice the warps
        num_warps = min(8, 2 * num_warps)
    # rotary_dim not a multiple of 16 (half-split pairs): whole rows cut at the rotary block, the
    # partners gathered in registers, on at most 2 warps, in every dtype and the interpreter
    partners = not interleaved and rotary_dim < d and rotary_dim % 16 != 0
    if partners:
        rows_fit = True
        num_warps = min(2, num_warps)
    # bshd tiles of 4 positions or more gather the backward's partner sines in registers
    gather = (rows_fit and tensor_format == "bshd" and block_s >= 4
              and rotary_dim > 0 and rotary_dim & (rotary_dim - 1) == 0)
    config = dict(block_s=block_s, block_b=block_b, block_h=block_h, group_b=group_b,
                  num_warps=num_warps, whole_rows=rows_fit, gather_sines=gather, gather=partners)
    group = min(group_b, b_blocks)
    programs = _cdiv(seq_rows, block_s) * _cdiv(heads, block_h) * _cdiv(b_blocks, group) * group
    return (programs, 1, 1), config


def check_config(config: dict, shape=(7, 3, 5, 24), tensor_format: str = "sbhd",
                 rotary_dim: Optional[int] = 12, interleaved: bool = False,
                 dtype: torch.dtype = torch.float32, seed: int = 0, margin: int = 97,
                 device: Optional[torch.device] = None,
                 launcher: Optional[Callable[..., torch.Tensor]] = None) -> dict:
    """Exercise 2: run the 2-D kernel with a given tile and check it, partial tiles included.

    The output is a window inside a larger NaN-filled buffer (``margin`` elements of NaN on each
    side): afterwards the window must hold no NaN (every element was written), the margins must
    still be NaN (no stray write), and the window must match the float64 reference within
    ``atol + rtol * |ref|`` (rtol one ulp of ``dtype``, 8 for float32; atol 1e-5), the tolerance of
    the package's tests.

    Args:
        config: tile for ``rope_2d(..., config=config)``, e.g. ``dict(block_s=4, block_b=2,
            block_h=2)``; pick sizes that do not divide the shape, to get partial tiles.
        shape, tensor_format, rotary_dim, interleaved, dtype: the problem (keep it tiny on CPU).
        launcher: what to run, called as ``launcher(t, freqs, tensor_format, out=...,
            interleaved=..., config=...)``; default ``rope_kernels.rope_2d``.

    Returns a dict: ``all_written``, ``margins_clean``, ``max_abs_err``, ``within_tol`` and
    ``ok`` (all three checks passed).
    """
    from rope_kernels import RotaryPositionEmbedding, rope_2d, rope_reference

    launcher = rope_2d if launcher is None else launcher
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    d = shape[-1]
    rotary_dim = d if rotary_dim is None else rotary_dim
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g).to(device, dtype)
    seq_len = shape[1] if tensor_format == "bshd" else shape[0]
    freqs = RotaryPositionEmbedding(rotary_dim, interleaved=interleaved, device=device)(seq_len)
    numel = t.numel()
    buf = torch.full((numel + 2 * margin,), float("nan"), dtype=dtype, device=device)
    out = buf[margin:margin + numel].view(shape)
    launcher(t, freqs, tensor_format, out=out, interleaved=interleaved, config=config)
    ref = rope_reference(t.double(), freqs, tensor_format, interleaved=interleaved)
    all_written = not bool(torch.isnan(out).any())
    margins_clean = bool(torch.isnan(buf[:margin]).all() and torch.isnan(buf[-margin:]).all())
    err = (out.double() - ref).abs()
    rtol = (8 if dtype == torch.float32 else 1) * torch.finfo(dtype).eps
    within = bool((err <= 1e-5 + rtol * ref.abs()).all())  # NaN compares False
    max_err = float(err.max()) if all_written else math.nan
    return dict(all_written=all_written, margins_clean=margins_clean, max_abs_err=max_err,
                within_tol=within, ok=all_written and margins_clean and within)


_SIZES = {"bf16": 2, "fp16": 2, "fp32": 4, torch.bfloat16: 2, torch.float16: 2,
          torch.float32: 4}


def ideal_time(shape, dtype="bf16", rotary_dim: Optional[int] = None,
               copy_gbps: float = 4274.6, table_rows: Optional[int] = None,
               tensor_format: str = "sbhd") -> dict:
    """Exercise 3: the fewest bytes a RoPE call must move, and its time at copy bandwidth.

    ``bytes = read t + write out + read the float32 angle rows used once``
    ``= 2 * numel * element_size + table_rows * rotary_dim * 4``, the count that
    ``rope_kernels.bench`` divides by the time to report GB/s. ``copy_gbps`` counts bytes read
    plus bytes written, like the bench's ceiling, so the ideal time is ``bytes / copy_gbps``.

    Args:
        shape: the tensor's shape (any format).
        dtype: ``"bf16"``, ``"fp16"``, ``"fp32"`` or a torch dtype.
        rotary_dim: rotated channels (default: all of the last dimension).
        copy_gbps: the device-to-device copy bandwidth, GB/s (read + write); default: an H200's,
            from an earlier recorded run (``figures/provenance.json`` holds the current one).
        table_rows: rows of the angle table read (default: the sequence length, ``shape[0]`` for
            sbhd/thd, ``shape[1]`` for bshd; for thd pass the longest sequence).

    Returns a dict with ``bytes`` (int) and ``us`` (microseconds at copy bandwidth).
    """
    size = _SIZES[dtype]
    rotary_dim = shape[-1] if rotary_dim is None else rotary_dim
    if table_rows is None:
        table_rows = shape[1] if tensor_format == "bshd" else shape[0]
    nbytes = 2 * math.prod(shape) * size + table_rows * rotary_dim * 4
    return dict(bytes=nbytes, us=nbytes / (copy_gbps * 1e9) * 1e6)


def whole_row_rotate(x: torch.Tensor, angles: torch.Tensor, backward: bool = False) -> torch.Tensor:
    """Exercise 4: the whole-row rotation of section 3.8 in PyTorch (half-split pairs).

    ``y[c] = x[c] * cos(theta[c]) + x[partner(c)] * s[c]`` for every channel ``c`` of a row, with
    ``partner(c)`` = ``c + d2/2`` in the first half of the ``d2 = rotary_dim`` rotated channels,
    ``c - d2/2`` in the second and ``c`` past them; ``s[c]`` = ``-sin(theta[c])`` in the first
    half, ``+sin(theta[c])`` in the second, 0 past them (where ``cos`` is taken as 1). The backward
    (the vector-Jacobian product, the transpose) takes the *partner's* signed sine, which has the
    other sign: ``dx[c] = dy[c] * cos(theta[c]) + dy[partner(c)] * s[partner(c)]`` (``partner``
    is its own inverse, so channel c's input reaches exactly outputs c and partner(c)).

    Args:
        x: ``[..., head_dim]`` (the rows), or the gradient of the output for ``backward``.
        angles: ``[..., rotary_dim]`` angles, broadcastable against ``x``'s leading axes (a
            TransformerEngine ``freqs`` table; its two halves may differ).
        backward: the transpose instead of the forward.

    Returns a new tensor like ``x``, computed in ``x``'s dtype.
    """
    head_dim, rotary_dim = x.shape[-1], angles.shape[-1]
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"angles.shape[-1] (rotary_dim) must be even and <= head_dim={head_dim}, "
                         f"got {rotary_dim}")
    half = rotary_dim // 2
    c = torch.arange(head_dim, device=x.device)
    partner = torch.where(c < half, c + half, torch.where(c < rotary_dim, c - half, c))
    sign = torch.where(c < half, -1.0, torch.where(c < rotary_dim, 1.0, 0.0)).to(x.dtype)
    # Past rotary_dim the angle is 0: cos 1, and the sign 0 removes the partner's term.
    theta = torch.nn.functional.pad(angles.to(x.dtype), (0, head_dim - rotary_dim))
    s = sign * theta.sin()
    if backward:
        s = s[..., partner]
    return x * theta.cos() + x[..., partner] * s
