"""The thd pre-pass written by sequence blocks instead of searched by token blocks (a candidate,
not in the package) against the package's, on a GPU: the pre-pass alone, the whole call, and the
main kernel alone as the ceiling.

    python scripts/thd_pre_pass_scatter.py [--out FILE.json] [--rounds N] [--sides NAME ...]

Why: at random cuts the package's pre-pass (``rope_2d.thd_positions_kernel``) takes 5.5-7.9 us
alone on an H200, 5.0 us where its guess holds (packs of equal lengths), and the whole call of an
8-head pack runs 1-2 points behind its main kernel alone (docs/performance_notes.md, session 54).
Its programs each cover 256 consecutive tokens and find their sequences by a guess, then a
search: 3-5 loads in a chain at random cuts, one where the guess holds. Loads sent together
saved up to 1.1 us of it, which did not show in the whole calls.

The candidate turns the question around. Each program takes ``SEQS`` consecutive sequences,
whose tokens are one run ``cu[s0] .. cu[s0 + SEQS]``, loads their ``SEQS`` boundaries in one
vector (one load, no chain), and walks the run ``TOKENS`` tokens at a time: a token's sequence is
the last boundary at or below it (a ``[TOKENS, SEQS]`` count, as ``_count_sequence`` does for the
main kernel's few-sequence packs; an empty sequence repeats a boundary and the count steps over
it), its row the distance from that boundary. No guess, no search, the same work at every cut.
The grid follows the sequences (``cdiv(n_seqs, SEQS)``) and the walk their tokens: ``SEQS`` is
about ``sqrt(ELEMENTS / mean length)``, so a program's run is about one tile at the pack's mean
length, and a long sequence costs its program more steps of stores, not more programs.

Two sizes (``--sides`` picks): tiles of 4096 and 1024 count elements (``ELEMENTS``): fewer, larger
programs or more, smaller ones. The rows are the same numbers (the same boundaries, the same
subtraction, start positions and context-parallel mapping as ``_positions``), so every output and
every token row must be the same bits (``tests/test_thd_candidates.py`` checks that on the CPU).
Each candidate is ``rope_kernels/rope_2d.py`` with ``thd_positions_kernel`` and
``pre_pass_plan`` replaced (``thd_sides.rope_2d_variant``), loaded as its own module.

Packs as in ``thd_pre_pass_rounds.py``: the 8-head ones and 32 heads; forward and backward.
Entries as there: the whole call as (time_ms_host_ahead, do_bench) medians as fractions of the
device copy; ``pre``: the pre-pass alone in microseconds; ``main only``: the package's main kernel
alone, its token rows written beforehand, without PDL; ``copy same``: a copy of the pack's bytes.
"""

from __future__ import annotations

import importlib
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rope_kernels.bench import Problem, copy_bandwidth_gbps  # noqa: E402
from thd_sides import (arguments, eight_head_packs, pre_pass_calls,  # noqa: E402
                       rope_2d_variant, timed_rounds, whole_calls)

r2 = importlib.import_module("rope_kernels.rope_2d")  # the module; the package exports the function

PRE_PASS_DEF = ('@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "narrow_rounds", '
                '"cp_size", "cp_rank"])\ndef thd_positions_kernel(')
PRE_PASS_END = "    tl.store(token_rows_ptr + token, pos, mask=inside)\n"
PLAN_DEF = "def pre_pass_plan("
PLAN_END = "BLOCK=PRE_PASS_BLOCK, FANOUT=PRE_PASS_FANOUT), 4)\n"

