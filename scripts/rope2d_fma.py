"""rope_2d with its rotation written as fused multiply-adds against the kernel file before (GPU
only).

    git show main:rope_kernels/rope_2d.py > /tmp/rope_2d_before.py
    python scripts/rope2d_fma.py --before /tmp/rope_2d_before.py [--rounds 5]
                                 [--out figures/rope2d_fma_h200.json]

Left as ``x1 * cos - x2 * sin`` and ``x2 * cos + x1 * sin`` (and whole rows' ``x * cos +
partner * sin``), the compiler fuses one product or the other into the fma depending on the code
around it; written as ``tl.fma`` every plan computes the same bits. Compiled for sm_90 on the CPU
the FFMA/FMUL counts of 240 plans are unchanged, but the instructions are scheduled otherwise at
218 of them. This times both files' ``rope_2d`` in one process, each file a module with its own
plan table launched by the package's launcher, at the benchmark's TransformerEngine-style shapes
(``SHAPES``: sbhd, bshd, thd; bf16, fp16, fp32; whole and half rotary; interleaved pairs; 8
heads; batch 1; head_dim 64 and 256; in place), forward and backward, in ``--rounds`` shuffled
rounds (``bench.time_ms_host_ahead``: L2 flushed per call, the host kept ahead). Per shape: each
call's fraction of the 2 GB copy (bytes as ``Problem.nbytes`` counts them, in place too: compare
the ratios), the ratio after / before per round, whether the two files' results are the same
bits, and whether the new file's in-place result equals its out-of-place one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from qk_size_scan import HOST_AHEAD_TIMING, provenance, same  # noqa: E402
from qk_table_hint import module_copy  # noqa: E402
from rope_kernels import bench  # noqa: E402

after_module = importlib.import_module("rope_kernels.rope_2d")  # the package exports the function

# name -> bench.Problem arguments (sbhd bf16, 4096 x 16, 32 heads of 128 unless said) and
# "in_place"
SHAPES = {
    "sbhd": {}, "bshd": dict(tensor_format="bshd"),
    "thd 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
    "sbhd fp16": dict(dtype="fp16"), "bshd fp32": dict(tensor_format="bshd", dtype="fp32"),
    "sbhd half rotary": dict(rotary_percent=0.5),
    "bshd half rotary": dict(tensor_format="bshd", rotary_percent=0.5),
    "sbhd interleaved": dict(interleaved=True),
    "bshd interleaved": dict(tensor_format="bshd", interleaved=True),
    "bshd 8 heads": dict(tensor_format="bshd", heads=8),
    "bshd batch 1": dict(tensor_format="bshd", batch=1),
    "bshd head_dim 64": dict(tensor_format="bshd", head_dim=64),
    "sbhd head_dim 256": dict(head_dim=256, heads=16),
    "thd 64 seqs, 8 heads": dict(tensor_format="thd", seq_len=4096, batch=32, heads=8, n_seqs=64),
    "bshd in place": dict(tensor_format="bshd", in_place=True),
    "bshd half rotary in place": dict(tensor_format="bshd", rotary_percent=0.5, in_place=True),
    "sbhd half rotary in place": dict(rotary_percent=0.5, in_place=True),
    "bshd fp32 half rotary in place": dict(tensor_format="bshd", dtype="fp32",
                                           rotary_percent=0.5, in_place=True),
}


def run(module, p, x, backward, out=None):
    return module.rope_2d(x, p.freqs, p.tensor_format, interleaved=p.interleaved,
                          cu_seqlens=p.cu_seqlens, backward=backward, out=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    modules = {"after": after_module, "before": module_copy("rope_2d_before", args.before)}
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name, kw in SHAPES.items():
        kw = dict(kw)
        in_place = kw.pop("in_place", False)
        p = bench.Problem(**kw)
        for backward in (False, True):
            x = p.grad if backward else p.t
            fns, results = {}, {}
            for key, module in modules.items():
                results[key] = run(module, p, x, backward)
                if in_place:  # each file rotates its own copy again and again: the same work
                    y = x.clone()
                    fns[key] = lambda m=module, y=y: run(m, p, y, backward, out=y)
                    z = x.clone()
                    run(module, p, z, backward, out=z)
                    results[key + " in place"] = z
                else:
                    fns[key] = lambda m=module: run(m, p, x, backward)
            fractions = bench.shuffled_rounds(fns, p.nbytes, copy_gbps, args.rounds,
                                              timer=bench.time_ms_host_ahead)
            r = [a / b for a, b in zip(fractions["after"], fractions["before"])]
            row = dict(shape=name, direction="backward" if backward else "forward",
                       mbytes=p.nbytes / 1e6,
                       of_copy={k: statistics.median(v) for k, v in fractions.items()},
                       after_over_before=statistics.median(r), spread=[min(r), max(r)],
                       same_bits=same(results["after"], results["before"]))
            if in_place:
                row["in_place_equals_out_of_place"] = {
                    key: same(results[key + " in place"], results[key]) for key in modules}
            rows.append(row)
            print(f"{name:32s} {row['direction']:8s} {row['mbytes']:6.0f} MB: "
                  f"{row['of_copy']['before']:.3f} -> {row['of_copy']['after']:.3f} "
                  f"(x{row['after_over_before']:.3f}, {min(r):.3f}-{max(r):.3f}); same bits "
                  f"{row['same_bits']}"
                  + (f"; in place = out of place {row['in_place_equals_out_of_place']}"
                     if in_place else ""), flush=True)
            del fns, results
        del p
        torch.cuda.empty_cache()
    ratios = [row["after_over_before"] for row in rows]
    print(f"after / before: median {statistics.median(ratios):.3f}, "
          f"{min(ratios):.3f}-{max(ratios):.3f} over {len(rows)} calls")
    command = f"python scripts/rope2d_fma.py --before {args.before.name} --rounds {args.rounds}"
    record = dict(provenance=provenance(copy_gbps, "rope2d_fma", command, HOST_AHEAD_TIMING),
                  rows=rows)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
