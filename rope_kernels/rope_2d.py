"""RoPE, 2-D batch-reusing Triton kernel: the fast path. One self-contained file (torch, triton, stdlib).

Each program owns a tile of ``BLOCK_S`` positions x ``BLOCK_B`` batch elements x ``BLOCK_H`` heads:
the (batch element, head) pairs form the tile's second axis, so it is 2-D over (positions, rows
that share them). It computes cos/sin for its positions once and reuses them for every batch
element and head of the tile; programs that run side by side share positions, so the angle rows
they read come from cache. Rotated channels are processed as pairs ``(x1, x2) -> (x1*cos -
x2*sin, x2*cos + x1*sin)``; channels past ``rotary_dim`` are copied in the same pass.

Usage (TransformerEngine conventions)::

    out = rope_2d(t, freqs, tensor_format="sbhd")           # forward
    grad_t = rope_2d(grad_out, freqs, backward=True)        # backward: sin negated

Shapes: ``t`` is ``[s, b, h, d]`` (sbhd), ``[b, s, h, d]`` (bshd) or ``[total_tokens, h, d]``
(thd, with ``cu_seqlens``); ``freqs`` is float32 ``[max_seq_len, 1, 1, rotary_dim]``. Any strides
are accepted; the output is a new contiguous tensor in ``t``'s format (or ``out=`` if given).
On a machine without a GPU set ``TRITON_INTERPRET=1`` before importing this file.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Optional

import torch
import triton
import triton.language as tl

# Triton reads TRITON_INTERPRET when @triton.jit runs, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _positions(
    s_idx,
    seq_len,
    cu_seqlens_ptr,
    start_positions_ptr,
    seq_lo,
    seq_hi,
    search_steps,
    cp_size,
    cp_rank,
    IS_THD: tl.constexpr,
    HAS_START: tl.constexpr,
    USE_CP: tl.constexpr,
):
    """Row of the angle table used by each row index ``s_idx`` (a position, or a token for thd).

    For thd, the sequence holding each token is found by a binary search over ``cu_seqlens``
    between sequences ``seq_lo`` and ``seq_hi`` (every token lies in one of them), in
    ``search_steps`` >= ceil(log2(seq_hi - seq_lo)) iterations, so the launch never depends on the
    longest sequence. Per-batch start positions (sbhd/bshd) are added by the caller.
    """
    if IS_THD:
        # Invariant: cu[lo] <= token < cu[hi] (cu = local boundaries, cu_seqlens // cp_size).
        # Once hi == lo + 1 further steps change nothing. (`s_idx * 0` rather than
        # tl.zeros_like: the latter breaks in the interpreter when triton was imported before
        # TRITON_INTERPRET was set.)
        lo = s_idx * 0 + seq_lo
        hi = s_idx * 0 + seq_hi
        for _ in range(search_steps):
            mid = (lo + hi) // 2
            go_right = _local(tl.load(cu_seqlens_ptr + mid), cp_size, USE_CP) <= s_idx
            lo = tl.where(go_right, mid, lo)
            hi = tl.where(go_right, hi, mid)
        seq_begin = _local(tl.load(cu_seqlens_ptr + lo), cp_size, USE_CP)
        cur_len = _local(tl.load(cu_seqlens_ptr + lo + 1), cp_size, USE_CP) - seq_begin
        local = s_idx - seq_begin
    else:
        lo = s_idx
        cur_len = seq_len
        local = s_idx
    if USE_CP:
        # Dual-chunk context parallelism: the first half of the local sequence is chunk cp_rank,
        # the second half is chunk (2*cp_size - 1 - cp_rank) of the global sequence.
        half = cur_len // 2
        pos = tl.where(
            local < half,
            local + cp_rank * half,
            cur_len * cp_size - (cp_rank + 1) * half + (local - half),
        )
    else:
        pos = local
    if IS_THD:
        if HAS_START:
            pos += tl.load(start_positions_ptr + lo)
    return pos


@triton.jit
def _local(bound, cp_size, USE_CP: tl.constexpr):
    """A boundary of cu_seqlens in this rank's tokens: divided by cp_size only with context
    parallelism (a runtime division costs a dozen instructions per boundary)."""
    if USE_CP:
        bound = bound // cp_size
    return bound


@triton.jit
def _count_sequence(s_idx, cu_seqlens_ptr, n_seqs, cp_size, BOUNDS: tl.constexpr,
                    USE_CP: tl.constexpr, BOUNDS_EACH: tl.constexpr):
    """Sequence holding each token ``s_idx`` in a pack of few sequences (``n_seqs + 1 <= BOUNDS``):
    one load of every boundary, shared by the tile's tokens, and for each token a count of the
    boundaries at or below it. The last of them opens its sequence; an empty sequence repeats a
    boundary, and the count steps over it. One round trip to the cache where the binary search
    makes ceil(log2(n_seqs)) dependent ones.

    ``BOUNDS_EACH``: every token loads the boundaries itself, as a ``[tokens, BOUNDS]`` tile (the
    same lines, from L1) already in the layout of the count, where one load shared by the tokens
    must be moved to it. Triton 3.9 moves that load through shared memory and 30 more registers
    (3.6 keeps it in registers), which made one-warp tiles of 2 tokens x 8 heads 5-12% slower
    at 64 and 128 sequences; loaded this way they are not. Tiles on more warps, or of one token,
    ran faster with the shared load (docs/performance_notes.md)."""
    b = tl.arange(0, BOUNDS)
    if BOUNDS_EACH:
        b = b[None, :] + s_idx[:, None] * 0  # [tokens, BOUNDS]
    bound = _local(tl.load(cu_seqlens_ptr + b, mask=b <= n_seqs, other=2147483647),
                   cp_size, USE_CP)
    if not BOUNDS_EACH:
        bound = bound[None, :]  # the shared load, a [BOUNDS] vector, broadcast to the tokens
    below = tl.sum((bound <= s_idx[:, None]).to(tl.int32), axis=1)
    # Rows past the last token (masked) count every boundary: keep all rows in range.
    return tl.minimum(tl.maximum(below - 1, 0), n_seqs - 1)


@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "cp_size", "cp_rank"])
def thd_positions_kernel(cu_seqlens_ptr, start_positions_ptr, token_rows_ptr, n_tokens, n_seqs,
                         cp_size, cp_rank, HAS_START: tl.constexpr, USE_CP: tl.constexpr,
                         PDL_TRIGGER: tl.constexpr, SEQS: tl.constexpr, STEPS: tl.constexpr,
                         TOKENS: tl.constexpr):
    """Pre-pass for packs of many sequences: writes the angle-table row of each token
    (``_positions``: its sequence, the context-parallel mapping and the start position), so
    that the main kernel reads one int per token instead of searching in every tile.

    Program ``p`` takes the ``SEQS`` sequences ``s0 = p * SEQS`` .. ``s0 + SEQS - 1``. Their
    tokens are one run, ``cu[s0]`` .. ``cu[s0 + SEQS]``, which the program walks ``TOKENS`` at a
    time. It first loads the ``SEQS`` boundaries as one vector: that load is the only one from
    L2 or memory, and it leaves their lines in L1, so each token's binary search over the
    program's sequences (``STEPS = log2(SEQS)`` steps) reads L1 only. The launch plan picks
    ``SEQS`` for about PRE_PASS_PROGRAMS programs: the grid follows the sequences in blocks, the
    walk their tokens, and neither depends on the longest sequence (a long one costs its
    program more steps of stores, not more programs). ``n_tokens`` is not read: the runs of all
    programs are the tokens (the caller checks ``cu_seqlens[-1]``).

    ``PDL_TRIGGER``: with programmatic dependent launch (Hopper and later) the main kernel may
    start as soon as every program here has begun, and waits for this kernel's writes only where
    it reads them (``PDL_WAIT``): its x loads overlap this kernel instead of queueing behind it.
    """
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    s0 = tl.program_id(0) * SEQS
    k = tl.arange(0, SEQS)
    # The window's boundaries; those past the last sequence read as the largest int32. Its
    # minimum is the run's first token, which keeps the load (and its lines in L1).
    window = tl.load(cu_seqlens_ptr + s0 + k, mask=s0 + k <= n_seqs, other=2147483647)
    seq_hi = tl.minimum(s0 + SEQS, n_seqs)
    first = _local(tl.min(window, axis=0), cp_size, USE_CP)
    run_end = _local(tl.load(cu_seqlens_ptr + seq_hi), cp_size, USE_CP)
    while first < run_end:
        token = first + tl.arange(0, TOKENS)
        pos = _positions(token, 0, cu_seqlens_ptr, start_positions_ptr, s0, seq_hi, STEPS,
                         cp_size, cp_rank, True, HAS_START, USE_CP)
        tl.store(token_rows_ptr + token, pos, mask=token < run_end)
        first += TOKENS


@triton.jit
def _fast_sincos(x):
    """cos(x), sin(x) through the SFU's cos.approx/sin.approx (absolute error ~1e-6 after the
    range reduction; measured up to |x| = 1e5 by a round-4 probe, now in git history). Used for
    16-bit outputs, whose rounding (>= 5e-4) hides that error; libdevice's cos/sin take ~40
    instructions and registers enough to cost bandwidth."""
    # x - 2*pi*k in two steps: 6.28125 has 8 significant bits, so k * 6.28125 is exact for
    # |k| < 2**16 (|x| < ~4e5), and the second constant carries the rest of 2*pi.
    k = tl.floor(x * 0.15915494309189535 + 0.5)
    r = tl.fma(k, -6.28125, x)
    r = tl.fma(k, -0.0019353071795864769, r)
    c = tl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=f,f", [r], dtype=tl.float32,
                                  is_pure=True, pack=1)
    s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=f,f", [r], dtype=tl.float32,
                                  is_pure=True, pack=1)
    return c, s


@triton.jit
def _table(ptrs, mask):
    """Angle-table entries, 0 where masked, loaded ``evict_last``. Each row is read again by
    every batch element (bshd: one batch element's whole sequence apart) or every sequence of a
    pack (thd), and the streamed x and out evict it from L2 in between: without the hint each
    read came from memory again. With it, on an H200 (triton 3.6, 3 shuffled rounds, fraction of
    copy, forward / backward): bshd at TE's shape 0.963 -> 0.979 / 0.963 -> 0.978, head_dim 256
    0.938 -> 0.966 / 0.931 -> 0.959, interleaved 0.950 -> 0.970 / 0.935 -> 0.965; thd in 16
    sequences 0.957 -> 0.982 / 0.960 -> 0.984; sbhd, whose rows are reused by programs running
    side by side, level."""
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_last")


@triton.jit
def _cos_sin(freqs_ptr, pos, c1, c2, f_stride_s, f_stride_d, mask, BACKWARD: tl.constexpr,
             FAST_TRIG: tl.constexpr):
    """cos/sin of the angles of both channels of each pair, ``[..., HALF]`` each.

    Every output channel uses its own table entry, exactly like the unfused formula. The backward
    pass applies the transposed rotation R(-theta): sin is negated and the two channels exchange
    their sines (which changes nothing for the symmetric tables RoPE uses).

    The table is read ``evict_last`` (``_table``), here and in ``_cos_sin_row``.
    """
    row = pos * f_stride_s
    f1 = _table(freqs_ptr + row + c1 * f_stride_d, mask)
    f2 = _table(freqs_ptr + row + c2 * f_stride_d, mask)
    if FAST_TRIG:
        cos1, sin1 = _fast_sincos(f1)
        cos2, sin2 = _fast_sincos(f2)
    else:
        cos1 = tl.cos(f1)
        sin1 = tl.sin(f1)
        cos2 = tl.cos(f2)
        sin2 = tl.sin(f2)
    if BACKWARD:
        return cos1, -sin2, cos2, -sin1
    return cos1, sin1, cos2, sin2


@triton.jit
def _row_partner(rotary_dim, INT64: tl.constexpr, ROW: tl.constexpr):
    """Channels c [ROW] of a whole row, the channel each is paired with (half-split: c + d2/2
    in the first half of the rotary channels, c - d2/2 in the second; itself past them), and
    whether c is rotated."""
    c = tl.arange(0, ROW)
    half = rotary_dim // 2
    rotated = c < rotary_dim
    partner = tl.where(c < half, c + half, tl.where(rotated, c - half, c))
    if INT64:
        c = c.to(tl.int64)
        partner = partner.to(tl.int64)
    return c, partner, rotated


@triton.jit
def _cos_sin_row(freqs_ptr, pos, c, partner, rotary_dim, f_stride_s, f_stride_d, mask,
                 BACKWARD: tl.constexpr, FAST_TRIG: tl.constexpr, GATHER_SINES: tl.constexpr,
                 BLOCK_S: tl.constexpr, ROW: tl.constexpr):
    """Whole rows as ``y[c] = x[c] * cos[c] + x[partner(c)] * sin[c]``: every channel's cos and
    signed sin, ``[BLOCK_S, ROW]`` (-sin in the first half of the rotary channels, +sin in the
    second; cos 1 and sin 0 past them). The backward is the transpose: the partner's term takes
    the partner's sine, with the other sign. That sine is either computed again from the
    partner's angle (loaded again, from L1), or, with ``GATHER_SINES`` (the backward, a
    power-of-two rotary_dim, which GATHER_SINES is), taken from the row's own sines in
    registers: partner(c) = c ^ (rotary_dim / 2) below rotary_dim. The indices are known at
    compile time; computed at run time (from rotary_dim // 2) they made the gather as slow as the
    second sine in an H200 probe."""
    row = pos * f_stride_s
    f = _table(freqs_ptr + row + c * f_stride_d, mask)
    if BACKWARD and GATHER_SINES == 0:
        f_sin = _table(freqs_ptr + row + partner * f_stride_d, mask)
    else:
        f_sin = f
    if FAST_TRIG:
        cos, sin = _fast_sincos(f)
        if BACKWARD and GATHER_SINES == 0:
            _, sin = _fast_sincos(f_sin)
    else:
        cos = tl.cos(f)
        sin = tl.sin(f_sin)
    if BACKWARD and GATHER_SINES > 0:
        ch = tl.arange(0, ROW)
        src = tl.where(ch < GATHER_SINES, ch ^ (GATHER_SINES // 2), ch)
        sin = tl.gather(sin, tl.broadcast_to(src[None, :], [BLOCK_S, ROW]), axis=1)
    first = c < rotary_dim // 2
    sign = tl.where(first, -1.0, 1.0)
    if BACKWARD:
        sign = -sign
    cos = tl.where(mask, cos, 1.0)
    sin = tl.where(mask, sign * sin, 0.0)
    return cos, sin


@triton.jit
def _per_row(v, PAIRS: tl.constexpr):
    """Per-position values ``[BLOCK_S, W]`` as the tile's rows ``[PAIRS * BLOCK_S, W]``: row r
    takes position r % BLOCK_S (the kernel's row order)."""
    BLOCK_S: tl.constexpr = v.shape[0]
    W: tl.constexpr = v.shape[1]
    return tl.reshape(tl.broadcast_to(v[None, :, :], (PAIRS, BLOCK_S, W)), (PAIRS * BLOCK_S, W))


@triton.jit
def _as_words(ptr):
    """``ptr`` seen as one word per pair of elements: uint32 for 16-bit dtypes, uint64 for 32-bit."""
    if ptr.dtype.element_ty.primitive_bitwidth == 16:
        return ptr.to(tl.pointer_type(tl.uint32))
    else:
        return ptr.to(tl.pointer_type(tl.uint64))


@triton.jit
def _load_pairs(ptr, offsets, mask):
    """Interleaved pairs (x[2j], x[2j+1]) as float32, from one word load per pair (``offsets``
    count words). Little-endian: x[2j] is the low half of the word."""
    elem = ptr.dtype.element_ty
    w = tl.load(_as_words(ptr) + offsets, mask=mask)
    if elem == tl.bfloat16:
        # A bfloat16 is the top half of the float32 with the same value: shifts, no conversion.
        x1 = (w << 16).to(tl.float32, bitcast=True)
        x2 = ((w >> 16) << 16).to(tl.float32, bitcast=True)
    elif elem == tl.float16:
        x1 = (w & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        x2 = (w >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        x1 = (w & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
        x2 = (w >> 32).to(tl.uint32).to(tl.float32, bitcast=True)
    return x1, x2


@triton.jit
def _store_pairs(ptr, offsets, y1, y2, mask):
    """Store float32 ``y1``, ``y2`` as the interleaved pairs (out[2j], out[2j+1]), one word each."""
    elem = ptr.dtype.element_ty
    if elem.primitive_bitwidth == 16:
        lo = y1.to(elem).to(tl.uint16, bitcast=True).to(tl.uint32)
        hi = y2.to(elem).to(tl.uint16, bitcast=True).to(tl.uint32)
        tl.store(_as_words(ptr) + offsets, lo | (hi << 16), mask=mask)
    else:
        lo = y1.to(tl.uint32, bitcast=True).to(tl.uint64)
        hi = y2.to(tl.uint32, bitcast=True).to(tl.uint64)
        tl.store(_as_words(ptr) + offsets, lo | (hi << 32), mask=mask)


# Sizes and counts are not specialised (fewer recompilations); strides and channel counts are,
# because stride == 1 and multiples of 16 are what let Triton vectorise loads and stores.
@triton.jit(do_not_specialize=["seq_len", "batch", "heads", "n_seqs", "search_steps", "cp_size",
                               "cp_rank", "h_blocks", "s_blocks", "group_b"])
def rope_2d_kernel(
    x_ptr,
    freqs_ptr,
    out_ptr,
    cu_seqlens_ptr,  # thd: cu_seqlens; with TOKEN_ROWS, each token's table row (the pre-pass)
    start_positions_ptr,
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
    h_blocks,  # cdiv(heads, BLOCK_H)
    s_blocks,  # cdiv(seq_len, BLOCK_S)
    group_b,  # batch blocks per group (see the program order below)
    IS_THD: tl.constexpr,
    TOKEN_ROWS: tl.constexpr,  # thd: table rows per token precomputed by thd_positions_kernel
    SEQ_BOUNDS: tl.constexpr,  # thd, few sequences: power of two >= n_seqs + 1 (else 0: search)
    BOUNDS_EACH: tl.constexpr,  # SEQ_BOUNDS: each token loads the boundaries (_count_sequence)
    PDL_WAIT: tl.constexpr,  # launched as the pre-pass's programmatic dependent: wait for its rows
    WAIT_FIRST: tl.constexpr,  # PDL_WAIT: wait before the x loads rather than after them
    HAS_START: tl.constexpr,
    USE_CP: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    PAIRS_AS_WORDS: tl.constexpr,  # interleaved pairs read as one word each; strides in words
    BACKWARD: tl.constexpr,
    INT64: tl.constexpr,  # 64-bit offsets, for tensors past 2**31 elements
    FAST_TRIG: tl.constexpr,  # SFU cos/sin (16-bit outputs on NVIDIA GPUs), else libdevice
    BLOCK_S: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_H: tl.constexpr,
    HALF: tl.constexpr,  # power of two >= rotary_dim // 2: pairs per head
    PASS: tl.constexpr,  # power of two >= head_dim - rotary_dim, or 0: channels copied through
    ROW: tl.constexpr,  # power of two >= head_dim: whole rows (half-split pairs), else 0
    GATHER_SINES: tl.constexpr,  # whole rows, backward: rotary_dim (a power of two) to gather
                                 # the partners' sines in registers, else 0 (see _cos_sin_row)
    # With ROW: the partners of the rotated channels taken from the row in registers (tl.gather);
    # ROW is then the rotary block, a power of two >= rotary_dim, and PASS the channels after it.
    GATHER: tl.constexpr,
    # rotary_dim and head_dim are multiples of CHANNEL_MULTIPLE (2, 4 or 8; 0: nothing told).
    CHANNEL_MULTIPLE: tl.constexpr,
):
    if CHANNEL_MULTIPLE > 1:
        # Said so that the compiler knows it (of an integer argument it learns only whether it is
        # a multiple of 16): masks at them then cover whole vectors of 2-8 channels, not one.
        rotary_dim = rotary_dim // CHANNEL_MULTIPLE * CHANNEL_MULTIPLE
        head_dim = head_dim // CHANNEL_MULTIPLE * CHANNEL_MULTIPLE
    # One program: BLOCK_S positions x BLOCK_B batch elements x BLOCK_H heads, on a 1-D grid.
    pid = tl.program_id(0)
    # Program order: batch blocks fastest, within groups of `group_b` of them; then head blocks,
    # then position blocks, then groups. Programs running side by side thus share positions
    # (their angle rows come from cache) and, for bshd, touch only a few batch elements' memory
    # at a time (rather than every one of them, power-of-two strides apart).
    per_group = group_b * h_blocks * s_blocks
    pid_b = (pid // per_group) * group_b + pid % group_b
    pid_h = (pid // group_b) % h_blocks
    pid_s = (pid % per_group) // (group_b * h_blocks)

    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)  # [BLOCK_S] rows (positions or tokens)
    s_mask = s_idx < seq_len
    # The tile is 2-D: [ROWS, channels], one row per (position, batch element, head), positions
    # fastest: row r is position r % BLOCK_S of (batch element, head) pair r // BLOCK_S, heads
    # fastest. The cos/sin of the BLOCK_S positions are broadcast to the rows (_per_row). A 3-D
    # tile [BLOCK_S, BLOCK_B*BLOCK_H, channels] with cos/sin broadcast over its middle axis
    # computes the same, but Triton 3.7 spreads such a tile's threads over the middle axis and
    # moves cos/sin through shared memory to match (up to 15% slower on an H200,
    # scripts/flat_tiles.py); on 2-D tiles both versions give each thread rows of one position.
    ROWS: tl.constexpr = BLOCK_S * BLOCK_B * BLOCK_H
    r = tl.arange(0, ROWS)
    bh = r // BLOCK_S
    s_row = pid_s * BLOCK_S + r % BLOCK_S
    b_idx = pid_b * BLOCK_B + bh // BLOCK_H
    h_idx = pid_h * BLOCK_H + bh % BLOCK_H
    j = tl.arange(0, HALF)  # [HALF] pair index
    r_mask = (s_row < seq_len) & (b_idx < batch) & (h_idx < heads)  # [ROWS]
    j_mask = j < rotary_dim // 2

    # Channels of pair j: half-split (GPT-NeoX) pairs j with j + d2/2; interleaved (GPT-J) 2j, 2j+1.
    if INTERLEAVED:
        c1 = 2 * j
        c2 = 2 * j + 1
    else:
        c1 = j
        c2 = j + rotary_dim // 2
    if INT64:
        s_idx = s_idx.to(tl.int64)
        s_row = s_row.to(tl.int64)
        b_idx = b_idx.to(tl.int64)
        h_idx = h_idx.to(tl.int64)
        c1 = c1.to(tl.int64)
        c2 = c2.to(tl.int64)

    if TOKEN_ROWS and PDL_WAIT and WAIT_FIRST:
        # Long sequences in 2 KB token rows: the call measured faster waiting here, before any
        # x load of ours (see WAIT_FIRST_MEAN_TOKENS; why is not known).
        tl.extra.cuda.gdc_wait()

    # [ROWS, 1] offsets of each row's (position, batch element, head); channels are added on
    # the last axis.
    x_sbh = (s_row * x_stride_s + b_idx * x_stride_b + h_idx * x_stride_h)[:, None]
    o_sbh = (s_row * o_stride_s + b_idx * o_stride_b + h_idx * o_stride_h)[:, None]
    row_mask = r_mask[:, None]
    mask = row_mask & j_mask[None, :]

    if PAIRS_AS_WORDS:
        # Interleaved pairs are adjacent channels: with the last axis contiguous and everything
        # else even, pair j of a row is word j of it (the launcher passes strides in words, the
        # channel stride 1). Channels copied through are then moved as words too.
        x_base = _as_words(x_ptr)
        o_base = _as_words(out_ptr)
        rotary_units = rotary_dim // 2
        head_units = head_dim // 2
        if INT64:
            j = j.to(tl.int64)
    else:
        x_base = x_ptr
        o_base = out_ptr
        rotary_units = rotary_dim
        head_units = head_dim

    # Every load of x is issued first, the angle table's after: the table load and the cos/sin
    # arithmetic then overlap the latency of the x loads instead of adding to it.
    if ROW > 0:
        # Whole rows (half-split pairs): each row in one load, and again through the channels'
        # partners (the same lines, from L1); one store below.
        c, partner, rotated = _row_partner(rotary_dim, INT64, ROW)
        xr = tl.load(x_ptr + x_sbh + c[None, :] * x_stride_d,
                     mask=row_mask & (c < head_dim)[None, :])
        if GATHER:
            xq = xr  # the partners are gathered from xr below, after the angles' loads
        else:
            xq = tl.load(x_ptr + x_sbh + partner[None, :] * x_stride_d,
                         mask=row_mask & rotated[None, :], other=0.0)
    elif PAIRS_AS_WORDS:
        # One word load per pair, as wide and coalesced as the half-split loads, and no
        # shuffling of registers.
        x1, x2 = _load_pairs(x_ptr, x_sbh + j[None, :], mask)
    elif INTERLEAVED:
        # Other interleaved layouts: load each row as [..., HALF, 2] (wide, coalesced loads)
        # and split it, rather than two stride-2 gathers. The split costs registers.
        c12 = (c1[:, None] + tl.arange(0, 2)[None, :])[None, :, :]  # [1, HALF, 2]
        mask12 = mask[:, :, None] & (c12 < rotary_dim)
        x12 = tl.load(x_ptr + x_sbh[:, :, None] + c12 * x_stride_d, mask=mask12)
    else:
        x1 = tl.load(x_ptr + x_sbh + c1[None, :] * x_stride_d, mask=mask)
        x2 = tl.load(x_ptr + x_sbh + c2[None, :] * x_stride_d, mask=mask)
    if PASS > 0:
        # Channels past rotary_dim, copied through (with GATHER those after the rotary block,
        # from channel ROW, a multiple of 16).
        p = (ROW if GATHER else rotary_units) + tl.arange(0, PASS)
        if INT64:
            p = p.to(tl.int64)
        p_mask = row_mask & (p < head_units)[None, :]
        xp = tl.load(x_base + x_sbh + p[None, :] * x_stride_d, mask=p_mask)

    if TOKEN_ROWS:
        if PDL_WAIT and not WAIT_FIRST:
            # x was written before the pre-pass was launched, so its loads above could go first;
            # the token rows are the pre-pass's output: wait until they are all written.
            tl.extra.cuda.gdc_wait()
        pos = tl.load(cu_seqlens_ptr + s_idx, mask=s_mask, other=0)
    elif SEQ_BOUNDS > 0:
        seq = _count_sequence(s_idx, cu_seqlens_ptr, n_seqs, cp_size, SEQ_BOUNDS, USE_CP,
                              BOUNDS_EACH)
        pos = _positions(s_idx, seq_len, cu_seqlens_ptr, start_positions_ptr, seq, seq + 1, 0,
                         cp_size, cp_rank, IS_THD, HAS_START, USE_CP)
    else:
        pos = _positions(s_idx, seq_len, cu_seqlens_ptr, start_positions_ptr, 0, n_seqs,
                         search_steps, cp_size, cp_rank, IS_THD, HAS_START, USE_CP)
    if HAS_START and not IS_THD:
        # Per-sequence offsets: the launcher gives such tiles a single batch element (BLOCK_B=1).
        # The last group of batch blocks may be padded (pid_b >= batch): such programs store
        # nothing, and must not read past the end of start_positions either.
        pos += tl.load(start_positions_ptr + pid_b, mask=pid_b < batch, other=0)
    if INT64:
        pos = pos.to(tl.int64)
    # The reuse: one cos/sin tile [BLOCK_S, HALF] per program, shared by all its batch elements
    # and heads.
    if ROW > 0:
        if GATHER:
            # With rotary_dim not a multiple of 16 a load at the partners' addresses (c +-
            # rotary_dim/2) moves one element an instruction: take them from the row instead.
            xq = tl.gather(xr, tl.broadcast_to(partner[None, :], xr.shape), axis=1)
            xq = tl.where(rotated[None, :], xq, 0.0)  # (sin is 0 there; x may be inf)
        cos, sin = _cos_sin_row(freqs_ptr, pos[:, None], c[None, :], partner[None, :], rotary_dim,
                                f_stride_s, f_stride_d, s_mask[:, None] & rotated[None, :],
                                BACKWARD, FAST_TRIG, GATHER_SINES, BLOCK_S, ROW)
        # fma as in the pairs' tile below: x * cos fused, the partner's term rounded first.
        y = tl.fma(xr.to(tl.float32), _per_row(cos, BLOCK_B * BLOCK_H),
                   xq.to(tl.float32) * _per_row(sin, BLOCK_B * BLOCK_H))
        tl.store(out_ptr + o_sbh + c[None, :] * o_stride_d,
                 y.to(out_ptr.dtype.element_ty), mask=row_mask & (c < head_dim)[None, :])
    else:
        sj_mask = s_mask[:, None] & j_mask[None, :]
        cos1, sin1, cos2, sin2 = _cos_sin(freqs_ptr, pos[:, None], c1[None, :], c2[None, :],
                                          f_stride_s, f_stride_d, sj_mask, BACKWARD, FAST_TRIG)

        if INTERLEAVED and not PAIRS_AS_WORDS:
            x1, x2 = tl.split(x12.to(tl.float32))
        else:
            x1 = x1.to(tl.float32)
            x2 = x2.to(tl.float32)
        cos1 = _per_row(cos1, BLOCK_B * BLOCK_H)
        sin1 = _per_row(sin1, BLOCK_B * BLOCK_H)
        cos2 = _per_row(cos2, BLOCK_B * BLOCK_H)
        sin2 = _per_row(sin2, BLOCK_B * BLOCK_H)
        # Written as fma so that every plan gives the same bits (whole rows or the pairs' tile,
        # in place with the heads narrowed or not): left as x1 * cos - x2 * sin and x2 * cos +
        # x1 * sin, the compiler picks which product to fuse from the code around it.
        y1 = tl.fma(x1, cos1, x2 * sin1 * -1.0)  # (-1.0: an exact negation)
        y2 = tl.fma(x2, cos2, x1 * sin2)
        if PAIRS_AS_WORDS:
            _store_pairs(out_ptr, o_sbh + j[None, :], y1, y2, mask)
        elif INTERLEAVED:
            y12 = tl.join(y1, y2).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + o_sbh[:, :, None] + c12 * o_stride_d, y12, mask=mask12)
        else:
            tl.store(out_ptr + o_sbh + c1[None, :] * o_stride_d,
                     y1.to(out_ptr.dtype.element_ty), mask=mask)
            tl.store(out_ptr + o_sbh + c2[None, :] * o_stride_d,
                     y2.to(out_ptr.dtype.element_ty), mask=mask)
    if PASS > 0:
        tl.store(o_base + o_sbh + p[None, :] * o_stride_d, xp, mask=p_mask)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _search_steps(n_seqs: int) -> int:
    """Iterations of the binary search over cu_seqlens that pin a token to one of n_seqs."""
    return max(1, (n_seqs - 1).bit_length())


def _floor_pow2(n: int) -> int:
    """Largest power of two <= n (1 for n < 1): block sizes feed tl.arange."""
    return 1 << max(0, n.bit_length() - 1)


def _is_pow2(n: int) -> bool:
    """n is a power of two (1, 2, 4, ...): what the gathered sines' compile-time indices need."""
    return n > 0 and n & (n - 1) == 0


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
        # Tokens are the rows and there is no batch axis (a batch of one).
        n, h, d = t.shape
        sn, sh, sd = t.stride()
        return (n, 1, h, d), (sn, 0, sh, sd)
    raise ValueError(f"tensor_format must be 'sbhd', 'bshd' or 'thd', got {tensor_format!r}")


def _max_offset(sizes, strides) -> int:
    return sum((n - 1) * abs(st) for n, st in zip(sizes, strides) if n > 0)


def default_config(seq_rows: int, batch: int, heads: int, head_dim: int, rotary_dim: int,
                   device: torch.device, element_size: int = 2, interleaved: bool = False,
                   tensor_format: str = "sbhd", pairs_as_words: bool = True,
                   in_place: bool = False, n_seqs: Optional[int] = None) -> dict:
    """Tile shape, program order and warps: a heuristic from the tile sweep on an H200
    (scripts/tile_sweep.py, shown in notebook 04). Returns ``block_s`` positions x ``block_b``
    batch elements x ``block_h`` heads (powers of two), ``group_b``, ``num_warps`` and
    ``whole_rows``.

    - A tile holds about TILE_BYTES of input, spent first on heads (at most half the rows; 4 in
      bshd, where positions are contiguous), then on up to 8 positions, then on batch elements.
      thd tiles hold THD_TILE_ELEMENTS: one token's run of up to 16 heads in 16-bit (2 warps),
      4 tokens x 4 heads in fp32 (4 warps). Interleaved pairs are read one word per pair
      (``pairs_as_words``) and tiled like half-split ones; layouts that do not allow it (last
      axis not contiguous, odd strides or offsets) split a [..., HALF, 2] tile, which costs
      registers: 1 KB tiles.
    - bshd rows (one position of one batch element, all heads) of at most 4 KB, as at 8 or 16
      heads or head_dim 64 in bf16, are tiled whole: tiles of one row (2 KB at least: two 1 KB
      rows) of one batch element, 2 warps.
    - ``group_b``: the batch blocks that run side by side, all of them for sbhd (memory order),
      two for bshd, one (memory order) for bshd's small rows.
    - ``in_place`` (``out`` is ``t``), bshd, 16-bit, 8 heads or more of 128 channels, all
      rotated, half-split pairs: one 2 KB block of 8 heads of one position per program, 2 warps,
      one batch element at a time.
      In place on an H200 (16 x 4096 tokens, 3 shuffled rounds, forward / backward, fraction of
      copy) it took 32 heads from 0.938/0.940 to 0.961/0.958 and 16 heads from 0.947/0.942 to
      0.953/0.950 (8 heads already ran it); out of place the tiles above stay ahead.
    - ``n_seqs`` (thd): with at most TOKEN_ROWS_ABOVE sequences, where each tile counts the
      boundaries below its tokens (``_count_sequence``) in a power-of-two slot of at least
      ONE_WARP_MIN_BOUNDS (32 sequences or more), 16-bit token rows of more than 1 KB and at most
      2 KB (8 heads of 128 channels) run their tiles on 1 warp. Against 2 warps on an H200
      (131072 tokens in 64 and 128 sequences, 8 heads, bf16, 3 shuffled rounds): 0.887 -> 0.924
      and 0.888 -> 0.927 of copy forward, 0.888 -> 0.911 backward at 64; at 4 KB rows (32 heads)
      1 and 2 warps were level (within 0.4 points), and with the pre-pass (more sequences) the same
      tile on 1 warp moved -1.3 to +0.1. With fewer boundaries 1 warp is far behind: 2 warps ->
      1 warp at 16 random-cut sequences 0.970 -> 0.866, 16 of 8192 tokens 0.964 -> 0.867, 4
      sequences 0.939 -> 0.914, against 0.910 -> 0.961 at 32 and 0.902 -> 0.965 at 64 (forward,
      5 shuffled rounds, figures/thd_count_warps_h200.json). Such one-warp tiles load the
      boundaries per token (``BOUNDS_EACH``, see _count_sequence).
    - ``whole_rows``: on a GPU, 16-bit half-split rows of at least WHOLE_ROW_BYTES (head_dim 128
      and up) keep the tile and warps chosen above, in every format and in place too, but move
      it as whole rows: each row loaded once, its channels' partners again (the same lines,
      from L1), one store, where the pairs' tile loads and stores two halves (and the channels
      past ``rotary_dim`` a third piece). sbhd and thd, on an H200 (2026-11-26, 5 shuffled
      rounds, figures/rope2d_whole_rows_sbhd_thd_h200.json): 1.004-1.011 of the pairs' speed
      at 34 of 40 points (forward and backward; TE's default sbhd 0.978 -> 0.985 of copy),
      1.025-1.036 with half the head rotated in sbhd, 0.996-0.997 at head_dim 256, and behind
      at two: thd in 64 sequences of 8 heads forward (-1.2%, +0.8% backward) and sbhd batch 1
      backward (-2.4%, +0.6% forward; an 84 MB problem whose single medians fall on one of two
      levels, see docs/performance_notes.md). On an H100
      (figures/rope2d_whole_rows_sbhd_thd_h100.json, the same script and code) 1.003-1.012 at
      33 of the 40 points, 1.016-1.030 with half the head rotated, level at 4 and behind at
      sbhd batch 1 forward (-1.6%, +0.7% backward).
    - ``gather_sines``: the whole-row backward needs each channel's partner's sine. bshd tiles
      of GATHER_SINES_POSITIONS positions or more (8 positions x 4 heads at 32 heads of 128)
      gather them from the row's own sines in registers where ``rotary_dim`` is a power of two;
      other tiles compute them again from the partners' angles. bshd on an H200 (2026-11-26,
      5 shuffled rounds, figures/rope2d_whole_rows_bshd_h200.json): whole rows with gathered
      sines ran at 1.005-1.011 of the pairs forward and 1.003-1.009 backward at the 8 shapes
      with tiles of 4-8 positions, where computing the sines again cost the backward 1-4%
      (0.959-0.987 of the pairs). With rotary_dim 96 of 128, which no gather serves, computing
      them again still ran 1.030 / 1.056 of the pairs, whose tile pads 48 pairs to 64. Tiles of
      one position (bshd rows of 8 or 16 heads, in place) compute them again: gathering was
      not faster there (0.970-1.003 of the pairs backward, against 1.000-1.007), and their
      whole rows ran 0.995-1.011 forward, 1.000-1.007 backward (8 heads and in place are the
      two below 1, by 0.4-0.5%; the file's two forward variants are the same kernel and differ
      by up to 0.5%, 1.7% in place).
      bshd rows of more than BSHD_WHOLE_ROW_MAX_BYTES (head_dim 256) keep the pairs: their
      whole-row backward is slow on the 2-D tiles (see there).
    - ``gather`` (``GATHERED_PARTNERS``): half-split pairs with rotary_dim not a multiple of 16
      (rotary_percent 0.25 on heads of 80 or 96: 20 or 24 channels), in every dtype, format and
      in the interpreter: whole rows cut at the rotary block, the partners gathered in registers
      (the kernel's ``GATHER``), on this tile on at most 2 warps. On an H200
      (figures/rope2d_gathered_h200.json, 3 shuffled rounds, bf16 unless said) the pairs, every
      element alone, ran at 0.485-0.779 of copy, these plans on the tile's 4 warps at
      0.659-0.929 and on 2 at 0.716-0.966 (sbhd 20 of 80 0.541 -> 0.924 forward, 0.548 -> 0.923
      backward; thd's backward the lowest, 0.545 -> 0.716); the same bits. Out of place in bshd
      and thd, 16-bit rows of 80-160 channels take tiles of their own on 1 warp
      (``GATHERED_TILES``: 16 rows of 160-192 B, 1 position or token x 16 heads, 2 x 8 with 8
      heads; in bshd 8 rows of 193-320 B): 38 calls on an H200 at 1.000-1.144 times the speed of
      7177d89's tiles (median 1.037), 0.795-0.968 -> 0.850-0.980 of copy, bshd at 20 of 80
      0.907 -> 0.956 (figures/rope2d_gathered_one_warp_h200.json; those tiles, 2 warps in bshd,
      figures/rope2d_gathered_tiles_h200.json). In place (``out=t``,
      the heads narrowed to rotary_dim: ``IN_PLACE_GATHER``) too, masked at rotary_dim, which
      the kernel is told is a multiple of 4 or 8 (``CHANNEL_MULTIPLE``), on 2 positions x 8 heads
      on 2 warps: the tiles sized for the narrowed heads (2-4 positions x 32-64 heads) ran at
      0.18-0.41 of copy counting the bytes moved (the rotated channels), this one, the best or
      within 2.9 points of the best of 8 tiles at 12 calls (probe, H200, 3 shuffled rounds), at
      0.306-0.441 in 16-bit and 0.432 in float32, against 0.127-0.223 and 0.385-0.386 before,
      every element alone (figures/rope2d_in_place_unaligned_h200.json); a kernel that only
      reads and writes the same runs reaches 0.323-0.451 and 0.430.
      ``WHOLE_ROWS = True`` takes whole rows on twice the tile's warps (at most 8): 1.002-1.016
      of the pairs on an H100 (26 of 28 points), but 0.826-1.013 on an H200 (below 0.97 at 22
      of 32 points; the full benchmark with it lost up to 18% there), so it is off. A
      ``config`` with ``whole_rows``, ``gather_sines`` or ``gather`` chooses per call.
    On the CPU interpreter, which pays per program, tiles are made as large as 16K elements.
    """
    on_gpu = device.type == "cuda"
    if (in_place and on_gpu and tensor_format == "bshd" and element_size == 2 and heads >= 8
            and head_dim == rotary_dim == 128 and not interleaved):
        cfg = dict(block_s=1, block_b=1, block_h=min(8, _next_pow2(max(1, heads))), group_b=1,
                   num_warps=2)
    else:
        # A new dict each call: the cached tuple stays untouched by callers that edit it.
        cfg = dict(_config(seq_rows, batch, heads, head_dim, rotary_dim, on_gpu, element_size,
                           interleaved and not pairs_as_words, tensor_format))
        row_bytes = heads * head_dim * element_size  # a token's row (thd)
        if (on_gpu and tensor_format == "thd" and n_seqs is not None
                and _two_kb_rows(row_bytes, element_size)
                and _count_slot(n_seqs, _token_rows(n_seqs, row_bytes, element_size))
                >= ONE_WARP_MIN_BOUNDS):
            cfg["num_warps"] = 1  # 2 KB token rows in packs whose tiles count (see above)
    whole = (on_gpu and element_size == 2 and not interleaved
             and head_dim * element_size >= WHOLE_ROW_BYTES)
    if whole and WHOLE_ROWS:
        cfg["whole_rows"] = True
        cfg["num_warps"] = min(8, 2 * cfg["num_warps"])  # the same tile on twice the warps
    else:
        cfg["whole_rows"] = (whole and tensor_format in WHOLE_ROW_FORMATS  # on the tile's warps
                             and not (tensor_format == "bshd"
                                      and head_dim * element_size > BSHD_WHOLE_ROW_MAX_BYTES))
    # rotary_dim not a multiple of 16, half-split pairs: whole rows cut at the rotary block, the
    # partners gathered in registers (GATHERED_PARTNERS), in every dtype and the interpreter.
    cfg["gather"] = (GATHERED_PARTNERS and not interleaved and rotary_dim % 16 != 0
                     and (rotary_dim < head_dim or (in_place and IN_PLACE_GATHER)))
    if cfg["gather"]:
        # On 2 warps at most: the pairs' tile on 4 warps ran 0.66-0.89 of copy in bf16 and the
        # same tile on 2 0.86-0.97 (figures/rope2d_gathered_h200.json, "after w2").
        cfg["whole_rows"] = True
        cfg["num_warps"] = min(2, cfg["num_warps"])
        if in_place and rotary_dim == head_dim and on_gpu:
            # In place, the heads narrowed to their rotated channels (runs of 40-80 B): 16 rows,
            # 2 positions x 8 heads, on 2 warps (IN_PLACE_GATHER). The tiles sized for the
            # narrowed heads held 32-128 such rows and ran at 0.18-0.41 of copy counting the
            # bytes moved; these 0.31-0.44 (see IN_PLACE_GATHER).
            cfg.update(block_s=min(2, _next_pow2(max(1, seq_rows))), block_b=1,
                       block_h=min(8, _next_pow2(max(1, heads))), num_warps=2)
        elif on_gpu and (tile := _gathered_tile(tensor_format, heads, head_dim, element_size)):
            # Out of place, 16-bit rows of 80-160 channels in bshd and thd: a tile of their own
            # on 1 warp (GATHERED_TILES). The tiles the rules above gave them ran up to 28 points
            # behind.
            rows, num_warps = tile
            block_h = min(rows, _next_pow2(max(1, heads)))  # heads first, then positions
            cfg.update(block_s=min(rows // block_h, _next_pow2(max(1, seq_rows))), block_b=1,
                       block_h=block_h, num_warps=num_warps)
    # bshd tiles of several positions: the whole-row backward gathers its partners' sines in
    # registers (a power-of-two rotary_dim; with another one it computes them again).
    cfg["gather_sines"] = (cfg["whole_rows"] and tensor_format in GATHER_SINES_FORMATS
                           and cfg["block_s"] >= GATHER_SINES_POSITIONS
                           and _is_pow2(rotary_dim))
    return cfg


# Whole rows (``ROW``): on a GPU, 16-bit half-split rows of at least WHOLE_ROW_BYTES are loaded
# whole, their channels' partners again (the same lines, from L1), and stored in one piece. By
# default in WHOLE_ROW_FORMATS, on the pairs' tile and warps: 0.3-1.1% faster than the pairs at
# most points of every format on an H200, behind by up to 2.4% at a few (see default_config;
# figures/rope2d_whole_rows_sbhd_thd_h200.json, figures/rope2d_whole_rows_bshd_h200.json). WHOLE_ROWS True takes them on
# twice the warps: faster on an H100, up to 17% slower on an H200. Rows of 128 B (head_dim 64)
# and float32 rows keep the pairs.
WHOLE_ROWS = False
WHOLE_ROW_FORMATS = ("sbhd", "bshd", "thd")
WHOLE_ROW_BYTES = 256
# The whole-row backward needs each channel's partner's sine. Computing it again from the
# partner's angle costs most where a thread holds several positions' angles: bshd tiles of 4-8
# positions lost 1-4% backward that way on an H200. There the sines are gathered in registers
# instead (GATHER_SINES in the kernel; power-of-two rotary_dim only). In sbhd tiles of 2
# positions x 16 heads the same gather was 8% slower on an H200 (level on an H100), so the rule
# stays with bshd.
GATHER_SINES_FORMATS = ("bshd",)
GATHER_SINES_POSITIONS = 4
# Half-split pairs with rotary_dim not a multiple of 16 (Megatron's and GPT-NeoX's rotary_percent
# 0.25 of heads of 80 or 96: 20 or 24 channels): the compiler cannot prove the pairs' second half
# or the channels past rotary_dim aligned (it knows an integer argument's divisibility by 16, no
# finer) and moves them one element an instruction. GATHER: whole rows cut in two aligned pieces,
# the rotary block and the rest, the partners gathered from the block in registers (as rope_qk's
# GATHERED_PARTNERS).
GATHERED_PARTNERS = True
# In place with such a rotary_dim (``out`` is ``t``: the heads narrowed to rotary_dim, the rest
# left where it is): the narrowed rows gathered too, masked at rotary_dim, on their own tile (see
# default_config). With CHANNEL_MULTIPLES 1.119-2.764 times the speed of 8c81001
# (figures/rope2d_in_place_unaligned_h200.json).
IN_PLACE_GATHER = True
# Out of place, GATHER's tiles of their own in bshd and thd, for 16-bit rows of
# GATHERED_TILE_MIN_ROW_BYTES or more: per format, (the largest row in bytes, (rows, warps)) in
# order. A tile holds `rows` rows (one head of one position or token each), heads first: 1 position
# x 16 heads, or 2 x 8 where there are 8 heads. On 1 warp: a probe of 10-14 tiles at 16 calls (H200,
# 3 shuffled rounds, not recorded) found 1-warp tiles ahead at every bshd call. Recorded at those 16
# and 10 held out (figures/rope2d_gathered_one_warp_h200.json, H200, 3 shuffled rounds, fraction of
# copy forward / backward, 7177d89's tile -> this one): bshd 20 of 80 0.907 / 0.908 -> 0.956 / 0.956
# (4 x 8 on 2 warps -> 1 x 16), with 4 heads 0.855 / 0.819 -> 0.911 / 0.883 (4 x 4 on 2 warps -> on
# 1), 40 of 160 0.968 / 0.931 -> 0.968 / 0.974, 28 of 112 (held out) 0.908 / 0.896 -> 0.944 / 0.938;
# thd's 8-head packs 2 x 8 on 2 warps -> on 1 0.909 / 0.899 -> 0.937 / 0.902 in 256 sequences.
# Before: thd 1 x 16 on 1 warp with 16 heads or more (figures/rope2d_gathered_tiles_h200.json: 1 x
# 16 on 2 warps 0.847 / 0.723 of copy at 20 of 80, on 1 0.964 / 0.957; why 2 warps run so much
# slower is not known), bshd 4 positions x 8 heads on 2 warps (4 at 96 channels), wider rows the
# general tiles. float32 keeps the general tiles: at bshd's 20 of 80 in the probe 1 x 8 on 1 warp
# ran 0.926 / 0.935 against 0.934 / 0.934. sbhd's tile (2 positions x 8-16 heads) was the best of 14
# or within 0.3 points of it in an earlier probe.
GATHERED_TILES = {"bshd": ((192, (16, 1)), (320, (8, 1))), "thd": ((192, (16, 1)),)}
GATHERED_TILE_MIN_ROW_BYTES = 160
# The largest power of two (up to 8) dividing rotary_dim and head_dim passed to the kernel where
# a mask stops at one that is not a multiple of 16 (``CHANNEL_MULTIPLE``; ``_channel_multiple``).
CHANNEL_MULTIPLES = True
# bshd rows longer than this (head_dim 256 in 16-bit) keep the pairs. On the 2-D tiles (5a5ea57)
# their whole-row backward ran at 0.80-0.81 of copy on an H200 with the sines gathered, 0.93
# computing them again, against 0.935 / 0.978 for the pairs (16 / 32 heads; the 3-D tiles'
# whole rows before: 0.939 / 0.977); forward, whole rows and pairs within 0.3% (probe, triton
# 3.6, 5 shuffled rounds, not recorded; docs/performance_notes.md).
BSHD_WHOLE_ROW_MAX_BYTES = 256


TILE_BYTES = 8192  # input bytes per program on a GPU (not thd)
# thd: more sequences than this -> the per-token pre-pass. On the H200 (65536 tokens, bf16) a
# binary search in every tile was ahead at 16 and 64 sequences (0.957/0.953 of copy against
# 0.943/0.952), the pre-pass from 256 on (0.965 against 0.948; 0.965 against 0.878 at 1024).
TOKEN_ROWS_ABOVE = 128
# ... and for 16-bit token rows wider than 2 KB (16 heads of 128 and more), more than this many:
# the count while its slot (_count_slot) holds at most 64 boundaries. H200, 65536 tokens cut at
# random, fraction of copy forward / backward, count against pre-pass (7 shuffled rounds,
# figures/thd_policy_h200_wide.json, scripts/thd_policy.py): 16 heads in 32, 48 and 63 sequences
# 0.967 / 0.964 against 0.951 / 0.955, 0.964 / 0.966 against 0.957 / 0.951, 0.963 / 0.968
# against 0.958 / 0.957; 32 heads 0.983 / 0.985 against 0.973 / 0.977, 0.981 / 0.985 against
# 0.980 / 0.981, 0.982 / 0.985 against 0.978 / 0.980. At 64 sequences (a slot of 128) the count
# falls to 0.934 / 0.935 and 0.951 / 0.953 against 0.955 / 0.954 and 0.977 / 0.981. Until
# 2026-11-27 this was 16: on the code of 2026-11-26 the count was behind at 32 sequences
# (figures/thd_policy_h200.json); on the code since, it led at 32 in an earlier run too
# (figures/thd_policy_h200_blocks.json). fp32 rows of 8 heads (4 KB) keep the count up to
# TOKEN_ROWS_ABOVE: 0.942-0.951 against 0.923-0.936 with the pre-pass at 32-128 sequences.
WIDE_TOKEN_ROWS_ABOVE = 63
# With the pre-pass (and PDL), 16-bit token rows of more than 1 KB and at most 2 KB (8 heads of
# 128) wait for it before their x loads (WAIT_FIRST) where the sequences average at least this
# many tokens. H200, 131072 tokens of 8 heads cut at random, forward / backward, x loads before
# the wait -> after it (figures/thd_policy_h200.json): 256 sequences 0.895 / 0.873 -> 0.944 /
# 0.938, 512 0.897 / 0.879 -> 0.936 / 0.927, 1024 0.909 / 0.890 -> 0.928 / 0.927, 2048 (64
# tokens on average) 0.928 / 0.909 -> 0.925 / 0.917, 256 sequences of 512 tokens 0.922 / 0.898
# -> 0.934 / 0.940; but 4096 sequences and more 0.922-0.937 -> 0.906-0.923, and 16384 x 8 tokens
# 0.946 / 0.956 -> 0.940 / 0.949. At 16 and 32 heads waiting first lost 0.6-2.3 points
# everywhere. Why the x loads in front slow the pre-pass most where sequences are long is not
# known (measured with the pre-pass of before 2026-11-27, whose chain of loads was shortest at
# 256 sequences: one narrowing round).
WAIT_FIRST_MEAN_TOKENS = 64
# thd without the pre-pass: with at most this many boundaries (n_seqs + 1) each tile loads them all
# and counts (_count_sequence) instead of the binary search. H200, forward, fraction of copy,
# binary search -> count (figures/thd_pre_pass.json): 65536 tokens of 32 heads in 16, 64 and 128
# sequences 0.956 -> 0.955, 0.952 -> 0.960, 0.948 -> 0.967 in bf16, 0.961 -> 0.980 and 0.942 ->
# 0.981 at 64 and 128 in fp32; 131072 tokens of 8 heads in bf16 0.887 -> 0.886, 0.905 -> 0.919,
# 0.920 -> 0.925. In a probe at 256 and 512 sequences (512 boundary slots and more), counting was
# level with the pre-pass at 256 and ahead at 512 with 32 heads, but 4.6-7.6 points behind at 512
# with 8 heads: TOKEN_ROWS_ABOVE stays 128.
COUNT_BOUNDS_MAX = 256
# ... and 2 KB token rows (8 heads of 128, 16-bit) whose count slot (the next power of two above
# n_seqs) has at least this many boundaries run on 1 warp, fewer on the tile's 2 (default_config).
ONE_WARP_MIN_BOUNDS = 64
# The pre-pass: about PRE_PASS_PROGRAMS programs of a power-of-two block of sequences each,
# PRE_PASS_TOKENS tokens a step, 4 warps. On an H200 (131072 tokens of 8 heads in 256-65536
# sequences, 65536 of 32 heads in 4096) it took 4.4-5.6 us alone at every pack in three runs, where
# the guess and search by blocks of tokens it replaced took 5.4-7.9 us at random cuts and 4.7-5.1
# at equal lengths (its guess held there); whole calls at random cuts 0.1 behind to 1.7 points ahead
# forward, 0.1 behind to 1.9 ahead backward, at equal lengths 0.8 behind to 0.1 ahead, at 32 heads
# 0.5-1.3 ahead. About 256 programs were slower alone at 65536 sequences (6.1 us), about 2048 at
# every pack, and a count over the block's boundaries in place of the search took 4.4-8.1 us
# (scripts/thd_pre_pass_scatter.py; figures/thd_pre_pass_search_h200.json,
# thd_pre_pass_search_confirm_h200.json, thd_pre_pass_package_h200.json,
# thd_pre_pass_count_h200.json).
PRE_PASS_PROGRAMS = 1024
PRE_PASS_TOKENS = 256
# thd tiles: 2048 elements of input, 64 bytes a thread (see _config).
THD_TILE_ELEMENTS = 2048
SMALL_ROW_BYTES = 4096  # bshd rows (all heads) up to this size are tiled whole ...
SMALL_ROW_TILE_BYTES = 2048  # ... in tiles of this many bytes, or one row where rows are larger


@functools.lru_cache(maxsize=1024)  # pure in its arguments; saves Python time per launch
def _config(seq_rows, batch, heads, head_dim, rotary_dim, on_gpu, element_size, split_pairs,
            tensor_format):
    half = _next_pow2(rotary_dim // 2)
    width = 2 * half + (_next_pow2(head_dim - rotary_dim) if head_dim > rotary_dim else 0)
    num_warps = 4
    max_positions = 8  # on a GPU
    # sbhd: batch blocks fastest over the whole batch (memory order). bshd: in pairs, so that
    # side-by-side programs touch two batch elements' memory, not all of them at once.
    group_b = 2 if tensor_format == "bshd" else None
    if not on_gpu:  # the interpreter pays per program: few, large tiles
        rows = max(1, 16384 // width)
        head_share = max_positions = rows  # no cap on positions but the budget
    elif split_pairs:
        rows = max(1, 1024 // (width * element_size))
        head_share = rows
        num_warps = 1
    elif tensor_format == "thd":
        # Rows of tokens are contiguous and nothing is reused across them but the search: small
        # tiles with 64 bytes of input a thread did best. 16-bit: one token's run of up to 16
        # heads, 4 KB on 2 warps; fp32: 4 tokens x 4 heads, 8 KB on 4 warps. (H200, 65536 tokens
        # in 16-65536 sequences, the whole call with the pre-pass: 0.945-0.956 in bf16, against
        # 0.91-0.92 for the 16 KB tiles used before; scripts/tile_sweep.py,
        # figures/tile_sweep_thd.csv.)
        rows = max(1, THD_TILE_ELEMENTS // width)
        head_share = rows if element_size < 4 else 4
        max_positions = rows
        num_warps = 2 if element_size < 4 else 4
    elif tensor_format == "bshd" and _next_pow2(max(1, heads)) * width * element_size <= SMALL_ROW_BYTES:
        # Small bshd rows: whole rows of one batch element (contiguous memory), 2 warps, as many
        # rows as make SMALL_ROW_TILE_BYTES (a 4 KB row is a tile alone). Half-row tiles or 4
        # warps lost 3-12% in the sweep (16 heads, head_dim 64). Against the 4 KB tiles used
        # before (H200, bf16, shuffled rounds, with memory order below): at 8 heads one 2 KB row
        # gained 0.1 to 1.4 points of copy (fwd/bwd); with 4 heads +0.6/+0.2, 1 head +1.0/+6.9,
        # 2 heads -0.1/-0.9 (one process of 3 rounds for 1-4 heads).
        rows = max(1, SMALL_ROW_TILE_BYTES // (width * element_size))
        head_share = _next_pow2(max(1, heads))
        max_positions = rows
        num_warps = 2
        # One batch element at a time (memory order), not pairs: +1.2 to +1.7 points of copy at
        # 8 heads, 0 to +1.0 at 16 heads or head_dim 64 (H200, bf16, an A/B of 4 processes with
        # shuffled order); larger rows keep the pairs, which were ahead there.
        group_b = 1
    elif tensor_format == "bshd":
        # Positions are contiguous in bshd: a tile of few heads and up to 8 positions did best.
        rows = max(1, TILE_BYTES // (width * element_size))
        head_share = 4
    else:
        rows = max(1, TILE_BYTES // (width * element_size))
        head_share = rows // 2  # leave room for at least two positions or batch elements
    # (position, batch element, head) rows of head_dim channels per tile: heads first (a run of
    # heads is contiguous in every layout), then positions, then batch elements.
    block_h = min(_next_pow2(max(1, heads)), _floor_pow2(max(1, head_share)))
    rows = max(1, rows // block_h)
    block_s = min(_next_pow2(max(1, seq_rows)), _floor_pow2(rows), max_positions)
    rows = max(1, rows // block_s)
    block_b = min(_next_pow2(max(1, batch)), _floor_pow2(rows))
    if group_b is None:
        group_b = max(1, triton.cdiv(batch, block_b))
    return (("block_s", block_s), ("block_b", block_b), ("block_h", block_h),
            ("group_b", group_b), ("num_warps", num_warps))


# Launch options of every plan. Fused multiply-adds stay on, as Triton 3.6 to 3.9 compile by
# default and as the kernels are tested and timed: 3.9 warns that its default turns them off in
# 3.10, which would change the results' last bits (not their accuracy).
LAUNCH_OPTIONS = {"enable_fp_fusion": True}


class Plan:
    """Everything a launch needs that follows from shapes, strides and flags (not from data).
    ``options``: launch options besides ``num_warps`` (``LAUNCH_OPTIONS``, ``launch_pdl``).
    ``compiled`` is for a launcher that reuses the kernel Triton compiled (the package's)."""

    __slots__ = ("grid", "scalars", "constexprs", "num_warps", "options", "compiled")

    def __init__(self, grid, scalars, constexprs, num_warps, options=None):
        self.grid, self.scalars, self.constexprs, self.num_warps = grid, scalars, constexprs, num_warps
        self.options = {**LAUNCH_OPTIONS, **(options or {})}
        self.compiled = {}


_PLANS: dict = {}  # call signature -> Plan; cleared when it grows past _MAX_PLANS
_PRE_PLANS: dict = {}  # the same signatures -> Plan of the thd pre-pass, where there is one
_MAX_PLANS = 4096


def pre_pass_plan(n_tokens: int, n_seqs: int, cp_size: int = 1, cp_rank: int = 0,
                  has_start: bool = False, pdl: bool = False) -> Plan:
    """Launch plan of ``thd_positions_kernel``: blocks of SEQS sequences (the power of two that
    makes about PRE_PASS_PROGRAMS programs), PRE_PASS_TOKENS tokens a step, 4 warps; ``pdl``: it
    lets the main kernel, launched as its programmatic dependent, start at once.
    Pointers: (cu_seqlens, start_positions or a placeholder, token_rows [n_tokens] int32)."""
    seqs = _next_pow2(triton.cdiv(max(n_seqs, 1), PRE_PASS_PROGRAMS))
    return Plan((triton.cdiv(n_seqs, seqs), 1, 1), (n_tokens, n_seqs, cp_size, cp_rank),
                dict(HAS_START=has_start, USE_CP=cp_size > 1, PDL_TRIGGER=pdl, SEQS=seqs,
                     STEPS=seqs.bit_length() - 1, TOKENS=PRE_PASS_TOKENS), 4)


def _pdl_available(device: torch.device) -> bool:
    """Programmatic dependent launch: NVIDIA GPUs of compute capability 9.0 (Hopper) or later,
    compiled kernels (not the interpreter), and a Triton that has the griddepcontrol wrappers."""
    return (not INTERPRETED and device.type == "cuda" and torch.version.hip is None
            and torch.cuda.get_device_capability(device)[0] >= 9
            and hasattr(getattr(getattr(tl, "extra", None), "cuda", None), "gdc_wait"))


def launch(kernel, plan: Plan, pointers):
    """Launch through Triton's own dispatch, on the device of ``pointers[0]``. (The rope_kernels
    package replaces this with a launcher that skips Triton's per-call argument analysis,
    rope_kernels/_launch.py; a copy of this file needs none.)"""
    device = pointers[0].device
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        # Triton launches on the current device and its stream, not the tensors' device: make
        # it theirs (a model spread over several GPUs in one process, device_map="auto").
        with torch.cuda.device(device):
            return launch(kernel, plan, pointers)
    return kernel[plan.grid](*pointers, *plan.scalars, **plan.constexprs,
                             num_warps=plan.num_warps, **plan.options)


def _pairs_as_words(*tensors: torch.Tensor) -> bool:
    """True when the interleaved pairs (2j, 2j+1) of every tensor can be read as one word each:
    last axis contiguous and of even length, every other stride and the address even in
    elements."""
    return all(a.stride(-1) == 1 and a.shape[-1] % 2 == 0
               and all(st % 2 == 0 for n, st in zip(a.shape[:-1], a.stride()[:-1]) if n > 1)
               and a.data_ptr() % (2 * a.element_size()) == 0 for a in tensors)


def _two_kb_rows(row_bytes: int, element_size: int) -> bool:
    """thd: 16-bit token rows of more than 1 KB and at most 2 KB (8 heads of 128), the rows
    that default_config's one-warp rule and the main kernel's early wait are for."""
    return element_size == 2 and 1024 < row_bytes <= 2048


def _token_rows(n_seqs: int, row_bytes: int, element_size: int) -> bool:
    """thd: the per-token pre-pass (else each tile counts or searches cu_seqlens)."""
    if element_size == 2 and row_bytes > 2048:
        return n_seqs > WIDE_TOKEN_ROWS_ABOVE
    return n_seqs > TOKEN_ROWS_ABOVE


def _count_slot(n_seqs: int, token_rows: bool) -> int:
    """thd without the pre-pass, few sequences: every tile loads the n_seqs + 1 boundaries into
    a slot of this many (a power of two) and counts those below its tokens; 0 where the tiles
    read the pre-pass's rows or search cu_seqlens instead."""
    return _next_pow2(n_seqs + 1) if not token_rows and n_seqs + 1 <= COUNT_BOUNDS_MAX else 0


def _wait_first(n_tokens: int, n_seqs: int, row_bytes: int, element_size: int) -> bool:
    """thd with the pre-pass and PDL: the main kernel waits before its x loads."""
    return (_two_kb_rows(row_bytes, element_size)
            and n_tokens >= WAIT_FIRST_MEAN_TOKENS * max(1, n_seqs))


def _gathered_tile(tensor_format: str, heads: int, head_dim: int,
                   element_size: int) -> Optional[tuple]:
    """GATHERED_TILES' (rows, warps) for GATHER's rows of ``head_dim`` channels of
    ``element_size`` bytes, out of place on a GPU, or None where the table has none."""
    row_bytes = head_dim * element_size
    if element_size != 2 or row_bytes < GATHERED_TILE_MIN_ROW_BYTES:
        return None
    return next((tile for largest, tile in GATHERED_TILES.get(tensor_format, ())
                 if row_bytes <= largest), None)


def _channel_multiple(rotary_dim: int, head_dim: int, gather: bool) -> int:
    """The kernel's ``CHANNEL_MULTIPLE``: the largest power of two up to 8 that divides rotary_dim
    and head_dim, where a load or store of x stops at one that is not a multiple of 16 (Triton
    knows those); else 0 (nothing to tell: also where that power is 1). The pairs' tiles stop at
    rotary_dim / 2, rotary_dim and head_dim; GATHER's whole rows only at head_dim (rotary_dim is
    used in registers). (rope_qk's twin: each kernel file stands alone.)"""
    both = math.gcd(rotary_dim, head_dim)
    if not CHANNEL_MULTIPLES or both % 16 == 0 or (gather and head_dim % 16 == 0):
        return 0
    multiple = min(8, both & -both)
    return multiple if multiple > 1 else 0


def _make_plan(t, freqs, out, tensor_format, cu_seqlens, start_positions, interleaved, cp_size,
               cp_rank, backward, config, pairs_as_words=False) -> Plan:
    (seq_rows, batch, heads, head_dim), x_strides = _canonical(t, tensor_format)
    _, o_strides = _canonical(out, tensor_format)
    rotary_dim = freqs.shape[-1]
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"freqs.shape[-1] (rotary_dim) must be even and <= head_dim={head_dim}, "
                         f"got {rotary_dim}")
    is_thd = tensor_format == "thd"
    n_seqs = cu_seqlens.numel() - 1 if is_thd else 1
    cfg = default_config(seq_rows, batch, heads, head_dim, rotary_dim, t.device,
                         t.element_size(), bool(interleaved), tensor_format, pairs_as_words,
                         out is t, n_seqs if is_thd else None)
    # SFU cos/sin where the output's rounding hides their error; libdevice's for float32, and in
    # the interpreter (which cannot run inline PTX) and on AMD GPUs.
    cfg["fast_trig"] = (not INTERPRETED and t.dtype != torch.float32
                        and t.device.type == "cuda" and torch.version.hip is None)
    # thd with many sequences: a pre-pass writes each token's table row (see
    # thd_positions_kernel) instead of each tile searching cu_seqlens.
    row_bytes = heads * head_dim * t.element_size()  # a token's row (thd)
    cfg["token_rows"] = is_thd and _token_rows(n_seqs, row_bytes, t.element_size())
    cfg["wait_first"] = is_thd and _wait_first(seq_rows, n_seqs, row_bytes, t.element_size())
    cfg["pdl"] = None
    if config:
        unknown = set(config) - set(cfg)
        if unknown:
            raise ValueError(f"config: unknown keys {sorted(unknown)}; known: {sorted(cfg)}")
        cfg.update(config)
        for name in ("block_s", "block_b", "block_h", "num_warps"):
            v = cfg[name]
            if not isinstance(v, int) or v < 1 or v & (v - 1):
                raise ValueError(f"config[{name!r}] must be a positive power of two, got {v!r}")
        if not isinstance(cfg["group_b"], int) or cfg["group_b"] < 1:
            raise ValueError(f"config['group_b'] must be a positive int, got {cfg['group_b']!r}")
    cfg["token_rows"] = bool(cfg["token_rows"]) and is_thd
    # The pre-pass and the main kernel overlap through programmatic dependent launch where the
    # GPU has it (``pdl`` in config: None = where available).
    pdl = bool(cfg["token_rows"]) and (_pdl_available(t.device) if cfg["pdl"] is None
                                       else bool(cfg["pdl"]))
    # Whole rows: half-split pairs only (interleaved pairs have their own loads); with ``gather``
    # (part of the head rotated) cut at the rotary block, the partners gathered in registers.
    whole_rows = bool(cfg["whole_rows"]) and not interleaved
    gather = whole_rows and bool(cfg["gather"]) and (rotary_dim < head_dim or out is t)
    rotary_block = max(16, _next_pow2(rotary_dim))
    if start_positions is not None and not is_thd:
        cfg["block_b"] = 1  # per-sequence start positions: each batch element its own angles
    seq_bounds = _count_slot(n_seqs, cfg["token_rows"]) if is_thd else 0
    sizes = (seq_rows, batch, heads, head_dim)
    int64 = max(_max_offset(sizes, x_strides), _max_offset(sizes, o_strides),
                _max_offset(freqs.shape, freqs.stride())) >= 2**31 - 1
    s_blocks = triton.cdiv(seq_rows, cfg["block_s"])
    b_blocks = triton.cdiv(batch, cfg["block_b"])
    h_blocks = triton.cdiv(heads, cfg["block_h"])
    group_b = min(cfg["group_b"], b_blocks)
    grid = (s_blocks * h_blocks * triton.cdiv(b_blocks, group_b) * group_b, 1, 1)
    if pairs_as_words:  # the kernel indexes words (pairs): halve the strides, the channel one is 1
        x_strides = (*(st // 2 for st in x_strides[:3]), 1)
        o_strides = (*(st // 2 for st in o_strides[:3]), 1)
    scalars = (seq_rows, batch, heads, rotary_dim, head_dim, *x_strides, *o_strides,
               freqs.stride(0), freqs.stride(-1),
               n_seqs, _search_steps(n_seqs) if is_thd else 0, cp_size, cp_rank,
               h_blocks, s_blocks, group_b)
    constexprs = dict(
        IS_THD=is_thd,
        TOKEN_ROWS=bool(cfg["token_rows"]),
        SEQ_BOUNDS=seq_bounds,
        # One-warp tiles of several tokens (_count_sequence).
        BOUNDS_EACH=seq_bounds > 0 and cfg["num_warps"] == 1 and cfg["block_s"] > 1,
        PDL_WAIT=pdl,
        WAIT_FIRST=pdl and bool(cfg["wait_first"]),
        HAS_START=start_positions is not None,
        USE_CP=cp_size > 1,
        INTERLEAVED=bool(interleaved),
        PAIRS_AS_WORDS=bool(pairs_as_words),
        BACKWARD=bool(backward),
        INT64=int64,
        FAST_TRIG=bool(cfg["fast_trig"]),
        BLOCK_S=cfg["block_s"],
        BLOCK_B=cfg["block_b"],
        BLOCK_H=cfg["block_h"],
        HALF=_next_pow2(rotary_dim // 2),
        # Channels copied through (words of two when pairs are words; whole rows copy them
        # within the row; with GATHER those after the rotary block).
        PASS=((_next_pow2(head_dim - rotary_block) if head_dim > rotary_block else 0) if gather
              else _next_pow2((head_dim - rotary_dim) // (2 if pairs_as_words else 1))
              if head_dim > rotary_dim and not whole_rows else 0),
        ROW=rotary_block if gather else _next_pow2(head_dim) if whole_rows else 0,
        GATHER_SINES=(rotary_dim if whole_rows and backward and cfg["gather_sines"]
                      and _is_pow2(rotary_dim) else 0),
        GATHER=gather,
        CHANNEL_MULTIPLE=_channel_multiple(rotary_dim, head_dim, gather),
    )
    return Plan(grid, scalars, constexprs, cfg["num_warps"], dict(launch_pdl=True) if pdl else None)


def rope_2d(
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
    config: Optional[dict] = None,
) -> torch.Tensor:
    """Apply RoPE (or, with ``backward=True``, its transpose) to ``t`` with the 2-D kernel.

    Args:
        t: ``[s, b, h, d]``, ``[b, s, h, d]`` or ``[total_tokens, h, d]``; float32/16, bfloat16.
        freqs: float32 angles ``[max_seq_len, 1, 1, rotary_dim]`` (rotary_dim even, <= d).
        tensor_format: ``"sbhd"``, ``"bshd"`` or ``"thd"``.
        start_positions: int ``[b]`` (``[n_seqs]`` for thd): first table row of each sequence.
        interleaved: pairs are channels (2j, 2j+1) instead of (j, j + rotary_dim/2).
        cu_seqlens: int32 ``[n_seqs + 1]`` cumulative sequence lengths (thd only; the padded
            global lengths when cp_size > 1).
        cp_size, cp_rank: context parallelism, dual-chunk slicing as in TransformerEngine.
        backward: apply R(-theta) instead of R(theta): the gradient of the forward.
        out: optional output tensor of ``t``'s shape, dtype and device (any strides); ``out=t``
            rotates in place (channels past rotary_dim untouched: neither read nor written).
        config: optional override of ``default_config``: ``block_s``, ``block_b``, ``block_h``,
            ``num_warps`` (powers of two), ``fast_trig`` (SFU cos/sin, NVIDIA GPUs only) and
            ``token_rows`` (thd: the per-token pre-pass instead of the search over cu_seqlens;
            on by default above TOKEN_ROWS_ABOVE sequences) and ``pdl`` (with the pre-pass:
            programmatic dependent launch of the main kernel; None = on where the GPU has it)
            and ``wait_first`` (with the pre-pass and PDL: the main kernel waits for the
            pre-pass before its x loads, not after them; see WAIT_FIRST_MEAN_TOKENS)
            and ``whole_rows`` (half-split pairs: each row loaded and stored in one piece, the
            channels' partners loaded again from L1; by default on a GPU for 16-bit rows of
            256 B or more, see ``default_config``) and ``gather_sines`` (whole rows, backward,
            power-of-two rotary_dim: the partners' sines gathered in registers, not computed
            again; by default in bshd tiles of 4 positions or more) and ``gather`` (with whole
            rows and part of the head rotated: the rows cut at the rotary block, the partners
            gathered in registers; by default where rotary_dim is not a multiple of 16).
            With ``start_positions`` (sbhd/bshd) ``block_b`` is 1: each batch element has its
            own angles.

    This launcher checks only what it needs to launch safely; ``rope_kernels.apply_rotary_pos_emb``
    validates values (table length, cu_seqlens) too.
    """
    if t.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError(
            "rope_2d got CPU tensors but the Triton interpreter is off. Either move the tensors "
            "to a GPU, or set the environment variable TRITON_INTERPRET=1 before this module is "
            "imported (e.g. `TRITON_INTERPRET=1 python ...`)."
        )
    if out is None:
        out = torch.empty_like(t, memory_format=torch.contiguous_format)
        out_strides = None  # contiguous: follows from t's shape, already in the key
    elif out.shape != t.shape or out.dtype != t.dtype or out.device != t.device:
        raise ValueError(f"out must match t (shape {tuple(t.shape)}, {t.dtype}, {t.device}), got "
                         f"shape {tuple(out.shape)}, {out.dtype}, {out.device}")
    else:
        out_strides = out.stride()
    result = out
    if out is t and freqs.shape[-1] < t.shape[-1]:
        # In place, the channels past rotary_dim stay where they are, neither read nor written
        # (as vLLM's and FlashInfer's in-place kernels leave them): the plan is that of the heads
        # narrowed to rotary_dim, a view of the same memory, all of it rotated.
        t = out = t[..., : freqs.shape[-1]]
    if t.numel() == 0:
        _canonical(t, tensor_format)  # still reject an unknown tensor_format
        return result
    is_thd = tensor_format == "thd"
    # The kernels read cu_seqlens and start_positions with stride 1: a strided view (such as
    # position_ids[:, 0]) is copied first.
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.contiguous()
    if start_positions is not None:
        start_positions = start_positions.contiguous()
    # Interleaved pairs are read one word per pair where the layout allows (this depends on the
    # addresses too, so it is part of the key).
    words = bool(interleaved) and _pairs_as_words(t, out)
    key = (tensor_format, t.shape, t.stride(), out_strides, t.dtype, t.device, freqs.shape,
           freqs.stride(), freqs.dtype,
           (cu_seqlens.shape, cu_seqlens.dtype) if is_thd else None,
           None if start_positions is None else start_positions.dtype,
           bool(interleaved), words, bool(backward), cp_size, cp_rank,
           tuple(sorted(config.items())) if config else None, out is t)  # in place: own tiles
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(t, freqs, out, tensor_format, cu_seqlens, start_positions, interleaved,
                          cp_size, cp_rank, backward, config, words)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
            _PRE_PLANS.clear()
        _PLANS[key] = plan
    seq_info = cu_seqlens if is_thd else t
    if plan.constexprs["TOKEN_ROWS"]:
        seq_info = torch.empty(t.shape[0], dtype=torch.int32, device=t.device)
        pre = _PRE_PLANS.get(key)
        if pre is None:
            pre = _PRE_PLANS[key] = pre_pass_plan(t.shape[0], cu_seqlens.numel() - 1, cp_size,
                                                  cp_rank, start_positions is not None,
                                                  plan.constexprs["PDL_WAIT"])
        launch(thd_positions_kernel, pre, (cu_seqlens, start_positions if start_positions
                                           is not None else cu_seqlens, seq_info))
    # Unused pointer arguments get `t` as a placeholder; constexpr flags keep them unread.
    launch(rope_2d_kernel, plan, (t, freqs, out, seq_info,
                                  start_positions if start_positions is not None else t))
    return result
