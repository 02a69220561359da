"""rope_2d with the partners gathered in registers where rotary_dim is not a multiple of 16,
against the kernel file before (GPU only).

    git show 6796176:rope_kernels/rope_2d.py > /tmp/rope_2d_6796176.py
    python scripts/rope2d_gathered.py --before /tmp/rope_2d_6796176.py [--rounds 3]
                                      [--out figures/rope2d_gathered_h200.json]

TransformerEngine's calls with ``rotary_percent`` 0.25 on heads of 80 or 96 (Megatron's GPT-NeoX
and Pythia ports: 20 or 24 channels rotated) compile to one 2-byte load and store per element of
x: Triton knows an integer argument's divisibility by 16 and no finer, so it cannot prove the
pairs' second half or the channels past rotary_dim aligned. ``GATHERED_PARTNERS`` (the kernel's
``GATHER``, as rope_qk's) moves each row in two aligned pieces, the rotary block and the rest,
and takes the partners from the block in registers. This times both files' ``rope_2d`` in one
process, each file a module with its own plan table launched by the package's launcher, at
such shapes (``SHAPES``: sbhd, bshd, thd; bf16 and float32; 16 x 4096 tokens unless said) and
at controls the rule leaves alone (half of 128 rotated, the whole head), forward and backward,
in ``--rounds`` shuffled rounds (``bench.time_ms_host_ahead``: L2 flushed per call, the host
kept ahead); the package's file also on 2 warps (``after w2``: the tile's rows on half its
warps). Per call: each side's fraction of the 2 GB copy (bytes as ``Problem.nbytes`` counts
them), the ratio after / before per round, and whether the results are the same bits.
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

# name -> bench.Problem arguments (bf16, 16 x 4096 tokens)
SHAPES = {
    "sbhd hd80 rot20": dict(head_dim=80, rotary_percent=0.25),
    "bshd hd80 rot20": dict(tensor_format="bshd", head_dim=80, rotary_percent=0.25),
    "thd hd80 rot20, 4096 seqs": dict(tensor_format="thd", head_dim=80, rotary_percent=0.25,
                                      n_seqs=4096),
    "sbhd hd96 rot24, 64 heads, batch 8": dict(head_dim=96, rotary_percent=0.25, heads=64,
                                               batch=8),
    "bshd hd160 rot40": dict(tensor_format="bshd", head_dim=160, rotary_percent=0.25),
    "sbhd hd80 rot20 fp32, batch 8": dict(head_dim=80, rotary_percent=0.25, dtype="fp32",
                                          batch=8),
    # controls: the rule leaves them alone
    "sbhd half rotary (control)": dict(rotary_percent=0.5),
    "bshd (control)": dict(tensor_format="bshd"),
}


def run(module, p, x, backward, config=None):
    return module.rope_2d(x, p.freqs, p.tensor_format, cu_seqlens=p.cu_seqlens,
                          backward=backward, config=config)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    before = module_copy("rope_2d_before", args.before)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name, kw in SHAPES.items():
        p = bench.Problem(**kw)
        for backward in (False, True):
            x = p.grad if backward else p.t
            after_module._PLANS.clear()
            results = {"after": run(after_module, p, x, backward),
                       "before": run(before, p, x, backward)}
            (plan,) = after_module._PLANS.values()
            gathered = bool(plan.constexprs["GATHER"])
            fns = {"after": lambda: run(after_module, p, x, backward),
                   "before": lambda: run(before, p, x, backward)}
            if gathered:
                w2 = {"num_warps": 2}
                results["after w2"] = run(after_module, p, x, backward, w2)
                fns["after w2"] = lambda: run(after_module, p, x, backward, w2)
            fractions = bench.shuffled_rounds(fns, p.nbytes, copy_gbps, args.rounds,
                                              timer=bench.time_ms_host_ahead)
            r = [a / b for a, b in zip(fractions["after"], fractions["before"])]
            c = plan.constexprs
            row = dict(shape=name, direction="backward" if backward else "forward",
                       mbytes=p.nbytes / 1e6, gathered=gathered,
                       tile=f"{c['BLOCK_S']} x {c['BLOCK_B']} x {c['BLOCK_H']} on "
                            f"{plan.num_warps} warps, ROW {c['ROW']}, PASS {c['PASS']}",
                       of_copy={k: statistics.median(v) for k, v in fractions.items()},
                       after_over_before=statistics.median(r), spread=[min(r), max(r)],
                       same_bits={k: same(v, results["before"]) for k, v in results.items()
                                  if k != "before"})
            rows.append(row)
            print(f"{name:36s} {row['direction']:8s} {row['mbytes']:6.0f} MB: "
                  f"{row['of_copy']['before']:.3f} -> {row['of_copy']['after']:.3f} "
                  f"(x{row['after_over_before']:.3f}, {min(r):.3f}-{max(r):.3f})"
                  + (f", w2 {row['of_copy']['after w2']:.3f}" if gathered else "")
                  + f" [{row['tile']}] same bits {row['same_bits']}", flush=True)
            del fns, results
        del p
        torch.cuda.empty_cache()
    changed = [row["after_over_before"] for row in rows if row["gathered"]]
    controls = [row["after_over_before"] for row in rows if not row["gathered"]]
    print(f"after / before: gathered {min(changed):.3f}-{max(changed):.3f} "
          f"(median {statistics.median(changed):.3f}) over {len(changed)} calls; "
          f"controls {min(controls):.3f}-{max(controls):.3f}")
    command = (f"python scripts/rope2d_gathered.py --before {args.before.name} "
               f"--rounds {args.rounds}")
    record = dict(provenance=provenance(copy_gbps, "rope2d_gathered", command,
                                        HOST_AHEAD_TIMING), rows=rows)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
