"""rope_2d in place (``out=t``) with a rotary_dim that is not a multiple of 16: the narrowed rows
gathered, against the kernel file before (GPU only).

    git show 8c81001:rope_kernels/rope_2d.py > /tmp/rope_2d_8c81001.py
    python scripts/rope2d_in_place_unaligned.py --before /tmp/rope_2d_8c81001.py [--rounds 3]
                                                [--tiles] [--out figures/rope2d_in_place_unaligned_h200.json]

In place with part of the head rotated, ``rope_2d`` rotates the heads narrowed to rotary_dim and
leaves the rest where it is (neither read nor written): runs of 40 bytes in every 160 at
TransformerEngine's rotary_percent 0.25 on heads of 80 in 16-bit. The file before moved every
element of those runs alone (its pairs' tiles: the compiler knew neither rotary_dim / 2 nor
rotary_dim to be a multiple of a vector). With ``IN_PLACE_GATHER`` and ``CHANNEL_MULTIPLES`` the
runs are whole rows masked at rotary_dim, the partners gathered in registers, and the kernel is
told that rotary_dim is a multiple of 4 or 8, so that its masks cover whole vectors.

Times both files' ``rope_2d`` with ``out=t`` in one process (each file a module with its own plan
table) at ``SHAPES`` (sbhd, bshd, thd; bf16 and float32; 16 x 4096 tokens unless said), forward
and backward, in ``--rounds`` shuffled rounds (``bench.time_ms_host_ahead``: L2 flushed per call,
the host kept ahead), with the best of four tiles of a kernel that only reads and writes the same
runs in place (``qk_in_place_narrow_tiles.stream``): the ceiling of the access pattern. ``--tiles``
also times the package's file on other tiles (a probe). Fractions of the 2 GB copy counting the
bytes moved (the rotated channels read and written once, and the angle rows:
``Problem.rotated_nbytes``). Checked before timing: each side's in-place result the same bits as
the package's out-of-place one, the channels past rotary_dim untouched.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import rope2d_gathered  # noqa: E402
from qk_in_place_narrow_tiles import stream  # noqa: E402
from qk_in_place_unaligned import STREAM_TILES  # noqa: E402
from qk_size_scan import HOST_AHEAD_TIMING, provenance  # noqa: E402
from qk_table_hint import module_copy  # noqa: E402
from rope_kernels import bench  # noqa: E402

after_module = importlib.import_module("rope_kernels.rope_2d")  # the package exports the function

# rope2d_gathered's shapes but its controls (bench.Problem arguments; bf16, 16 x 4096 tokens, 32
# heads unless said)
SHAPES = {name: kw for name, kw in rope2d_gathered.SHAPES.items() if "control" not in name}
# --tiles: (block_s, block_b, block_h, num_warps), whole rows gathered
PROBE_TILES = ((4, 1, 4, 2), (2, 1, 8, 2), (1, 1, 16, 2), (4, 1, 8, 2), (8, 1, 4, 2),
               (2, 1, 16, 2), (4, 1, 4, 1), (4, 1, 8, 4))


def run(module, p, x, backward, config=None):
    """``module``'s rope_2d on ``x`` in place."""
    return module.rope_2d(x, p.freqs, p.tensor_format, cu_seqlens=p.cu_seqlens,
                          backward=backward, config=config, out=x)


def tile_of(module, fn) -> str:
    module._PLANS.clear()
    fn()
    (plan,) = module._PLANS.values()
    c = plan.constexprs
    return (f"{c['BLOCK_S']} x {c['BLOCK_B']} x {c['BLOCK_H']} on {plan.num_warps} warps, "
            f"ROW {c['ROW']}, GATHER {c['GATHER']}, CHANNEL_MULTIPLE {c.get('CHANNEL_MULTIPLE')}")


