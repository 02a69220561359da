"""What do_bench's L2 flush costs a timed call, by size (GPU only).

    python scripts/l2_flush_effect.py [--out figures/l2_flush_effect.json]

``triton.testing.do_bench`` clears L2 before every timed call by writing 256 MB of zeros. That
leaves L2 full of dirty lines, which the timed call must write back to memory as it evicts them:
traffic that is not the kernel's. The benchmark keeps do_bench (its numbers compare with every
other do_bench figure) and measures each problem against a copy of its own bytes timed the same
way. This script shows the size of the effect: a device-to-device copy (and our TE-style call,
bshd bf16, 16 x 4096 tokens x 8/16/32 heads x 128) timed three ways, as a fraction of the run's
2 GB copy (itself timed by do_bench):

    do_bench          median, L2 cleared by writing 256 MB (what the benchmark uses)
    read-only flush   median, L2 cleared by reading 256 MB (the evicted lines are clean)
    no flush          median, back-to-back calls on the same tensors (L2 holds the end of the
                      previous call's output, dirty)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import rope_kernels as rk  # noqa: E402
from rope_kernels.bench import Problem, copy_bandwidth_gbps, provenance, time_ms  # noqa: E402


def median_ms(fn, flush=None, reps=60) -> float:
    """Median of CUDA-event times of ``fn``, each after ``flush()`` (outside the events)."""
    for _ in range(5):
        fn()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(start, end))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    copy = copy_bandwidth_gbps()
    flush_buffer = torch.empty(64 * 2**20, dtype=torch.float32, device="cuda").uniform_()

    def read_flush():
        flush_buffer.amax()

    def fractions(fn, nbytes):
        ms = dict(do_bench=time_ms(fn), read_only_flush=median_ms(fn, read_flush),
                  no_flush=median_ms(fn))
        return {k: round(nbytes / v / 1e6 / copy, 4) for k, v in ms.items()}

    rows = []
    for mib in (86, 268, 336, 672, 1344, 2688):
        n = mib * 2**20 // 4  # bf16 elements per tensor: mib / 2 read, mib / 2 written
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        row = dict(what="copy", mib=mib, **fractions(lambda: dst.copy_(src), 4 * n))
        rows.append(row)
        print(row, flush=True)
        del src, dst
        torch.cuda.empty_cache()
    for heads in (8, 16, 32):
        p = Problem("bshd", "bf16", seq_len=4096, batch=16, heads=heads, head_dim=128)
        call = lambda p=p: rk.apply_rotary_pos_emb(p.t, p.freqs, "bshd", fused=True,  # noqa: E731
                                                   validate=False)
        row = dict(what=f"apply_rotary_pos_emb bshd bf16 16 x 4096 x {heads} x 128",
                   mib=round(p.nbytes / 2**20), **fractions(call, p.nbytes))
        rows.append(row)
        print(row, flush=True)
        del p
        torch.cuda.empty_cache()
    prov = provenance(copy, "l2_flush_effect")
    prov["command"] = "python scripts/l2_flush_effect.py"
    prov["fractions"] = "bytes moved / time / the 2 GB copy's bandwidth (copy_gbps, do_bench)"
    result = dict(provenance=prov, rows=rows)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
