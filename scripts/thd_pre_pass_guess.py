"""The thd pre-pass's guess as an integer division (the package) against the same guess in float64
(a candidate, not in the package), on a GPU: the pre-pass alone and the whole call.

    python scripts/thd_pre_pass_guess.py [--out FILE.json] [--rounds N]

The pre-pass (``rope_2d.thd_positions_kernel``) first guesses each token's sequence as if every
sequence had the same length: ``token * n_seqs // n_tokens``. The product can pass 2**31, so it is
an int64 division, which sm_90 code makes a call to a slow division routine per token. The
candidate computes ``floor((token + 1/2) * (n_seqs / n_tokens))`` in float64: one division per
program, a multiply per token, exact for equal lengths (the half token keeps the quotient
1/(2L) clear of an integer) and checked like the integer guess elsewhere.

Both sides are ``rope_kernels/rope_2d.py``, the candidate made from it by replacing the guess line
(the script stops if that line is not found), loaded twice in one process as modules launched like
the package's (``thd_sides.rope_2d_variant``; the recorded figure, at 1a565b8, launched them
through Triton's own dispatch). Packs of 131072 tokens (8 heads, head_dim 128: 2 KB token rows in
bf16) cut at random into 256-65536 sequences, or into equal lengths, one of 32 heads and one in
fp32, forward and backward: every output compared bit for bit between the two (DIFF lines), and
the pre-pass's rows too. Entries: the whole call as (time_ms_host_ahead, do_bench) fractions of the
device copy; ``pre``: the pre-pass alone in microseconds (time_ms_host_ahead); ``copy same``: a copy
of the pack's bytes. Medians over shuffled rounds; results are written after every round from the
second on.
"""

from __future__ import annotations

import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rope_kernels.bench import Problem, copy_bandwidth_gbps  # noqa: E402
from thd_sides import (arguments, eight_head_packs, pre_pass_calls,  # noqa: E402
                       rope_2d_variant, timed_rounds, whole_calls)

INT_GUESS = ("    guess = tl.minimum((token.to(tl.int64) * n_seqs // n_tokens).to(tl.int32), "
             "n_seqs - 1)\n")
FLOAT_GUESS = ("    seqs_per_token = n_seqs.to(tl.float64) / n_tokens.to(tl.float64)\n"
               "    guess = tl.minimum(((token.to(tl.float64) + 0.5) * seqs_per_token)"
               ".to(tl.int32), n_seqs - 1)\n")


def load_variants(folder: pathlib.Path) -> dict:
    """The package's rope_2d.py and the candidate made from it, as modules launched like the
    package's."""
    return {"int": rope_2d_variant("rope_2d_int_guess", [], folder),
            "float64": rope_2d_variant("rope_2d_float64_guess", [(INT_GUESS, FLOAT_GUESS)],
                                       folder)}


def main():
    args = arguments(__doc__, "figures/thd_pre_pass_guess_h200.json")
    folder = pathlib.Path(tempfile.mkdtemp())
    versions = load_variants(folder)
    copy = copy_bandwidth_gbps()
    packs = eight_head_packs()
    packs["h32 random 4096"] = Problem("thd", seq_len=4096, batch=16, heads=32, n_seqs=4096)
    packs["h8 fp32 random 16384"] = Problem("thd", dtype="fp32", seq_len=8192, batch=16, heads=8,
                                            n_seqs=16384)
    calls, nbytes, diffs = whole_calls(versions, packs)
    pre_pass_calls(versions, packs, calls, diffs)
    table = timed_rounds(
        calls, nbytes, copy, args, "thd_pre_pass_guess.py",
        dict(timing="whole calls: [time_ms_host_ahead, do_bench] medians as fractions of "
                    "copy_gbps; pre: time_ms_host_ahead medians in microseconds"),
        microseconds=lambda what: what.startswith("pre"))
    print(f"copy {copy:.0f} GB/s; whole call: fraction of copy (host ahead / do_bench); "
          "pre-pass alone: us")
    for pname, t in table.items():
        ratio = "  ".join(f"{d} float64/int {t[d + ' float64'][0] / t[d + ' int'][0]:.4f}"
                          for d in ("fwd", "bwd"))
        print(f"{pname:22s} fwd {t['fwd int'][0]:.3f} -> {t['fwd float64'][0]:.3f}  "
              f"bwd {t['bwd int'][0]:.3f} -> {t['bwd float64'][0]:.3f}  {ratio}  "
              f"pre {t['pre int'][0]:.2f} -> {t['pre float64'][0]:.2f} us  "
              f"copy same {t['copy same'][0]:.3f}")


if __name__ == "__main__":
    main()
