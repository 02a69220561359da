"""Whole-row tiles in rope_2d against its pairs' tiles (GPU only).

    python scripts/rope2d_whole_rows.py [--out figures/rope2d_whole_rows.json] [--rounds 5]
    python scripts/rope2d_whole_rows.py --set sbhd-thd [--out figures/rope2d_whole_rows_sbhd_thd_h200.json]
    python scripts/rope2d_whole_rows.py --set bshd [--out figures/rope2d_whole_rows_bshd_h200.json]

The same change as rope_qk's whole rows (scripts/qk_whole_rows.py) in the TransformerEngine-style
kernel: with whole rows (``config={"whole_rows": True}``) a program loads each row of its tile
once, loads each channel's partner again (the same lines, from L1) and stores the row in one
piece, instead of the pairs' two halves and the channels past ``rotary_dim`` in three.

``--set all`` (the default): each shape's tile, timed four ways: pairs and whole rows, each on
the tile's warps and on twice as many, so that the gain of each change shows alone. Shuffled
rounds at the benchmark's TE shapes (sbhd, bshd, thd; 16-bit and fp32; forward and backward;
partial rotary, 8 heads, small batches, short packed sequences, in place), as a fraction of the
run's 2 GB copy (``triton.testing.do_bench`` median; bytes as the benchmark counts them).
``default`` in each row names the variant that ``WHOLE_ROWS = True`` takes (whole rows in every
format on twice the warps), which was ``default_config``'s default when
figures/rope2d_whole_rows.json (H100) and figures/rope2d_whole_rows_h200.json (H200) were
recorded.

``--set sbhd-thd``: whole rows on the tile's own warps (the default rule since 8f839b6, then
for sbhd and thd only) against the pairs, at more sbhd and thd shapes, and on one warp for thd
tiles of 8 heads; ``default`` names the variant ``default_config`` takes with
``WHOLE_ROWS = False``. figures/rope2d_whole_rows_sbhd_thd_h200.json (H200) and _h100.json are
that set.

``--set bshd``: bshd, where the whole-row backward's partner sines decide: pairs, whole rows
with each partner's sine computed again from its angle (``gather_sines`` off), and whole rows
with the sines gathered in registers (``gather_sines`` on; a power-of-two rotary_dim only, else
the same kernel as the one before; in the forward both are one kernel, so their difference
there is the run's noise); ``default`` names the variant ``default_config`` takes.
figures/rope2d_whole_rows_bshd_h200.json (H200) is that set, recorded at fbb7a3c, whose rule
kept the pairs for rotary_dim 96 of 128 (its ``default`` there says so); whole rows ran 3-6%
faster there, and the rule now takes them.
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import rope_2d  # noqa: E402
from rope_kernels.bench import Problem, copy_bandwidth_gbps, provenance  # noqa: E402
from rope_kernels.rope_2d import default_config  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from qk_table_hint import shuffled_rounds  # noqa: E402  (medians of bench.shuffled_rounds)

rope_2d_module = sys.modules["rope_kernels.rope_2d"]  # the package exports the function

# name -> Problem arguments (sbhd bf16, 4096 x 16, 32 heads of 128 unless said), and "in_place"
SHAPES = {
    "sbhd": {}, "bshd": dict(tensor_format="bshd"),
    "thd 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
    "sbhd fp16": dict(dtype="fp16"),
    "bshd half rotary": dict(tensor_format="bshd", rotary_percent=0.5),
    "bshd 8 heads": dict(tensor_format="bshd", heads=8),
    "bshd 16 heads": dict(tensor_format="bshd", heads=16),
    "sbhd 16 heads": dict(heads=16),
    "bshd s8192": dict(tensor_format="bshd", seq_len=8192),
    "bshd batch 1": dict(tensor_format="bshd", batch=1),
    "bshd batch 4": dict(tensor_format="bshd", batch=4),
    "sbhd head_dim 256": dict(head_dim=256, heads=16),
    "thd 16384 x 8, 8 heads": dict(tensor_format="thd", seq_len=8, batch=16384, heads=8),
    "thd 16384 x 8, 32 heads": dict(tensor_format="thd", seq_len=8, batch=16384),
    "thd 64 seqs, 8 heads": dict(tensor_format="thd", seq_len=4096, batch=32, heads=8, n_seqs=64),
    "bshd in place": dict(tensor_format="bshd", in_place=True),
    # controls the rule leaves with the pairs
    "bshd fp32": dict(tensor_format="bshd", dtype="fp32"),
    "bshd head_dim 64": dict(tensor_format="bshd", head_dim=64),
}

# --set sbhd-thd: the formats whose default is whole rows on the tile's own warps
SHAPES_SBHD_THD = {
    "sbhd": {}, "sbhd fp16": dict(dtype="fp16"), "sbhd 16 heads": dict(heads=16),
    "sbhd 8 heads": dict(heads=8), "sbhd batch 1": dict(batch=1), "sbhd batch 4": dict(batch=4),
    "sbhd half rotary": dict(rotary_percent=0.5), "sbhd in place": dict(in_place=True),
    "sbhd s8192": dict(seq_len=8192), "sbhd head_dim 256": dict(head_dim=256, heads=16),
    "thd 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
    "thd 4096 seqs fp16": dict(tensor_format="thd", n_seqs=4096, dtype="fp16"),
    "thd 4096 seqs half rotary": dict(tensor_format="thd", n_seqs=4096, rotary_percent=0.5),
    "thd 4096 seqs in place": dict(tensor_format="thd", n_seqs=4096, in_place=True),
    "thd 16 seqs": dict(tensor_format="thd", n_seqs=16),
    "thd 64 seqs, 8 heads": dict(tensor_format="thd", seq_len=4096, batch=32, heads=8, n_seqs=64),
    "thd 16384 x 8, 8 heads": dict(tensor_format="thd", seq_len=8, batch=16384, heads=8),
    "thd 65536 x 4, 8 heads": dict(tensor_format="thd", seq_len=4, batch=65536, heads=8),
    "thd 16384 x 8, 32 heads": dict(tensor_format="thd", seq_len=8, batch=16384),
    "thd 16384 seqs, 8 heads": dict(tensor_format="thd", seq_len=4096, batch=32, heads=8,
                                    n_seqs=16384),
}


# --set bshd: whole rows in bshd, the backward's partner sines computed again or gathered
SHAPES_BSHD = {
    "bshd": dict(tensor_format="bshd"), "bshd fp16": dict(tensor_format="bshd", dtype="fp16"),
    "bshd s8192": dict(tensor_format="bshd", seq_len=8192),
    "bshd batch 1": dict(tensor_format="bshd", batch=1, seq_len=16384),
    "bshd batch 4": dict(tensor_format="bshd", batch=4),
    "bshd half rotary": dict(tensor_format="bshd", rotary_percent=0.5),
    "bshd rotary 96 of 128": dict(tensor_format="bshd", rotary_percent=0.75),
    "bshd head_dim 256": dict(tensor_format="bshd", head_dim=256, heads=16),
    "bshd 64 heads": dict(tensor_format="bshd", heads=64, batch=8),
    "bshd 16 heads": dict(tensor_format="bshd", heads=16),
    "bshd 8 heads": dict(tensor_format="bshd", heads=8),
    "bshd in place": dict(tensor_format="bshd", in_place=True),
}


def variants(p: Problem, in_place: bool, which: str = "all") -> tuple:
    """(name -> config for rope_2d, the name of the default): the tile that default_config
    chooses, with pairs and with whole rows. ``all``: each on its warps and on twice as many;
    the default named is ``WHOLE_ROWS = True``'s. ``sbhd-thd``: on its warps (and whole rows on
    one warp where a thd tile of 8 heads has two); the default named is the package's.
    ``bshd``: pairs and whole rows with the partners' sines computed again or gathered, on the
    tile's warps; the default named is the package's."""
    t = p.t
    canon = {"sbhd": t.shape, "bshd": (t.shape[1], t.shape[0], *t.shape[2:]),
             "thd": (t.shape[0], 1, *t.shape[1:])}[p.tensor_format]

    def config():
        return default_config(*canon, p.rotary_dim, t.device, t.element_size(), False,
                              p.tensor_format, in_place=in_place,
                              n_seqs=p.n_seqs if p.tensor_format == "thd" else None)

    default_flag = rope_2d_module.WHOLE_ROWS
    try:
        rope_2d_module.WHOLE_ROWS = True
        now = config()  # the whole-rows rule (the opt-in; the default when the records were made)
        rope_2d_module.WHOLE_ROWS = False
        before = config()  # the package's default: the tile on its own warps
    finally:
        rope_2d_module.WHOLE_ROWS = default_flag
    warps = before["num_warps"]
    out = {}
    if which == "sbhd-thd":
        out["pairs"] = dict(before, whole_rows=False)
        out["whole rows"] = dict(before, whole_rows=True)
        if p.tensor_format == "thd" and p.heads == 8 and warps == 2:
            out["whole rows, 1 warp"] = dict(before, whole_rows=True, num_warps=1)
        now = before
    elif which == "bshd":
        out["pairs"] = dict(before, whole_rows=False, gather_sines=False)
        out["whole rows, second sine"] = dict(before, whole_rows=True, gather_sines=False)
        out["whole rows, gathered sines"] = dict(before, whole_rows=True, gather_sines=True)
        now = before
    else:
        for whole in (False, True):
            for w in (warps, 2 * warps):
                if w <= 8:
                    name = (("whole rows" if whole else "pairs")
                            + (f", {w} warps" if w != warps else ""))
                    out[name] = dict(before, whole_rows=whole, num_warps=w)
    default = [name for name, cfg in out.items() if cfg == now]
    assert len(default) == 1, (now, out)
    return out, default[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--set", choices=("all", "sbhd-thd", "bshd"), default="all",
                        help="all: the four variants at every format; sbhd-thd: the default "
                             "rule against the pairs at more sbhd and thd shapes; bshd: pairs "
                             "and whole rows with the backward's partner sines computed again "
                             "or gathered")
    args = parser.parse_args(argv)
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "rope2d_whole_rows"), "rounds": args.rounds,
              "rows": {}}
    result["provenance"]["command"] = ("python scripts/rope2d_whole_rows.py"
                                       + (f" --set {args.set}" if args.set != "all" else ""))
    start = time.time()
    shapes = {"all": SHAPES, "sbhd-thd": SHAPES_SBHD_THD, "bshd": SHAPES_BSHD}[args.set]
    for name, kw in shapes.items():
        kw = dict(kw)
        in_place = kw.pop("in_place", False)
        p = Problem(**kw)
        configs, default = variants(p, in_place, args.set)
        for direction in ("forward", "backward"):
            x = p.grad if direction == "backward" else p.t
            ref = rope_2d(x, p.freqs, p.tensor_format, cu_seqlens=p.cu_seqlens,
                          backward=direction == "backward", config=configs["pairs"])
            fns = {}
            for label, config in configs.items():
                def call(config=config, x=x, p=p, backward=direction == "backward", out=None):
                    return rope_2d(x if out is None else out, p.freqs, p.tensor_format,
                                   cu_seqlens=p.cu_seqlens, backward=backward, config=config,
                                   out=out)
                if in_place:  # each variant rotates its own copy of x, again and again
                    out = x.clone()
                    call(out=out)
                    call = functools.partial(call, out=x.clone())
                else:
                    out = call()
                # The same rotation; 16-bit rounding may differ where an FMA does.
                torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)
                fns[label] = call
            del ref, out
            row = shuffled_rounds(fns, p.nbytes, copy, args.rounds)
            row["default"] = default
            row["default / pairs"] = round(row[default] / row["pairs"], 4)
            result["rows"].setdefault(name, {})[direction] = row
            print(f"{name:24s} {direction:8s} {row}  [{time.time() - start:.0f} s]", flush=True)
        del p, fns
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
