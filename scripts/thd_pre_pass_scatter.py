"""The thd pre-pass by blocks of sequences (the package's since 2026-11-27) against the guess and
search by blocks of tokens it replaced and against other forms of it, on a GPU: the pre-pass
alone, the whole call, and the main kernel alone as the ceiling.

    python scripts/thd_pre_pass_scatter.py [--out FILE.json] [--rounds N] [--sides NAME ...]

Why: at random cuts the pre-pass of before (kept here as the side "guess and search") took
5.5-7.9 us alone on an H200, 5.0 us where its guess held (packs of equal lengths), and the
whole call of an 8-head pack ran 1-2 points behind its main kernel alone (docs/performance_notes.md,
session 54). Its programs each covered 256 consecutive tokens and found their sequences by a
guess, then a search: 3-5 loads from L2 or memory in a chain at random cuts, one where the guess
held. Loads sent together saved up to 1.1 us of it, which did not show in the whole calls.

The package's pre-pass (``rope_2d.thd_positions_kernel``) turns the question around: each
program takes a block of ``SEQS`` consecutive sequences, whose tokens are one run ``cu[s0] ..
cu[s0 + SEQS]``, loads their boundaries as one vector (the one load from L2 or memory; it leaves
their lines in L1), and walks the run ``TOKENS`` tokens a step, each token found by a binary
search over the block from L1. ``SEQS`` makes about PRE_PASS_PROGRAMS (1024) programs. The sides:
- "guess and search": the pre-pass before 2026-11-27 (rope_2d.py of a425299, its text below).
- "search 256", "search 2048": the package's with about 256 or 2048 programs.
- "count 4096", "count 1024": blocks of ``sqrt(ELEMENTS / mean length)`` sequences (so a
  program's run is about one step at the pack's mean length), each token's sequence counted
  over the block's boundaries as a ``[TOKENS, SEQS]`` tile (as ``_count_sequence`` does), tiles
  of 4096 or 1024 elements.

Every side computes the same rows (the same boundaries, the same subtraction, start positions
and context-parallel mapping as ``_positions``), so every output and every token row must be the
same bits (``tests/test_thd_candidates.py`` checks that on the CPU). Each side is
``rope_kernels/rope_2d.py`` with ``thd_positions_kernel`` and ``pre_pass_plan`` (or
PRE_PASS_PROGRAMS) replaced by text (``thd_sides.rope_2d_variant``), loaded as its own module.

Packs: the 8-head ones of ``thd_sides.eight_head_packs`` and 32 heads; forward and backward.
Entries: the whole call as (time_ms_host_ahead, do_bench) medians as fractions of the device
copy; ``pre``: the pre-pass alone in microseconds (time_ms_host_ahead); ``main only``: the
package's main kernel alone, its token rows written beforehand, without PDL (the ceiling of any
pre-pass); ``copy same``: a copy of the pack's bytes. Results are written after every round from
the second on.

Runs on an H200 (Triton 3.6.0). Before the package took the search by sequence blocks, with the
package of then as the first side: ``figures/thd_pre_pass_count_h200.json`` (the two counts, 4
rounds), ``figures/thd_pre_pass_search_h200.json`` (count 1024, search 256 and 1024, 4 rounds)
and ``figures/thd_pre_pass_search_confirm_h200.json`` (search 1024 and 2048, 5 rounds). The
search of about 1024 programs took 4.5-5.6 us alone at every pack, and was taken. After, with
``--sides 'guess and search'``: ``figures/thd_pre_pass_package_h200.json`` (3 rounds; the package
4.4-5.4 us alone). See docs/performance_notes.md, 2026-11-27, session 55.
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

# The package's pre-pass and its plan (from the def through these ends): what the sides replace.
PRE_PASS_DEF = ('@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "cp_size", "cp_rank"])\n'
                'def thd_positions_kernel(')
PRE_PASS_END = "        first += TOKENS\n"
PLAN_DEF = "def pre_pass_plan("
PLAN_END = "TOKENS=PRE_PASS_TOKENS), 4)\n"
PROGRAMS = "PRE_PASS_PROGRAMS = 1024\n"

# The pre-pass before 2026-11-27 (rope_2d.py of a425299), as it was: its search helper, kernel,
# constants, rounds and plan.
BEFORE_KERNEL = '''\
@triton.jit
def _narrow(cu_seqlens_ptr, token, lo, hi, cp_size, FANOUT: tl.constexpr, USE_CP: tl.constexpr):
    """One round of a FANOUT-ary search for the sequence of one ``token``: from cu[lo] <= token <
    cu[hi] to a range FANOUT times smaller, with one vector load of FANOUT boundaries spread
    over [lo, hi) (a binary search would take log2(FANOUT) dependent loads for the same)."""
    step = (hi - lo + FANOUT - 1) // FANOUT
    idx = lo + tl.arange(0, FANOUT) * step
    inside = idx < hi
    bound = _local(tl.load(cu_seqlens_ptr + idx, mask=inside, other=0), cp_size, USE_CP)
    below = tl.sum((inside & (bound <= token)).to(tl.int32), axis=0)  # >= 1: idx[0] = lo
    new_lo = lo + (below - 1) * step
    return new_lo, tl.minimum(new_lo + step, hi)


@triton.jit(do_not_specialize=["n_tokens", "n_seqs", "narrow_rounds", "cp_size", "cp_rank"])
def thd_positions_kernel(cu_seqlens_ptr, start_positions_ptr, token_rows_ptr, n_tokens, n_seqs,
                         narrow_rounds, cp_size, cp_rank, HAS_START: tl.constexpr,
                         USE_CP: tl.constexpr, PDL_TRIGGER: tl.constexpr, BLOCK: tl.constexpr,
                         FANOUT: tl.constexpr):
    """Pre-pass for packs of many sequences: writes the angle-table row of each of ``BLOCK``
    consecutive tokens (``_positions``: the search over ``cu_seqlens``, the context-parallel
    mapping and the start position). The main kernel then reads one int per token instead of
    searching in every tile. One program per token block, so the grid follows the tokens, never
    the sequences or the longest sequence.

    First a guess: token ``i`` of ``n_tokens`` would be in sequence ``i * n_seqs // n_tokens`` if
    every sequence had the same length, and one load of that sequence's two boundaries checks it.
    Where every token of the block is where the guess says (always, in a pack of equal lengths),
    that is the answer. Otherwise the block searches. Its tokens are consecutive, so the sequences
    holding them are a run ``lo .. hi - 1``: from the sequences of its first and last token, each
    found in ``narrow_rounds`` rounds of a FANOUT-ary search (one wide load a round; 2 rounds for
    65536 sequences). Each token's binary search then covers only that run, whose boundaries the
    first steps bring into L1: a chain of 16 dependent loads from L2 at 65536 sequences becomes 2
    from L2 and ~8 from L1.

    ``PDL_TRIGGER``: with programmatic dependent launch (Hopper and later) the main kernel may
    start as soon as every program here has begun, and waits for this kernel's writes only where
    it reads them (``PDL_WAIT``): its x loads overlap this kernel instead of queueing behind it.
    """
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    first = tl.program_id(0) * BLOCK
    token = first + tl.arange(0, BLOCK)
    inside = token < n_tokens
    # The guess (int64: token * n_seqs can pass 2**31) and its check, one load pair per token.
    guess = tl.minimum((token.to(tl.int64) * n_seqs // n_tokens).to(tl.int32), n_seqs - 1)
    guess_begin = _local(tl.load(cu_seqlens_ptr + guess, mask=inside, other=0), cp_size, USE_CP)
    guess_end = _local(tl.load(cu_seqlens_ptr + guess + 1, mask=inside, other=0), cp_size, USE_CP)
    hit = ((guess_begin <= token) & (token < guess_end)) | (token >= n_tokens)
    if tl.min(hit.to(tl.int32), axis=0) == 1:
        # Each token's sequence is known: a search of zero steps over [guess, guess + 1).
        pos = _positions(token, 0, cu_seqlens_ptr, start_positions_ptr, guess, guess + 1, 0,
                         cp_size, cp_rank, True, HAS_START, USE_CP)
    else:
        last = tl.minimum(first + BLOCK, n_tokens) - 1
        lo = first * 0
        hi = lo + n_seqs
        lo_last = lo
        hi_last = hi
        for _ in range(narrow_rounds):
            lo, hi = _narrow(cu_seqlens_ptr, first, lo, hi, cp_size, FANOUT, USE_CP)
            lo_last, hi_last = _narrow(cu_seqlens_ptr, last, lo_last, hi_last, cp_size, FANOUT,
                                       USE_CP)
        steps = lo * 0  # ceil(log2(hi_last - lo)): the binary search's iterations over the run
        span = hi_last - lo
        while span > 1:
            span = (span + 1) // 2
            steps += 1
        pos = _positions(token, 0, cu_seqlens_ptr, start_positions_ptr, lo, hi_last, steps,
                         cp_size, cp_rank, True, HAS_START, USE_CP)
    tl.store(token_rows_ptr + token, pos, mask=inside)
'''

BEFORE_PLAN = '''\
PRE_PASS_BLOCK = 256
PRE_PASS_FANOUT = 256


def _narrow_rounds(n_seqs: int, fanout: int) -> int:
    """Rounds of a fanout-ary search that pin a token to one of n_seqs sequences."""
    rounds, covered = 1, fanout
    while covered < n_seqs:
        rounds, covered = rounds + 1, covered * fanout
    return rounds


def pre_pass_plan(n_tokens: int, n_seqs: int, cp_size: int = 1, cp_rank: int = 0,
                  has_start: bool = False, pdl: bool = False) -> Plan:
    """Launch plan of ``thd_positions_kernel``: one program per PRE_PASS_BLOCK tokens, 4 warps;
    ``pdl``: it lets the main kernel, launched as its programmatic dependent, start at once.
    Pointers: (cu_seqlens, start_positions or a placeholder, token_rows [n_tokens] int32)."""
    return Plan((triton.cdiv(n_tokens, PRE_PASS_BLOCK), 1, 1),
                (n_tokens, n_seqs, _narrow_rounds(n_seqs, PRE_PASS_FANOUT), cp_size, cp_rank),
                dict(HAS_START=has_start, USE_CP=cp_size > 1, PDL_TRIGGER=pdl,
                     BLOCK=PRE_PASS_BLOCK, FANOUT=PRE_PASS_FANOUT), 4)
'''

# The "count" sides: each token's sequence counted over the block's boundaries.
COUNT_KERNEL = '''\
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

COUNT_PLAN = '''\
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


def between(source: str, begin: str, end: str) -> str:
    """The text of ``source`` from ``begin`` through ``end`` (the first ``end`` after it)."""
    if source.count(begin) != 1:
        sys.exit(f"rope_2d.py no longer has this text once: update the script\n{begin}")
    i = source.index(begin)
    j = source.index(end, i) + len(end)
    return source[i:j]


def replacements(kind: str, size: int = 0) -> list:
    """The (old, new) texts of side ``kind``: "before" (the guess and search), "count" (tiles of
    ``size`` count elements) or "search" (about ``size`` programs)."""
    source = (ROOT / "rope_kernels" / "rope_2d.py").read_text()
    if kind == "search":
        return [(PROGRAMS, f"PRE_PASS_PROGRAMS = {size}\n")]
    if kind == "before":
        kernel, plan = BEFORE_KERNEL, BEFORE_PLAN
    else:
        kernel, plan = COUNT_KERNEL, COUNT_PLAN.replace("__ELEMENTS__", str(size))
    return [(between(source, PRE_PASS_DEF, PRE_PASS_END), kernel),
            (between(source, PLAN_DEF, PLAN_END), plan)]


CANDIDATES = {"guess and search": ("before",), "search 256": ("search", 256),
              "search 2048": ("search", 2048), "count 4096": ("count", 4096),
              "count 1024": ("count", 1024)}


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
