"""Bandwidth benchmark: ``python -m rope_kernels.bench [--mode quick|full] [--out figures]``.

RoPE is memory-bound, so speed is reported as achieved bandwidth against what the memory can do:

    GB/s = (bytes read of t + bytes written of out + bytes of the float32 angle rows used) / time

the fewest bytes any implementation must move (the same count for every implementation, so the
numbers compare times), but for the in-place calls with part of the head rotated
(``ROTATED_CHANNELS_ONLY``): they leave the other channels where they are, and count only the
rotated ones (``moved_bytes``; compare their times, ``ms``, with the other calls'). The ceiling
is the device-to-device copy bandwidth measured first, in the same run, counting bytes read plus
bytes written (2 GB copied). Times are medians of
``triton.testing.do_bench`` (which clears L2 before every call) on tensors larger than L2; decode-
sized calls are timed back to back with CUDA events instead, so Python launch cost is included.

do_bench clears L2 by writing 256 MB of zeros, so every timed call starts by writing back the
dirty lines that leaves in L2: a cost of a few microseconds that is not the kernel's, and that
smaller problems feel more (on an H200, a 268 MB copy timed this way reaches 0.92 of the 2 GB
copy's bandwidth). So each problem is also measured against a copy of its own bytes, timed the
same way (``copy_same_gbps``, of the bytes each call moves): the bandwidth a pure streaming
kernel of that size gets here.

Writes ``bench.csv`` (one row per measurement), ``provenance.json`` (GPU, versions, date, copy
bandwidth, command) and plots into the output folder, and prints a short summary.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import warnings
from typing import Callable, Iterable, Optional, Union

import torch
import triton

from .reference import RotaryPositionEmbedding, rope_reference, rotate_half
from .rope_2d import rope_2d

CHECKOUT = pathlib.Path(__file__).resolve().parents[1]  # the repository this package sits in
FIGURES = CHECKOUT / "figures"
DEFAULT = dict(seq_len=4096, batch=16, heads=32, head_dim=128, rotary_percent=1.0)
COLUMNS = ["gpu", "impl", "direction", "tensor_format", "dtype", "seq_len", "batch", "heads",
           "head_dim", "rotary_dim", "n_seqs", "sweep", "ms", "gbps", "copy_gbps", "timing",
           "entry", "k_heads", "copy_same_gbps", "interleaved"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Where the problems are built: the GPU. (tests/test_bench_calls.py builds small ones on the CPU,
# in the interpreter, to check what every call computes.)
DEVICE = "cuda"


# ---------------------------------------------------------------------------------------------
# Timing and the ceiling
# ---------------------------------------------------------------------------------------------
def time_ms(fn: Callable[[], object], warmup: int = 20, rep: int = 60) -> float:
    """Median milliseconds of ``fn`` on the GPU (do_bench: warm-up, L2 flushed before each call)."""
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def time_per_call_us(fn: Callable[[], object], calls: int = 2000, repeats: int = 3) -> float:
    """Microseconds per call of ``fn`` run back to back: max(Python launch, GPU time)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(repeats):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


# GPU clock cycles that time_ms_host_ahead keeps the GPU busy after each flush: about 200 us at
# the H100's and H200's 1.98 GHz boost clock, several times the Python launch of any call timed
# here (Liger-Kernel's took 28-50 us a call at batch 1-2 on an H200: figures/peer_margins.json).
HOST_LEAD_CYCLES = 400_000


def time_ms_host_ahead(fn: Callable[[], object], warmup: int = 20, rep: int = 60,
                       lead_cycles: int = HOST_LEAD_CYCLES) -> float:
    """Median milliseconds of ``fn`` on the GPU, as ``time_ms`` (L2 flushed before each call, each
    call between two CUDA events), with the GPU kept busy for ``lead_cycles`` after each flush
    (``torch.cuda._sleep``), before the start event.

    do_bench's loop enqueues a flush (256 MB written: at least 53 us at the H200's 4.8 TB/s), the
    start event and the call: where the call's Python launch takes longer than the flush, the GPU
    reaches the start event first and waits for the kernel, and that wait is timed. Here the host
    stays ahead, so the time is the GPU's alone for any launch shorter than the lead. At 69-170 MB
    do_bench's medians of any kernel fall on one of two levels about 3 points of copy apart from one
    call of it to the next (recorded in ``small_points`` of ``scripts/peer_margins.py``); in a
    probe, ten medians of this function in a row stayed within 0.1 point. Warm-up and number of
    calls as do_bench's."""
    cache = triton.runtime.driver.active.get_empty_cache_for_benchmark()
    fn()
    torch.cuda.synchronize()

    def timed_calls(n):
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for start, end in zip(starts, ends):
            cache.zero_()
            torch.cuda._sleep(lead_cycles)
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(starts, ends)]

    estimate = statistics.median(timed_calls(5))
    for _ in range(max(1, int(warmup / estimate))):
        fn()
    return statistics.median(timed_calls(max(1, int(rep / estimate))))


def shuffled_times(fns: dict, rounds: int,
                   timer: Optional[Callable[[Callable[[], object]], float]] = None) -> dict:
    """name -> the milliseconds ``timer`` (``time_ms`` unless given) gave each callable, one per
    round: after one warm-up call each, every round times every callable once in its own
    shuffled order, so that slow drift of the machine spreads over all of them instead of
    landing on whichever runs first (the scripts' A/Bs)."""
    timer = timer or time_ms
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for r in range(rounds):
        items = list(fns.items())
        random.Random(r).shuffle(items)
        for name, fn in items:
            times[name].append(timer(fn))
    return times


def shuffled_rounds(fns: dict, nbytes: int, copy_gbps: float, rounds: int,
                    timer: Optional[Callable[[Callable[[], object]], float]] = None) -> dict:
    """name -> the fractions of ``copy_gbps`` each callable reached, one per round of
    ``shuffled_times`` (``nbytes`` moved a call)."""
    return {name: [nbytes / ms / 1e6 / copy_gbps for ms in times]
            for name, times in shuffled_times(fns, rounds, timer).items()}


