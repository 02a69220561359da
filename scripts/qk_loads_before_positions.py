"""q's and k's loads issued before the positions' in rope_qk: an A/B against the file before
(GPU only).

    git show REV:rope_kernels/rope_qk.py > /tmp/rope_qk_before.py
    python scripts/qk_loads_before_positions.py --before /tmp/rope_qk_before.py
                                                [--out figures/qk_loads_before_positions_h200.json]
                                                [--rounds 5] [--half-rotary]

The cos/sin cache's programs read each token's position, then the token's row of the cache
(a load that waits on another), then rotate their tile of q or k. Written in that order, or with
the tile's loads first, ptxas issues the tile's loads only after the position has come (the SASS
of a program of one head block: LDG of the position, wait, LDG of the cache row, LDG.128 of the
tile), so each program spends one memory latency with nothing of q or k in flight. The file now
issues the tile's loads first, with a barrier before the positions' load (a point ptxas does not
move loads across), where ``rope_qk._x_first`` says so. This times both files' calls in one
process, each through its own plan table and the package's launcher: bf16 32 q / 8 k heads of
128,

- 16 sequences of 512-4096 tokens (168-1343 MB): the cache out of place and in place, Hugging
  Face's call (a control: no positions, so no barrier, the same program), a copy of the same
  bytes; a line fitted to time against bytes per call (intercept: what a call pays whatever its
  size);
- one sequence of 4096 tokens in place (86 MB, where Liger-Kernel's kernel, given cos and sin
  per token, led ours by 1-2%: ``scripts/qk_positions_cost.py``);
- the decode-sized call (64 tokens): its GPU time alone (L2 flushed, host ahead) and back to back
  from Python;
- then, at 16 x 2048 tokens, the plans the rule chooses otherwise (16 q / 4 k heads: loads first;
  head_dim 64: all heads a program; float32) and the interleaved pairs it leaves alone (SHAPES).

``--half-rotary``: instead, half the head rotated at 16 x 4096 tokens, both pairings, the cache
out of place and in place (whose heads are narrowed: left alone) and Hugging Face's call.
Where the two files' bits differ, ``differences`` gives how many elements and each file's
largest and mean distance from the float64 rotation.

Timing: ``bench.time_ms_host_ahead`` (median, L2 flushed per call, the host kept ahead) in
``--rounds`` shuffled rounds; per round the ratio after/before of each call. Both files' results
are compared bit for bit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from qk_size_scan import HOST_AHEAD_TIMING, fit, provenance, same  # noqa: E402
from qk_table_hint import module_copy  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402
from rope_kernels.reference import cos_sin_cache_reference  # noqa: E402

SEQ_LENS = (512, 1024, 2048, 4096)
BATCH, Q_HEADS, K_HEADS, HEAD_DIM = 16, 32, 8, 128
DECODE_TOKENS = 64
SCAN_LABEL = "bf16 32q/8k hd128 16"
# The scan over sizes (with Hugging Face's call as a control), then other plans at 16 x 2048
# tokens: k's blocks loaded first (16q/4k), all heads a program (head_dim 64), interleaved pairs
# as words (which keep the order before: X_FIRST in the kernel), float32; then batch 1 in place.
SHAPES = ([dict(seq_len=s, batch=BATCH, heads=Q_HEADS, k_heads=K_HEADS, head_dim=HEAD_DIM,
                hf=True) for s in SEQ_LENS]
          + [dict(seq_len=2048, batch=BATCH, heads=h, k_heads=kh, head_dim=d, dtype=dt,
                  interleaved=i) for h, kh, d, dt, i in ((16, 4, 128, "bf16", False),
                                                          (32, 8, 64, "bf16", False),
                                                          (32, 8, 128, "bf16", True),
                                                          (32, 8, 64, "bf16", True),
                                                          (32, 8, 128, "fp32", False))]
          + [dict(seq_len=4096, batch=1, heads=Q_HEADS, k_heads=K_HEADS, head_dim=HEAD_DIM,
                  only_in_place=True)])
# --half-rotary: half of each head rotated, 16 x 4096 tokens (in place, the cache's heads
# narrowed to the rotated channels take the all-heads programs).
HALF_ROTARY_SHAPES = [dict(seq_len=4096, batch=BATCH, heads=Q_HEADS, k_heads=K_HEADS,
                           head_dim=HEAD_DIM, rotary_percent=0.5, interleaved=i, hf=not i)
                      for i in (False, True)]


def calls(modules: dict, shape: dict):
    """name -> call for each module (name suffixed with the module's key), and the problem.
    ``shape``: QKProblem's arguments, ``only_in_place`` (the cache in place alone) and ``hf``
    (Hugging Face's call too)."""
    shape = dict(shape)
    only_in_place, with_hf = shape.pop("only_in_place", False), shape.pop("hf", False)
    p = bench.QKProblem(**shape)
    q, k = p.tokens(p.q), p.tokens(p.k)
    hq, hk = p.q.transpose(1, 2), p.k.transpose(1, 2)
    neox = not p.interleaved
    fns = {}
    for key, module in modules.items():
        qi, ki = q.clone(), k.clone()
        if not only_in_place:
            fns[f"cache {key}"] = lambda m=module: m.rope_cos_sin_cache(
                p.positions, q, k, p.head_dim, p.cache, neox)
        if with_hf:
            fns[f"hf {key}"] = lambda m=module: m.rope_cos_sin(hq, hk, p.cos, p.sin, 1)
        # In place the second rotation of a round starts from the first's results: the same work.
        fns[f"cache in place {key}"] = lambda m=module, qi=qi, ki=ki: m.rope_cos_sin_cache(
            p.positions, qi, ki, p.head_dim, p.cache, neox, query_out=qi, key_out=ki)
    return fns, p


def reference(p, q: torch.Tensor, k: torch.Tensor):
    """The cache call's results in float64 (``rope_kernels.reference``): q and k rotated."""
    return [cos_sin_cache_reference(p.positions, x, p.head_dim, p.cache, not p.interleaved)
            for x in (q, k)]


def differences(p, after, before) -> dict:
    """Where the two files' results differ: how many elements, and each one's largest and mean
    distance from the float64 rotation."""
    expected = reference(p, p.tokens(p.q), p.tokens(p.k))
    result = dict(elements=sum(a.numel() for a in after),
                  differ=sum(int((a != b).sum()) for a, b in zip(after, before)))
    for key, outs in (("after", after), ("before", before)):
        errors = torch.cat([(o.double() - e).abs().flatten() for o, e in zip(outs, expected)])
        result[f"max_error_{key}"] = float(errors.max())
        result[f"mean_error_{key}"] = float(errors.mean())
    return result


def check_same(fns: dict, p, modules: dict, differences_found: list) -> dict:
    """Each call's results, after and before, equal bit for bit (in place: one call each on
    copies of the same inputs, through ``modules``' functions); where they do not, their
    ``differences`` are appended to ``differences_found``."""
    result = {}
    for name in [n[:-len(" after")] for n in fns if n.endswith(" after")]:
        if "in place" in name:
            outs = []
            for key in ("after", "before"):
                q, k = p.tokens(p.q).clone(), p.tokens(p.k).clone()
                module = modules[key]
                outs.append(module.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache,
                                                      not p.interleaved, query_out=q, key_out=k))
        else:
            outs = [fns[f"{name} {key}"]() for key in ("after", "before")]
        result[name] = same(*outs)
        if not result[name] and name.startswith("cache"):
            differences_found.append(dict(call=name, seq_len=p.seq_len, heads=p.heads,
                                          k_heads=p.k_heads, head_dim=p.head_dim,
                                          interleaved=p.interleaved, dtype=p.dtype_name,
                                          **differences(p, *outs)))
            print(f"  {name}: {differences_found[-1]}")
    return result


def ratios(fractions: dict) -> dict:
    """name -> (median, min, max) over rounds of after / before."""
    out = {}
    for name in [n[:-len(" after")] for n in fractions if n.endswith(" after")]:
        r = [a / b for a, b in zip(fractions[f"{name} after"], fractions[f"{name} before"])]
        out[name] = (statistics.median(r), min(r), max(r))
    return out


def decode_times(modules: dict, rounds: int) -> dict:
    """The decode-sized cache call of each module: GPU time (median) and back to back."""
    p = bench.QKProblem(seq_len=DECODE_TOKENS, batch=1, heads=Q_HEADS, k_heads=K_HEADS,
                        head_dim=HEAD_DIM)
    q, k = p.tokens(p.q), p.tokens(p.k)
    decode = {key: dict(gpu=[], host=[]) for key in modules}
    for _ in range(rounds):  # the two files alternate, so that drift of the host is shared
        for key, module in modules.items():
            fn = lambda m=module: m.rope_cos_sin_cache(p.positions, q, k, HEAD_DIM, p.cache)  # noqa
            decode[key]["gpu"].append(bench.time_ms_host_ahead(fn) * 1e3)
            decode[key]["host"].append(bench.time_per_call_us(fn))
    decode = {key: dict(gpu_us=statistics.median(d["gpu"]),
                        gpu_spread=[min(d["gpu"]), max(d["gpu"])],
                        per_call_us=statistics.median(d["host"]),
                        per_call_spread=[min(d["host"]), max(d["host"])])
              for key, d in decode.items()}
    print(f"decode ({DECODE_TOKENS} tokens): " + "; ".join(
        f"{key} GPU {d['gpu_us']:.2f} us ({d['gpu_spread'][0]:.2f}-{d['gpu_spread'][1]:.2f}), "
        f"back to back {d['per_call_us']:.2f} us ({d['per_call_spread'][0]:.2f}-"
        f"{d['per_call_spread'][1]:.2f})" for key, d in decode.items()))
    return decode


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--half-rotary", action="store_true",
                        help="only HALF_ROTARY_SHAPES (and no decode)")
    args = parser.parse_args(argv)
    modules = {"after": rope_qk, "before": module_copy("rope_qk_before", args.before)}
    differences_found = []
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for shape in HALF_ROTARY_SHAPES if args.half_rotary else SHAPES:
        fns, p = calls(modules, shape)
        nbytes = p.nbytes
        src = torch.empty(nbytes // 2 // 4, dtype=torch.float32, device="cuda").uniform_()
        dst = torch.empty_like(src)
        fns["copy_same"] = lambda: dst.copy_(src)
        same_bits = check_same(fns, p, modules, differences_found)
        fractions = bench.shuffled_rounds(fns, nbytes, copy_gbps, args.rounds,
                                          timer=bench.time_ms_host_ahead)
        r = ratios(fractions)
        label = (f"{p.dtype_name} {p.heads}q/{p.k_heads}k hd{p.head_dim}"
                 f"{f' rotary {p.rotary_dim}' if p.rotary_dim < p.head_dim else ''}"
                 f"{' interleaved' if p.interleaved else ''} {p.batch} x {p.seq_len}")
        for name, fr in fractions.items():
            times = [nbytes / (f * copy_gbps) / 1e3 for f in fr]
            base = name.rsplit(" ", 1)[0] if name != "copy_same" else None
            rows.append(dict(name=name, shape=label, seq_len=p.seq_len, batch=p.batch,
                             mbytes=nbytes / 1e6, time_us=statistics.median(times),
                             of_copy=statistics.median(fr), spread=[min(fr), max(fr)],
                             after_over_before=r.get(base) if name.endswith("after") else None,
                             same_bits=same_bits.get(base)))
        print(f"{label}, {nbytes / 1e6:5.0f} MB: copy "
              f"{statistics.median(fractions['copy_same']):.3f}; " + "; ".join(
                  f"{n} {statistics.median(fractions[n + ' before']):.3f} -> "
                  f"{statistics.median(fractions[n + ' after']):.3f} (x{m:.3f}, {lo:.3f}-{hi:.3f})"
                  for n, (m, lo, hi) in r.items()) + f"; same bits {same_bits}", flush=True)
        del fns, p, src, dst
        torch.cuda.empty_cache()
    fits = {}
    scan = [r for r in rows if r["shape"].startswith(SCAN_LABEL) and r["batch"] == BATCH]
    for name in dict.fromkeys(r["name"] for r in scan if not args.half_rotary):
        mine = [r for r in scan if r["name"] == name]
        intercept, gbps = fit([r["mbytes"] * 1e6 for r in mine], [r["time_us"] for r in mine])
        fits[name] = dict(intercept_us=intercept, slope_gbps=gbps, slope_of_copy=gbps / copy_gbps)
        print(f"{name:22s} time = {intercept:5.2f} us + bytes / {gbps:6.0f} GB/s "
              f"({gbps / copy_gbps:.3f} of copy)")
    # The decode-sized call: GPU time alone, and back to back from Python.
    decode = {} if args.half_rotary else decode_times(modules, args.rounds)
    command = (f"python scripts/qk_loads_before_positions.py --before {args.before.name} "
               f"--rounds {args.rounds}" + (" --half-rotary" if args.half_rotary else ""))
    record = dict(provenance=provenance(copy_gbps, "qk_loads_before_positions", command,
                                        HOST_AHEAD_TIMING),
                  rows=rows, fits=fits, decode=decode, differences=differences_found)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
