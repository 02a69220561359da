"""What the thd A/B scripts share (``thd_pre_pass_guess.py``, ``thd_angle_rows.py``): each side's
whole calls on the same packs, checked bit for bit against the first side's, and their timing in
shuffled rounds, written as a table after every round from the second on."""

from __future__ import annotations

import json
import pathlib
import random
import sys
from typing import Callable, Optional

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import provenance, time_ms, time_ms_host_ahead  # noqa: E402


def whole_calls(sides: dict, packs: dict) -> tuple[dict, dict, list]:
    """For every pack (a ``bench.Problem`` of the thd format) and direction: each side's
    ``rope_2d`` (``sides``: name -> a module with one) out of place into a NaN-filled output,
    run once and compared bit for bit with the first side's (the differing ones are listed and
    printed as DIFF lines), and a ``copy_`` of the pack (``copy same``).

    Returns ``calls`` ({(pack, "fwd NAME" | "bwd NAME" | "copy same"): callable}), ``nbytes``
    ({pack: (bytes a call moves as the benchmark counts them, bytes of the copy)}) and the
    list of differing outputs."""
    calls, nbytes, diffs = {}, {}, []
    for pname, p in packs.items():
        x = p.t
        for direction in ("fwd", "bwd"):
            first = None
            for name, m in sides.items():
                o = torch.full_like(x, float("nan"))

                def call(x=x, p=p, o=o, m=m, bwd=direction == "bwd"):
                    m.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens, out=o, backward=bwd)
                call()
                torch.cuda.synchronize()
                if first is None:
                    first = o.clone()
                elif not torch.equal(o, first):
                    diffs.append(f"{pname} {direction} {name}")
                    print("DIFF", diffs[-1], flush=True)
                calls[(pname, f"{direction} {name}")] = call
        co = torch.empty_like(x)
        calls[(pname, "copy same")] = lambda co=co, x=x: co.copy_(x)
        nbytes[pname] = (p.nbytes, 2 * x.numel() * x.element_size())
    return calls, nbytes, diffs


def timed_rounds(calls: dict, nbytes: dict, copy_gbps: float, rounds: int, out: str,
                 command: str, extra: Optional[dict] = None,
                 microseconds: Callable[[str], bool] = lambda what: False) -> dict:
    """Time every entry of ``calls`` once per round, in a new shuffled order each round, as
    [time_ms_host_ahead, do_bench] fractions of ``copy_gbps`` (the copy's own bytes for ``copy
    same``, the call's otherwise); entries whose name ``microseconds`` picks are timed in
    microseconds with the host kept ahead only (do_bench is slow on a call of a few
    microseconds). From the second round on, the medians so far are written to ``out`` with the
    run's provenance (``command``; ``extra`` added). Returns the last table:
    {pack: {name: [medians]}}."""
    keys = list(calls)
    results = {k: [] for k in keys}
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    table = {}
    for r in range(rounds):
        random.shuffle(keys)
        for k in keys:
            pname, what = k
            if microseconds(what):
                results[k].append((time_ms_host_ahead(calls[k]) * 1e3,))
                continue
            by = nbytes[pname][1 if what == "copy same" else 0]
            frac = lambda t: by / t / 1e6 / copy_gbps  # noqa: E731
            results[k].append((frac(time_ms_host_ahead(calls[k])), frac(time_ms(calls[k]))))
        print("round", r, flush=True)
        if r == 0:
            continue
        table = {}
        for (pname, what), v in results.items():
            table.setdefault(pname, {})[what] = [round(median([e[i] for e in v]), 4)
                                                 for i in range(len(v[0]))]
        prov = provenance(copy_gbps, "probe")
        prov.update(command=command, rounds_done=r + 1, **(extra or {}))
        pathlib.Path(out).write_text(json.dumps(dict(provenance=prov, table=table), indent=1))
    return table
