"""The thd pre-pass's search with each round's loads sent together (candidates, not in the
package) against the package's, on a GPU: the pre-pass alone, the whole call, and the main kernel
alone as the ceiling.

    python scripts/thd_pre_pass_rounds.py [--out FILE.json] [--rounds N] [--sides NAME ...]

Why: at random cuts the main kernel alone (its token rows written beforehand) ran at 0.953-0.954
of the 2 GiB copy on an H200, the whole call at 0.933-0.944, and the pre-pass alone took 5.9-7.8
us (docs/performance_notes.md, 2026-11-27). Compiled for sm_90, the package's pre-pass
(``rope_2d.thd_positions_kernel``) waits on its loads one after another: the guess's two
boundaries, reduced (``tl.min``, a barrier) before the branch; then, each round of the FANOUT-ary
search, the first token's boundaries, reduced, and only then the last token's. At 65536 sequences
(two rounds) that is five loads from DRAM in a chain, at 256 sequences three.

Three candidates (``--sides`` picks which are timed against the package; all by default):
- "rounds together": each round's two vectors of boundaries are loaded before either is reduced
  (``_narrow_both``), the first round beside the guess's boundaries and reduced before the guess
  is checked: two loads in a chain at 65536 sequences, one at 256.
- "first loads early": the first round spans every sequence for both tokens alike, so it is one
  vector, loaded beside the guess's boundaries and reduced only where the guess misses; the later
  rounds as in "rounds together".
- "together after the check": the package's code where the guess holds, every round as in
  "rounds together" where it misses.

The numbers are the same (the same boundaries compared the same way), so every output and every
token row must be the same bits (``tests/test_thd_candidates.py`` checks that on the CPU). Each
candidate is ``rope_kernels/rope_2d.py`` with pieces replaced by text
(``thd_sides.rope_2d_variant``: the script stops if a piece is not found), loaded as its own
module launched like the package's.

Packs as in ``thd_angle_rows.py``' 8-head ones, and 32 heads; forward and backward. Entries: the
whole call as (time_ms_host_ahead, do_bench) medians as fractions of the device copy; ``pre``: the
pre-pass alone in microseconds (time_ms_host_ahead); ``main only``: the package's main kernel
alone, its token rows written beforehand, without PDL (the ceiling of any pre-pass); ``copy
same``: a copy of the pack's bytes. Results are written after every round from the second on.

Status: run on an H200. ``figures/thd_pre_pass_rounds_h200.json`` (the first two, 3 rounds): the
pre-pass alone 0.6-1.1 us faster at 4096-65536 random sequences and 0.6-0.7 us slower at 16384 x 8
equal ones. ``figures/thd_pre_pass_after_check_h200.json`` (the third, 5 rounds): 0.03-0.23 us
faster at random cuts, as fast at equal ones. The whole calls within the rounds' spread in both.
None taken (docs/performance_notes.md, 2026-11-27, session 54).
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rope_kernels.bench import Problem, copy_bandwidth_gbps  # noqa: E402
from thd_sides import (arguments, eight_head_packs, pre_pass_calls,  # noqa: E402
                       rope_2d_variant, timed_rounds, whole_calls)

r2 = importlib.import_module("rope_kernels.rope_2d")  # the module; the package exports the function

PRE_PASS_DEF = ('@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "narrow_rounds", '
                '"cp_size", "cp_rank"])\ndef thd_positions_kernel(')
NARROW_BOTH = """@triton.jit
def _narrow_both(cu_seqlens_ptr, first, last, lo, hi, lo_last, hi_last, cp_size,
                 FANOUT: tl.constexpr, USE_CP: tl.constexpr):
    \"\"\"``_narrow`` for two tokens at once: both vectors of boundaries are loaded before either
    is reduced (each tl.sum waits on its load and ends in a barrier).\"\"\"
    step = (hi - lo + FANOUT - 1) // FANOUT
    idx = lo + tl.arange(0, FANOUT) * step
    inside = idx < hi
    step_last = (hi_last - lo_last + FANOUT - 1) // FANOUT
    idx_last = lo_last + tl.arange(0, FANOUT) * step_last
    inside_last = idx_last < hi_last
    bound = tl.load(cu_seqlens_ptr + idx, mask=inside, other=0)
    bound_last = tl.load(cu_seqlens_ptr + idx_last, mask=inside_last, other=0)
    bound = _local(bound, cp_size, USE_CP)
    bound_last = _local(bound_last, cp_size, USE_CP)
    below = tl.sum((inside & (bound <= first)).to(tl.int32), axis=0)
    below_last = tl.sum((inside_last & (bound_last <= last)).to(tl.int32), axis=0)
    lo = lo + (below - 1) * step
    lo_last = lo_last + (below_last - 1) * step_last
    return lo, tl.minimum(lo + step, hi), lo_last, tl.minimum(lo_last + step_last, hi_last)


