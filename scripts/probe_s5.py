"""Session-5 probes on a GPU: registers of rope_2d's compiled kernels (and Liger's), and out of
place vs in place at the bshd shapes where Liger (in place) led; with ``rows``, whole-row tiles of
bshd rows smaller than the tile sweep's 4 KB (8 and 4 heads) on 1-4 warps; with ``copy``, the
device copy's bandwidth at the sizes of the smaller benchmark shapes, as a fraction of the 2 GiB
copy the benchmark uses as its ceiling. Prints; writes nothing.

    python scripts/probe_s5.py [rows | copy]
"""

from __future__ import annotations

import importlib
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import Problem, _liger, copy_bandwidth_gbps, time_ms  # noqa: E402

r2 = importlib.import_module("rope_kernels.rope_2d")


def regs_of_last_plan():
    plan = list(r2._PLANS.values())[-1]
    ks = list(plan.compiled.values())
    return [(k.n_regs, k.n_spills) for k in ks], plan.constexprs


def main():
    copy = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()} copy {copy:.0f} GB/s")
    cases = {
        "bshd default": dict(tensor_format="bshd"),
        "bshd h16": dict(tensor_format="bshd", heads=16),
        "bshd d64": dict(tensor_format="bshd", head_dim=64),
        "bshd b4": dict(tensor_format="bshd", batch=4),
        "sbhd default": dict(tensor_format="sbhd"),
        "sbhd interleaved": dict(tensor_format="sbhd", interleaved=True),
    }
    tiles = [None, dict(block_s=8, block_b=4, block_h=1, group_b=2),
             dict(block_s=1, block_b=2, block_h=16, group_b=2),
             dict(block_s=1, block_b=2, block_h=32, group_b=2),
             dict(block_s=8, block_b=1, block_h=4, group_b=2)]
    liger = _liger()
    for name, kw in cases.items():
        p = Problem(**kw)
        for cfg in tiles:
            if cfg and (p.tensor_format != "bshd" or cfg["block_h"] > p.heads):
                continue
            out = r2.rope_2d(p.t, p.freqs, config=cfg, **p.kwargs())
            r2.rope_2d(p.t, p.freqs, config=cfg, out=out, **p.kwargs())  # thin path: compiled kept
            regs, cx = regs_of_last_plan()
            f_out = p.nbytes / time_ms(lambda: r2.rope_2d(p.t, p.freqs, config=cfg, out=out,
                                                           **p.kwargs())) / 1e6 / copy
            t = p.t.clone()
            f_in = p.nbytes / time_ms(lambda: r2.rope_2d(t, p.freqs, config=cfg, out=t,
                                                          **p.kwargs())) / 1e6 / copy
            tile = (cx["BLOCK_S"], cx["BLOCK_B"], cx["BLOCK_H"])
            print(f"{name:18s} {str(cfg and tile or ('default', tile)):28s} regs/spills {regs} "
                  f"out-of-place {f_out:.3f} in place {f_in:.3f}", flush=True)
        if liger is not None and (make := liger(p, "forward")) is not None:
            f = p.nbytes / time_ms(make) / 1e6 / copy
            try:
                from liger_kernel.ops.rope import _triton_rope
                regs = [(k.n_regs, k.n_spills) for c in _triton_rope.device_caches.values()
                        for k in c[0].values()]
            except Exception as e:  # noqa: BLE001
                regs = f"? ({type(e).__name__})"
            print(f"{name:18s} Liger (in place) {f:.3f} regs/spills {regs}", flush=True)


def small_rows():
    copy = copy_bandwidth_gbps()
    liger = _liger()
    for heads in (8, 4):
        p = Problem("bshd", heads=heads)
        kw = p.kwargs()

        def frac(fn):
            return round(p.nbytes / time_ms(fn) / 1e6 / copy, 3)

        dflt = r2.default_config(p.seq_len, p.batch, heads, p.head_dim, p.rotary_dim, p.t.device,
                                 2, False, "bshd")
        print(heads, "heads: default", dflt, frac(lambda: r2.rope_2d(p.t, p.freqs, **kw)))
        if liger is not None:
            print(heads, "heads: Liger", frac(liger(p, "forward")))
        for bs, bb, w in [(1, 1, 1), (1, 1, 2), (2, 1, 1), (2, 1, 2), (2, 1, 4), (1, 2, 1),
                          (1, 2, 2), (4, 1, 2), (4, 1, 4)]:
            cfg = dict(block_s=bs, block_b=bb, block_h=heads, num_warps=w, group_b=2)
            print(heads, "heads:", cfg, frac(lambda: r2.rope_2d(p.t, p.freqs, config=cfg, **kw)),
                  flush=True)


def copy_sizes():
    ceiling = copy_bandwidth_gbps()
    print(f"copy of 2 GiB -> 2 GiB (read + write counted): {ceiling:.0f} GB/s")
    for mib in (32, 64, 128, 256, 512, 1024):
        gbps = copy_bandwidth_gbps(mib * 1024**2)
        print(f"copy of {mib:5d} MiB -> {mib:5d} MiB: {gbps:.0f} GB/s, {gbps / ceiling:.3f} of the "
              "2 GiB copy", flush=True)


if __name__ == "__main__":
    {"rows": small_rows, "copy": copy_sizes}.get(sys.argv[1] if sys.argv[1:] else "", main)()
