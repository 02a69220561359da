"""Whole-row tiles in rope_qk against the pair tiles they replaced (GPU only).

    python scripts/qk_whole_rows.py [--out figures/qk_whole_rows.json] [--rounds 5]

rope_qk's pair tiles load a row of q or k as separate pieces: the first and the second half of
the rotary channels (the pairs' two channels), then the channels past ``rotary_dim``, and store
them the same way. With whole rows (``rope_qk.WHOLE_ROWS``, for 16-bit inputs and half-split
pairs) a program loads each row once, loads each channel's partner again (the same lines, from
L1), and stores the row in one piece: ``y[c] = x[c] * cos[c] + x[partner(c)] * sin[c]``, with
the sine signed per half and cos 1, sin 0 past the rotary channels.

Both sides are the package's rope_qk.py: as imported, with ``WHOLE_ROWS = True`` (whole rows are
off by default since an H200 measured them slower: figures/qk_whole_rows_h200.json), and a second
copy of the file loaded as its own module with ``WHOLE_ROWS = False`` (the default tiles), both
launched through the package's thin launch. Shuffled rounds at the benchmark's q+k shapes, forward and
backward, and fused QKV, as a fraction of the run's 2 GB copy (``triton.testing.do_bench``
median; bytes as the benchmark counts them).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import _launch  # noqa: E402
from rope_kernels import rope_qk as rows  # noqa: E402
from rope_kernels.bench import QKProblem, QKVProblem, copy_bandwidth_gbps, provenance  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
# Each entry point's call on a given rope_qk module, and medians of shuffled rounds.
from qk_table_hint import calls, module_copy, shuffled_rounds  # noqa: E402

# name -> QKProblem arguments (bf16, 16 x 4096 tokens, 32 q / 8 k heads of 128 unless said)
SHAPES = {
    "32q/8k": {}, "16q/4k": dict(heads=16, k_heads=4), "8q/8k": dict(heads=8),
    "32q/32k": dict(k_heads=32), "64q/8k": dict(heads=64), "head_dim 64": dict(head_dim=64),
    "head_dim 256": dict(head_dim=256, heads=16, k_heads=4),
    "fp16 16q/4k": dict(dtype="fp16", heads=16, k_heads=4), "1024 tokens": dict(seq_len=1024),
    "batch 1": dict(batch=1), "batch 4": dict(batch=4), "half rotary": dict(rotary_percent=0.5),
    "fp32 (unchanged)": dict(dtype="fp32"),
}
MODES = ("cache out of place", "cache in place", "cache backward", "hf", "hf backward")


def pairs_module():
    """rope_qk.py loaded again as its own module, with whole rows off."""
    module = module_copy("rope_qk_pairs", rows.__file__)
    module.WHOLE_ROWS = False
    return module


def max_difference(a, b) -> float:
    """Largest |a - b| over the outputs, in ulps of the largest |a| (16-bit: rounding may differ
    where the compiler fuses a multiply-add differently; the formula is the same)."""
    worst = 0.0
    for x, y in zip(a, b):
        scale = x.float().abs().max().item() * torch.finfo(x.dtype).eps
        worst = max(worst, (x.float() - y.float()).abs().max().item() / max(scale, 1e-30))
    return worst


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    assert rows.launch is _launch.thin_launch  # as the package runs
    rows.WHOLE_ROWS = True  # this process only: the whole-row side of the A/B
    pairs = pairs_module()
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_whole_rows"), "rounds": args.rounds,
              "entry_points": {}}
    result["provenance"]["command"] = "python scripts/qk_whole_rows.py"
    start = time.time()

    def record(name, mode, new, old, nbytes):
        a, b = new(), old()
        # In place, the second call rotated q and k again: compared separately, below.
        diff = None if mode == "cache in place" else round(max_difference(a, b), 2)
        row = shuffled_rounds({"whole rows": new, "pairs": old}, nbytes, copy, args.rounds)
        row["ratio"] = round(row["whole rows"] / row["pairs"], 4)
        row["max_difference_ulps"] = diff
        result["entry_points"].setdefault(name, {})[mode] = row
        print(f"{name:18s} {mode:20s} {row}  [{time.time() - start:.0f} s]", flush=True)

    for name, kw in SHAPES.items():
        p = QKProblem(**kw)
        for mode in MODES:
            record(name, mode, calls(rows, p, mode), calls(pairs, p, mode), p.nbytes)
        # In place: one call of each on two copies of the same q and k, compared.
        q0, k0 = p.tokens(p.q).clone(), p.tokens(p.k).clone()
        q1, k1 = q0.clone(), k0.clone()
        rows.rope_cos_sin_cache(p.positions, q0, k0, p.head_dim, p.cache, query_out=q0,
                                key_out=k0)
        pairs.rope_cos_sin_cache(p.positions, q1, k1, p.head_dim, p.cache, query_out=q1,
                                 key_out=k1)
        result["entry_points"][name]["cache in place"]["max_difference_ulps"] = round(
            max_difference((q0, k0), (q1, k1)), 2)
        del p, q0, k0, q1, k1
        torch.cuda.empty_cache()

    for name, kw in {"fused QKV": {}, "fused QKV half rotary": dict(rotary_percent=0.5),
                     "fused QKV 8 groups of 1 q head": dict(q_per_group=1)}.items():
        p = QKVProblem(**kw)
        fwd = [lambda m=m, p=p: m.rope_qkv(p.qkv, p.freqs, p.freqs, p.splits)
               for m in (rows, pairs)]
        bwd = [lambda m=m, p=p: m.rope_qkv_backward(*p.grads, p.freqs, p.freqs, p.splits)
               for m in (rows, pairs)]
        record(name, "forward", *fwd, p.nbytes)
        record(name, "backward", *bwd, p.nbytes)
        del p, fwd, bwd
        torch.cuda.empty_cache()

    ratios = [m["ratio"] for modes in result["entry_points"].values() for m in modes.values()]
    result["ratio_min"], result["ratio_max"] = min(ratios), max(ratios)
    print(f"whole rows / pairs: {min(ratios):.3f} .. {max(ratios):.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
