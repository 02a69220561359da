"""Small helpers the notebooks share: the mode banner, kernel source, live or recorded results.

On a GPU the benchmark cells measure live with ``rope_kernels.bench``; on a CPU they load the
recorded run in ``figures/`` and say which GPU and date it comes from, so a reader sees real GPU
numbers either way.
"""

from __future__ import annotations

import inspect
from typing import Optional

import torch

from . import bench
from .rope_2d import INTERPRETED

ON_GPU = torch.cuda.is_available() and not INTERPRETED
DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")


def banner() -> str:
    """One line saying where the kernels run."""
    import triton

    if ON_GPU:
        return (f"GPU mode: {torch.cuda.get_device_name()}, kernels compiled by Triton "
                f"{triton.__version__}; benchmark cells measure live.")
    return (f"CPU mode: no GPU, kernels run in Triton {triton.__version__}'s interpreter (slow, "
            f"so shapes are tiny); benchmark cells show the recorded GPU run from figures/.")


def show_source(obj) -> None:
    """Print the source of a kernel or function exactly as the package defines it."""
    fn = getattr(obj, "fn", obj)  # a @triton.jit kernel keeps the Python function in .fn
    print(inspect.getsource(fn).rstrip())


def randn(shape, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """Seeded normal values made on the CPU (identical on every machine), then moved."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(DEVICE, dtype)


def results(sweep: Optional[str] = None, live_impls: Optional[list] = None, **filters):
    """Benchmark rows (DataFrame) and provenance for one sweep of ``rope_kernels.bench``.

    GPU: measure the sweep now (bf16, sbhd unless given) for ``live_impls`` (default: all).
    CPU: the recorded rows from figures/bench.csv, filtered the same way.
    """
    if not ON_GPU:
        df, prov = bench.load_recorded()
        print(f"Showing the recorded {prov['gpu']} run of {prov['date']} (torch {prov['torch']}, "
              f"triton {prov['triton']}, copy {prov['copy_gbps']:.0f} GB/s).")
    else:
        import pandas as pd

        copy_gbps = bench.copy_bandwidth_gbps()
        prov = bench.provenance(copy_gbps, "notebook")
        fmt = filters.get("tensor_format", "sbhd" if sweep != "decode" else "bshd")
        dtype = filters.get("dtype", "bf16")
        directions = [filters["direction"]] if "direction" in filters else ["forward", "backward"]
        rows, decode_group = [], []
        for name, kw, job_fmt, job_dtype, decode in bench.benchmark_jobs("full", [fmt], [dtype]):
            if (sweep is not None and name != sweep) or job_fmt != fmt or job_dtype != dtype:
                continue
            impls = bench.implementations(decode=decode)
            if live_impls is not None:
                impls = {k: v for k, v in impls.items() if k in live_impls}
            p = bench.Problem(job_fmt, job_dtype, **kw)
            if decode:  # timed together below, in interleaved rounds (as the benchmark does)
                decode_group.append((impls, p))
                continue
            for direction in directions:
                rows += bench.measure(impls, p, direction, name, copy_gbps)
            del p
        if decode_group:
            rows += bench.measure_decode(decode_group, "decode", copy_gbps)
        df = pd.DataFrame(rows)
        print(f"Measured live on {prov['gpu']} (copy {copy_gbps:.0f} GB/s).")
    if sweep is not None:
        df = df[df.sweep == sweep]
    for key, value in filters.items():
        df = df[df[key] == value]
    return df, prov
