"""Whole-row tiles in rope_2d against its pairs' tiles (GPU only; not yet recorded).

    python scripts/rope2d_whole_rows.py [--out figures/rope2d_whole_rows.json] [--rounds 5]

The same change as rope_qk's whole rows (scripts/qk_whole_rows.py) in the TransformerEngine-style
kernel: with ``config={"whole_rows": True}`` a program loads each row of its tile once, loads each
channel's partner again (the same lines, from L1) and stores the row in one piece, instead of the
pairs' two halves and the channels past ``rotary_dim`` in three. Off by default until this A/B
says where it wins. Shuffled rounds at the benchmark's TE shapes (sbhd, bshd, thd; 16-bit and
fp32; forward and backward; partial rotary, 8 heads, small batches, short packed sequences), the
default tile with whole rows and with half and twice its warps, as a fraction of the run's 2 GB
copy (``triton.testing.do_bench`` median; bytes as the benchmark counts them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import rope_2d  # noqa: E402
from rope_kernels.bench import Problem, copy_bandwidth_gbps, provenance  # noqa: E402
from rope_kernels.bench import shuffled_rounds as bench_shuffled_rounds  # noqa: E402
from rope_kernels.rope_2d import default_config  # noqa: E402

# name -> Problem arguments (sbhd bf16, 4096 x 16, 32 heads of 128 unless said)
SHAPES = {
    "sbhd": {}, "bshd": dict(tensor_format="bshd"), "thd 4096 seqs": dict(tensor_format="thd",
                                                                        n_seqs=4096),
    "sbhd fp16": dict(dtype="fp16"), "bshd fp32 (whole rows: 512 B)": dict(tensor_format="bshd",
                                                                           dtype="fp32"),
    "bshd half rotary": dict(tensor_format="bshd", rotary_percent=0.5),
    "bshd 8 heads": dict(tensor_format="bshd", heads=8), "bshd s8192": dict(tensor_format="bshd",
                                                                            seq_len=8192),
    "bshd batch 1": dict(tensor_format="bshd", batch=1), "bshd batch 4": dict(tensor_format="bshd",
                                                                              batch=4),
    "bshd head_dim 64": dict(tensor_format="bshd", head_dim=64),
    "thd 16384 x 8, 8 heads": dict(tensor_format="thd", seq_len=8, batch=16384, heads=8),
    "thd 16384 x 8, 32 heads": dict(tensor_format="thd", seq_len=8, batch=16384),
}


def variants(p: Problem) -> dict:
    """name -> config for rope_2d: the default (pairs), whole rows on the default tile, and whole
    rows with half and twice its warps."""
    t = p.t
    canon = {"sbhd": t.shape, "bshd": (t.shape[1], t.shape[0], *t.shape[2:]),
             "thd": (t.shape[0], 1, *t.shape[1:])}[p.tensor_format]
    cfg = default_config(*canon, p.rotary_dim, t.device, t.element_size(), False,
                         p.tensor_format, n_seqs=p.n_seqs if p.tensor_format == "thd" else None)
    out = {"pairs": None, "whole rows": {"whole_rows": True}}
    for warps in (cfg["num_warps"] // 2, cfg["num_warps"] * 2):
        if 1 <= warps <= 8:
            out[f"whole rows, {warps} warps"] = {"whole_rows": True, "num_warps": warps}
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "rope2d_whole_rows"), "rounds": args.rounds,
              "rows": {}}
    result["provenance"]["command"] = "python scripts/rope2d_whole_rows.py"
    start = time.time()
    for name, kw in SHAPES.items():
        p = Problem(**kw)
        for direction in ("forward", "backward"):
            x = p.grad if direction == "backward" else p.t
            fns = {}
            ref = None
            for label, config in variants(p).items():
                def call(config=config, x=x, p=p, backward=direction == "backward"):
                    return rope_2d(x, p.freqs, p.tensor_format, cu_seqlens=p.cu_seqlens,
                                   backward=backward, config=config)
                out = call()
                if ref is None:
                    ref = out
                else:  # the same rotation; 16-bit rounding may differ where an FMA does
                    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
                fns[label] = call
            del ref, out
            fr = bench_shuffled_rounds(fns, p.nbytes, copy, args.rounds)
            row = {k: round(statistics.median(v), 4) for k, v in fr.items()}
            row["best whole rows / pairs"] = round(
                max(v for k, v in row.items() if k.startswith("whole")) / row["pairs"], 4)
            result["rows"].setdefault(name, {})[direction] = row
            print(f"{name:28s} {direction:8s} {row}  [{time.time() - start:.0f} s]", flush=True)
        del p
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
