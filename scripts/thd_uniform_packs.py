"""Packs of many equal short sequences (thd): ours next to flash-attn's Triton rotary.

    ROPE_PEER_DIR=DIR python scripts/thd_uniform_packs.py [--out FILE.json]

The benchmark's thd sweep cuts its tokens at random into sequences of mixed lengths; this script
measures the uniform packs a peer was reported fastest on (16384 sequences of 8 tokens), and
more of that kind: n_seqs sequences of ``length`` tokens each, bf16, head_dim 128, forward and
backward. Ours: the public ``apply_rotary_pos_emb`` (validate=False) forward, ``rope_2d``
backward (the benchmark's own callables for them). flash-attn: ``apply_rotary`` from
flash_attn/ops/triton/rotary.py (an installed flash-attn, else a copy of that one file in
$ROPE_PEER_DIR, as for the benchmark). Its grid has one row per sequence on CUDA's second grid
axis, which holds at most 65535: packs of more sequences are recorded as not launchable.

Bytes as in the benchmark (read t + write out + the float32 angle rows used); fractions of the
device copy measured in the same run; each row is the median of 3 rounds that alternate the
implementations, each round a do_bench median.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import (Problem, _flash_attn, _ours_api, copy_bandwidth_gbps,  # noqa: E402
                                provenance, time_ms)

PACKS = [  # (n_seqs, tokens per sequence, heads)
    (16384, 8, 32),
    (16384, 8, 8),
    (4096, 64, 32),
    (65536, 4, 32),
    (65536, 4, 8),
]
CUDA_GRID_Y_MAX = 65535


def uniform_problem(n_seqs: int, length: int, heads: int) -> Problem:
    """n_seqs sequences of ``length`` tokens each (Problem's thd with n_seqs None)."""
    return Problem(tensor_format="thd", seq_len=length, batch=n_seqs, heads=heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="figures/thd_uniform_packs.json")
    args = parser.parse_args()
    copy = copy_bandwidth_gbps()
    ours = _ours_api("2d")  # the benchmark's "triton-2d (ours)"
    flash_attn = _flash_attn()
    rows = []
    for n_seqs, length, heads in PACKS:
        p = uniform_problem(n_seqs, length, heads)
        for direction in ("forward", "backward"):
            fns = {"ours": ours(p, direction)}
            note = None
            if flash_attn is None:
                note = "flash-attn not available (set ROPE_PEER_DIR)"
            elif n_seqs > CUDA_GRID_Y_MAX:
                note = f"flash-attn cannot launch: one grid row per sequence, > {CUDA_GRID_Y_MAX}"
            else:
                fns["flash_attn"] = flash_attn(p, direction)
            for fn in fns.values():
                fn()
            runs = {name: [] for name in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    runs[name].append(p.nbytes / time_ms(fn) / 1e6 / copy)
            frac = {name: sorted(v)[1] for name, v in runs.items()}
            rows.append(dict(n_seqs=n_seqs, tokens_per_seq=length, heads=heads, head_dim=128,
                             dtype="bf16", direction=direction, bytes=p.nbytes,
                             ours=round(frac["ours"], 4),
                             flash_attn=round(frac["flash_attn"], 4) if "flash_attn" in frac else None,
                             note=note))
            print(f"{n_seqs:6d} x {length:3d} tokens, {heads:2d} heads, {direction:8s} "
                  f"ours {frac['ours']:.3f}  flash-attn "
                  + (f"{frac['flash_attn']:.3f}" if "flash_attn" in frac else f"- ({note})"),
                  flush=True)
        del p
        torch.cuda.empty_cache()
    prov = provenance(copy, "thd_uniform_packs")
    prov["command"] = "ROPE_PEER_DIR=DIR python scripts/thd_uniform_packs.py"
    prov["timing"] = ("triton.testing.do_bench median (L2 flushed per call), median of 3 rounds "
                      "alternating the implementations")
    pathlib.Path(args.out).write_text(json.dumps(dict(provenance=prov, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