SCATTER_KERNEL = '''\
@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "cp_size", "cp_rank"])
def thd_positions_kernel(cu_seqlens_ptr, start_positions_ptr, token_rows_ptr, n_tokens, n_seqs,
                         cp_size, cp_rank, HAS_START: tl.constexpr, USE_CP: tl.constexpr,
                         PDL_TRIGGER: tl.constexpr, SEQS: tl.constexpr, TOKENS: tl.constexpr):
    """Pre-pass for packs of many sequences: writes the angle-table row of every token of
    sequences ``s0 .. s0 + SEQS - 1``. Their tokens are one run ``cu[s0] .. cu[s0 + SEQS]``:
    one load of the ``SEQS`` boundaries, then ``TOKENS`` tokens a step, each token's sequence the
    last boundary at or below it. (``n_tokens`` is unused: the runs of all programs are the
    tokens.)"""
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    s0 = tl.program_id(0) * SEQS
    k = tl.arange(0, SEQS)
    # Boundaries past the last sequence read as the largest int32: never at or below a token.
    begin = _local(tl.load(cu_seqlens_ptr + s0 + k, mask=s0 + k <= n_seqs, other=2147483647),
                   cp_size, USE_CP)
    run_begin = _local(tl.load(cu_seqlens_ptr + s0), cp_size, USE_CP)
    run_end = _local(tl.load(cu_seqlens_ptr + tl.minimum(s0 + SEQS, n_seqs)), cp_size, USE_CP)
    first = run_begin
    while first < run_end:
        token = first + tl.arange(0, TOKENS)
        below = begin[None, :] <= token[:, None]  # [TOKENS, SEQS]
        seq_begin = tl.max(tl.where(below, begin[None, :], 0), axis=1)
        local = token - seq_begin
        if USE_CP:
            # The sequence ends at the next boundary above the token, or where the run ends.
            seq_end = tl.min(tl.where(below, run_end, begin[None, :]), axis=1)
            cur_len = tl.minimum(seq_end, run_end) - seq_begin
            half = cur_len // 2
            pos = tl.where(local < half, local + cp_rank * half,
                           cur_len * cp_size - (cp_rank + 1) * half + (local - half))
        else:
            pos = local
        inside = token < run_end
        if HAS_START:
            seq = s0 + tl.sum(below.to(tl.int32), axis=1) - 1
            pos += tl.load(start_positions_ptr + seq, mask=inside, other=0)
        tl.store(token_rows_ptr + token, pos, mask=inside)
        first += TOKENS
'''

SCATTER_PLAN = '''\
def pre_pass_plan(n_tokens: int, n_seqs: int, cp_size: int = 1, cp_rank: int = 0,
                  has_start: bool = False, pdl: bool = False) -> Plan:
    """Launch plan of ``thd_positions_kernel``: SEQS sequences a program, about
    sqrt(ELEMENTS / mean length), so that a program's run is about one step of TOKENS =
    ELEMENTS / SEQS tokens at the mean length; 4 warps."""
    mean = max(n_tokens, 1) / max(n_seqs, 1)
    seqs = min(64, max(1, _floor_pow2(int((__ELEMENTS__ / mean) ** 0.5))))
    tokens = min(2048, __ELEMENTS__ // seqs)
    return Plan((triton.cdiv(n_seqs, seqs), 1, 1), (n_tokens, n_seqs, cp_size, cp_rank),
                dict(HAS_START=has_start, USE_CP=cp_size > 1, PDL_TRIGGER=pdl, SEQS=seqs,
                     TOKENS=tokens), 4)
'''


