"""Input validation shared by every RoPE entry point of the package.

Each failure raises TypeError (wrong kind of object or dtype) or ValueError (wrong shape or value)
whose message names the argument, what was expected and what was given. Checks that need the
*values* of device tensors (cu_seqlens, start_positions) copy them to the host, which synchronises
with the GPU; ``check_values=False`` skips those (and only those).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FORMATS = ("sbhd", "bshd", "thd")
_INT_DTYPES = (torch.int32, torch.int64)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}"


def _int_vector(name: str, x, length: Optional[int], device: torch.device, what: str,
                other: str = "t") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor ({what}), got {_describe(x)}")
    if x.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must have dtype torch.int32 or torch.int64, got {x.dtype}")
    if x.dim() != 1 or (length is not None and x.numel() != length):
        want = f"[{length}]" if length is not None else "1-D"
        raise ValueError(f"{name} must have shape {want} ({what}), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on the same device as {other} ({device}), got "
                         f"{x.device}")


_VALIDATED: set = set()  # call signatures whose metadata passed (bounded: cleared past 4096)


def _meta(x):
    """Hashable metadata of an optional tensor argument (its type if it is no tensor)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype, x.device)
    return type(x)


def _remembered(key, check) -> None:
    """Run ``check()`` unless ``key`` (a call signature, or None: not cacheable) passed before."""
    if key is not None and not torch.compiler.is_compiling():
        try:
            if key in _VALIDATED:
                return
        except TypeError:  # an unhashable argument: let the checks name it
            key = None
    else:
        key = None
    check()
    if key is not None:
        if len(_VALIDATED) >= 4096:
            _VALIDATED.clear()
        _VALIDATED.add(key)


def validate_rope_args(
    t,
    freqs,
    tensor_format: str,
    start_positions,
    interleaved,
    cu_seqlens,
    cp_size,
    cp_rank,
    kernel_dtypes_only: bool,
    check_values: bool = True,
) -> None:
    """Raise a clear TypeError/ValueError for any argument RoPE cannot apply correctly.

    Metadata (types, shapes, dtypes, devices, flags) is checked once per call signature and the
    signature remembered (outside torch.compile, which turns these checks into guards instead);
    with ``check_values``, the values of ``start_positions`` and ``cu_seqlens`` are checked on
    every call (a copy to the host)."""
    key = None
    if isinstance(t, torch.Tensor) and isinstance(freqs, torch.Tensor):
        key = ("rope", t.shape, t.dtype, t.device, freqs.shape, freqs.dtype, freqs.device,
               tensor_format, _meta(start_positions), _meta(cu_seqlens), interleaved,
               type(interleaved), cp_size, type(cp_size), cp_rank, type(cp_rank),
               kernel_dtypes_only)
    _remembered(key, lambda: _validate_meta(t, freqs, tensor_format, start_positions,
                                            interleaved, cu_seqlens, cp_size, cp_rank,
                                            kernel_dtypes_only))
    if check_values:
        _validate_values(t, freqs, tensor_format, start_positions, cu_seqlens, cp_size)


def _validate_meta(t, freqs, tensor_format, start_positions, interleaved, cu_seqlens, cp_size,
                   cp_rank, kernel_dtypes_only) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {_describe(t)}")
    if not isinstance(freqs, torch.Tensor):
        raise TypeError(f"freqs must be a torch.Tensor of float32 angles, got {_describe(freqs)}")
    if tensor_format not in FORMATS:
        raise ValueError(f"tensor_format must be one of {FORMATS}, got {tensor_format!r}")
    if kernel_dtypes_only:
        if t.dtype not in KERNEL_DTYPES:
            raise TypeError(f"t must have dtype float32, float16 or bfloat16 for the Triton "
                            f"kernels, got {t.dtype}")
    elif not t.dtype.is_floating_point:
        raise TypeError(f"t must have a floating dtype, got {t.dtype}")
    rank = 3 if tensor_format == "thd" else 4
    if t.dim() != rank:
        layout = {"sbhd": "[s, b, h, d]", "bshd": "[b, s, h, d]", "thd": "[t, h, d]"}[tensor_format]
        raise ValueError(f"t must be {rank}-D {layout} for tensor_format={tensor_format!r}, got "
                         f"shape {tuple(t.shape)}")
    if not freqs.is_floating_point():
        raise TypeError(f"freqs must be a floating-point tensor of angles, got {freqs.dtype}")
    if kernel_dtypes_only and freqs.dtype != torch.float32:  # the entry points convert first
        raise TypeError(f"freqs must be float32 angles for the Triton kernels, got {freqs.dtype} "
                        f"(convert with freqs.float())")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"freqs must have shape [max_seq_len, 1, 1, rotary_dim], got "
                         f"{tuple(freqs.shape)}")
    if freqs.device != t.device:
        raise ValueError(f"freqs must be on the same device as t ({t.device}), got {freqs.device}")
    head_dim, rotary_dim = t.shape[-1], freqs.shape[-1]
    if rotary_dim == 0 or rotary_dim % 2 != 0:
        raise ValueError(f"freqs.shape[-1] (rotary_dim) must be even and positive, got "
                         f"{rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"freqs.shape[-1] (rotary_dim) must be <= t.shape[-1] (head_dim = "
                         f"{head_dim}), got {rotary_dim}")
    if not isinstance(interleaved, bool):
        raise TypeError(f"interleaved must be a bool, got {_describe(interleaved)}")
    if not isinstance(cp_size, int) or isinstance(cp_size, bool) or cp_size < 1:
        raise ValueError(f"cp_size must be an int >= 1, got {cp_size!r}")
    if not isinstance(cp_rank, int) or isinstance(cp_rank, bool) or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank must be an int in [0, cp_size={cp_size}), got {cp_rank!r}")

    max_rows = freqs.shape[0]
    if tensor_format != "thd":
        if cu_seqlens is not None:
            raise ValueError(f"cu_seqlens is only used with tensor_format='thd', got it with "
                             f"tensor_format={tensor_format!r}")
        seq_len = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
        batch = t.shape[1] if tensor_format == "sbhd" else t.shape[0]
        if cp_size > 1 and seq_len % 2 != 0:
            raise ValueError(f"the sequence length must be even when cp_size > 1 (dual-chunk "
                             f"slicing), got {seq_len}")
        if start_positions is not None:
            _int_vector("start_positions", start_positions, batch, t.device,
                        "one start position per batch element")
        _check_rows(max_rows, seq_len * cp_size, seq_len, cp_size, False)
        return

    # thd: packed variable-length sequences.
    if cu_seqlens is None:
        raise ValueError("cu_seqlens is required for tensor_format='thd' (int32 [n_seqs + 1] "
                         "cumulative sequence lengths), got None")
    _int_vector("cu_seqlens", cu_seqlens, None, t.device, "cumulative sequence lengths")
    if cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must hold at least 2 entries [0, ..., total], got "
                         f"{cu_seqlens.numel()}")
    n_seqs = cu_seqlens.numel() - 1
    if start_positions is not None:
        _int_vector("start_positions", start_positions, n_seqs, t.device,
                    "one start position per sequence")


