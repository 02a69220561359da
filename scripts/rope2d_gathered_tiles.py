"""rope_2d's gathered rows out of place in bshd and thd on tiles of their own (``GATHERED_TILES``),
against the kernel file before (GPU only).

    git show b25b2d3:rope_kernels/rope_2d.py > /tmp/rope_2d_b25b2d3.py
    python scripts/rope2d_gathered_tiles.py --before /tmp/rope_2d_b25b2d3.py [--rounds 3]
                                            [--tiles] [--out figures/rope2d_gathered_tiles_h200.json]

Where rotary_dim is not a multiple of 16 (TransformerEngine's ``rotary_percent`` 0.25 on heads of
80, 96 or 160), ``rope_2d`` moves each row in two aligned pieces and gathers the partners in
registers (``GATHER``, ``scripts/rope2d_gathered.py``), on the tile the general rules give the
format: in thd one token's 16 heads on 2 warps, in bshd 8 (or 4) positions x 4 heads. A probe of
14 tiles a call found those 12-24 points of copy behind the best in thd and 3-5 in bshd;
``GATHERED_TILES`` gives 16-bit rows of 80 or 96 channels 1 token x 16 heads on 1 warp in thd
(16 heads or more) and 4 positions x 8 heads in bshd, on 2 warps (4 at 96 channels); sbhd keeps
its tile, the best in the same probe. (Since f5fd49d ``GATHERED_TILES`` puts those rows on 1
warp in bshd too, and this script times the tiles of today's file; that change's own A/B is
``scripts/rope2d_gathered_one_warp.py``.)

Times both files' ``rope_2d`` (out of place) in one process, each file a module with its own plan
table, at ``SHAPES``: the three calls the tiles were chosen on, and ten they were not (other head
counts, sequence counts, head_dim 96 and 128, fp16 and float32), forward and backward, in
``--rounds`` shuffled rounds (``bench.time_ms_host_ahead``: L2 flushed per call, the host kept
ahead), with a copy of the same bytes (``copy_same``). ``--tiles`` also times the package's file
on ``PROBE_TILES`` (a probe). Fractions of the 2 GB copy (bytes as ``Problem.nbytes`` counts
them: x read and the result written once, the angle rows read once). Checked before timing: both
sides' results the same bits.
"""

from __future__ import annotations

import importlib
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from qk_size_scan import same  # noqa: E402
from qk_table_hint import module_copy  # noqa: E402
from rope2d_gathered import run  # noqa: E402
from rope2d_in_place_unaligned import arguments, tile_of, write_record  # noqa: E402
from rope_kernels import bench  # noqa: E402

after_module = importlib.import_module("rope_kernels.rope_2d")  # the package exports the function

# name -> bench.Problem arguments (bf16, 16 x 4096 tokens, 32 heads unless said); "chosen on":
# the probe's calls, the rest held out.
SHAPES = {
    "bshd hd80 rot20 (chosen on)": dict(tensor_format="bshd", head_dim=80, rotary_percent=0.25),
    "bshd hd160 rot40 (chosen on)": dict(tensor_format="bshd", head_dim=160,
                                         rotary_percent=0.25),
    "thd hd80 rot20, 4096 seqs (chosen on)": dict(tensor_format="thd", head_dim=80,
                                                  rotary_percent=0.25, n_seqs=4096),
    "bshd hd96 rot24": dict(tensor_format="bshd", head_dim=96, rotary_percent=0.25),
    "bshd hd128 rot24": dict(tensor_format="bshd", rotary_percent=0.1875),
    "bshd hd80 rot20, 8 heads, batch 64": dict(tensor_format="bshd", head_dim=80,
                                               rotary_percent=0.25, heads=8, batch=64),
    "bshd hd80 rot20 fp32, batch 8": dict(tensor_format="bshd", head_dim=80, rotary_percent=0.25,
                                          dtype="fp32", batch=8),
    "thd hd80 rot20, 16 seqs": dict(tensor_format="thd", head_dim=80, rotary_percent=0.25,
                                    n_seqs=16),
    "thd hd80 rot20, 8 heads, 256 seqs": dict(tensor_format="thd", head_dim=80,
                                              rotary_percent=0.25, heads=8, batch=64, n_seqs=256),
    "thd hd96 rot24, 64 seqs": dict(tensor_format="thd", head_dim=96, rotary_percent=0.25,
                                    n_seqs=64),
    "thd hd160 rot40, 4096 seqs, batch 8": dict(tensor_format="thd", head_dim=160,
                                                rotary_percent=0.25, n_seqs=4096, batch=8),
    "thd hd80 rot20 fp16, 4096 seqs": dict(tensor_format="thd", head_dim=80, rotary_percent=0.25,
                                           dtype="fp16", n_seqs=4096),
    "thd hd80 rot20 fp32, 4096 seqs, batch 8": dict(tensor_format="thd", head_dim=80,
                                                    rotary_percent=0.25, dtype="fp32",
                                                    n_seqs=4096, batch=8),
}
# --tiles: (block_s, block_b, block_h, num_warps) per format, the rows gathered
PROBE_TILES = {"bshd": ((2, 1, 16, 2), (2, 1, 16, 4), (4, 1, 8, 4), (4, 1, 8, 2), (8, 1, 4, 2)),
               "thd": ((2, 1, 8, 2), (1, 1, 16, 2), (4, 1, 8, 4), (4, 1, 4, 2))}


