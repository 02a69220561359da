"""Interleaved pairs in rope_qk read as one word each, against the split tile (GPU only).

    python scripts/qk_pairs_as_words.py [--out figures/qk_pairs_as_words_h200.json] [--rounds 3]

rope_qk rotates interleaved pairs (2j, 2j+1) for the cos/sin cache with ``is_neox=False``,
Hugging Face's Cohere and GLM functions and TransformerEngine's fused QKV with
``interleaved=True``. Until this script's change it loaded each row as a ``[..., HALF, 2]`` tile
and split it in registers (``INTERLEAVED`` 1). Where every row of q and k starts at an even
element with its channels contiguous (the layouts models produce), it now reads and writes a
pair as one 32-bit word (64-bit in float32), as rope_2d does (``INTERLEAVED`` 2), with the
tiles' shapes of the half-split pairs.

Sides, all ``rope_kernels/rope_qk.py`` launched through the package's thin launch:
- ``split``: a copy of the file whose ``_aligned`` is always False (the split tile, and the tile
  rule the split pairs had);
- ``words``: the package's file as it is (its ``default_config``);
- ``words, <s> x <h> on <w>``: a copy whose ``default_config`` returns that tile (tokens x heads,
  one head block a program, warps);
- ``words, half-split rules``: a copy whose ``default_config`` is asked as for half-split pairs.

Every side is checked to give the split side's values within a unit in the last place (a tile
may fuse a multiply-add where another does not; the largest difference is recorded). Shuffled rounds
(``bench.shuffled_rounds``), medians as a fraction of the run's 2 GB copy, bytes as the
benchmark counts them (q and k, or qkv and its outputs, read and written once, + the table's
rows once).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import _launch  # noqa: E402
from rope_kernels import rope_qk  # noqa: E402
from rope_kernels.bench import QKProblem, QKVProblem, copy_bandwidth_gbps, provenance  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from qk_table_hint import hf_call, medians, module_copy  # noqa: E402

TILES = [(1, 8, 2), (1, 8, 4), (2, 8, 2), (2, 8, 4), (4, 8, 4), (4, 8, 8), (8, 4, 4)]

# name -> (problem kind, problem arguments, call mode); bf16, 16 x 4096 tokens, 32 q / 8 k heads
# of 128 unless said.
CASES = {
    "cache": ("qk", {}, "cache"),
    "cache in place": ("qk", {}, "cache in place"),
    "cache fp16": ("qk", dict(dtype="fp16"), "cache"),
    "cache fp32": ("qk", dict(dtype="fp32"), "cache"),
    "cache 16q/4k, half rotary": ("qk", dict(heads=16, k_heads=4, rotary_percent=0.5), "cache"),
    "cache head_dim 64": ("qk", dict(head_dim=64), "cache"),
    "Cohere": ("qk", {}, "interleaved"),
    "Cohere fp32": ("qk", dict(dtype="fp32"), "interleaved"),
    "GLM": ("qk", {}, "glm"),
    "GLM half rotary": ("qk", dict(rotary_percent=0.5), "glm"),
    "fused QKV": ("qkv", {}, "qkv"),
    # more shapes, for the rule (the words side) against the half-split rules and the tiles
    "cache 32q/32k": ("qk", dict(k_heads=32), "cache"),
    "cache 64q/8k, batch 8": ("qk", dict(heads=64, batch=8), "cache"),
    "cache 8q/8k": ("qk", dict(heads=8), "cache"),
    "cache batch 1": ("qk", dict(batch=1), "cache"),
    "cache 1024 tokens": ("qk", dict(seq_len=1024), "cache"),
    "cache head_dim 256": ("qk", dict(head_dim=256, heads=16, k_heads=4), "cache"),
    "cache head_dim 64 fp32": ("qk", dict(head_dim=64, dtype="fp32"), "cache"),
    "Cohere head_dim 64": ("qk", dict(head_dim=64), "interleaved"),
    "GLM 16q/4k": ("qk", dict(heads=16, k_heads=4), "glm"),
    "fused QKV fp32": ("qkv", dict(dtype="fp32"), "qkv"),
    "fused QKV 8 groups x 1 q, batch 8": ("qkv", dict(q_per_group=1, batch=8), "qkv"),
}


def call(module, p, mode: str, backward: bool):
    """The call of ``mode`` on ``module`` for problem ``p`` (views made here, outside the timing)."""
    if mode == "qkv":
        if backward:
            return lambda: module.rope_qkv_backward(*p.grads, p.freqs, p.freqs, p.splits,
                                                    interleaved=True)
        return lambda: module.rope_qkv(p.qkv, p.freqs, p.freqs, p.splits, interleaved=True)
    q, k = (p.gq, p.gk) if backward else (p.q, p.k)
    if mode.startswith("cache"):
        q, k = p.tokens(q), p.tokens(k)
        if mode == "cache in place":  # (rotating the same tensors again each call: same work)
            return lambda: module.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache,
                                                     False, query_out=q, key_out=k,
                                                     backward=backward)
        return lambda: module.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache, False,
                                                 backward=backward)
    return hf_call(module, p, backward, pairs=mode)  # the [b, h, s, d] views models hand over


def sides() -> dict:
    split = module_copy("rope_qk_split", rope_qk.__file__)
    split._aligned = lambda *args: False
    out = {"split": split, "words": rope_qk}
    for s, h, w in TILES:
        m = module_copy(f"rope_qk_words_{s}_{h}_{w}", rope_qk.__file__)
        m.default_config = (lambda *a, s=s, h=h, w=w, **k:
                            dict(block_s=s, block_h=h, num_warps=w, all_heads=False))
        out[f"words, {s} x {h} on {w}"] = m
    half = module_copy("rope_qk_words_half_rules", rope_qk.__file__)
    real = half.default_config
    # asked as for half-split pairs (interleaved and words False)
    half.default_config = lambda *a: real(*a[:6], False, *a[7:11])
    out["words, half-split rules"] = half
    return out


def outputs(x):
    return [x] if torch.is_tensor(x) else [y for y in x if torch.is_tensor(y)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=None, help="comma-separated names (default: all)")
    args = parser.parse_args(argv)
    assert rope_qk.launch is _launch.thin_launch  # as the package runs
    modules = sides()
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_pairs_as_words"), "rounds": args.rounds,
              "cases": {}}
    result["provenance"]["command"] = "python scripts/qk_pairs_as_words.py"
    start = time.time()
    names = args.cases.split(",") if args.cases else list(CASES)
    for name in names:
        kind, kw, mode = CASES[name]
        p = QKVProblem(**kw) if kind == "qkv" else QKProblem(**kw)
        directions = ("forward",) if mode == "cache in place" else ("forward", "backward")
        for direction in directions:
            bw = direction == "backward"
            fns = {side: call(m, p, mode, bw) for side, m in modules.items()}
            if mode == "cache in place":  # values checked out of place (in place rotates again)
                checks = {side: call(m, p, "cache", bw) for side, m in modules.items()}
            else:
                checks = fns
            want = [y.float() for y in outputs(checks["split"]())]
            worst = 0.0
            for side, fn in checks.items():
                got = outputs(fn())
                for a, b in zip(got, want):
                    worst = max(worst, (a.float() - b).abs().max().item())
                    # A unit in the last place of the result or of the products (inputs of
                    # order 1): a tile may fuse a multiply-add where another does not.
                    tol = 2 * torch.finfo(a.dtype).eps * (b.abs() + 1)
                    assert ((a.float() - b).abs() <= tol).all(), (name, direction, side)
            row = medians(fns, p.nbytes, copy, args.rounds)
            row["words / split"] = round(row["words"] / row["split"], 4)
            row["max_abs_difference"] = worst
            # What the plan chose: the words side's constexprs for this call.
            rope_qk._PLANS.clear()
            fns["words"]()
            (plan,) = rope_qk._PLANS.values()
            c = plan.constexprs
            row["words tile"] = (f"{c['BLOCK_S']} x {c['BLOCK_H']} on {plan.num_warps}, "
                                 f"INTERLEAVED {c['INTERLEAVED']}, all_heads {c['ALL_HEADS']}")
            result["cases"].setdefault(name, {})[direction] = row
            best = max((v, k) for k, v in row.items() if k.startswith("words") and
                       isinstance(v, float) and k != "words / split")
            print(f"{name:28s} {direction:8s} split {row['split']:.3f} words {row['words']:.3f} "
                  f"best {best[1]} {best[0]:.3f}  [{time.time() - start:.0f} s]", flush=True)
        del p
        torch.cuda.empty_cache()
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
