"""In-place q+k calls with part of the head rotated: the channels past ``rotary_dim`` left where
they are, against copying them onto themselves (GPU only).

    python scripts/qk_in_place_rotated_only.py [--out figures/qk_in_place_rotated_only_h200.json]
                                               [--rounds 5]

In place, the channels past ``rotary_dim`` of q and k already hold their results. rope_qk plans
such a call as one on heads narrowed to ``rotary_dim`` (a view of the same memory: same strides,
all of it rotated), so they are neither read nor written, as vLLM's and FlashInfer's in-place
kernels leave them. Before, the plan copied them through, and half the head rotated moved every
byte of q and k.

At the benchmark's q+k shape with half the head rotated (bf16 forward and backward, fp32
forward; 16 x 4096 tokens, 32 q / 8 k heads of 128), for Hugging Face's in-place call and the
cos/sin cache in place, in shuffled rounds (``bench.time_ms_host_ahead``, median):
- ``before``: the plan before, copying the channels through (its default tile);
- ``before, best tile``: the best tile a probe found for it (whole rows, 1 token x 8 heads, 2
  warps; Hugging Face's call only);
- ``rule``: the narrowed plan with its default tile (what the package runs);
- 16 other tiles of the narrowed plan.
Each as a fraction of the run's 2 GB copy, counting every byte of q and k (``full``: the same
count for every call, so the numbers compare times) and counting the bytes moved (``moved``:
the rotated channels only for the narrowed plans). Every narrowed tile's results are checked
bit for bit against the out-of-place call's.
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

from rope_kernels import bench, rope_qk  # noqa: E402


def _tile(block_s, block_h, num_warps, whole_rows=False):
    return dict(block_s=block_s, block_h=block_h, num_warps=num_warps, all_heads=False,
                whole_rows=whole_rows)


TILES = {"1x8 2w": _tile(1, 8, 2), "2x8 2w": _tile(2, 8, 2), "4x8 2w": _tile(4, 8, 2),
         "2x16 2w": _tile(2, 16, 2), "2x8 4w": _tile(2, 8, 4), "4x8 4w": _tile(4, 8, 4),
         "1x16 2w": _tile(1, 16, 2), "8x8 4w": _tile(8, 8, 4),
         "2x8 2w rows": _tile(2, 8, 2, True), "1x8 2w rows": _tile(1, 8, 2, True),
         "4x4 2w rows": _tile(4, 4, 2, True), "4x8 4w rows": _tile(4, 8, 4, True),
         "loads first 2w": rope_qk._loads_first(32, 8, 2),
         "loads first 4w": rope_qk._loads_first(32, 8, 4),
         "all heads 2w": dict(block_s=1, block_h=32, block_hk=8, num_warps=2, all_heads=True),
         "all heads 16 4w": dict(block_s=1, block_h=16, block_hk=8, num_warps=4,
                                 all_heads=True)}
BEFORE_BEST = _tile(1, 8, 2, True)


def views(kind, p, q, k):
    """q and k as each call is given them: [b, h, s, d] views, or [tokens, heads * d]."""
    return (q.transpose(1, 2), k.transpose(1, 2)) if kind == "hf" else (p.tokens(q), p.tokens(k))


def call(kind, p, backward, q, k, out=True):
    """The call on q, k: in place (``out``) or out of place (returns the results)."""
    if kind == "hf":
        o = dict(q_out=q, k_out=k) if out else {}
        return rope_qk.rope_cos_sin(q, k, p.cos, p.sin, 1, backward=backward, **o)
    o = dict(query_out=q, key_out=k) if out else {}
    return rope_qk.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache, True,
                                      backward=backward, **o)


def planned(kind, p, backward, q, k, config=None, before=False):
    """(plan, pointers) of one in-place call on q and k (which it rotates once, making the
    plan): ``config`` forced, or the default; ``before``: the plan before, which copied the
    channels past rotary_dim (the default tile the in-place call had then, unless forced)."""
    real_config, real_plan = rope_qk.default_config, rope_qk._plan
    if before:
        args = (p.seq_len, p.heads, p.k_heads, p.head_dim, q.element_size(), True, False,
                rope_qk.ANGLES["cos_sin" if kind == "hf" else "cache"], p.rotary_dim, True)
        config = config or real_config(*args)
        # The plan of the same call not in place: nothing narrowed, with the in-place tile.
        rope_qk._plan = lambda *a, **kw: real_plan(*a, **{**kw, "in_place": False})
    if config is not None:
        rope_qk.default_config = lambda *a, **kw: dict(config)
    try:
        rope_qk._PLANS.clear()
        call(kind, p, backward, q, k)
        (plan,) = rope_qk._PLANS.values()
    finally:
        rope_qk.default_config, rope_qk._plan = real_config, real_plan
        rope_qk._PLANS.clear()
    if kind == "hf":
        pointers = (q, q, k, k, q, q, p.cos, p.cos, p.sin, q, q)
    else:
        pointers = (q, q, k, k, q, q, p.cache, p.cache, p.cache, p.positions, q)
    return plan, pointers


def describe(plan):
    c = plan.constexprs
    return dict(block_s=c["BLOCK_S"], block_h=c["BLOCK_H"], row=c["ROW"], passed=c["PASS"],
                all_heads=c["ALL_HEADS"], loads_first=c["LOADS_FIRST"], warps=plan.num_warps,
                head_dim=plan.scalars[8])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "qk_in_place_rotated_only_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 1
    copy = bench.copy_bandwidth_gbps()
    result = dict(provenance=bench.provenance(copy, "qk_in_place_rotated_only"),
                  rounds=args.rounds, timer="bench.time_ms_host_ahead, median of rounds",
                  sets={})
    started = time.time()
    for dtype, direction in (("bf16", "forward"), ("bf16", "backward"), ("fp32", "forward")):
        p = bench.QKProblem(dtype, rotary_percent=0.5)
        backward = direction == "backward"
        src_q, src_k = (p.gq, p.gk) if backward else (p.q, p.k)
        fns, same_bits, plans = {}, {}, {}
        for kind in ("hf", "cache"):
            want = [x.clone() for x in call(kind, p, backward, *views(kind, p, src_q, src_k),
                                            out=False)]
            for name, config in {"rule": None, **TILES}.items():
                q, k = views(kind, p, src_q.clone(), src_k.clone())
                plan, _ = planned(kind, p, backward, q, k, config)  # rotates q and k once
                torch.cuda.synchronize()
                same_bits[f"{kind} {name}"] = bool(torch.equal(q, want[0])
                                                   and torch.equal(k, want[1]))
                if name == "rule":
                    plans[kind] = describe(plan)
                del q, k
            del want
            befores = {"before": None, **({"before, best tile": BEFORE_BEST}
                                          if kind == "hf" else {})}
            for name, config in {**befores, "rule": None, **TILES}.items():
                q, k = views(kind, p, src_q, src_k)
                plan, pointers = planned(kind, p, backward, q, k, config,
                                         before=name.startswith("before"))
                if name == "before":
                    plans[f"{kind} before"] = describe(plan)
                fns[f"{kind} {name}"] = (lambda plan=plan, pointers=pointers:
                                         rope_qk.launch(rope_qk.rope_qk_kernel, plan, pointers))
        rounds = bench.shuffled_rounds(fns, p.nbytes, copy, args.rounds,
                                       timer=bench.time_ms_host_ahead)
        full = {n: round(statistics.median(v), 4) for n, v in rounds.items()}
        moved = {n: round(v * (p.nbytes if "before" in n else p.rotated_nbytes) / p.nbytes, 4)
                 for n, v in full.items()}
        result["sets"][f"{dtype} {direction}"] = dict(
            mbytes=dict(full=round(p.nbytes / 1e6, 1), moved=round(p.rotated_nbytes / 1e6, 1)),
            plans=plans, same_bits_as_out_of_place=same_bits, full=full, moved=moved,
            spread={n: round(max(v) - min(v), 4) for n, v in rounds.items()},
            time_rule_over_before={kind: round(full[f"{kind} before"] / full[f"{kind} rule"], 4)
                                   for kind in ("hf", "cache")})
        print(f"{dtype} {direction} [{time.time() - started:.0f} s]:",
              json.dumps(result["sets"][f"{dtype} {direction}"]["time_rule_over_before"]),
              "all bits equal:", all(same_bits.values()), flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        del p, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