def write_record(rows, args, copy_gbps, mode, **provenance_extra):
    """Print the rows' after / before (range and median) and write them to ``args.out`` with the
    provenance: the command line (``scripts/{mode}.py`` with ``--before``, ``--rounds`` and
    ``--tiles`` as given), the side before's sha256 and ``provenance_extra``."""
    ratios = [row["after_over_before"] for row in rows]
    print(f"after / before: {min(ratios):.3f}-{max(ratios):.3f} "
          f"(median {statistics.median(ratios):.3f}) over {len(ratios)} calls")
    command = (f"python scripts/{mode}.py --before {args.before.name} --rounds {args.rounds}"
               + (" --tiles" if args.tiles else ""))
    prov = provenance(copy_gbps, mode, command, HOST_AHEAD_TIMING)
    prov["before_sha256"] = hashlib.sha256(args.before.read_bytes()).hexdigest()[:16]
    prov.update(provenance_extra)
    if args.out:
        args.out.write_text(json.dumps(dict(provenance=prov, rows=rows), indent=1) + "\n")
        print("wrote", args.out)


def arguments(doc: str) -> argparse.ArgumentParser:
    """The A/B scripts' arguments, which ``write_record`` reads: ``--before``, ``--out``,
    ``--rounds`` and ``--tiles``."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tiles", action="store_true", help="time PROBE_TILES too (a probe)")
    return parser


def main(argv=None):
    args = arguments(__doc__).parse_args(argv)
    before = module_copy("rope_2d_before", args.before)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name, kw in SHAPES.items():
        p = bench.Problem(**kw)
        rd = p.rotary_dim
        for backward in (False, True):
            src = p.grad if backward else p.t
            want = after_module.rope_2d(src, p.freqs, p.tensor_format, cu_seqlens=p.cu_seqlens,
                                        backward=backward)
            configs = {"after": None, "before": None}
            if args.tiles:
                configs.update({f"{s}x{b}x{h} w{w}": dict(block_s=s, block_b=b, block_h=h,
                                                         num_warps=w, whole_rows=True,
                                                         gather=True)
                                for s, b, h, w in PROBE_TILES})
            work = src.clone()  # the timed calls rotate it again and again
            same_bits, fns = {}, {}
            for side, config in configs.items():
                module = before if side == "before" else after_module
                x = src.clone()
                run(module, p, x, backward, config)
                assert torch.equal(x[..., rd:], src[..., rd:]), (name, side)
                same_bits[side] = bool(torch.equal(x, want))
                fns[side] = lambda m=module, c=config: run(m, p, work, backward, c)
            tiles = {"after": tile_of(after_module, fns["after"]),
                     "before": tile_of(before, fns["before"])}
            for rows_, warps in STREAM_TILES:
                fns[f"stream {rows_}r {warps}w"] = stream(work, work[:0], p.head_dim, rd, rows_,
                                                          warps)
            fractions = bench.shuffled_rounds(fns, p.rotated_nbytes, copy_gbps, args.rounds,
                                              timer=bench.time_ms_host_ahead)
            of_copy = {k: statistics.median(v) for k, v in fractions.items()}
            best_stream = max((k for k in of_copy if k.startswith("stream")), key=of_copy.get)
            r = [a / b for a, b in zip(fractions["after"], fractions["before"])]
            row = dict(shape=name, direction="backward" if backward else "forward",
                       mbytes_moved=round(p.rotated_nbytes / 1e6, 1), tiles=tiles,
                       after=of_copy["after"], before=of_copy["before"],
                       after_over_before=statistics.median(r), spread=[min(r), max(r)],
                       stream=of_copy[best_stream], stream_tile=best_stream,
                       of_copy=of_copy, same_bits=same_bits)
            rows.append(row)
            probe = sorted(((v, k) for k, v in of_copy.items()
                            if k not in ("after", "before") and not k.startswith("stream")),
                           reverse=True)[:4]
            print(f"{name:36s} {row['direction']:8s} {row['mbytes_moved']:6.0f} MB: "
                  f"{row['before']:.3f} -> {row['after']:.3f} (x{row['after_over_before']:.3f}) "
                  f"stream {row['stream']:.3f} [{tiles['after']}] <- [{tiles['before']}]"
                  + (" | " + ", ".join(f"{k} {v:.3f}" for v, k in probe) if probe else "")
                  + f" same bits {all(same_bits.values())}", flush=True)
            del fns, work, want
        del p
        torch.cuda.empty_cache()
    write_record(rows, args, copy_gbps, "rope2d_in_place_unaligned",
                 bytes="the rotated channels read and written once + the angle rows "
                       "(Problem.rotated_nbytes)")


if __name__ == "__main__":
    main()
