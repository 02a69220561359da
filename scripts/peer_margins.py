"""Where a peer was ahead of ours in the recorded benchmark: by how much, and why (GPU only).

    python scripts/peer_margins.py [--bench figures/bench.csv] [--out figures/peer_margins.json]
                                   [--rounds 15]

1. ``points``: every shape and direction at which the recorded run (``--bench``) has a peer
   faster than our call doing the same job (``bench.compare_with_peers``: an in-place peer
   against our in-place call, the others against the call that returns new tensors), measured
   again here in ``--rounds`` shuffled rounds: our call and that peer, and for Liger-Kernel also
   Liger given float32 cos and sin. Liger reads half of each cos and sin row in the model's
   dtype (bf16 at head_dim 128: 256 B a token); our calls read the float32 rows that the
   TE-style and FlashInfer-style APIs take (512 B a token), which Liger's float32 run also reads.
   At batch 1 those 256 B a token are 1.2% (q+k, 40 heads) to 1.6% (32 heads) of the bytes.
   Per implementation: the median, lowest and highest fraction of the run's copy over the
   rounds; ``ratio``: our median fraction over the peer's (time of the peer / ours, >= 1 where
   ours is ahead), ``ratio_float32_tables`` the same against Liger with float32 tables.
2. ``transposition``: Hugging Face's call with half the head rotated returns contiguous
   [b, h, s, d] tensors, as GPT-NeoX's function (it ends in ``torch.cat``) does, from q and k
   that are [b, h, s, d] views of [b, s, h, d] projections: the call transposes what it moves.
   Measured beside it: the cos/sin cache call of the same problem (results in the inputs'
   layout), and torch's copy of q and k into contiguous [b, h, s, d] tensors and into tensors of
   their own layout.

3. ``small_points``: the points of (1) below 256 MB (the benchmark's batch 1-2 shapes, 69-170 MB,
   22-47 us a call), where the order of ours and the peer changed between runs. Each is measured
   again on ``--placements`` fresh sets of buffers (a spacer allocation of random size before
   each, so that they lie elsewhere in memory), ours and the peer on each set, in shuffled rounds
   timed by ``bench.time_ms_host_ahead``: the GPU is kept busy after each L2 flush, so a call whose
   Python launch outlasts the flush does not have the GPU's wait for it timed, as it can in
   do_bench's loop. Per set: each call's median, lowest and highest fraction, and ``paired``, the
   median over the rounds of ours / the peer in the same round. Also per point: ``host_us``, the
   Python launch of each call (the host's time per call, back to back), and ``invocations``:
   ``--invocations`` do_bench medians in a row of ours, the peer and an in-place ``torch.neg``
   of the same tensors (a control: a native kernel that moves the same bytes) on the first set,
   timed as the benchmark times a point.

Bytes as in the benchmark (inputs read and outputs written once, the float32 angle rows used
once); fractions of the 2 GB copy of the same run; every value a median of do_bench or, in (3),
of its host-ahead variant.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import statistics
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import bench  # noqa: E402

LIGER = "Liger-Kernel (q+k, in place)"
LIGER_FLOAT32 = "Liger-Kernel (q+k, in place), float32 cos/sin"


def peer_leads(csv: pathlib.Path) -> list[dict]:
    """Each shape and direction of a recorded run where a peer was faster than ours (one row
    per shape, as the summary counts them): its fields, the peer and the recorded ratio."""
    import pandas as pd

    joined = bench.compare_with_peers(pd.read_csv(csv))
    joined = joined[~joined.index.duplicated()]  # a shape in two sweeps: once
    leads = joined[joined.speedup < 1].reset_index()
    points = []
    for r in leads.itertuples():
        point = {key: getattr(r, key) for key in bench.PEER_KEYS}
        for key in ("seq_len", "batch", "heads", "k_heads", "head_dim", "rotary_dim", "n_seqs"):
            point[key] = int(point[key])
        point["interleaved"] = bool(point["interleaved"])
        point.update(peer=r.best_other, recorded_ratio=round(float(r.speedup), 4),
                     recorded_mbytes=round(float(r.mbytes), 1))
        points.append(point)
    return points


def problem_of(point: dict):
    """The benchmark's problem for a recorded point."""
    kw = dict(seq_len=point["seq_len"], batch=point["batch"], heads=point["heads"],
              head_dim=point["head_dim"], rotary_percent=point["rotary_dim"] / point["head_dim"])
    if point["entry"] == "qk":
        kw["k_heads"] = point["k_heads"]
    if point["tensor_format"] == "thd":
        kw["n_seqs"] = point["n_seqs"]
    if point.get("interleaved"):
        kw["interleaved"] = True
    return bench.make_problem(point["tensor_format"], point["dtype"], kw)


