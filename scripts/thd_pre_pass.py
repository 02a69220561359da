"""The thd pre-pass on a GPU: its cost by number of sequences, next to the design it replaced,
and the whole call with the pre-pass and with the search in every tile.

    python scripts/thd_pre_pass.py [--out FILE.json]

Problems as in the benchmark's thd sweep: 4096 x 16 = 65536 tokens, 32 heads, head_dim 128, cut
at random into n_seqs sequences of mixed lengths; and 8192 x 16 = 131072 tokens of 8 heads (bf16,
the same bytes: 2 KB token rows). Times are do_bench medians.
- ``pre_us``: ``rope_2d.thd_positions_kernel`` alone, next to two designs before it, kept here
  only to compare: ``pre_us_binary_search``, a binary search per token over all sequences (256
  tokens a program, 2 warps), and ``pre_us_per_sequence``, one program per sequence writing its
  tokens' rows. ``figures/thd_pre_pass.json`` was recorded with the package's pre-pass of then
  (256 tokens a program, each token's sequence guessed as if all lengths were equal and
  checked, a 256-ary search where the guess missed); since 2026-11-27 the package's takes blocks
  of sequences and searches each block from L1 (``scripts/thd_pre_pass_scatter.py``).
- ``frac_search`` / ``frac_pre_pass``: the whole ``rope_2d`` call (bytes as in the benchmark) as
  a fraction of the device copy, with ``config=dict(token_rows=False / True)``. Without the
  pre-pass each tile counts the boundaries below its tokens where ``n_seqs + 1 <=
  COUNT_BOUNDS_MAX`` and searches otherwise; ``frac_binary_search`` is the same call with
  ``COUNT_BOUNDS_MAX`` set to 1, so that every tile runs the binary search.
- The calls take the package's default tile, which for 8 heads depends on the path (1 warp where
  tiles count, see ``default_config``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import Problem, copy_bandwidth_gbps, provenance  # noqa: E402

r2 = importlib.import_module("rope_kernels.rope_2d")


@triton.jit
def per_sequence_pre_pass(cu_seqlens_ptr, token_rows_ptr, BLOCK: tl.constexpr):
    """The earlier design (no cp, no start positions): program i writes sequence i's rows."""
    seq = tl.program_id(0)
    begin = tl.load(cu_seqlens_ptr + seq)
    end = tl.load(cu_seqlens_ptr + seq + 1)
    for off in range(begin, end, BLOCK):
        token = off + tl.arange(0, BLOCK)
        tl.store(token_rows_ptr + token, token - begin, mask=token < end)


@triton.jit
def binary_search_pre_pass(cu_seqlens_ptr, token_rows_ptr, n_tokens, n_seqs, search_steps,
                           BLOCK: tl.constexpr):
    """The second design (no cp, no start positions): a binary search per token over all
    sequences, search_steps = ceil(log2(n_seqs)) dependent loads from L2."""
    token = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    pos = r2._positions(token, 0, cu_seqlens_ptr, cu_seqlens_ptr, 0, n_seqs, search_steps, 1, 0,
                        True, False, False)
    tl.store(token_rows_ptr + token, pos, mask=token < n_tokens)


def us(fn) -> float:
    return round(1e3 * do_bench(fn, return_mode="median"), 2)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    copy = copy_bandwidth_gbps()
    rows = []
    cases = [(n, dtype, 32) for n in (16, 64, 128, 256, 1024, 2048, 4096, 16384, 65536)
             for dtype in ("bf16", "fp32")]
    cases += [(n, "bf16", 8) for n in (16, 64, 128, 256, 1024, 16384)]
    count_bounds_max = r2.COUNT_BOUNDS_MAX
    for n_seqs, dtype, heads in cases:
        size = dict(seq_len=4096, batch=16) if heads == 32 else dict(seq_len=8192, batch=16)
        p = Problem("thd", dtype, heads=heads, n_seqs=n_seqs, **size)
        t, freqs, cu = p.t, p.freqs, p.cu_seqlens
        n_tokens = t.shape[0]
        token_rows = torch.empty(n_tokens, dtype=torch.int32, device=t.device)
        row = dict(n_seqs=n_seqs, dtype=dtype, heads=heads, max_len=p.max_len)
        for name, on, bounds in (("frac_search", False, count_bounds_max),
                                 ("frac_binary_search", False, 1),
                                 ("frac_pre_pass", True, count_bounds_max)):
            r2.COUNT_BOUNDS_MAX = bounds
            r2._PLANS.clear()
            ms = do_bench(lambda on=on: r2.rope_2d(t, freqs, "thd", cu_seqlens=cu,
                                                   config=dict(token_rows=on)),
                          return_mode="median")
            row[name] = round(p.nbytes / ms / 1e6 / copy, 4)
        r2.COUNT_BOUNDS_MAX = count_bounds_max
        r2._PLANS.clear()
        pre = r2.pre_pass_plan(n_tokens, n_seqs)  # what rope_2d launches
        row["pre_us"] = us(lambda: r2.launch(r2.thd_positions_kernel, pre,
                                             (cu, cu, token_rows)))
        want = token_rows.clone()
        row["pre_us_binary_search"] = us(lambda: binary_search_pre_pass[(
            triton.cdiv(n_tokens, 256),)](cu, token_rows, n_tokens, n_seqs,
                                          r2._search_steps(n_seqs), BLOCK=256, num_warps=2))
        assert torch.equal(token_rows, want), "the designs disagree"
        row["pre_us_per_sequence"] = us(lambda: per_sequence_pre_pass[(n_seqs,)](
            cu, token_rows, BLOCK=256, num_warps=4))
        print(row, flush=True)
        rows.append(row)
    prov = provenance(copy, "thd_pre_pass")
    prov["command"] = "python scripts/thd_pre_pass.py"
    result = dict(provenance=prov, rows=rows)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
