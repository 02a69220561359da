"""rope_2d's gathered rows out of place in bshd and thd on 1 warp (``GATHERED_TILES`` of the
session after 7177d89), against the kernel file before (GPU only).

    git show 7177d89:rope_kernels/rope_2d.py > /tmp/rope_2d_7177d89.py
    python scripts/rope2d_gathered_one_warp.py --before /tmp/rope_2d_7177d89.py [--rounds 3]
                                               [--tiles] [--out figures/rope2d_gathered_one_warp_h200.json]

Where rotary_dim is not a multiple of 16 (``rotary_percent`` 0.25 on heads of 80-160), rope_2d
gathers the partners in registers (``GATHER``). Out of place, 16-bit rows of 80 or 96 channels
had tiles of their own on 1-4 warps (scripts/rope2d_gathered_tiles.py: thd 1 token x 16 heads on 1
warp with 16 heads or more, bshd 4 positions x 8 heads on 2 or 4); bshd's tiles on 1 warp had
never been tried. A probe (not recorded) of 10-14 tiles at the 16 calls marked "chosen on" found
them ahead at every bshd call. ``GATHERED_TILES`` now gives 16-bit rows of 160-192 B 16 rows (1
position or token x 16 heads, 2 x 8 with 8 heads) on 1 warp in both formats, and bshd's rows of
193-320 B 8 rows on 1 warp.

Times both files' ``rope_2d`` (out of place) at ``SHAPES``: the 16 calls of the probe and 10 held
out (fp16, 4, 8, 16 and 64 heads, head_dim 112 and 144, other sequence counts), forward and
backward, in ``--rounds`` shuffled rounds with the host kept ahead, with a copy of the same
bytes, as ``scripts/rope2d_gathered_tiles.py`` does (``compare``); ``--tiles`` times the
package's file on ``PROBE_TILES`` too. Checked before timing: every side's results the same bits.
"""

from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from rope2d_gathered_tiles import SHAPES as TILES_SHAPES  # noqa: E402
from rope2d_gathered_tiles import arguments_with_only, compare  # noqa: E402


def _chosen_on(name: str) -> str:
    return name if name.endswith("(chosen on)") else f"{name} (chosen on)"


# name -> bench.Problem arguments (bf16, 16 x 4096 tokens, 32 heads unless said); "chosen on":
# the probe's calls, the rest held out.
SHAPES = {_chosen_on(name): kw for name, kw in TILES_SHAPES.items()}
SHAPES.update({
    "bshd hd80 rot20, batch 4 (chosen on)": dict(tensor_format="bshd", head_dim=80,
                                                 rotary_percent=0.25, batch=4),
    "bshd hd160 rot40, 8 heads, batch 64 (chosen on)": dict(
        tensor_format="bshd", head_dim=160, rotary_percent=0.25, heads=8, batch=64),
    "bshd hd96 rot24 fp16, 64 heads, batch 8 (chosen on)": dict(
        tensor_format="bshd", head_dim=96, rotary_percent=0.25, heads=64, batch=8, dtype="fp16"),
    # held out
    "bshd hd80 rot20 fp16, 64 heads, batch 8": dict(tensor_format="bshd", head_dim=80,
                                                    rotary_percent=0.25, heads=64, batch=8,
                                                    dtype="fp16"),
    "bshd hd80 rot20, 4 heads, batch 128": dict(tensor_format="bshd", head_dim=80,
                                                rotary_percent=0.25, heads=4, batch=128),
    "bshd hd96 rot24, 16 heads, 1024 x 128": dict(tensor_format="bshd", head_dim=96,
                                                  rotary_percent=0.25, heads=16, seq_len=1024,
                                                  batch=128),
    "bshd hd112 rot28": dict(tensor_format="bshd", head_dim=112, rotary_percent=0.25),
    "bshd hd144 rot36, batch 8": dict(tensor_format="bshd", head_dim=144, rotary_percent=0.25,
                                      batch=8),
    "bshd hd160 rot40 fp16, 16 heads": dict(tensor_format="bshd", head_dim=160,
                                            rotary_percent=0.25, heads=16, dtype="fp16"),
    "bshd hd128 rot24, 8 heads, batch 64": dict(tensor_format="bshd", rotary_percent=0.1875,
                                                heads=8, batch=64),
    "thd hd80 rot20, 8 heads, 16 seqs, batch 64": dict(tensor_format="thd", head_dim=80,
                                                       rotary_percent=0.25, heads=8, batch=64,
                                                       n_seqs=16),
    "thd hd80 rot20 fp16, 8 heads, 4096 seqs, batch 64": dict(
        tensor_format="thd", head_dim=80, rotary_percent=0.25, heads=8, batch=64, n_seqs=4096,
        dtype="fp16"),
    "thd hd96 rot24, 4 heads, 1024 seqs, batch 128": dict(tensor_format="thd", head_dim=96,
                                                          rotary_percent=0.25, heads=4,
                                                          batch=128, n_seqs=1024),
})
# --tiles: (block_s, block_b, block_h, num_warps) per format
PROBE_TILES = {"bshd": ((4, 1, 8, 2), (2, 1, 8, 1), (1, 1, 16, 1), (1, 1, 8, 1)),
               "thd": ((2, 1, 8, 2), (1, 1, 16, 1), (2, 1, 8, 1))}


def main(argv=None):
    compare(arguments_with_only(__doc__).parse_args(argv), SHAPES, PROBE_TILES,
            "rope2d_gathered_one_warp")


if __name__ == "__main__":
    main()
