"""Bandwidth benchmark: ``python -m rope_kernels.bench [--mode quick|full] [--out figures]``.

RoPE is memory-bound, so speed is reported as achieved bandwidth against what the memory can do:

    GB/s = (bytes read of t + bytes written of out + bytes of the float32 angle rows used) / time

the fewest bytes any implementation must move (the same count for every implementation, so the
numbers compare times). The ceiling is the device-to-device copy bandwidth measured first, in the
same run, counting bytes read plus bytes written. Times are medians of
``triton.testing.do_bench`` (which clears L2 before every call) on tensors larger than L2; decode-
sized calls are timed back to back with CUDA events instead, so Python launch cost is included.

Writes ``bench.csv`` (one row per measurement), ``provenance.json`` (GPU, versions, date, copy
bandwidth, command) and plots into the output folder, and prints a short summary.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import pathlib
import platform
import sys
import warnings
from typing import Callable, Iterable, Optional

import torch
import triton

from .reference import RotaryPositionEmbedding, rope_reference
from .rope_2d import rope_2d

FIGURES = pathlib.Path(__file__).resolve().parents[1] / "figures"
DEFAULT = dict(seq_len=4096, batch=16, heads=32, head_dim=128, rotary_percent=1.0)
COLUMNS = ["gpu", "impl", "direction", "tensor_format", "dtype", "seq_len", "batch", "heads",
           "head_dim", "rotary_dim", "n_seqs", "sweep", "ms", "gbps", "copy_gbps", "timing"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ---------------------------------------------------------------------------------------------
# Timing and the ceiling
# ---------------------------------------------------------------------------------------------
def time_ms(fn: Callable[[], object], warmup: int = 20, rep: int = 60) -> float:
    """Median milliseconds of ``fn`` on the GPU (do_bench: warm-up, L2 flushed before each call)."""
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def time_per_call_us(fn: Callable[[], object], calls: int = 2000) -> float:
    """Microseconds per call of ``fn`` run back to back: max(Python launch, GPU time)."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = math.inf
    for _ in range(3):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1e3 / calls)
    return best