SEARCH_KERNEL = '''\
@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "cp_size", "cp_rank"])
def thd_positions_kernel(cu_seqlens_ptr, start_positions_ptr, token_rows_ptr, n_tokens, n_seqs,
                         cp_size, cp_rank, HAS_START: tl.constexpr, USE_CP: tl.constexpr,
                         PDL_TRIGGER: tl.constexpr, SEQS: tl.constexpr, STEPS: tl.constexpr,
                         TOKENS: tl.constexpr):
    """Pre-pass for packs of many sequences: writes the angle-table row of every token of
    sequences ``s0 .. s0 + SEQS - 1``, one run ``cu[s0] .. cu[s0 + SEQS]``. One vector load of
    the ``SEQS`` boundaries (its minimum is where the run begins, so the load is used and its
    lines stay in L1), then ``TOKENS`` tokens a step, each found by a binary search of
    ``STEPS = log2(SEQS)`` steps over the run's sequences (``_positions``), from L1."""
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    s0 = tl.program_id(0) * SEQS
    k = tl.arange(0, SEQS)
    window = tl.load(cu_seqlens_ptr + s0 + k, mask=s0 + k <= n_seqs, other=2147483647)
    run_begin = _local(tl.min(window, axis=0), cp_size, USE_CP)
    seq_hi = tl.minimum(s0 + SEQS, n_seqs)
    run_end = _local(tl.load(cu_seqlens_ptr + seq_hi), cp_size, USE_CP)
    first = run_begin
    while first < run_end:
        token = first + tl.arange(0, TOKENS)
        pos = _positions(token, 0, cu_seqlens_ptr, start_positions_ptr, s0, seq_hi, STEPS,
                         cp_size, cp_rank, True, HAS_START, USE_CP)
        tl.store(token_rows_ptr + token, pos, mask=token < run_end)
        first += TOKENS
'''

SEARCH_PLAN = '''\
def pre_pass_plan(n_tokens: int, n_seqs: int, cp_size: int = 1, cp_rank: int = 0,
                  has_start: bool = False, pdl: bool = False) -> Plan:
    """Launch plan of ``thd_positions_kernel``: about PROGRAMS programs of SEQS sequences
    each (a power of two), TOKENS tokens a step; 4 warps."""
    seqs = _next_pow2(triton.cdiv(n_seqs, __PROGRAMS__))
    return Plan((triton.cdiv(n_seqs, seqs), 1, 1), (n_tokens, n_seqs, cp_size, cp_rank),
                dict(HAS_START=has_start, USE_CP=cp_size > 1, PDL_TRIGGER=pdl, SEQS=seqs,
                     STEPS=seqs.bit_length() - 1, TOKENS=__TOKENS__), 4)
'''


def between(source: str, begin: str, end: str) -> str:
    """The text of ``source`` from ``begin`` through ``end`` (the first ``end`` after it)."""
    if source.count(begin) != 1:
        sys.exit(f"rope_2d.py no longer has this text once: update the script\n{begin}")
    i = source.index(begin)
    j = source.index(end, i) + len(end)
    return source[i:j]


def replacements(kind: str, size: int) -> list:
    """``kind`` "count": tiles of ``size`` count elements; "search": about ``size`` programs."""
    source = (ROOT / "rope_kernels" / "rope_2d.py").read_text()
    if kind == "count":
        kernel, plan = SCATTER_KERNEL, SCATTER_PLAN.replace("__ELEMENTS__", str(size))
    else:
        kernel = SEARCH_KERNEL
        plan = SEARCH_PLAN.replace("__PROGRAMS__", str(size)).replace("__TOKENS__", "256")
    return [(between(source, PRE_PASS_DEF, PRE_PASS_END), kernel),
            (between(source, PLAN_DEF, PLAN_END), plan)]


CANDIDATES = {"count 4096": ("count", 4096), "count 1024": ("count", 1024),
              "search 256": ("search", 256), "search 1024": ("search", 1024),
              "search 2048": ("search", 2048)}


def load_sides(folder: pathlib.Path, names=tuple(CANDIDATES)) -> dict:
    """The package's module and the candidates ``names`` made from its file."""
    return {"package": r2, **{name: rope_2d_variant("rope_2d_" + name.replace(" ", "_"),
                                                    replacements(*CANDIDATES[name]), folder)
                              for name in names}}


def main():
    import torch

    args = arguments(__doc__, "figures/thd_pre_pass_scatter_h200.json", list(CANDIDATES))
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
                calls[(pname, f"{direction} main only")] = main_only
    table = timed_rounds(
        calls, nbytes, copy, args, "thd_pre_pass_scatter.py --sides " + " ".join(
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
