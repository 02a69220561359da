"""RoPE on q and k (and a copy of v) in one launch. One self-contained file (torch, triton, stdlib).

Models rarely rotate one tensor: attention needs q and k rotated by the same positions, and
TransformerEngine's fused QKV also hands back v. This kernel does all of it in one launch. Its
programs are split between *parts*: the first ones rotate tiles of q, the next ones tiles of k,
the last ones (if any) copy tiles of v. Every part is seen as ``[s, b, g, u, d]``:

    s, b   the token: position index and batch element (serving's flat tokens: b = 1)
    g, u   the head: ``head = g * n_sub + u``. TransformerEngine's packed QKV holds, per group g
           of the projection, ``q_split / head_dim`` query heads u side by side; elsewhere
           n_sub = 1 and g is the head.
    d      channels; the first ``rotary_dim`` are rotated, the rest copied through.

Where each token's angles come from (``ANGLES``):

    0 "freqs"    TransformerEngine: an angle table [max_pos, 1, 1, rotary_dim], row = the token's
                 position (s, mapped for context parallelism, + start_positions[b]) or
                 positions[s, b]; cos/sin computed here in float32.
    1 "cache"    FlashInfer/vLLM: cos_sin_cache [max_pos, rotary_dim] float32, cos in the first
                 half of a row and sin in the second, row = positions[token].
    2 "cos_sin"  Hugging Face: cos and sin [b, s, rotary_dim] already computed by the model
                 (attention scaling folded in), read at (b, s), one entry per channel.
    3 "cos_sin_half"  the same tensors, one entry per pair: pair j's at channel j, whatever the
                 pairing. GLM's function rotates interleaved pairs with such cos and sin (it
                 takes the first half of Llama's layout, repeat_interleaved); GPT-OSS's cos and
                 sin hold only these entries ([b, s, head_dim / 2]), for half-split pairs, and
                 OpenAI's privacy filter's for interleaved pairs.
    4 "cos_sin_neg"  as 2, with sin negated: a rotation by -theta (NanoChat's ``rotate_half`` has
                 the opposite sign of Llama's).
    5 "inv_freq"  FlashInfer's ``apply_rope_pos_ids``: no table of rows, only each pair's
                 frequency, inv_freq [rotary_dim / 2] float32; pair j's angle is
                 ``float32(positions[token]) * inv_freq[j]`` (a float32 product, as FlashInfer's
                 kernel and transformers' rotary modules form it), its cos/sin computed here.

Pairs are half-split (j, j + rotary_dim/2) or interleaved (2j, 2j+1). Interleaved pairs are read
and written as one 32-bit word each (64-bit in float32) where every row of q and k starts at an
even element with its channels contiguous (the layouts models produce), else split from a
``[..., HALF, 2]`` tile, which is slower (``INTERLEAVED`` 2 and 1). Half-split rows move in three
pieces, the pairs' two halves and the channels past rotary_dim, or whole (``ROW``), each channel's
partner loaded again from L1. Where rotary_dim is not a multiple of 16 the compiler cannot prove the
pieces aligned (it knows an integer argument's divisibility by 16, no finer) and moves them one
element an instruction: there a row moves in two aligned pieces, the rotary block and the rest,
and the partners are gathered from the block in registers (``GATHER``).

Usage::

    q_out, k_out, v_out = rope_qkv(qkv, q_freqs, k_freqs, [q_split, k_split, v_split])
    q, k = rope_cos_sin_cache(positions, q, k, head_size, cos_sin_cache, is_neox=True)
    q, k = rope_cos_sin(q, k, cos, sin, heads_axis=1)

On a machine without a GPU set ``TRITON_INTERPRET=1`` before importing this file.
"""

from __future__ import annotations

import contextlib
import math
import os
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

# Triton reads TRITON_INTERPRET when @triton.jit runs, i.e. when this module is imported.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

ANGLES = {"freqs": 0, "cache": 1, "cos_sin": 2, "cos_sin_half": 3, "cos_sin_neg": 4,
          "inv_freq": 5}


@triton.jit
def _fast_sincos(x):
    """cos(x), sin(x) through the SFU's cos.approx/sin.approx after a two-constant range
    reduction (absolute error ~1e-6): for 16-bit outputs, whose rounding hides it."""
    k = tl.floor(x * 0.15915494309189535 + 0.5)
    r = tl.fma(k, -6.28125, x)  # 6.28125 has 8 significant bits: k * 6.28125 is exact
    r = tl.fma(k, -0.0019353071795864769, r)
    c = tl.inline_asm_elementwise("cos.approx.f32 $0, $1;", "=f,f", [r], dtype=tl.float32,
                                  is_pure=True, pack=1)
    s = tl.inline_asm_elementwise("sin.approx.f32 $0, $1;", "=f,f", [r], dtype=tl.float32,
                                  is_pure=True, pack=1)
    return c, s


@triton.jit
def _sincos(f, FAST_TRIG: tl.constexpr):
    """cos(f), sin(f) of float32 angles: ``_fast_sincos`` for 16-bit tensors (``FAST_TRIG``),
    accurate ones for float32."""
    if FAST_TRIG:
        cos, sin = _fast_sincos(f)
    else:
        cos = tl.cos(f)
        sin = tl.sin(f)
    return cos, sin


@triton.jit
def _position_angles(table_ptr, row, j, mask, t_stride_d, FAST_TRIG: tl.constexpr):
    """``ANGLES`` 5: cos and sin of pair j's angle, ``float32(position) * inv_freq[j]`` (a
    float32 product), for the positions ``row`` [BLOCK_S, 1] (the table's "rows" are the
    positions themselves) and the pairs ``j`` [n]."""
    inv_freq = _table_row(table_ptr + j * t_stride_d, mask)
    return _sincos(row.to(tl.float32) * inv_freq[None, :], FAST_TRIG)


@triton.jit
def _pairs(rotary_dim, INTERLEAVED: tl.constexpr, INT64: tl.constexpr, HALF: tl.constexpr):
    """Pair index j [HALF], its mask, and the pair's two channels: half-split (GPT-NeoX) pairs j
    with j + rotary_dim/2; interleaved (GPT-J) pairs 2j with 2j+1 (INTERLEAVED 1 and 2; 3 and 4
    read or write their interleaved side as words, pair j word j, so these are the channels of
    their half-split side)."""
    j = tl.arange(0, HALF)
    j_mask = j < rotary_dim // 2
    if INT64:
        j = j.to(tl.int64)
    if INTERLEAVED == 1 or INTERLEAVED == 2:
        c1 = 2 * j
        c2 = 2 * j + 1
    else:
        c1 = j
        c2 = j + rotary_dim // 2
    return j, j_mask, c1, c2


@triton.jit
def _table_row(ptrs, mask):
    """Entries of the angle table (or of cos and sin), 0 where masked, loaded ``evict_last``: a
    row is read again by every sequence that has a token at that position (and by every head
    block of a token), and between two reads the streamed q and k, tens of MB, pass through L2
    and would evict it; re-read from memory, the cos/sin cache's rows add 5% to the bytes at
    16 q / 4 k heads of 128. Against the same file without the hint (scripts/qk_table_hint.py,
    figures/qk_table_hint.json: H200, 16 x 4096 tokens, 5 shuffled rounds) in place gained 0.9 to
    2.8 points of copy, Hugging Face's tables 0.7 to 1.9 forward and backward at bf16/fp16/fp32
    32q/8k, 16q/4k, 8q/8k, 32q/32k, 64q/8k, 8192 tokens (-0.6 to +1.3 at batch 1-4, 1024 tokens,
    half rotary, head_dim 64), out of place was level, -0.8 to +0.9 (that host kept the rows in
    L2 without the hint: a copy of q and k that also reads each token's row was as fast as the
    plain copy). On another H200 host, where that copy lost 3.5 points to the plain one and the
    hint won them back, out of place gained 1.1 to 3.0 points at the same shapes (16q/4k 0.918
    -> 0.948), level at 1024 tokens (probe, 3 rounds, not recorded)."""
    return tl.load(ptrs, mask=mask, other=0.0, eviction_policy="evict_last")


@triton.jit
def _angles(table_ptr, sin_ptr, t_row, s_mask, rotary_dim, t_stride_d,
            ANGLES: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
            FAST_TRIG: tl.constexpr, INT64: tl.constexpr, HALF: tl.constexpr,
            ROW: tl.constexpr):
    """cos/sin of both channels of each pair, [BLOCK_S, HALF] each, for the tokens whose rows
    start at ``t_row`` [BLOCK_S] in the angle table (or in cos and sin): shared by every head.
    The table's entries are read through ``_table_row`` (kept in L2: see there). With ``ROW``
    (whole rows, ``_angles_row``): that function's cos and signed sin, each returned twice."""
    if ROW > 0:
        cos1, sin1 = _angles_row(table_ptr, sin_ptr, t_row, s_mask, rotary_dim, t_stride_d,
                                 ANGLES, BACKWARD, FAST_TRIG, INT64, ROW)
        cos2 = cos1
        sin2 = sin1
    else:
        j, j_mask, c1, c2 = _pairs(rotary_dim, INTERLEAVED, INT64, HALF)
        sj_mask = s_mask[:, None] & j_mask[None, :]
        row = t_row[:, None]
        if ANGLES == 5:  # t_row is the position itself
            cos1, sin1 = _position_angles(table_ptr, row, j, j_mask, t_stride_d, FAST_TRIG)
            cos2 = cos1
            sin2 = sin1
        elif ANGLES == 1 or ANGLES == 3:
            # One cos and one sin per pair, pair j's cos at entry j of the row. The cache's rows
            # are [cos_0 .. cos_{d2/2-1}, sin_0 .. sin_{d2/2-1}]; GLM's sines (ANGLES 3, any
            # float dtype) are a table of their own, pair j's at channel j.
            if ANGLES == 1:
                sin_row = table_ptr + (rotary_dim // 2) * t_stride_d
            else:
                sin_row = sin_ptr
            cos1 = _table_row(table_ptr + row + j[None, :] * t_stride_d, sj_mask).to(tl.float32)
            sin1 = _table_row(sin_row + row + j[None, :] * t_stride_d, sj_mask).to(tl.float32)
            cos2 = cos1
            sin2 = sin1
        elif ANGLES == 2 or ANGLES == 4:  # cos and sin per channel (Hugging Face), any float
            cos1 = _table_row(table_ptr + row + c1[None, :] * t_stride_d, sj_mask)
            cos2 = _table_row(table_ptr + row + c2[None, :] * t_stride_d, sj_mask)
            sin1 = _table_row(sin_ptr + row + c1[None, :] * t_stride_d, sj_mask)
            sin2 = _table_row(sin_ptr + row + c2[None, :] * t_stride_d, sj_mask)
            cos1 = cos1.to(tl.float32)
            cos2 = cos2.to(tl.float32)
            sin1 = sin1.to(tl.float32)
            sin2 = sin2.to(tl.float32)
            if ANGLES == 4:  # a rotation by -theta
                sin1 = -sin1
                sin2 = -sin2
        else:  # angles: every channel its own table entry, as TransformerEngine's formula
            f1 = _table_row(table_ptr + row + c1[None, :] * t_stride_d, sj_mask)
            f2 = _table_row(table_ptr + row + c2[None, :] * t_stride_d, sj_mask)
            cos1, sin1 = _sincos(f1, FAST_TRIG)
            cos2, sin2 = _sincos(f2, FAST_TRIG)
        if BACKWARD:
            # The transpose of [[cos1, -sin1], [sin2, cos2]]: sin negated, the channels' sines
            # swapped.
            sin1, sin2 = -sin2, -sin1
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
def _angles_row(table_ptr, sin_ptr, t_row, s_mask, rotary_dim, t_stride_d,
                ANGLES: tl.constexpr, BACKWARD: tl.constexpr, FAST_TRIG: tl.constexpr,
                INT64: tl.constexpr, ROW: tl.constexpr):
    """Half-split RoPE of whole rows as ``y[c] = x[c] * cos[c] + x[partner(c)] * sin[c]``: the
    cos [BLOCK_S, ROW] and signed sin of every channel (-sin in the first half of the rotary
    channels, +sin in the second, cos 1 and sin 0 past them). The backward is the transpose:
    the partner's term takes the partner's sine, with the other sign."""
    c, partner, rotated = _row_partner(rotary_dim, INT64, ROW)
    half = rotary_dim // 2
    first = c < half
    row = t_row[:, None]
    mask = s_mask[:, None] & rotated[None, :]
    # The channel whose sine multiplies x[partner(c)]: c itself in the forward, written through
    # tl.where (c wherever the sine is loaded), which ran Hugging Face's transposed forward
    # (bf16, head_dim 128) 1.4-2.4% faster than the plain index c on an H200 with triton 3.6,
    # level elsewhere and on 3.7.1 (probes, not recorded; docs/performance_notes.md: the same
    # instructions in another order, 64 registers against 66).
    s_ch = partner if BACKWARD else tl.where(rotated, c, partner)
    if ANGLES == 5:  # pair j's angle (t_row is the position), shared by its channels
        cos, sin = _position_angles(table_ptr, row, tl.where(first, c, c - half), rotated,
                                    t_stride_d, FAST_TRIG)
    elif ANGLES == 1 or ANGLES == 3:
        # One entry per pair, pair j's cos at j, which a pair's two channels share: the cache's
        # rows (its sin at d2/2 + j) or GPT-OSS's cos and sin (its sin a table of its own).
        j = tl.where(first, c, c - half)
        if ANGLES == 1:
            sin_row = table_ptr + half * t_stride_d
        else:
            sin_row = sin_ptr
        cos = _table_row(table_ptr + row + j[None, :] * t_stride_d, mask).to(tl.float32)
        sin = _table_row(sin_row + row + j[None, :] * t_stride_d, mask).to(tl.float32)
    elif ANGLES == 2 or ANGLES == 4:
        cos = _table_row(table_ptr + row + c[None, :] * t_stride_d, mask).to(tl.float32)
        sin = _table_row(sin_ptr + row + s_ch[None, :] * t_stride_d, mask).to(tl.float32)
        if ANGLES == 4:  # a rotation by -theta
            sin = -sin
    else:
        f = _table_row(table_ptr + row + c[None, :] * t_stride_d, mask)
        if BACKWARD:
            f_sin = _table_row(table_ptr + row + partner[None, :] * t_stride_d, mask)
        else:
            f_sin = f
        cos, sin = _sincos(f, FAST_TRIG)
        if BACKWARD:
            _, sin = _sincos(f_sin, FAST_TRIG)
    sign = tl.where(first, -1.0, 1.0)
    if BACKWARD:
        sign = -sign
    cos = tl.where(rotated[None, :], cos, 1.0)
    sin = tl.where(rotated[None, :], sign[None, :] * sin, 0.0)
    return cos, sin


@triton.jit
def _group_sub(h, heads, n_sub, INT64: tl.constexpr):
    """Heads ``h`` of a part as (group h // n_sub, sub-head h % n_sub), and which exist."""
    g = h // n_sub
    u = h % n_sub
    if INT64:
        g = g.to(tl.int64)
        u = u.to(tl.int64)
    return g, u, h < heads


@triton.jit
def _tile_rows(s_idx, s_mask, pid_b, pid_h, heads, n_sub, x_s, x_b, x_g, x_u,
               INT64: tl.constexpr, BLOCK_H: tl.constexpr):
    """[BLOCK_S, BLOCK_H, 1] offsets of each (token, head) row of head block ``pid_h`` of a part,
    and which rows exist; channels go on the last axis."""
    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H] heads of this part
    g, u, h_mask = _group_sub(h, heads, n_sub, INT64)
    row = (s_idx[:, None] * x_s + (pid_b * x_b + g * x_g + u * x_u)[None, :])[:, :, None]
    row_mask = (s_mask[:, None] & h_mask[None, :])[:, :, None]
    return row, row_mask


@triton.jit
def _flat_rows(s_idx, s_mask, pid_b, pid_h, heads, n_sub, x_s, x_b, x_g, x_u,
               INT64: tl.constexpr, BLOCK_H: tl.constexpr):
    """Whole rows: [BLOCK_H * BLOCK_S, 1] offsets of each (token, head) row of head block
    ``pid_h``, row r holding token r % BLOCK_S of head r // BLOCK_S, and which rows exist.
    Whole-row tiles are 2-D, with the tokens' cos/sin broadcast to their rows (``_per_row``): on
    a 3-D tile [BLOCK_S, BLOCK_H, ROW] Triton 3.7 spreads the threads over the heads and moves
    cos/sin through shared memory to meet them (5-7% slower than on Triton 3.6 on an H200,
    scripts/flat_tiles.py); on 2-D tiles both versions give each thread rows of one token."""
    BLOCK_S: tl.constexpr = s_idx.shape[0]
    R: tl.constexpr = BLOCK_S * BLOCK_H
    s = tl.reshape(tl.broadcast_to(s_idx[None, :], (BLOCK_H, BLOCK_S)), (R,))
    sm = tl.reshape(tl.broadcast_to(s_mask[None, :], (BLOCK_H, BLOCK_S)), (R,))
    h = pid_h * BLOCK_H + tl.arange(0, R) // BLOCK_S
    g, u, h_mask = _group_sub(h, heads, n_sub, INT64)
    row = (s * x_s + pid_b * x_b + g * x_g + u * x_u)[:, None]
    return row, (sm & h_mask)[:, None]


@triton.jit
def _per_row(v, BLOCK_H: tl.constexpr):
    """[BLOCK_S, ROW] per-token values as [BLOCK_H * BLOCK_S, ROW] rows (see _flat_rows; the
    same as rope_2d's ``_per_row``, which this file does not import, so that it stands alone)."""
    BLOCK_S: tl.constexpr = v.shape[0]
    ROW: tl.constexpr = v.shape[1]
    return tl.reshape(tl.broadcast_to(v[None, :, :], (BLOCK_H, BLOCK_S, ROW)),
                      (BLOCK_H * BLOCK_S, ROW))


@triton.jit
def _as_words(ptr):
    """``ptr`` seen as one word per pair of elements: uint32 for 16-bit dtypes, uint64 for 32-bit.
    (This and the two functions below are rope_2d's, which this file does not import.)"""
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


