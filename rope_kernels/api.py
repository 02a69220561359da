"""The public entry points, each with the names, signature and semantics of the library it
replaces:

- ``apply_rotary_pos_emb`` and ``apply_fused_qkv_rotary_pos_emb``: TransformerEngine's.
  ``fused=False`` runs the naive PyTorch formula (``reference.rope_reference``); ``fused=True``
  runs a Triton kernel, the 2-D batch-reusing one unless ``kernel="1d"``.
- ``apply_rope_with_cos_sin_cache`` and ``..._inplace``: FlashInfer's (vLLM's convention).
- FlashInfer's other RoPE functions (positions, no cache): in ``flashinfer.py``.
- ``rope_kernels.hf.apply_rotary_pos_emb``: transformers' (in ``hf.py``).

Every one is differentiable where its original is, traceable by ``torch.compile(fullgraph=True)``
(through the operators of ``_ops.py``) and capturable in a CUDA graph. What is checked where:

- Types, shapes, dtypes, devices and flags: always, in eager mode once per call signature (then
  remembered), under ``torch.compile`` as guards of the compiled graph.
- Values of device tensors (``start_positions``, ``cu_seqlens``, ``positions``): in eager mode
  only, and only with ``validate=True`` (the default) and outside CUDA-graph capture, because
  they copy to the host (about 30 us, and a synchronisation). Under ``torch.compile`` and during
  capture they are not checked: out-of-range values then read outside the angle table.

Repeated eager calls take a shortcut (``_Shortcuts``): the first call of a signature runs the
whole path above and its one kernel launch is remembered; later calls with the same signature
(shapes, strides, dtypes, devices, flags, the input's address modulo 16 where it matters) skip
the checks already passed and the launcher's planning, and go from their arguments to the
launch (``_launch.Shortcut``; on triton 3.6 to 3.9, from the third call, through a launch plan
of the package's own C launcher). The shortcut is not taken where the full path does more than
one launch: autograd, torch.compile, value checks (``validate=True`` with ``start_positions`` or
``cu_seqlens``).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from . import _launch, _ops
from . import rope_mrope as _mr
from . import rope_qk as _qk
from ._validate import needs_grad as _needs_grad
from ._validate import (validate_cos_sin_cache_args, validate_in_place, validate_mrope_args,
                        validate_mrope_sections, validate_qkv_args, validate_rope_args)
from .reference import rope_reference
from .rope_1d import rope_1d
from .rope_2d import rope_2d

KERNELS: dict[str, Callable[..., torch.Tensor]] = {"1d": rope_1d, "2d": rope_2d}

_Tensor = torch.Tensor
_FLOAT32 = torch.float32


def _float32_angles(freqs):
    """Angles of another floating dtype as float32, as TransformerEngine's fused function takes
    them (its FusedRoPEFunc: ``if freqs.dtype != torch.float32: freqs = freqs.float()``): a
    table built in bf16 (a model cast to bf16 casts RotaryPositionEmbedding's ``inv_freq``
    buffer too) rotates as its float32 values. Anything else is left to the checks."""
    if isinstance(freqs, _Tensor) and freqs.dtype is not _FLOAT32 and freqs.is_floating_point():
        return freqs.float()
    return freqs


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class _Shortcuts:
    """Per eager call signature, the one launch the full path made (a ``_launch.Shortcut``: from
    the call's tensors to the kernel's pointer arguments and new outputs), or False where the
    full path did anything else (several launches, a tensor of its own making). Bounded like the
    plans.

    The entry points read ``entries`` inline (``entries.get(key)``, then ``entry(inputs)``): a
    method call per step is a measurable part of a decode-sized call.

    Before building its key, a call tries the ``recent`` signatures, the last few found by key,
    each ``(flags, check, entry)``: the call's flags (its entry point's tag, then every argument
    that is not a tensor, and which optional tensors are None) compared by value, then its
    tensors by ``check`` (``_launch.tensor_check``: their dtypes, devices, shapes and strides
    against the ones the key was built from; a None tensor is left out, the flags having said
    which are None). What the key holds is therefore what flags and check compare: a match is
    the entry the key would find, at a third of the cost of building and hashing the key. (The
    check also refuses one tensor object in two places, as torch.compile's guard does; such a
    call, q and k the same tensor for instance, simply takes the key.)
    """

    RECENT = 4  # signatures tried before the key: q and k of a layer, the QKV and cache calls

    def __init__(self):
        self.enabled = True  # False: every call takes the full path
        self.entries: dict = {}
        self.recent: tuple = ()

    def remember(self, flags, tensors, entry):
        """Put ``entry``, just found by its key for a call with these flags and tensors (the
        ones given, as the call's check will pass them), first among the ``recent`` signatures."""
        recent = self.recent
        if recent and recent[0][2] is entry:
            return
        check = entry.check
        if check is None:  # built once per entry, from the tensors of the first call found
            check = entry.check = _launch.tensor_check(tensors) or False
        if check:
            self.recent = ((flags, check, entry),
                           *[r for r in recent if r[2] is not entry][:self.RECENT - 1])

    def full_path(self, key, run, inputs, outputs_of):
        """``run()`` (the full path); with a ``key`` (the signature, not yet in ``entries``),
        while recording its launches, remembering them for ``key`` if there was one whose
        pointers are all among ``inputs`` and the new tensors ``outputs_of(result)``, by
        identity. (The recording is process-wide: a launch from another thread meanwhile fails
        the identity check, and the signature then simply keeps the full path.)"""
        if key is None:
            return run()
        recording = _launch.RECORDING = []
        try:
            result = run()
        finally:
            _launch.RECORDING = None
        entry = False
        if len(recording) == 1:
            kernel, plan, pointers = recording[0]
            outputs = tuple(outputs_of(result))
            tensors = (*inputs, *outputs)
            slots = [next((i for i, x in enumerate(tensors) if x is p), None) for p in pointers]
            if None not in slots and not any(o is x for o in outputs for x in inputs):
                entry = _launch.Shortcut(kernel, plan, slots,
                                         tuple((tuple(o.shape), o.stride(), o.dtype, o.device)
                                               for o in outputs))
        if len(self.entries) >= 4096:
            self.entries.clear()
        self.entries[key] = entry
        return result


_SHORTCUTS = _Shortcuts()
# Stand-in in fused QKV's tensor check for k_freqs when it is q_freqs' object (the guard refuses
# one tensor passed twice). A None tensor is left out of the check: the flags say which are None.
_SAME_TABLE = torch.empty(0)


def _tensor_meta(x):
    """Hashable metadata of a tensor argument, for a shortcut key (raises AttributeError for
    anything else, which then takes the full path)."""
    if type(x) is not _Tensor:
        raise AttributeError
    return (x.shape, x.stride(), x.dtype, x.device)


class RoPEFunction(torch.autograd.Function):
    """Autograd wrapper: forward applies R(theta), backward applies R(theta)^T = R(-theta)."""

    @staticmethod
    def forward(ctx, t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size,
                cp_rank, launcher, backward=False):
        ctx.save_for_backward(freqs, start_positions, cu_seqlens)
        ctx.args = (tensor_format, interleaved, cp_size, cp_rank, launcher, backward)
        return launcher(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                        cp_size, cp_rank, backward=backward)

    @staticmethod
    def backward(ctx, grad_out):
        freqs, start_positions, cu_seqlens = ctx.saved_tensors
        tensor_format, interleaved, cp_size, cp_rank, launcher, backward = ctx.args
        # grad_out may have any strides, stride 0 included (e.g. from `out.sum()`): the kernels
        # read it through its strides, no copy needed. Grad mode is on here only for
        # create_graph=True (a gradient penalty): then the same Function with sin negated, so
        # that the gradient is differentiable in turn; else the launcher alone (no bookkeeping).
        args = (grad_out, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                cp_size, cp_rank)
        if torch.is_grad_enabled():
            grad_t = RoPEFunction.apply(*args, launcher, not backward)
        else:
            grad_t = launcher(*args, backward=not backward)
        return grad_t, None, None, None, None, None, None, None, None, None


def apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    tensor_format: str = "sbhd",
    start_positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    fused: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    *,
    kernel: str = "2d",
    validate: bool = True,
) -> torch.Tensor:
    """Apply rotary position embedding to ``t``; a drop-in for TransformerEngine's function.

    Args:
        t: ``[s, b, h, d]`` (sbhd), ``[b, s, h, d]`` (bshd) or ``[total_tokens, h, d]`` (thd),
            float32, float16 or bfloat16 (any float dtype with ``fused=False``), any strides.
        freqs: angles ``[max_seq_len, 1, 1, rotary_dim]`` from ``RotaryPositionEmbedding``,
            float32 (``fused=True`` converts another float dtype to float32 first, as TE does;
            ``fused=False`` takes cos/sin in freqs' dtype, as TE's formula does, or in float64
            for a float64 ``t``); ``rotary_dim`` even and <= d. Channels past ``rotary_dim``
            are passed through.
        tensor_format: ``"sbhd"``, ``"bshd"`` or ``"thd"``.
        start_positions: int ``[b]`` (``[n_seqs]`` for thd): position of the first token of each
            sequence in the table (inference with a KV cache). Not with ``cp_size > 1``.
        interleaved: rotate channel pairs (2j, 2j+1) (GPT-J) instead of (j, j + rotary_dim/2).
        fused: run a Triton kernel (True) or the naive PyTorch code (False), as in TE.
        cu_seqlens: int32 ``[n_seqs + 1]`` cumulative sequence lengths, required for thd (the
            padded global lengths when ``cp_size > 1``).
        cp_size, cp_rank: context-parallel world size and this rank (dual-chunk slicing).
        kernel: ``"2d"`` (batch-reusing, the fast path) or ``"1d"`` (the simple kernel).
        validate: check argument values that live on the device (cu_seqlens, start_positions);
            this copies them to the host. Shapes, dtypes and devices are always checked.

    Returns:
        A new contiguous tensor of ``t``'s shape and dtype; ``t`` is never modified.
    """
    if fused is True:
        freqs = _float32_angles(freqs)
    key = None
    if (fused is True and type(t) is _Tensor and type(freqs) is _Tensor and _SHORTCUTS.enabled
            and (not validate or (start_positions is None and cu_seqlens is None))
            # Flags of exactly these types (others take the checks, which name a wrong one):
            # then a value that merely equals an accepted one (1 for True, True for 1, 1.0)
            # cannot share its key.
            and (interleaved is False or interleaved is True)
            and type(cp_size) is int and type(cp_rank) is int
            and (start_positions is None or type(start_positions) is _Tensor)
            and not _is_compiling()
            and not (_grad_enabled() and (t.requires_grad or freqs.requires_grad))):
        # An eager call that launches once: the shortcut's key is everything the checks and the
        # launcher's plan depend on (the address modulo 16: interleaved pairs read as words),
        # first tried as flags and a tensor check against the recent signatures.
        flags = ("te", tensor_format, interleaved, t.data_ptr() & 15 if interleaved else 0,
                 cp_size, cp_rank, kernel, start_positions is None, cu_seqlens is None)
        # The tensors given (flags say which are None; the check costs per tensor).
        guarded = (t, freqs) if start_positions is None else (t, freqs, start_positions)
        if cu_seqlens is not None:
            guarded += (cu_seqlens,)
        for known, check, entry in _SHORTCUTS.recent:
            if known == flags and check(*guarded):
                return entry((t, freqs, start_positions, cu_seqlens))[0]
        try:
            key = (flags, t.shape, t.stride(), t.dtype, t.device, freqs.shape, freqs.stride(),
                   freqs.dtype, freqs.device,
                   None if start_positions is None else (
                       start_positions.shape, start_positions.stride(), start_positions.dtype,
                       start_positions.device),
                   None if cu_seqlens is None else _tensor_meta(cu_seqlens))
            entry = _SHORTCUTS.entries.get(key)
        except (AttributeError, TypeError):  # an argument of another type: let the checks say
            key = entry = None
        if entry:
            _SHORTCUTS.remember(flags, guarded, entry)
            return entry((t, freqs, start_positions, cu_seqlens))[0]
        if entry is False:  # a signature whose full path is not one launch
            key = None
    compiling = torch.compiler.is_compiling()
    validate_rope_args(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size,
                       cp_rank, kernel_dtypes_only=fused,
                       check_values=_check_values(validate, t, compiling))
    if not fused:
        return rope_reference(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                              cp_size, cp_rank)
    launcher = KERNELS.get(kernel)
    if launcher is None:
        raise ValueError(f"kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    _no_grad_for("freqs", freqs, "the angles", "use fused=False to learn them")
    if compiling:  # one opaque operator in the graph, its backward registered with it
        return _ops.rope(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                         cp_size, cp_rank, kernel, False)
    if _needs_grad(t):
        return RoPEFunction.apply(t, freqs, tensor_format, start_positions, interleaved,
                                  cu_seqlens, cp_size, cp_rank, launcher)

    def run():
        return launcher(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens,
                        cp_size, cp_rank)

    return _SHORTCUTS.full_path(key, run, (t, freqs, start_positions, cu_seqlens),
                                lambda out: (out,))


def _check_values(validate: bool, t: torch.Tensor, compiling: bool) -> bool:
    """Value checks copy device tensors to the host: eager mode only, never during capture."""
    if not validate or compiling or not isinstance(t, torch.Tensor):
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _no_grad_for(name: str, x: torch.Tensor, what: str, instead: str) -> None:
    if _needs_grad(x):
        raise ValueError(f"{name} requires grad, but the fused kernels give no gradient for "
                         f"{what}: pass {name}.detach(), or {instead}")


def apply_fused_qkv_rotary_pos_emb(
    qkv: torch.Tensor,
    q_freqs: torch.Tensor,
    k_freqs: torch.Tensor,
    qkv_split_arg_list: Sequence[int],
    tensor_format: str = "sbhd",
    start_positions: Optional[torch.Tensor] = None,
    interleaved: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    cp_size: int = 1,
    cp_rank: int = 0,
    *,
    validate: bool = True,
):
    """RoPE on q and k of a packed QKV projection, and v split off: TransformerEngine's function.

    Args:
        qkv: ``[s, b, h, q_split + k_split + v_split]`` (sbhd) or ``[b, s, h, ...]`` (bshd),
            float32/float16/bfloat16, any strides. Each of the h groups holds ``q_split /
            k_split`` query heads, one key head and one value head.
        q_freqs, k_freqs: angles ``[max_seq_len, 1, 1, rotary_dim]``, ``rotary_dim <= k_split``;
            same shape; float32 (another float dtype is converted to float32 first, as for
            ``apply_rotary_pos_emb(fused=True)``).
        qkv_split_arg_list: ``[q_split, k_split, v_split]``: widths of q, k and v per group;
            ``k_split`` is the head size and divides ``q_split``.
        tensor_format: ``"sbhd"`` or ``"bshd"`` (``"thd"`` raises, as in TransformerEngine).
        start_positions, interleaved, cp_size, cp_rank: as in ``apply_rotary_pos_emb``.
        cu_seqlens: must be None (no packed input).
        validate: check ``start_positions`` values (a copy to the host), as in
            ``apply_rotary_pos_emb``.

    Returns:
        New contiguous ``(q, k, v)``: ``q [s, b, h * q_split / k_split, k_split]``, ``k [s, b,
        h, k_split]``, ``v [s, b, h, v_split]`` (bshd: first two axes exchanged). One kernel
        launch; differentiable (the backward, one launch too, returns a new contiguous
        qkv-shaped gradient).
    """
    if k_freqs is q_freqs:  # one table for both: keep it one object (the plan compares them)
        q_freqs = k_freqs = _float32_angles(q_freqs)
    else:
        q_freqs, k_freqs = _float32_angles(q_freqs), _float32_angles(k_freqs)
    sig = None
    if (type(qkv) is _Tensor and type(q_freqs) is _Tensor and type(k_freqs) is _Tensor
            and _SHORTCUTS.enabled and cu_seqlens is None
            and (not validate or start_positions is None)
            # Flags and splits of exactly these types, as in apply_rotary_pos_emb.
            and (interleaved is False or interleaved is True)
            and type(cp_size) is int and type(cp_rank) is int
            and (start_positions is None or type(start_positions) is _Tensor)
            and type(qkv_split_arg_list) in (list, tuple) and len(qkv_split_arg_list) == 3
            and not _is_compiling()
            and not (_grad_enabled() and (qkv.requires_grad or q_freqs.requires_grad
                                          or k_freqs.requires_grad))):
        q_split, k_split, v_split = qkv_split_arg_list
        if type(q_split) is int and type(k_split) is int and type(v_split) is int:
            # (Whether q and k read one table decides the plan: their addresses are compared.)
            # (Interleaved pairs: whether qkv's address allows reading them as words, too.)
            flags = ("qkv", q_freqs.data_ptr() == k_freqs.data_ptr(), q_split, k_split, v_split,
                     tensor_format, interleaved, cp_size, cp_rank, start_positions is None,
                     interleaved and _qk._aligned(qkv))
            guarded = (qkv, q_freqs, _SAME_TABLE if k_freqs is q_freqs else k_freqs)
            if start_positions is not None:
                guarded += (start_positions,)
            for known, check, entry in _SHORTCUTS.recent:
                if known == flags and check(*guarded):
                    q, k, v = entry((qkv, q_freqs, k_freqs, start_positions))
                    return q, k, v
            sig = (flags, qkv.shape, qkv.stride(), qkv.dtype, qkv.device, q_freqs.shape,
                   q_freqs.stride(), q_freqs.dtype, q_freqs.device, k_freqs.shape,
                   k_freqs.stride(), k_freqs.dtype, k_freqs.device,
                   None if start_positions is None else _tensor_meta(start_positions))
            try:
                entry = _SHORTCUTS.entries.get(sig)
            except TypeError:  # an unhashable tensor_format: let the checks name it
                sig = entry = None
            if entry:
                _SHORTCUTS.remember(flags, guarded, entry)
                q, k, v = entry((qkv, q_freqs, k_freqs, start_positions))
                return q, k, v
            if entry is False:  # a signature whose full path is not one launch
                sig = None
    compiling = torch.compiler.is_compiling()
    validate_qkv_args(qkv, q_freqs, k_freqs, qkv_split_arg_list, tensor_format, start_positions,
                      interleaved, cu_seqlens, cp_size, cp_rank,
                      check_values=_check_values(validate, qkv, compiling))
    _no_grad_for("q_freqs", q_freqs, "the angles", "use apply_rotary_pos_emb(fused=False)")
    _no_grad_for("k_freqs", k_freqs, "the angles", "use apply_rotary_pos_emb(fused=False)")
    splits = [int(n) for n in qkv_split_arg_list]
    if compiling or _needs_grad(qkv):
        return _ops.rope_qkv(qkv, q_freqs, k_freqs, splits, tensor_format, start_positions,
                             interleaved, cp_size, cp_rank)

    def run():
        return _qk.rope_qkv(qkv, q_freqs, k_freqs, splits, tensor_format, start_positions,
                            interleaved, cp_size, cp_rank)

    return _SHORTCUTS.full_path(sig, run, (qkv, q_freqs, k_freqs, start_positions),
                                lambda out: out)


def apply_rope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    *,
    validate: bool = True,
):
    """RoPE on query and key at per-token positions, from a cos/sin cache: FlashInfer's function.

    Args:
        positions: int32/int64 ``[num_tokens]``, any order (each token's position).
        query: ``[num_tokens, num_q_heads * head_size]`` (last axis contiguous; a view into a
            packed qkv buffer is fine).
        key: ``[num_tokens, num_k_heads * head_size]``: as many or fewer heads (grouped-query).
        head_size: channels per head.
        cos_sin_cache: float32 ``[max_position, rotary_dim]``: ``cos`` in the first
            ``rotary_dim / 2`` columns of a row, ``sin`` in the rest; ``rotary_dim <= head_size``
            (channels past it are copied).
        is_neox: True for half-split pairs (j, j + rotary_dim/2), False for GPT-J's interleaved
            pairs (2j, 2j+1).
        validate: check that every position lies inside the cache (a copy to the host; eager
            mode only, outside CUDA-graph capture).

    Returns:
        New contiguous ``(query_out, key_out)`` of the inputs' shapes, from one kernel launch;
        the inputs are not modified. Differentiable with respect to query and key.
    """
    sig, entry = _cache_shortcut(positions, query, key, head_size, cos_sin_cache, is_neox,
                                 validate, False)
    if entry:
        query_out, key_out = entry((positions, query, key, cos_sin_cache))
        return query_out, key_out
    compiling = torch.compiler.is_compiling()
    validate_cos_sin_cache_args(positions, query, key, head_size, cos_sin_cache, is_neox,
                                check_values=_check_values(validate, query, compiling))
    _no_grad_for("cos_sin_cache", cos_sin_cache, "the cache", "detach it")
    if compiling or _needs_grad(query, key):
        return _ops.rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox,
                                       False)

    def run():
        return _qk.rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox)

    return _SHORTCUTS.full_path(sig, run, (positions, query, key, cos_sin_cache),
                                lambda out: out)


