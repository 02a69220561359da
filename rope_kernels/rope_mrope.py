"""Multimodal RoPE (M-RoPE) of q and k from a cos/sin cache, in one launch. One self-contained
file (torch, triton, stdlib).

Qwen2-VL, Qwen2.5-VL, Qwen3-VL and GLM-4V give every token three positions, one per axis of
its image or video patch: time, height, width (T, H, W). A text token has the same position on
all three. The rotary pairs are split into three *sections*, ``mrope_section = [s_t, s_h, s_w]``
pairs (``s_t + s_h + s_w = rotary_dim / 2``), and pair j turns by the angle of its section's
position::

    contiguous sections (Qwen2-VL, Qwen2.5-VL, GLM-4V):  j < s_t -> T,  j < s_t + s_h -> H,  else W
    interleaved sections (Qwen3-VL, ``mrope_interleaved``): j % 3 == 1 and j < 3 s_h -> H,
                                                         j % 3 == 2 and j < 3 s_w -> W,  else T

This is vLLM's and SGLang's ``MRotaryEmbedding`` (and what transformers' Qwen rotary modules
build into their cos and sin). Serving stacks gather ``cos_sin_cache[positions]`` for all three
axes first, then rotate; this kernel reads each pair's cos and sin straight from the cache row of
its section's position, so a token's rows are read once and nothing is gathered beforehand.

Shapes (serving's flat tokens):

    positions      int32/int64 [3, num_tokens], any strides (T, H and W rows)
    query, key     [num_tokens, heads * head_size]: the channels of a head contiguous; the token
                   and head strides free (views into a packed qkv projection are fine)
    cos_sin_cache  float [max_position, rotary_dim]: cos of pair j at column j, its sin at
                   rotary_dim / 2 + j (FlashInfer's and vLLM's layout)

Pairs are half-split (j, j + rotary_dim / 2; ``is_neox``) or interleaved (2j, 2j + 1). The first
``rotary_dim`` channels of each head turn; the rest are copied (out of place) or left where they
are (in place). The rotation runs in float32 and rounds once to the output's dtype. The backward
is the same kernel with sin negated (``backward=True``): a pair's rotation by -theta is the
transpose of its rotation by theta.

Programs: one per (block of ``BLOCK_S`` tokens, block of ``BLOCK_H`` heads); the first
``cdiv(q_heads, BLOCK_H)`` head blocks are q's, the rest k's. A program loads its tokens' three
positions, then one cos and one sin per (token, pair), and reuses them for every head of its
block.

Usage::

    q_out, k_out = rope_mrope(positions, q, k, head_size, cos_sin_cache, [16, 24, 24])
    rope_mrope(positions, q, k, head_size, cos_sin_cache, [24, 20, 20], interleaved_sections=True,
               query_out=q, key_out=k)                                          # in place

On a machine without a GPU set ``TRITON_INTERPRET=1`` before importing this file.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def _section_rows(positions_ptr, s_idx, s_mask, j, p_stride_axis, p_stride_token,
                  cache_stride_row, SECTION_T: tl.constexpr, SECTION_H: tl.constexpr,
                  SECTION_W: tl.constexpr, INTERLEAVED_SECTIONS: tl.constexpr,
                  INT64: tl.constexpr):
    """Where each (token, pair)'s cache row starts, [BLOCK_S, HALF]: the row of the position on
    the pair's axis (T, H or W). The three positions of a token are loaded once here."""
    p_t = tl.load(positions_ptr + s_idx * p_stride_token, mask=s_mask, other=0)
    p_h = tl.load(positions_ptr + p_stride_axis + s_idx * p_stride_token, mask=s_mask, other=0)
    p_w = tl.load(positions_ptr + 2 * p_stride_axis + s_idx * p_stride_token, mask=s_mask,
                  other=0)
    if INTERLEAVED_SECTIONS:
        # Qwen3-VL: T H W T H W ... while H and W last, then T to the end.
        on_h = (j % 3 == 1) & (j < 3 * SECTION_H)
        on_w = (j % 3 == 2) & (j < 3 * SECTION_W)
    else:
        on_h = (j >= SECTION_T) & (j < SECTION_T + SECTION_H)
        on_w = j >= SECTION_T + SECTION_H
    pos = tl.where(on_w[None, :], p_w[:, None], tl.where(on_h[None, :], p_h[:, None],
                                                         p_t[:, None]))
    if INT64:
        pos = pos.to(tl.int64)
    return pos * cache_stride_row