@triton.jit
def _pass_channels(ptr, row_mask, rotary_dim, head_dim, INTERLEAVED: tl.constexpr,
                   INT64: tl.constexpr, PASS: tl.constexpr):
    """The channels past rotary_dim of a tile's rows [BLOCK_S, BLOCK_H, 1] (``row_mask``),
    copied through: (base pointer, channel index [PASS], mask). With INTERLEAVED 2 they move as
    words, like the pairs: the base reinterpreted as words, the index and its bound halved."""
    if INTERLEAVED == 2:
        p = rotary_dim // 2 + tl.arange(0, PASS)
        p_mask = row_mask & (p < head_dim // 2)[None, None, :]
        base = _as_words(ptr)
    else:
        p = rotary_dim + tl.arange(0, PASS)
        p_mask = row_mask & (p < head_dim)[None, None, :]
        base = ptr
    if INT64:
        p = p.to(tl.int64)
    return base, p, p_mask


@triton.jit
def _after_block(row_mask, head_dim, INT64: tl.constexpr, ROW: tl.constexpr,
                 PASS: tl.constexpr):
    """With ``GATHER``: the channels after a whole-row tile's rotary block (channel index [PASS]
    from channel ROW, a multiple of 16, so aligned) and their mask, for rows [R, 1]."""
    p = ROW + tl.arange(0, PASS)
    if INT64:
        p = p.to(tl.int64)
    return p, row_mask & (p < head_dim)[None, :]


@triton.jit
def _load_tile(
    x_ptr, s_idx, s_mask, pid_b, pid_h, heads, n_sub, rotary_dim, head_dim,
    x_s, x_b, x_g, x_u, x_d,
    INTERLEAVED: tl.constexpr, INT64: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
    PASS: tl.constexpr, ROW: tl.constexpr, GATHER: tl.constexpr,
):
    """Issue the loads of a tile of BLOCK_S tokens x BLOCK_H heads of one part: the pairs' two
    channels (x1, x2; interleaved pairs: the [..., HALF, 2] tile twice, or with INTERLEAVED 2
    both as float32 from one word per pair) and the channels past rotary_dim (xp; with PASS 0, a
    stand-in that is never used). With ``ROW`` (half-split pairs): whole rows [..., ROW] (x1),
    and each channel's partner (x2: the same lines again, from L1); with ``GATHER`` the rotary
    block [..., ROW] (x1; the partners are gathered from it in ``_store_tile``, x2 a stand-in)
    and the channels after it (xp)."""
    if ROW > 0:
        x_row, row_mask = _flat_rows(s_idx, s_mask, pid_b, pid_h, heads, n_sub, x_s, x_b, x_g,
                                     x_u, INT64, BLOCK_H)
        c, partner, rotated = _row_partner(rotary_dim, INT64, ROW)
        x1 = tl.load(x_ptr + x_row + c[None, :] * x_d, mask=row_mask & (c < head_dim)[None, :])
        if GATHER:
            x2 = x1  # the partners are gathered from x1 in _store_tile
        else:
            x2 = tl.load(x_ptr + x_row + partner[None, :] * x_d, mask=row_mask & rotated[None, :],
                         other=0.0)
        xp = x1
        if GATHER and PASS > 0:
            p, p_mask = _after_block(row_mask, head_dim, INT64, ROW, PASS)
            xp = tl.load(x_ptr + x_row + p[None, :] * x_d, mask=p_mask)
    else:
        x_row, row_mask = _tile_rows(s_idx, s_mask, pid_b, pid_h, heads, n_sub, x_s, x_b, x_g,
                                     x_u, INT64, BLOCK_H)
        j, j_mask, c1, c2 = _pairs(rotary_dim, INTERLEAVED, INT64, HALF)
        mask = row_mask & j_mask[None, None, :]
        if INTERLEAVED == 2 or INTERLEAVED == 3:
            # Pair j of a row is word j of it (the launcher passes strides in words, the channel
            # stride 1): loads as wide as the half-split ones, and no shuffle of registers.
            x1, x2 = _load_pairs(x_ptr, x_row + j[None, None, :], mask)
        elif INTERLEAVED == 1:
            # Each row as [..., HALF, 2] (one wide load), split into the pairs' channels later.
            c12 = (c1[:, None] + tl.arange(0, 2)[None, :])[None, None, :, :]  # [1, 1, HALF, 2]
            mask12 = mask[:, :, :, None] & (c12 < rotary_dim)
            x1 = tl.load(x_ptr + x_row[:, :, :, None] + c12 * x_d, mask=mask12)
            x2 = x1
        else:  # half-split pairs (INTERLEAVED 0, and 4's inputs)
            x1 = tl.load(x_ptr + x_row + c1[None, None, :] * x_d, mask=mask)
            x2 = tl.load(x_ptr + x_row + c2[None, None, :] * x_d, mask=mask)
        xp = x1
        if PASS > 0:
            base, p, p_mask = _pass_channels(x_ptr, row_mask, rotary_dim, head_dim, INTERLEAVED,
                                             INT64, PASS)
            xp = tl.load(base + x_row + p[None, None, :] * x_d, mask=p_mask)
    return x1, x2, xp


@triton.jit
def _store_tile(
    out_ptr, x1, x2, xp, cos1, sin1, cos2, sin2,
    s_idx, s_mask, pid_b, pid_h, heads, n_sub, rotary_dim, head_dim,
    o_s, o_b, o_g, o_u, o_d,
    INTERLEAVED: tl.constexpr, INT64: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
    PASS: tl.constexpr, ROW: tl.constexpr, GATHER: tl.constexpr,
):
    """Rotate a tile loaded by ``_load_tile`` by its tokens' cos/sin [BLOCK_S, HALF] and store it
    (the channels past rotary_dim copied). With ``ROW``: whole rows, one store (with ``GATHER``
    two: the rotary block, the partners gathered from it, and the channels after it)."""
    if ROW > 0:
        o_row, row_mask = _flat_rows(s_idx, s_mask, pid_b, pid_h, heads, n_sub, o_s, o_b, o_g,
                                     o_u, INT64, BLOCK_H)
        c = tl.arange(0, ROW)
        if INT64:
            c = c.to(tl.int64)
        if GATHER:
            # The partners from the row in registers: with rotary_dim not a multiple of 16 a load
            # at their addresses (c +- rotary_dim/2) moves one element an instruction. Gathered
            # here, not where x1 is loaded: the gather waits for x1, and a program whose angle
            # rows wait on positions issues those loads first (X_FIRST's barrier).
            _, partner, rotated = _row_partner(rotary_dim, INT64, ROW)
            x2 = tl.gather(x1, tl.broadcast_to(partner[None, :], x1.shape), axis=1)
            x2 = tl.where(rotated[None, :], x2, 0.0)  # (sin is 0 there; x may be inf)
        # One formula for every plan (see the pairs' below): x * cos fused, the partner's term
        # rounded first. The same bits as the pairs' tile, whichever program shape runs.
        y = tl.fma(x1.to(tl.float32), _per_row(cos1, BLOCK_H),
                   x2.to(tl.float32) * _per_row(sin1, BLOCK_H))
        tl.store(out_ptr + o_row + c[None, :] * o_d, y.to(out_ptr.dtype.element_ty),
                 mask=row_mask & (c < head_dim)[None, :])
        if GATHER and PASS > 0:
            p, p_mask = _after_block(row_mask, head_dim, INT64, ROW, PASS)
            tl.store(out_ptr + o_row + p[None, :] * o_d, xp, mask=p_mask)
    else:
        o_row, row_mask = _tile_rows(s_idx, s_mask, pid_b, pid_h, heads, n_sub, o_s, o_b, o_g,
                                     o_u, INT64, BLOCK_H)
        j, j_mask, c1, c2 = _pairs(rotary_dim, INTERLEAVED, INT64, HALF)
        mask = row_mask & j_mask[None, None, :]
        if INTERLEAVED >= 3:
            # A channel's result lands where another thread read another channel: in place,
            # every thread's loads must be done before any thread's stores (BAR.SYNC orders them
            # for the program's threads; programs share no row).
            tl.debug_barrier()
        if INTERLEAVED == 1:
            x1, x2 = tl.split(x1.to(tl.float32))
        else:
            x1 = x1.to(tl.float32)
            x2 = x2.to(tl.float32)
        # Written as fma so that every plan computes the same bits: left as x1 * cos - x2 * sin,
        # the compiler contracts one product or the other into the fma depending on the code
        # around it, so that a program shape (all heads, q's first block apart, in place with
        # the heads narrowed) could differ from another in the last bit.
        y1 = tl.fma(x1, cos1[:, None, :], x2 * sin1[:, None, :] * -1.0)  # (-1.0: an exact neg)
        y2 = tl.fma(x2, cos2[:, None, :], x1 * sin2[:, None, :])
        if INTERLEAVED == 2 or INTERLEAVED == 4:
            _store_pairs(out_ptr, o_row + j[None, None, :], y1, y2, mask)
        elif INTERLEAVED == 1:
            c12 = (c1[:, None] + tl.arange(0, 2)[None, :])[None, None, :, :]
            mask12 = mask[:, :, :, None] & (c12 < rotary_dim)
            y12 = tl.join(y1, y2).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + o_row[:, :, :, None] + c12 * o_d, y12, mask=mask12)
        else:
            tl.store(out_ptr + o_row + c1[None, None, :] * o_d, y1.to(out_ptr.dtype.element_ty),
                     mask=mask)
            tl.store(out_ptr + o_row + c2[None, None, :] * o_d, y2.to(out_ptr.dtype.element_ty),
                     mask=mask)
        if PASS > 0:
            base, p, p_mask = _pass_channels(out_ptr, row_mask, rotary_dim, head_dim, INTERLEAVED,
                                             INT64, PASS)
            tl.store(base + o_row + p[None, None, :] * o_d, xp, mask=p_mask)


@triton.jit
def _rotate_tile(
    x_ptr, out_ptr, cos1, sin1, cos2, sin2, table_ptr, sin_ptr, t_row,
    s_idx, s_mask, pid_b, pid_h, heads, n_sub, rotary_dim, head_dim,
    x_s, x_b, x_g, x_u, x_d, o_s, o_b, o_g, o_u, o_d, t_stride_d,
    ANGLES: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    FAST_TRIG: tl.constexpr, INT64: tl.constexpr, ANGLES_HERE: tl.constexpr,
    BLOCK_H: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr, ROW: tl.constexpr,
    GATHER: tl.constexpr,
):
    """Rotate a tile of BLOCK_S tokens x BLOCK_H heads of one part by the tokens' cos/sin: given
    (``_angles``, computed once for several tiles), or with ``ANGLES_HERE`` computed here, after
    x's loads are issued so that the angle loads and the trig overlap their latency."""
    x1, x2, xp = _load_tile(x_ptr, s_idx, s_mask, pid_b, pid_h, heads, n_sub, rotary_dim,
                            head_dim, x_s, x_b, x_g, x_u, x_d, INTERLEAVED, INT64, BLOCK_H, HALF,
                            PASS, ROW, GATHER)
    if ANGLES_HERE:
        cos1, sin1, cos2, sin2 = _angles(table_ptr, sin_ptr, t_row, s_mask, rotary_dim,
                                         t_stride_d, ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG,
                                         INT64, HALF, ROW)
    _store_tile(out_ptr, x1, x2, xp, cos1, sin1, cos2, sin2, s_idx, s_mask, pid_b, pid_h, heads,
                n_sub, rotary_dim, head_dim, o_s, o_b, o_g, o_u, o_d, INTERLEAVED, INT64, BLOCK_H,
                HALF, PASS, ROW, GATHER)


@triton.jit
def _table_rows(positions_ptr, start_positions_ptr, s_idx, s_mask, pid_b, seq_len,
                t_stride_b, t_stride_s, p_stride_s, p_stride_b, cp_size, cp_rank,
                ANGLES: tl.constexpr, HAS_POSITIONS: tl.constexpr, HAS_START: tl.constexpr,
                USE_CP: tl.constexpr, INT64: tl.constexpr):
    """Where each token's row starts in the angle table (or in cos and sin), [BLOCK_S]: from
    ``positions`` (a load, on which the table's loads wait), or from the token's index. (For
    ``ANGLES`` 5 the stride is 1: the position itself.)"""
    if ANGLES >= 2 and ANGLES <= 4:
        t_row = pid_b * t_stride_b + s_idx * t_stride_s
    else:
        if HAS_POSITIONS:
            pos = tl.load(positions_ptr + s_idx * p_stride_s + pid_b * p_stride_b, mask=s_mask,
                          other=0)
        else:
            pos = s_idx
            if USE_CP:
                # Dual-chunk context parallelism (TransformerEngine): the first half of the local
                # sequence is chunk cp_rank of the global one, the second half chunk
                # 2 * cp_size - 1 - cp_rank.
                half = seq_len // 2
                pos = tl.where(s_idx < half, s_idx + cp_rank * half,
                               seq_len * cp_size - (cp_rank + 1) * half + (s_idx - half))
            if HAS_START:
                pos += tl.load(start_positions_ptr + pid_b)
        if INT64:
            pos = pos.to(tl.int64)
        t_row = pos * t_stride_s
    return t_row


@triton.jit
def _rotate_tile_x_first(
    x_ptr, out_ptr, table_ptr, sin_ptr, positions_ptr, start_positions_ptr,
    s_idx, s_mask, pid_b, pid_h, heads, n_sub, rotary_dim, head_dim, seq_len,
    x_s, x_b, x_g, x_u, x_d, o_s, o_b, o_g, o_u, o_d,
    t_stride_b, t_stride_s, t_stride_d, p_stride_s, p_stride_b, cp_size, cp_rank,
    ANGLES: tl.constexpr, HAS_POSITIONS: tl.constexpr, HAS_START: tl.constexpr,
    USE_CP: tl.constexpr, INTERLEAVED: tl.constexpr, BACKWARD: tl.constexpr,
    FAST_TRIG: tl.constexpr, INT64: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
    PASS: tl.constexpr, ROW: tl.constexpr, GATHER: tl.constexpr, POSITIONS_FIRST: tl.constexpr,
):
    """``_rotate_tile`` for a program of one head block whose table rows come from positions
    (``X_FIRST``): the tile's loads are issued first, then those of the positions and of the
    angle rows (which wait on the positions), so that their latencies overlap. Left to itself
    ptxas moves the positions' load and the rows' above the tile's and issues the tile's only
    once the positions have come: a program then has no byte of q or k in flight for one memory
    latency. A barrier is a point it does not move loads across (BAR.SYNC between the LDGs of
    the tile and of the positions in the SASS; it waits on no load). With ``POSITIONS_FIRST``
    the positions' load goes before the tile's (still with nothing waiting on it), and only the
    rows' after the barrier: the rows' wait is then one latency shorter (``_positions_first``)."""
    if POSITIONS_FIRST:
        t_row = _table_rows(positions_ptr, start_positions_ptr, s_idx, s_mask, pid_b, seq_len,
                            t_stride_b, t_stride_s, p_stride_s, p_stride_b, cp_size, cp_rank,
                            ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INT64)
    x1, x2, xp = _load_tile(x_ptr, s_idx, s_mask, pid_b, pid_h, heads, n_sub, rotary_dim,
                            head_dim, x_s, x_b, x_g, x_u, x_d, INTERLEAVED, INT64, BLOCK_H, HALF,
                            PASS, ROW, GATHER)
    tl.debug_barrier()
    if not POSITIONS_FIRST:
        t_row = _table_rows(positions_ptr, start_positions_ptr, s_idx, s_mask, pid_b, seq_len,
                            t_stride_b, t_stride_s, p_stride_s, p_stride_b, cp_size, cp_rank,
                            ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INT64)
    cos1, sin1, cos2, sin2 = _angles(table_ptr, sin_ptr, t_row, s_mask, rotary_dim, t_stride_d,
                                     ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG, INT64, HALF, ROW)
    _store_tile(out_ptr, x1, x2, xp, cos1, sin1, cos2, sin2, s_idx, s_mask, pid_b, pid_h, heads,
                n_sub, rotary_dim, head_dim, o_s, o_b, o_g, o_u, o_d, INTERLEAVED, INT64, BLOCK_H,
                HALF, PASS, ROW, GATHER)


@triton.jit
def _copy_tile(x_ptr, out_ptr, s_idx, s_mask, pid_b, pid_h, heads, width,
               x_s, x_b, x_g, x_d, o_s, o_b, o_g, o_d,
               INT64: tl.constexpr, BLOCK_H: tl.constexpr, WIDTH: tl.constexpr):
    """Copy a tile of BLOCK_S tokens x BLOCK_H heads of ``width`` channels (v of fused QKV)."""
    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, WIDTH)
    if INT64:
        h = h.to(tl.int64)
        c = c.to(tl.int64)
    mask = (s_mask[:, None] & (h < heads)[None, :])[:, :, None] & (c < width)[None, None, :]
    x_row = (s_idx[:, None] * x_s + (pid_b * x_b + h * x_g)[None, :])[:, :, None]
    o_row = (s_idx[:, None] * o_s + (pid_b * o_b + h * o_g)[None, :])[:, :, None]
    tl.store(out_ptr + o_row + c[None, None, :] * o_d,
             tl.load(x_ptr + x_row + c[None, None, :] * x_d, mask=mask), mask=mask)