def _cache_shortcut(positions, query, key, head_size, cos_sin_cache, is_neox, validate,
                    in_place):
    """(the shortcut key of an eager apply_rope_with_cos_sin_cache(_inplace) call or None, its
    entry or None): the key is None where the call cannot take the shortcut, its full path is
    not one launch or a recent signature answered it (the entry then given), the entry None
    where it is not known yet."""
    if (not _SHORTCUTS.enabled or type(query) is not _Tensor or type(key) is not _Tensor
            or type(cos_sin_cache) is not _Tensor
            or (validate and positions.numel() if type(positions) is _Tensor else True)
            # (Flags of exactly these types, as in apply_rotary_pos_emb.)
            or type(head_size) is not int or not (is_neox is True or is_neox is False)
            or _is_compiling()
            or (_grad_enabled() and (query.requires_grad or key.requires_grad
                                     or cos_sin_cache.requires_grad))):
        return None, None
    # (Interleaved pairs: whether the addresses allow reading them as words decides the plan.)
    flags = ("cache", head_size, is_neox, in_place,
             not is_neox and _qk._aligned(query, key))
    return _cache_entry(flags, positions, query, key, cos_sin_cache)


def _cache_entry(flags, positions, query, key, cos_sin_cache):
    """The shortcut of a cache call (plain or M-RoPE) with these flags and tensors: (its key or
    None, its entry or None), as ``_cache_shortcut`` says; a recent signature tried first."""
    for known, check, entry in _SHORTCUTS.recent:
        if known == flags and check(positions, query, key, cos_sin_cache):
            return None, entry
    sig = (flags, query.shape, query.stride(), query.dtype, query.device, key.shape,
           key.stride(), key.dtype, key.device, positions.shape, positions.stride(),
           positions.dtype, positions.device, cos_sin_cache.shape, cos_sin_cache.stride(),
           cos_sin_cache.dtype, cos_sin_cache.device)
    entry = _SHORTCUTS.entries.get(sig)
    if entry:
        _SHORTCUTS.remember(flags, (positions, query, key, cos_sin_cache), entry)
    return (None if entry is False else sig), entry


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    *,
    validate: bool = True,
) -> None:
    """``apply_rope_with_cos_sin_cache`` writing into ``query`` and ``key`` (FlashInfer's
    in-place variant, what vLLM calls): one launch, no allocation, not differentiable. Channels
    past ``rotary_dim`` are neither read nor written, as FlashInfer's and vLLM's kernels leave
    them. Raises ValueError for query or key that need a gradient (use
    ``apply_rope_with_cos_sin_cache``), for one tensor given as both, and for a query or key
    whose elements share memory (a stride of 0); views of one packed qkv buffer are fine."""
    sig, entry = _cache_shortcut(positions, query, key, head_size, cos_sin_cache, is_neox,
                                 validate, True)
    if entry:
        entry((positions, query, key, cos_sin_cache))
        return
    compiling = torch.compiler.is_compiling()
    validate_cos_sin_cache_args(positions, query, key, head_size, cos_sin_cache, is_neox,
                                check_values=_check_values(validate, query, compiling))
    validate_in_place("apply_rope_with_cos_sin_cache_inplace", "apply_rope_with_cos_sin_cache",
                      query=query, key=key)
    if compiling:
        _ops.rope_cos_sin_cache_(positions, query, key, head_size, cos_sin_cache, is_neox)
        return

    def run():
        _qk.rope_cos_sin_cache(positions, query, key, head_size, cos_sin_cache, is_neox,
                               query_out=query, key_out=key)

    _SHORTCUTS.full_path(sig, run, (positions, query, key, cos_sin_cache), lambda _: ())


