"""FlashInfer's RoPE functions (``flashinfer.rope``) with their names, signatures and semantics, so
that serving code written against FlashInfer runs on these kernels, on a GPU or (interpreted) on
a CPU::

    import rope_kernels.flashinfer as flashinfer
    q_rope, k_rope = flashinfer.apply_rope_pos_ids(q, k, pos_ids)        # per-token positions
    flashinfer.apply_llama31_rope_pos_ids_inplace(q, k, pos_ids)         # Llama 3.1's frequencies
    q_rope, k_rope = flashinfer.apply_rope(q, k, indptr, offsets)        # a ragged batch
    q, k = flashinfer.apply_rope_with_cos_sin_cache(positions, q, k, head_size, cos_sin_cache)

``q`` is ``[nnz, num_q_heads, head_dim]`` and ``k`` ``[nnz, num_k_heads, head_dim]`` (fewer k
heads for grouped-query attention; any strides, views into a packed qkv buffer included). The
first ``rotary_dim`` channels of each head turn (all of them by default), the rest pass
through; ``interleave=True`` pairs channels (2j, 2j+1), else (j, j + rotary_dim/2). The angles
are computed in the kernel, as FlashInfer's are: pair j of a token at position p turns by
``float32(p) * f_j`` (a float32 product), with ``f_j = rope_theta ** (-2j / rotary_dim) /
rope_scale`` (computed in float64 and rounded to float32 once), or Llama 3.1's blend of
``f_j / rope_scale`` and ``f_j`` (``rope_qk.inv_freq_table``). Where FlashInfer's kernels take
cos and sin from fast approximate intrinsics, these use accurate ones for float32 tensors and the
SFU's after a range reduction for 16-bit ones (about 1e-6, below the outputs' rounding).

Differences a caller can see, all additions:
- the out-of-place functions are differentiable with respect to q and k (the backward is the
  same kernel with sin negated); FlashInfer's are not;
- ``apply_rope`` and ``apply_llama31_rope`` (and their in-place twins) check ``indptr`` on the
  host in eager mode (``validate=True``, a keyword of their own), which copies it there;
- bad input raises a TypeError or ValueError naming the argument.

The ``pos_ids`` functions are one launch each, and repeated eager calls take the package's
shortcut (``rope_kernels.api``). The ``indptr`` ones launch a small kernel first that gives each
token its position (``rope_qk.ragged_positions``: a binary search of indptr), then the same one.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _ops
from . import api as _api
from . import rope_qk as _qk
from ._validate import needs_grad as _needs_grad
from ._validate import validate_in_place, validate_indptr, validate_pos_ids_args
from .api import (_Tensor, _grad_enabled, _is_compiling, apply_rope_with_cos_sin_cache,
                  apply_rope_with_cos_sin_cache_inplace)

__all__ = [
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]

_NUMBER = (int, float)
_RECENT_TABLES: dict = {}  # a shortcut's flags -> the frequency table its last call found


def _table(q, rotary_dim, rope_scale, rope_theta, llama31, create=True):
    return _qk.inv_freq_table(q.shape[-1] if rotary_dim is None else rotary_dim, rope_scale,
                              rope_theta, q.device, llama31, create)


def _shortcut(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta, llama31, in_place):
    """(the shortcut key of an eager pos_ids call or None, its entry or None, the frequency
    table or None), as ``api._cache_shortcut``: the key None where the call cannot take the
    shortcut or a recent signature answered it (the entry then given)."""
    shortcuts = _api._SHORTCUTS
    if (not shortcuts.enabled or type(q) is not _Tensor or type(k) is not _Tensor
            or type(pos_ids) is not _Tensor
            # (Flags of exactly these types: anything else takes the full path, which names it.)
            or not (interleave is True or interleave is False)
            or not (rotary_dim is None or type(rotary_dim) is int)
            or type(rope_scale) not in _NUMBER or type(rope_theta) not in _NUMBER
            or (llama31 is not None and any(type(x) not in _NUMBER for x in llama31))
            or _is_compiling() or (_grad_enabled() and (q.requires_grad or k.requires_grad))):
        return None, None, None
    flags = ("pos_ids", rotary_dim, interleave, rope_scale, rope_theta, llama31, in_place,
             interleave and _qk._aligned(q, k))
    # The table of the last signature found with these flags: a recent signature's check then
    # also checks that it is on q's device.
    table = _RECENT_TABLES.get(flags)
    if table is not None:
        for known, check, entry in shortcuts.recent:
            if known == flags and check(pos_ids, q, k, table):
                return None, entry, table
    # The table a full-path call made (after its checks), or None: then the full path makes it
    # (and records the launch under the key, if it is the signature's first call).
    table = _table(q, rotary_dim, rope_scale, rope_theta, llama31, create=False)
    sig = (flags, q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device,
           pos_ids.shape, pos_ids.stride(), pos_ids.dtype, pos_ids.device)
    entry = shortcuts.entries.get(sig)
    if entry and table is not None:
        shortcuts.remember(flags, (pos_ids, q, k, table), entry)
        if len(_RECENT_TABLES) >= 64:
            _RECENT_TABLES.clear()
        _RECENT_TABLES[flags] = table
        return sig, entry, table
    return (None if entry is not None else sig), None, table


def _pos_ids_call(function, twin, q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                  llama31, in_place):
    """The pos_ids functions: FlashInfer's results, or None in place."""
    sig, entry, table = _shortcut(q, k, pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                                  llama31, in_place)
    if entry:
        if in_place:
            entry((pos_ids, q, k, table))
            return None
        q_rope, k_rope = entry((pos_ids, q, k, table))
        return q_rope, k_rope
    validate_pos_ids_args(function, q, k, "pos_ids", pos_ids, rotary_dim, interleave, rope_scale,
                          rope_theta, llama31)
    if in_place:
        validate_in_place(function, twin, q=q, k=k)
    if _is_compiling() or (not in_place and _needs_grad(q, k)):
        return _through_ops(pos_ids, q, k, rotary_dim, interleave, rope_scale, rope_theta,
                            llama31, in_place)
    if table is None:
        table = _table(q, rotary_dim, rope_scale, rope_theta, llama31)

    def run():
        return _rotate(pos_ids, q, k, table, interleave, in_place)

    return _api._SHORTCUTS.full_path(sig, run, (pos_ids, q, k, table),
                                     (lambda _: ()) if in_place else (lambda out: out))