@triton.jit
def _rotate_heads(x_ptr, out_ptr, positions_ptr, cache_ptr, s_idx, s_mask, h0, heads,
                  x_stride_token, x_stride_head, o_stride_token, o_stride_head, rotary_dim,
                  head_dim, p_stride_axis, p_stride_token, cache_stride_row, cache_stride_col,
                  SECTION_T: tl.constexpr, SECTION_H: tl.constexpr, SECTION_W: tl.constexpr,
                  INTERLEAVED_SECTIONS: tl.constexpr, IS_NEOX: tl.constexpr,
                  BACKWARD: tl.constexpr, COPY_PASS: tl.constexpr, X_FIRST: tl.constexpr,
                  INT64: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
                  PASS: tl.constexpr):
    """Rotate heads ``h0 .. h0 + BLOCK_H`` of the tokens ``s_idx``: load the rows, then each
    (token, pair)'s cos and sin (the same for every head of a token), rotate, store; with
    ``COPY_PASS`` also copy the channels past rotary_dim."""
    h = h0 + tl.arange(0, BLOCK_H)
    h_mask = h < heads
    if INT64:
        h = h.to(tl.int64)
    j = tl.arange(0, HALF)  # pair index
    j_mask = j < rotary_dim // 2
    row_mask = s_mask[:, None, None] & h_mask[None, :, None]  # [BLOCK_S, BLOCK_H, 1]
    x_row = x_ptr + s_idx[:, None, None] * x_stride_token + h[None, :, None] * x_stride_head
    o_row = out_ptr + s_idx[:, None, None] * o_stride_token + h[None, :, None] * o_stride_head
    if IS_NEOX:
        c1 = j
        c2 = j + rotary_dim // 2
    else:
        c1 = 2 * j
        c2 = 2 * j + 1
    mask = row_mask & j_mask[None, None, :]
    x1 = tl.load(x_row + c1[None, None, :], mask=mask, other=0.0)
    x2 = tl.load(x_row + c2[None, None, :], mask=mask, other=0.0)
    if COPY_PASS:
        # Loaded with the rotated channels, so that the whole row is in flight at once.
        p = rotary_dim + tl.arange(0, PASS)
        p_mask = row_mask & (p < head_dim)[None, None, :]
        xp = tl.load(x_row + p[None, None, :], mask=p_mask, other=0.0)
    if X_FIRST:
        # The cos/sin loads wait on the positions' load; left to itself, ptxas issues the
        # positions' load first and the rows' loads after it. A barrier (it waits on no load)
        # is a point ptxas does not move loads across: the rows are in flight meanwhile.
        tl.debug_barrier()
    rows = _section_rows(positions_ptr, s_idx, s_mask, j, p_stride_axis, p_stride_token,
                         cache_stride_row, SECTION_T, SECTION_H, SECTION_W,
                         INTERLEAVED_SECTIONS, INT64)
    sj_mask = s_mask[:, None] & j_mask[None, :]
    # evict_last: a cache row is read again by every head block of the token and by every token
    # at that position, while the streamed q and k pass through L2.
    cos = tl.load(cache_ptr + rows + j[None, :] * cache_stride_col, mask=sj_mask, other=0.0,
                  eviction_policy="evict_last").to(tl.float32)
    sin = tl.load(cache_ptr + rows + (j[None, :] + rotary_dim // 2) * cache_stride_col,
                  mask=sj_mask, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if BACKWARD:
        sin = -sin  # R(theta)^T = R(-theta)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    c = cos[:, None, :]
    s = sin[:, None, :]
    tl.store(o_row + c1[None, None, :], (a * c - b * s).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + c2[None, None, :], (b * c + a * s).to(out_ptr.dtype.element_ty), mask=mask)
    if COPY_PASS:
        tl.store(o_row + p[None, None, :], xp.to(out_ptr.dtype.element_ty), mask=p_mask)


@triton.jit
def rope_mrope_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, positions_ptr, cache_ptr,
    num_tokens, q_heads, k_heads, rotary_dim, head_dim,
    q_stride_token, q_stride_head, k_stride_token, k_stride_head,
    qo_stride_token, qo_stride_head, ko_stride_token, ko_stride_head,
    p_stride_axis, p_stride_token, cache_stride_row, cache_stride_col,
    SECTION_T: tl.constexpr, SECTION_H: tl.constexpr, SECTION_W: tl.constexpr,
    INTERLEAVED_SECTIONS: tl.constexpr, IS_NEOX: tl.constexpr, BACKWARD: tl.constexpr,
    COPY_PASS: tl.constexpr, X_FIRST: tl.constexpr, INT64: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr,
):
    """Grid ``(cdiv(num_tokens, BLOCK_S), cdiv(q_heads, BLOCK_H) + cdiv(k_heads, BLOCK_H))``.
    ``HALF``: a power of two >= rotary_dim / 2; ``PASS``: one >= head_dim - rotary_dim (with
    ``COPY_PASS``); ``X_FIRST``: issue the rows' loads before the positions'."""
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    s_mask = s_idx < num_tokens
    if INT64:
        s_idx = s_idx.to(tl.int64)
    q_blocks = tl.cdiv(q_heads, BLOCK_H)
    if pid_h < q_blocks:
        _rotate_heads(q_ptr, q_out_ptr, positions_ptr, cache_ptr, s_idx, s_mask,
                      pid_h * BLOCK_H, q_heads, q_stride_token, q_stride_head, qo_stride_token,
                      qo_stride_head, rotary_dim, head_dim, p_stride_axis, p_stride_token,
                      cache_stride_row, cache_stride_col, SECTION_T, SECTION_H, SECTION_W,
                      INTERLEAVED_SECTIONS, IS_NEOX, BACKWARD, COPY_PASS, X_FIRST, INT64,
                      BLOCK_H, HALF, PASS)
    else:
        _rotate_heads(k_ptr, k_out_ptr, positions_ptr, cache_ptr, s_idx, s_mask,
                      (pid_h - q_blocks) * BLOCK_H, k_heads, k_stride_token, k_stride_head,
                      ko_stride_token, ko_stride_head, rotary_dim, head_dim, p_stride_axis,
                      p_stride_token, cache_stride_row, cache_stride_col, SECTION_T, SECTION_H,
                      SECTION_W, INTERLEAVED_SECTIONS, IS_NEOX, BACKWARD, COPY_PASS, X_FIRST,
                      INT64, BLOCK_H, HALF, PASS)


def default_config(num_tokens: int, q_heads: int, k_heads: int, row_bytes: int,
                   on_gpu: bool = True) -> dict:
    """Tiles by measurement (``scripts/mrope.py --sweep``, ``figures/mrope_h200.json``: H200,
    bf16 heads of 128, 65536 tokens): blocks of 8 heads (fewer only where both parts have
    fewer), 4 KB of the rows a program moves (``row_bytes`` a head: the whole head, or in place
    only its rotated channels), 4 warps. Against the 48 tiles swept out of place (2-16 heads,
    16-64 rows, 4 or 8 warps, the rows' loads first or not; 5 shuffled rounds) it was the
    fastest at GLM-4.1V-9B's heads, 0.1 and 0.3 points of copy behind the fastest at
    Qwen3-VL-8B's and Qwen2.5-VL-7B's at 65536 tokens, 1.0 behind at 16384. In place with half
    of GLM's heads rotated (128 B moved a row), 4 KB (4 tokens) ran at 0.770 of copy in the
    record, 2 KB at 0.667 in a probe of 3 rounds. The interpreter takes big tiles: its cost is
    per program, not per element."""
    block_h = min(8, triton.next_power_of_2(max(q_heads, k_heads, 1)))
    target = 4096 if on_gpu else 1 << 16
    block_s = triton.next_power_of_2(max(1, target // (row_bytes * block_h)))
    block_s = max(1, min(block_s, triton.next_power_of_2(max(num_tokens, 1)), 64))
    return {"BLOCK_S": block_s, "BLOCK_H": block_h, "num_warps": 4 if on_gpu else 1,
            "X_FIRST": False}


def _tokens_heads(x: torch.Tensor, head_size: int):
    """``x`` [T, H * head_size] or [T, H, head_size] as (heads, token stride, head stride)."""
    if x.dim() == 3:
        return x.shape[1], x.stride(0), x.stride(1)
    return x.shape[1] // head_size, x.stride(0), head_size


# Launch options of every plan: fused multiply-adds on, as Triton 3.6 to 3.9 compile by default
# (3.9 warns that 3.10 turns them off, which would change the results' last bits).
LAUNCH_OPTIONS = {"enable_fp_fusion": True}


class Plan:
    """What a launch needs that follows from shapes, strides and flags, not from data (the
    fields of ``rope_qk.Plan``). ``compiled`` is for a launcher that reuses the kernel Triton
    compiled (the package's)."""

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
        with torch.cuda.device(device):  # Triton launches on the current device
            return launch(kernel, plan, pointers)
    return kernel[plan.grid](*pointers, *plan.scalars, **plan.constexprs,
                             num_warps=plan.num_warps, **plan.options)


def _make_plan(positions, query, key, head_size, cos_sin_cache, mrope_section,
               interleaved_sections, is_neox, query_out, key_out, backward, config) -> Plan:
    num_tokens = query.shape[0]
    rotary_dim = cos_sin_cache.shape[1]
    q_heads, q_st, q_sh = _tokens_heads(query, head_size)
    k_heads, k_st, k_sh = _tokens_heads(key, head_size)
    _, qo_st, qo_sh = _tokens_heads(query_out, head_size)
    _, ko_st, ko_sh = _tokens_heads(key_out, head_size)
    in_place = query_out is query and key_out is key
    moved = rotary_dim if in_place else head_size  # channels of a head the program moves
    cfg = dict(config or default_config(num_tokens, q_heads, k_heads,
                                        moved * query.element_size(), query.is_cuda))
    block_s, block_h = cfg.pop("BLOCK_S"), cfg.pop("BLOCK_H")
    num_warps = cfg.pop("num_warps", 4)
    x_first = cfg.pop("X_FIRST", False)
    # int64 offsets only where an int32 one could overflow.
    largest = max(x.numel() * x.element_size() for x in (query, key, query_out, key_out,
                                                          cos_sin_cache))
    section_t, section_h, section_w = (int(s) for s in mrope_section)
    # Three grid sizes: a launcher that calls the compiled kernel directly takes all three.
    grid = (triton.cdiv(num_tokens, block_s),
            triton.cdiv(q_heads, block_h) + triton.cdiv(k_heads, block_h), 1)
    scalars = (num_tokens, q_heads, k_heads, rotary_dim, head_size,
               q_st, q_sh, k_st, k_sh, qo_st, qo_sh, ko_st, ko_sh,
               positions.stride(0), positions.stride(1), cos_sin_cache.stride(0),
               cos_sin_cache.stride(1))
    constexprs = dict(
        SECTION_T=section_t, SECTION_H=section_h, SECTION_W=section_w,
        INTERLEAVED_SECTIONS=bool(interleaved_sections), IS_NEOX=bool(is_neox),
        BACKWARD=bool(backward), COPY_PASS=(not in_place and rotary_dim < head_size),
        X_FIRST=bool(x_first), INT64=largest >= 2**31, BLOCK_S=block_s, BLOCK_H=block_h,
        HALF=triton.next_power_of_2(rotary_dim // 2),
        PASS=triton.next_power_of_2(max(head_size - rotary_dim, 1)))
    return Plan(grid, scalars, constexprs, num_warps, cfg)


def rope_mrope(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, head_size: int,
               cos_sin_cache: torch.Tensor, mrope_section: Sequence[int],
               interleaved_sections: bool = False, is_neox: bool = True,
               query_out: Optional[torch.Tensor] = None, key_out: Optional[torch.Tensor] = None,
               backward: bool = False, config: Optional[dict] = None):
    """M-RoPE of ``query`` and ``key`` at ``positions`` [3, num_tokens] (shapes in the module's
    docstring). Writes into ``query_out``/``key_out`` (new contiguous tensors if None; pass the
    inputs for in place) and returns them. ``config``: tiles of your own (``default_config``'s
    keys). Inputs are assumed valid (the package checks them: ``rope_kernels._validate``)."""
    if query.device.type == "cpu" and not INTERPRETED:
        raise RuntimeError("rope_mrope got CPU tensors but the Triton interpreter is off: move "
                           "the tensors to a GPU, or set TRITON_INTERPRET=1 before importing "
                           "this module (e.g. `TRITON_INTERPRET=1 python ...`).")
    if query_out is None:
        query_out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if key_out is None:
        key_out = torch.empty_like(key, memory_format=torch.contiguous_format)
    if query.shape[0] == 0 or (query.numel() == 0 and key.numel() == 0):
        return query_out, key_out
    in_place = query_out is query and key_out is key
    # Every pointer's dtype and every scalar follow from the key: a launcher that reuses the
    # kernel compiled for a plan (the package's) relies on that.
    sig = (query.shape, query.stride(), key.shape, key.stride(), query_out.stride(),
           key_out.stride(), query.dtype, key.dtype, query_out.dtype, key_out.dtype,
           query.device,
           positions.shape, positions.stride(), positions.dtype, cos_sin_cache.shape,
           cos_sin_cache.stride(), cos_sin_cache.dtype, head_size, tuple(mrope_section),
           bool(interleaved_sections), bool(is_neox), bool(backward), in_place)
    plan = None if config else _PLANS.get(sig)
    if plan is None:
        plan = _make_plan(positions, query, key, head_size, cos_sin_cache, mrope_section,
                          interleaved_sections, is_neox, query_out, key_out, backward, config)
        if not config:
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[sig] = plan
    launch(rope_mrope_kernel, plan, (query, key, query_out, key_out, positions, cos_sin_cache))
    return query_out, key_out