def copy_bandwidth_gbps(nbytes: int = 2 * 1024**3) -> float:
    """Device-to-device copy of ``nbytes``: (bytes read + bytes written) / median time."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / ms / 1e6


def copy_same_bytes_gbps(moved: int) -> float:
    """A device-to-device copy that moves ``moved`` bytes in all (half read, half written),
    timed like the kernels: the streaming ceiling at that size, L2 flush included."""
    return copy_bandwidth_gbps(max(moved // 2, 4096))


def source_commit(root: Optional[pathlib.Path] = None) -> str:
    """The git commit of the code that ran (12 hex digits; ``root``: this package's checkout),
    with ``+changes`` where tracked files differ from it; ``unknown`` outside a git checkout or
    without git. A copied tree whose history lags (the lent GPU machines' copies) reads as its
    older commit ``+changes``: ``source_digest`` then says which code it was."""
    root = CHECKOUT if root is None else root
    if not (root / ".git").exists():  # e.g. installed into site-packages: not this checkout's
        return "unknown"

    def git(*args):
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+changes" if changed else "")


def source_digest(root: Optional[pathlib.Path] = None) -> str:
    """SHA-256 (first 16 hex digits) of the code that ran: every ``rope_kernels/*.py`` and
    ``scripts/*`` file under ``root`` (this package's checkout) but Markdown (``scripts/README.md``
    is prose), path and content, in path order. Unlike the commit it needs no git history (a
    copied tree may carry a stale one): the same call at a checkout of the commit in question
    says whether that commit ran."""
    root = CHECKOUT if root is None else root
    digest = hashlib.sha256()
    files = [*root.glob("rope_kernels/*.py"), *root.glob("scripts/*")]
    for path in sorted(f for f in files if f.is_file() and f.suffix != ".md"):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def provenance(copy_gbps: float, mode: str) -> dict:
    return {
        "gpu": torch.cuda.get_device_name(),
        "commit": source_commit(),
        "source_digest": source_digest(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "copy_gbps": round(copy_gbps, 1),
        "mode": mode,
        "command": "python -m rope_kernels.bench --mode " + mode,
        "bytes": "read t + write out + read the float32 angle rows used (once); in-place calls "
                 "with part of the head rotated: the rotated channels only (they leave the rest "
                 "where it is)",
        "timing": "triton.testing.do_bench median (L2 flushed per call); copy_same_gbps: a "
                  "copy of each problem's bytes timed the same way; decode: back-to-back calls "
                  "timed with CUDA events, Python launch included, fastest of 4 rounds. "
                  "Backward: the Triton kernels' backward call directly; torch eager/compile "
                  "through torch.autograd.grad",
    }


# ---------------------------------------------------------------------------------------------
# Problems and implementations
# ---------------------------------------------------------------------------------------------
class Problem:
    """One RoPE call to time: the input, its angle table and everything the call needs."""

    def __init__(self, tensor_format="sbhd", dtype="bf16", seq_len=4096, batch=16, heads=32,
                 head_dim=128, rotary_percent=1.0, n_seqs=None, interleaved=False, seed=0):
        self.tensor_format, self.dtype_name = tensor_format, dtype
        self.seq_len, self.batch, self.heads, self.head_dim = seq_len, batch, heads, head_dim
        self.interleaved = interleaved
        dtype = DTYPES[dtype]
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        self.cu_seqlens = None
        if tensor_format == "thd":
            # seq_len * batch tokens cut at random into n_seqs sequences of varying length, or
            # (n_seqs None) into batch sequences of seq_len tokens each
            total = seq_len * batch
            if n_seqs is None:
                self.n_seqs, self.max_len = batch, seq_len
                self.cu_seqlens = torch.arange(0, total + 1, seq_len, device=DEVICE,
                                               dtype=torch.int32)
            else:
                self.n_seqs = n_seqs
                cuts = torch.randperm(total - 1, generator=g, device=DEVICE)[: n_seqs - 1] + 1
                cu = torch.cat([torch.zeros(1, device=DEVICE, dtype=torch.long),
                                cuts.sort().values,
                                torch.full((1,), total, device=DEVICE, dtype=torch.long)])
                self.cu_seqlens = cu.to(torch.int32)
                self.max_len = int((cu[1:] - cu[:-1]).max())
            shape = (total, heads, head_dim)
        else:
            self.n_seqs = batch
            self.max_len = seq_len
            shape = (seq_len, batch, heads, head_dim)
            if tensor_format == "bshd":
                shape = (batch, seq_len, heads, head_dim)
        self.t = torch.randn(shape, device=DEVICE, dtype=dtype, generator=g)
        self.grad = torch.randn(shape, device=DEVICE, dtype=dtype, generator=g)
        emb = RotaryPositionEmbedding(head_dim, rotary_percent, interleaved=interleaved,
                                      device=torch.device(DEVICE))
        self.freqs = emb(self.max_len)
        self.rotary_dim = self.freqs.shape[-1]

    @property
    def nbytes(self) -> int:
        # Table rows actually read: every row up to the longest sequence.
        return 2 * self.t.numel() * self.t.element_size() + self.max_len * self.rotary_dim * 4

    @property
    def rotated_nbytes(self) -> int:
        """The rotated channels read and written once + the table rows: what an in-place call
        that leaves the rest where it is moves (``moved_bytes``)."""
        return (2 * self.t.numel() // self.head_dim * self.rotary_dim * self.t.element_size()
                + self.max_len * self.rotary_dim * 4)

    def kwargs(self) -> dict:
        return dict(tensor_format=self.tensor_format, interleaved=self.interleaved,
                    cu_seqlens=self.cu_seqlens)

    def row(self) -> dict:
        return dict(tensor_format=self.tensor_format, dtype=self.dtype_name,
                    seq_len=self.seq_len, batch=self.batch, heads=self.heads,
                    head_dim=self.head_dim, rotary_dim=self.rotary_dim,
                    n_seqs=self.n_seqs, interleaved=self.interleaved)


def _autograd(fn):
    """Forward: fn(t). Backward: the vector-Jacobian product through autograd (what training
    runs), with the forward graph built once outside the timed region."""
    def make(p: Problem, direction: str):
        kw = p.kwargs()
        if direction == "forward":
            return lambda: fn(p.t, p.freqs, **kw)
        t = p.t.detach().requires_grad_(True)
        out = fn(t, p.freqs, **kw)
        return lambda: torch.autograd.grad(out, t, p.grad, retain_graph=True)
    return make


def _ours_api(kernel):
    """Forward: the public apply_rotary_pos_emb (argument checks included). Backward: the call
    RoPEFunction.backward makes, the kernel with sin negated on the incoming gradient (timed
    directly, like Liger's backward, without the autograd engine around it)."""
    from .api import KERNELS, apply_rotary_pos_emb

    launcher = KERNELS[kernel]

    def make(p: Problem, direction: str):
        kw = p.kwargs()
        if direction == "forward":
            return lambda: apply_rotary_pos_emb(p.t, p.freqs, kw["tensor_format"], None,
                                                kw["interleaved"], True, kw["cu_seqlens"],
                                                kernel=kernel, validate=False)
        return lambda: launcher(p.grad, p.freqs, backward=True, **kw)
    return make


def _ours_in_place(p: Problem, direction: str):
    """rope_2d writing into its input (``out=t``), forward and backward: the same job as an
    in-place peer's. Timed where one runs (Liger: bshd, half-split, full rotary)."""
    if p.tensor_format != "bshd" or p.interleaved or p.rotary_dim != p.head_dim:
        return None
    x = p.t if direction == "forward" else p.grad
    kw = p.kwargs()
    return lambda: rope_2d(x, p.freqs, backward=direction == "backward", out=x, **kw)


def _naive(t, freqs, tensor_format, interleaved, cu_seqlens):
    return rope_reference(t, freqs, tensor_format, None, interleaved, cu_seqlens)


_compiled = {}


def _compiled_naive(t, freqs, tensor_format, interleaved, cu_seqlens):
    if "fn" not in _compiled:
        # One specialisation per shape (and per requires_grad): allow them all, else dynamo
        # silently falls back to eager after 8 and the "compiled" numbers would be eager's.
        torch._dynamo.config.cache_size_limit = 256
        if hasattr(torch._dynamo.config, "recompile_limit"):
            torch._dynamo.config.recompile_limit = 256
        # dynamic=None: static first, then one dynamic-shape graph (bounded compile time).
        _compiled["fn"] = torch.compile(rope_reference)
    return _compiled["fn"](t, freqs, tensor_format, None, interleaved, cu_seqlens)


def _te():
    try:
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb as te_rope
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        try:
            from transformer_engine.pytorch.dot_product_attention.rope import (
                apply_rotary_pos_emb as te_rope)
        except Exception:  # noqa: BLE001
            return None

    def call(t, freqs, tensor_format, interleaved, cu_seqlens):
        return te_rope(t, freqs, tensor_format=tensor_format, interleaved=interleaved,
                       fused=True, cu_seqlens=cu_seqlens)
    return call


def _liger(float32_tables: bool = False):
    """Liger-Kernel's in-place Triton rope, which rotates q and k ([b, h, s, d] views of
    [b, s, h, d] memory, half-split pairs, full rotary only) in one launch. ``float32_tables``:
    cos/sin given in float32 instead of t's dtype (it reads half of each row: then as many table
    bytes as our float32 angle rows; scripts/peer_margins.py)."""
    try:
        from liger_kernel.ops.rope import rope_backward, rope_forward
    except Exception:  # noqa: BLE001
        return None

    def make(p: Problem, direction: str):
        if p.tensor_format != "bshd" or p.interleaved or p.rotary_dim != p.head_dim:
            return None
        # Split the heads between q and k so that one Liger call moves the same bytes as one
        # call of ours; cos/sin in t's dtype, [1, s, d] (their format: the [f, f] table).
        b, s, h, d = p.t.shape
        q = p.t[:, :, : h // 2].contiguous().transpose(1, 2)
        k = p.t[:, :, h // 2:].contiguous().transpose(1, 2)
        f = p.freqs[:s, 0, 0][None]
        table_dtype = torch.float32 if float32_tables else p.t.dtype
        cos, sin = f.cos().to(table_dtype), f.sin().to(table_dtype)
        if direction == "forward":
            return lambda: rope_forward(q, k, cos, sin)
        return lambda: rope_backward(q, k, cos, sin)
    return make


def _flash_attn_module():
    """flash-attn's Triton rotary (flash_attn/ops/triton/rotary.py): from an installed flash-attn,
    else from a copy of that one file at $ROPE_PEER_DIR/flash_attn_rotary.py (it imports only
    torch and triton; the benchmark on the GPU machine carries it there)."""
    try:
        from flash_attn.ops.triton import rotary  # type: ignore
        return rotary
    except Exception:  # noqa: BLE001
        pass
    import importlib.util
    import os

    path = pathlib.Path(os.environ.get("ROPE_PEER_DIR", "")) / "flash_attn_rotary.py"
    if not os.environ.get("ROPE_PEER_DIR") or not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("flash_attn_rotary", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flash_attn():
    """flash-attn's apply_rotary: bshd (its layout) and thd (cu_seqlens + max_seqlen); cos/sin
    [seqlen, rotary_dim / 2] in x's dtype; backward = conjugate (sin negated) on the gradient."""
    module = _flash_attn_module()
    if module is None:
        return None

    def make(p: Problem, direction: str):
        if p.tensor_format not in ("bshd", "thd"):
            return None
        half = p.freqs[: p.max_len, 0, 0, : p.rotary_dim // 2]
        if p.interleaved:
            half = p.freqs[: p.max_len, 0, 0, 0::2]
        cos, sin = half.cos().to(p.t.dtype), half.sin().to(p.t.dtype)
        x = p.t if direction == "forward" else p.grad
        kw = dict(interleaved=p.interleaved, conjugate=direction == "backward")
        if p.tensor_format == "thd":
            kw.update(cu_seqlens=p.cu_seqlens, max_seqlen=p.max_len)
        return lambda: module.apply_rotary(x, cos, sin, **kw)
    return make


def graph_replay(fn: Callable[[], object]) -> Callable[[], None]:
    """``fn`` warmed up on a side stream (compilation stays outside the capture), captured once
    in a CUDA graph; returns the graph's replay: one call, no Python launch path."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _cuda_graph(launcher):
    """Our kernel captured once in a CUDA graph and replayed: what a decode loop that uses
    graphs (as serving stacks do) pays per call, with no Python launch path at all."""
    def make(p: Problem, direction: str):
        if direction != "forward":
            return None
        kw = p.kwargs()
        out = launcher(p.t, p.freqs, **kw)
        return graph_replay(lambda: launcher(p.t, p.freqs, out=out, **kw))
    return make


def implementations(decode: bool = False) -> dict:
    """name -> make(problem, direction) -> zero-argument callable (or None: not applicable)."""
    impls = {
        "triton-2d (ours)": _ours_api("2d"),
        "triton-1d (ours)": _ours_api("1d"),
        **({} if decode else {"triton-2d (ours), in place": _ours_in_place}),
        "torch eager (TE unfused formula)": _autograd(_naive),
        "torch.compile": _autograd(_compiled_naive),
    }
    if decode:
        impls["triton-2d (ours), CUDA graph replay"] = _cuda_graph(rope_2d)
    te = _te()
    if te is not None:
        impls["TransformerEngine fused (CUDA)"] = _autograd(te)
    liger = _liger()
    if liger is not None:
        impls["Liger-Kernel (q+k, in place)"] = liger
    flash = _flash_attn()
    if flash is not None:
        impls["flash-attn rotary (Triton)"] = flash
    return impls


def missing_peers() -> list[str]:
    names = []
    if _te() is None:
        names.append("TransformerEngine (not importable: needs its CUDA build)")
    if _liger() is None:
        names.append("Liger-Kernel (not importable)")
    if _flash_attn_module() is None:
        names.append("flash-attn rotary (neither flash-attn nor $ROPE_PEER_DIR/flash_attn_rotary.py)")
    return names


# ---------------------------------------------------------------------------------------------
# The other entry points: q and k together (serving, Hugging Face), fused QKV (TransformerEngine)
# ---------------------------------------------------------------------------------------------
def _hf_formula(q, k, cos, sin, interleaved=False):
    """transformers' Llama formula in plain PyTorch: the eager baseline of the q+k problems
    (``interleaved``: Cohere's, channels 2j and 2j+1 paired, cos and sin repeat_interleaved)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return (q * cos + rotate_half(q, interleaved) * sin,
            k * cos + rotate_half(k, interleaved) * sin)


class QKProblem:
    """q [b, s, q_heads, d] and k [b, s, k_heads, d] (the memory of the projections), rotated at
    positions 0..s-1 of each sequence; every implementation gets the layout its API expects as a
    view of that memory (tokens x heads*d for the cos/sin cache, [b, h, s, d] for HF and Liger).
    ``interleaved``: channels 2j and 2j+1 paired (the cache's ``is_neox=False``, Cohere's and
    GLM's functions) rather than j and j + rotary_dim/2. Bytes: q and k read and written once +
    the float32 cos/sin rows of the s positions."""

    tensor_format = "qk"

    def __init__(self, dtype="bf16", seq_len=4096, batch=16, heads=32, k_heads=8, head_dim=128,
                 rotary_percent=1.0, interleaved=False, seed=0):
        self.dtype_name, self.seq_len, self.batch = dtype, seq_len, batch
        self.heads, self.k_heads, self.head_dim = heads, k_heads, head_dim
        self.interleaved = interleaved
        dtype = DTYPES[dtype]
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        mk = lambda h: torch.randn((batch, seq_len, h, head_dim), device=DEVICE, dtype=dtype,  # noqa: E731
                                   generator=g)
        self.q, self.k, self.gq, self.gk = mk(heads), mk(k_heads), mk(heads), mk(k_heads)
        self.rotary_dim = int(head_dim * rotary_percent)
        inv = 1.0 / 10000 ** (torch.arange(0, self.rotary_dim, 2, device=DEVICE) / self.rotary_dim)
        f = torch.outer(torch.arange(seq_len, device=DEVICE, dtype=torch.float32), inv)
        self.cache = torch.cat((f.cos(), f.sin()), dim=-1)
        # Llama's (and GLM's) layout, cat(freqs, freqs); Cohere's repeats each angle in place.
        self.cos, self.sin = (torch.cat((f, f), -1).cos().to(dtype)[None],
                              torch.cat((f, f), -1).sin().to(dtype)[None])
        pairs = f.repeat_interleave(2, dim=-1)
        self.cos_pairs, self.sin_pairs = pairs.cos().to(dtype)[None], pairs.sin().to(dtype)[None]
        self.positions = torch.arange(seq_len, device=DEVICE).repeat(batch)
        self.n_seqs = batch

    @property
    def nbytes(self) -> int:
        return (2 * (self.q.numel() + self.k.numel()) * self.q.element_size()
                + self.seq_len * self.rotary_dim * 4)

    @property
    def rotated_nbytes(self) -> int:
        """The rotated channels of q and k read and written once + the cos/sin rows: what an
        in-place call that leaves the rest where it is moves (``moved_bytes``)."""
        return (2 * (self.q.numel() + self.k.numel()) // self.head_dim * self.rotary_dim
                * self.q.element_size() + self.seq_len * self.rotary_dim * 4)

    def tokens(self, x):  # [b, s, h, d] -> [b*s, h*d]
        return x.view(self.batch * self.seq_len, -1)

    def row(self) -> dict:
        return dict(tensor_format="qk", dtype=self.dtype_name, seq_len=self.seq_len,
                    batch=self.batch, heads=self.heads, k_heads=self.k_heads,
                    head_dim=self.head_dim, rotary_dim=self.rotary_dim, n_seqs=self.batch,
                    interleaved=self.interleaved)


def qk_implementations(decode: bool = False) -> dict:
    from . import hf, rope_qk
    from .api import apply_rope_with_cos_sin_cache, apply_rope_with_cos_sin_cache_inplace

    # The [tokens, heads * d] views are made once, outside the timed calls, as a serving loop
    # holds its q and k (two views a call cost the decode rows a few microseconds).
    def cache(p, direction, validate=False):
        d, neox = p.head_dim, not p.interleaved
        if direction == "forward":
            q, k = p.tokens(p.q), p.tokens(p.k)
            return lambda: apply_rope_with_cos_sin_cache(p.positions, q, k, d, p.cache, neox,
                                                         validate=validate)
        gq, gk = p.tokens(p.gq), p.tokens(p.gk)
        return lambda: rope_qk.rope_cos_sin_cache(p.positions, gq, gk, d, p.cache, neox,
                                                  backward=True)

    def inplace(p, direction):
        neox = not p.interleaved
        if direction != "forward":  # the backward of the same job, as Liger's rope_backward
            gq, gk = p.tokens(p.gq), p.tokens(p.gk)
            return lambda: rope_qk.rope_cos_sin_cache(p.positions, gq, gk, p.head_dim, p.cache,
                                                      neox, query_out=gq, key_out=gk,
                                                      backward=True)
        q, k = p.tokens(p.q), p.tokens(p.k)
        return lambda: apply_rope_with_cos_sin_cache_inplace(p.positions, q, k, p.head_dim,
                                                             p.cache, neox, validate=False)

    def hf_of(function, pairs, tables):
        """One of hf's functions on the [b, h, s, d] views, given ``tables(p)`` -> its cos and
        sin, or None where it does not apply; backward: the call its operator's backward makes."""
        def make(p, direction):
            cos_sin = tables(p)
            if cos_sin is None:
                return None
            cos, sin = cos_sin
            q, k = p.q.transpose(1, 2), p.k.transpose(1, 2)
            if direction == "forward":
                return lambda: function(q, k, cos, sin)
            gq, gk = p.gq.transpose(1, 2), p.gk.transpose(1, 2)
            return lambda: rope_qk.rope_cos_sin(gq, gk, cos, sin, 1, backward=True, pairs=pairs)
        return make

    def hf_inplace(p, direction):
        """hf.apply_rotary_pos_emb_inplace (Llama's pairs): Liger's job, given what Liger is
        given (the model's cos and sin per token, q and k as [b, h, s, d] views), in place;
        backward: the same call with sin negated on the gradients, in place as Liger's."""
        if p.interleaved:
            return None
        if direction == "forward":
            q, k = p.q.transpose(1, 2), p.k.transpose(1, 2)
            return lambda: hf.apply_rotary_pos_emb_inplace(q, k, p.cos, p.sin)
        gq, gk = p.gq.transpose(1, 2), p.gk.transpose(1, 2)
        return lambda: rope_qk.rope_cos_sin(gq, gk, p.cos, p.sin, 1, backward=True,
                                            q_out=gq, k_out=gk)

    def eager(p, direction):
        if direction != "forward" or p.rotary_dim != p.head_dim:
            return None
        q, k = p.q.transpose(1, 2), p.k.transpose(1, 2)
        if p.interleaved:
            return lambda: _hf_formula(q, k, p.cos_pairs, p.sin_pairs, interleaved=True)
        return lambda: _hf_formula(q, k, p.cos, p.sin)

    impls = {
        "ours: cos_sin_cache, q+k one launch": cache,
        "ours: cos_sin_cache in place": inplace,
        "ours: hf.apply_rotary_pos_emb, q+k one launch": hf_of(
            hf.apply_rotary_pos_emb, "half", lambda p: None if p.interleaved else (p.cos, p.sin)),
        # Interleaved pairs: Cohere's function (cos and sin per channel, the whole head rotated)
        # and GLM's (Llama's layout of cos and sin, partial rotary too).
        "ours: hf.apply_rotary_pos_emb_interleaved (Cohere), q+k one launch": hf_of(
            hf.apply_rotary_pos_emb_interleaved, "interleaved",
            lambda p: ((p.cos_pairs, p.sin_pairs) if p.interleaved and p.rotary_dim == p.head_dim
                       else None)),
        "ours: hf.apply_rotary_pos_emb_glm, q+k one launch": hf_of(
            hf.apply_rotary_pos_emb_glm, "glm", lambda p: (p.cos, p.sin) if p.interleaved else None),
        "ours: hf.apply_rotary_pos_emb_inplace": hf_inplace,
        "torch eager (HF formula)": eager,
    }
    if decode:
        impls["ours: cos_sin_cache, default call (positions checked)"] = (
            lambda p, direction: cache(p, direction, validate=True) if direction == "forward" else None)
        impls["ours: cos_sin_cache in place, CUDA graph replay"] = _qk_graph
    liger = _liger_qk()
    if liger is not None:
        impls["Liger-Kernel (q+k, in place)"] = liger
    return impls


def _qk_graph(p, direction):
    from .api import apply_rope_with_cos_sin_cache_inplace

    if direction != "forward":
        return None
    q, k = p.tokens(p.q), p.tokens(p.k)
    return graph_replay(
        lambda: apply_rope_with_cos_sin_cache_inplace(p.positions, q, k, p.head_dim, p.cache))


def _liger_qk(float32_tables: bool = False):
    """Liger-Kernel's in-place q+k rope on the [b, h, s, d] views of a QKProblem, with the
    model's cos and sin (``float32_tables``: the same cos and sin in float32, from the cache)."""
    try:
        from liger_kernel.ops.rope import rope_backward, rope_forward
    except Exception:  # noqa: BLE001
        return None

    def make(p, direction):
        if p.rotary_dim != p.head_dim or p.interleaved:
            return None  # Liger rotates whole heads of half-split pairs only
        cos, sin = p.cos, p.sin
        if float32_tables:
            half = p.rotary_dim // 2
            cos = torch.cat((p.cache[:, :half], p.cache[:, :half]), -1)[None]
            sin = torch.cat((p.cache[:, half:], p.cache[:, half:]), -1)[None]
        q, k = p.q.transpose(1, 2), p.k.transpose(1, 2)
        if direction == "forward":
            return lambda: rope_forward(q, k, cos, sin)
        gq, gk = p.gq.transpose(1, 2), p.gk.transpose(1, 2)
        return lambda: rope_backward(gq, gk, cos, sin)
    return make


class QKVProblem:
    """TransformerEngine's packed QKV [s, b, h, (n_q + 2) * d] -> q [s, b, h * n_q, d], k, v.
    Bytes: qkv read once, q, k and v written once, + the float32 angle rows (q and k share one
    table here)."""

    tensor_format = "qkv"

    def __init__(self, dtype="bf16", seq_len=4096, batch=16, heads=8, q_per_group=4, head_dim=128,
                 rotary_percent=1.0, interleaved=False, seed=0):
        self.dtype_name, self.seq_len, self.batch, self.heads = dtype, seq_len, batch, heads
        self.interleaved = interleaved
        self.n_q, self.head_dim = q_per_group, head_dim
        dtype = DTYPES[dtype]
        g = torch.Generator(device=DEVICE).manual_seed(seed)
        self.qkv = torch.randn((seq_len, batch, heads, (q_per_group + 2) * head_dim), device=DEVICE,
                               dtype=dtype, generator=g)
        self.splits = [q_per_group * head_dim, head_dim, head_dim]
        self.freqs = RotaryPositionEmbedding(head_dim, rotary_percent, interleaved=interleaved,
                                             device=torch.device(DEVICE))(seq_len)
        self.rotary_dim = self.freqs.shape[-1]
        lead = (seq_len, batch)
        self.grads = [torch.randn((*lead, heads * q_per_group, head_dim), device=DEVICE, dtype=dtype,
                                  generator=g),
                      torch.randn((*lead, heads, head_dim), device=DEVICE, dtype=dtype, generator=g),
                      torch.randn((*lead, heads, head_dim), device=DEVICE, dtype=dtype, generator=g)]
        self.n_seqs = batch

    @property
    def nbytes(self) -> int:
        return 2 * self.qkv.numel() * self.qkv.element_size() + self.seq_len * self.rotary_dim * 4

    def row(self) -> dict:
        return dict(tensor_format="qkv", dtype=self.dtype_name, seq_len=self.seq_len,
                    batch=self.batch, heads=self.heads * self.n_q, k_heads=self.heads,
                    head_dim=self.head_dim, rotary_dim=self.rotary_dim, n_seqs=self.batch,
                    interleaved=self.interleaved)


def _unfused_qkv(qkv, freqs, splits, interleaved=False):
    """TE's unfused recipe (what its test compares the fused kernel with): split, reshape q, two
    RoPE calls; v is returned as the split view."""
    q, k, v = torch.split(qkv, splits, dim=3)
    q = q.reshape(*q.shape[:2], -1, splits[1])
    return (rope_reference(q, freqs, interleaved=interleaved),
            rope_reference(k, freqs, interleaved=interleaved), v)


def qkv_implementations() -> dict:
    from . import rope_qk
    from .api import apply_fused_qkv_rotary_pos_emb

    def ours(p, direction):
        if direction == "forward":
            return lambda: apply_fused_qkv_rotary_pos_emb(p.qkv, p.freqs, p.freqs, p.splits,
                                                          interleaved=p.interleaved,
                                                          validate=False)
        return lambda: rope_qk.rope_qkv_backward(*p.grads, p.freqs, p.freqs, p.splits,
                                                 interleaved=p.interleaved)

    def eager(p, direction):
        if direction != "forward":
            return None
        return lambda: _unfused_qkv(p.qkv, p.freqs, p.splits, p.interleaved)

    def compiled(p, direction):
        if direction != "forward" or p.dtype_name != "bf16":
            return None
        if "qkv" not in _compiled:
            _compiled["qkv"] = torch.compile(_unfused_qkv)
        return lambda: _compiled["qkv"](p.qkv, p.freqs, p.splits, p.interleaved)

    return {"ours: fused QKV, one launch": ours,
            "torch eager (TE unfused: split + 2 calls)": eager,
            "torch.compile (TE unfused: split + 2 calls)": compiled}


# ---------------------------------------------------------------------------------------------
# Sweeps
# ---------------------------------------------------------------------------------------------
def sweeps(mode: str) -> list[tuple[str, dict]]:
    """(sweep name, problem kwargs) for every point, around TE's test defaults."""
    points = []
    axes = {
        "seq_len": [512, 1024, 2048, 4096, 8192],
        "head_dim": [64, 128, 256],
        "batch": [1, 2, 4, 8, 16],
        "heads": [8, 16, 32, 64],
        "rotary_percent": [0.5, 1.0],
    }
    if mode == "quick":
        axes = {"seq_len": [1024, 4096], "rotary_percent": [0.5, 1.0], "batch": [1, 16]}
    for axis, values in axes.items():
        for v in values:
            points.append((axis, {**DEFAULT, axis: v}))
    return points


def _applicable(impls: dict, problem: Problem, direction: str):
    """(name, callable) of every implementation that runs ``problem`` in ``direction``."""
    for name, make in impls.items():
        if name.startswith("torch") and problem.tensor_format == "thd" and problem.n_seqs > 256:
            continue  # TE's unfused thd loops over sequences in Python: > 1 s a call, not timed
        if name == "torch.compile" and (problem.tensor_format == "thd"
                                        or problem.dtype_name != "bf16"):
            continue  # thd graph-breaks on cu_seqlens.tolist(); other dtypes: compile time
        fn = make(problem, direction)
        if fn is not None:
            yield name, fn


# A copy of the bytes moved: one number for every call of a problem, or a function of the bytes
# a call moves (``moved_bytes``), or None where not measured.
CopySame = Union[float, Callable[[int], float], None]


def _failed(name: str, problem: Problem, e: Exception) -> None:
    warnings.warn(f"{name} failed on {problem.row()}: {type(e).__name__}: {e}")


def measure(impls: dict, problem: Problem, direction: str, sweep: str, copy_gbps: float,
            copy_same_gbps: CopySame = None) -> list[dict]:
    """One row per implementation that applies, timed with ``time_ms`` (decode-sized problems:
    ``measure_decode``)."""
    timed = {}
    for name, fn in _applicable(impls, problem, direction):
        try:
            timed[name] = (time_ms(fn), "do_bench median" + (
                ", through torch.autograd.grad"
                if direction == "backward" and name.startswith("torch") else ""))
        except Exception as e:  # noqa: BLE001 - a peer that fails a shape is reported, not fatal
            _failed(name, problem, e)
    return _rows(timed, problem, direction, sweep, copy_gbps, copy_same_gbps)


def measure_decode(problems: list, sweep: str, copy_gbps: float, rounds: int = 4) -> list[dict]:
    """Forward rows of decode-sized ``problems`` ([(implementations, problem)]), timed back to
    back (``time_per_call_us``): every (problem, implementation) warmed up first, then timed once
    per round, ``rounds`` rounds over all of them, each keeping its fastest. Host time drifts by microseconds for
    seconds at a time on the lent machines: interleaved rounds spread that drift over every
    problem and implementation instead of landing on whichever came first (the recorded run of
    d32453e, which timed each problem's rounds together, timed every implementation 30-60% slower
    at its first decode shape, batch 1, than at batch 8; a later run of the same code had them
    level)."""
    timing = "back-to-back per call, fastest of %d rounds" % rounds
    calls = []  # (problem, name, fn)
    for impls, problem in problems:
        for name, fn in _applicable(impls, problem, "forward"):
            try:
                time_per_call_us(fn, calls=200)  # compiles and warms up; a failure shows here
                calls.append((problem, name, fn))
            except Exception as e:  # noqa: BLE001
                _failed(name, problem, e)
    best = [math.inf] * len(calls)
    for _ in range(rounds):
        for i, (_, _, fn) in enumerate(calls):
            best[i] = min(best[i], time_per_call_us(fn, calls=1000, repeats=2) / 1e3)
    rows = []
    for _, problem in problems:
        timed = {name: (ms, timing) for (p, name, _), ms in zip(calls, best) if p is problem}
        rows += _rows(timed, problem, "forward", sweep, copy_gbps)
    return rows


# In-place calls that leave the channels past rotary_dim where they are, neither read nor
# written (as vLLM's and FlashInfer's in-place kernels do): with part of the head rotated they
# move the rotated channels only, and their GB/s count those bytes (``moved_bytes``).
ROTATED_CHANNELS_ONLY = frozenset({"ours: cos_sin_cache in place",
                                   "ours: hf.apply_rotary_pos_emb_inplace",
                                   "ours: cos_sin_cache in place, CUDA graph replay"})


def moved_bytes(problem: Problem, impl: str) -> int:
    """Bytes ``impl`` moves on ``problem``: ``problem.nbytes``, but ``problem.rotated_nbytes`` for
    a call of ROTATED_CHANNELS_ONLY with part of the head rotated."""
    if impl in ROTATED_CHANNELS_ONLY and problem.rotary_dim < problem.head_dim:
        return problem.rotated_nbytes
    return problem.nbytes


def _rows(timed: dict, problem: Problem, direction: str, sweep: str, copy_gbps: float,
          copy_same_gbps: CopySame = None) -> list[dict]:
    """Benchmark rows from {implementation: (ms, how it was timed)}. ``copy_same_gbps``: the
    copy of the bytes moved, a number (every call moves ``problem.nbytes``) or a function of
    the bytes (``moved_bytes``)."""
    rows = []
    for name, (ms, timing) in timed.items():
        moved = moved_bytes(problem, name)
        gbps = moved / ms / 1e6
        same = copy_same_gbps(moved) if callable(copy_same_gbps) else copy_same_gbps
        rows.append(dict(gpu=torch.cuda.get_device_name(), impl=name, direction=direction,
                         sweep=sweep, ms=ms, gbps=gbps, copy_gbps=copy_gbps, timing=timing,
                         entry=_entry(problem.tensor_format), copy_same_gbps=same,
                         **problem.row()))
    return rows


def benchmark_jobs(mode: str = "full", formats: Iterable[str] = ("sbhd", "bshd", "thd"),
                   dtypes: Optional[Iterable[str]] = None, entries: bool = False) -> list[tuple]:
    """Every problem of a run: (sweep, problem kwargs, tensor_format, dtype, is_decode). With
    ``entries``, also the q+k ("qk") and fused QKV ("qkv") problems of the other entry points."""
    dtypes = list(dtypes or (["bf16"] if mode == "quick" else ["bf16", "fp16", "fp32"]))
    jobs = []
    for fmt in formats:
        for dtype in dtypes:
            if fmt == "thd":
                n_list = [16, 4096] if mode == "quick" else [16, 256, 4096, 16384, 65536]
                for n in n_list:
                    jobs.append(("thd_n_seqs", dict(DEFAULT, n_seqs=n), fmt, dtype, False))
                if mode != "quick" and dtype == "bf16":
                    # 8 heads (a grouped-query k): 2 KB token rows, four times the tokens per
                    # byte, where the pre-pass weighs most. 131072 tokens, 268 MB each way.
                    for n in n_list:
                        jobs.append(("thd_n_seqs_8_heads",
                                     dict(DEFAULT, seq_len=8192, heads=8, n_seqs=n), fmt, dtype,
                                     False))
                jobs.append(("rotary_percent", dict(DEFAULT, n_seqs=256, rotary_percent=0.5),
                             fmt, dtype, False))
                if mode != "quick" and dtype == "bf16":
                    jobs.append(("interleaved", dict(DEFAULT, n_seqs=256, interleaved=True), fmt,
                                 dtype, False))
                continue
            if mode != "quick" and dtype == "bf16":
                # GPT-J's pairs (channels 2j and 2j+1) at TE's test default shape: one point,
                # not a sweep (the kernels' other axes are the half-split pairs').
                jobs.append(("interleaved", dict(DEFAULT, interleaved=True), fmt, dtype, False))
            for sweep, kw in sweeps(mode):
                if dtype != "bf16" and sweep not in ("seq_len", "rotary_percent"):
                    continue  # other dtypes: the main axes only
                jobs.append((sweep, kw, fmt, dtype, False))
    for b in ([1, 64] if mode == "quick" else [1, 8, 64, 256]):
        jobs.append(("decode", dict(DEFAULT, seq_len=1, batch=b), "bshd", "bf16", True))
    if entries:
        qk = dict(seq_len=4096, batch=16, heads=32, k_heads=8, head_dim=128)
        points = ([("qk", qk), ("qk", dict(qk, seq_len=1024, batch=4))] if mode == "quick" else
                  [("qk", dict(qk, seq_len=s)) for s in (1024, 2048, 4096, 8192)]
                  + [("qk", dict(qk, batch=b)) for b in (1, 2, 4)]
                  + [("qk", dict(qk, heads=h, k_heads=hk)) for h, hk in ((32, 32), (64, 8), (16, 4))]
                  + [("qk", dict(qk, head_dim=64)), ("qk", dict(qk, rotary_percent=0.5))])
        for dtype in (["bf16"] if mode == "quick" else ["bf16", "fp32"]):
            jobs += [("qk", kw, "qk", dtype, False) for _, kw in points]
        if mode != "quick":
            # Interleaved pairs (the cache's is_neox=False, Cohere's and GLM's functions).
            jobs += [("interleaved", dict(kw, interleaved=True), "qk", dtype, False)
                     for kw, dtype in ((qk, "bf16"), (dict(qk, seq_len=1024), "bf16"),
                                       (dict(qk, head_dim=64), "bf16"),
                                       (dict(qk, rotary_percent=0.5), "bf16"), (qk, "fp32"))]
        jobs.append(("decode", dict(qk, seq_len=1, batch=64), "qk", "bf16", True))
        qkv = dict(seq_len=4096, batch=8, heads=8, q_per_group=4, head_dim=128)
        for kw in ([qkv] if mode == "quick" else
                   [qkv, dict(qkv, seq_len=2048, batch=2, heads=64, q_per_group=4),
                    dict(qkv, q_per_group=1), dict(qkv, rotary_percent=0.5)]):
            jobs.append(("qkv", kw, "qkv", "bf16", False))
        if mode != "quick":
            jobs.append(("interleaved", dict(qkv, interleaved=True), "qkv", "bf16", False))
    return jobs


def _entry(fmt: str) -> str:
    """The entry point a problem format belongs to: "qk", "qkv", or "te" (sbhd, bshd, thd)."""
    return fmt if fmt in ("qk", "qkv") else "te"


def make_problem(fmt: str, dtype: str, kw: dict):
    if fmt == "qk":
        return QKProblem(dtype, **kw)
    if fmt == "qkv":
        return QKVProblem(dtype, **kw)
    return Problem(fmt, dtype, **kw)


def run(mode: str = "quick", out: pathlib.Path = FIGURES, formats: Iterable[str] = ("sbhd", "bshd", "thd"),
        dtypes: Optional[Iterable[str]] = None, progress: bool = True,
        budget_s: Optional[float] = None, only: Optional[Iterable[str]] = None):
    """Run the sweeps: decode first (every decode problem together), then the rest, most important
    first (bf16, then fp16/fp32), writing the CSV after every problem; with ``budget_s``, stop
    starting new problems after that many seconds (decode rows are always measured)."""
    import time
    import pandas as pd

    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        tqdm = None
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    copy_gbps = copy_bandwidth_gbps()
    prov = provenance(copy_gbps, mode)
    print(f"{prov['gpu']}: device-to-device copy {copy_gbps:.0f} GB/s (read + write)")
    impls = {"te": implementations(), "qk": qk_implementations(), "qkv": qkv_implementations()}
    decode_impls = {"te": implementations(decode=True), "qk": qk_implementations(decode=True)}
    for name in missing_peers():
        print("skipped:", name)
    jobs = [j for j in benchmark_jobs(mode, formats, dtypes, entries=True)
            if only is None or j[2] in only]
    jobs.sort(key=lambda job: (job[3] != "bf16", not job[4]))  # bf16 first, decode early
    rows, started, skipped = [], time.time(), 0
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    # Decode rows first, while the run is young and nothing else has run: every decode problem of
    # every entry point together, so that their rounds interleave (``measure_decode``).
    # torch.compile's decode rows are timed after every other decode row: eager calls timed
    # after a compiled function ran in the process were slower on these hosts (see
    # scripts/launch_latency.py), and the order must not favour anyone.
    decode_jobs = [job for job in jobs if job[4]]
    jobs = [job for job in jobs if not job[4]]
    if decode_jobs:
        problems = [(_entry(fmt), make_problem(fmt, dtype, kw))
                    for _, kw, fmt, dtype, _ in decode_jobs]
        for late in (False, True):
            group = [({n: m for n, m in decode_impls[entry].items()
                       if n.startswith("torch.compile") == late}, p) for entry, p in problems]
            rows += measure_decode(group, "decode", copy_gbps)
        del problems, group
        torch.cuda.empty_cache()
    copy_same = {}

    def copy_of(moved: int) -> float:  # one copy measured per size moved, for the run
        if moved not in copy_same:
            copy_same[moved] = copy_same_bytes_gbps(moved)
        return copy_same[moved]

    bar = tqdm(jobs, desc="rope bench", disable=not progress) if tqdm else jobs
    for sweep, kw, fmt, dtype, _ in bar:
        if budget_s is not None and time.time() - started > budget_s:
            skipped += 1
            continue
        p = make_problem(fmt, dtype, kw)
        copy_of(p.nbytes)
        for direction in ("forward", "backward"):
            rows += measure(impls[_entry(fmt)], p, direction, sweep, copy_gbps,
                            copy_same_gbps=copy_of)
        del p
        torch.cuda.empty_cache()
        pd.DataFrame(rows).reindex(columns=COLUMNS).to_csv(out / "bench.csv", index=False,
                                                            float_format="%.6g")
    if skipped:
        print(f"time budget of {budget_s:.0f} s reached: {skipped} of {len(jobs)} problems not run")
        prov["not_run"] = f"{skipped} of {len(jobs)} problems (time budget {budget_s:.0f} s)"
        (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    df = pd.DataFrame(rows).reindex(columns=COLUMNS)
    plot_all(df, prov, out)
    print(summary(df))
    return df, prov


# ---------------------------------------------------------------------------------------------
# Recorded results, plots and the summary
# ---------------------------------------------------------------------------------------------
def load_recorded(folder: pathlib.Path = FIGURES):
    """The recorded benchmark: (DataFrame, provenance dict)."""
    import pandas as pd

    folder = pathlib.Path(folder)
    return pd.read_csv(folder / "bench.csv"), json.loads((folder / "provenance.json").read_text())


def caption(prov: dict, dtype: str, tensor_format: str) -> str:
    return (f"{prov['gpu']}, {dtype}, {tensor_format}; torch {prov['torch']}, triton "
            f"{prov['triton']}, {prov['date']}; copy {prov['copy_gbps']:.0f} GB/s")


def plot_sweep(df, prov: dict, sweep: str, direction: str = "forward", dtype: str = "bf16",
               tensor_format: str = "sbhd", ax=None, impls: Optional[list] = None):
    """Achieved GB/s along one sweep axis, with the measured copy bandwidth as the ceiling."""
    import matplotlib.pyplot as plt

    x = {"thd_n_seqs": "n_seqs", "thd_n_seqs_8_heads": "n_seqs",
         "rotary_percent": "rotary_dim"}.get(sweep, sweep)
    sel = df[(df.sweep == sweep) & (df.direction == direction) & (df.dtype == dtype)
             & (df.tensor_format == tensor_format)]
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.8))
    for name, grp in sel.groupby("impl", sort=False):
        if impls is not None and name not in impls:
            continue
        grp = grp.sort_values(x)
        ax.plot(grp[x], grp.gbps, marker="o", label=name)
    ax.axhline(prov["copy_gbps"], color="k", ls="--", lw=1,
               label=f"device copy {prov['copy_gbps']:.0f} GB/s")
    ax.set_xlabel(x)
    if x in ("seq_len", "batch", "heads", "n_seqs"):
        ax.set_xscale("log", base=2)
    ax.set_ylabel("GB/s")
    ax.set_ylim(0, prov["copy_gbps"] * 1.1)
    ax.set_title(f"RoPE {direction}, {sweep}", fontsize=10)
    ax.text(0.0, -0.28, caption(prov, dtype, tensor_format), transform=ax.transAxes, fontsize=7)
    ax.legend(fontsize=7, loc="lower right")
    return ax


def plot_all(df, prov: dict, out: pathlib.Path):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    te_rows = df[df["entry"].fillna("te") == "te"] if "entry" in df else df
    for sweep in sorted(set(te_rows.sweep) - {"decode", "interleaved"}):  # (the latter: points)
        fmt = "thd" if sweep.startswith("thd_n_seqs") else "sbhd"
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        for ax, direction in zip(axes, ("forward", "backward")):
            plot_sweep(df, prov, sweep, direction, "bf16", fmt, ax=ax)
        fig.tight_layout()
        fig.savefig(out / f"sweep_{sweep}.png", dpi=110)
        plt.close(fig)


PRIMARY = {"te": "triton-2d (ours)", "qk": "ours: cos_sin_cache, q+k one launch",
           "qkv": "ours: fused QKV, one launch"}
# Our in-place call of each entry point: what an in-place peer (Liger) is compared with, the
# first of its names that ran at a shape. q+k: the Hugging Face in-place call, which is given
# what Liger is given (the model's cos and sin, gathered per token); the cache call, which reads
# each token's position first, where that call did not run (interleaved pairs, and recordings
# made before it existed).
IN_PLACE = {"te": ("triton-2d (ours), in place",),
            "qk": ("ours: hf.apply_rotary_pos_emb_inplace", "ours: cos_sin_cache in place")}


def compare_with_peers(df):
    """Per shape and direction (``PEER_KEYS``, not decode) where our primary call ran: its time
    (``ms``), MB moved, fraction of the run's copy (``copy_frac``) and of a copy of the same bytes
    (``same_size_frac``), its speed-up over the fastest peer doing the same job (``speedup``,
    target >= 1, that peer in ``best_other``: an in-place peer (Liger) against our in-place call,
    the others against our primary call, which returns new tensors) and over any peer
    (``speedup_any``: the primary call against every peer). A shape measured in two sweeps has
    a row for each (the summary's medians count both)."""
    import pandas as pd

    df = _normalised(df)
    keys = PEER_KEYS
    sized = df[df.sweep != "decode"].assign(mbytes=lambda d: d.gbps * d.ms)  # GB/s x ms = MB
    ours = sized[sized.impl == sized.entry.map(PRIMARY)].set_index(keys)
    # (A shape can be in two sweeps: one time per shape.)
    ours_in_place = _first_in_place(sized, keys)
    others = sized[~sized.impl.str.contains("ours")]

    def fastest(rows):
        return rows.loc[rows.groupby(keys).ms.idxmin()].set_index(keys)[["ms", "impl"]]

    joined = ours.copy()
    joined["copy_frac"] = joined.gbps / joined.copy_gbps
    joined["same_size_frac"] = joined.gbps / joined.copy_same_gbps
    any_peer = fastest(others).reindex(joined.index)
    joined["speedup_any"] = any_peer.ms / joined.ms
    in_place = others.impl.str.contains("in place")
    ratios = []  # (ratio, peer) per kind of job
    for peers, mine in ((others[~in_place], joined.ms),
                        (others[in_place], ours_in_place.reindex(joined.index).fillna(joined.ms))):
        if len(peers):
            best = fastest(peers).reindex(joined.index)
            ratios.append((best.ms / mine, best.impl))
    if ratios:
        frame = pd.concat([r for r, _ in ratios], axis=1)
        pick = frame.fillna(math.inf).values.argmin(axis=1)
        joined["speedup"] = frame.min(axis=1)
        names = pd.concat([n for _, n in ratios], axis=1).values
        joined["best_other"] = [row[i] for row, i in zip(names, pick)]
    else:
        joined["speedup"], joined["best_other"] = math.nan, None
    return joined


def _first_in_place(sized, keys):
    """Per shape (``keys``), the time of the first of IN_PLACE's calls of its entry point that
    ran there."""
    import pandas as pd

    ranked = [sized[(sized.entry == entry) & (sized.impl == name)].assign(_rank=rank)
              for entry, names in IN_PLACE.items() for rank, name in enumerate(names)]
    ranked = pd.concat(ranked)
    if not len(ranked):
        return ranked.groupby(keys).ms.min()
    first = ranked[ranked._rank == ranked.groupby(keys)._rank.transform("min")]
    return first.groupby(keys).ms.min()


def _normalised(df):
    """Rows of older recordings (no entry, k_heads, copy_same_gbps or interleaved column) as
    current ones."""
    df = df.assign(entry=df["entry"].fillna("te") if "entry" in df else "te",
                   k_heads=df["k_heads"].fillna(0) if "k_heads" in df else 0,
                   interleaved=(df["interleaved"].fillna(False).astype(bool)
                                if "interleaved" in df else False))
    return df if "copy_same_gbps" in df else df.assign(copy_same_gbps=math.nan)


PEER_KEYS = ["entry", "direction", "tensor_format", "dtype", "seq_len", "batch", "heads",
             "k_heads", "head_dim", "rotary_dim", "n_seqs", "interleaved"]


def summary(df) -> str:
    """Per entry point (TE-style, q+k, fused QKV), format, dtype, direction and pairing
    (``interleaved``: GPT-J's adjacent channels, else half-split), on shapes that
    move >= 256 MB and on all shapes: our kernel's fraction of the copy bandwidth (the 2 GB copy
    of the run) and of a copy of the same bytes (``copy_same_gbps``, where recorded), and its
    speed-up over the fastest peer doing the same job at each shape (``compare_with_peers``;
    target: >= 1); ``speedup_any_min``: the primary call against every peer. Then the worst of
    each, naming the shape and the peer; then decode."""
    df = _normalised(df)
    joined = compare_with_peers(df)
    big = joined[joined.mbytes >= 256]
    group = ["entry", "tensor_format", "dtype", "direction", "interleaved"]
    table = joined.groupby(group).agg(copy_frac_all_min=("copy_frac", "min"),
                                      speedup_min=("speedup", "min"),
                                      speedup_any_min=("speedup_any", "min"))
    table = big.groupby(group).agg(copy_frac_256MB_min=("copy_frac", "min"),
                                   copy_frac_256MB_median=("copy_frac", "median"),
                                   same_size_256MB_min=("same_size_frac", "min")).join(
                                       table, how="outer")
    lines = ["ours (" + ", ".join(f"{k}: {v}" for k, v in PRIMARY.items()) + "): fraction of "
             "copy bandwidth (2 GB copy; same_size: a copy of the same bytes), and speed-up over "
             "the fastest peer doing the same job (speedup_any: over any peer) at each shape\n"
             + table.round(3).to_string()]
    worst = []
    for entry, grp in joined.reset_index().groupby("entry"):
        big_e = grp[grp.mbytes >= 256]
        if len(big_e):
            r = big_e.loc[big_e.copy_frac.idxmin()]
            same = ("" if math.isnan(r.same_size_frac)
                    else f" ({r.same_size_frac:.3f} of a copy of the same bytes)")
            worst.append(f"{entry}: worst fraction of copy (>= 256 MB) {r.copy_frac:.3f}{same} at "
                         f"{_shape(r)}")
        rated = grp.dropna(subset=["speedup"])
        if len(rated):
            r = rated.loc[rated.speedup.idxmin()]
            worst.append(f"{entry}: worst ratio to the fastest peer doing the same job "
                         f"{r.speedup:.3f} ({r.best_other}) at {_shape(r)}")
    if worst:
        lines.append("\n".join(worst))
    dec = df[df.sweep == "decode"]
    if len(dec):
        dec = dec.assign(us=dec.ms * 1e3).pivot_table(index=["entry", "batch"], columns="impl",
                                                      values="us")
        lines.append("decode forward (seq 1, 32 heads (q+k: 32 q, 8 k), head_dim 128, bf16), "
                     "microseconds per call back to back:\n"
                     + dec.round(1).T.dropna(how="all").to_string())
    return "\n\n".join(lines)


def _shape(r) -> str:
    extra = f" k_heads {int(r['k_heads'])}" if r["k_heads"] else ""
    return (f"{r['tensor_format']} {r['dtype']} {r['direction']} s{int(r['seq_len'])} "
            f"b{int(r['batch'])} h{int(r['heads'])}{extra} d{int(r['head_dim'])} "
            f"rot{int(r['rotary_dim'])}"
            + (f" n_seqs {int(r['n_seqs'])}" if r["tensor_format"] == "thd" else "")
            + (" interleaved" if r.get("interleaved", False) else ""))


def show_recorded(folder: pathlib.Path = FIGURES) -> None:
    """Without a GPU: check the kernels in the interpreter, then print the recorded run."""
    from . import MODE, RotaryPositionEmbedding, apply_rotary_pos_emb

    t = torch.randn(8, 2, 4, 64, generator=torch.Generator().manual_seed(0))
    freqs = RotaryPositionEmbedding(64)(8)
    ref = rope_reference(t.double(), freqs)
    for kernel in ("1d", "2d"):
        err = (apply_rotary_pos_emb(t, freqs, fused=True, kernel=kernel).double() - ref).abs()
        print(f"{kernel} kernel ({MODE}): max |error| vs float64 reference = {err.max():.1e}")
    df, prov = load_recorded(folder)
    print(f"\nNo GPU here, so nothing is timed. Recorded run: {prov['gpu']}, {prov['date']}, "
          f"torch {prov['torch']}, triton {prov['triton']}, copy {prov['copy_gbps']:.0f} GB/s "
          f"({prov['command']}):\n")
    print(summary(df))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["quick", "full"], default="quick")
    parser.add_argument("--out", type=pathlib.Path, default=FIGURES)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting new problems after this many seconds")
    parser.add_argument("--only", default=None,
                        help="comma-separated problem kinds to run: sbhd, bshd, thd, qk, qkv")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        show_recorded(args.out)
        return 0
    run(args.mode, args.out, progress=not args.no_progress, budget_s=args.budget_s,
        only=args.only.split(",") if args.only else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