def copy_bandwidth_gbps(nbytes: int = 2 * 1024**3) -> float:
    """Device-to-device copy of ``nbytes``: (bytes read + bytes written) / median time."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * nbytes / ms / 1e6


def provenance(copy_gbps: float, mode: str) -> dict:
    return {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "copy_gbps": round(copy_gbps, 1),
        "mode": mode,
        "command": "python -m rope_kernels.bench --mode " + mode,
        "bytes": "read t + write out + read the float32 angle rows used (once)",
        "timing": "triton.testing.do_bench median (L2 flushed per call); decode: back-to-back "
                  "calls timed with CUDA events, Python launch included. Backward: the Triton "
                  "kernels' backward call directly; torch eager/compile through "
                  "torch.autograd.grad",
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
        g = torch.Generator(device="cuda").manual_seed(seed)
        self.cu_seqlens = None
        if tensor_format == "thd":
            # seq_len * batch tokens cut at random into n_seqs sequences of varying length
            total = seq_len * batch
            self.n_seqs = n_seqs
            cuts = torch.randperm(total - 1, generator=g, device="cuda")[: n_seqs - 1] + 1
            cu = torch.cat([torch.zeros(1, device="cuda", dtype=torch.long), cuts.sort().values,
                            torch.full((1,), total, device="cuda", dtype=torch.long)])
            self.cu_seqlens = cu.to(torch.int32)
            self.max_len = int((cu[1:] - cu[:-1]).max())
            shape = (total, heads, head_dim)
        else:
            self.n_seqs = batch
            self.max_len = seq_len
            shape = (seq_len, batch, heads, head_dim)
            if tensor_format == "bshd":
                shape = (batch, seq_len, heads, head_dim)
        self.t = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
        self.grad = torch.randn(shape, device="cuda", dtype=dtype, generator=g)
        emb = RotaryPositionEmbedding(head_dim, rotary_percent, interleaved=interleaved,
                                      device=torch.device("cuda"))
        self.freqs = emb(self.max_len)
        self.rotary_dim = self.freqs.shape[-1]

    @property
    def nbytes(self) -> int:
        # Table rows actually read: every row up to the longest sequence.
        return 2 * self.t.numel() * self.t.element_size() + self.max_len * self.rotary_dim * 4

    def kwargs(self) -> dict:
        return dict(tensor_format=self.tensor_format, interleaved=self.interleaved,
                    cu_seqlens=self.cu_seqlens)

    def row(self) -> dict:
        return dict(tensor_format=self.tensor_format, dtype=self.dtype_name,
                    seq_len=self.seq_len, batch=self.batch, heads=self.heads,
                    head_dim=self.head_dim, rotary_dim=self.rotary_dim,
                    n_seqs=self.n_seqs)


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


def _liger():
    """Liger-Kernel's in-place Triton rope, which rotates q and k ([b, h, s, d] views of
    [b, s, h, d] memory, half-split pairs, full rotary only) in one launch."""
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
        cos, sin = f.cos().to(p.t.dtype), f.sin().to(p.t.dtype)
        if direction == "forward":
            return lambda: rope_forward(q, k, cos, sin)
        return lambda: rope_backward(q, k, cos, sin)
    return make


def _cuda_graph(launcher):
    """Our kernel captured once in a CUDA graph and replayed: what a decode loop that uses
    graphs (as serving stacks do) pays per call, with no Python launch path at all."""
    def make(p: Problem, direction: str):
        if direction != "forward":
            return None
        kw = p.kwargs()
        out = launcher(p.t, p.freqs, **kw)  # compile outside the capture
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            launcher(p.t, p.freqs, out=out, **kw)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launcher(p.t, p.freqs, out=out, **kw)
        return graph.replay
    return make


def implementations(decode: bool = False) -> dict:
    """name -> make(problem, direction) -> zero-argument callable (or None: not applicable)."""
    impls = {
        "triton-2d (ours)": _ours_api("2d"),
        "triton-1d (ours)": _ours_api("1d"),
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
    return impls


def missing_peers() -> list[str]:
    names = []
    if _te() is None:
        names.append("TransformerEngine (not importable: needs its CUDA build)")
    if _liger() is None:
        names.append("Liger-Kernel (not importable)")
    names.append("flash-attn rotary (not importable without flash-attn's CUDA extension)")
    return names


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


def measure(impls: dict, problem: Problem, direction: str, sweep: str, copy_gbps: float,
            decode: bool = False) -> list[dict]:
    rows = []
    for name, make in impls.items():
        if name.startswith("torch") and problem.tensor_format == "thd" and problem.n_seqs > 256:
            continue  # TE's unfused thd loops over sequences in Python: > 1 s a call, not timed
        if name == "torch.compile" and (problem.tensor_format == "thd"
                                        or problem.dtype_name != "bf16"):
            continue  # thd graph-breaks on cu_seqlens.tolist(); other dtypes: compile time
        fn = make(problem, direction)
        if fn is None:
            continue
        try:
            if decode:
                ms = time_per_call_us(fn) / 1e3
                timing = "back-to-back per call"
            else:
                ms = time_ms(fn)
                timing = "do_bench median" + (", through torch.autograd.grad"
                                              if direction == "backward" and name.startswith("torch")
                                              else "")
        except Exception as e:  # noqa: BLE001 - a peer that fails a shape is reported, not fatal
            warnings.warn(f"{name} failed on {problem.row()}: {type(e).__name__}: {e}")
            continue
        gbps = problem.nbytes / ms / 1e6
        rows.append(dict(gpu=torch.cuda.get_device_name(), impl=name, direction=direction,
                         sweep=sweep, ms=ms, gbps=gbps, copy_gbps=copy_gbps, timing=timing,
                         **problem.row()))
    return rows


def benchmark_jobs(mode: str = "full", formats: Iterable[str] = ("sbhd", "bshd", "thd"),
                   dtypes: Optional[Iterable[str]] = None) -> list[tuple]:
    """Every problem of a run: (sweep, problem kwargs, tensor_format, dtype, is_decode)."""
    dtypes = list(dtypes or (["bf16"] if mode == "quick" else ["bf16", "fp16", "fp32"]))
    jobs = []
    for fmt in formats:
        for dtype in dtypes:
            if fmt == "thd":
                n_list = [16, 4096] if mode == "quick" else [16, 256, 4096, 16384]
                for n in n_list:
                    jobs.append(("thd_n_seqs", dict(DEFAULT, n_seqs=n), fmt, dtype, False))
                jobs.append(("rotary_percent", dict(DEFAULT, n_seqs=256, rotary_percent=0.5),
                             fmt, dtype, False))
                continue
            for sweep, kw in sweeps(mode):
                if dtype != "bf16" and sweep not in ("seq_len", "rotary_percent"):
                    continue  # other dtypes: the main axes only
                jobs.append((sweep, kw, fmt, dtype, False))
    for b in ([1, 64] if mode == "quick" else [1, 8, 64, 256]):
        jobs.append(("decode", dict(DEFAULT, seq_len=1, batch=b), "bshd", "bf16", True))
    return jobs


def run(mode: str = "quick", out: pathlib.Path = FIGURES, formats: Iterable[str] = ("sbhd", "bshd", "thd"),
        dtypes: Optional[Iterable[str]] = None, progress: bool = True,
        budget_s: Optional[float] = None):
    """Run the sweeps, most important first (bf16, decode, then fp16/fp32), writing the CSV after
    every problem; with ``budget_s``, stop starting new problems after that many seconds."""
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
    impls = implementations()
    decode_impls = implementations(decode=True)
    for name in missing_peers():
        print("skipped:", name)
    jobs = benchmark_jobs(mode, formats, dtypes)
    jobs.sort(key=lambda job: (job[3] != "bf16", not job[4]))  # bf16 first, decode early
    rows, started, skipped = [], time.time(), 0
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    bar = tqdm(jobs, desc="rope bench", disable=not progress) if tqdm else jobs
    for sweep, kw, fmt, dtype, decode in bar:
        if budget_s is not None and time.time() - started > budget_s:
            skipped += 1
            continue
        p = Problem(fmt, dtype, **kw)
        # Decode is inference: forward only.
        for direction in ("forward",) if decode else ("forward", "backward"):
            rows += measure(decode_impls if decode else impls, p, direction, sweep, copy_gbps,
                            decode)
        del p
        torch.cuda.empty_cache()
        pd.DataFrame(rows)[COLUMNS].to_csv(out / "bench.csv", index=False, float_format="%.6g")
    if skipped:
        print(f"time budget of {budget_s:.0f} s reached: {skipped} of {len(jobs)} problems not run")
        prov["not_run"] = f"{skipped} of {len(jobs)} problems (time budget {budget_s:.0f} s)"
        (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    df = pd.DataFrame(rows)[COLUMNS]
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

    x = {"thd_n_seqs": "n_seqs", "rotary_percent": "rotary_dim"}.get(sweep, sweep)
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

    for sweep in sorted(set(df.sweep) - {"decode"}):
        fmt = "thd" if sweep == "thd_n_seqs" else "sbhd"
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
        for ax, direction in zip(axes, ("forward", "backward")):
            plot_sweep(df, prov, sweep, direction, "bf16", fmt, ax=ax)
        fig.tight_layout()
        fig.savefig(out / f"sweep_{sweep}.png", dpi=110)
        plt.close(fig)


def summary(df) -> str:
    """Per (format, dtype, direction): our 2-D kernel's fraction of the copy bandwidth on shapes
    that move >= 256 MB (the target: >= 0.95), and on all shapes; and its speed-up over the
    fastest other implementation measured at each shape (the target: >= 1)."""
    keys = ["direction", "tensor_format", "dtype", "seq_len", "batch", "heads", "head_dim",
            "rotary_dim", "n_seqs"]
    sized = df[df.sweep != "decode"].assign(mbytes=lambda d: d.gbps * d.ms)  # GB/s x ms = MB
    ours = sized[sized.impl == "triton-2d (ours)"].set_index(keys)
    others = sized[~sized.impl.str.contains("ours")].groupby(keys).ms.min()
    joined = ours.join(others.rename("best_other_ms"))
    joined["copy_frac"] = joined.gbps / joined.copy_gbps
    joined["speedup"] = joined.best_other_ms / joined.ms
    big = joined[joined.mbytes >= 256]
    table = joined.groupby(["tensor_format", "dtype", "direction"]).agg(
        copy_frac_all_min=("copy_frac", "min"), speedup_min=("speedup", "min"))
    table = big.groupby(["tensor_format", "dtype", "direction"]).agg(
        copy_frac_256MB_min=("copy_frac", "min"),
        copy_frac_256MB_median=("copy_frac", "median")).join(table, how="outer")
    lines = ["triton-2d (ours): fraction of copy bandwidth, and speed-up over the fastest other "
             "implementation at each shape\n" + table.round(3).to_string()]
    dec = df[df.sweep == "decode"]
    if len(dec):
        dec = dec.assign(us=dec.ms * 1e3).pivot_table(index="batch", columns="impl", values="us")
        lines.append("decode forward (seq 1, heads 32, head_dim 128, bf16, bshd), microseconds "
                     "per call back to back:\n" + dec.round(1).to_string())
    return "\n\n".join(lines)


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
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        show_recorded(args.out)
        return 0
    run(args.mode, args.out, progress=not args.no_progress, budget_s=args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
