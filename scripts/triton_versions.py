"""The package's calls timed under one Triton version, and runs of several versions compared (GPU).

    python scripts/triton_versions.py time --out /tmp/v36_1.json      # under each version, in turn
    python scripts/triton_versions.py compare /tmp/v36_*.json /tmp/v39_*.json \
        [--out figures/triton_versions_h200.json]

A process has one Triton, so each version is timed in processes of its own, alternated on one
machine (3.6, 3.9, 3.6, 3.9, ...) so that the host's drift lands on both. ``time`` times every
point (the calls of ``scripts/flat_tiles.py``'s TE-style, Hugging Face and fused QKV shapes, the
cos/sin cache's calls and Cohere's and GLM's head_dim-64 calls, each forward and backward) in
``--rounds`` shuffled rounds, do_bench's median each, with the host kept ahead under 200 MB
(``bench.time_ms_host_ahead``), and a SHA-256 of each result computed once on NaN-filled memory.
``compare`` takes per point the median over a version's processes, its ratio to the first
version's (the reference), and says where the bits differ. Fractions of copy use the reference
processes' 2 GiB copy; bytes as the benchmark counts them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import random
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def _digest(out) -> str:
    """SHA-256 (16 hex digits) of a result or tuple of results: shapes, strides, dtypes, bytes."""
    h = hashlib.sha256()
    for t in ((out,) if torch.is_tensor(out) else out):
        h.update(str((tuple(t.shape), t.stride(), t.dtype)).encode())
        h.update(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def points():
    """(name, direction, make) for every point; ``make()`` -> (call, nbytes), built when timed."""
    from flat_tiles import HF_SHAPES, QKV_SHAPES, TE_SHAPES, te_calls
    from qk_table_hint import calls, hf_call, qkv_call
    from rope_kernels import rope_qk
    from rope_kernels.bench import Problem, QKProblem, QKVProblem

    rope_2d = sys.modules["rope_kernels.rope_2d"]
    out = []
    for name, kw in TE_SHAPES.items():
        for direction in ("forward", "backward"):
            def make(kw=dict(kw), bw=direction == "backward"):
                in_place = kw.pop("in_place", False)
                p = Problem(**kw)
                return te_calls(rope_2d, p, bw, in_place), p.nbytes
            out.append(("te " + name, direction, make))
    for name, kw in HF_SHAPES.items():  # Hugging Face's half-rotary calls (transposed results)
        for direction in ("forward", "backward"):
            def make(kw=kw, bw=direction == "backward"):
                p = QKProblem(**dict(dict(rotary_percent=0.5), **kw))
                call = hf_call(rope_qk, p, bw)
                return (call, call), p.nbytes
            out.append(("hf " + name, direction, make))
    for name, kw in QKV_SHAPES.items():
        for direction in ("forward", "backward"):
            def make(kw=kw, bw=direction == "backward"):
                p = QKVProblem(**kw)
                call = qkv_call(rope_qk, p, bw)
                return (call, call), p.nbytes
            out.append(("qkv " + name, direction, make))
    cache_shapes = {"32q/8k": {}, "1024 tokens": dict(seq_len=1024), "batch 1": dict(batch=1),
                    "head_dim 64": dict(head_dim=64), "fp32": dict(dtype="fp32"),
                    "interleaved": dict(interleaved=True),
                    "interleaved head_dim 64": dict(interleaved=True, head_dim=64)}
    for name, kw in cache_shapes.items():
        for mode in ("cache out of place", "cache in place", "cache backward"):
            def make(kw=kw, mode=mode):
                p = QKProblem(**kw)
                call = calls(rope_qk, p, mode)  # is_neox=False where p.interleaved
                return (call, call), p.nbytes
            direction = "backward" if mode == "cache backward" else "forward"
            out.append((f"{mode.replace(' backward', '')} {name}", direction, make))
    words = {"cohere head_dim 64": ("interleaved", dict(head_dim=64)),
             "cohere head_dim 64 16q/4k": ("interleaved", dict(head_dim=64, heads=16, k_heads=4)),
             "glm head_dim 64": ("glm", dict(head_dim=64)),
             "glm head_dim 64 half rotary": ("glm", dict(head_dim=64, rotary_percent=0.5))}
    for name, (pairs, kw) in words.items():
        for direction in ("forward", "backward"):
            def make(kw=kw, pairs=pairs, bw=direction == "backward"):
                p = QKProblem(**dict(kw, interleaved=True))
                if pairs == "interleaved":
                    p.cos, p.sin = p.cos_pairs, p.sin_pairs
                call = hf_call(rope_qk, p, bw, pairs=pairs)
                return (call, call), p.nbytes
            out.append((name, direction, make))
    return out


def time_all(args) -> None:
    import triton
    from flat_tiles import poisoned
    from rope_kernels.bench import copy_bandwidth_gbps, provenance, time_ms, time_ms_host_ahead

    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "triton_versions"), "rounds": args.rounds,
              "triton_file": triton.__file__, "points": {}}
    result["provenance"]["command"] = "python scripts/triton_versions.py time"
    start = time.time()
    todo = {f"{name} | {direction}": make for name, direction, make in points()}
    order = list(todo)
    for r in range(args.rounds):
        # One problem in memory at a time (all of them would not fit): built, timed, freed.
        random.Random(r).shuffle(order)
        for key in order:
            (checked, timed), nbytes = todo[key]()
            if r == 0:  # compiles; the digest of a result computed on NaN-filled memory
                result["points"][key] = {"mb": round(nbytes / 1e6, 1),
                                         "digest": _digest(poisoned(checked)), "ms": []}
            timer = time_ms_host_ahead if nbytes < 200e6 else time_ms
            result["points"][key]["ms"].append(timer(timed))
            del checked, timed
            torch.cuda.empty_cache()
        print(f"round {r + 1} [{time.time() - start:.0f} s]", flush=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out, triton.__version__)


def compare(args) -> None:
    runs = [json.loads(pathlib.Path(f).read_text()) for f in args.files]
    by_version: dict = {}
    for run in runs:
        by_version.setdefault(run["provenance"]["triton"], []).append(run)
    versions = list(by_version)
    ref = versions[0]
    copy = statistics.median(r["provenance"]["copy_gbps"] for r in by_version[ref])
    keys = list(by_version[ref][0]["points"])
    table = {}
    for key in keys:
        row = {"mb": by_version[ref][0]["points"][key]["mb"]}
        for v in versions:
            ms = statistics.median(statistics.median(r["points"][key]["ms"]) for r in by_version[v])
            row[v] = {"ms": round(ms, 5), "copy_frac": round(row["mb"] / ms / copy, 4),
                      "digest": sorted({r["points"][key]["digest"] for r in by_version[v]})}
        for v in versions[1:]:
            row[v]["ratio_to_" + ref] = round(row[ref]["ms"] / row[v]["ms"], 4)
            row[v]["same_bits_as_" + ref] = row[v]["digest"] == row[ref]["digest"]
        table[key] = row
    summary = {}
    for v in versions[1:]:
        ratios = sorted(row[v]["ratio_to_" + ref] for row in table.values())
        summary[v] = {"ratio_min": ratios[0], "ratio_median": statistics.median(ratios),
                      "ratio_max": ratios[-1], "points": len(ratios),
                      "below_0.98": sum(x < 0.98 for x in ratios),
                      "bits_differ": [k for k, row in table.items()
                                      if not row[v]["same_bits_as_" + ref]]}
        print(f"{v} / {ref}: {summary[v]['ratio_min']:.3f} .. {summary[v]['ratio_max']:.3f}, "
              f"median {summary[v]['ratio_median']:.3f}, {summary[v]['below_0.98']} points "
              f"below 0.98, bits differ at {len(summary[v]['bits_differ'])} of {len(table)}")
        for k, row in sorted(table.items(), key=lambda kv: kv[1][v]["ratio_to_" + ref])[:8]:
            print(f"   {row[v]['ratio_to_' + ref]:.3f}  {k} ({row['mb']} MB)")
    # The reference's first run's provenance, with every version and each run's own.
    prov = dict(by_version[ref][0]["provenance"], triton=" / ".join(versions), copy_gbps=copy,
                mode="triton_versions compare",
                timing="triton.testing.do_bench median per round (L2 flushed per call; the host "
                       "kept ahead under 200 MB), the median of a process's rounds, the median "
                       "of a version's processes",
                command="python scripts/triton_versions.py compare " + " ".join(
                    pathlib.Path(f).name for f in args.files),
                runs={v: [r["provenance"] for r in by_version[v]] for v in versions})
    result = {"provenance": prov, "reference": ref, "summary": summary, "points": table}
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    t = sub.add_parser("time")
    t.add_argument("--out", type=pathlib.Path, required=True)
    t.add_argument("--rounds", type=int, default=3)
    c = sub.add_parser("compare")
    c.add_argument("files", nargs="+")
    c.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    (time_all if args.what == "time" else compare)(args)


if __name__ == "__main__":
    main()
