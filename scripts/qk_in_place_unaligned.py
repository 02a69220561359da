"""In-place q+k calls whose rotary_dim is not a multiple of 16 (vLLM's in-place calls for GPT-NeoX
models, Hugging Face's in-place functions): the partners gathered in whole rows of the rotated
channels, against the file before (GPU only).

    git show 43b2d79:rope_kernels/rope_qk.py > /tmp/rope_qk_43b2d79.py
    python scripts/qk_in_place_unaligned.py --before /tmp/rope_qk_43b2d79.py \
        [--out figures/qk_in_place_unaligned_h200.json] [--rounds 5]

In place, rope_qk plans a call with part of the head rotated on heads narrowed to ``rotary_dim``:
each head is a run of ``rotary_dim`` channels, read and written, and the rest of the head is left
alone (neither read nor written, as vLLM's and FlashInfer's in-place kernels leave it). With
rotary_dim 20 or 24 the compiler knows neither where the pairs' second half starts nor where a
run ends to be a multiple of a vector (it learns only whether an integer argument is a multiple
of 16), and before this change every element of those runs moved alone. Now the runs are whole
rows cut at a power of two, masked at rotary_dim, the partners gathered in registers
(``IN_PLACE_GATHER``), and the kernel is told that rotary_dim is a multiple of 4 or 8
(``CHANNEL_MULTIPLE``), so that the masks cover whole vectors.

Per shape (``SHAPES``: 16 x 4096 tokens unless said) and call (``CALLS``: the cos/sin cache in
place, Hugging Face's in-place call on the ``[b, h, s, d]`` views models hand over), forward,
in shuffled rounds (``qk_table_hint.medians``), as fractions of the run's 2 GB copy counting the
bytes moved (the rotated channels of q and k read and written once, and the cos/sin rows,
``QKProblem.rotated_nbytes``):
- ``rule``: the package's rope_qk;
- ``before``: the rope_qk.py at ``--before``, loaded as its own module;
- ``stream``: the best of four tiles of a kernel that only reads and writes the same runs of q and
  k in place (x * (1 + 2**-20): no load is dropped), one launch for both, its masks at a
  compile-time rotary_dim (``qk_in_place_narrow_tiles.stream``): what the access pattern allows
  a streaming kernel here;
- ``copy_same``: a contiguous copy of the same number of bytes.
Checked before timing: each side's in-place result equal bit for bit to the rule's out-of-place
one, the channels past rotary_dim untouched.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import time

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from rope_kernels import _launch, bench, rope_qk  # noqa: E402
from qk_in_place_narrow_tiles import stream  # noqa: E402  (one launch over q and k's runs)
from qk_table_hint import medians, module_copy  # noqa: E402
from qk_words_hd64 import plan_of  # noqa: E402

# name -> QKProblem arguments (bf16, 16 x 4096 tokens unless said)
SHAPES = {
    "Pythia 2.8B hd80 32q/32k rot20": dict(heads=32, k_heads=32, head_dim=80, rotary_percent=0.25),
    "GPT-NeoX 20B hd96 64q/64k rot24 batch 8": dict(heads=64, k_heads=64, head_dim=96,
                                                    rotary_percent=0.25, batch=8),
    "hd160 32q/8k rot40": dict(heads=32, k_heads=8, head_dim=160, rotary_percent=0.25),
    "hd128 32q/8k rot24": dict(rotary_percent=0.1875),
    "hd160 32q/2k rot40": dict(heads=32, k_heads=2, head_dim=160, rotary_percent=0.25),
    "Pythia 2.8B fp16": dict(heads=32, k_heads=32, head_dim=80, rotary_percent=0.25,
                             dtype="fp16"),
    "Pythia 2.8B fp32 batch 8": dict(heads=32, k_heads=32, head_dim=80, rotary_percent=0.25,
                                     dtype="fp32", batch=8),
    "GPT-NeoX 20B fp32 batch 4": dict(heads=64, k_heads=64, head_dim=96, rotary_percent=0.25,
                                      dtype="fp32", batch=4),
}
CALLS = ("cache in place", "hf in place")
STREAM_TILES = ((16, 2), (16, 4), (32, 2), (32, 4))  # rows, warps


def call(module, p: bench.QKProblem, kind: str, q: torch.Tensor, k: torch.Tensor,
         in_place: bool = True):
    """``kind``'s call on ``module`` over q, k ([b, s, h, d] memory): the cos/sin cache on token
    rows, or Hugging Face's call on the [b, h, s, d] views; in place unless ``in_place`` is False
    (then the results are new tensors)."""
    if kind == "cache in place":
        qt, kt = p.tokens(q), p.tokens(k)
        out = dict(query_out=qt, key_out=kt) if in_place else {}
        return lambda: module.rope_cos_sin_cache(p.positions, qt, kt, p.head_dim, p.cache, True,
                                                 **out)
    qv, kv = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = p.cos[..., :p.rotary_dim], p.sin[..., :p.rotary_dim]
    out = dict(q_out=qv, k_out=kv) if in_place else {}
    return lambda: module.rope_cos_sin(qv, kv, cos, sin, 1, **out)


def plan_label(module, fn) -> str:
    """``plan_of``'s label of ``fn``'s plan on ``module``, with its ``ROW``, ``GATHER`` and
    ``CHANNEL_MULTIPLE`` (the kernel before has no CHANNEL_MULTIPLE)."""
    label = plan_of(module, fn)
    (plan,) = module._PLANS.values()
    c = plan.constexprs
    return label + "".join(f", {name} {c[name]}" for name in ("ROW", "GATHER", "CHANNEL_MULTIPLE")
                           if name in c)


def check(p: bench.QKProblem, kind: str, modules: dict) -> None:
    """Each module's in-place result equal bit for bit to the rule's out-of-place one, the
    channels past rotary_dim untouched, the rotated ones changed."""
    want = [x.transpose(1, 2) if kind == "hf in place" else x.view(p.q.shape[:2] + (-1, p.head_dim))
            for x in call(rope_qk, p, kind, p.q, p.k, in_place=False)()]
    rd = p.rotary_dim
    for name, module in modules.items():
        q, k = p.q.clone(), p.k.clone()
        call(module, p, kind, q, k)()
        for got, src, ref in ((q, p.q, want[0]), (k, p.k, want[1])):
            assert torch.equal(got[..., rd:], src[..., rd:]), (name, kind, "pass channels")
            assert not torch.equal(got[..., :rd], src[..., :rd]), (name, kind, "not rotated")
            assert torch.equal(got, ref.reshape(got.shape)), (name, kind, "bits")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True,
                        help="the rope_qk.py of the side before")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=None, help="comma-separated shape names (_ for a space)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 1
    assert rope_qk.launch is _launch.thin_launch  # as the package runs
    before = module_copy("rope_qk_before", args.before)
    copy = bench.copy_bandwidth_gbps()
    result = dict(provenance=bench.provenance(copy, "qk_in_place_unaligned"), rounds=args.rounds,
                  bytes="the rotated channels of q and k read and written once + the cos/sin "
                        "rows (QKProblem.rotated_nbytes)", calls={})
    result["provenance"]["command"] = "python scripts/qk_in_place_unaligned.py --before " + str(
        args.before) + (f" --only {args.only}" if args.only else "")
    result["provenance"]["before_sha256"] = hashlib.sha256(
        args.before.read_bytes()).hexdigest()[:16]
    names = list(SHAPES) if args.only is None else args.only.replace("_", " ").split(",")
    started = time.time()
    for name in names:
        p = bench.QKProblem(**SHAPES[name])
        for kind in CALLS:
            check(p, kind, {"rule": rope_qk, "before": before})
            # The timed calls rotate copies of q and k again and again (a rotation keeps norms).
            work_q, work_k = p.q.clone(), p.k.clone()
            fns = {"rule": call(rope_qk, p, kind, work_q, work_k),
                   "before": call(before, p, kind, work_q, work_k)}
            tiles = {side: plan_label(module, fns[side])
                     for side, module in (("rule", rope_qk), ("before", before))}
            for rows, warps in STREAM_TILES:
                fns[f"stream {rows}r {warps}w"] = stream(work_q, work_k, p.head_dim,
                                                         p.rotary_dim, rows, warps)
            moved = medians(fns, p.rotated_nbytes, copy, args.rounds)
            best_stream = max((n for n in moved if n.startswith("stream")), key=moved.get)
            row = dict(rule=moved["rule"], before=moved["before"],
                       ratio=round(moved["rule"] / moved["before"], 4),
                       stream=moved[best_stream], stream_tile=best_stream,
                       rule_over_stream=round(moved["rule"] / moved[best_stream], 4),
                       copy_same=round(bench.copy_same_bytes_gbps(p.rotated_nbytes) / copy, 4),
                       mbytes_moved=round(p.rotated_nbytes / 1e6, 1), tiles=tiles,
                       fractions=moved)
            result["calls"][f"{name}: {kind}"] = row
            print(f"[{time.time() - started:.0f} s] {name:40s} {kind:14s} rule {row['rule']:.3f} "
                  f"before {row['before']:.3f} ratio {row['ratio']:.3f} stream "
                  f"{row['stream']:.3f} copy same {row['copy_same']:.3f} [{tiles['rule']}] <- "
                  f"[{tiles['before']}]", flush=True)
            del work_q, work_k, fns
        del p
        torch.cuda.empty_cache()
    ratios = [r["ratio"] for r in result["calls"].values()]
    print(f"rule / before at {len(ratios)} calls: {min(ratios):.3f} .. {max(ratios):.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
