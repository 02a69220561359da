"""Tile sweep of rope_qk's kernel (q and k in one launch) on a GPU: programs of one head block
against programs that loop over all heads of their tokens (``all_heads``), for the cos/sin cache
(FlashInfer), Hugging Face's cos/sin and TransformerEngine's fused QKV, next to Liger-Kernel where
it applies. rope_qk.default_config's choices come from this; the recorded run is
figures/qk_tile_sweep.json.

    python scripts/qk_tile_sweep.py [--out figures/qk_tile_sweep.json] [--budget 270]

``--budget`` (seconds) is shared between the problems; each tries configurations in the order
below until its share is spent, so a short budget sweeps fewer of them (the JSON lists which).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import pathlib
import sys
import time

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import (QKProblem, QKVProblem, _liger_qk, copy_bandwidth_gbps,  # noqa: E402
                                provenance, time_ms)

qk = importlib.import_module("rope_kernels.rope_qk")


def cache_call(p, backward=False):
    q, k = (p.tokens(p.gq), p.tokens(p.gk)) if backward else (p.tokens(p.q), p.tokens(p.k))
    return lambda: qk.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache,
                                         backward=backward)


def hf_call(p):
    q, k = p.q.transpose(1, 2), p.k.transpose(1, 2)
    return lambda: qk.rope_cos_sin(q, k, p.cos, p.sin, 1)


def qkv_call(p):
    return lambda: qk.rope_qkv(p.qkv, p.freqs, p.freqs, p.splits, "sbhd")


PROBLEMS = [
    ("cache bf16 32q/8k", lambda: QKProblem(), cache_call),
    ("cache bf16 16q/4k", lambda: QKProblem(heads=16, k_heads=4), cache_call),
    ("cache bf16 d64", lambda: QKProblem(head_dim=64), cache_call),
    ("cache bf16 batch 1", lambda: QKProblem(batch=1, seq_len=16384), cache_call),
    ("cache fp32 32q/8k", lambda: QKProblem(dtype="fp32"), cache_call),
    ("cache bf16 32q/8k backward", lambda: QKProblem(), lambda p: cache_call(p, True)),
    ("hf bf16 32q/8k", lambda: QKProblem(), hf_call),
    ("hf bf16 16q/4k", lambda: QKProblem(heads=16, k_heads=4), hf_call),
    ("qkv bf16 8 groups x 4q", lambda: QKVProblem(), qkv_call),
    ("qkv bf16 32 groups x 1q", lambda: QKVProblem(heads=32, q_per_group=1), qkv_call),
]

def configs_for(p) -> list:
    """The configurations tried on problem ``p``: programs of one head block, and programs of all
    heads with k's blocks sized to k (head blocks of 2 KB, or all of q in one block)."""
    k_heads = getattr(p, "k_heads", p.heads)  # fused QKV: one k head per group
    q_heads = p.heads * getattr(p, "n_q", 1)
    full_q = triton.next_power_of_2(q_heads)
    configs = [dict(block_s=s, block_h=h, block_hk=min(h, triton.next_power_of_2(k_heads)),
                    num_warps=w, all_heads=True)
               for s, h, w in itertools.product([1, 2], sorted({4, 8, 16, full_q}), [2, 4, 8])]
    configs += [dict(block_s=s, block_h=h, num_warps=w, all_heads=False)
                for s, h, w in itertools.product([1, 2, 4, 8], [4, 8], [2, 4])]
    return configs


def fraction(p, make, config, copy_gbps):
    """Fraction of copy bandwidth of rope_qk on problem ``p`` with ``config`` (None: default)."""
    default = qk.default_config
    qk._PLANS.clear()
    if config is not None:
        qk.default_config = lambda *args, **kwargs: dict(config)
    try:
        fn = make(p)
        fn()
        return p.nbytes / time_ms(fn) / 1e6 / copy_gbps
    finally:
        qk.default_config = default
        qk._PLANS.clear()


def _label(c: dict) -> str:
    return (f"(s{c['block_s']} h{c['block_h']} hk{c.get('block_hk', c['block_h'])} "
            f"w{c['num_warps']}{' all' if c['all_heads'] else ''})")


def _default_of(p, make) -> dict:
    """The configuration default_config chose for ``p`` (read back from the plan it built)."""
    qk._PLANS.clear()
    make(p)()
    (plan,) = qk._PLANS.values()
    c = plan.constexprs
    qk._PLANS.clear()
    return dict(block_s=c["BLOCK_S"], block_h=c["BLOCK_H"], block_hk=c["BLOCK_HK"],
                num_warps=plan.num_warps, all_heads=c["ALL_HEADS"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--budget", type=float, default=270.0)
    args = parser.parse_args(argv)
    copy_gbps = copy_bandwidth_gbps()
    liger = _liger_qk()
    start = time.time()
    results = []
    for i, (name, make_problem, make) in enumerate(PROBLEMS):
        p = make_problem()
        row = dict(problem=name, default=fraction(p, make, None, copy_gbps), configs=[])
        if liger is not None and name.startswith("cache") and "backward" not in name:
            row["liger"] = p.nbytes / time_ms(liger(p, "forward")) / 1e6 / copy_gbps
        element_size = (p.q if hasattr(p, "q") else p.qkv).element_size()
        share = (args.budget - (time.time() - start)) / (len(PROBLEMS) - i)
        t0 = time.time()
        for config in configs_for(p):
            if not 1024 <= config["block_s"] * config["block_h"] * p.head_dim * element_size <= 32768:
                continue
            if time.time() - t0 > share:
                break
            row["configs"].append(dict(config, frac=fraction(p, make, config, copy_gbps)))
        row["default_config"] = _default_of(p, make)
        best = sorted(row["configs"], key=lambda c: -c["frac"])[:3]
        print(f"{name:28s} default {row['default']:.3f} {_label(row['default_config'])}  "
              f"liger {row.get('liger', float('nan')):.3f}  best "
              + ", ".join(f"{c['frac']:.3f} {_label(c)}" for c in best), flush=True)
        results.append(row)
        del p
        torch.cuda.empty_cache()
    record = dict(provenance=provenance(copy_gbps, "qk_tile_sweep"), problems=results)
    record["provenance"]["command"] = "python scripts/qk_tile_sweep.py"
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
