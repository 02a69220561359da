"""Tile sweep of rope_2d's kernel on a GPU: every tile shape (block_s x block_b x block_h, warps)
within 4-32 KB of input (thd: 1-32 KB), for the problems below, next to Liger-Kernel where it
applies.
Writes $OUT/tile_sweep.csv (one row per problem x config). Notebook 04 reads the recorded copy
in figures/.

    python scripts/tile_sweep.py [--out DIR] [--only NAME,NAME]
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib
import json
import os
import pathlib
import sys
import time

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import Problem, _liger, copy_bandwidth_gbps, time_ms  # noqa: E402
from rope_kernels.reference import rope_reference  # noqa: E402

r2 = importlib.import_module("rope_kernels.rope_2d")

PROBLEMS = {
    "sbhd bf16 default": dict(tensor_format="sbhd"),
    "bshd bf16 default": dict(tensor_format="bshd"),
    "sbhd fp32 default": dict(tensor_format="sbhd", dtype="fp32"),
    "bshd fp32 default": dict(tensor_format="bshd", dtype="fp32"),
    "bshd bf16 h8": dict(tensor_format="bshd", heads=8),
    "bshd bf16 h16": dict(tensor_format="bshd", heads=16),
    "bshd bf16 h64": dict(tensor_format="bshd", heads=64),
    "bshd bf16 b4": dict(tensor_format="bshd", batch=4),
    "bshd bf16 s1024": dict(tensor_format="bshd", seq_len=1024),
    "sbhd bf16 rp0.5": dict(tensor_format="sbhd", rotary_percent=0.5),
    "bshd bf16 d256": dict(tensor_format="bshd", head_dim=256, heads=16),
    "bshd bf16 d64": dict(tensor_format="bshd", head_dim=64),
    "bshd bf16 b1 h64 s2048": dict(tensor_format="bshd", batch=1, heads=64, seq_len=2048),
    "bshd bf16 b2 s8192": dict(tensor_format="bshd", batch=2, seq_len=8192),
    "sbhd bf16 interleaved": dict(tensor_format="sbhd", interleaved=True),
    "bshd bf16 interleaved": dict(tensor_format="bshd", interleaved=True),
    "sbhd fp32 interleaved": dict(tensor_format="sbhd", dtype="fp32", interleaved=True),
    "thd bf16 16 seqs": dict(tensor_format="thd", n_seqs=16),
    "thd bf16 256 seqs": dict(tensor_format="thd", n_seqs=256),
    "thd bf16 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
    "thd bf16 16384 seqs": dict(tensor_format="thd", n_seqs=16384),
    "thd bf16 65536 seqs": dict(tensor_format="thd", n_seqs=65536),
    "thd fp16 4096 seqs": dict(tensor_format="thd", n_seqs=4096, dtype="fp16"),
    "thd fp32 16384 seqs": dict(tensor_format="thd", n_seqs=16384, dtype="fp32"),
}


def configs(p: Problem) -> list[dict]:
    """Tiles of 4-32 KB of input, warps by tile size; for bshd each tile both with the batch
    blocks in one group (all of them side by side) and in groups of 2. (Interleaved pairs are
    read one word per pair here, the inputs being contiguous, and tile like half-split ones.)"""
    (rows, batch, heads, head_dim), _ = r2._canonical(p.t, p.tensor_format)
    half = r2._next_pow2(p.rotary_dim // 2)
    width = 2 * half + (r2._next_pow2(head_dim - p.rotary_dim) if head_dim > p.rotary_dim else 0)
    nh, nb = r2._next_pow2(heads), r2._next_pow2(batch)
    out = []
    for _ in (0,):
        # thd: tiles from 1 KB (one token's run of heads), warps for 16-64 input bytes a thread
        lo, hi = (1024 if p.tensor_format == "thd" else 4096), 32768
        for bh in sorted({nh, nh // 2, nh // 4, 1, 2, 4, 8, 16} & set(range(1, nh + 1))):
            for bb in (1, 2, 4):
                if bb > nb:
                    continue
                # thd: longer runs of tokens amortise each tile's search over cu_seqlens
                for bs in (1, 2, 4, 8) + ((16, 32) if p.tensor_format == "thd" else ()):
                    tile = bs * bb * bh * width * p.t.element_size()
                    if not lo <= tile <= hi:
                        continue
                    if p.tensor_format == "thd":
                        warps = tuple(w for w in (1, 2, 4, 8) if 16 <= tile // (32 * w) <= 64)
                    else:
                        warps = (2, 4, 8) if tile <= 8192 else (4, 8) if tile <= 16384 else (8,)
                    groups = (2, 1 << 20) if p.tensor_format == "bshd" else (1 << 20,)
                    # thd: each tile with the search over cu_seqlens and with the pre-pass
                    rows_modes = (False, True) if p.tensor_format == "thd" else (None,)
                    for nw in warps:
                        for g in groups:
                            for tr in rows_modes:
                                cfg = dict(block_s=bs, block_b=bb, block_h=bh, num_warps=nw,
                                           group_b=g)
                                if tr is not None:
                                    cfg["token_rows"] = tr
                                out.append(cfg)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "gpu-out")))
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    copy = copy_bandwidth_gbps()
    gpu = torch.cuda.get_device_name()
    print(f"{gpu}: copy {copy:.0f} GB/s; triton {triton.__version__} torch {torch.__version__}", flush=True)
    base = dict(gpu=gpu, torch=torch.__version__, triton=triton.__version__,
                date=datetime.date.today().isoformat(), copy_gbps=round(copy))
    rows = []
    liger = _liger()
    t0 = time.time()
    names = [n for n in PROBLEMS if not args.only or n in args.only.split(",")]
    for name in names:
        p = Problem(**PROBLEMS[name])
        kw = p.kwargs()
        ref = rope_reference(p.t.double(), p.freqs, p.tensor_format, None, p.interleaved, p.cu_seqlens)
        tol = 1e-2 if p.t.dtype != torch.float32 else 1e-5

        def rec(config, label, fn):
            ms = time_ms(fn)
            rows.append(dict(base, problem=name, config=label, ms=ms, gbps=p.nbytes / ms / 1e6,
                             frac=p.nbytes / ms / 1e6 / copy))
            return rows[-1]["frac"]

        dflt = rec(None, "default", lambda: r2.rope_2d(p.t, p.freqs, **kw))
        msg = f"{name:24s} default {dflt:.3f}"
        liger_call = liger(p, "forward") if liger is not None else None
        if liger_call is not None:
            msg += f"  liger {rec(None, 'Liger-Kernel', liger_call):.3f}"
        best = (0, None)
        for cfg in configs(p):
            out = r2.rope_2d(p.t, p.freqs, config=cfg, **kw)
            err = ((out.double() - ref).abs() / (1 + ref.abs())).max().item()
            if not err < tol:
                print(f"  WRONG {cfg}: rel err {err:.3g}", flush=True)
                continue
            f = rec(cfg, json.dumps(cfg), lambda: r2.rope_2d(p.t, p.freqs, config=cfg, **kw))
            best = max(best, (f, json.dumps(cfg)))
        if liger_call is not None:
            # Liger rotates in place; ours too with out=t (on a copy: the values keep rotating).
            t_in_place = p.t.clone()
            f = rec(None, "default, in place",
                    lambda: r2.rope_2d(t_in_place, p.freqs, out=t_in_place, **kw))
            msg += f"  default in place {f:.3f}"
        if p.t.dtype != torch.float32 and best[1]:
            cfg = dict(json.loads(best[1]), fast_trig=False)
            f = rec(cfg, json.dumps(cfg), lambda: r2.rope_2d(p.t, p.freqs, config=cfg, **kw))
            msg += f"  best {best[0]:.3f} {best[1]} (libdevice trig: {f:.3f})"
        else:
            msg += f"  best {best[0]:.3f} {best[1]}"
        print(msg, f"[{time.time() - t0:.0f} s]", flush=True)
        with open(args.out / "tile_sweep.csv", "w", newline="") as fh:  # after every problem
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