def apply_mrope_with_cos_sin_cache(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    *,
    mrope_section: Sequence[int],
    mrope_interleaved: bool = False,
    validate: bool = True,
):
    """Multimodal RoPE (M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V) on query and key from a
    cos/sin cache: vLLM's and SGLang's ``MRotaryEmbedding``, with FlashInfer's arguments.

    Each token has three positions (time, height, width); the rotary pairs are split into three
    sections and pair j turns by the angle of its section's position (``rope_mrope``'s
    docstring has the rule, contiguous or interleaved). The results are those of vLLM's
    ``MRotaryEmbedding.forward_native`` with ``cos_sin_cache`` as its cache.

    Args:
        positions: int32/int64 ``[3, num_tokens]`` (T, H and W positions, any order and
            strides), or ``[num_tokens]`` for text only: then every pair takes that position and
            the call is ``apply_rope_with_cos_sin_cache``'s.
        query: ``[num_tokens, num_q_heads * head_size]`` (or ``[num_tokens, num_q_heads,
            head_size]``); a head's channels contiguous, the other strides free.
        key: likewise with its own head count (grouped-query attention: fewer heads).
        head_size: channels per head.
        cos_sin_cache: float32 ``[max_position, rotary_dim]``, cos in the first half of a row
            and sin in the second; ``rotary_dim <= head_size`` (the rest of a head is copied).
        is_neox: True for half-split pairs (j, j + rotary_dim/2), False for GPT-J's
            interleaved pairs (2j, 2j+1).
        mrope_section: ``[t, h, w]``, pairs on each axis; they add up to ``rotary_dim / 2``
            (Qwen2-VL's ``[16, 24, 24]``, Qwen3-VL's ``[24, 20, 20]``).
        mrope_interleaved: Qwen3-VL's sections, T H W T H W ... (vLLM's ``mrope_interleaved``),
            else contiguous (T's pairs, then H's, then W's).
        validate: check that every position lies inside the cache (a copy to the host; eager
            mode only, outside CUDA-graph capture).

    Returns:
        New contiguous ``(query_out, key_out)`` of the inputs' shapes, from one kernel launch;
        the inputs are not modified. Differentiable with respect to query and key.
    """
    if _text_only(positions, cos_sin_cache, mrope_section, mrope_interleaved):
        return apply_rope_with_cos_sin_cache(positions, query, key, head_size, cos_sin_cache,
                                             is_neox, validate=validate)
    sig, entry = _mrope_shortcut(positions, query, key, head_size, cos_sin_cache, is_neox,
                                 mrope_section, mrope_interleaved, validate, False)
    if entry:
        query_out, key_out = entry((positions, query, key, cos_sin_cache))
        return query_out, key_out
    compiling = torch.compiler.is_compiling()
    validate_mrope_args(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                        mrope_interleaved, _check_values(validate, query, compiling))
    _no_grad_for("cos_sin_cache", cos_sin_cache, "the cache", "detach it")
    if compiling or _needs_grad(query, key):
        return _ops.rope_mrope(positions, query, key, head_size, cos_sin_cache,
                               list(mrope_section), mrope_interleaved, is_neox, False)

    def run():
        return _mr.rope_mrope(positions, query, key, head_size, cos_sin_cache, mrope_section,
                              mrope_interleaved, is_neox)

    return _SHORTCUTS.full_path(sig, run, (positions, query, key, cos_sin_cache),
                                lambda out: out)


