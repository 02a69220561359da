"""thd with the pre-pass: the first programs of the main kernel find their tokens' rows themselves
(a candidate, not in the package) instead of waiting for the pre-pass, on a GPU.

    python scripts/thd_first_wave.py [--out FILE.json] [--rounds N]

Why: in packs of 131072 tokens of 8 heads cut at random into 256-65536 sequences, the main
kernel alone (its token rows written beforehand) ran at 0.953-0.954 of the 2 GiB copy on an
H200, the whole call at 0.933-0.944 (docs/performance_notes.md, 2026-11-27). The difference is
the pre-pass's 6-8 us, which programmatic dependent launch (PDL) hides only in part: every
program of the main kernel waits for the whole pre-pass before it loads its rows, so the first
wave of programs (about 16 per SM) issues its x loads and then stalls.

The candidate: programs ``pid < search_below`` search ``cu_seqlens`` for their tokens' rows
themselves (the binary search the package's tiles use without the pre-pass) and never wait;
the rest wait for the pre-pass and load its rows as the package does. ``search_below`` is
``per_sm`` programs for each SM: 0 (the candidate's code, waiting like the package), 8, 16, 32
and 64. It is ``rope_kernels/rope_2d.py`` with pieces replaced by text (the script stops if one
is not found): the kernel's new parameters (``bounds_ptr``, ``search_below``,
``FIRST_WAVE_SEARCH``), its two waits, and the main launch, which passes ``cu_seqlens`` as
``bounds_ptr``; its plans carry ``search_below`` and ``FIRST_WAVE_SEARCH``. Each side is loaded as
its own module, launched like the package's (``thd_sides.rope_2d_variant``).

Packs as in ``thd_angle_rows.py``' 8-head ones, and 32 heads; forward and backward; every
output compared bit for bit with the package's (DIFF lines: the rows are the same numbers, so
none is expected). Entries: (time_ms_host_ahead, do_bench) medians as fractions of the device
copy; ``copy same``: a copy of the pack's bytes. Results are written after every round from the
second on.

Status: run on an H200 (``figures/thd_first_wave_h200.json``, 3 rounds; the outputs of every
setting equal the package's): no setting is ahead at every 8-head pack, so not taken
(docs/performance_notes.md, 2026-11-27, session 54). Checked on the CPU by
``tests/test_thd_candidates.py``.
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
from thd_sides import (arguments, eight_head_packs, new_constexpr,  # noqa: E402
                       print_sides, rope_2d_variant, timed_rounds, whole_calls)

r2 = importlib.import_module("rope_kernels.rope_2d")  # the module; the package exports the function

PER_SM = (0, 8, 16, 32, 64)

# The kernel's new parameters: cu_seqlens itself as a sixth pointer (with the pre-pass,
# cu_seqlens_ptr holds the token rows), the number of programs that search as the last scalar,
# and the switch.
POINTER = "    start_positions_ptr,\n    seq_len,"
FIRST_WAVE_POINTER = POINTER.replace(
    "\n    seq_len,", "\n    bounds_ptr,  # FIRST_WAVE_SEARCH: cu_seqlens\n    seq_len,")
SCALAR = "    group_b,  # batch blocks per group (see the program order below)\n"
FIRST_WAVE_SCALAR = SCALAR + (
    "    search_below,  # FIRST_WAVE_SEARCH: programs below this search, the rest wait\n")
EARLY_WAIT = """\
    if TOKEN_ROWS and PDL_WAIT and WAIT_FIRST:
"""
FIRST_WAVE_EARLY_WAIT = """\
    if TOKEN_ROWS and PDL_WAIT and WAIT_FIRST and (not FIRST_WAVE_SEARCH or pid >= search_below):
"""
ROWS_LOAD = """\
    if TOKEN_ROWS:
        if PDL_WAIT and not WAIT_FIRST:
            # x was written before the pre-pass was launched, so its loads above could go first;
            # the token rows are the pre-pass's output: wait until they are all written.
            tl.extra.cuda.gdc_wait()
        pos = tl.load(cu_seqlens_ptr + s_idx, mask=s_mask, other=0)
"""
FIRST_WAVE_ROWS_LOAD = """\
    if TOKEN_ROWS and FIRST_WAVE_SEARCH and pid < search_below:
        pos = _positions(s_idx, seq_len, bounds_ptr, start_positions_ptr, 0, n_seqs,
                         search_steps, cp_size, cp_rank, IS_THD, HAS_START, USE_CP)
    elif TOKEN_ROWS:
        if PDL_WAIT and not WAIT_FIRST:
            tl.extra.cuda.gdc_wait()
        pos = tl.load(cu_seqlens_ptr + s_idx, mask=s_mask, other=0)
"""
MAIN_LAUNCH = """\
    launch(rope_2d_kernel, plan, (t, freqs, out, seq_info,
                                  start_positions if start_positions is not None else t))
"""
FIRST_WAVE_MAIN_LAUNCH = """\
    launch(rope_2d_kernel, plan, (t, freqs, out, seq_info,
                                  start_positions if start_positions is not None else t,
                                  cu_seqlens if is_thd else t))
"""


def first_wave_module(per_sm: int, folder: pathlib.Path):
    """rope_2d.py with the candidate, ``per_sm`` programs per SM searching (0: none)."""
    def search_below(plan, t):
        first_wave = per_sm > 0 and plan.constexprs["TOKEN_ROWS"]
        n_sm = torch.cuda.get_device_properties(t.device).multi_processor_count if t.is_cuda else 1
        plan.scalars = (*plan.scalars, per_sm * n_sm if first_wave else 0)
        plan.constexprs["FIRST_WAVE_SEARCH"] = first_wave

    return rope_2d_variant(
        f"rope_2d_first_wave_{per_sm}",
        [(POINTER, FIRST_WAVE_POINTER), (SCALAR, FIRST_WAVE_SCALAR),
         new_constexpr("FIRST_WAVE_SEARCH: tl.constexpr = False"),
         (EARLY_WAIT, FIRST_WAVE_EARLY_WAIT),
         (ROWS_LOAD, FIRST_WAVE_ROWS_LOAD), (MAIN_LAUNCH, FIRST_WAVE_MAIN_LAUNCH)],
        folder, search_below)


def main():
    args = arguments(__doc__, "figures/thd_first_wave_h200.json")
    folder = pathlib.Path(tempfile.mkdtemp())
    versions = {"package": r2,
                **{f"search {k}/SM": first_wave_module(k, folder) for k in PER_SM}}
    copy = copy_bandwidth_gbps()
    packs = eight_head_packs()
    packs["h32 random 4096"] = Problem("thd", seq_len=4096, batch=16, heads=32, n_seqs=4096)
    calls, nbytes, diffs = whole_calls(versions, packs)
    table = timed_rounds(calls, nbytes, copy, args, "thd_first_wave.py",
                         dict(differing_outputs=diffs))
    print_sides(table, versions, f"copy {copy:.0f} GB/s; fraction of copy (host ahead): the "
                                 f"package, then {', '.join(map(str, PER_SM))} programs per SM "
                                 "searching")


if __name__ == "__main__":
    main()