def calls_for(point: dict, problem, float32_tables: bool = True) -> dict:
    """name -> callable: our call doing the peer's job, the peer, and (``float32_tables``)
    Liger's float32 run."""
    entry = point["entry"]
    impls = {"te": bench.implementations, "qk": bench.qk_implementations,
             "qkv": bench.qkv_implementations}[entry]()
    if "in place" in point["peer"]:  # the first of our in-place calls that runs here
        ours = next(name for name in bench.IN_PLACE[entry]
                    if impls[name](problem, point["direction"]) is not None)
    else:
        ours = bench.PRIMARY[entry]
    names = [ours, point["peer"]]
    if point["peer"] == LIGER and float32_tables:
        impls[LIGER_FLOAT32] = (bench._liger if entry == "te" else bench._liger_qk)(True)
        names.append(LIGER_FLOAT32)
    fns = {name: impls[name](problem, point["direction"]) for name in names}
    missing = [name for name, fn in fns.items() if fn is None]
    if missing:
        raise RuntimeError(f"{missing} do not run {point}")
    return fns


def spread(values) -> dict:
    """{median, min, max} of fractions, rounded as recorded."""
    return {"median": round(sorted(values)[len(values) // 2], 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def shuffled_rounds(fns: dict, nbytes: int, copy: float, rounds: int) -> dict:
    """name -> {median, min, max} fraction of ``copy`` over ``rounds`` shuffled rounds
    (``bench.shuffled_rounds``)."""
    return {name: spread(v) for name, v in bench.shuffled_rounds(fns, nbytes, copy, rounds).items()}


SMALL_MBYTES = 256  # points below this size get the placements and host-ahead timing of (3)
TIMING = (
    "points, transposition and small_points' invocations: triton.testing.do_bench median (L2 "
    "flushed per call); small_points' sets: bench.time_ms_host_ahead median (do_bench's flush and "
    f"events, the GPU kept busy {bench.HOST_LEAD_CYCLES} cycles after each flush); host_us: host "
    "time per call, 200 calls back to back")


def host_us(fn, calls: int = 200) -> float:
    """Microseconds of the host per call of ``fn``, ``calls`` back to back (fewer than the GPU's
    launch queue holds, so the host does not wait for the GPU until the end, which is untimed)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return round(seconds / calls * 1e6, 1)


def control_for(point: dict, problem):
    """An in-place torch.neg of the tensors the point's calls rotate: a native kernel moving the
    same bytes (one launch per tensor)."""
    forward = point["direction"] == "forward"
    if point["entry"] == "te":
        tensors = (problem.t if forward else problem.grad,)
    else:
        tensors = (problem.q, problem.k) if forward else (problem.gq, problem.gk)
    return lambda: [torch.neg(x, out=x) for x in tensors]


def small_point(point: dict, copy: float, rounds: int, placements: int, invocations: int,
                rng: random.Random) -> dict:
    """Section (3) of the module docstring for one point."""
    spacers, named, sets = [], {}, []
    for i in range(placements):
        spacers.append(torch.empty(rng.randint(1, 64) * 2**21 + rng.randint(0, 511) * 4096,
                                   dtype=torch.uint8, device="cuda"))
        sets.append(problem_of(point))
        calls = calls_for(point, sets[-1], float32_tables=False)
        for name, fn in calls.items():
            named[f"{name} | set {i}"] = fn
    ours, peer = calls
    fractions = bench.shuffled_rounds(named, sets[0].nbytes, copy, rounds,
                                      timer=bench.time_ms_host_ahead)
    row = {"sets": []}
    for i in range(placements):
        a, b = fractions[f"{ours} | set {i}"], fractions[f"{peer} | set {i}"]
        row["sets"].append({"ours": spread(a), "peer": spread(b),
                            "paired": round(statistics.median(x / y for x, y in zip(a, b)), 4)})
    first = {ours: named[f"{ours} | set 0"], peer: named[f"{peer} | set 0"],
             "torch.neg in place (control)": control_for(point, sets[0])}
    row["host_us"] = {name: host_us(fn) for name, fn in first.items()}
    row["invocations"] = {name: [] for name in first}
    for _ in range(invocations):
        for name, fn in first.items():
            row["invocations"][name].append(
                round(sets[0].nbytes / bench.time_ms(fn) / 1e6 / copy, 4))
    del spacers, sets, named, first
    torch.cuda.empty_cache()
    return row


def check_liger_float32_tables() -> None:
    """Liger with float32 cos/sin computes the rotation it computes with bf16 ones."""
    p = bench.QKProblem(seq_len=64, batch=2, heads=4, k_heads=2)
    q0, k0 = p.q.clone(), p.k.clone()
    runs = []
    for float32_tables in (False, True):
        p.q, p.k = q0.clone(), k0.clone()  # rotated in place
        bench._liger_qk(float32_tables)(p, "forward")()
        runs.append((p.q, p.k))
    assert not torch.equal(runs[0][0], q0)  # it did rotate
    for a, b in zip(*runs):
        torch.testing.assert_close(a.float(), b.float(), atol=0.06, rtol=0.02)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", type=pathlib.Path, default=ROOT / "figures" / "bench.csv")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--placements", type=int, default=3)
    parser.add_argument("--invocations", type=int, default=8)
    args = parser.parse_args(argv)
    if bench._liger_qk() is not None:
        check_liger_float32_tables()
    copy = bench.copy_bandwidth_gbps()
    result = {"provenance": bench.provenance(copy, "peer_margins"), "rounds": args.rounds,
              "recorded_run": os.path.relpath(args.bench, ROOT),
              "points": [], "transposition": {}, "small_points": []}
    result["provenance"]["command"] = "python scripts/peer_margins.py"
    result["provenance"]["timing"] = TIMING
    start = time.time()

    for point in peer_leads(args.bench):
        problem = problem_of(point)
        fns = calls_for(point, problem)
        fractions = shuffled_rounds(fns, problem.nbytes, copy, args.rounds)
        ours, peer = list(fns)[:2]
        row = dict(point, ours=ours, fractions=fractions,
                   ratio=round(fractions[ours]["median"] / fractions[peer]["median"], 4))
        if LIGER_FLOAT32 in fractions:
            row["ratio_float32_tables"] = round(
                fractions[ours]["median"] / fractions[LIGER_FLOAT32]["median"], 4)
        result["points"].append(row)
        print(f"{bench._shape(point):58s} ratio {row['ratio']:.3f} (recorded "
              f"{point['recorded_ratio']:.3f}), against float32 tables "
              f"{row.get('ratio_float32_tables', float('nan')):.3f}  "
              f"[{time.time() - start:.0f} s]", flush=True)
        del problem, fns
        torch.cuda.empty_cache()

    qk = bench.qk_implementations()
    for dtype in ("bf16", "fp32"):
        p = bench.QKProblem(dtype, rotary_percent=0.5)
        q_bhsd, k_bhsd = p.q.transpose(1, 2), p.k.transpose(1, 2)
        q_t, k_t = (torch.empty_like(x, memory_format=torch.contiguous_format)
                    for x in (q_bhsd, k_bhsd))
        q_s, k_s = torch.empty_like(p.q), torch.empty_like(p.k)
        fns = {
            "ours: hf.apply_rotary_pos_emb (contiguous [b, h, s, d] results)":
                qk["ours: hf.apply_rotary_pos_emb, q+k one launch"](p, "forward"),
            "ours: cos_sin_cache (results in the inputs' layout)":
                qk["ours: cos_sin_cache, q+k one launch"](p, "forward"),
            "torch: copy of q and k into contiguous [b, h, s, d] (a transpose)":
                lambda: (q_t.copy_(q_bhsd), k_t.copy_(k_bhsd)),
            "torch: copy of q and k into their own layout": lambda: (q_s.copy_(p.q), k_s.copy_(p.k)),
        }
        # The Hugging Face call's results are laid out as GPT-NeoX's function lays out its own.
        out = fns["ours: hf.apply_rotary_pos_emb (contiguous [b, h, s, d] results)"]()
        assert all(x.is_contiguous() for x in out)
        result["transposition"][dtype] = dict(p.row(), fractions=shuffled_rounds(
            fns, p.nbytes, copy, args.rounds))
        for name, v in result["transposition"][dtype]["fractions"].items():
            print(f"transposition {dtype}: {name:66s} {v['median']:.3f}", flush=True)
        del p, q_bhsd, k_bhsd, q_t, k_t, q_s, k_s, out
        torch.cuda.empty_cache()

    rng = random.Random(0)
    for point in result["points"]:
        if point["recorded_mbytes"] >= SMALL_MBYTES:
            continue
        keys = {key: point[key] for key in (*bench.PEER_KEYS, "peer", "recorded_mbytes")}
        row = dict(keys, ours=point["ours"], **small_point(point, copy, args.rounds,
                                                          args.placements, args.invocations, rng))
        result["small_points"].append(row)
        print(f"{bench._shape(point):58s} paired ours/peer per set "
              + " ".join(f"{s['paired']:.3f}" for s in row["sets"])
              + "; host us " + ", ".join(f"{v:.1f}" for v in row["host_us"].values())
              + f"  [{time.time() - start:.0f} s]", flush=True)
        for name, v in row["invocations"].items():
            print(f"    do_bench x{len(v)} {name:40s} " + " ".join(f"{x:.3f}" for x in v), flush=True)

    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
