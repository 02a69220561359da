"""What FlashInfer's per-token positions cost the q+k kernel, beside Liger-Kernel (GPU only).

    python scripts/qk_positions_cost.py [--out figures/qk_positions_cost_h200.json] [--rounds 9]
                                        [--placements 2]

At q+k bf16 batch 1 (4096 tokens, 32 q / 8 k heads of 128, in place, 86 MB) Liger's kernel led ours
by up to about 2% in the recorded runs of 2026-11-26 and -27, before 0892ecc issued q's and k's
loads ahead of the positions' (``figures/qk_positions_cost_h200_2026-11-26.json``; since then ours
leads, ``figures/qk_positions_cost_h200.json``). The two do not do quite the same job: our
cos/sin-cache call reads each token's position from ``positions`` and then that row of the cache, a
load that waits for another load, where Liger is given cos and sin already gathered per token
(Hugging Face's convention) and reads the token's own row.

Here, on batch-1 problems whose positions are 0, 1, 2, ... (so the token index is the position,
and the outputs must be equal to the bit): our in-place cache call as the package makes it, the
same plan with the row taken from the token index (``HAS_POSITIONS`` off: no positions load,
nothing else changed), and Liger with bf16 and with float32 cos and sin (float32: the table bytes
ours reads). ``--placements`` sets of buffers (a spacer allocation of random size before each),
all calls in ``--rounds`` shuffled rounds timed by ``bench.time_ms_host_ahead`` (L2 flushed per
call, the host kept ahead of the GPU). Per set: each call's median fraction of the 2 GB copy and
its median ratio to Liger (bf16 tables) within a round; ``no_positions/ours`` the same for the
call without the positions load over the package's call.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import pathlib
import random
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import bench  # noqa: E402

qk = importlib.import_module("rope_kernels.rope_qk")

SHAPES = [(4096, "backward"), (4096, "forward"), (8192, "backward"), (8192, "forward")]


@contextlib.contextmanager
def _no_positions():
    """Plans made inside take each token's cache row from its index, not from ``positions``."""
    plan = qk._plan
    qk._plan = lambda *args, **kwargs: plan(*args, **{**kwargs, "has_positions": False})
    try:
        yield
    finally:
        qk._plan = plan


def ours(p: bench.QKProblem, backward: bool, q, k, positions: bool = True):
    """Our in-place cache call on the token views ``q``, ``k``; without ``positions``, its plan
    with the positions load left out, launched as the package launches it."""
    def call():
        return qk.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache, query_out=q,
                                     key_out=k, backward=backward)

    if positions:
        return call
    made = {}
    run = qk._run
    qk._run = lambda sig, make_plan, pointers: made.update(plan=make_plan(), pointers=pointers)
    try:
        with _no_positions():
            call()
    finally:
        qk._run = run
    plan, pointers = made["plan"], made["pointers"]
    assert plan.constexprs["HAS_POSITIONS"] is False
    return lambda: qk.launch(qk.rope_qk_kernel, plan, pointers)


def same_bits(p: bench.QKProblem, backward: bool) -> None:
    """With positions 0, 1, 2, ... both plans write the same bits."""
    assert torch.equal(p.positions, torch.arange(p.seq_len, device=p.positions.device))
    bq, bk = (p.gq, p.gk) if backward else (p.q, p.k)
    outs = []
    for positions in (True, False):
        q, k = p.tokens(bq).clone(), p.tokens(bk).clone()
        ours(p, backward, q, k, positions)()
        outs.append((q, k))
    torch.cuda.synchronize()
    assert not torch.equal(outs[0][0], p.tokens(bq))  # it did rotate
    for a, b in zip(*outs):
        assert torch.equal(a, b), "the call without the positions load wrote other bits"


def measure(seq_len: int, direction: str, copy: float, rounds: int, placements: int,
            rng: random.Random) -> list[dict]:
    backward = direction == "backward"
    named, spacers, problems = {}, [], []
    for i in range(placements):
        spacers.append(torch.empty(rng.randint(1, 64) * 2**21 + rng.randint(0, 511) * 4096,
                                   dtype=torch.uint8, device="cuda"))
        p = bench.QKProblem(seq_len=seq_len, batch=1)
        problems.append(p)
        if i == 0:
            same_bits(p, backward)
        bq, bk = (p.gq, p.gk) if backward else (p.q, p.k)
        named[("ours", i)] = ours(p, backward, p.tokens(bq), p.tokens(bk))
        named[("no_positions", i)] = ours(p, backward, p.tokens(bq), p.tokens(bk), False)
        named[("liger_bf16", i)] = bench._liger_qk(False)(p, direction)
        named[("liger_float32", i)] = bench._liger_qk(True)(p, direction)
    fractions = bench.shuffled_rounds(named, problems[0].nbytes, copy, rounds,
                                      timer=bench.time_ms_host_ahead)
    rows = []
    for i in range(placements):
        row = dict(seq_len=seq_len, batch=1, heads=32, k_heads=8, head_dim=128, dtype="bf16",
                   direction=direction, set=i, mbytes=round(problems[0].nbytes / 1e6, 1))
        liger = fractions[("liger_bf16", i)]
        for name in ("ours", "no_positions", "liger_bf16", "liger_float32"):
            v = fractions[(name, i)]
            row[name] = round(statistics.median(v), 4)
            row[f"{name}/liger_bf16"] = round(statistics.median(a / b for a, b in zip(v, liger)), 4)
        row["no_positions/ours"] = round(statistics.median(
            a / b for a, b in zip(fractions[("no_positions", i)], fractions[("ours", i)])), 4)
        rows.append(row)
    del named, spacers, problems
    torch.cuda.empty_cache()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=pathlib.Path,
                    default=ROOT / "figures" / "qk_positions_cost_h200.json")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--placements", type=int, default=2)
    args = ap.parse_args(argv)
    if bench._liger_qk() is None:
        raise SystemExit("Liger-Kernel is not importable: it is the peer this script measures")
    copy = bench.copy_bandwidth_gbps()
    rng = random.Random(0)
    prov = bench.provenance(copy, "qk_positions_cost")
    prov.update(command=f"python scripts/qk_positions_cost.py --rounds {args.rounds} "
                        f"--placements {args.placements}",
                timing=f"bench.time_ms_host_ahead medians over {args.rounds} shuffled rounds "
                       "(L2 flushed per call, the GPU kept busy "
                       f"{bench.HOST_LEAD_CYCLES} cycles after each flush); ratios: median "
                       "over the rounds of the ratio within a round",
                bytes="q and k read and written once + the float32 cos/sin rows of the positions "
                      "(as the benchmark counts the q+k problems, for every call here)")
    rows = []
    for done, (seq_len, direction) in enumerate(SHAPES, 1):
        for row in measure(seq_len, direction, copy, args.rounds, args.placements, rng):
            print(json.dumps(row), flush=True)
            rows.append(row)
        # Written after every problem, so that a run stopped by a time limit keeps what it measured
        # (``complete`` says whether every problem was).
        args.out.write_text(json.dumps({"provenance": prov, "complete": done == len(SHAPES),
                                        "rows": rows}, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