"""
GUESS = """\
    guess_end = _local(tl.load(cu_seqlens_ptr + guess + 1, mask=inside, other=0), cp_size, USE_CP)
"""
# The package's rounds: the first token's, then the last token's; and the candidates' one call.
TWO_NARROWS = """\
            lo, hi = _narrow(cu_seqlens_ptr, first, lo, hi, cp_size, FANOUT, USE_CP)
            lo_last, hi_last = _narrow(cu_seqlens_ptr, last, lo_last, hi_last, cp_size, FANOUT,
                                       USE_CP)
"""
NARROW_BOTH_CALL = """\
            lo, hi, lo_last, hi_last = _narrow_both(cu_seqlens_ptr, first, last, lo, hi, lo_last,
                                                    hi_last, cp_size, FANOUT, USE_CP)
"""
ROUNDS = """\
        last = tl.minimum(first + BLOCK, n_tokens) - 1
        lo = first * 0
        hi = lo + n_seqs
        lo_last = lo
        hi_last = hi
        for _ in range(narrow_rounds):
""" + TWO_NARROWS
LATER_ROUNDS = "        for _ in range(1, narrow_rounds):\n" + NARROW_BOTH_CALL
# "rounds together": every round, the first round included, through _narrow_both, the first
# round before the guess is checked (its reductions too).
TOGETHER = [
    (PRE_PASS_DEF, NARROW_BOTH + PRE_PASS_DEF),
    (GUESS, GUESS + """\
    # The search's first round for the block's first and last token, loaded beside the guess's
    # boundaries and before the guess is checked, so that a missed guess costs no load of its own.
    last = tl.minimum(first + BLOCK, n_tokens) - 1
    lo, hi, lo_last, hi_last = _narrow_both(cu_seqlens_ptr, first, last, first * 0, n_seqs,
                                            first * 0, n_seqs, cp_size, FANOUT, USE_CP)
"""),
    (ROUNDS, LATER_ROUNDS)]
# "first loads early": the first round covers every sequence for both tokens alike, so it is one
# vector of boundaries: loaded beside the guess's, reduced only where the guess misses; the
# later rounds as in "rounds together".
EARLY = [
    (PRE_PASS_DEF, NARROW_BOTH + PRE_PASS_DEF),
    (GUESS, GUESS + """\
    # The search's first round spans every sequence, for the block's first and last token alike:
    # its boundaries are loaded here, beside the guess's, and reduced only where the guess misses.
    first_step = (n_seqs + FANOUT - 1) // FANOUT
    first_idx = tl.arange(0, FANOUT) * first_step
    first_in = first_idx < n_seqs
    first_bound = _local(tl.load(cu_seqlens_ptr + first_idx, mask=first_in, other=0), cp_size,
                         USE_CP)
