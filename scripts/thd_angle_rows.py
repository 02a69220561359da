"""thd whole-row tiles: cos/sin computed once per token (the package) against computed for more of
the tile's rows (two candidates, not in the package), on a GPU.

    python scripts/thd_angle_rows.py [--out FILE.json] [--rounds N]

In a pack of 8 heads of 128 (2 KB token rows in bf16), the main kernel's tile is 2 tokens x 8
heads of whole rows on 2 warps. It computes the cos/sin of its 2 tokens once, as a [2, 128] tile,
and broadcasts them to the 16 rows (``_per_row``). Compiled for sm_90 that broadcast goes through
1 KB of shared memory and barriers, because Triton lays the float32 table load out 4 channels
per thread and the bf16 rows 8 per thread. The candidates remove it:

- ``4 rows``: cos/sin on a [4, 128] tile, one layout tile of the rows (row i holds token
  i % 2), broadcast to the 16 rows. Each thread computes 2x the sines and cosines; compiled for
  sm_90 (Triton 3.7.1) 2 KB of shared memory, still 3 barriers: the layouts still differ.
- ``every row``: cos/sin of every row's token, in the rows' own layout: no shared memory and no
  barriers (44 registers instead of 64), but 8x the sines, cosines and table loads.

Both are ``rope_kernels/rope_2d.py`` with its whole-row cos/sin line replaced by text (the script
stops if the line is not found) and the plan's ``ANGLE_ROWS`` set to 4 or to the tile's rows,
loaded as modules launched like the package's (``thd_sides.rope_2d_variant``). Packs of 131072
tokens cut at random into 256-65536 sequences or into equal lengths, 8, 16 and 32 heads, fp16,
head_dim 256; forward and backward; every output compared bit for bit with the package's (DIFF
lines: the cos/sin are the same numbers, so none is expected). Entries: (time_ms_host_ahead,
do_bench) medians as fractions of the device copy; ``copy same``: a copy of the pack's bytes.
Results are written after every round from the second on.
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
from thd_sides import (arguments, eight_head_packs, new_constexpr,  # noqa: E402
                       print_sides, rope_2d_variant, timed_rounds, whole_calls)

r2 = importlib.import_module("rope_kernels.rope_2d")  # the module; the package exports the function

# The package's whole-row cos/sin: one [BLOCK_S, ROW] tile, broadcast to the rows.
PER_TOKEN = """\
        cos, sin = _cos_sin_row(freqs_ptr, pos[:, None], c[None, :], partner[None, :], rotary_dim,
                                f_stride_s, f_stride_d, s_mask[:, None] & rotated[None, :],
                                BACKWARD, FAST_TRIG, GATHER_SINES, BLOCK_S, ROW)
        # fma as in the pairs' tile below: x * cos fused, the partner's term rounded first.
        y = tl.fma(xr.to(tl.float32), _per_row(cos, BLOCK_B * BLOCK_H),
                   xq.to(tl.float32) * _per_row(sin, BLOCK_B * BLOCK_H))
"""
# The candidates: an [ANGLE_ROWS, ROW] tile whose row i holds token i % BLOCK_S (its table row
# loaded again for each), broadcast to the ROWS rows; ANGLE_ROWS == ROWS: every row its own.
PER_ANGLE_ROW = """\
        if ANGLE_ROWS > 0:
            s_a = pid_s * BLOCK_S + tl.arange(0, ANGLE_ROWS) % BLOCK_S
            sa_mask = s_a < seq_len
            pos_a = tl.load(cu_seqlens_ptr + s_a, mask=sa_mask, other=0)  # TOKEN_ROWS only
            cos, sin = _cos_sin_row(freqs_ptr, pos_a[:, None], c[None, :], partner[None, :],
                                    rotary_dim, f_stride_s, f_stride_d,
                                    sa_mask[:, None] & rotated[None, :], BACKWARD, FAST_TRIG,
                                    GATHER_SINES, ANGLE_ROWS, ROW)
            y = tl.fma(xr.to(tl.float32), _per_row(cos, ROWS // ANGLE_ROWS),
                       xq.to(tl.float32) * _per_row(sin, ROWS // ANGLE_ROWS))
        else:
""" + "".join("    " + line for line in PER_TOKEN.splitlines(True))


def angle_rows_module(name: str, rows: int, folder: pathlib.Path):
    """rope_2d.py with the candidate's cos/sin, its plans' whole-row tiles of token rows given
    ``ANGLE_ROWS`` = ``rows`` (at least BLOCK_S, at most the tile's rows)."""
    def angle_rows(plan, t):
        c = plan.constexprs
        if c["ROW"] and c["TOKEN_ROWS"]:
            tile_rows = c["BLOCK_S"] * c["BLOCK_B"] * c["BLOCK_H"]
            c["ANGLE_ROWS"] = min(max(rows, c["BLOCK_S"]), tile_rows)

    return rope_2d_variant(name, [new_constexpr("ANGLE_ROWS: tl.constexpr = 0"),
                                  (PER_TOKEN, PER_ANGLE_ROW)], folder, angle_rows)


def main():
    args = arguments(__doc__, "figures/thd_angle_rows_h200.json")
    folder = pathlib.Path(tempfile.mkdtemp())
    versions = {"package": r2,
                "4 rows": angle_rows_module("rope_2d_angle_rows_4", 4, folder),
                "every row": angle_rows_module("rope_2d_angle_rows_all", 2**20, folder)}
    copy = copy_bandwidth_gbps()
    packs = eight_head_packs()
    packs["h8 fp16 random 16384"] = Problem("thd", dtype="fp16", seq_len=8192, batch=16, heads=8,
                                            n_seqs=16384)
    packs["h16 random 4096"] = Problem("thd", seq_len=8192, batch=16, heads=16, n_seqs=4096)
    packs["h32 random 4096"] = Problem("thd", seq_len=4096, batch=16, heads=32, n_seqs=4096)
    packs["h8 d256 random 4096"] = Problem("thd", seq_len=8192, batch=8, heads=8, head_dim=256,
                                           n_seqs=4096)
    calls, nbytes, diffs = whole_calls(versions, packs)
    table = timed_rounds(calls, nbytes, copy, args, "thd_angle_rows.py",
                         dict(differing_outputs=diffs))
    print_sides(table, versions, f"copy {copy:.0f} GB/s; fraction of copy (host ahead), "
                                 "package / 4 rows / every row")


if __name__ == "__main__":
    main()