def _rotate(positions, q, k, table, interleave, in_place):
    """The eager launch of both families: new ``(q_rope, k_rope)``, or None written in place."""
    if in_place:
        _qk.rope_pos_ids(positions, q, k, table, interleave, q_out=q, k_out=k)
        return None
    return _qk.rope_pos_ids(positions, q, k, table, interleave)


def _through_ops(positions, q, k, rotary_dim, interleave, rope_scale, rope_theta, llama31,
                 in_place):
    """The call as the package's operators (torch.compile, autograd): numbers as floats."""
    args = (q.shape[-1] if rotary_dim is None else rotary_dim, interleave, float(rope_scale),
            float(rope_theta), [float(x) for x in llama31] if llama31 is not None else None)
    if in_place:
        _ops.rope_pos_ids_(positions, q, k, *args)
        return None
    return _ops.rope_pos_ids(positions, q, k, *args, False)


def _ragged_call(function, twin, q, k, indptr, offsets, rotary_dim, interleave, rope_scale,
                 rope_theta, llama31, in_place, validate):
    """The indptr functions: each token's position (one small launch), then the pos_ids path."""
    validate_pos_ids_args(function, q, k, "offsets", offsets, rotary_dim, interleave, rope_scale,
                          rope_theta, llama31, indptr=indptr)
    if in_place:
        validate_in_place(function, twin, q=q, k=k)
    compiling = _is_compiling()
    if (validate and not compiling
            and not (indptr.is_cuda and torch.cuda.is_current_stream_capturing())):
        validate_indptr(indptr, q.shape[0])
    if compiling or (not in_place and _needs_grad(q, k)):
        positions = _ops.ragged_positions(indptr, offsets, q.shape[0])
        return _through_ops(positions, q, k, rotary_dim, interleave, rope_scale, rope_theta,
                            llama31, in_place)
    positions = _qk.ragged_positions(indptr, offsets, q.shape[0])
    return _rotate(positions, q, k, _table(q, rotary_dim, rope_scale, rope_theta, llama31),
                   interleave, in_place)


def apply_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
):
    """RoPE on q and k at per-token positions, the angles computed in the kernel: FlashInfer's
    ``apply_rope_pos_ids``.

    Args:
        q: ``[nnz, num_q_heads, head_dim]`` float32, float16 or bfloat16.
        k: ``[nnz, num_k_heads, head_dim]``, q's dtype and device.
        pos_ids: int32/int64 ``[nnz]``, each token's position (any order, any value: there is no
            table to stay inside).
        rotary_dim: channels rotated per head (even); None for all of them.
        interleave: pairs (2j, 2j+1) if True, else (j, j + rotary_dim/2).
        rope_scale: positions are divided by it (linear position interpolation).
        rope_theta: the base of the frequencies.

    Returns:
        New ``(q_rope, k_rope)`` (``torch.empty_like`` of q and k, as FlashInfer allocates),
        from one launch; q and k are not modified. Differentiable with respect to q and k.
    """
    return _pos_ids_call("apply_rope_pos_ids", "apply_rope_pos_ids", q, k, pos_ids, rotary_dim,
                         interleave, rope_scale, rope_theta, None, False)