"""),
    (ROUNDS, """\
        last = tl.minimum(first + BLOCK, n_tokens) - 1
        lo = (tl.sum((first_in & (first_bound <= first)).to(tl.int32), axis=0) - 1) * first_step
        lo_last = (tl.sum((first_in & (first_bound <= last)).to(tl.int32), axis=0) - 1) * first_step
        hi = tl.minimum(lo + first_step, n_seqs)
        hi_last = tl.minimum(lo_last + first_step, n_seqs)
""" + LATER_ROUNDS)]

# "together after the check": the package's code where the guess holds; where it misses, every
# round as in "rounds together" (the first round's two loads are the same addresses).
AFTER_CHECK = [(PRE_PASS_DEF, NARROW_BOTH + PRE_PASS_DEF), (TWO_NARROWS, NARROW_BOTH_CALL)]
CANDIDATES = {"rounds together": TOGETHER, "first loads early": EARLY,
              "together after the check": AFTER_CHECK}


def load_sides(folder: pathlib.Path, names=tuple(CANDIDATES)) -> dict:
    """The package's module and the candidates ``names`` made from its file."""
    return {"package": r2, **{name: rope_2d_variant("rope_2d_" + name.replace(" ", "_"),
                                                    CANDIDATES[name], folder)
                              for name in names}}


def main():
    args = arguments(__doc__, "figures/thd_pre_pass_rounds_h200.json", list(CANDIDATES))
    sides = load_sides(pathlib.Path(tempfile.mkdtemp()), args.sides)
    copy = copy_bandwidth_gbps()
    packs = eight_head_packs()
    packs["h32 random 4096"] = Problem("thd", seq_len=4096, batch=16, heads=32, n_seqs=4096)
    calls, nbytes, diffs = whole_calls(sides, packs)
    package_rows = pre_pass_calls(sides, packs, calls, diffs)
    for pname, p in packs.items():
        x = p.t
        for direction in ("fwd", "bwd"):
            out = torch.full_like(x, float("nan"))
            plan = r2._make_plan(x, p.freqs, out, "thd", p.cu_seqlens, None, False, 1, 0,
                                 direction == "bwd", dict(pdl=False), False)
            if plan.constexprs.get("TOKEN_ROWS"):
                def main_only(x=x, p=p, out=out, rows=package_rows[pname], plan=plan):
                    r2.launch(r2.rope_2d_kernel, plan, (x, p.freqs, out, rows, x))
                main_only()
                torch.cuda.synchronize()
                expected = torch.full_like(x, float("nan"))
                r2.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens, out=expected,
                           backward=direction == "bwd")
                if not torch.equal(out, expected):
                    diffs.append(f"{pname} {direction} main only")
                    print("DIFF", diffs[-1], flush=True)
                calls[(pname, f"{direction} main only")] = main_only
    table = timed_rounds(
        calls, nbytes, copy, args, "thd_pre_pass_rounds.py --sides " + " ".join(
            f"'{name}'" for name in args.sides),
        dict(differing_outputs=diffs,
             timing="whole calls and main only: [time_ms_host_ahead, do_bench] medians as "
                    "fractions of copy_gbps; pre: time_ms_host_ahead medians in microseconds"),
        microseconds=lambda what: what.startswith("pre"))
    names = list(sides)
    print(f"copy {copy:.0f} GB/s; fraction of copy (host ahead): {' / '.join(names)} "
          "[main only]; pre-pass alone in us")
    for pname, t in table.items():
        line = "  ".join(
            f"{d} " + " / ".join(f"{t[f'{d} {n}'][0]:.3f}" for n in names)
            + (f" [{t[d + ' main only'][0]:.3f}]" if d + " main only" in t else "")
            for d in ("fwd", "bwd"))
        pre = " / ".join(f"{t[f'pre {n}'][0]:.2f}" for n in names)
        print(f"{pname:22s} {line}  pre {pre} us  copy same {t['copy same'][0]:.3f}")


if __name__ == "__main__":
    main()