def apply_mrope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    *,
    mrope_section: Sequence[int],
    mrope_interleaved: bool = False,
    validate: bool = True,
) -> None:
    """``apply_mrope_with_cos_sin_cache`` writing into ``query`` and ``key`` (what vLLM's
    ``MRotaryEmbedding.forward_cuda`` does to its inputs): one launch, no allocation, not
    differentiable. Channels past ``rotary_dim`` are neither read nor written. Raises ValueError
    for query or key that need a gradient, for one tensor given as both, and for a query or key
    whose elements share memory (a stride of 0)."""
    if _text_only(positions, cos_sin_cache, mrope_section, mrope_interleaved):
        apply_rope_with_cos_sin_cache_inplace(positions, query, key, head_size, cos_sin_cache,
                                              is_neox, validate=validate)
        return
    sig, entry = _mrope_shortcut(positions, query, key, head_size, cos_sin_cache, is_neox,
                                 mrope_section, mrope_interleaved, validate, True)
    if entry:
        entry((positions, query, key, cos_sin_cache))
        return
    compiling = torch.compiler.is_compiling()
    validate_mrope_args(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                        mrope_interleaved, _check_values(validate, query, compiling))
    validate_in_place("apply_mrope_with_cos_sin_cache_inplace", "apply_mrope_with_cos_sin_cache",
                      query=query, key=key)
    if compiling:
        _ops.rope_mrope_(positions, query, key, head_size, cos_sin_cache, list(mrope_section),
                         mrope_interleaved, is_neox)
        return

    def run():
        _mr.rope_mrope(positions, query, key, head_size, cos_sin_cache, mrope_section,
                       mrope_interleaved, is_neox, query_out=query, key_out=key)

    _SHORTCUTS.full_path(sig, run, (positions, query, key, cos_sin_cache), lambda _: ())