def apply_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
) -> None:
    """``apply_rope_pos_ids`` writing into q and k: one launch, no allocation, not
    differentiable; channels past ``rotary_dim`` are neither read nor written. Raises
    ValueError for q or k that need a gradient, for one tensor given as both, and for a tensor
    whose elements share memory (a stride of 0)."""
    _pos_ids_call("apply_rope_pos_ids_inplace", "apply_rope_pos_ids", q, k, pos_ids, rotary_dim,
                  interleave, rope_scale, rope_theta, None, True)


def apply_llama31_rope_pos_ids(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
):
    """``apply_rope_pos_ids`` with Llama 3.1's frequencies: FlashInfer's
    ``apply_llama31_rope_pos_ids``. A pair whose wavelength ``2 pi / f`` is longer than
    ``old_context_len / low_freq_factor`` turns by ``f / rope_scale``, one shorter than
    ``old_context_len / high_freq_factor`` by ``f``, one between by a blend of the two
    (transformers' rope_type "llama3" computes the same frequencies)."""
    return _pos_ids_call("apply_llama31_rope_pos_ids", "apply_llama31_rope_pos_ids", q, k,
                         pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                         (low_freq_factor, high_freq_factor, old_context_len), False)


def apply_llama31_rope_pos_ids_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    pos_ids: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
) -> None:
    """``apply_llama31_rope_pos_ids`` writing into q and k (as ``apply_rope_pos_ids_inplace``)."""
    _pos_ids_call("apply_llama31_rope_pos_ids_inplace", "apply_llama31_rope_pos_ids", q, k,
                  pos_ids, rotary_dim, interleave, rope_scale, rope_theta,
                  (low_freq_factor, high_freq_factor, old_context_len), True)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
    *,
    validate: bool = True,
):
    """RoPE on a ragged batch of q and k: FlashInfer's ``apply_rope``. Segment b is tokens
    ``indptr[b] .. indptr[b+1] - 1`` (``indptr`` int ``[batch_size + 1]``, from 0 to nnz), and
    its first token is at position ``offsets[b]`` (int ``[batch_size]``), the next at
    ``offsets[b] + 1``, and so on. Other arguments and the results as ``apply_rope_pos_ids``.
    ``validate`` (this package's keyword): check indptr's values, a copy to the host (eager mode
    only, outside CUDA-graph capture)."""
    return _ragged_call("apply_rope", "apply_rope", q, k, indptr, offsets, rotary_dim,
                        interleave, rope_scale, rope_theta, None, False, validate)


def apply_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 1,
    rope_theta: float = 1e4,
    *,
    validate: bool = True,
) -> None:
    """``apply_rope`` writing into q and k (as ``apply_rope_pos_ids_inplace``)."""
    _ragged_call("apply_rope_inplace", "apply_rope", q, k, indptr, offsets, rotary_dim,
                 interleave, rope_scale, rope_theta, None, True, validate)


def apply_llama31_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
    *,
    validate: bool = True,
):
    """``apply_rope`` with Llama 3.1's frequencies (``apply_llama31_rope_pos_ids``)."""
    return _ragged_call("apply_llama31_rope", "apply_llama31_rope", q, k, indptr, offsets,
                        rotary_dim, interleave, rope_scale, rope_theta,
                        (low_freq_factor, high_freq_factor, old_context_len), False, validate)


def apply_llama31_rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor,
    indptr: torch.Tensor,
    offsets: torch.Tensor,
    rotary_dim: Optional[int] = None,
    interleave: bool = False,
    rope_scale: float = 8,
    rope_theta: float = 5e5,
    low_freq_factor: float = 1,
    high_freq_factor: float = 4,
    old_context_len: int = 8192,
    *,
    validate: bool = True,
) -> None:
    """``apply_llama31_rope`` writing into q and k (as ``apply_rope_pos_ids_inplace``)."""
    _ragged_call("apply_llama31_rope_inplace", "apply_llama31_rope", q, k, indptr, offsets,
                 rotary_dim, interleave, rope_scale, rope_theta,
                 (low_freq_factor, high_freq_factor, old_context_len), True, validate)