def compare(args, shapes, probe_tiles, mode):
    """Time ``args.before``'s rope_2d against the package's at ``shapes`` (name -> bench.Problem
    arguments, or those named in ``args.only``), and with ``args.tiles`` the package's on
    ``probe_tiles``; print each call and write the record as ``scripts/{mode}.py``'s."""
    before = module_copy("rope_2d_before", args.before)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    names = list(shapes) if args.only is None else args.only.split(";")
    for name in names:
        p = bench.Problem(**shapes[name])
        copy_same = bench.copy_same_bytes_gbps(p.nbytes) / copy_gbps
        for backward in (False, True):
            x = p.grad if backward else p.t
            sides = {"after": (after_module, None), "before": (before, None)}
            if args.tiles:
                for s, b, h, w in probe_tiles[p.tensor_format]:
                    sides[f"{s}x{b}x{h} w{w}"] = (after_module, dict(
                        block_s=s, block_b=b, block_h=h, num_warps=w))
            results = {side: run(m, p, x, backward, cfg) for side, (m, cfg) in sides.items()}
            assert all(same(r, results["before"]) for r in results.values()), name
            tiles = {side: tile_of(m, lambda m=m: run(m, p, x, backward))
                     for side, m in (("after", after_module), ("before", before))}
            fns = {side: (lambda m=m, cfg=cfg: run(m, p, x, backward, cfg))
                   for side, (m, cfg) in sides.items()}
            fractions = bench.shuffled_rounds(fns, p.nbytes, copy_gbps, args.rounds,
                                              timer=bench.time_ms_host_ahead)
            r = [a / b for a, b in zip(fractions["after"], fractions["before"])]
            row = dict(shape=name, direction="backward" if backward else "forward",
                       mbytes=round(p.nbytes / 1e6, 1), tiles=tiles,
                       of_copy={k: statistics.median(v) for k, v in fractions.items()},
                       after_over_before=statistics.median(r), spread=[min(r), max(r)],
                       copy_same=round(copy_same, 4))
            rows.append(row)
            probe = sorted(((v, k) for k, v in row["of_copy"].items()
                            if k not in ("after", "before")), reverse=True)
            print(f"{name:40s} {row['direction']:8s} {row['mbytes']:6.0f} MB: "
                  f"{row['of_copy']['before']:.3f} -> {row['of_copy']['after']:.3f} "
                  f"(x{row['after_over_before']:.3f}, {min(r):.3f}-{max(r):.3f}; copy same "
                  f"{copy_same:.3f}) [{tiles['before']} -> {tiles['after']}]"
                  + "".join(f" | {k} {v:.3f}" for v, k in probe), flush=True)
            del fns, results
        del p
        torch.cuda.empty_cache()
    write_record(rows, args, copy_gbps, mode)


def arguments_with_only(doc):
    """``arguments`` and ``--only``."""
    parser = arguments(doc)
    parser.add_argument("--only", default=None, help="shape names separated by semicolons")
    return parser


def main(argv=None):
    compare(arguments_with_only(__doc__).parse_args(argv), SHAPES, PROBE_TILES,
            "rope2d_gathered_tiles")


if __name__ == "__main__":
    main()
