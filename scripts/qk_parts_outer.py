"""q's programs first, then k's: the program order of rope_qk against the one before (GPU only).

    python scripts/qk_parts_outer.py [--out figures/qk_parts_outer_h200.json] [--rounds 3]
                                     [--min-mb 0] [--only qk,qkv]

rope_qk's programs of one head block ran a token's head blocks of q and k side by side (then the
next token's): the programs running at one time read and write four streams of memory, q's and
k's inputs and outputs. With ``rope_qk.PARTS_OUTER`` all of q's programs run first, then all of
k's (then v's), two streams at a time (``scripts/qk_size_scan.py`` found a Triton copy of q and k
in that order faster than in the other, and the cos/sin cache call with it).

For every q+k and fused-QKV problem of the benchmark (``bench.benchmark_jobs``), every call of
ours through rope_qk's functions (the kernels the public entry points launch), forward and
backward, whose plan has programs of one head block (where the order applies): the plan with the
flag off (``before``) and on (``parts_outer``), timed in shuffled rounds (``bench.time_ms``,
do_bench's median, as the benchmark), fractions of the run's 2 GiB copy counting the bytes the
benchmark counts (``bench.moved_bytes``). Each plan's results are compared bit for bit with the
other's (``same_bits``).
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

from qk_size_scan import every_plan, forced, provenance, same  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402


def planned(call, parts_outer, config=None):
    """``call`` on the plan made with ``rope_qk.PARTS_OUTER`` = ``parts_outer`` (and ``config`` in
    place of default_config's, if given), launched through rope_qk's plan table under the call's
    key (``qk_size_scan.forced``). Returns (the call, the plan)."""
    run = forced(config, call, PARTS_OUTER=parts_outer)
    return run, run.plan


def qk_calls(p):
    """(name as in the benchmark, direction) -> a call of rope_qk on q+k problem ``p``."""
    d, neox = p.head_dim, not p.interleaved
    q, k, gq, gk = (p.tokens(x) for x in (p.q, p.k, p.gq, p.gk))
    qi, ki, gqi, gki = (x.clone() for x in (q, k, gq, gk))
    cache = "ours: cos_sin_cache, q+k one launch"
    in_place = "ours: cos_sin_cache in place"
    calls = {
        (cache, "forward"): lambda: rope_qk.rope_cos_sin_cache(p.positions, q, k, d, p.cache,
                                                               neox),
        (cache, "backward"): lambda: rope_qk.rope_cos_sin_cache(p.positions, gq, gk, d, p.cache,
                                                                neox, backward=True),
        (in_place, "forward"): lambda: rope_qk.rope_cos_sin_cache(
            p.positions, qi, ki, d, p.cache, neox, query_out=qi, key_out=ki),
        (in_place, "backward"): lambda: rope_qk.rope_cos_sin_cache(
            p.positions, gqi, gki, d, p.cache, neox, query_out=gqi, key_out=gki, backward=True),
    }
    hq, hk, hgq, hgk = (x.transpose(1, 2) for x in (p.q, p.k, p.gq, p.gk))
    hqi, hki, hgqi, hgki = (x.clone().transpose(1, 2) for x in (p.q, p.k, p.gq, p.gk))
    if p.interleaved:
        functions = [("ours: hf.apply_rotary_pos_emb_glm, q+k one launch", "glm", p.cos, p.sin)]
        if p.rotary_dim == p.head_dim:
            functions.append(("ours: hf.apply_rotary_pos_emb_interleaved (Cohere), q+k one launch",
                              "interleaved", p.cos_pairs, p.sin_pairs))
    else:
        functions = [("ours: hf.apply_rotary_pos_emb, q+k one launch", "half", p.cos, p.sin)]
        hf_in_place = "ours: hf.apply_rotary_pos_emb_inplace"
        calls[(hf_in_place, "forward")] = lambda: rope_qk.rope_cos_sin(
            hqi, hki, p.cos, p.sin, 1, q_out=hqi, k_out=hki)
        calls[(hf_in_place, "backward")] = lambda: rope_qk.rope_cos_sin(
            hgqi, hgki, p.cos, p.sin, 1, backward=True, q_out=hgqi, k_out=hgki)
    for name, pairs, cos, sin in functions:
        calls[(name, "forward")] = (lambda cos=cos, sin=sin, pairs=pairs:
                                    rope_qk.rope_cos_sin(hq, hk, cos, sin, 1, pairs=pairs))
        calls[(name, "backward")] = (lambda cos=cos, sin=sin, pairs=pairs:
                                     rope_qk.rope_cos_sin(hgq, hgk, cos, sin, 1, backward=True,
                                                          pairs=pairs))
    return calls


def qkv_calls(p):
    name = "ours: fused QKV, one launch"
    return {(name, "forward"): lambda: rope_qk.rope_qkv(p.qkv, p.freqs, p.freqs, p.splits,
                                                         interleaved=p.interleaved),
            (name, "backward"): lambda: rope_qk.rope_qkv_backward(
                *p.grads, p.freqs, p.freqs, p.splits, interleaved=p.interleaved)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-mb", type=float, default=0.0)
    parser.add_argument("--only", default="qk,qkv")
    parser.add_argument("--every-plan", action="store_true",
                        help="order by part every plan of one head block in memory order, not "
                             "only those of the package's rule (rope_qk._parts_outer)")
    parser.add_argument("--hf-2kb", action="store_true",
                        help="also time Hugging Face's half-split calls that the rule leaves in "
                             "the order before on 2 KB head blocks ordered by part")
    parser.add_argument("--hf-k-2kb", action="store_true",
                        help="the same, but q's blocks kept and k's halved (2 KB)")
    parser.add_argument("--candidates-only", action="store_true",
                        help="time only the candidates of --hf-2kb or --hf-k-2kb")
    args = parser.parse_args(argv)
    if args.every_plan:
        rope_qk._parts_outer = every_plan
    copy_gbps = bench.copy_bandwidth_gbps()
    record = dict(provenance=provenance(copy_gbps, "qk_parts_outer",
                                        "python scripts/qk_parts_outer.py "
                                        + " ".join(argv or sys.argv[1:])),
                  rows=[])
    jobs = [j for j in bench.benchmark_jobs("full", entries=True)
            if j[2] in args.only.split(",") and not j[4]]
    for sweep, kw, fmt, dtype, _ in jobs:
        p = bench.make_problem(fmt, dtype, kw)
        if p.nbytes < args.min_mb * 1e6:
            continue
        for (name, direction), call in (qk_calls(p) if fmt == "qk" else qkv_calls(p)).items():
            moved = bench.moved_bytes(p, name)
            before, _ = planned(call, False)
            after, plan = planned(call, True)
            fns = {"before": before, "parts_outer": after}
            in_place = "in place" in name or "inplace" in name
            if plan.constexprs["PARTS_OUTER"] and args.candidates_only:
                continue
            if not plan.constexprs["PARTS_OUTER"]:
                c = plan.constexprs
                row_bytes = p.head_dim * p.q.element_size() if fmt == "qk" else 0
                if not ((args.hf_2kb or args.hf_k_2kb) and "hf.apply_rotary_pos_emb" in name
                        and not p.interleaved
                        and not c["ALL_HEADS"] and not c["TOKEN_BLOCKS_FASTEST"]
                        and c["BLOCK_H"] * row_bytes == 4096
                        and p.k_heads % (c["BLOCK_H"] // 2) == 0):
                    continue  # not the rule's (programs of all heads, token blocks fastest, ...)
                if args.hf_k_2kb:  # q's 4 KB blocks, k's 2 KB
                    fns = {"before": before, "hf_k_2kb_parts_outer": planned(
                        call, True, dict(block_s=1, block_h=c["BLOCK_H"],
                                         block_hk=c["BLOCK_H"] // 2, num_warps=2,
                                         all_heads=False))[0]}
                else:
                    fns = {"before": before, "hf_2kb_parts_outer": planned(
                        call, True, dict(block_s=1, block_h=c["BLOCK_H"] // 2, num_warps=2,
                                         all_heads=False))[0]}
            # In place, both plans write the same tensors: no second result to compare.
            candidate = list(fns)[1]
            bits = None if in_place else same(before(), fns[candidate]())
            fractions = bench.shuffled_rounds(fns, moved, copy_gbps, args.rounds)
            row = dict(p.row(), sweep=sweep, impl=name, direction=direction, mbytes=moved / 1e6,
                       same_bits=bits, **{k: statistics.median(v) for k, v in fractions.items()},
                       rounds=fractions)
            row["candidate"] = candidate
            row["ratio"] = row[candidate] / row["before"]
            record["rows"].append(row)
            print(f"{sweep:14s} {dtype} s{p.seq_len} b{p.batch} h{p.heads}"
                  f"/{getattr(p, 'k_heads', '-')} d{p.head_dim} r{p.rotary_dim}"
                  f"{' il' if p.interleaved else ''} {moved / 1e6:5.0f} MB {name[6:40]:34s} "
                  f"{'' if candidate == 'parts_outer' else candidate + ' '}"
                  f"{direction[:3]}: {row['before']:.3f} -> {row[candidate]:.3f} "
                  f"({row['ratio']:.3f}){' BITS DIFFER' if bits is False else ''}", flush=True)
            if args.out:
                args.out.write_text(json.dumps(record, indent=1) + "\n")
        del p
        torch.cuda.empty_cache()
    for candidate in ("parts_outer", "hf_2kb_parts_outer", "hf_k_2kb_parts_outer"):
        ratios = [r["ratio"] for r in record["rows"] if r["candidate"] == candidate]
        if ratios:
            print(f"{len(ratios)} calls: {candidate} / before median "
                  f"{statistics.median(ratios):.3f}, min {min(ratios):.3f}, "
                  f"max {max(ratios):.3f}")


if __name__ == "__main__":
    main()