def _mrope_shortcut(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                    mrope_interleaved, validate, in_place):
    """``_cache_shortcut`` for apply_mrope_with_cos_sin_cache(_inplace): (the shortcut key or
    None, its entry or None)."""
    if (not _SHORTCUTS.enabled or type(query) is not _Tensor or type(key) is not _Tensor
            or type(cos_sin_cache) is not _Tensor or type(positions) is not _Tensor
            or (validate and positions.numel())
            # (Flags of exactly these types: a section of floats equal to ints takes the full
            # path, which names it.)
            or type(head_size) is not int or not (is_neox is True or is_neox is False)
            or not (mrope_interleaved is True or mrope_interleaved is False)
            or type(mrope_section) not in (list, tuple)
            or not all(type(x) is int for x in mrope_section)
            or _is_compiling()
            or (_grad_enabled() and (query.requires_grad or key.requires_grad
                                     or cos_sin_cache.requires_grad))):
        return None, None
    flags = ("mrope", head_size, is_neox, tuple(mrope_section), mrope_interleaved, in_place)
    return _cache_entry(flags, positions, query, key, cos_sin_cache)


def _text_only(positions, cos_sin_cache, mrope_section, mrope_interleaved) -> bool:
    """Whether the positions are text-only ([num_tokens]): vLLM's MRotaryEmbedding then rotates
    as plain RoPE, the cache call, whose checks and shortcut take the call. The sections are
    checked here all the same (comparisons only, nothing a repeated call need not do), so that
    bad sections raise whatever the positions' shape; a cache that is not 2-D is left to the
    cache call's check, which names it."""
    if not (isinstance(positions, torch.Tensor) and positions.dim() == 1):
        return False
    if isinstance(cos_sin_cache, torch.Tensor) and cos_sin_cache.dim() == 2:
        validate_mrope_sections(mrope_section, mrope_interleaved, cos_sin_cache.shape[1])
    return True

