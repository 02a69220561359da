"""What the thd A/B scripts share (``thd_angle_rows.py``, ``thd_first_wave.py``,
``thd_pre_pass_scatter.py``; before 2026-11-27 also ``thd_pre_pass_guess.py`` and
``thd_pre_pass_rounds.py``, retired with the pre-pass they changed): their arguments, their
candidates made from rope_2d.py by text, the 8-head packs, each side's whole calls and pre-pass
on the same packs checked bit for bit against the first side's, their timing in shuffled rounds
(written as a table after every round from the second on), and the table printed side by side."""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
from typing import Callable, Optional

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from qk_table_hint import module_copy  # noqa: E402
from rope_kernels.bench import Problem, provenance, time_ms, time_ms_host_ahead  # noqa: E402


def arguments(doc: str, default_out: str, sides: Optional[list] = None) -> argparse.Namespace:
    """``--out`` (the JSON written) and ``--rounds`` (2 or more) of a script with docstring
    ``doc``; with ``sides`` (the script's candidates' names), ``--sides`` too: the candidates
    timed against the package, all of them if not given."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", default=default_out)
    parser.add_argument("--rounds", type=int, default=3, help="2 or more")
    if sides:
        parser.add_argument("--sides", nargs="+", choices=sides, default=sides,
                            help="candidates timed against the package (default: all)")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds: 2 or more (results are written from the second round on)")
    return args


# The last line of rope_2d_kernel's parameters and the signature's close.
KERNEL_SIGNATURE_END = "    CHANNEL_MULTIPLE: tl.constexpr,\n):\n"


def new_constexpr(declaration: str) -> tuple[str, str]:
    """The replacement (for ``rope_2d_variant``) that adds ``declaration`` (``"NAME:
    tl.constexpr = default"``) as rope_2d_kernel's last parameter."""
    return (KERNEL_SIGNATURE_END,
            KERNEL_SIGNATURE_END.replace("\n):", f"\n    {declaration},\n):"))


def rope_2d_variant(name: str, replacements, folder: pathlib.Path,
                    adjust_plan: Optional[Callable] = None):
    """``rope_kernels/rope_2d.py`` with each ``(old, new)`` of ``replacements`` made (the script
    stops if an ``old`` is not there exactly once), written to ``folder`` (``@triton.jit`` reads
    a kernel's source from its file) and loaded as the module ``name``, launched like the
    package's (``qk_table_hint.module_copy``). ``adjust_plan(plan, t)``, if given, edits every
    launch plan the module makes for a tensor ``t``."""
    source = (ROOT / "rope_kernels" / "rope_2d.py").read_text()
    for old, new in replacements:
        if source.count(old) != 1:
            sys.exit(f"rope_2d.py no longer has this text, which {name} replaces: update the "
                     f"script\n{old}")
        source = source.replace(old, new)
    path = folder / f"{name}.py"
    path.write_text(source)
    module = module_copy(name, path)
    if adjust_plan is not None:
        make_plan = module._make_plan

        def adjusted(t, *args, **kwargs):
            plan = make_plan(t, *args, **kwargs)
            adjust_plan(plan, t)
            return plan

        module._make_plan = adjusted
    return module


def eight_head_packs() -> dict:
    """131072 tokens of 8 heads of 128 (2 KB token rows in bf16) cut at random into 256, 4096,
    16384 and 65536 sequences, and into 16384 x 8 and 512 x 256 equal ones."""
    packs = {f"h8 random {n}": Problem("thd", seq_len=8192, batch=16, heads=8, n_seqs=n)
             for n in (256, 4096, 16384, 65536)}
    packs["h8 uniform 16384x8"] = Problem("thd", seq_len=8, batch=16384, heads=8)
    packs["h8 uniform 512x256"] = Problem("thd", seq_len=256, batch=512, heads=8)
    return packs


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


def pre_pass_calls(sides: dict, packs: dict, calls: dict, diffs: list) -> dict:
    """For every pack and side (as in ``whole_calls``): the side's thd pre-pass alone
    (``thd_positions_kernel``), run once into a -1-filled int32 buffer and compared bit for bit
    with the first side's rows (a differing one is appended to ``diffs`` and printed as a DIFF
    line), added to ``calls`` as ``(pack, "pre NAME")``. Returns {pack: the first side's rows}."""
    first_rows = {}
    for pname, p in packs.items():
        n_tokens = p.t.shape[0]
        for name, m in sides.items():
            rows = torch.full((n_tokens,), -1, dtype=torch.int32, device=p.t.device)
            plan = m.pre_pass_plan(n_tokens, p.n_seqs)

            def pre(m=m, plan=plan, p=p, rows=rows):
                m.launch(m.thd_positions_kernel, plan, (p.cu_seqlens, p.cu_seqlens, rows))
            pre()
            torch.cuda.synchronize()
            if pname not in first_rows:
                first_rows[pname] = rows
            elif not torch.equal(rows, first_rows[pname]):
                diffs.append(f"{pname} rows {name}")
                print("DIFF", diffs[-1], flush=True)
            calls[(pname, f"pre {name}")] = pre
    return first_rows


def timed_rounds(calls: dict, nbytes: dict, copy_gbps: float, args: argparse.Namespace,
                 script: str, extra: Optional[dict] = None,
                 microseconds: Callable[[str], bool] = lambda what: False) -> dict:
    """Time every entry of ``calls`` once per round, in a new shuffled order each round, as
    [time_ms_host_ahead, do_bench] fractions of ``copy_gbps`` (the copy's own bytes for ``copy
    same``, the call's otherwise); entries whose name ``microseconds`` picks are timed in
    microseconds with the host kept ahead only (do_bench is slow on a call of a few
    microseconds). ``args.rounds`` rounds; from the second on, the medians so far are written to
    ``args.out`` with the run's provenance (the command that ran ``scripts/<script>``; ``extra``
    added). Returns the last table: {pack: {name: [medians]}}."""
    keys = list(calls)
    results = {k: [] for k in keys}
    median = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    table = {}
    for r in range(args.rounds):
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
        prov.update(command=f"python scripts/{script} --out {args.out} --rounds {args.rounds}",
                    rounds_done=r + 1,
                    timing="[time_ms_host_ahead, do_bench] medians as fractions of copy_gbps")
        prov.update(extra or {})  # a script's own "timing" replaces the line above
        pathlib.Path(args.out).write_text(json.dumps(dict(provenance=prov, table=table), indent=1))
    return table


def print_sides(table: dict, sides, legend: str):
    """One line per pack: each side's fraction of copy (host ahead) forward, then backward."""
    print(legend)
    for pname, t in table.items():
        line = "  ".join(f"{d} " + " / ".join(f"{t[f'{d} {v}'][0]:.3f}" for v in sides)
                         for d in ("fwd", "bwd"))
        print(f"{pname:22s} {line}  copy same {t['copy same'][0]:.3f}")
