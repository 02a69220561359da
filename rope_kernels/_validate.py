"""Input validation shared by every RoPE entry point of the package.

Each failure raises TypeError (wrong kind of object or dtype) or ValueError (wrong shape or value)
whose message names the argument, what was expected and what was given. Checks that need the
*values* of device tensors (cu_seqlens, start_positions) copy them to the host, which synchronises
with the GPU; ``check_values=False`` skips those (and only those).
"""

from __future__ import annotations

from typing import Optional

import torch

KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FORMATS = ("sbhd", "bshd", "thd")
_INT_DTYPES = (torch.int32, torch.int64)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device}"
    return f"{type(x).__name__} {x!r}"


def _int_vector(name: str, x, length: Optional[int], device: torch.device, what: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor ({what}), got {_describe(x)}")
    if x.dtype not in _INT_DTYPES:
        raise TypeError(f"{name} must have dtype torch.int32 or torch.int64, got {x.dtype}")
    if x.dim() != 1 or (length is not None and x.numel() != length):
        want = f"[{length}]" if length is not None else "1-D"
        raise ValueError(f"{name} must have shape {want} ({what}), got {tuple(x.shape)}")
    if x.device != device:
        raise ValueError(f"{name} must be on the same device as t ({device}), got {x.device}")


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
    """Raise a clear TypeError/ValueError for any argument RoPE cannot apply correctly."""
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
    if freqs.dtype != torch.float32:
        raise TypeError(f"freqs must be float32 angles, got {freqs.dtype} (convert with "
                        f"freqs.float(); cos/sin are computed from it in float32)")
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
    if cp_size > 1 and start_positions is not None:
        raise ValueError("start_positions must be None when cp_size > 1 (offsets are for "
                         f"inference, context parallelism for training), got cp_size={cp_size}")

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
        needed = seq_len * cp_size
        if start_positions is not None:
            _int_vector("start_positions", start_positions, batch, t.device,
                        "one start position per batch element")
            if check_values and start_positions.numel():
                lowest, highest = (int(v) for v in torch.aminmax(start_positions))
                if lowest < 0:
                    raise ValueError(f"start_positions must be >= 0, got a minimum of {lowest}")
                needed = seq_len + highest
        if needed > max_rows:
            raise ValueError(
                f"freqs has {max_rows} rows (positions) but needs at least {needed}: sequence "
                f"length {seq_len}" + (f" x cp_size {cp_size}" if cp_size > 1 else "")
                + (" + the largest start position" if start_positions is not None else ""))
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
    if not check_values:
        return
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
