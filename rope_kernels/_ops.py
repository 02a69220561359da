"""The kernels as PyTorch operators (``torch.ops.rope_kernels.*``), with their autograd formulas.

``torch.compile`` sees each operator as one opaque node: ``fullgraph=True`` traces through the
public functions with no graph break, the node's fake implementation gives output shapes from
input shapes (so dynamic shapes need no recompile), and the backward is the same operator with
sin negated. Inside the node the kernel runs as in eager mode, launched on the current stream
with no host synchronisation, so the compiled graph can be captured in a CUDA graph
(``mode="reduce-overhead"``).

In eager mode the public functions call the kernels directly when no gradient is needed (the
dispatcher adds microseconds to a decode-sized call) and go through these operators when one is.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import rope_1d as _r1
from . import rope_2d as _r2
from . import rope_mrope as _mr
from . import rope_qk as _qk

LAUNCHERS = {"1d": _r1.rope_1d, "2d": _r2.rope_2d}


# --- TransformerEngine's apply_rotary_pos_emb(fused=True) ------------------------------------
@torch.library.custom_op("rope_kernels::rope", mutates_args=())
def rope(t: Tensor, freqs: Tensor, tensor_format: str, start_positions: Optional[Tensor],
         interleaved: bool, cu_seqlens: Optional[Tensor], cp_size: int, cp_rank: int,
         kernel: str, backward: bool) -> Tensor:
    return LAUNCHERS[kernel](t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                             cp_size, cp_rank, backward=backward)


@rope.register_fake
def _(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size, cp_rank,
      kernel, backward):
    return torch.empty_like(t, memory_format=torch.contiguous_format)


def _rope_setup(ctx, inputs, output):
    t, freqs, fmt, start_positions, interleaved, cu_seqlens, cp_size, cp_rank, kernel, bwd = inputs
    ctx.save_for_backward(freqs, start_positions, cu_seqlens)
    ctx.args = (fmt, interleaved, cp_size, cp_rank, kernel, bwd)


def _rope_backward(ctx, grad):
    freqs, start_positions, cu_seqlens = ctx.saved_tensors
    fmt, interleaved, cp_size, cp_rank, kernel, bwd = ctx.args
    # The gradient of R(theta) is R(theta)^T = R(-theta): the same kernel with sin negated.
    return (rope(grad, freqs, fmt, start_positions, interleaved, cu_seqlens, cp_size, cp_rank,
                 kernel, not bwd),) + (None,) * 9


rope.register_autograd(_rope_backward, setup_context=_rope_setup)


# --- TransformerEngine's apply_fused_qkv_rotary_pos_emb --------------------------------------
@torch.library.custom_op("rope_kernels::rope_qkv", mutates_args=())
def rope_qkv(qkv: Tensor, q_freqs: Tensor, k_freqs: Tensor, qkv_split_arg_list: List[int],
             tensor_format: str, start_positions: Optional[Tensor], interleaved: bool,
             cp_size: int, cp_rank: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _qk.rope_qkv(qkv, q_freqs, k_freqs, qkv_split_arg_list, tensor_format,
                        start_positions, interleaved, cp_size, cp_rank)


@rope_qkv.register_fake
def _(qkv, q_freqs, k_freqs, qkv_split_arg_list, tensor_format, start_positions, interleaved,
      cp_size, cp_rank):
    q_split, k_split, v_split = qkv_split_arg_list
    lead, h = qkv.shape[:2], qkv.shape[2]
    new = lambda *shape: qkv.new_empty(shape)  # noqa: E731
    return (new(*lead, h * (q_split // k_split), k_split), new(*lead, h, k_split),
            new(*lead, h, v_split))


@torch.library.custom_op("rope_kernels::rope_qkv_backward", mutates_args=())
def rope_qkv_backward(q_grad: Tensor, k_grad: Tensor, v_grad: Tensor, q_freqs: Tensor,
                      k_freqs: Tensor, qkv_split_arg_list: List[int], tensor_format: str,
                      start_positions: Optional[Tensor], interleaved: bool, cp_size: int,
                      cp_rank: int) -> Tensor:
    return _qk.rope_qkv_backward(q_grad, k_grad, v_grad, q_freqs, k_freqs, qkv_split_arg_list,
                                 tensor_format, start_positions, interleaved, cp_size, cp_rank)


@rope_qkv_backward.register_fake
def _(q_grad, k_grad, v_grad, q_freqs, k_freqs, qkv_split_arg_list, tensor_format,
      start_positions, interleaved, cp_size, cp_rank):
    lead, h = k_grad.shape[:2], k_grad.shape[2]
    return k_grad.new_empty((*lead, h, sum(qkv_split_arg_list)))


def _qkv_setup(ctx, inputs, output):
    qkv, q_freqs, k_freqs, splits, fmt, start_positions, interleaved, cp_size, cp_rank = inputs
    ctx.save_for_backward(q_freqs, k_freqs, start_positions)
    ctx.args = (list(splits), fmt, interleaved, cp_size, cp_rank)


def _qkv_backward(ctx, q_grad, k_grad, v_grad):
    q_freqs, k_freqs, start_positions = ctx.saved_tensors
    splits, fmt, interleaved, cp_size, cp_rank = ctx.args
    grad = rope_qkv_backward(q_grad, k_grad, v_grad, q_freqs, k_freqs, splits, fmt,
                             start_positions, interleaved, cp_size, cp_rank)
    return (grad,) + (None,) * 8


rope_qkv.register_autograd(_qkv_backward, setup_context=_qkv_setup)


def _qkv_backward_setup(ctx, inputs, output):
    # What rope_qkv's backward saves: its inputs after the three gradients are rope_qkv's after qkv.
    _qkv_setup(ctx, (None,) + tuple(inputs[3:]), output)


def _qkv_backward_backward(ctx, grad):
    # rope_qkv_backward rotates q and k by R(theta)^T and packs q, k and v into one tensor; its
    # transpose unpacks and rotates by R(theta): rope_qkv (create_graph=True).
    q_freqs, k_freqs, start_positions = ctx.saved_tensors
    splits, fmt, interleaved, cp_size, cp_rank = ctx.args
    q_grad, k_grad, v_grad = rope_qkv(grad, q_freqs, k_freqs, splits, fmt, start_positions,
                                      interleaved, cp_size, cp_rank)
    return (q_grad, k_grad, v_grad) + (None,) * 8


rope_qkv_backward.register_autograd(_qkv_backward_backward, setup_context=_qkv_backward_setup)


# --- FlashInfer/vLLM: apply_rope_with_cos_sin_cache(_inplace) --------------------------------
@torch.library.custom_op("rope_kernels::rope_cos_sin_cache", mutates_args=())
def rope_cos_sin_cache(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                       cos_sin_cache: Tensor, is_neox: bool, backward: bool
                       ) -> Tuple[Tensor, Tensor]:
    return _qk.rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox,
                                  backward=backward)


@rope_cos_sin_cache.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox, backward):
    return (torch.empty_like(query, memory_format=torch.contiguous_format),
            torch.empty_like(key, memory_format=torch.contiguous_format))


def _cache_setup(ctx, inputs, output):
    positions, query, key, head_size, cos_sin_cache, is_neox, bwd = inputs
    ctx.save_for_backward(positions, cos_sin_cache)
    ctx.args = (head_size, is_neox, bwd)


def _cache_backward(ctx, query_grad, key_grad):
    positions, cos_sin_cache = ctx.saved_tensors
    head_size, is_neox, bwd = ctx.args
    gq, gk = rope_cos_sin_cache(positions, query_grad, key_grad, head_size, cos_sin_cache,
                                is_neox, not bwd)
    return None, gq, gk, None, None, None, None


rope_cos_sin_cache.register_autograd(_cache_backward, setup_context=_cache_setup)


@torch.library.custom_op("rope_kernels::rope_cos_sin_cache_", mutates_args=("query", "key"))
def rope_cos_sin_cache_(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                        cos_sin_cache: Tensor, is_neox: bool) -> None:
    _qk.rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox,
                           query_out=query, key_out=key)


@rope_cos_sin_cache_.register_fake
def _(positions, query, key, head_size, cos_sin_cache, is_neox):
    return None


# --- vLLM's MRotaryEmbedding: apply_mrope_with_cos_sin_cache(_inplace) -----------------------
@torch.library.custom_op("rope_kernels::rope_mrope", mutates_args=())
def rope_mrope(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
               cos_sin_cache: Tensor, mrope_section: List[int], mrope_interleaved: bool,
               is_neox: bool, backward: bool) -> Tuple[Tensor, Tensor]:
    return _mr.rope_mrope(positions, query, key, head_size, cos_sin_cache, mrope_section,
                          mrope_interleaved, is_neox, backward=backward)


@rope_mrope.register_fake
def _(positions, query, key, head_size, cos_sin_cache, mrope_section, mrope_interleaved, is_neox,
      backward):
    return (torch.empty_like(query, memory_format=torch.contiguous_format),
            torch.empty_like(key, memory_format=torch.contiguous_format))


def _mrope_setup(ctx, inputs, output):
    positions, _, _, head_size, cos_sin_cache, section, interleaved, is_neox, bwd = inputs
    ctx.save_for_backward(positions, cos_sin_cache)
    ctx.args = (head_size, section, interleaved, is_neox, bwd)


def _mrope_backward(ctx, query_grad, key_grad):
    positions, cos_sin_cache = ctx.saved_tensors
    head_size, section, interleaved, is_neox, bwd = ctx.args
    # The kernel reads a head's channels contiguous; a gradient may come expanded (stride 0).
    query_grad, key_grad = (g if g.stride(-1) == 1 else g.contiguous()
                            for g in (query_grad, key_grad))
    gq, gk = rope_mrope(positions, query_grad, key_grad, head_size, cos_sin_cache, section,
                        interleaved, is_neox, not bwd)
    return None, gq, gk, None, None, None, None, None, None


rope_mrope.register_autograd(_mrope_backward, setup_context=_mrope_setup)


@torch.library.custom_op("rope_kernels::rope_mrope_", mutates_args=("query", "key"))
def rope_mrope_(positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                cos_sin_cache: Tensor, mrope_section: List[int], mrope_interleaved: bool,
                is_neox: bool) -> None:
    _mr.rope_mrope(positions, query, key, head_size, cos_sin_cache, mrope_section,
                   mrope_interleaved, is_neox, query_out=query, key_out=key)


@rope_mrope_.register_fake
def _(positions, query, key, head_size, cos_sin_cache, mrope_section, mrope_interleaved, is_neox):
    return None


# --- FlashInfer: apply_rope_pos_ids / apply_llama31_rope_pos_ids (and apply_rope's) ----------
# ``llama31``: [low_freq_factor, high_freq_factor, old_context_len], or None for plain RoPE.
def _inv_freq(q, rotary_dim, rope_scale, rope_theta, llama31):
    # (A table made here is not kept: under Inductor's CUDA graphs it is made in their pool.)
    return _qk.inv_freq_table(rotary_dim, rope_scale, rope_theta, q.device,
                              tuple(llama31) if llama31 is not None else None, keep=False)


@torch.library.custom_op("rope_kernels::rope_pos_ids", mutates_args=())
def rope_pos_ids(positions: Tensor, q: Tensor, k: Tensor, rotary_dim: int, interleave: bool,
                 rope_scale: float, rope_theta: float, llama31: Optional[List[float]],
                 backward: bool) -> Tuple[Tensor, Tensor]:
    return _qk.rope_pos_ids(positions, q, k, _inv_freq(q, rotary_dim, rope_scale, rope_theta,
                                                       llama31), interleave, backward=backward)


@rope_pos_ids.register_fake
def _(positions, q, k, rotary_dim, interleave, rope_scale, rope_theta, llama31, backward):
    return torch.empty_like(q), torch.empty_like(k)


def _pos_ids_setup(ctx, inputs, output):
    positions, q, k, *args = inputs
    ctx.save_for_backward(positions)
    ctx.args = args


def _pos_ids_backward(ctx, q_grad, k_grad):
    (positions,) = ctx.saved_tensors
    rotary_dim, interleave, rope_scale, rope_theta, llama31, bwd = ctx.args
    gq, gk = rope_pos_ids(positions, q_grad, k_grad, rotary_dim, interleave, rope_scale,
                          rope_theta, llama31, not bwd)
    return (None, gq, gk) + (None,) * 6


rope_pos_ids.register_autograd(_pos_ids_backward, setup_context=_pos_ids_setup)


@torch.library.custom_op("rope_kernels::rope_pos_ids_", mutates_args=("q", "k"))
def rope_pos_ids_(positions: Tensor, q: Tensor, k: Tensor, rotary_dim: int, interleave: bool,
                  rope_scale: float, rope_theta: float, llama31: Optional[List[float]]) -> None:
    _qk.rope_pos_ids(positions, q, k, _inv_freq(q, rotary_dim, rope_scale, rope_theta, llama31),
                     interleave, q_out=q, k_out=k)


@rope_pos_ids_.register_fake
def _(positions, q, k, rotary_dim, interleave, rope_scale, rope_theta, llama31):
    return None


@torch.library.custom_op("rope_kernels::ragged_positions", mutates_args=())
def ragged_positions(indptr: Tensor, offsets: Tensor, num_tokens: int) -> Tensor:
    return _qk.ragged_positions(indptr, offsets, num_tokens)


@ragged_positions.register_fake
def _(indptr, offsets, num_tokens):
    return indptr.new_empty(num_tokens, dtype=_qk.ragged_positions_dtype(indptr, offsets))


# --- Hugging Face: apply_rotary_pos_emb(q, k, cos, sin) ----------------------------------------
@torch.library.custom_op("rope_kernels::rope_cos_sin", mutates_args=())
def rope_cos_sin(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, heads_axis: int,
                 backward: bool, pairs: str) -> Tuple[Tensor, Tensor]:
    return _qk.rope_cos_sin(q, k, cos, sin, heads_axis, backward=backward, pairs=pairs)


@rope_cos_sin.register_fake
def _(q, k, cos, sin, heads_axis, backward, pairs):
    return _qk.hf_outputs(q, k, _qk.hf_rotary_dim(cos, pairs))


def _cos_sin_setup(ctx, inputs, output):
    q, k, cos, sin, heads_axis, bwd, pairs = inputs
    ctx.save_for_backward(cos, sin)
    ctx.args = (heads_axis, bwd, pairs)


def _cos_sin_backward(ctx, q_grad, k_grad):
    cos, sin = ctx.saved_tensors
    heads_axis, bwd, pairs = ctx.args
    gq, gk = rope_cos_sin(q_grad, k_grad, cos, sin, heads_axis, not bwd, pairs)
    return gq, gk, None, None, None, None, None


rope_cos_sin.register_autograd(_cos_sin_backward, setup_context=_cos_sin_setup)


@torch.library.custom_op("rope_kernels::rope_cos_sin_", mutates_args=("q", "k"))
def rope_cos_sin_(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, heads_axis: int,
                  pairs: str) -> None:
    _qk.rope_cos_sin(q, k, cos, sin, heads_axis, pairs=pairs, q_out=q, k_out=k)


@rope_cos_sin_.register_fake
def _(q, k, cos, sin, heads_axis, pairs):
    return None


# --- DeepSeek V4's apply_rotary_pos_emb: the last channels of each head rotated --------------
@torch.library.custom_op("rope_kernels::rope_trailing", mutates_args=())
def rope_trailing(x: Tensor, cos: Tensor, sin: Tensor, heads_axis: int, backward: bool,
                  pairs: str) -> Tensor:
    return _qk.rope_trailing(x, cos, sin, heads_axis, backward=backward, pairs=pairs)


@rope_trailing.register_fake
def _(x, cos, sin, heads_axis, backward, pairs):
    return x.new_empty(x.shape)


def _trailing_setup(ctx, inputs, output):
    x, cos, sin, heads_axis, bwd, pairs = inputs
    ctx.save_for_backward(cos, sin)
    ctx.args = (heads_axis, bwd, pairs)


def _trailing_backward(ctx, grad):
    # The copied channels' gradient is copied; the rotated ones' is rotated by R(theta)^T.
    cos, sin = ctx.saved_tensors
    heads_axis, bwd, pairs = ctx.args
    return rope_trailing(grad, cos, sin, heads_axis, not bwd, pairs), None, None, None, None, None


rope_trailing.register_autograd(_trailing_backward, setup_context=_trailing_setup)