@triton.jit
def _told(a, b, c, d, MULTIPLE: tl.constexpr):
    """a, b, c and d, multiples of ``MULTIPLE``, said so for the compiler (which learns of an
    integer argument only whether it is a multiple of 16)."""
    return (a // MULTIPLE * MULTIPLE, b // MULTIPLE * MULTIPLE, c // MULTIPLE * MULTIPLE,
            d // MULTIPLE * MULTIPLE)


# Sizes and counts are not specialised (fewer recompilations); strides are, because stride == 1
# and multiples of 16 are what let Triton vectorise loads and stores.
@triton.jit(do_not_specialize=["seq_len", "batch", "q_heads", "k_heads", "v_heads", "q_sub",
                               "k_sub", "cp_size", "cp_rank", "q_blocks", "k_blocks",
                               "part_blocks", "s_blocks"])
def rope_qk_kernel(
    q_ptr, q_out_ptr, k_ptr, k_out_ptr, v_ptr, v_out_ptr,
    q_table_ptr, k_table_ptr, sin_ptr, positions_ptr, start_positions_ptr,
    seq_len, batch, q_heads, k_heads, v_heads, q_sub, k_sub, rotary_dim, head_dim, v_dim,
    q_s, q_b, q_g, q_u, q_d, qo_s, qo_b, qo_g, qo_u, qo_d,
    k_s, k_b, k_g, k_u, k_d, ko_s, ko_b, ko_g, ko_u, ko_d,
    v_s, v_b, v_g, v_d, vo_s, vo_b, vo_g, vo_d,
    t_stride_b, t_stride_s, t_stride_d, p_stride_s, p_stride_b,
    cp_size, cp_rank,
    k_offset, k_out_offset, v_offset, v_out_offset,  # packed QKV: where k, v start (elements)
    q_blocks, k_blocks, part_blocks,  # head blocks of q, of k, and of all parts together
    s_blocks,  # cdiv(seq_len, BLOCK_S)
    ANGLES: tl.constexpr,
    ALL_HEADS: tl.constexpr,  # a program takes every head of its tokens (else one head block)
    LOADS_FIRST: tl.constexpr,  # with ALL_HEADS, one block of q and one of k, no v: loads first
    SAME_TABLE: tl.constexpr,  # q and k read the same angle table (their cos/sin computed once)
    B_OUTER: tl.constexpr,  # batch elements are the outer axis in memory (bshd, HF's views)
    TOKEN_BLOCKS_FASTEST: tl.constexpr,  # program order: token blocks, head blocks, batch
    PARTS_OUTER: tl.constexpr,  # program order: all of q's programs, then k's, then v's
    HAS_POSITIONS: tl.constexpr,  # positions[s, b] give the table row (else s, + start)
    HAS_START: tl.constexpr,
    USE_CP: tl.constexpr,
    HAS_V: tl.constexpr,
    X_FIRST: tl.constexpr,  # q's (or k's) loads issued before the positions' (_rotate_tile_x_first)
    POSITIONS_FIRST: tl.constexpr,  # with X_FIRST: the positions' load before q's (k's) too
    # Pairs: 0 half-split (j, j + rotary_dim/2); interleaved (2j, 2j+1): 1 split from a
    # [..., HALF, 2] tile, 2 read and written as one word each (q's and k's strides in words).
    # One layout read, the other written (DeepSeek V3's function; the whole head rotated): 3
    # interleaved pairs read as words (the inputs' strides in words), their results stored
    # half-split (the pair's first channel's result at j, the second's at j + rotary_dim/2); 4
    # half-split pairs read, stored as words (the outputs' strides in words): 3's transpose.
    INTERLEAVED: tl.constexpr,
    BACKWARD: tl.constexpr,
    FAST_TRIG: tl.constexpr,
    INT64: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HK: tl.constexpr,  # head block of k and v (with ALL_HEADS; else BLOCK_H)
    Q_LOOP: tl.constexpr,  # with ALL_HEADS: head blocks of q, k and v (unrolled loops)
    K_LOOP: tl.constexpr,
    V_LOOP: tl.constexpr,
    HALF: tl.constexpr,  # power of two >= rotary_dim // 2
    PASS: tl.constexpr,  # power of two >= head_dim - rotary_dim, or 0
    V_WIDTH: tl.constexpr,  # power of two >= v_dim, or 0
    ROW: tl.constexpr,  # power of two >= head_dim: whole rows (half-split pairs), else 0
    # With ROW: the partners of the rotated channels taken from the row in registers (tl.gather);
    # ROW is then the rotary block, a power of two >= rotary_dim, and PASS the channels after it.
    GATHER: tl.constexpr,
    # rotary_dim and head_dim are multiples of CHANNEL_MULTIPLE (2, 4 or 8; 0: nothing told).
    CHANNEL_MULTIPLE: tl.constexpr,
    # q's, k's and v's strides (the channels' apart) and k's and v's offsets are multiples of
    # STRIDE_MULTIPLE, the table's of TABLE_MULTIPLE (4 or 8; 0: nothing told).
    STRIDE_MULTIPLE: tl.constexpr,
    TABLE_MULTIPLE: tl.constexpr,
    # sin's entries start SIN_OFFSET elements past sin_ptr: 1 where cos and sin are the real and
    # imaginary parts of one complex tensor (Llama 4's angles), passed as that one tensor.
    SIN_OFFSET: tl.constexpr,
):
    if CHANNEL_MULTIPLE > 1:
        # Said so that the compiler knows it (of an integer argument it learns only whether it is
        # a multiple of 16): masks at them then cover whole vectors of 2-8 channels, not one.
        rotary_dim = rotary_dim // CHANNEL_MULTIPLE * CHANNEL_MULTIPLE
        head_dim = head_dim // CHANNEL_MULTIPLE * CHANNEL_MULTIPLE
    if STRIDE_MULTIPLE > 1:
        # The same for the strides (heads of 72 or 104 channels: every row starts on 16 bytes,
        # which the compiler cannot tell from a stride of 72), so that rows load in vectors.
        q_s, q_b, q_g, q_u = _told(q_s, q_b, q_g, q_u, STRIDE_MULTIPLE)
        qo_s, qo_b, qo_g, qo_u = _told(qo_s, qo_b, qo_g, qo_u, STRIDE_MULTIPLE)
        k_s, k_b, k_g, k_u = _told(k_s, k_b, k_g, k_u, STRIDE_MULTIPLE)
        ko_s, ko_b, ko_g, ko_u = _told(ko_s, ko_b, ko_g, ko_u, STRIDE_MULTIPLE)
        v_s, v_b, v_g, vo_s = _told(v_s, v_b, v_g, vo_s, STRIDE_MULTIPLE)
        vo_b, vo_g, k_offset, k_out_offset = _told(vo_b, vo_g, k_offset, k_out_offset,
                                                   STRIDE_MULTIPLE)
        v_offset, v_out_offset, _, _ = _told(v_offset, v_out_offset, 0, 0, STRIDE_MULTIPLE)
    if TABLE_MULTIPLE > 1:
        t_stride_b, t_stride_s, _, _ = _told(t_stride_b, t_stride_s, 0, 0, TABLE_MULTIPLE)
    # Program order: head blocks of all parts fastest (the q, k and v of the same tokens, which
    # are neighbours in memory for packed QKV), then tokens in memory order: batch elements then
    # token blocks for sbhd, token blocks then batch elements when the batch is the outer axis.
    # With PARTS_OUTER all of q's programs come first, in that order, then all of k's (then v's):
    # programs that run side by side then stream through one tensor rather than two.
    # With ALL_HEADS a program loops over the head blocks of every part itself. Where results are
    # transposed against the inputs (TOKEN_BLOCKS_FASTEST), token blocks go fastest instead:
    # programs that run side by side then write neighbouring tokens of the same heads.
    pid = tl.program_id(0)
    # Fused QKV passes its packed tensor whole, with where k and v start in it, rather than
    # views into it: every pointer argument is then one of the call's own tensors (the package's
    # shortcuts rely on that). Elsewhere the offsets are 0.
    k_ptr += k_offset
    k_out_ptr += k_out_offset
    v_ptr += v_offset
    v_out_ptr += v_out_offset
    sin_ptr += SIN_OFFSET  # (likewise: the complex angles' one tensor, at its imaginary parts)
    if TOKEN_BLOCKS_FASTEST:
        pid_s = pid % s_blocks
        rest = pid // s_blocks
        pid_h = rest % part_blocks
        pid_b = rest // part_blocks
    else:
        if ALL_HEADS:
            pid_h = 0
            rest = pid
        elif PARTS_OUTER:
            q_programs = q_blocks * s_blocks * batch
            k_programs = k_blocks * s_blocks * batch
            if pid < q_programs:
                pid_h = pid % q_blocks
                rest = pid // q_blocks
            elif pid < q_programs + k_programs:
                pid_h = q_blocks + (pid - q_programs) % k_blocks
                rest = (pid - q_programs) // k_blocks
            else:  # v's programs (the package plans none: see _parts_outer)
                v_blocks = part_blocks - q_blocks - k_blocks
                pid_h = q_blocks + k_blocks + (pid - q_programs - k_programs) % v_blocks
                rest = (pid - q_programs - k_programs) // v_blocks
        else:
            pid_h = pid % part_blocks
            rest = pid // part_blocks
        if B_OUTER:
            pid_s = rest % s_blocks
            pid_b = rest // s_blocks
        else:
            pid_b = rest % batch
            pid_s = rest // batch
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s_idx < seq_len
    if INT64:
        s_idx = s_idx.to(tl.int64)
        pid_b = pid_b.to(tl.int64)

    # Each token's row in the angle table (or in cos and sin); with X_FIRST, later.
    if not X_FIRST:
        t_row = _table_rows(positions_ptr, start_positions_ptr, s_idx, s_mask, pid_b, seq_len,
                            t_stride_b, t_stride_s, p_stride_s, p_stride_b, cp_size, cp_rank,
                            ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INT64)

    if LOADS_FIRST:
        # All of q's heads in one block and all of k's in another: both tiles' loads are issued
        # before any store (the program keeps all of its bytes in flight), then the angles.
        q1, q2, qp = _load_tile(q_ptr, s_idx, s_mask, pid_b, 0, q_heads, q_sub, rotary_dim,
                                head_dim, q_s, q_b, q_g, q_u, q_d, INTERLEAVED, INT64, BLOCK_H,
                                HALF, PASS, ROW, GATHER)
        k1, k2, kp = _load_tile(k_ptr, s_idx, s_mask, pid_b, 0, k_heads, k_sub, rotary_dim,
                                head_dim, k_s, k_b, k_g, k_u, k_d, INTERLEAVED, INT64, BLOCK_HK,
                                HALF, PASS, ROW, GATHER)
        if X_FIRST:
            tl.debug_barrier()  # q's and k's loads before the positions' (_rotate_tile_x_first)
            t_row = _table_rows(positions_ptr, start_positions_ptr, s_idx, s_mask, pid_b,
                                seq_len, t_stride_b, t_stride_s, p_stride_s, p_stride_b, cp_size,
                                cp_rank, ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INT64)
        cos1, sin1, cos2, sin2 = _angles(q_table_ptr, sin_ptr, t_row, s_mask, rotary_dim,
                                         t_stride_d, ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG,
                                         INT64, HALF, ROW)
        _store_tile(q_out_ptr, q1, q2, qp, cos1, sin1, cos2, sin2, s_idx, s_mask, pid_b, 0,
                    q_heads, q_sub, rotary_dim, head_dim, qo_s, qo_b, qo_g, qo_u, qo_d,
                    INTERLEAVED, INT64, BLOCK_H, HALF, PASS, ROW, GATHER)
        if not SAME_TABLE:
            cos1, sin1, cos2, sin2 = _angles(k_table_ptr, sin_ptr, t_row, s_mask, rotary_dim,
                                             t_stride_d, ANGLES, INTERLEAVED, BACKWARD,
                                             FAST_TRIG, INT64, HALF, ROW)
        _store_tile(k_out_ptr, k1, k2, kp, cos1, sin1, cos2, sin2, s_idx, s_mask, pid_b, 0,
                    k_heads, k_sub, rotary_dim, head_dim, ko_s, ko_b, ko_g, ko_u, ko_d,
                    INTERLEAVED, INT64, BLOCK_HK, HALF, PASS, ROW, GATHER)
    elif ALL_HEADS:
        # The cos/sin of these tokens once, for every head block of q, k (and v's copy). With
        # X_FIRST they are loaded after the first block of q has its loads issued.
        if X_FIRST:
            x1, x2, xp = _load_tile(q_ptr, s_idx, s_mask, pid_b, 0, q_heads, q_sub, rotary_dim,
                                    head_dim, q_s, q_b, q_g, q_u, q_d, INTERLEAVED, INT64,
                                    BLOCK_H, HALF, PASS, ROW, GATHER)
            tl.debug_barrier()
            t_row = _table_rows(positions_ptr, start_positions_ptr, s_idx, s_mask, pid_b,
                                seq_len, t_stride_b, t_stride_s, p_stride_s, p_stride_b, cp_size,
                                cp_rank, ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INT64)
        cos1, sin1, cos2, sin2 = _angles(q_table_ptr, sin_ptr, t_row, s_mask, rotary_dim,
                                         t_stride_d, ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG,
                                         INT64, HALF, ROW)
        if X_FIRST:
            _store_tile(q_out_ptr, x1, x2, xp, cos1, sin1, cos2, sin2, s_idx, s_mask, pid_b, 0,
                        q_heads, q_sub, rotary_dim, head_dim, qo_s, qo_b, qo_g, qo_u, qo_d,
                        INTERLEAVED, INT64, BLOCK_H, HALF, PASS, ROW, GATHER)
        for hb in tl.static_range(1 if X_FIRST else 0, Q_LOOP):
            _rotate_tile(q_ptr, q_out_ptr, cos1, sin1, cos2, sin2, q_table_ptr, sin_ptr, t_row,
                         s_idx, s_mask, pid_b, hb, q_heads, q_sub, rotary_dim, head_dim,
                         q_s, q_b, q_g, q_u, q_d, qo_s, qo_b, qo_g, qo_u, qo_d, t_stride_d,
                         ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG, INT64, False, BLOCK_H, HALF,
                         PASS, ROW, GATHER)
        if not SAME_TABLE:
            cos1, sin1, cos2, sin2 = _angles(k_table_ptr, sin_ptr, t_row, s_mask, rotary_dim,
                                             t_stride_d, ANGLES, INTERLEAVED, BACKWARD,
                                             FAST_TRIG, INT64, HALF, ROW)
        for hb in tl.static_range(K_LOOP):
            _rotate_tile(k_ptr, k_out_ptr, cos1, sin1, cos2, sin2, k_table_ptr, sin_ptr, t_row,
                         s_idx, s_mask, pid_b, hb, k_heads, k_sub, rotary_dim, head_dim,
                         k_s, k_b, k_g, k_u, k_d, ko_s, ko_b, ko_g, ko_u, ko_d, t_stride_d,
                         ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG, INT64, False, BLOCK_HK, HALF,
                         PASS, ROW, GATHER)
        if HAS_V:
            for hb in tl.static_range(V_LOOP):
                _copy_tile(v_ptr, v_out_ptr, s_idx, s_mask, pid_b, hb, v_heads, v_dim,
                           v_s, v_b, v_g, v_d, vo_s, vo_b, vo_g, vo_d, INT64, BLOCK_HK, V_WIDTH)
    elif X_FIRST:
        # One head block of q or of k, its loads before the positions' (_rotate_tile_x_first).
        if pid_h < q_blocks:
            _rotate_tile_x_first(
                q_ptr, q_out_ptr, q_table_ptr, sin_ptr, positions_ptr, start_positions_ptr,
                s_idx, s_mask, pid_b, pid_h, q_heads, q_sub, rotary_dim, head_dim, seq_len,
                q_s, q_b, q_g, q_u, q_d, qo_s, qo_b, qo_g, qo_u, qo_d,
                t_stride_b, t_stride_s, t_stride_d, p_stride_s, p_stride_b, cp_size, cp_rank,
                ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INTERLEAVED, BACKWARD, FAST_TRIG, INT64,
                BLOCK_H, HALF, PASS, ROW, GATHER, POSITIONS_FIRST)
        elif pid_h < q_blocks + k_blocks:
            _rotate_tile_x_first(
                k_ptr, k_out_ptr, k_table_ptr, sin_ptr, positions_ptr, start_positions_ptr,
                s_idx, s_mask, pid_b, pid_h - q_blocks, k_heads, k_sub, rotary_dim, head_dim,
                seq_len, k_s, k_b, k_g, k_u, k_d, ko_s, ko_b, ko_g, ko_u, ko_d,
                t_stride_b, t_stride_s, t_stride_d, p_stride_s, p_stride_b, cp_size, cp_rank,
                ANGLES, HAS_POSITIONS, HAS_START, USE_CP, INTERLEAVED, BACKWARD, FAST_TRIG, INT64,
                BLOCK_HK, HALF, PASS, ROW, GATHER, POSITIONS_FIRST)
        elif HAS_V:
            _copy_tile(v_ptr, v_out_ptr, s_idx, s_mask, pid_b, pid_h - q_blocks - k_blocks,
                       v_heads, v_dim, v_s, v_b, v_g, v_d, vo_s, vo_b, vo_g, vo_d,
                       INT64, BLOCK_HK, V_WIDTH)
    elif pid_h < q_blocks:
        _rotate_tile(q_ptr, q_out_ptr, 0.0, 0.0, 0.0, 0.0, q_table_ptr, sin_ptr, t_row,
                     s_idx, s_mask, pid_b, pid_h, q_heads, q_sub, rotary_dim, head_dim,
                     q_s, q_b, q_g, q_u, q_d, qo_s, qo_b, qo_g, qo_u, qo_d, t_stride_d,
                     ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG, INT64, True, BLOCK_H, HALF, PASS,
                     ROW, GATHER)
    elif pid_h < q_blocks + k_blocks:
        _rotate_tile(k_ptr, k_out_ptr, 0.0, 0.0, 0.0, 0.0, k_table_ptr, sin_ptr, t_row,
                     s_idx, s_mask, pid_b, pid_h - q_blocks, k_heads, k_sub, rotary_dim,
                     head_dim, k_s, k_b, k_g, k_u, k_d, ko_s, ko_b, ko_g, ko_u, ko_d, t_stride_d,
                     ANGLES, INTERLEAVED, BACKWARD, FAST_TRIG, INT64, True, BLOCK_HK, HALF, PASS,
                     ROW, GATHER)
    else:
        if HAS_V:
            _copy_tile(v_ptr, v_out_ptr, s_idx, s_mask, pid_b, pid_h - q_blocks - k_blocks,
                       v_heads, v_dim, v_s, v_b, v_g, v_d, vo_s, vo_b, vo_g, vo_d,
                       INT64, BLOCK_HK, V_WIDTH)


# ---------------------------------------------------------------------------------------------
# Launch plans
# ---------------------------------------------------------------------------------------------
def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _floor_pow2(n: int) -> int:
    return 1 << max(0, n.bit_length() - 1)


def _head_block(q_heads: int, k_heads: int, rows: int) -> int:
    """The head block of the generic tiles (``default_config``'s last rule, ``_whole_rows`` on
    the interpreter): as many heads as the smaller of q's and k's counts rounds up to, at most
    ``rows`` rows."""
    return min(_next_pow2(max(1, min(q_heads, k_heads))), _floor_pow2(rows))


TILE_BYTES = 8192  # input bytes per program on a GPU
# Tokens x heads of a tile whose outputs are transposed against its inputs (see default_config).
TRANSPOSED_TILE = (4, 4)
# Whole rows for 16-bit half-split pairs (``_whole_rows``), off by default: 0.1-3.0% faster than
# the pair tiles on an H100, up to 11% slower on an H200 (scripts/qk_whole_rows.py,
# figures/qk_whole_rows.json and figures/qk_whole_rows_h200.json; see default_config).
WHOLE_ROWS = False
# Results transposed against the inputs (Hugging Face's partial rotary on the transposed views
# models hand over), rows of 256 B or more: token blocks are the fastest program axis, so
# programs running side by side write neighbouring runs of each head's tokens, where head blocks
# fastest had them write to as many heads, far apart. scripts/qk_transposed_order.py, 7 shuffled
# rounds: on an H200 (figures/qk_transposed_order_h200.json) bf16 32q/8k, half rotary, GPT-NeoX's
# call 0.946 -> 0.954 of copy forward, 0.948 -> 0.952 backward, GLM's 0.942 -> 0.958 / 0.942 ->
# 0.957, -0.3% to +2.7% at its 15 other shapes of such rows; with 128 B rows GLM's lost 1.4-1.8%
# in a first recording (the order at every row width).
# On an H100 (figures/qk_transposed_order_h100.json) level, -0.6% to +1.0%.
TRANSPOSED_TOKEN_BLOCKS_FASTEST = True
# Hugging Face's interleaved pairings (Cohere's and GLM's calls) read as words in 128 B rows
# (head_dim 64 in 16-bit): the whole head rotated, loads first where q fills 4 KB a token, else 2
# tokens x 8 heads on 2 warps (4 x 4 with 1-3 k heads); part of it, tiles of their own for GLM's
# call and for 1-3 k heads (see default_config).
WORDS_128B_HF_TILES = True
# In-place calls with part of the head rotated, in float32: whole rows on tiles of their own
# (``narrowed`` in default_config; scripts/qk_in_place_narrow_tiles.py compares them with the
# tiles before, which this flag turned off gives).
NARROWED_ROWS = True
# Programs of one head block over q and k whose heads fill the blocks: all of q's programs first,
# then all of k's, rather than each token's head blocks of q and k side by side. The programs
# running at one time then read and write two streams of memory instead of four
# (scripts/qk_size_scan.py: a Triton copy of q and k in one launch, 0.964 -> 0.968 of copy at 672
# MB in bf16). scripts/qk_parts_outer.py, figures/qk_parts_outer_h200.json (H200, 3 shuffled
# rounds, every q+k call of the benchmark where the rule applies, 256 MB or more, time before /
# time after): the cos/sin cache 0.997-1.012 (median 1.005) out of place, 1.000-1.022 (1.007) in
# place (bf16 32q/8k at 672 MB 0.944 -> 0.956 of copy in place), Hugging Face's calls 0.998-1.012,
# Cohere's and GLM's 1.000-1.007. Every plan of one head block in that order
# (figures/qk_parts_outer_every_plan_h200.json): where k's heads fill half a block (Hugging Face's
# 4 KB blocks at 32q/8k and 64q/8k, the cache in place at fp32 16q/4k) 0.958-1.019 (median 0.981),
# fused QKV, whose q, k and v of a token are neighbours in memory, 0.993-1.000 forward and
# 0.968-0.979 backward: those keep the order before (``_parts_outer``).
PARTS_OUTER = True
# q's and k's loads issued before the positions' (``X_FIRST`` in the kernel; ``_x_first``).
LOADS_BEFORE_POSITIONS = True
# The cache's gathered rows on more than one warp, 4 tokens a program or more: the positions'
# load before q's and k's too (``POSITIONS_FIRST`` in the kernel; ``_positions_first``).
GATHERED_POSITIONS_FIRST = True
# Tiles of their own for 16-bit half-split calls of the cos/sin cache and Hugging Face's tables
# whose head counts the rules below fit badly: blocks partly masked (10, 12, 20 or 40 heads in
# blocks of 8 or 16), 4 warps where 2 move more, one token's 2 KB where 2 tokens move more, or
# head_dim 96's rows padded to 128 channels in blocks of 8 heads (``_head_count_tile``).
HEAD_COUNT_TILES = True
# Partial rotary with rotary_dim not a multiple of 16 (GPT-NeoX 20B's 24 of 96 channels, Pythia
# 2.8B's and StableLM 3B's 20 of 80): whole rows cut at the rotary block, in vectors, each rotated
# channel's partner taken from the row in registers (``GATHER`` in the kernel;
# ``_gathered_partners``).
GATHERED_PARTNERS = True
# In place with such a rotary_dim (vLLM's in-place calls for GPT-NeoX models, Hugging Face's
# in-place functions): the narrowed heads' rows as one rotary block masked at rotary_dim, the
# partners gathered (``_gathered_partners``, ``_gathered_tile``). With CHANNEL_MULTIPLES,
# 1.090-2.790 times the speed of 43b2d79 (figures/qk_in_place_unaligned_h200.json).
IN_PLACE_GATHER = True
# The largest power of two (up to 8) dividing rotary_dim and head_dim passed to the kernel where
# a mask stops at one that is not a multiple of 16 (``CHANNEL_MULTIPLE``; ``_channel_multiple``):
# the masks then cover whole vectors.
CHANNEL_MULTIPLES = True
# The same for strides and offsets that are multiples of 16 bytes but not of 16 elements
# (``STRIDE_MULTIPLE``, ``TABLE_MULTIPLE``; ``_stride_multiple``).
STRIDE_MULTIPLES = True
# Tiles of models' shapes the rules below fit badly, from probes of 24 models' shapes (H200,
# 3 shuffled rounds; see default_config): few k heads with q over 4 KB (FEW_K_HEAD_TILES), rows
# padded to a power of two in Hugging Face's partial rotary (PADDED_TRANSPOSED_PAIRS), and the
# cos/sin cache with part of 128 B rows rotated (PARTIAL_128B_CACHE_TILES).
FEW_K_HEAD_TILES = True
PADDED_TRANSPOSED_PAIRS = True
PARTIAL_128B_CACHE_TILES = True
# One tensor a call (k of no heads: Gemma 4's and GPT-J's functions in rope_kernels.hf), 16-bit,
# every channel of the rows given rotated, in place or not: one token's heads a program, at least 4
# of them and 2 KB, on a warp a KB (2 at least) (``_one_tensor_tile``). The rules for q and k
# together gave these calls all-heads programs with an empty k block, or 8 tokens x 1 head. A
# probe (H200, 3 shuffled rounds, not recorded; 10-13 tiles a shape, forward / backward, of
# copy): Gemma 4's q of 8 heads of 512 at batch 4, 0.894 / 0.886 -> 0.929 / 0.924 (the best of
# 11); its k of 4 heads of 256, 0.853 / 0.880 -> 0.883 / 0.879; q of 8 of 256 0.921 / 0.925 ->
# 0.932 / 0.928 (the best of 13); k of 4 of 512 level (0.941 / 0.946 -> 0.942 / 0.940); GPT-J's
# 16 heads of 64 rotated channels, 0.819 / 0.817 -> 0.832 / 0.832 (the best of 11). Recorded
# against the tiles before (scripts/hf_one_tensor.py, figures/hf_one_tensor_h200.json: H200, 3
# shuffled rounds, 6 shapes, 3 of them held out, forward, backward and in place, batch 4 and 16):
# 54 calls 0.974-2.192 times the speed (median 1.018), the same bits; CodeGen 350M's 64 B rows
# 1.540-2.192; 10 calls slower by up to 2.6% (q of 16 heads of 128 forward 0.984, where the
# loads-first program of all 16 led).
ONE_TENSOR_TILES = True
# DeepSeek V3's backward (INTERLEAVED 4: half-split pairs read, words written) with fewer k heads
# than a head block (its one shared key head): k's blocks of k's own size, where the programs of
# one head block run. In a probe (H200, 5 shuffled rounds, bf16, DeepSeek's views,
# rope_dim 64), against k in blocks of q's size: 0.905 -> 0.945 of copy at 128 heads (4 x 4096
# tokens), 0.872 -> 0.892 at 64, 0.844 -> 0.877 at 20, 0.808 -> 0.850 at 16; its forward lost
# with the same blocks (0.920 -> 0.883 at 20 heads, 0.904 -> 0.857 at 16), so keeps them.
# Recorded against the blocks before (scripts/hf_deepseek.py, figures/hf_deepseek_h200.json: H200,
# 5 shuffled rounds, 7 models' shapes, LongCat-Flash's held out): 1.027-1.064 times the speed at
# the 5 shapes it changes, the same bits; 1.000-1.001 at the 2 it leaves (all heads a program).
DEEPSEEK_BACKWARD_K_BLOCKS = True
# The vision encoders' calls (``rope_kernels.hf.apply_rotary_pos_emb_vision``): tiles of their own
# where the rules fit them badly (``_vision_tile``). Recorded with STRIDE_MULTIPLES against the code
# before both (scripts/hf_vision.py, figures/hf_vision_h200.json: H200, 5 shuffled rounds, bf16,
# 7 encoders' shapes, 32768 and 65536 patches): 1.042-1.586 times the speed at the 24 calls of the 4
# shapes they change, the same bits; 0.990-1.005 at the controls.
VISION_TILES = True
# ``_gathered_tile`` out of place in 16-bit on 1 warp: the cache's (and every call whose results are
# not transposed) (largest row in bytes, rows a program: q's heads first, k's blocks as large),
# Hugging Face's transposed views' (largest row in bytes, (tokens, heads)). The 2-warp tiles before
# had never been tried on 1 warp; rope_2d's gathered rows had just run up to 5.5% faster so
# (rope_2d.GATHERED_TILES). A probe (H200, 3 shuffled rounds, not recorded, 7 models' shapes in bf16
# and fp16, 10 tiles): the cache at 20 of 80 on 1 x 16 0.985 of copy against 0.960 on 4 x 8 on 2
# warps, 24 of 128 on 1 x 8 0.979 against 0.965, GPT-NeoX 20B's 64 heads of 96 level (0.978 against
# 0.979); Hugging Face's call on 2 x 4 0.4-2.6 points ahead of 4 x 4 on 2 warps at rows of 160-256
# B, behind at 320 B (40 of 160, where 4 x 4 on 1 warp led). Recorded against 0ba0055 at 5 of the
# probe's shapes and 7 held out (figures/qk_gathered_one_warp_h200.json, H200, 3 shuffled rounds):
# the 29 calls whose tile changed at 0.998-1.130 times the speed (median 1.011), the same bits; the
# cache 0.825-0.980 -> 0.922-0.985 of copy (Pythia 2.8B's 20 of 80 0.962 -> 0.984, 40 of 160 with 2
# k heads 0.825 -> 0.932), Hugging Face's call 0.884-0.948 -> 0.893-0.956. With 8 q and 8 k heads
# (held out) the recording's first run (_run1.json) had 1 warp behind: Hugging Face's backward 0.914
# -> 0.879, the cache 0.961 -> 0.952; so only from 16 q heads. The run recorded, with both sides on
# one tile there, measured that backward at 0.949 and 0.892: it runs at two levels, and the loss may
# not be the tile's. A second probe (H200, 5 shuffled rounds, each default timed twice, within 0.2
# points of itself; not recorded) took up both leads. Hugging Face's call with 8 q and 8 k heads:
# 2 x 4 on 1 warp 0.958 / 0.962 against 0.948 / 0.952 at 20 of 80, 1 x 8 and 2 x 4 0.964-0.968
# against 0.914-0.916 at 24 of 128; its rows of 320 B (40 of 160; 32/8, 32/32 and 16/16 heads): 4 x
# 4 on 1 warp 0.960-0.966 against 0.946-0.953 on 2. The cache with 8 q heads kept its 2-warp tiles
# (4 x 8 on 2 0.963 against 0.952 on 2 x 8 on 1 at 20 of 80; level at 24 of 128). So the transposed
# table gains 320 B rows and its floor is 8 q heads; the cache's stays at 16. Its first recording
# against 1a3db4f (..._run1.json) had Hugging Face's call at 40 of 160 with 2 k heads (held out)
# behind, 8 x 2 on 1 warp 0.923 / 0.922 against 0.938 / 0.936 on 2, so the 320 B entry needs 4 k
# heads (the third number: the fewest k heads an entry takes). Recorded with that
# (figures/qk_transposed_one_warp_h200.json, H200, 5 shuffled rounds, 12 shapes): Hugging Face's
# call 1.005-1.052 at the 20 calls changed (median 1.012), 0.908-0.959 -> 0.927-0.966 of copy.
GATHERED_ONE_WARP_TILES = {"cache": ((192, 16, 1), (320, 8, 1)),
                           "transposed": ((256, (2, 4), 1), (320, (4, 4), 4))}
GATHERED_ONE_WARP_MIN_Q_HEADS = {"cache": 16, "transposed": 8}
# ``_gathered_tile`` out of place in 16-bit on 2 warps, results not transposed (the cache's calls,
# forward and backward), where k has fewer heads than q's block would take: 8 tokens x 4 q heads a
# program, k's blocks of its own heads (``block_hk``), not q's blocks cut to k's head count (32 x 1
# with 1 k head, 16 x 2 with 2). A probe (H200, 5 shuffled rounds, not recorded, 17 tiles at 9
# models' shapes): 8 q / 1 k heads at 20 of 80 0.705 -> 0.868 of copy forward, 0.701 -> 0.869
# backward; 4 q / 1 k at 40 of 160 0.631 -> 0.836; 8 q / 2 k at 20 of 80 0.889 -> 0.915; 12 q / 4 k
# at 28 of 112 0.925 -> 0.944; 12 q / 2 k at 24 of 96 level (0.929 / 0.931). Float32 lost (8 q / 2 k
# at 20 of 80: 0.944 on 8 x 2 / 2, 0.902 on 8 x 4 / 2), so 16-bit only; rows of 160-320 B (the
# probe's) and from 4 q heads. Its first recording against 5a683c8
# (figures/qk_few_k_gathered_h200_run1.json, code of 982f601) had 26 of 28 calls 1.002-1.323 times
# the speed before, but rows of 256 B (held out: 8 q / 2 k at 24 of 128, rows a power of two, with
# no padding) 0.976 / 0.969; so rows not a power of two. Recorded so
# (figures/qk_few_k_gathered_h200.json, H200, 5 shuffled rounds, 19 shapes, 8 held out): 1.000-1.380
# at the 30 calls changed (median 1.043), 0.628-0.928 -> 0.818-0.943 of copy, the same bits.
FEW_K_HEAD_GATHERED_BLOCKS = True
# The same for Hugging Face's calls (results transposed against the inputs) with 1 or 2 k heads, in
# 16-bit at rows of 160-320 B but 256: (largest row in bytes, k heads, (tokens, q heads, warps)),
# k's blocks of its own heads. Before, q's block was cut to k's head count: 8 tokens x 1 head on 1
# warp with 1 k head from 8 q heads (16 x 1 on 2 below 8). Two probes (H200, 3 shuffled rounds, not
# recorded; 23 shapes of 4-32 q heads, 6-17 tiles each, forward and backward alike), forward: 1 k
# head, 160-192 B: 8 x 4 on 2 warps, 8 q / 1 k at 20 of 80 0.821 -> 0.927, 16 q 0.824 -> 0.944, at
# 24 of 96 4 q 0.889 -> 0.953; 224 B: 4 x 2 on 1, 4 q 0.885 -> 0.949, 16 q 0.881 -> 0.945 (16 x 2 on
# 2 0.936-0.938 there, 8 x 4 0.844 and 0.873 at 4 and 8 q heads); 320 B: 2 x 4 on 1, 0.753-0.764 ->
# 0.876-0.916. 2 k heads, 160 B: 4 x 4 on 2, 8 q 0.929 -> 0.946, 4 q 0.863 -> 0.925 (8 x 4 0.951);
# 320 B: 4 x 2 on 1, 0.930-0.940 -> 0.951-0.965; 192-224 B: level with the tile before (4 x 2 on 1
# from 8 q heads, which the entry keeps). Where q's heads are not a multiple of its block, the block
# is halved and the tokens doubled (6 q / 1 k at 20 of 80: 16 x 2 0.894, 8 x 4 0.824); an odd number
# of q heads (blocks of 1, not measured) keeps the tile before (since the commit after 2dc4328's
# record, which had no such shape). Recorded against cae2b94 (figures/qk_few_k_transposed_h200.json,
# H200, 5 shuffled rounds, 32 shapes, 11 held out): 1.005-1.245 at the 56 calls changed (median
# 1.085), 0.696-0.939 -> 0.826-0.964 of copy, the same bits; the 8 calls left alone 0.999-1.003.
FEW_K_TRANSPOSED_TILES = ((192, 1, (8, 4, 2)), (224, 1, (4, 2, 1)), (320, 1, (2, 4, 1)),
                          (160, 2, (4, 4, 2)), (320, 2, (4, 2, 1)))


def _x_first(has_positions: bool, interleaved: bool, narrowed: bool) -> bool:
    """Whether q's and k's loads go before the positions' (``X_FIRST``): where it was measured
    faster, the half-split pairs of calls with per-token positions whose heads are not narrowed.
    scripts/qk_loads_before_positions.py, figures/qk_loads_before_positions_h200.json (H200, 4
    shuffled rounds, the cos/sin cache against the file before, out of place / in place): bf16
    32q/8k +0.4 to +1.1% / +0.1 to +1.0% at 168-1343 MB (the intercept of time against bytes
    6.98 -> 6.55 us); 16q/4k (loads first) +1.4% / +0.5%; head_dim 64 (all heads a program)
    +1.7% / +1.9%; float32 +0.4% / +0.1%; batch 1 in place +0.4%; half the head rotated +0.7% out
    of place (..._half_h200.json). Left out, as they lost: interleaved pairs read as words
    (-1.3% at 32q/8k, ..._words_h200.json) and in place with half the head rotated, where the
    heads are narrowed and all heads are a program (-2.3%, ..._narrowed_h200.json). Elsewhere the
    kernel of 0892ecc compiled to the same SASS as before it (42 plans checked with Triton
    3.7.1); since d697775 the rotation is written as fma, which schedules most plans otherwise."""
    return LOADS_BEFORE_POSITIONS and has_positions and not interleaved and not narrowed


def _positions_first(x_first: bool, gather: bool, all_heads: bool, num_warps: int,
                     block_s: int) -> bool:
    """Whether a program of one head block with ``X_FIRST`` also issues the positions' load before
    the tile's (``POSITIONS_FIRST``): the cache's gathered rows (``_gathered_partners``) on more
    than one warp, in tiles of 4 tokens or more. Its rows of cos and sin, one float32 row a token,
    are loaded at the positions' addresses after the barrier; with the positions' load after the
    tile's too, the rows come two latencies after the tile's first load. A probe (H200, 5 shuffled
    rounds, not recorded) found where that costs: the cache's call with 8 q / 2 k heads at 20 of 80
    channels (16 x 2 on 2 warps) at 0.869 / 0.871 of copy, 0.966 with the positions' load taken out
    (the benchmark's positions are each token's index: the same rows), against 0.974 for a copy of
    the same bytes. With the positions' load first 0.890; 12 q / 4 k at 28 of 112 (4 x 4) 0.880 ->
    0.923, 8 q / 8 k at 20 of 80 (4 x 8) 0.958 -> 0.967. On one warp it lost up to 0.8 points (1 x 8
    and 1 x 16 at 24 of 96 and 128, 20 of 80), in the plans of other calls with positions (not
    gathered) up to 1.5 (bf16 32 q / 8 k heads, one sequence of 4096 tokens). The first recording
    (every gathered tile on 2 warps, figures/qk_positions_first_h200_run1.json, H200, 5 shuffled
    rounds, the cache out of place forward and backward) had it 1.006-1.049 times the speed in tiles
    of 4-16 tokens (level at 24 of 96 with 8 q / 8 k heads, 0.998 and 1.000) but 0.987-1.006 in
    tiles of 2 tokens x 8 heads: float32 at 24 of 96 0.992-0.994, bf16 at 24 of 128 0.987 / 0.988.
    So from 4 tokens a program (a rule set after that run: their rows of cos and sin, the loads that
    wait, grow with the tokens)."""
    return (GATHERED_POSITIONS_FIRST and x_first and gather and not all_heads and num_warps > 1
            and block_s >= 4)


def _gathered_partners(head_dim: int, rotary_dim: Optional[int], interleaved: bool, words: bool,
                       angles: int, narrowed: bool = False) -> bool:
    """Whether a call takes whole rows with the partners gathered in registers
    (``GATHERED_PARTNERS``, the kernel's ``GATHER``): half-split pairs of the cos/sin cache or
    Hugging Face's tables (``angles`` as ``default_config`` takes them) with part of the head
    rotated, where rotary_dim is not a multiple of 16. There the compiler cannot prove aligned
    the pairs' second half (channel rotary_dim/2) or the channels past rotary_dim (it knows an
    integer argument's divisibility by 16, no finer), and the pairs' tiles move them one element
    an instruction. Whole rows fix the pass channels but not the partners, loaded at c +-
    rotary_dim/2. Here each row is loaded in two aligned pieces, the rotary block (channels 0 to
    the power of two >= rotary_dim, masked at head_dim) and the rest, and the partners come from
    the rotary block in registers (``tl.gather``: shuffles within a warp): every load and store
    of q and k is a vector. Measured on an H200 in bf16 (probe, 3 shuffled rounds, Hugging
    Face's call / the cache's, fraction of copy, the pairs with the pass channels as rows ->
    these tiles): Pythia 2.8B's 20 of 80 channels 0.690 / 0.683 -> 0.942 / 0.960, GPT-NeoX 20B's
    24 of 96 0.763 / 0.750 -> 0.944 / 0.981, StableLM 2 12B's 40 of 160 0.700 / 0.722 -> 0.914 /
    0.965, 24 of 128 0.835 / 0.856 -> 0.924 / 0.963; in float32, where whole rows loaded the
    partners one element at a time and the pairs' tiles moved every element so, 20 of 80 0.484 /
    0.814 -> 0.916 / 0.956. Recorded with ``_gathered_tile``'s tiles against 7b5d384
    (figures/qk_gathered_partners_h200.json, 5 rounds): 24 calls 1.100-1.892 times the speed,
    Hugging Face's call at 0.915-0.948 of copy, the cache's at 0.956-0.979.

    In place (``narrowed``, ``IN_PLACE_GATHER``) the heads are narrowed to rotary_dim (``head_dim``
    is rotary_dim here): each row is the rotary block alone, masked at rotary_dim, which the
    kernel is told is a multiple of 4 or 8 (``CHANNEL_MULTIPLE``), so that loads and stores move
    8 or 16 bytes, not 2. Recorded against 43b2d79 (figures/qk_in_place_unaligned_h200.json,
    H200, 5 shuffled rounds, the bytes moved: the rotated channels): 16-bit 0.129-0.326 ->
    0.313-0.444 of copy (Pythia 2.8B's 20 of 80 through the cache 0.129 -> 0.351, GPT-NeoX 20B's
    24 of 96 0.160 -> 0.413), float32 0.366-0.385 -> 0.410-0.647; 0.887-1.124 of a kernel that
    only reads and writes the same runs (runs of 40-96 B in every 160-384 B)."""
    return (GATHERED_PARTNERS and rotary_dim is not None
            and (rotary_dim < head_dim or (narrowed and IN_PLACE_GATHER))
            and rotary_dim % 16 != 0 and not interleaved and not words
            and angles in (ANGLES["cache"], ANGLES["cos_sin"]))


def _gathered_tile(seq_len: int, q_heads: int, k_heads: int, head_dim: int, element_size: int,
                   on_gpu: bool, transposed: bool, narrowed: bool = False) -> dict:
    """The tile of a ``_gathered_partners`` call. In 16-bit out of place, on 1 warp
    (``GATHERED_ONE_WARP_TILES``): results transposed against the inputs (Hugging Face's views),
    with 8 q heads or more, 2 tokens x 4 heads at rows of up to 256 B and 4 x 4 up to 320 B (with 4
    k heads or more); else, with 16 q heads or more, 16 rows of up to 192 B (1 token x 16 q heads:
    Pythia's 80 channels, GPT-NeoX 20B's 96), 8 of up to 320 B. Else on 2 warps: transposed results
    4 tokens x 4 heads (``TRANSPOSED_TILE``); in 16-bit at rows of 160-320 B (not 256) where k's
    heads are fewer than q's block would take (``FEW_K_HEAD_GATHERED_BLOCKS``), 8 tokens x 4 q heads
    with k's blocks of its own heads; else 32 rows of up to 192 B (4 tokens x 8 heads), 16 of more
    (2 x 8), q's blocks cut to k's head count. Transposed results in 16-bit with 1 or 2 k heads
    and an even number of q heads, 4 or more, at rows of 160-320 B (not 256), take
    ``FEW_K_TRANSPOSED_TILES``' tile by row size, k's blocks of its own heads and q's block halved
    (tokens doubled) until it divides q's heads. In the probe of ``_gathered_partners`` (11 tiles of
    1-8 tokens x 4-16 heads on 2 or 4 warps, H200, 3 shuffled rounds) these were the best or within
    3.0 points of the best at every call (Hugging Face's call at 40 of 160: 0.914, against 0.944 on
    4 x 8 on 4 warps); the next sizes lost up to 9 points (the cache at 20 of 80: 0.960 on 4 x 8,
    0.895 on 2 x 8; at 24 of 128: 0.963 on 2 x 8, 0.913 on 4 x 8). The interpreter: tiles of 16K
    elements.

    In place (``narrowed``: ``head_dim`` is rotary_dim, rows of the rotated channels only, each
    a few dozen bytes with the rest of the head between them): 4 tokens x 4 heads on 2 warps,
    k's blocks of 4 heads too where k has fewer. In a probe of 16 tiles (H200, 3 shuffled rounds,
    bf16, fp16 and float32, the cache's and Hugging Face's in-place calls at 20 of 80, 24 of 96,
    24 of 128 and 40 of 160 channels) it was the best on average, 1.4 points of copy from the
    best at each call on average and 4.5 at most (float32 Hugging Face's call at 20 of 80, 0.410
    against 0.456 on 2 x 4); the 32-row tile above lost up to 6.3 points, and with 2 k heads
    its 16 x 2 (k's head count sizing every block) 5.9."""
    if not on_gpu:
        return dict(_interpreter_whole_rows(seq_len, q_heads, k_heads, _next_pow2(head_dim)),
                    gather=True)
    if narrowed:
        return dict(block_s=min(_next_pow2(max(1, seq_len)), 4),
                    block_h=min(4, _next_pow2(max(q_heads, k_heads))), num_warps=2,
                    all_heads=False, whole_rows=True, gather=True)
    row_bytes = head_dim * element_size
    one_warp = _gathered_one_warp(row_bytes, element_size, q_heads, k_heads, transposed)
    if (FEW_K_HEAD_GATHERED_BLOCKS and one_warp is None and not transposed
            and _few_k_rows(row_bytes, element_size, q_heads)
            and _next_pow2(k_heads) < min(8, _next_pow2(q_heads))):
        return _own_k_blocks(seq_len, 8, 4, 2, k_heads)
    few_k = _few_k_transposed_tile(row_bytes, element_size, q_heads, k_heads, transposed)
    if few_k is not None:
        return _own_k_blocks(seq_len, *few_k, k_heads)
    if one_warp is not None and not transposed:
        # q's heads first, k's blocks the same size (the probe's tiles)
        rows, block_h = one_warp, min(one_warp, _next_pow2(max(1, q_heads)))
    else:
        if transposed:
            tokens, block_h = one_warp or TRANSPOSED_TILE
            rows = tokens * block_h
        else:
            rows, block_h = (32 if row_bytes <= 192 else 16), 8
        block_h = min(block_h, _next_pow2(max(1, min(q_heads, k_heads))))
    return dict(block_s=min(_next_pow2(max(1, seq_len)), rows // block_h), block_h=block_h,
                num_warps=1 if one_warp is not None else 2, all_heads=False, whole_rows=True,
                gather=True)


def _vision_tile(q_heads: int, k_heads: int, head_dim: int, element_size: int,
                 rotary_dim: Optional[int], interleaved: bool, words: bool,
                 transposed: bool) -> Optional[dict]:
    """The tile of a vision encoder's call (``rope_kernels.hf.apply_rotary_pos_emb_vision``:
    ``[1, tokens, heads, d]``, float32 cos and sin) where the rules fit it badly, in 16-bit with
    the whole head rotated (in place, heads narrowed to their rotated channels count as whole:
    MiniMax M3 VL's 78 of 80) and as many k heads as q heads, up to 16; None elsewhere
    (``VISION_TILES``). Heads of 80 channels, whose rows the tiles pad to 128 (Qwen2.5-VL's 16 x
    80), or interleaved pairs read as words (Inkling 2's 16 x 64): loads first, one token's heads
    on 2 warps. Heads of a width that is not a multiple of 16 (Qwen3-VL's 16 x 72, MLCD's 16 x
    104): whole rows, one token's heads on 2 warps; but interleaved pairs read as words (Llama
    4's 16 x 88, angles of one entry per pair): one token's heads on 2 warps, pairs as words.
    Chosen from two probes of 12-18 tiles (``scripts/hf_vision.py --tiles``: H200, 3 shuffled
    rounds, bf16, 32768 tokens, not recorded), forward, of copy, the rules' tile -> this one: 16
    x 80 0.780 -> 0.909, 16 x 72 0.628 -> 0.742 (0.477 before ``STRIDE_MULTIPLES``), 16 x 104
    0.708 -> 0.895, 16 x 64 pairs 0.890 -> 0.911; the best of the probe's tiles within 0.8
    points of these; 16 x 96 and 12 x 128, where the rules' tile was the best or within 0.6
    points, keep it. Llama 4's, from a probe of 13 tiles (``scripts/hf_complex.py --tiles``,
    the same card and rounds, 16 and 64 images of 577 patches, not recorded): 0.756 -> 0.781
    and 0.857 -> 0.933, the best of the probe's tiles."""
    if (element_size != 2 or transposed or rotary_dim not in (None, head_dim)
            or q_heads != k_heads or q_heads > 16):
        return None
    width = _next_pow2(head_dim)
    block_h = _next_pow2(q_heads)
    if words and width == 64:
        return _loads_first(q_heads, k_heads, num_warps=2)
    if words and head_dim % 16 != 0:
        return dict(block_s=1, block_h=block_h, num_warps=2, all_heads=False)
    if interleaved:
        return None
    if head_dim % 16 != 0:
        return dict(block_s=1, block_h=block_h, num_warps=2, all_heads=False, whole_rows=True)
    if head_dim == 80:
        return _loads_first(q_heads, k_heads, num_warps=2)
    return None


def _one_tensor_tile(q_heads: int, row: int) -> dict:
    """``ONE_TENSOR_TILES``' tile: one token, ``q_heads`` up to the larger of 4 heads and 2 KB of
    them, a warp a KB of the tile (2 at least)."""
    block_h = min(_next_pow2(q_heads), max(4, 2048 // row))
    return dict(block_s=1, block_h=block_h, num_warps=max(2, block_h * row // 1024),
                all_heads=False)


def _few_k_rows(row_bytes: int, element_size: int, q_heads: int) -> bool:
    """Where the few-k-head rules (``FEW_K_HEAD_GATHERED_BLOCKS``, ``FEW_K_TRANSPOSED_TILES``)
    were measured: 16-bit rows of 160-320 B that are not a power of two, 4 q heads or more."""
    return (element_size == 2 and 160 <= row_bytes <= 320 and bool(row_bytes & (row_bytes - 1))
            and q_heads >= 4)


def _own_k_blocks(seq_len: int, tokens: int, block_h: int, num_warps: int, k_heads: int) -> dict:
    """A gathered tile of ``tokens`` x ``block_h`` q heads whose k blocks are k's own head count
    (``block_hk``, named where it differs from ``block_h``)."""
    cfg = dict(block_s=min(_next_pow2(max(1, seq_len)), tokens), block_h=block_h,
               num_warps=num_warps, all_heads=False, whole_rows=True, gather=True)
    if _next_pow2(k_heads) != block_h:
        cfg["block_hk"] = _next_pow2(k_heads)
    return cfg


def _few_k_transposed_tile(row_bytes: int, element_size: int, q_heads: int, k_heads: int,
                           transposed: bool):
    """``FEW_K_TRANSPOSED_TILES``' (tokens, q heads, warps) for a gathered call out of place with
    transposed results (Hugging Face's), q's block halved and its tokens doubled until it divides
    q's heads (no masked heads); None elsewhere, and for an odd number of q heads (blocks of one
    head, not measured)."""
    if not transposed or q_heads % 2 or not _few_k_rows(row_bytes, element_size, q_heads):
        return None
    for largest, k_count, (tokens, block_h, warps) in FEW_K_TRANSPOSED_TILES:
        if k_heads == k_count and row_bytes <= largest:
            while q_heads % block_h:
                tokens, block_h = tokens * 2, block_h // 2
            return tokens, block_h, warps
    return None


def _gathered_one_warp(row_bytes: int, element_size: int, q_heads: int, k_heads: int,
                       transposed: bool):
    """``GATHERED_ONE_WARP_TILES``' entry for a gathered call out of place on a GPU (rows a
    program, or (tokens, heads) where the results are transposed), or None: 2 warps."""
    kind = "transposed" if transposed else "cache"
    if element_size != 2 or q_heads < GATHERED_ONE_WARP_MIN_Q_HEADS[kind]:
        return None
    for largest, tile, fewest_k_heads in GATHERED_ONE_WARP_TILES[kind]:
        if row_bytes <= largest:
            return tile if k_heads >= fewest_k_heads else None
    return None


def _parts_outer(all_heads: bool, token_blocks_fastest: bool, has_v: bool, q_heads: int,
                 k_heads: int, block_h: int, block_hk: int) -> bool:
    """Whether a plan orders its programs by part (``PARTS_OUTER``): programs of one head block
    (``block_h`` heads of q, ``block_hk`` of k), in memory order of the tokens, over q and k (no
    v) whose heads fill their blocks."""
    return (PARTS_OUTER and not all_heads and not token_blocks_fastest and not has_v
            and q_heads % block_h == 0 and k_heads % block_hk == 0)


def _head_count_tile(q_heads: int, k_heads: int, head_dim: int, angles: int) -> Optional[dict]:
    """The tile of a 16-bit half-split call of the cos/sin cache (``angles`` 1) or Hugging
    Face's tables (2) with the whole head rotated, at head_dim 64, 96 or 128, where the rules of
    ``default_config`` below fit its head counts badly; None elsewhere. Models
    bring head counts that are not powers of two (NanoChat's 10, Qwen2.5's 14 / 2, 28 / 4 and 40
    / 8, Llama 2 13B's 40, Phi-3 medium's 40 / 10), and those rules were measured at powers of
    two: their head blocks of 8 or 16 (2 or 4 KB) leave part of a block masked at 10, 12, 20 or
    40 heads, and their loads-first programs run on 4 warps where 2 move more.

    Chosen from a probe of 7 tiles a call (H200, 3 shuffled rounds, not recorded), then against
    the rules before (``scripts/qk_head_counts.py``, figures/qk_head_counts_h200.json: H200, 5
    shuffled rounds, bf16, 16 x 4096 tokens, fraction of copy before -> after, the same bits):

    - 128 B rows, q not a power of two in at most 4 KB, k under 2 KB: loads first on 2 warps,
      both tables (14q/2k Hugging Face's 0.633 -> 0.850, the cache's 0.839 -> 0.855; 28q/4k
      0.891 -> 0.954).
    - 128 B rows, q over 4 KB: the cache with k under 2 KB, 2 tokens x 8 heads on 2 warps (40q/8k
      0.891 -> 0.970, 64q/8k 0.940 -> 0.982); Hugging Face's tables the same where the generic
      tile would mask part of its head block (40q/40k 0.946 -> 0.992).
    - 256 B rows, Hugging Face's tables, k of 2 KB or more: loads first where q fits 4 KB, on 2
      warps while k is under 4 KB and q is not a power of two or fills 4 KB (16q/8k 0.910 ->
      0.962; 10q/10k backward 0.937 -> 0.954, forward 0.955 -> 0.947; 8q/8k stays on 4, where 2
      lost 0.9 points); loads first on 2 warps where q is 4-8 KB and does not fill 4 KB blocks
      (20q/20k 0.912 -> 0.966); else 4 KB blocks, partly masked or not (40q/10k 0.943 -> 0.975).
    - 256 B rows, the cache: k of 2 KB or more in head counts that are not multiples of 8 and q
      under 8 KB, loads first on 4 warps (10q/10k 0.869 -> 0.928, 20q/20k 0.937 -> 0.967; all
      heads in 2 KB blocks lost at 40q/10k and at batch 2); where the generic tile would mask
      part of its block, 2 KB blocks (40q/40k 0.946 -> 0.991); q over 4 KB with k under 2 KB, 2
      tokens x 4 heads on 2 warps (28q/4k 0.913 -> 0.972).

    Then (a probe of 12 tiles, H200, 3 shuffled rounds, not recorded; against the tiles of
    06fe1c9, ``scripts/qk_head_counts.py --before``, figures/qk_head_counts_more_h200.json: 32
    calls 0.986-1.246 times the speed, median 1.061):

    - 128 B rows, q not a power of two in at most 2 KB (SmolLM2's 9 q / 3 k and 15 / 5,
      Qwen2.5 0.5B's 14 / 2), k no more than half of q: loads first on 2 warps, 2 tokens a
      program, twice the bytes in flight of one token's (15q/5k 0.829 -> 0.928 Hugging Face's,
      0.897 -> 0.924 the cache; 14q/2k 0.853 -> 0.908, 0.857 -> 0.903; at 12q/12k and 24q/8k the
      cache lost 1.4-3.1 points with it); on 1 warp where q and k of a token are at most 1.5 KB
      (9q/3k: 2 warps 0.781 / 0.818, 1 warp 0.871 / 0.834 in a second probe, recorded 0.713 ->
      0.859 / 0.750 -> 0.828 against one token on 2; 15q/5k and 14q/2k lost 0.5-1.7 points on 1).
    - head_dim 96 (Phi-3 mini's and Phi-3.5 mini's 32 / 32), whose rows the tiles pad to 128
      channels, up to 32 heads and k no more than q: loads first, one token a program, on 2
      warps for Hugging Face's tables and 4 for the cache (32q/32k 0.933 -> 0.973 Hugging
      Face's, its backward 0.992 -> 0.979; the cache 0.899 -> 0.981, in place 0.891 -> 0.957).
      The rules below give these rows one token's 8 heads (1.5 KB) a program for the cache, 16
      heads for Hugging Face's. Other padded sizes (80, 112) were not measured."""
    row = _next_pow2(head_dim) * 2  # bytes of a row as the tiles hold it (16-bit)
    cache, hf = angles == ANGLES["cache"], angles == ANGLES["cos_sin"]
    if head_dim == 96:  # the one padded size measured (default_config passes 64, 96 and 128)
        if (cache or hf) and k_heads <= q_heads <= 32:
            return _loads_first(q_heads, k_heads, num_warps=4 if cache else 2)
        return None
    q_bytes, k_bytes, both = q_heads * row, k_heads * row, (q_heads + k_heads) * row
    power_of_two = q_heads & (q_heads - 1) == 0
    # The head block of the generic tile at the end of default_config (TILE_BYTES of heads).
    generic = _head_block(q_heads, k_heads, max(1, TILE_BYTES // row))
    generic_masks = q_heads % generic != 0 or k_heads % generic != 0
    if row == 128:
        if q_bytes <= 4096 and k_bytes < 2048 and k_heads <= q_heads and not power_of_two:
            two = q_bytes <= 2048 and 2 * k_heads <= q_heads  # small q, grouped k
            # 2 tokens of at most 1.5 KB each: one warp (SmolLM2 135M's 9 q / 3 k)
            warps = 1 if two and both <= 1536 else 2
            return _loads_first(q_heads, k_heads, num_warps=warps, block_s=2 if two else 1)
        if q_bytes > 4096 and ((cache and k_bytes < 2048 and both <= 16384)
                               or (hf and generic_masks)):
            return dict(block_s=2, block_h=8, num_warps=2, all_heads=False)
    elif row == 256 and hf and k_bytes >= 2048 and k_heads <= q_heads:
        if q_bytes <= 4096:
            two = k_bytes < 4096 and (q_bytes == 4096 or not power_of_two)
            return _loads_first(q_heads, k_heads, num_warps=2 if two else 4)
        if q_bytes < 8192 and q_heads % 16 != 0:
            return _loads_first(q_heads, k_heads, num_warps=2)
        return dict(block_s=1, block_h=16, num_warps=2, all_heads=False)
    elif row == 256 and cache:
        if (k_bytes >= 2048 and (q_heads % 8 != 0 or k_heads % 8 != 0) and q_bytes < 8192
                and k_heads <= q_heads):
            return _loads_first(q_heads, k_heads, num_warps=4)
        if k_bytes >= 2048 and both > 16384 and generic_masks:
            return dict(block_s=1, block_h=8, num_warps=2, all_heads=False)
        if q_bytes > 4096 and k_bytes < 2048 and both <= 16384:
            return dict(block_s=2, block_h=4, num_warps=2, all_heads=False)
    return None


def _interpreter_whole_rows(seq_len: int, q_heads: int, k_heads: int, width: int) -> dict:
    """Whole rows of ``width`` channels in the interpreter, which pays per program: tiles of up
    to 16K elements, heads first (``_whole_rows``, ``_gathered_tile``)."""
    rows = max(1, 16384 // width)
    block_h = _head_block(q_heads, k_heads, rows)
    block_s = min(_next_pow2(max(1, seq_len)), _floor_pow2(max(1, rows // block_h)))
    return dict(block_s=block_s, block_h=block_h, num_warps=4, all_heads=False, whole_rows=True)


def _whole_rows(seq_len: int, q_heads: int, k_heads: int, width: int, row: int, on_gpu: bool,
                angles: int) -> dict:
    """Tiles of whole rows (``ROW``: each row loaded once, its channels' partners again from
    L1, one store): 8 heads x as many tokens as fill 4 KB of input on 4 warps (8 KB for the
    cos/sin cache), one head block per program. See ``default_config``."""
    if not on_gpu:
        return _interpreter_whole_rows(seq_len, q_heads, k_heads, width)
    tile = 8192 if angles == ANGLES["cache"] else 4096
    block_h = min(8, _next_pow2(max(1, q_heads)))
    block_s = min(_next_pow2(max(1, seq_len)), max(1, tile // (row * block_h)))
    return dict(block_s=block_s, block_h=block_h, num_warps=4, all_heads=False, whole_rows=True)


def default_config(seq_len: int, q_heads: int, k_heads: int, head_dim: int, element_size: int,
                   on_gpu: bool, interleaved: bool = False, angles: int = 0,
                   rotary_dim: Optional[int] = None, in_place: bool = False,
                   transposed: bool = False, words: bool = False, narrowed: bool = False,
                   vision: bool = False) -> dict:
    """Tile of ``block_s`` tokens x ``block_h`` heads (powers of two), ``num_warps``, and
    ``all_heads``: whether a program loops over every head block of its tokens.

    ``transposed``: the outputs hold tokens and heads in the other memory order than the inputs
    (Hugging Face's partial rotary: GPT-NeoX's function returns contiguous ``[b, h, s, d]``
    results for ``[b, h, s, d]`` views of ``[b, s, h, d]`` projections). There, on a GPU, with
    half-split rows of 64 or 128 channels and at least 4 heads in q and in k, whole rows in tiles
    of 4 tokens x 4 heads on 2 warps (``TRANSPOSED_TILE``): a program reads runs of 4 heads of
    each token and writes runs of 4 tokens of each head, each row in one piece (the pairs' tiles
    move a row in three: the pairs' two halves and the channels past ``rotary_dim``).

    - Chosen among 11 tiles (H200, 5 shuffled rounds, 2026-11-26, bf16 32q/8k half rotary and 8
      variations): whole rows in 8 x 4 tiles on 4 warps came within a point of these but at
      batch 1 forward (+1.6 points) and head_dim 64 backward (-2.0); the pairs in 8 x 4 on 4
      warps were -0.8% to +7.5% against the tiles below; whole rows in 4 x 8 on 4 warps, 8 x 8
      on 8, 8 x 4 on 2 or 16 x 4 on 4 warps 6-23% behind them at head_dim 128 in 16-bit.
    - Then this rule against the one before (``scripts/qk_transposed_tiles.py``,
      figures/qk_transposed_tiles_h200.json: H200, 7 shuffled rounds, forward / backward, bf16
      32q/8k, batch 16 x 4096 tokens, half rotary unless said): 0.926 -> 0.934 / 0.915 -> 0.948
      of copy; fp16 +2.5% / +3.5%, a quarter rotated +6.2% / +8.7%, 16q/4k +1.9% / +2.4%, 64q/8k
      +0.6% / +4.0%, head_dim 64 +5.1% / +8.7% (fp32 +6.3% / +6.4%), fp32 head_dim 128 +0.2% /
      +0.6%, 1024 tokens -1.0% / +2.5%, batch 1 and 2 +0.2-0.7% / +3.4-3.5%; the controls (2 k
      heads, the whole head rotated) level. In a probe before it (not recorded) the rule lost
      6.9% / 1.1% with 2 k heads (16 rows of 2 heads x 8 tokens) and 6-7% with 1: fewer heads
      keep the tiles below, as does head_dim 256 (whole rows 12-20% behind).

    With ``WHOLE_ROWS`` on (off by default) whole rows come first (``_whole_rows``,
    ``whole_rows`` in the config): 16-bit half-split pairs whose rows are 256 B or more, every
    table, in place or not. They depend on the card. On an H200 (figures/qk_whole_rows_h200.json,
    3 shuffled rounds) they were 0.893-1.021 of the pairs' speed, 4-11% behind at head_dim 256,
    fp16 16q/4k and through Hugging Face's call, ahead only with half the head rotated through
    Hugging Face's call (+1.8%) and at batch 1 backward. Against the pairs' tiles below on an H100
    (scripts/qk_whole_rows.py, figures/qk_whole_rows.json: 5 shuffled rounds, both tile
    sets in one process) they were 0.1-3.0% faster at every such shape of the benchmark's q+k
    problems, forward and backward, but three: the cache in place at batch 1 (-1.1%, an 84 MB
    problem whose single medians fall on one of two levels, see docs/performance_notes.md),
    and in place at head_dim 256 and Hugging Face's tables at batch 4 (level). Most with half
    the head rotated through Hugging Face's call, whose rows were cut in three pieces and whose
    results are contiguous, so transposed: 0.952 -> 0.971 of copy forward, 0.943 -> 0.971
    backward; fused QKV 0.5-1.4%. At head_dim 64 in 16-bit (128 B rows) they were 0.5-0.8%
    behind in a probe, so those rows, fp32 and interleaved pairs keep the rules below. All of
    those rules were measured on an H200 before whole rows existed.

    One head block per program: about TILE_BYTES of input, spent first on heads (a run of heads
    is contiguous in every layout the entry points produce), at most the smaller of the q and k
    head counts so that k's tiles are not mostly masked (grouped-query attention: 8 k heads for
    32 q heads), then on up to 8 tokens. Interleaved pairs that cannot be read as words (see the
    first rule, ``words``) split a [..., HALF, 2] tile, which costs registers: 2 KB tiles. The
    interpreter pays per program: tiles of up to 16K elements.

    The cos/sin cache with up to 16 KB of q and k per token: one program per token, all of its
    heads (its cache row read once, not once per head block), k's blocks sized to k. From
    scripts/qk_tile_sweep.py on an H200 (bf16, 16q/4k and 32q/8k heads at head_dim 64 and 128,
    32q/32k: as fast or up to 4% faster than one head block per program; at 64q/8k and in
    float32 one head block per program stays ahead). Except where rows are 256 B or more and k
    fills a 2 KB block (bf16 head_dim 128 with 8 k heads or more, fp32 head_dim 64): there one
    token's 2 KB head block per program, on 2 warps, was 0.3-2.3 points of copy ahead of the
    all-heads program forward, in place and backward at 32q/8k, 32q/32k, batch 1-4 and 1024
    tokens, 0.5-0.8 in fp32, level or ahead at 16q/8k and 8q/8k (4 shuffled rounds on an
    H200); at 16q/4k bf16, where k fills half a block, the all-heads program stays (level).

    Hugging Face's cos and sin (``angles`` 2) under the same condition, with the whole head
    rotated (``rotary_dim`` None or head_dim): one 2 KB head block per program on 2 warps, against
    4 tokens x 8 heads on 4 warps: +0.5 to +1.9 points of copy forward and backward at bf16
    32q/8k, 32q/32k, 64q/8k, 16q/8k, batch 4, 1024 tokens and fp32 head_dim 128 (3 shuffled rounds
    on an H200, 2026-11-24); fp32 head_dim 64 moved -1.7 forward and +1.9 backward;
    with half the head rotated it lost 3 points, so partial rotary keeps the tiles below.
    Refined there (H200, 5 shuffled rounds, 2026-11-24, forward / backward against the 2 KB
    blocks): where q's heads fill 4 KB blocks, one 4 KB block per program on 2 warps: 32q/8k
    0.952 / 0.940 -> 0.956 / 0.951, 32q/32k 0.952 / 0.931 -> 0.962 / 0.965, 64q/8k 0.946 / 0.952
    -> 0.974 / 0.971, 2048 tokens and batch 8 +0.4 to +0.7, batch 1-2 and fp32 level (-0.7 to
    +0.3); where they would leave half a block empty it lost (8q/8k -13, 24q/8k -3.4 / -0.3
    points), so other head counts keep 2 KB. Where all of q fits 4 KB (and k is no bigger),
    loads first on 4 warps: 8q/8k 0.915 / 0.919 -> 0.924 / 0.925, 16q/8k 0.925 / 0.924 -> 0.936
    / 0.934, 16q/16k 0.939 / 0.938 -> 0.947 / 0.945 (4 KB blocks 0.944 / 0.945), fp32 8q/8k
    level. (Its
    outputs are laid out like its inputs, as transformers' are: with the same tiles, writing the
    transposed views' memory order instead of new contiguous [b, h, s, d] tensors gained 0.9 to
    3.6 points at every bf16 and fp32 shape above except head_dim 64, -0.5.)

    The cos/sin cache in place (``in_place``: the outputs are the inputs, as vLLM calls it) at
    head_dim 128: one block of 8 heads of one token per program on 2 warps (2 KB in 16-bit, 4 KB
    in fp32). Against the rules above, in place (H200, 3 shuffled rounds, forward / backward):
    bf16 16q/4k 0.924/0.920 -> 0.934/0.926, batch 2 0.838/0.840 -> 0.834/0.849, batch 1 level,
    fp32 32q/32k 0.947/0.948 -> 0.976/0.976, fp32 batch 1 +0.3/+0.3 points; bf16 32q/8k already
    ran it.

    ``narrowed``: an in-place call with part of the head rotated, planned on heads narrowed to
    ``rotary_dim`` (``head_dim`` here is ``rotary_dim``; the rows are runs of the rotated
    channels, the rest of each head skipped). In float32 with half-split pairs and 8 q and k
    heads or more, on a GPU: whole rows, 1 token x 8 heads on 2 warps for 256 B rows (64
    channels), 2 x 8 for 128 B rows (32). Against the tiles the other rules give these heads
    (Hugging Face's 1 x 16, the cache's 1 x 8, the all-heads programs at 128 B rows), fraction
    of copy counting the bytes moved (scripts/qk_in_place_narrow_tiles.py,
    figures/qk_in_place_narrow_tiles_h200.json: H200, 5 shuffled rounds, 16 x 4096 tokens, 32 q /
    8 k heads of 128 unless said, Hugging Face's call / the cache's): half rotated 0.933 / 0.942
    -> 0.953 / 0.955 forward, 0.935 / 0.941 -> 0.953 / 0.954 backward, 32 k heads 0.933 / 0.946
    -> 0.958 / 0.958, a quarter rotated 0.805 / 0.818 -> 0.830 / 0.830, heads of 64 0.838 / 0.854
    -> 0.875 / 0.879; 0.972-0.996 of a kernel that only reads and writes the same runs in place.
    On an H100 (..._h100.json) +0.0% to +2.1%. In 16-bit the rules below stay: in a probe of the
    same tiles (H200, 3 rounds) the cache's 128 B rows lost 11 points of copy with whole rows,
    Hugging Face's gained 1, and at heads of 256 the two calls' best tiles differed.

    ``loads_first``: one program per token with all of q in one block and all of k in another,
    issuing both tiles' loads before any store (as Liger's kernel does). Taken where a token's q
    fits 4 KB, k does not fill 2 KB and the whole head is rotated, for the cos/sin cache with
    rows of 256 B or more (2 warps) and Hugging Face's tables (2 warps; 4 for 128 B rows).
    Against the rules above (H200, 3 shuffled rounds, 2026-11-24, fraction of copy): cache
    16q/4k 0.905 -> 0.914 out of place and 0.929 -> 0.932 in place, 16q/2k 0.906 -> 0.915 and
    0.914 -> 0.937, 12q/2k 0.867 -> 0.906 and 0.841 -> 0.918; Hugging Face 16q/4k 0.898 ->
    0.920, 16q/2k 0.901 -> 0.917, 12q/2k 0.905 -> 0.923, head_dim 64 0.912 -> 0.947. Where q
    is bigger (32q/8k, 32q/32k, fp32) the rules above stay ahead by 1-3 points, and at bf16
    head_dim 64 the cache's all-heads program is 1 point ahead of it.

    ``HEAD_COUNT_TILES`` (after ``WHOLE_ROWS``, before the rules from the transposed tile on):
    16-bit half-split calls of the cache and Hugging Face's tables with the whole head rotated,
    at head_dim 64, 96 and 128, take ``_head_count_tile``'s tiles at head counts these rules fit
    badly: at 69 calls of figures/qk_head_counts_h200.json 0.991-1.407 times the speed of these
    rules (median 1.034), then at 32 calls of figures/qk_head_counts_more_h200.json (head_dim 96,
    small grouped q of 64) 0.986-1.246 times that of the tiles before (median 1.061). The
    benchmark's head counts keep these rules.

    Models' shapes (a probe of 24, H200; against the tiles of 683f4f5,
    figures/qk_model_shapes_h200.json: 31 calls 0.997-2.288 times the speed, median 1.405; 16-bit):

    - ``FEW_K_HEAD_TILES``: few k heads with q over 4 KB (multi-query attention), the whole head
      rotated, but the cache in place: the last rule's head block, sized to k, would be 512 B or
      less; 4 tokens x 1 KB of heads on 2 warps (Falcon 7B's 71 q / 1 k through Hugging Face's call
      0.495 -> 0.977, 48q/2k 0.715 -> 0.979, 32q/1k of 128 0.829 -> 0.970; the cache +0.5 to
      +2.2 points).
    - ``_gathered_partners`` calls (rotary_dim not a multiple of 16, 16-bit or float32): whole
      rows cut at the rotary block, the partners gathered in registers, on ``_gathered_tile``'s
      tiles (since c8faee4; before, the pairs with the channels past rotary_dim as whole rows,
      on one token's 2 KB of heads on 2 warps; figures/qk_gathered_partners_h200.json). In
      place, on the narrowed heads, since 8c81001 (figures/qk_in_place_unaligned_h200.json;
      before, the narrowed heads' rules, every element alone).
    - ``PADDED_TRANSPOSED_PAIRS``: Hugging Face's partial rotary with transposed results in rows
      padded to a power of two: the pairs' 4 x 4 tile on 4 warps, not whole rows (Phi-2's 32 of
      80 channels 0.852 -> 0.957 forward, 0.858 -> 0.951 backward).
    - ``PARTIAL_128B_CACHE_TILES``: the cache out of place, 128 B rows, under half rotated: one
      token's 16 heads on 2 warps, not the all-heads program (StableLM 2 1.6B's 16 of 64, 32 / 32
      heads, 0.888 -> 0.978).

    ``ONE_TENSOR_TILES``: one tensor a call (``k_heads`` 0: Gemma 4's and GPT-J's functions),
    16-bit, the whole of each row rotated, in place or not: ``_one_tensor_tile``, one token's
    heads a program (Gemma 4's q of 8 heads of 512: 0.894 -> 0.929 of copy forward).

    GPT-OSS's tables (``ANGLES`` 3 with half-split pairs) and NanoChat's (4) are planned as
    Llama's (2): see ``_tile_angles``."""
    width = _next_pow2(head_dim)
    row = width * element_size
    if VISION_TILES and vision and on_gpu:
        tile = _vision_tile(q_heads, k_heads, head_dim, element_size, rotary_dim, interleaved,
                            words, transposed)
        if tile is not None:
            return tile
    if _gathered_partners(head_dim, rotary_dim, interleaved, words, angles, narrowed):
        return _gathered_tile(seq_len, q_heads, k_heads, head_dim, element_size, on_gpu,
                              transposed, narrowed)
    if (ONE_TENSOR_TILES and on_gpu and k_heads == 0 and element_size == 2 and not transposed
            and rotary_dim in (None, head_dim)):
        return _one_tensor_tile(q_heads, row)
    if (NARROWED_ROWS and on_gpu and narrowed and not interleaved and element_size == 4
            and min(q_heads, k_heads) >= 8 and width in (32, 64)):
        return dict(block_s=1 if width == 64 else 2, block_h=8, num_warps=2, all_heads=False,
                    whole_rows=True)
    if words:
        # Interleaved pairs read as one word each load like half-split ones. At head_dim 65-128
        # on a GPU: one token's 8 heads a program, a warp per KB of them (2 warps in 16-bit, 4
        # in float32); Hugging Face's tables at head_dim 64 in 16-bit: below; elsewhere the
        # half-split pairs' rules. scripts/qk_pairs_as_words.py,
        # figures/qk_pairs_as_words_h200.json (H200, 3 shuffled rounds, bf16 32q/8k heads of
        # 128, 16 x 4096 tokens unless said), forward, of copy, split tile -> words: the cache
        # 0.710 -> 0.976, Cohere's call 0.731 -> 0.982, GLM's 0.802 -> 0.976, fused QKV 0.719
        # -> 0.981; head_dim 64 0.329 -> 0.957. Backward alike. At 22 shapes and dtypes,
        # forward and backward: 1.09-2.94 times the split tile, within 1.6 points of the best of
        # 7 tiles and the half-split rules, 0.93-0.99 of copy from 671 MB (0.917 at 1024 tokens,
        # 336 MB; 0.750 at batch 1, 84 MB).
        if on_gpu and width == 128:
            return dict(block_s=1, block_h=min(8, _next_pow2(q_heads)),
                        num_warps=max(1, 8 * row // 1024), all_heads=False)
        # Hugging Face's tables (Cohere's and GLM's calls) at head_dim 64 in 16-bit. Probes of
        # 10-23 tiles (H200, 3-5 shuffled rounds, bf16, 16 x 4096 tokens, forward / backward, of
        # copy) against the half-split rules these calls took before (4-8 tokens x 2-16 heads on
        # 4 warps, but loads first on 4 for Cohere's where all of q fits 4 KB; with part of the
        # head rotated the transposed tile, or 8 x 2 with 1-3 k heads):
        # - the whole head rotated, q filling 4 KB a token (32 heads): loads first, on 2 warps
        #   under 2 KB of k (GLM's 0.916 / 0.921 -> 0.958 / 0.952, Cohere's 0.932 / 0.933 ->
        #   0.955 / 0.960 at 32q/8k), on 4 from 2 KB (GLM's 0.928 / 0.927 -> 0.965 / 0.965 at
        #   32q/16k, 0.956 / 0.954 -> 0.973 / 0.971 at 32q/32k; Cohere's took it already);
        # - other head counts with 4 k heads or more: 2 tokens x 8 heads on 2 warps. Cohere's
        #   0.747 / 0.740 -> 0.922 / 0.925 at 16q/4k, 0.870 / 0.868 -> 0.951 / 0.955 at 24q/8k,
        #   0.918 / 0.918 -> 0.952 / 0.952 at 16q/16k, 0.966 / 0.963 -> 0.976 / 0.978 at 64q/8k;
        #   GLM's +1.0 to +4.1 points at these;
        # - with 1-3 k heads, 4 tokens x 4 heads on 2 warps (an 8-head block would be mostly
        #   masked k): Cohere's 0.453 / 0.450 -> 0.826 / 0.827, GLM's 0.761 / 0.755 -> 0.853 /
        #   0.858 at 8q/2k;
        # - part of the head rotated, with the results transposed (Hugging Face's views): GLM's
        #   2 tokens x 8 heads on 2 warps with 4 k heads or more (0.905 / 0.906 -> 0.910 / 0.913
        #   at 32q/8k, 0.870 / 0.878 -> 0.912 / 0.914 at 16q/4k); with 1-3 k heads, both calls 4
        #   tokens x 4 heads on 1 warp (GLM's 0.766 / 0.761 -> 0.852 / 0.845, Cohere's 0.737 /
        #   0.737 -> 0.851 / 0.845 at 8q/2k); Cohere's keeps the transposed tile otherwise (the
        #   best: its 2 x 8 lost 6 points).
        # The best tiles were within 0.6 points of these (0.8 at 8q/2k; 1.7 for GLM's half
        # rotary at 32q/8k, where 4 x 8 on 4 warps led). The cache (is_neox=False) keeps its
        # all-heads program (0.955, the best), float32 its tile. Recorded against the rules
        # before: scripts/qk_words_hd64.py.
        if (WORDS_128B_HF_TILES and on_gpu and element_size == 2 and width == 64
                and angles in (ANGLES["cos_sin"], ANGLES["cos_sin_half"])):
            tile = None
            if rotary_dim in (None, head_dim):
                if q_heads * row == 4096:
                    return _loads_first(q_heads, k_heads,
                                        num_warps=2 if k_heads * row < 2048 else 4)
                tile = (2, 8, 2) if k_heads >= 4 else (4, 4, 2)
            elif transposed and k_heads < 4:
                tile = (4, 4, 1)
            elif transposed and angles == ANGLES["cos_sin_half"]:
                tile = (2, 8, 2)
            if tile is not None:
                block_s, block_h, num_warps = tile
                return dict(block_s=min(block_s, _next_pow2(max(1, seq_len))), block_h=block_h,
                            num_warps=num_warps, all_heads=False)
        interleaved = False
    if WHOLE_ROWS and not interleaved and element_size == 2 and row >= 256:
        return _whole_rows(seq_len, q_heads, k_heads, width, row, on_gpu, angles)
    if (FEW_K_HEAD_TILES and on_gpu and element_size == 2 and not interleaved and not words
            and not (in_place and angles == ANGLES["cache"]) and not transposed
            and rotary_dim in (None, head_dim)
            and angles in (ANGLES["cache"], ANGLES["cos_sin"]) and row in (128, 256)
            and q_heads * row > 4096
            and _head_block(q_heads, k_heads, max(1, TILE_BYTES // row)) * row <= 512):
        # Few k heads (multi-query attention, Falcon 7B's 71 q / 1 k): the generic tile's head
        # block, sized to k, would be 1-2 heads, 8 tokens of 128-512 B runs on 4 warps. 4 tokens
        # x 1 KB of heads on 2 warps instead (FEW_K_HEAD_TILES). Not the cache in place: there
        # its tiles below were as fast or faster (71 q / 1 k of 64: 2.2% ahead). Hugging Face's
        # in-place functions take it (not timed in place; the generic tile ran at 0.49 of copy
        # out of place).
        return dict(block_s=min(4, _next_pow2(max(1, seq_len))), block_h=1024 // row,
                    num_warps=2, all_heads=False)
    if (HEAD_COUNT_TILES and on_gpu and element_size == 2 and not interleaved and not words
            and not narrowed and not transposed and rotary_dim in (None, head_dim)
            and head_dim in (64, 96, 128)):
        tile = _head_count_tile(q_heads, k_heads, head_dim, angles)
        if tile is not None:
            tile["block_s"] = min(tile["block_s"], _next_pow2(max(1, seq_len)))
            return tile
    if (on_gpu and transposed and not interleaved and 64 <= width <= 128
            and min(q_heads, k_heads) >= TRANSPOSED_TILE[1]):
        tile = dict(block_s=min(_next_pow2(max(1, seq_len)), TRANSPOSED_TILE[0]),
                    block_h=TRANSPOSED_TILE[1], all_heads=False)
        if head_dim != width and PADDED_TRANSPOSED_PAIRS and element_size == 2:
            # 16-bit rows padded to a power of two (Phi-2's 80 channels in 128): the pairs'
            # tiles, on 4 warps (PADDED_TRANSPOSED_PAIRS).
            return dict(tile, num_warps=4)
        return dict(tile, num_warps=2, whole_rows=True)
    # One token's 2 KB head block per program, 2 warps: where rows are 256 B or more and k fills
    # a block (the cos/sin cache and Hugging Face's tables, as measured above).
    two_kb_blocks = row >= 256 and k_heads * row >= 2048
    # Loads first: where all of a token's q fits 4 KB and k does not fill 2 KB (see above).
    if (on_gpu and not interleaved and not two_kb_blocks and q_heads * row <= 4096
            and rotary_dim in (None, head_dim)
            and (angles == ANGLES["cos_sin"] or (angles == ANGLES["cache"] and row >= 256))):
        return _loads_first(q_heads, k_heads, num_warps=2 if row >= 256 else 4)
    if on_gpu and in_place and angles == ANGLES["cache"] and not interleaved and width == 128:
        return dict(block_s=1, block_h=min(8, _next_pow2(q_heads)), num_warps=2, all_heads=False)
    if (on_gpu and angles == ANGLES["cos_sin"] and not interleaved and two_kb_blocks
            and rotary_dim in (None, head_dim)):
        if q_heads * row <= 4096 and k_heads <= q_heads:
            return _loads_first(q_heads, k_heads, num_warps=4)
        # 4 KB head blocks where q's heads fill them (no masked half block of q), else 2 KB.
        block_h = 4096 // row if q_heads % (4096 // row) == 0 else 2048 // row
        return dict(block_s=1, block_h=block_h, num_warps=2, all_heads=False)
    if (on_gpu and angles == ANGLES["cache"] and not interleaved
            and (q_heads + k_heads) * row <= 16384):
        if two_kb_blocks:
            return dict(block_s=1, block_h=2048 // row, num_warps=2, all_heads=False)
        if (PARTIAL_128B_CACHE_TILES and rotary_dim is not None and 2 * rotary_dim < head_dim
                and row == 128 and element_size == 2):
            # Under half of 128 B rows rotated (StableLM 2's and Pythia's 16 of 64 channels): one
            # token's 2 KB of heads on 2 warps, not the all-heads program (measured at a quarter;
            # half, the benchmark's, keeps it; PARTIAL_128B_CACHE_TILES).
            return dict(block_s=1, block_h=min(16, _next_pow2(q_heads)), num_warps=2,
                        all_heads=False)
        if q_heads * row <= 4096:  # all of q in one block, all of k in another
            return dict(block_s=1, block_h=_next_pow2(q_heads), block_hk=_next_pow2(k_heads),
                        num_warps=2, all_heads=True)
        block = max(1, 2048 // row)
        return dict(block_s=1, block_h=block, block_hk=min(block, _next_pow2(k_heads)),
                    num_warps=4, all_heads=True)
    if not on_gpu:
        rows, max_tokens = max(1, 16384 // width), 1 << 20
    else:
        rows = max(1, (2048 if interleaved else TILE_BYTES) // row)
        max_tokens = 8
    block_h = _head_block(q_heads, k_heads, rows)
    block_s = min(_next_pow2(max(1, seq_len)), _floor_pow2(max(1, rows // block_h)), max_tokens)
    # Hugging Face's interleaved pairings (Cohere's and GLM's functions) in 16-bit: this tile on 2
    # warps. One probe on an H200 (bf16, 32q/8k heads of 128, 16 x 4096 tokens, one do_bench
    # median each, not recorded; docs/performance_notes.md): 1 token x 8 heads on 4 warps 0.747
    # (GLM's) and 0.646 (Cohere's) of copy, on 2 warps 0.798 and 0.727, the best of 24 tiles of
    # 1-8 tokens x 4-8 heads on 2-8 warps; the half-split call reaches 0.976 there (its pairs
    # are two contiguous halves; these tiles split [..., HALF, 2]).
    num_warps = (2 if on_gpu and interleaved and element_size == 2
                 and angles in (ANGLES["cos_sin"], ANGLES["cos_sin_half"]) else 4)
    # TransformerEngine's fused QKV (the one caller of TE's angle tables here), 16-bit half-split
    # rows of 256 B or more: whole rows on these tiles. Against the pairs
    # (figures/qk_transposed_tiles_h200.json: H200, 7 shuffled rounds, forward / backward): 8
    # groups x 4 q +0.4% / +0.4%, 64 x 4 at 2 x 2048 tokens +1.2% / -0.1%, 8 x 1 at batch 8 +0.8% /
    # +0.4%, half rotary +0.8% / +0.8%, fp16 +0.5% / +0.3%. (The cache and Hugging Face's tables
    # lost with whole rows on their tiles: docs/performance_notes.md.)
    whole_rows = (on_gpu and angles == ANGLES["freqs"] and not interleaved and element_size == 2
                  and row >= 256)
    return dict(block_s=block_s, block_h=block_h, num_warps=num_warps, all_heads=False,
                whole_rows=whole_rows)


def _loads_first(q_heads: int, k_heads: int, num_warps: int, block_s: int = 1) -> dict:
    """The loads-first config: ``block_s`` tokens per program, all of their q in one block, all
    of their k in another."""
    return dict(block_s=block_s, block_h=_next_pow2(q_heads), block_hk=_next_pow2(k_heads),
                num_warps=num_warps, all_heads=True, loads_first=True)


# Launch options of every plan. Fused multiply-adds stay on, as Triton 3.6 to 3.9 compile by
# default and as the kernels are tested and timed: 3.9 warns that its default turns them off in
# 3.10, which would change the results' last bits (not their accuracy).
LAUNCH_OPTIONS = {"enable_fp_fusion": True}


class Plan:
    """What a launch needs that follows from shapes, strides and flags, not from data.
    ``options``: launch options besides ``num_warps`` (``LAUNCH_OPTIONS``; the same fields as
    rope_2d's Plan). ``compiled`` is for a launcher that reuses the kernel Triton compiled (the
    package's)."""

    __slots__ = ("grid", "scalars", "constexprs", "num_warps", "options", "compiled")

    def __init__(self, grid, scalars, constexprs, num_warps, options=None):
        self.grid, self.scalars, self.constexprs, self.num_warps = grid, scalars, constexprs, num_warps
        self.options = {**LAUNCH_OPTIONS, **(options or {})}
        self.compiled = {}


_PLANS: dict = {}  # call signature -> Plan; cleared when it grows past _MAX_PLANS
_MAX_PLANS = 4096


def launch(kernel, plan: Plan, pointers: Sequence[torch.Tensor]):
    """Launch through Triton's own dispatch, on the device of ``pointers[0]``. (The rope_kernels
    package replaces this with a launcher that skips Triton's per-call argument analysis; a copy
    of this file needs none.)"""
    device = pointers[0].device
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        # Triton launches on the current device and its stream, not the tensors' device: make
        # it theirs (a model spread over several GPUs in one process, device_map="auto").
        with torch.cuda.device(device):
            return launch(kernel, plan, pointers)
    return kernel[plan.grid](*pointers, *plan.scalars, **plan.constexprs,
                             num_warps=plan.num_warps, **plan.options)


def _max_offset(sizes, strides) -> int:
    return sum((n - 1) * abs(st) for n, st in zip(sizes, strides) if n > 0)


def _plan(q, k, v, *, device, dtype, angles, rotary_dim, has_positions, has_start, interleaved,
          backward, cp_size, cp_rank, t_strides, p_strides, same_table, offsets=(0, 0, 0, 0),
          in_place=False, aligned=False, deinterleave=0, vision=False, sin_offset=0,
          config=None):
    """``q``, ``k``: (sizes [s, b, g, u, d], input strides, output strides); ``v`` the same with
    u = 1, or None. Sizes of q and k agree in s, b and d. ``same_table``: q and k read the same
    angle table (cos/sin cache, Hugging Face's cos and sin, one TE freqs tensor for both).
    ``offsets``: elements from the k input, k output, v input and v output pointers to the first
    element of each (a packed tensor passed whole). ``aligned``: the addresses of q's and k's
    inputs and outputs are even in elements (``_aligned``; part of the caller's key).
    ``in_place``: the outputs are the inputs. Then the channels past ``rotary_dim`` are left
    where they are, neither read nor written, as vLLM's and FlashInfer's in-place kernels leave
    them: the plan is that of heads narrowed to ``rotary_dim`` (same strides, so the same memory),
    all of it rotated. ``deinterleave`` (DeepSeek V3's function, interleaved pairs, the whole head
    rotated): 1 reads interleaved pairs and writes their results half-split, 2 the transpose (its
    backward); the kernel's ``INTERLEAVED`` 3 and 4, the interleaved side as words (the caller
    ensures that the tensors allow it: ``_aligned`` and ``_words_strides``). ``sin_offset``: the
    kernel's ``SIN_OFFSET`` (1: sin passed as cos's tensor, its entries one element on).
    ``config``: the tile (``default_config``'s dict) where the caller has a rule of its own."""
    narrowed = in_place and rotary_dim < q[0][4]
    if narrowed:
        q, k = [((*sizes[:4], rotary_dim), *strides) for sizes, *strides in (q, k)]
    (seq_len, batch, qg, qu, head_dim), q_in, q_out = q
    (_, _, kg, ku, _), k_in, k_out = k
    q_heads, k_heads = qg * qu, kg * ku
    on_gpu = device.type == "cuda"
    element_size = torch.empty((), dtype=dtype).element_size()
    # Interleaved pairs read and written as one word each: where every row of q and k, read and
    # written, starts at an even element and has its channels contiguous.
    words = (bool(interleaved) and aligned and head_dim % 2 == 0
             and offsets[0] % 2 == 0 and offsets[1] % 2 == 0
             and all(_words_strides(sizes, st) for sizes, *strides in (q, k) for st in strides))
    if deinterleave and not (words and rotary_dim == head_dim):
        raise ValueError(f"deinterleave needs pairs read as words and the whole head rotated, "
                         f"got words={words}, rotary_dim {rotary_dim} of {head_dim}")
    # Tokens and heads in the other memory order in the outputs than in the inputs (a size of 1
    # has no order).
    transposed = (seq_len > 1 and q_heads > 1
                  and (abs(q_in[0]) < abs(q_in[2])) != (abs(q_out[0]) < abs(q_out[2])))
    cfg = config or default_config(seq_len, q_heads, k_heads, head_dim, element_size, on_gpu,
                                   interleaved, _tile_angles(angles, interleaved), rotary_dim,
                                   in_place, transposed, words, narrowed, vision)
    block_h = cfg["block_h"]
    all_heads = bool(cfg.get("all_heads", False))
    # k's (and v's) blocks may have a size of their own (block_hk): the all-heads programs size
    # them to k; the default plans of one head block give every part the same size.
    block_hk = cfg.get("block_hk", block_h)
    if (DEEPSEEK_BACKWARD_K_BLOCKS and deinterleave == 2 and not all_heads
            and 0 < k_heads < block_hk):
        block_hk = _next_pow2(k_heads)
    q_blocks, k_blocks = triton.cdiv(q_heads, block_h), triton.cdiv(k_heads, block_hk)
    v_heads = v[0][2] if v is not None else 0
    v_dim = v[0][4] if v is not None else 0
    part_blocks = q_blocks + k_blocks + triton.cdiv(v_heads, block_hk)
    s_blocks = triton.cdiv(seq_len, cfg["block_s"])
    # Loads first (``loads_first`` in the config) needs one block of q, one of k and no v.
    loads_first = (all_heads and bool(cfg.get("loads_first", False)) and q_blocks == 1
                   and k_blocks == 1 and v is None)
    grid = (s_blocks * batch * (1 if all_heads else part_blocks), 1, 1)
    # Transposed results in rows of 256 B or more: token blocks the fastest program axis (see
    # TRANSPOSED_TOKEN_BLOCKS_FASTEST).
    token_blocks_fastest = (TRANSPOSED_TOKEN_BLOCKS_FASTEST and transposed and not all_heads
                            and _next_pow2(head_dim) * element_size >= 256)
    whole_rows = bool(cfg.get("whole_rows")) and not interleaved
    # Whole rows with the partners gathered in registers: the rows cut at the rotary block.
    gather = whole_rows and bool(cfg.get("gather")) and (rotary_dim < head_dim or narrowed)
    rotary_block = max(16, _next_pow2(rotary_dim))  # (GATHER's row: 16 channels or more)
    x_first = _x_first(has_positions, interleaved, narrowed)
    parts = [q, k] + ([v] if v is not None else [])
    int64 = max(_max_offset(sizes, st) for sizes, a, b in parts for st in (a, b)) >= 2**31 - 1
    v_strides = ((*v[1][:3], v[1][4], *v[2][:3], v[2][4]) if v is not None else (0,) * 8)
    if words:  # q and k indexed in words (pairs): strides halved, the channel one 1 (v: elements)
        halved = [(*(x // 2 for x in st[:4]), 1) for st in (q_in, q_out, k_in, k_out)]
        if deinterleave == 1:  # the inputs are pairs, the outputs half-split: only the inputs'
            q_in, k_in = halved[0], halved[2]
        elif deinterleave == 2:  # the outputs are pairs
            q_out, k_out = halved[1], halved[3]
        else:
            q_in, q_out, k_in, k_out = halved
    # Every part's sizes with each stride tuple the kernel gets (STRIDE_MULTIPLE's values)
    told = [(q[0], q_in), (q[0], q_out), (k[0], k_in), (k[0], k_out)] + (
        [(v[0], v[1]), (v[0], v[2])] if v is not None else [])
    scalars = (seq_len, batch, q_heads, k_heads, v_heads, qu, ku, rotary_dim, head_dim, v_dim,
               *q_in, *q_out, *k_in, *k_out, *v_strides, *t_strides, *p_strides, cp_size,
               cp_rank, *offsets, q_blocks, k_blocks, part_blocks, s_blocks)
    constexprs = dict(
        ANGLES=angles,
        ALL_HEADS=all_heads,
        LOADS_FIRST=loads_first,
        SAME_TABLE=bool(same_table),
        B_OUTER=abs(q_in[1]) > abs(q_in[0]),
        TOKEN_BLOCKS_FASTEST=token_blocks_fastest,
        PARTS_OUTER=_parts_outer(all_heads, token_blocks_fastest, v is not None, q_heads, k_heads,
                                 block_h, block_hk),
        HAS_POSITIONS=has_positions,
        HAS_START=has_start,
        USE_CP=cp_size > 1,
        HAS_V=v is not None,
        X_FIRST=x_first,
        POSITIONS_FIRST=_positions_first(x_first, gather, all_heads, cfg["num_warps"],
                                         cfg["block_s"]),
        INTERLEAVED=2 + deinterleave if deinterleave else 2 if words else int(bool(interleaved)),
        BACKWARD=bool(backward),
        # SFU cos/sin where the output's rounding hides their error (16-bit, NVIDIA, compiled).
        FAST_TRIG=(angles in (ANGLES["freqs"], ANGLES["inv_freq"]) and dtype != torch.float32
                   and on_gpu and not INTERPRETED and torch.version.hip is None),
        INT64=int64,
        BLOCK_S=cfg["block_s"],
        BLOCK_H=block_h,
        BLOCK_HK=block_hk,
        Q_LOOP=q_blocks if all_heads else 0,
        K_LOOP=k_blocks if all_heads else 0,
        V_LOOP=part_blocks - q_blocks - k_blocks if all_heads else 0,
        HALF=_next_pow2(rotary_dim // 2),
        # Channels past rotary_dim (in words of two when pairs are words; with GATHER those past
        # the rotary block).
        PASS=((_next_pow2(head_dim - rotary_block) if head_dim > rotary_block else 0)
              if gather
              else _next_pow2((head_dim - rotary_dim) // (2 if words else 1))
              if head_dim > rotary_dim else 0),
        V_WIDTH=_next_pow2(v_dim) if v is not None else 0,
        ROW=rotary_block if gather else _next_pow2(head_dim) if whole_rows else 0,
        GATHER=gather,
        CHANNEL_MULTIPLE=_channel_multiple(rotary_dim, head_dim, gather),
        STRIDE_MULTIPLE=_stride_multiple(
            [st for sizes, strides in told for n, st in zip(sizes[:4], strides[:4]) if n > 1]
            + list(offsets), 4 if words else element_size),
        TABLE_MULTIPLE=_stride_multiple(t_strides[:2], 4),
        SIN_OFFSET=sin_offset,
    )
    return Plan(grid, scalars, constexprs, cfg["num_warps"])


def _channel_multiple(rotary_dim: int, head_dim: int, gather: bool) -> int:
    """The kernel's ``CHANNEL_MULTIPLE``: the largest power of two up to 8 that divides rotary_dim
    and head_dim, where a load or store of q or k stops at one that is not a multiple of 16
    (Triton knows those); else 0 (nothing to tell: also where that power is 1). The pairs' tiles
    stop at rotary_dim / 2, rotary_dim and head_dim; GATHER's whole rows only at head_dim
    (rotary_dim is used in registers)."""
    if not CHANNEL_MULTIPLES or (gather and head_dim % 16 == 0):
        return 0
    multiple = _power_of_two_dividing((rotary_dim, head_dim))
    return multiple if multiple > 1 else 0


def _stride_multiple(values, unit: int) -> int:
    """The kernel's ``STRIDE_MULTIPLE`` (``TABLE_MULTIPLE``): the largest power of two up to 8
    that divides every one of ``values`` (strides, offsets; in elements of ``unit`` bytes), where
    that is 16 bytes or more and some value is not a multiple of 16 (which the compiler knows of
    itself); else 0. Fused projections of heads of 72 or 104 channels (Qwen3-VL's and MLCD's
    vision encoders) have strides of 8 elements, not 16: told, their rows load in 16-byte
    vectors, not one element at a time. Under 16 bytes, telling could only lower what the
    compiler knows of a tensor whose strides are multiples of 16."""
    if not STRIDE_MULTIPLES:
        return 0
    multiple = _power_of_two_dividing(values)
    return multiple if multiple * unit >= 16 else 0


def _power_of_two_dividing(values) -> int:
    """The largest power of two up to 8 that divides every one of ``values``; 0 where they are
    all multiples of 16 (the compiler knows that of an integer argument itself) or all 0."""
    both = 0
    for x in values:
        both = math.gcd(both, x)
    return 0 if both % 16 == 0 else min(8, both & -both)


def _tile_angles(angles: int, interleaved: bool) -> int:
    """The tables whose tiles a call takes (``default_config``'s ``angles``): GPT-OSS's (one
    entry per pair with half-split pairs) and NanoChat's (sin negated) take those of Llama's
    tables, whose accesses of q and k are the same (the tables half as wide, or the same)."""
    if (angles == ANGLES["cos_sin_half"] and not interleaved) or angles == ANGLES["cos_sin_neg"]:
        return ANGLES["cos_sin"]
    if angles == ANGLES["inv_freq"]:  # the cache's accesses of q, k and positions, no rows
        return ANGLES["cache"]
    return angles


def _words_strides(sizes, strides) -> bool:
    """Channels contiguous (the last stride 1) and the other strides even (or of a size-1 axis):
    with ``_aligned``, the condition on a tensor for reading or writing its pairs as words."""
    return strides[-1] == 1 and all(st % 2 == 0 or n == 1
                                    for n, st in zip(sizes[:-1], strides[:-1]))


def _aligned(*tensors: torch.Tensor) -> bool:
    """Every address even in elements: the condition for reading interleaved pairs as words that
    depends on the addresses (the others, in ``_plan``, follow from shapes and strides). Callers
    ask only for interleaved pairs: half-split ones need no address in the call's key."""
    return all(t.data_ptr() % (2 * t.element_size()) == 0 for t in tensors)


def _run(key, make_plan, pointers) -> None:
    plan = _PLANS.get(key)
    if plan is None:
        plan = make_plan()
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        _PLANS[key] = plan
    launch(rope_qk_kernel, plan, pointers)


def _check_device(x: torch.Tensor) -> None:
    if x.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError("rope_qk got CPU tensors but the Triton interpreter is off: move the "
                           "tensors to a GPU, or set TRITON_INTERPRET=1 before importing this "
                           "module (e.g. `TRITON_INTERPRET=1 python ...`).")


# ---------------------------------------------------------------------------------------------
# The three conventions
# ---------------------------------------------------------------------------------------------
def _qkv_parts(x: torch.Tensor, tensor_format: str, splits, heads: int):
    """Sizes and strides of the q, k and v parts of a qkv-shaped tensor, as [s, b, g, u, d]."""
    q_split, k_split, v_split = splits
    st = x.stride()
    s_st, b_st = (st[1], st[0]) if tensor_format == "bshd" else (st[0], st[1])
    s, b = (x.shape[1], x.shape[0]) if tensor_format == "bshd" else (x.shape[0], x.shape[1])
    n_q = q_split // k_split
    return (((s, b, heads, n_q, k_split), (s_st, b_st, st[2], k_split * st[3], st[3])),
            ((s, b, heads, 1, k_split), (s_st, b_st, st[2], 0, st[3])),
            ((s, b, heads, 1, v_split), (s_st, b_st, st[2], 0, st[3])))


def _heads_parts(t: torch.Tensor, tensor_format: str, heads: int):
    """Sizes and strides of a [s, b, heads * n, d] output (q: n > 1) seen as [s, b, heads, n, d]."""
    st = t.stride()
    s_st, b_st = (st[1], st[0]) if tensor_format == "bshd" else (st[0], st[1])
    s, b = (t.shape[1], t.shape[0]) if tensor_format == "bshd" else (t.shape[0], t.shape[1])
    n = t.shape[2] // heads
    return (s, b, heads, n, t.shape[3]), (s_st, b_st, n * st[2], st[2], st[3])


def _run_qkv(qkv_like, q, k, v, q_freqs, k_freqs, splits, tensor_format, start_positions,
             interleaved, cp_size, cp_rank, backward):
    """Rotate q and k and copy v between the packed tensor and the three split ones: forward
    reads ``qkv_like`` and writes q, k, v; backward reads q, k, v and writes ``qkv_like``."""
    if k_freqs.stride() != q_freqs.stride():
        q_freqs, k_freqs = q_freqs.contiguous(), k_freqs.contiguous()
    if start_positions is not None:  # read with stride 1: a strided view is copied first
        start_positions = start_positions.contiguous()
    same_table = k_freqs.data_ptr() == q_freqs.data_ptr()  # (same shape and strides: checked)
    aligned = bool(interleaved) and _aligned(qkv_like, q, k)
    h = k.shape[2]
    sig = ("qkv", qkv_like.shape, qkv_like.stride(), q.stride(), k.stride(), v.stride(),
           qkv_like.dtype, q.dtype, k.dtype, v.dtype, qkv_like.device, tuple(splits),
           tensor_format, q_freqs.shape[-1], q_freqs.stride(), q_freqs.dtype, k_freqs.dtype,
           None if start_positions is None else start_positions.dtype,
           bool(interleaved), cp_size, cp_rank, bool(backward), same_table, aligned)

    # The k and v parts of the packed tensor start q_split and q_split + k_split channels in:
    # the kernel gets the packed tensor itself and these offsets.
    k_start = splits[0] * qkv_like.stride(-1)
    v_start = (splits[0] + splits[1]) * qkv_like.stride(-1)
    if backward:
        ptrs = (q, qkv_like, k, qkv_like, v, qkv_like)
        offsets = (0, k_start, 0, v_start)
    else:
        ptrs = (qkv_like, q, qkv_like, k, qkv_like, v)
        offsets = (k_start, 0, v_start, 0)

    def make_plan():
        packed = _qkv_parts(qkv_like, tensor_format, splits, h)
        split = [_heads_parts(x, tensor_format, h) for x in (q, k, v)]
        # (sizes, strides of what is read, strides of what is written)
        parts = [(sizes, (o[1] if backward else st), (st if backward else o[1]))
                 for (sizes, st), o in zip(packed, split)]
        return _plan(parts[0], parts[1], parts[2], device=qkv_like.device, dtype=qkv_like.dtype,
                     angles=ANGLES["freqs"], rotary_dim=q_freqs.shape[-1], has_positions=False,
                     has_start=start_positions is not None, interleaved=interleaved,
                     backward=backward, cp_size=cp_size, cp_rank=cp_rank,
                     t_strides=(0, q_freqs.stride(0), q_freqs.stride(-1)), p_strides=(0, 0),
                     same_table=same_table, offsets=offsets, aligned=aligned)

    _run(sig, make_plan, (*ptrs, q_freqs, k_freqs, q_freqs, qkv_like,
                          start_positions if start_positions is not None else qkv_like))


def rope_qkv(qkv: torch.Tensor, q_freqs: torch.Tensor, k_freqs: torch.Tensor,
             qkv_split_arg_list: Sequence[int], tensor_format: str = "sbhd",
             start_positions: Optional[torch.Tensor] = None, interleaved: bool = False,
             cp_size: int = 1, cp_rank: int = 0):
    """TransformerEngine's fused QKV RoPE, forward: one launch.

    ``qkv`` ``[s, b, h, q_split + k_split + v_split]`` (sbhd) or ``[b, s, h, ...]`` (bshd), any
    strides; ``q_freqs``, ``k_freqs`` float32 ``[max_pos, 1, 1, rotary_dim]``. Returns new
    contiguous ``q [s, b, h * q_split / k_split, k_split]``, ``k [s, b, h, k_split]`` and
    ``v [s, b, h, v_split]`` (bshd: s and b exchanged), as TransformerEngine does.
    """
    _check_device(qkv)
    q_split, k_split, v_split = splits = [int(n) for n in qkv_split_arg_list]
    lead, h = qkv.shape[:2], qkv.shape[2]
    q_out = torch.empty((*lead, h * (q_split // k_split), k_split), dtype=qkv.dtype,
                        device=qkv.device)
    k_out = torch.empty((*lead, h, k_split), dtype=qkv.dtype, device=qkv.device)
    v_out = torch.empty((*lead, h, v_split), dtype=qkv.dtype, device=qkv.device)
    if qkv.numel():
        _run_qkv(qkv, q_out, k_out, v_out, q_freqs, k_freqs, splits, tensor_format,
                 start_positions, interleaved, cp_size, cp_rank, backward=False)
    return q_out, k_out, v_out


def rope_qkv_backward(q_grad: torch.Tensor, k_grad: torch.Tensor, v_grad: torch.Tensor,
                      q_freqs: torch.Tensor, k_freqs: torch.Tensor,
                      qkv_split_arg_list: Sequence[int], tensor_format: str = "sbhd",
                      start_positions: Optional[torch.Tensor] = None, interleaved: bool = False,
                      cp_size: int = 1, cp_rank: int = 0) -> torch.Tensor:
    """Gradient of ``rope_qkv`` with respect to qkv (one launch): q and k rotated back by
    R(-theta), v copied, all written into one new contiguous qkv-shaped tensor. The incoming
    gradients may have any strides (stride 0 from ``out.sum()`` too)."""
    _check_device(k_grad)
    splits = [int(n) for n in qkv_split_arg_list]
    lead, h = k_grad.shape[:2], k_grad.shape[2]
    grad = torch.empty((*lead, h, sum(splits)), dtype=k_grad.dtype, device=k_grad.device)
    if grad.numel():
        _run_qkv(grad, q_grad, k_grad, v_grad, q_freqs, k_freqs, splits, tensor_format,
                 start_positions, interleaved, cp_size, cp_rank, backward=True)
    return grad


def _tokens_heads(x: torch.Tensor, head_size: int):
    """[T, H * D] or [T, H, D] as (sizes [s=T, b=1, g=H, u=1, d=D], strides)."""
    if x.dim() == 2:
        n, width = x.shape
        s_t, s_c = x.stride()
        return (n, 1, width // head_size, 1, head_size), (s_t, 0, head_size * s_c, 0, s_c)
    n, h, d = x.shape
    s_t, s_h, s_d = x.stride()
    return (n, 1, h, 1, d), (s_t, 0, s_h, 0, s_d)


def rope_cos_sin_cache(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                       head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True,
                       query_out: Optional[torch.Tensor] = None,
                       key_out: Optional[torch.Tensor] = None, backward: bool = False):
    """FlashInfer/vLLM convention: ``positions`` int [num_tokens], ``query``
    [num_tokens, num_q_heads * head_size] (or [num_tokens, num_q_heads, head_size]), ``key``
    likewise with its own head count, ``cos_sin_cache`` float32 [max_position, rotary_dim] (cos
    in the first half of a row, sin in the second). ``is_neox``: half-split pairs, else GPT-J's
    interleaved pairs. Writes into ``query_out``/``key_out`` (new tensors if None; pass the
    inputs for in place) and returns them, shaped like the inputs."""
    _check_device(query)
    # Output strides in the key only where the caller chose the outputs (in place, or given):
    # new ones are contiguous, which follows from the shapes.
    if query_out is None:
        query_out, q_out_strides = torch.empty_like(query, memory_format=torch.contiguous_format), None
    else:
        q_out_strides = query_out.stride()
    if key_out is None:
        key_out, k_out_strides = torch.empty_like(key, memory_format=torch.contiguous_format), None
    else:
        k_out_strides = key_out.stride()
    if query.numel() == 0 and key.numel() == 0:
        return query_out, key_out
    in_place = query_out is query and key_out is key  # in place has tiles of its own
    aligned = not is_neox and _aligned(query, key, query_out, key_out)
    # Every pointer's dtype is in the key: a launcher that reuses the kernel compiled for a plan
    # (the package's) relies on the plan fixing everything Triton specialises on.
    sig = ("cache", query.shape, query.stride(), q_out_strides, key.shape, key.stride(),
           k_out_strides, query.dtype, key.dtype, query_out.dtype, key_out.dtype, query.device,
           positions.stride(), positions.dtype, cos_sin_cache.stride(), cos_sin_cache.dtype,
           cos_sin_cache.shape[-1], head_size, bool(is_neox), bool(backward), in_place, aligned)

    def make_plan():
        (q_sizes, q_in), (k_sizes, k_in) = (_tokens_heads(query, head_size),
                                            _tokens_heads(key, head_size))
        q_o, k_o = _tokens_heads(query_out, head_size)[1], _tokens_heads(key_out, head_size)[1]
        return _plan((q_sizes, q_in, q_o), (k_sizes, k_in, k_o), None, device=query.device,
                     dtype=query.dtype, angles=ANGLES["cache"],
                     rotary_dim=cos_sin_cache.shape[-1], has_positions=True, has_start=False,
                     interleaved=not is_neox, backward=backward, cp_size=1, cp_rank=0,
                     t_strides=(0, cos_sin_cache.stride(0), cos_sin_cache.stride(1)),
                     p_strides=(positions.stride(0), 0), same_table=True, in_place=in_place,
                     aligned=aligned)

    _run(sig, make_plan, (query, query_out, key, key_out, query, query, cos_sin_cache,
                          cos_sin_cache, cos_sin_cache, positions, query))
    return query_out, key_out


# FlashInfer's apply_rope_pos_ids family: angles from each token's position and a frequency per
# pair, computed in the kernel (ANGLES 5), so no table of rows is read.
_INV_FREQ: dict = {}


def inv_freq_table(rotary_dim: int, rope_scale: float, rope_theta: float, device: torch.device,
                   llama31: Optional[tuple] = None, create: bool = True, keep: bool = True):
    """FlashInfer's frequency of each pair, float32 [rotary_dim // 2] on ``device``: pair j's
    ``rope_theta ** (-2j / rotary_dim) / rope_scale`` (positions scaled down by ``rope_scale``).
    ``llama31 = (low_freq_factor, high_freq_factor, old_context_len)``: Llama 3.1's, each pair's
    frequency f blended as ``(1 - a) * f / rope_scale + a * f`` with
    ``a = clamp(old_context_len * f / (2 pi (high - low)) - low / (high - low), 0, 1)``: pairs of
    long wavelength scaled, short ones not, the ones between smoothed (FlashInfer's smooth_a and
    smooth_b, transformers' rope_type "llama3").

    Computed in float64 and rounded once, with device operations, so that a table first needed
    inside CUDA-graph capture is filled when the graph replays. A table is kept (per device and
    arguments, for the life of the process: a captured graph may read it) unless it was built
    during capture, whose values exist only after a replay, or ``keep`` is False: the package's
    torch.compile operators pass that, since Inductor's CUDA graphs warm up in a memory pool whose
    blocks their replays reuse. ``create=False``: a table kept before, or None."""
    key = (device, rotary_dim, float(rope_scale), float(rope_theta), llama31)
    table = _INV_FREQ.get(key)
    if table is not None or not create:
        return table
    j = torch.arange(rotary_dim // 2, dtype=torch.float64, device=device)
    freq = torch.pow(float(rope_theta), j * (-2.0 / rotary_dim))
    if llama31 is None:
        freq = freq / float(rope_scale)
    else:
        low, high, old_context_len = (float(x) for x in llama31)
        smooth = (freq * (old_context_len / (2 * math.pi * (high - low)))
                  - low / (high - low)).clamp(0.0, 1.0)
        freq = (1.0 - smooth) * (freq / float(rope_scale)) + smooth * freq
    table = freq.to(torch.float32)
    if keep and not (table.is_cuda and torch.cuda.is_current_stream_capturing()):
        _INV_FREQ[key] = table
    return table


@triton.jit
def _ragged_positions_kernel(indptr_ptr, offsets_ptr, positions_ptr, num_tokens, batch, steps,
                             BLOCK: tl.constexpr):
    """positions[t] = offsets[b] + t - indptr[b] for the segment b holding token t: the largest b
    with indptr[b] <= t (an empty segment's b equals the next one's start, and is passed over).
    A binary search over indptr [batch + 1], ``steps`` = bits of ``batch``."""
    t = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = t < num_tokens
    lo = tl.zeros([BLOCK], dtype=tl.int32)
    hi = tl.zeros([BLOCK], dtype=tl.int32) + (batch - 1)
    for _ in range(steps):
        mid = (lo + hi + 1) // 2
        start = tl.load(indptr_ptr + mid, mask=mask, other=0)
        inside = start <= t
        lo = tl.where(inside, mid, lo)
        hi = tl.where(inside, hi, mid - 1)
    start = tl.load(indptr_ptr + lo, mask=mask, other=0)
    offset = tl.load(offsets_ptr + lo, mask=mask, other=0)
    tl.store(positions_ptr + t, (offset + t - start).to(positions_ptr.dtype.element_ty),
             mask=mask)


def ragged_positions_dtype(indptr: torch.Tensor, offsets: torch.Tensor) -> torch.dtype:
    """``ragged_positions``' dtype: int64 if either of indptr and offsets is, else int32."""
    return torch.int64 if torch.int64 in (indptr.dtype, offsets.dtype) else torch.int32


def ragged_positions(indptr: torch.Tensor, offsets: torch.Tensor,
                     num_tokens: int) -> torch.Tensor:
    """Each token's position in FlashInfer's ragged batch (``apply_rope``'s): ``indptr``
    [batch + 1] (segment b is tokens indptr[b] .. indptr[b+1] - 1), ``offsets`` [batch] (the
    position of each segment's first token). Returns [num_tokens] of ``ragged_positions_dtype``,
    from one launch (no copy to the host)."""
    positions = torch.empty(num_tokens, dtype=ragged_positions_dtype(indptr, offsets),
                            device=indptr.device)
    batch = offsets.shape[0]
    if num_tokens == 0:
        return positions
    if batch == 0:  # tokens with no segment: FlashInfer's own check refuses this; so does ours
        raise ValueError(f"ragged_positions: {num_tokens} tokens but no segments (indptr "
                         f"{tuple(indptr.shape)})")
    block = 256
    grid = (triton.cdiv(num_tokens, block),)
    with torch.cuda.device(indptr.device) if indptr.is_cuda else contextlib.nullcontext():
        _ragged_positions_kernel[grid](indptr, offsets, positions, num_tokens, batch,
                                       max(1, batch.bit_length()), BLOCK=block, num_warps=4,
                                       **LAUNCH_OPTIONS)
    return positions


def rope_pos_ids(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                 inv_freq: torch.Tensor, interleave: bool = False,
                 q_out: Optional[torch.Tensor] = None, k_out: Optional[torch.Tensor] = None,
                 backward: bool = False):
    """FlashInfer's ``apply_rope_pos_ids`` convention: ``positions`` int [nnz], ``q``
    [nnz, num_q_heads, head_dim] and ``k`` [nnz, num_k_heads, head_dim] (any strides),
    ``inv_freq`` float32 [rotary_dim / 2] (``inv_freq_table``): pair j of a token at position p
    turns by ``float32(p) * inv_freq[j]``. ``interleave``: pairs (2j, 2j+1), else (j, j +
    rotary_dim/2); channels past rotary_dim copied (left where they are in place). Writes into
    ``q_out``/``k_out`` (new ``empty_like`` tensors if None, as FlashInfer allocates; pass q and
    k for in place) and returns them. One launch."""
    _check_device(q)
    if q_out is None:
        q_out = torch.empty_like(q)
    if k_out is None:
        k_out = torch.empty_like(k)
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    in_place = q_out is q and k_out is k
    aligned = bool(interleave) and _aligned(q, k, q_out, k_out)
    sig = ("pos_ids", q.shape, q.stride(), q_out.stride(), k.shape, k.stride(), k_out.stride(),
           q.dtype, k.dtype, q_out.dtype, k_out.dtype, q.device, positions.stride(),
           positions.dtype, inv_freq.shape, inv_freq.stride(), inv_freq.dtype,
           bool(interleave), bool(backward), in_place, aligned)

    def make_plan():
        head_dim = q.shape[-1]
        (q_sizes, q_in), (k_sizes, k_in) = _tokens_heads(q, head_dim), _tokens_heads(k, head_dim)
        q_o, k_o = _tokens_heads(q_out, head_dim)[1], _tokens_heads(k_out, head_dim)[1]
        return _plan((q_sizes, q_in, q_o), (k_sizes, k_in, k_o), None, device=q.device,
                     dtype=q.dtype, angles=ANGLES["inv_freq"], rotary_dim=2 * inv_freq.shape[0],
                     has_positions=True, has_start=False, interleaved=bool(interleave),
                     backward=backward, cp_size=1, cp_rank=0,
                     t_strides=(0, 1, inv_freq.stride(0)), p_strides=(positions.stride(0), 0),
                     same_table=True, in_place=in_place, aligned=aligned)

    _run(sig, make_plan, (q, q_out, k, k_out, q, q, inv_freq, inv_freq, inv_freq, positions, q))
    return q_out, k_out


def _sbhd_of_hf(x: torch.Tensor, heads_axis: int):
    """[b, h, s, d] (heads_axis 1) or [b, s, h, d] (2) as (sizes [s, b, h, 1, d], strides)."""
    st = x.stride()
    if heads_axis == 1:
        b, h, s, d = x.shape
        return (s, b, h, 1, d), (st[2], st[0], st[1], 0, st[3])
    b, s, h, d = x.shape
    return (s, b, h, 1, d), (st[1], st[0], st[2], 0, st[3])


def new_like(x: torch.Tensor) -> torch.Tensor:
    """A new dense tensor of x's shape and dtype with x's dimensions in x's memory order: what
    torch's elementwise ops return for x, and so what transformers' apply_rotary_pos_emb returns
    (for a [b, h, s, d] view of a projection's [b, s, h, d] memory, [b, s, h, d] memory: each
    token's heads written side by side, as they were read)."""
    out = torch.empty_like(x)  # x's own strides where x is dense
    if out.stride() != x.stride():  # a view with gaps (a slice of a fused projection, say)
        order = sorted(range(x.dim()), key=lambda i: -x.stride(i))  # outer to inner, stable
        out = torch.empty([x.shape[i] for i in order], dtype=x.dtype, device=x.device)
        out = out.permute([order.index(i) for i in range(x.dim())])
    return out


def hf_outputs(q: torch.Tensor, k: torch.Tensor, rotary_dim: int):
    """New q and k results laid out as transformers lays out its own: Llama's function (the whole
    head rotated) returns its elementwise result, in the inputs' memory order (``new_like``);
    GPT-NeoX's, the one that rotates part of the head, ends in ``torch.cat``: contiguous."""
    if rotary_dim < q.shape[-1]:
        return (torch.empty_like(q, memory_format=torch.contiguous_format),
                torch.empty_like(k, memory_format=torch.contiguous_format))
    return new_like(q), new_like(k)


# Hugging Face's pairings (``pairs`` of rope_cos_sin): -> (ANGLES, interleaved, rotated channels
# per entry of cos: rotary_dim = that * cos.shape[-1])
HF_PAIRS = {
    "half": (ANGLES["cos_sin"], False, 1),  # Llama, GPT-NeoX: channel j with j + rotary_dim/2
    "interleaved": (ANGLES["cos_sin"], True, 1),  # Cohere: 2j with 2j+1, cos/sin per channel
    "glm": (ANGLES["cos_sin_half"], True, 1),  # GLM: 2j with 2j+1, pair j's cos/sin at channel j
    "half_per_pair": (ANGLES["cos_sin_half"], False, 2),  # GPT-OSS: cos/sin [b, s, rotary_dim/2]
    "interleaved_per_pair": (ANGLES["cos_sin_half"], True, 2),  # OpenAI's privacy filter
    "half_negated": (ANGLES["cos_sin_neg"], False, 1),  # NanoChat: Llama's with sin negated
    # DeepSeek V3: GLM's pairs and angles, each pair's results written half-split (j, j + d/2)
    "deepseek": (ANGLES["cos_sin_half"], True, 1),
}


# The vision encoders' functions (rope_kernels.hf.apply_rotary_pos_emb_vision and its interleaved
# twin, and Llama 4's encoder's apply_rotary_emb_llama4_vision) pass these: the pairs of "half",
# "interleaved" and "interleaved_per_pair", planned on tiles of their own (VISION_TILES).
VISION_PAIRS = {"vision": "half", "vision_interleaved": "interleaved",
                "vision_interleaved_complex": "interleaved_per_pair"}
# The complex-angle functions (Llama 4's, DeepSeek V2's) pass these: "interleaved_per_pair" with
# cos and sin the real and imaginary parts of one complex64 tensor, sin's entries one element
# past cos's, which the kernel then reads through cos's pointer (SIN_OFFSET).
COMPLEX_PAIRS = {"interleaved_complex": "interleaved_per_pair",
                 "vision_interleaved_complex": "interleaved_per_pair"}


def _base_pairs(pairs: str) -> str:
    """The HF_PAIRS key whose pairs and tables ``pairs`` (any of the keys above) takes."""
    return VISION_PAIRS.get(pairs) or COMPLEX_PAIRS.get(pairs) or pairs


def hf_rotary_dim(cos: torch.Tensor, pairs: str) -> int:
    """How many channels of each head ``pairs``' function rotates with this ``cos``."""
    return HF_PAIRS[_base_pairs(pairs)][2] * cos.shape[-1]


def rope_cos_sin(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 heads_axis: int = 1, backward: bool = False, pairs: str = "half",
                 q_out: Optional[torch.Tensor] = None, k_out: Optional[torch.Tensor] = None):
    """Hugging Face convention: ``q`` [b, h, s, d] (``heads_axis=1``) or [b, s, h, d]
    (``heads_axis=2``), any strides, ``k`` alike with its own head count; ``cos``, ``sin``
    [b, s, rotary_dim], [1, s, rotary_dim] or [s, rotary_dim], channels past rotary_dim copied.
    ``pairs`` (``HF_PAIRS``): "half" rotates channel j with j + rotary_dim/2 by cos/sin of each
    channel (Llama's function); "interleaved" 2j with 2j+1, cos/sin of each channel (Cohere's,
    whose rotary module repeat_interleaves them); "glm" 2j with 2j+1 by pair j's cos/sin, read at
    channel j (GLM's function, given Llama's layout of cos and sin); "half_per_pair" and
    "interleaved_per_pair" the half-split and interleaved pairs by cos/sin of one entry per pair,
    ``[b, s, rotary_dim / 2]`` (GPT-OSS's function, OpenAI's privacy filter's); "half_negated"
    as "half" with sin negated (NanoChat's); "deepseek" GLM's pairs and angles with each pair's
    results written to channels j and j + d/2 (DeepSeek V3's ``apply_rotary_pos_emb_interleave``,
    the whole head rotated; its backward reads those and writes pairs). ``COMPLEX_PAIRS``' keys
    take "interleaved_per_pair" with cos and sin the real and imaginary parts of one complex
    tensor (Llama 4's, DeepSeek V2's angles: ``view_as_real(freqs)[..., 0]`` and ``[..., 1]``),
    which the kernel then reads through cos's address alone (elsewhere as two tables);
    ``VISION_PAIRS``' keys plan on the vision tiles. Writes into ``q_out`` and ``k_out`` (pass q
    and k for in place; both or neither) and returns them; if None, new tensors laid out as
    transformers' functions lay out theirs (``hf_outputs``)."""
    angles, interleaved, _ = HF_PAIRS[_base_pairs(pairs)]
    rotary_dim = hf_rotary_dim(cos, pairs)
    _check_device(q)
    if (q_out is None) != (k_out is None):
        raise ValueError("rope_cos_sin writes into q_out and k_out, both or neither: got "
                         f"q_out {'None' if q_out is None else 'a tensor'}, k_out "
                         f"{'None' if k_out is None else 'a tensor'}")
    if q_out is None:
        q_out, k_out = hf_outputs(q, k, rotary_dim)
        out_meta = None  # follows from the inputs' shapes and strides
    else:
        out_meta = (q_out.stride(), k_out.stride(), q_out.dtype, k_out.dtype)
    if q.numel() == 0 and k.numel() == 0:
        return q_out, k_out
    # The complex angles' sin, one element past cos in one tensor, goes to the kernel as cos's
    # tensor (SIN_OFFSET 1): its own address is not 16-byte aligned, and the package's shortest
    # launch path takes aligned addresses only (a decode-sized call 9 us longer on an H200 host).
    sin_next = (pairs in COMPLEX_PAIRS and sin.stride() == cos.stride()
                and sin.dtype == cos.dtype
                and sin.data_ptr() == cos.data_ptr() + cos.element_size())
    if sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    in_place = q_out is q and k_out is k
    deinterleave = (2 if backward else 1) if pairs == "deepseek" else 0
    aligned = interleaved and _aligned(q, k, q_out, k_out)
    if deinterleave and not (aligned and all(_words_strides(t.shape, t.stride())
                                             for t in (q, k, q_out, k_out))):
        # DeepSeek's pairs are read (or written) as words; tensors that do not allow it (an odd
        # stride or address) go through dense copies (new, so aligned): correct, at a copy's cost.
        qc, kc = (x.clone(memory_format=torch.contiguous_format) for x in (q, k))
        qo, ko = rope_cos_sin(qc, kc, cos, sin, heads_axis, backward, pairs,
                              torch.empty_like(qc), torch.empty_like(kc))
        q_out.copy_(qo)
        k_out.copy_(ko)
        return q_out, k_out
    sig = ("hf", q.shape, q.stride(), k.shape, k.stride(), q.dtype, k.dtype, q.device,
           cos.shape, cos.stride(), cos.dtype, sin.dtype, heads_axis, bool(backward), pairs,
           aligned, out_meta, in_place, sin_next)

    def make_plan():
        q_sizes, q_in = _sbhd_of_hf(q, heads_axis)
        k_sizes, k_in = _sbhd_of_hf(k, heads_axis)
        st = cos.stride()
        # A batch of one (or none) is shared by every batch element: stride 0.
        t_strides = ((0, st[0], st[1]) if cos.dim() == 2
                     else (st[0] if cos.shape[0] > 1 else 0, st[1], st[2]))
        return _plan((q_sizes, q_in, _sbhd_of_hf(q_out, heads_axis)[1]),
                     (k_sizes, k_in, _sbhd_of_hf(k_out, heads_axis)[1]), None, device=q.device,
                     dtype=q.dtype, angles=angles, rotary_dim=rotary_dim,
                     has_positions=False, has_start=False, interleaved=interleaved,
                     backward=backward, cp_size=1, cp_rank=0, t_strides=t_strides,
                     p_strides=(0, 0), same_table=True, in_place=in_place, aligned=aligned,
                     deinterleave=deinterleave, vision=pairs in VISION_PAIRS,
                     sin_offset=int(sin_next))

    _run(sig, make_plan, (q, q_out, k, k_out, q, q, cos, cos, cos if sin_next else sin, q, q))
    return q_out, k_out


# rope_trailing's tile on a GPU (DeepSeek V4's calls): about this many bytes of x a program (its
# rows whole: the copied channels and the rotary slice), on 4 warps. In a probe (H200, bf16, 3
# shuffled rounds, not recorded) 4 KB a program (1 token x 4 heads of 512 channels, 4 tokens x 1
# head, 1 x 16 heads of 128) was the best of 28 tiles or within 0.6 points of copy of it at 64
# heads of 512 and of 128 and at 1 head of 512; against default_config's tile (which sees a q
# of no heads) scripts/hf_deepseek_v4.py records the A/B (figures/hf_deepseek_v4_h200.json).
TRAILING_BYTES = 4096
TRAILING_IN_PLACE_BYTES = 2048


def trailing_config(on_gpu: bool, heads: int, head_dim: int, rotary_dim: int, element_size: int,
                    in_place: bool):
    """``rope_trailing``'s tile: on a GPU, out of place ``TRAILING_BYTES`` of x a program on 4
    warps, in place ``TRAILING_IN_PLACE_BYTES`` of the rotary slices (the only channels it moves)
    on 2; as many heads of a token as that holds (a power of two, up to the heads there are),
    then tokens. Elsewhere (the interpreter, whose cost is per program) None: ``default_config``'s.

    In place, DeepSeek V4's slices of 64 of 512 or 128 channels in bf16 (H200, 5 shuffled
    rounds; a probe, not recorded): 2 KB on 2 warps level with the q+k path's tiles (one token's
    16 heads on 2 warps) at 64 heads, 0.30-0.51 of their time on the one shared key-value head
    (one head a program there); 4 KB counted over the whole head, as out of place, gave a program
    an eighth of that and took 2.5-2.7 times as long at heads of 512."""
    if not on_gpu or TRAILING_BYTES is None:
        return None
    tile_bytes, row_channels = ((TRAILING_IN_PLACE_BYTES, rotary_dim) if in_place
                                else (TRAILING_BYTES, head_dim))
    rows = 1 << max(0, (tile_bytes // (row_channels * element_size)).bit_length() - 1)
    block_h = min(_next_pow2(heads), rows)
    return dict(block_s=max(1, rows // block_h), block_h=block_h, block_hk=block_h,
                num_warps=2 if in_place else 4, all_heads=False)


def rope_trailing(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads_axis: int = 1,
                  backward: bool = False, pairs: str = "interleaved_per_pair",
                  out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """DeepSeek V4's layout: each head of ``x`` [b, h, s, d] (``heads_axis=1``) or [b, s, h, d]
    (any strides) is ``[nope | rope]``; its last ``rope = hf_rotary_dim(cos, pairs)`` channels
    are rotated as ``rope_cos_sin`` rotates a head (``pairs``: an ``HF_PAIRS`` key, cos and sin
    as there), the first ``d - rope`` copied. Returns a new contiguous tensor of x's shape
    (transformers' function ends in ``torch.cat``); ``out``: a contiguous tensor of x's shape,
    dtype and device to write into instead (the tests poison it), or x itself: in place, the
    rotary slices alone read and written.

    One launch, which reads every byte of x once and writes every byte of the result once: the
    rotary slices are the kernel's k (its q has no heads) and the copied channels its v (fused
    QKV's copy), both given as x and the result themselves, k at an offset of ``d - rope``
    channels (the plan's ``offsets``). So the launch's pointers are the call's own tensors, and a
    repeated call can take the shortcut of ``rope_kernels.api`` (``hf.py`` does)."""
    _check_device(x)
    angles, interleaved, _ = HF_PAIRS[pairs]
    rope = hf_rotary_dim(cos, pairs)
    nope = x.shape[-1] - rope
    in_place = out is x
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif not in_place and not (out.shape == x.shape and out.dtype == x.dtype
                               and out.device == x.device and out.is_contiguous()):
        raise ValueError(f"rope_trailing: out must be a contiguous tensor of x's shape "
                         f"{tuple(x.shape)}, dtype {x.dtype} and device {x.device}; got "
                         f"{tuple(out.shape)}, {out.dtype}, {out.device}, strides {out.stride()}")
    if x.numel() == 0:
        return out
    if sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    aligned = interleaved and _aligned(x, out)
    sig = ("trailing", x.shape, x.stride(), x.dtype, x.device, cos.shape, cos.stride(),
           cos.dtype, sin.dtype, heads_axis, bool(backward), pairs, aligned, in_place)

    def make_plan():
        rotary = [_sbhd_of_hf(t.narrow(-1, nope, rope), heads_axis) for t in (x, out)]
        sizes = rotary[0][0]
        none = ((*sizes[:2], 0, *sizes[3:]), rotary[0][1], rotary[1][1])  # q: no heads
        v = None
        if nope and not in_place:
            copied = [_sbhd_of_hf(t.narrow(-1, 0, nope), heads_axis) for t in (x, out)]
            v = (copied[0][0], copied[0][1], copied[1][1])
        st = cos.stride()
        t_strides = ((0, st[0], st[1]) if cos.dim() == 2
                     else (st[0] if cos.shape[0] > 1 else 0, st[1], st[2]))
        return _plan(none, (sizes, rotary[0][1], rotary[1][1]), v, device=x.device,
                     dtype=x.dtype, angles=angles, rotary_dim=rope, has_positions=False,
                     has_start=False, interleaved=interleaved, backward=backward, cp_size=1,
                     cp_rank=0, t_strides=t_strides, p_strides=(0, 0), same_table=True,
                     offsets=(nope * x.stride(-1), nope * out.stride(-1), 0, 0),
                     in_place=in_place, aligned=aligned,
                     config=trailing_config(x.is_cuda, sizes[2], x.shape[-1], rope,
                                            x.element_size(), in_place))

    _run(sig, make_plan, (x, out, x, out, x, out, cos, cos, sin, x, x))
    return out