def _check_rows(max_rows, needed, seq_len, cp_size, with_start) -> None:
    if needed > max_rows:
        raise ValueError(
            f"freqs has {max_rows} rows (positions) but needs at least {needed}: sequence "
            f"length {seq_len}" + (f" x cp_size {cp_size}" if cp_size > 1 else "")
            + (" + the largest start position" if with_start else ""))


# Up to this many values are copied to the host whole and reduced there: one copy (one
# synchronisation) instead of a reduction kernel and two copies; on an H100 host 21 us against 38
# at 64 values, 35 against 38 at 256. The list costs Python time per value, so more values are
# reduced on the device (stacking the two results to copy them once was slower than the second
# copy: 47 us against 41 at 257 values). docs/performance_notes.md, "The launch path".
_HOST_REDUCE_MAX = 256


def _min_max(x) -> tuple[int, int]:
    """The smallest and the largest value of ``x``, a non-empty 1-D int tensor, on the host."""
    if x.numel() <= _HOST_REDUCE_MAX:
        values = x.tolist()
        return min(values), max(values)
    lowest, highest = torch.aminmax(x)
    return int(lowest), int(highest)


def _validate_values(t, freqs, tensor_format, start_positions, cu_seqlens, cp_size) -> None:
    """Checks of the values of start_positions and cu_seqlens: copies them to the host."""
    max_rows = freqs.shape[0]
    if tensor_format != "thd":
        if start_positions is None or not start_positions.numel():
            return
        seq_len = t.shape[0] if tensor_format == "sbhd" else t.shape[1]
        lowest, highest = _min_max(start_positions)
        if lowest < 0:
            raise ValueError(f"start_positions must be >= 0, got a minimum of {lowest}")
        # TE: each sequence's rows start at its offset and span seq_len * cp_size rows.
        _check_rows(max_rows, seq_len * cp_size + highest, seq_len, cp_size, True)
        return
    n_seqs = cu_seqlens.numel() - 1
    cu = cu_seqlens.tolist()
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {cu[0]}")
    if any(b < a for a, b in zip(cu[:-1], cu[1:])):
        raise ValueError(f"cu_seqlens must be non-decreasing, got {cu}")
    if cp_size > 1 and any(c % (2 * cp_size) for c in cu):
        raise ValueError(f"cu_seqlens must be padded to multiples of 2 * cp_size = {2 * cp_size} "
                         f"for context parallelism, got {cu}")
    if cu[-1] // cp_size != t.shape[0]:
        raise ValueError(f"cu_seqlens[-1] // cp_size must equal t.shape[0] = {t.shape[0]} (the "
                         f"number of tokens), got {cu[-1]} // {cp_size} = {cu[-1] // cp_size}")
    lengths = [(b // cp_size - a // cp_size) * cp_size for a, b in zip(cu[:-1], cu[1:])]
    starts = start_positions.tolist() if start_positions is not None else [0] * n_seqs
    if min(starts, default=0) < 0:
        raise ValueError(f"start_positions must be >= 0, got a minimum of {min(starts)}")
    needed = max(n + s for n, s in zip(lengths, starts))
    if needed > max_rows:
        raise ValueError(f"freqs has {max_rows} rows (positions) but the longest sequence needs "
                         f"{needed} (its length x cp_size + its start position)")


def _tensor(name: str, x, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor ({what}), got {_describe(x)}")


def _kernel_dtype(name: str, x) -> None:
    if x.dtype not in KERNEL_DTYPES:
        raise TypeError(f"{name} must have dtype float32, float16 or bfloat16, got {x.dtype}")


def _same_device(name: str, x, device) -> None:
    if x.device != device:
        raise ValueError(f"{name} must be on the same device as the inputs ({device}), got "
                         f"{x.device}")


def _freqs_table(name: str, freqs, device) -> None:
    _tensor(name, freqs, "float32 angles [max_seq_len, 1, 1, rotary_dim]")
    if freqs.dtype != torch.float32:  # (the entry point converts other float dtypes first)
        raise TypeError(f"{name} must be float32 angles, got {freqs.dtype}")
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise ValueError(f"{name} must have shape [max_seq_len, 1, 1, rotary_dim], got "
                         f"{tuple(freqs.shape)}")
    _same_device(name, freqs, device)


def validate_qkv_args(qkv, q_freqs, k_freqs, qkv_split_arg_list, tensor_format, start_positions,
                      interleaved, cu_seqlens, cp_size, cp_rank, check_values: bool) -> None:
    """apply_fused_qkv_rotary_pos_emb: qkv [s, b, h, q + k + v] (sbhd) or [b, s, h, ...]
    (metadata once per call signature, values of start_positions when asked)."""
    sig = None
    if (all(isinstance(x, torch.Tensor) for x in (qkv, q_freqs, k_freqs))
            and isinstance(qkv_split_arg_list, (list, tuple))):
        sig = ("qkv", _meta(qkv), _meta(q_freqs), _meta(k_freqs),
               tuple((type(n), n) for n in qkv_split_arg_list), tensor_format,
               _meta(start_positions), _meta(cu_seqlens), interleaved, type(interleaved),
               cp_size, type(cp_size), cp_rank, type(cp_rank))
    _remembered(sig, lambda: _validate_qkv_meta(qkv, q_freqs, k_freqs, qkv_split_arg_list,
                                                tensor_format, start_positions, interleaved,
                                                cu_seqlens, cp_size, cp_rank))
    if check_values:  # q and k have qkv's sequence and batch axes
        _validate_values(qkv, q_freqs, tensor_format, start_positions, None, cp_size)


def _validate_qkv_meta(qkv, q_freqs, k_freqs, qkv_split_arg_list, tensor_format, start_positions,
                       interleaved, cu_seqlens, cp_size, cp_rank) -> None:
    _tensor("qkv", qkv, "[s, b, h, q_split + k_split + v_split]")
    if tensor_format == "thd":
        raise ValueError("tensor_format 'thd' is not supported by apply_fused_qkv_rotary_pos_emb "
                         "(as in TransformerEngine): use 'sbhd' or 'bshd', or apply_rotary_pos_emb "
                         "on q and k")
    if tensor_format not in ("sbhd", "bshd"):
        raise ValueError(f"tensor_format must be 'sbhd' or 'bshd', got {tensor_format!r}")
    if cu_seqlens is not None:
        raise ValueError("cu_seqlens must be None: fused QKV RoPE takes no packed (thd) input")
    _kernel_dtype("qkv", qkv)
    if qkv.dim() != 4:
        raise ValueError(f"qkv must be 4-D [s, b, h, q_split + k_split + v_split] "
                         f"({tensor_format}), got shape {tuple(qkv.shape)}")
    splits = list(qkv_split_arg_list) if isinstance(qkv_split_arg_list, (list, tuple)) else None
    if (splits is None or len(splits) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in splits)):
        raise ValueError(f"qkv_split_arg_list must be three positive ints [q_split, k_split, "
                         f"v_split], got {qkv_split_arg_list!r}")
    q_split, k_split, _ = splits
    if sum(splits) != qkv.shape[-1]:
        raise ValueError(f"qkv_split_arg_list must add up to qkv.shape[-1] = {qkv.shape[-1]}, got "
                         f"{splits} (sum {sum(splits)})")
    if q_split % k_split:
        raise ValueError(f"qkv_split_arg_list[0] (q_split = {q_split}) must be a multiple of "
                         f"qkv_split_arg_list[1] (k_split = {k_split}, the head size)")
    _freqs_table("q_freqs", q_freqs, qkv.device)
    _freqs_table("k_freqs", k_freqs, qkv.device)
    if q_freqs.shape != k_freqs.shape:
        raise ValueError(f"q_freqs and k_freqs must have the same shape, got "
                         f"{tuple(q_freqs.shape)} and {tuple(k_freqs.shape)}")
    # The checks of apply_rotary_pos_emb, on a [s, b, h, k_split] view standing in for q and k.
    _validate_meta(qkv[..., :k_split], q_freqs, tensor_format, start_positions, interleaved, None,
                   cp_size, cp_rank, True)


def validate_cos_sin_cache_args(positions, query, key, head_size, cos_sin_cache, is_neox,
                                check_values: bool) -> None:
    """FlashInfer's apply_rope_with_cos_sin_cache (metadata once per call signature)."""
    sig = None
    if all(isinstance(x, torch.Tensor) for x in (positions, query, key, cos_sin_cache)):
        sig = ("cache", _meta(positions), _meta(query), query.stride(), _meta(key), key.stride(),
               _meta(cos_sin_cache), head_size, type(head_size), is_neox, type(is_neox))
    _remembered(sig, lambda: _validate_cache_meta(positions, query, key, head_size,
                                                  cos_sin_cache, is_neox))
    if check_values and positions.numel():
        lowest, highest = _min_max(positions)
        if lowest < 0 or highest >= cos_sin_cache.shape[0]:
            raise ValueError(f"positions must lie in [0, {cos_sin_cache.shape[0]}) (the rows of "
                             f"cos_sin_cache), got values from {lowest} to {highest}")


def _validate_cache_meta(positions, query, key, head_size, cos_sin_cache, is_neox) -> None:
    _tensor("positions", positions, "int [num_tokens]")
    _tensor("query", query, "[num_tokens, num_q_heads * head_size]")
    _tensor("key", key, "[num_tokens, num_k_heads * head_size]")
    _tensor("cos_sin_cache", cos_sin_cache, "float32 [max_position, rotary_dim]")
    if not isinstance(head_size, int) or isinstance(head_size, bool) or head_size <= 0:
        raise ValueError(f"head_size must be a positive int, got {head_size!r}")
    if not isinstance(is_neox, bool):
        raise TypeError(f"is_neox must be a bool, got {_describe(is_neox)}")
    if positions.dtype not in _INT_DTYPES:
        raise TypeError(f"positions must have dtype torch.int32 or torch.int64, got "
                        f"{positions.dtype}")
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D [num_tokens], got shape {tuple(positions.shape)}")
    for name, x in (("query", query), ("key", key)):
        _kernel_dtype(name, x)
        if x.dim() not in (2, 3):
            raise ValueError(f"{name} must be [num_tokens, num_heads * head_size] (or [num_tokens, "
                             f"num_heads, head_size]), got shape {tuple(x.shape)}")
        if (x.shape[2] != head_size) if x.dim() == 3 else (x.shape[1] % head_size != 0):
            raise ValueError(f"head_size ({head_size}) must divide {name}'s width into heads, got "
                             f"{name} of shape {tuple(x.shape)}")
        if x.shape[0] != positions.shape[0]:
            raise ValueError(f"{name} must have one row per position: positions has "
                             f"{positions.shape[0]} tokens, {name} has {x.shape[0]}")
        if x.dim() == 2 and x.shape[1] and x.stride(1) != 1:
            raise ValueError(f"{name}'s last axis must be contiguous (stride 1), got strides "
                             f"{x.stride()}")
        _same_device(name, x, positions.device)
    if key.dtype != query.dtype:
        raise TypeError(f"key must have query's dtype ({query.dtype}), got {key.dtype}")
    if cos_sin_cache.dtype != torch.float32:
        raise TypeError(f"cos_sin_cache must be float32, got {cos_sin_cache.dtype} (FlashInfer's "
                        "convention; a cache kept in the model's dtype, as vLLM keeps it, "
                        "converts with cos_sin_cache.float())")
    if cos_sin_cache.dim() != 2:
        raise ValueError(f"cos_sin_cache must be 2-D [max_position, rotary_dim], got shape "
                         f"{tuple(cos_sin_cache.shape)}")
    _same_device("cos_sin_cache", cos_sin_cache, positions.device)
    rotary_dim = cos_sin_cache.shape[1]
    if rotary_dim == 0 or rotary_dim % 2:
        raise ValueError(f"cos_sin_cache.shape[1] (rotary_dim) must be even and positive, got "
                         f"{rotary_dim}")
    if rotary_dim > head_size:
        raise ValueError(f"cos_sin_cache.shape[1] (rotary_dim = {rotary_dim}) must be <= head_size "
                         f"({head_size})")


def validate_mrope_args(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                        mrope_interleaved, check_values: bool) -> None:
    """vLLM's MRotaryEmbedding through FlashInfer's cache arguments
    (``apply_mrope_with_cos_sin_cache``): positions [3, num_tokens] (or [num_tokens]), the rest
    as ``validate_cos_sin_cache_args`` (metadata once per call signature)."""
    sig = None
    if all(isinstance(x, torch.Tensor) for x in (positions, query, key, cos_sin_cache)):
        section = tuple(mrope_section) if isinstance(mrope_section, (list, tuple)) else None
        sig = ("mrope", _meta(positions), _meta(query), query.stride(), _meta(key), key.stride(),
               _meta(cos_sin_cache), head_size, type(head_size), is_neox, type(is_neox),
               section, section and tuple(type(x) for x in section), mrope_interleaved,
               type(mrope_interleaved))
    _remembered(sig, lambda: _validate_mrope_meta(positions, query, key, head_size,
                                                  cos_sin_cache, is_neox, mrope_section,
                                                  mrope_interleaved))
    if check_values and positions.numel():
        lowest, highest = _min_max(positions.reshape(-1))
        if lowest < 0 or highest >= cos_sin_cache.shape[0]:
            raise ValueError(f"positions must lie in [0, {cos_sin_cache.shape[0]}) (the rows of "
                             f"cos_sin_cache), got values from {lowest} to {highest}")


def _validate_mrope_meta(positions, query, key, head_size, cos_sin_cache, is_neox, mrope_section,
                         mrope_interleaved) -> None:
    _tensor("positions", positions, "int [3, num_tokens] (T, H, W) or [num_tokens]")
    if positions.dim() == 2:
        if positions.shape[0] != 3:
            raise ValueError(f"positions must be [3, num_tokens] (one row per axis: T, H, W) or "
                             f"[num_tokens], got shape {tuple(positions.shape)}")
        tokens = positions[0]  # the checks of a 1-D call, on one row
    elif positions.dim() == 1:
        tokens = positions
    else:
        raise ValueError(f"positions must be [3, num_tokens] (T, H, W) or [num_tokens], got "
                         f"shape {tuple(positions.shape)}")
    _validate_cache_meta(tokens, query, key, head_size, cos_sin_cache, is_neox)
    for name, x in (("query", query), ("key", key)):
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(f"{name}'s last axis must be contiguous (stride 1), got strides "
                             f"{x.stride()}; pass {name}.contiguous()")
    validate_mrope_sections(mrope_section, mrope_interleaved, cos_sin_cache.shape[1])


def validate_mrope_sections(mrope_section, mrope_interleaved, rotary_dim: int) -> None:
    """M-RoPE's own arguments, given the cache's width: a few comparisons, no tensor metadata
    (the text-only call checks only these, and leaves the rest to the cache call's checks)."""
    if not isinstance(mrope_interleaved, bool):
        raise TypeError(f"mrope_interleaved must be a bool, got {_describe(mrope_interleaved)}")
    if (not isinstance(mrope_section, (list, tuple)) or len(mrope_section) != 3
            or any(not isinstance(s, int) or isinstance(s, bool) or s < 0
                   for s in mrope_section)):
        raise ValueError(f"mrope_section must be a list of 3 non-negative ints (pairs on the T, H "
                         f"and W axes), got {mrope_section!r}")
    half = rotary_dim // 2
    if sum(mrope_section) != half:
        raise ValueError(f"mrope_section must add up to rotary_dim / 2 = {half} pairs "
                         f"(cos_sin_cache.shape[1] = {rotary_dim}), got "
                         f"{list(mrope_section)} (sum {sum(mrope_section)})")


def validate_pos_ids_args(function, q, k, positions_name, positions, rotary_dim, interleave,
                          rope_scale, rope_theta, llama31=None, indptr=None) -> None:
    """FlashInfer's apply_rope_pos_ids and apply_rope families (``rope_kernels.flashinfer``),
    once per call signature. ``positions``: pos_ids [nnz], or (with ``indptr``) apply_rope's
    offsets [batch], ``indptr`` [batch + 1]; ``llama31``: (low_freq_factor, high_freq_factor,
    old_context_len) or None. Values of device tensors are not read here (``validate_indptr``)."""
    sig = None
    numbers = (rotary_dim, interleave, rope_scale, rope_theta, llama31)
    if all(isinstance(x, torch.Tensor) for x in (q, k, positions)):
        sig = ("pos_ids", function, _meta(q), _meta(k), _meta(positions), _meta(indptr),
               *numbers, *(type(x) for x in numbers),
               tuple(type(x) for x in llama31) if isinstance(llama31, tuple) else None)
    _remembered(sig, lambda: _validate_pos_ids_meta(function, q, k, positions_name, positions,
                                                    rotary_dim, interleave, rope_scale,
                                                    rope_theta, llama31, indptr))


def _real(function: str, name: str, x, positive: bool = True) -> None:
    """A finite real number (int or float, not bool), > 0 where ``positive``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError(f"{function}: {name} must be a number (int or float), got {_describe(x)}")
    if not math.isfinite(x) or (positive and x <= 0):
        raise ValueError(f"{function}: {name} must be a finite number"
                         f"{' > 0' if positive else ''}, got {x!r}")


def _validate_pos_ids_meta(function, q, k, positions_name, positions, rotary_dim, interleave,
                           rope_scale, rope_theta, llama31, indptr) -> None:
    _tensor("q", q, "[nnz, num_q_heads, head_dim]")
    _tensor("k", k, "[nnz, num_k_heads, head_dim]")
    for name, x in (("q", q), ("k", k)):
        _kernel_dtype(name, x)
        if x.dim() != 3:
            raise ValueError(f"{function}: {name} must be 3-D [nnz, num_heads, head_dim], got "
                             f"shape {tuple(x.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype ({q.dtype}), got {k.dtype}")
    _same_device("k", k, q.device)
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(f"k must have q's tokens and head_dim ([{q.shape[0]}, num_k_heads, "
                         f"{q.shape[2]}]), got shape {tuple(k.shape)}")
    nnz, head_dim = q.shape[0], q.shape[2]
    if indptr is None:
        _int_vector(positions_name, positions, nnz, q.device, "one position per token", "q")
    else:
        _int_vector(positions_name, positions, None, q.device, "[batch_size]", "q")
        _int_vector("indptr", indptr, positions.shape[0] + 1, q.device,
                    f"[batch_size + 1], batch_size = {positions_name}.shape[0]", "q")
    if rotary_dim is not None and (isinstance(rotary_dim, bool)
                                   or not isinstance(rotary_dim, int)):
        raise TypeError(f"{function}: rotary_dim must be an int or None, got "
                        f"{_describe(rotary_dim)}")
    rotary = head_dim if rotary_dim is None else rotary_dim
    if rotary <= 0 or rotary % 2 or rotary > head_dim:
        raise ValueError(f"{function}: rotary_dim must be even, positive and <= head_dim "
                         f"({head_dim}), got {rotary}"
                         f"{' (None: head_dim)' if rotary_dim is None else ''}")
    if not isinstance(interleave, bool):
        raise TypeError(f"{function}: interleave must be a bool, got {_describe(interleave)}")
    _real(function, "rope_scale", rope_scale)
    _real(function, "rope_theta", rope_theta)
    if llama31 is not None:
        low, high, old_context_len = llama31
        _real(function, "low_freq_factor", low)
        _real(function, "high_freq_factor", high)
        _real(function, "old_context_len", old_context_len)
        if high <= low:
            raise ValueError(f"{function}: high_freq_factor must be > low_freq_factor (the "
                             f"smoothing divides by their difference), got {high!r} and {low!r}")


def validate_indptr(indptr, num_tokens: int) -> None:
    """apply_rope's indptr values (a copy to the host): from 0 to the token count,
    non-decreasing."""
    ptr = indptr.tolist()
    if ptr[0] != 0 or ptr[-1] != num_tokens or any(b < a for a, b in zip(ptr[:-1], ptr[1:])):
        shown = ptr if len(ptr) <= 16 else f"{ptr[:8]} ... {ptr[-8:]}"
        raise ValueError(f"indptr must run non-decreasing from 0 to nnz = {num_tokens} (q's "
                         f"tokens), got {shown}")


def validate_hf_args(q, k, cos, sin, unsqueeze_dim, pairs="half", one=None) -> None:
    """transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim), once per signature;
    ``pairs``: which of rope_kernels.hf's functions (rope_qk.HF_PAIRS' keys: "half",
    "interleaved", "glm", "half_per_pair", "interleaved_per_pair", "half_negated", "deepseek";
    or a key of rope_qk.VISION_PAIRS or COMPLEX_PAIRS, checked as the pairs it stands for).
    ``one``: for a function that rotates one tensor (Gemma 4's, GPT-J's), its argument's name;
    that tensor is ``q``, and ``k`` is not checked (the caller makes it: none of q's heads)."""
    sig = None
    if all(isinstance(x, torch.Tensor) for x in (q, cos, sin)) and (
            one is not None or isinstance(k, torch.Tensor)):
        sig = ("hf", _meta(q), None if one else _meta(k), _meta(cos), _meta(sin), unsqueeze_dim,
               type(unsqueeze_dim), pairs, one)
    _remembered(sig, lambda: _validate_hf_meta(q, k, cos, sin, unsqueeze_dim, pairs, one))


def _validate_hf_meta(q, k, cos, sin, unsqueeze_dim, pairs, one=None) -> None:
    q_name = one or "q"
    tensors = ((q_name, q),) + ((("k", k),) if one is None else ()) + (("cos", cos), ("sin", sin))
    for name, x in tensors:
        _tensor(name, x, "see rope_kernels.hf.apply_rotary_pos_emb")
        _kernel_dtype(name, x)
    if (isinstance(unsqueeze_dim, (bool, torch.Tensor))  # (a tensor: `in` would raise)
            or unsqueeze_dim not in (1, 2)):
        layout = f"{q_name} as" if one else "q, k as"
        got = (repr(unsqueeze_dim) if isinstance(unsqueeze_dim, int)
               else f"a {type(unsqueeze_dim).__name__}")
        raise ValueError(f"unsqueeze_dim must be 1 ({layout} [b, h, s, d]) or 2 ([b, s, h, d]), "
                         f"got {got}")
    if one is not None:
        if q.dim() != 4:
            raise ValueError(f"{q_name} must be 4-D, got shape {tuple(q.shape)}")
        k = q.narrow(unsqueeze_dim, 0, 0)  # (what the caller rotates with it: no heads)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"q and k must be 4-D, got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if k.dtype != q.dtype:
        raise TypeError(f"k must have q's dtype ({q.dtype}), got {k.dtype}")
    seq_axis = 2 if unsqueeze_dim == 1 else 1
    if (k.shape[0], k.shape[seq_axis], k.shape[3]) != (q.shape[0], q.shape[seq_axis], q.shape[3]):
        raise ValueError(f"k must match q in batch, sequence and head_dim (unsqueeze_dim="
                         f"{unsqueeze_dim}), got q {tuple(q.shape)} and k {tuple(k.shape)}")
    if cos.shape != sin.shape or cos.dim() not in (2, 3):
        raise ValueError(f"cos and sin must have one shape, [b, s, rotary_dim] or [s, rotary_dim], "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    b, s, d = q.shape[0], q.shape[seq_axis], q.shape[3]
    lead = cos.shape[:-1] if cos.dim() == 3 else (1, *cos.shape[:-1])
    if lead[1] != s or lead[0] not in (1, b):
        raise ValueError(f"cos must be [b or 1, s, rotary_dim] with b = {b}, s = {s}, got "
                         f"{tuple(cos.shape)}")
    rotary_dim = cos.shape[-1]
    if pairs.endswith(("_per_pair", "_complex")):
        gpt_oss = ("apply_rotary_pos_emb_gpt_oss" if pairs == "half_per_pair"
                   else "apply_rotary_pos_emb_gpt_oss_interleaved")
        if 2 * cos.shape[-1] != d:
            raise ValueError(f"cos.shape[-1] must be head_dim / 2 ({d / 2:g}) for {gpt_oss}, whose "
                             f"cos and sin have one entry per pair and rotate the whole head "
                             f"(as GPT-OSS's), got {cos.shape[-1]}; for cos and sin of one "
                             f"entry per channel use rope_kernels.hf.apply_rotary_pos_emb")
        rotary_dim = d
    if rotary_dim == 0 or rotary_dim % 2 or rotary_dim > d:
        raise ValueError(f"cos.shape[-1] (rotary_dim) must be even, positive and <= head_dim "
                         f"({d}), got {rotary_dim}")
    if pairs == "deepseek" and rotary_dim != d:
        raise ValueError(f"cos.shape[-1] must be head_dim ({d}) for "
                         f"apply_rotary_pos_emb_deepseek, which rotates the whole head as "
                         f"DeepSeek V3's apply_rotary_pos_emb_interleave does (pass the rotary "
                         f"slices of q and k, as its attention does), got {rotary_dim}")
    for name, x in (("k", k), ("cos", cos), ("sin", sin)):
        _same_device(name, x, q.device)


def validate_vision_args(q, k, cos, sin, function: str) -> None:
    """transformers' apply_rotary_pos_emb_vision(q, k, cos, sin) (a vision encoder's patches):
    the shapes that function takes, checked before the call becomes a q+k call with a batch of
    one (whose checks, ``validate_hf_args``, do the rest: dtypes, rotary_dim, devices).
    ``function``: our function's name, for the messages."""
    sig = None
    if all(isinstance(x, torch.Tensor) for x in (q, k, cos, sin)):
        sig = ("vision", _meta(q), _meta(k), _meta(cos), _meta(sin), function)
    _remembered(sig, lambda: _validate_vision_meta(q, k, cos, sin, function))


def _validate_vision_meta(q, k, cos, sin, function) -> None:
    for name, x in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _tensor(name, x, f"see rope_kernels.hf.{function}")
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(f"{function}: q and k must be 3-D, [tokens, heads, head_dim] (a vision "
                         f"encoder's patches, as transformers' apply_rotary_pos_emb_vision takes "
                         f"them), got shapes {tuple(q.shape)} and {tuple(k.shape)}")
    if (k.shape[0], k.shape[2]) != (q.shape[0], q.shape[2]):
        raise ValueError(f"{function}: k must match q in tokens and head_dim, got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)}")
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != q.shape[0]:
        raise ValueError(f"{function}: cos and sin must have one shape, [tokens, rotary_dim] with "
                         f"tokens = {q.shape[0]} (q's first axis), got {tuple(cos.shape)} and "
                         f"{tuple(sin.shape)}")


def validate_2d_args(q, k, cos, sin, num_k_exclude_rope, repeat_freqs_k, function: str) -> None:
    """transformers' SAM-family ``apply_rotary_pos_emb_2d(q, k, cos, sin, num_k_exclude_rope=0,
    repeat_freqs_k=False)``: the shapes and arguments that function takes, checked before the
    call becomes one or two q+k calls (whose checks, ``validate_hf_args``, do the rest: dtypes,
    devices, even channels). ``function``: our function's name, for the messages."""
    sig = None
    if all(isinstance(x, torch.Tensor) for x in (q, k, cos, sin)):
        sig = ("2d", _meta(q), _meta(k), _meta(cos), _meta(sin), num_k_exclude_rope,
               type(num_k_exclude_rope), repeat_freqs_k, type(repeat_freqs_k), function)
    _remembered(sig, lambda: _validate_2d_meta(q, k, cos, sin, num_k_exclude_rope,
                                               repeat_freqs_k, function))


def _validate_2d_meta(q, k, cos, sin, num_k_exclude_rope, repeat_freqs_k, function) -> None:
    for name, x in (("q", q), ("k", k), ("cos", cos), ("sin", sin)):
        _tensor(name, x, f"see rope_kernels.hf.{function}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"{function}: q and k must be 4-D, [batch, heads, tokens, head_dim] (as "
                         f"SAM's attention passes them), got shapes {tuple(q.shape)} and "
                         f"{tuple(k.shape)}")
    if (k.shape[0], k.shape[1], k.shape[3]) != (q.shape[0], q.shape[1], q.shape[3]):
        raise ValueError(f"{function}: k must match q in batch, heads and head_dim, got q "
                         f"{tuple(q.shape)} and k {tuple(k.shape)}")
    if (cos.shape != sin.shape or cos.dim() not in (2, 3) or cos.dim() == 3 and cos.shape[0] != 1
            or cos.shape[-2:] != (q.shape[2], q.shape[3])):
        raise ValueError(f"{function}: cos and sin must have one shape, [1, tokens, head_dim] (the "
                         f"rotary module's) or [tokens, head_dim], tokens = {q.shape[2]} and "
                         f"head_dim = {q.shape[3]} from q {tuple(q.shape)}: one row per token, "
                         f"broadcast over batch and heads, covering the whole head; got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    if isinstance(num_k_exclude_rope, bool) or not isinstance(num_k_exclude_rope, int):
        raise TypeError(f"{function}: num_k_exclude_rope must be an int (how many of k's last "
                        f"tokens are not rotated), got {_describe(num_k_exclude_rope)}")
    if not 0 <= num_k_exclude_rope <= k.shape[2]:
        raise ValueError(f"{function}: num_k_exclude_rope must be in [0, {k.shape[2]}] (k's "
                         f"tokens), got {num_k_exclude_rope}")
    rotated, tokens = k.shape[2] - num_k_exclude_rope, q.shape[2]
    if rotated and rotated != tokens and not (repeat_freqs_k and rotated % tokens == 0):
        raise ValueError(
            f"{function}: k's rotated tokens ({k.shape[2]} less num_k_exclude_rope = "
            f"{num_k_exclude_rope}: {rotated}) must be q's {tokens}, or, with "
            f"repeat_freqs_k=True, a multiple of them (cos and sin repeated), got repeat_freqs_k="
            f"{repeat_freqs_k}")


def validate_complex_args(xq, xk, freqs, function: str, names: tuple, heads_axis: int,
                          vision: bool = False) -> None:
    """transformers' ``apply_rotary_emb(xq, xk, freqs_cis)`` (Llama 4's text model, heads on
    axis 2; DeepSeek V2's, heads on axis 1) and Llama 4's ``vision_apply_rotary_emb(query, key,
    freqs_ci)`` (``vision``: the angles of one image's patches, any shape of s * d/2 entries):
    everything those calls take, checked under the caller's argument names (``names``: q's, k's
    and the angles'), before the angles become the cos and sin of a q+k call.
    ``function``: our function's name, for the messages."""
    sig = None
    if all(isinstance(x, torch.Tensor) for x in (xq, xk, freqs)):
        sig = ("complex", _meta(xq), _meta(xk), _meta(freqs), function, heads_axis, vision)
    _remembered(sig, lambda: _validate_complex_meta(xq, xk, freqs, function, names, heads_axis,
                                                    vision))


def _validate_complex_meta(xq, xk, freqs, function, names, heads_axis, vision) -> None:
    q_name, k_name, f_name = names
    for name, x in ((q_name, xq), (k_name, xk)):
        _tensor(name, x, f"see rope_kernels.hf.{function}")
        _kernel_dtype(name, x)
    _tensor(f_name, freqs, f"complex64 angles, see rope_kernels.hf.{function}")
    if freqs.dtype != torch.complex64:
        raise TypeError(f"{function}: {f_name} must be complex64 (cos + i sin of each pair's "
                        f"angle, as transformers' rotary module makes it with torch.polar), got "
                        f"{freqs.dtype}")
    layout = "[b, s, h, d]" if heads_axis == 2 else "[b, h, s, d]"
    if xq.dim() != 4 or xk.dim() != 4:
        raise ValueError(f"{function}: {q_name} and {k_name} must be 4-D, {layout}, got shapes "
                         f"{tuple(xq.shape)} and {tuple(xk.shape)}")
    if xk.dtype != xq.dtype:
        raise TypeError(f"{function}: {k_name} must have {q_name}'s dtype ({xq.dtype}), got "
                        f"{xk.dtype}")
    seq_axis = 3 - heads_axis
    b, s, d = xq.shape[0], xq.shape[seq_axis], xq.shape[3]
    if (xk.shape[0], xk.shape[seq_axis], xk.shape[3]) != (b, s, d):
        raise ValueError(f"{function}: {k_name} must match {q_name} in batch, sequence and "
                         f"head_dim ({layout}), got {q_name} {tuple(xq.shape)} and {k_name} "
                         f"{tuple(xk.shape)}")
    if d % 2:
        raise ValueError(f"{function}: head_dim must be even (channels 2j and 2j+1 are a complex "
                         f"number), got {q_name} {tuple(xq.shape)}")
    if vision:
        if freqs.numel() != s * d // 2:
            raise ValueError(f"{function}: {f_name} must hold one angle per patch and pair, "
                             f"s * head_dim / 2 = {s} * {d // 2} entries (transformers views it "
                             f"as [1, s, 1, head_dim / 2]), got shape {tuple(freqs.shape)}")
    elif freqs.dim() != 3 or freqs.shape[0] not in (1, b) or freqs.shape[1:] != (s, d // 2):
        raise ValueError(f"{function}: {f_name} must be [b or 1, s, head_dim / 2] with b = {b}, "
                         f"s = {s}, head_dim / 2 = {d // 2} ({q_name} {layout} "
                         f"{tuple(xq.shape)}), got {tuple(freqs.shape)}")
    for name, x in ((k_name, xk), (f_name, freqs)):
        _same_device(name, x, xq.device)


def needs_grad(*tensors: torch.Tensor) -> bool:
    """Whether autograd would record a call on ``tensors`` (one of them requires grad and grad
    mode is on)."""
    return torch.is_grad_enabled() and any(x.requires_grad for x in tensors)


def validate_in_place(function: str, differentiable: str, **tensors) -> None:
    """What an in-place function refuses beyond its out-of-place twin's checks, for the tensors
    it writes into, two or one (given by argument name, e.g. ``query=..., key=...``; one for
    Gemma 4's and GPT-J's functions): tensors that need a gradient (autograd would lose the
    values the backward needs), one tensor given for both, and a tensor whose elements share
    memory (a stride of 0, as from ``expand()``: several programs would write one element).
    ``differentiable``: the out-of-place twin to name."""
    if needs_grad(*tensors.values()):
        raise ValueError(f"{function} cannot rotate {' and '.join(tensors)} that "
                         f"{'require' if len(tensors) > 1 else 'requires'} grad (autograd would "
                         f"lose the values it needs): use {differentiable}, which is "
                         f"differentiable, or call it under torch.no_grad()")
    if len(tensors) == 2:
        (a, x), (b, y) = tensors.items()
        if x is y:
            raise ValueError(f"{function} needs {a} and {b} to be different tensors, got one "
                             f"tensor for both")
    for name, t in tensors.items():
        if any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride())):
            raise ValueError(f"{function} writes into {name}, whose elements share memory (a "
                             f"stride of 0, as from expand()): got shape {tuple(t.shape)}, "
                             f"strides {t.stride()}; pass {name}.contiguous()")
