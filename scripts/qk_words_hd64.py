"""Cohere's and GLM's calls at head_dim 64 in 16-bit: the tiles of ``WORDS_128B_HF_TILES``
against the rules before them (GPU only).

    python scripts/qk_words_hd64.py [--out figures/qk_words_hd64_h200.json] [--rounds 7]

Hugging Face's interleaved pairings (Cohere's function, GLM's and its family's) read and write a
pair as one word (``INTERLEAVED`` 2). At head_dim 64 in 16-bit (128 B rows) with the whole head
rotated they took the half-split pairs' tile rules, which suit neither: GLM's table mode got 8
tokens x 8 heads on 4 warps, Cohere's loads first on 4 warps. ``rope_qk.WORDS_128B_HF_TILES``
(the default since this script) gives them, with the whole head rotated, loads first where q
fills 4 KB a token (on 2 warps under 2 KB of k, on 4 from 2 KB), else 2 tokens x 8 heads on 2
warps, 4 x 4 with 1-3 k heads; with part of it rotated and the results transposed (as Hugging
Face's are), GLM's call 2 tokens x 8 heads on 2 warps and either call 4 x 4 on 1 warp with 1-3 k
heads (``default_config``). The first recording (60bc0fa) covered the whole head rotated with k
under 2 KB and q at most 4 KB; this one the rule as it stands.

Both sides are ``rope_kernels/rope_qk.py``: as imported, and a second copy loaded as its own
module with ``WORDS_128B_HF_TILES = False``, both launched through the package's thin launch,
with the same views: the ``[b, h, s, d]`` views of ``[b, s, h, d]`` memory that models hand over.
The two sides must agree within a unit in the last place (another tile may fuse a multiply-add
where this one does not; the largest difference is recorded) and in their result strides.
Shuffled rounds (``bench.shuffled_rounds``), forward and backward, medians as a fraction of the
run's 2 GB copy; problems under 200 MB are timed with the host kept ahead of the GPU. Bytes as
the benchmark counts them. Controls (``CONTROLS``: calls the rule leaves alone) take the same
plan on both sides.
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
from rope_kernels.bench import QKProblem, copy_bandwidth_gbps, provenance  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from qk_table_hint import flag_off_copy, hf_call, medians  # noqa: E402

# name -> QKProblem arguments: bf16, 16 x 4096 tokens, 32 q / 8 k heads of 64, the whole head
# rotated unless said.
SHAPES = {
    "32q/8k": {}, "32q/8k fp16": dict(dtype="fp16"), "32q/4k": dict(k_heads=4),
    "32q/2k": dict(k_heads=2), "24q/8k": dict(heads=24), "16q/8k": dict(heads=16, k_heads=8),
    "16q/4k": dict(heads=16, k_heads=4), "16q/2k": dict(heads=16, k_heads=2),
    "8q/8k": dict(heads=8), "8q/2k": dict(heads=8, k_heads=2), "batch 4": dict(batch=4),
    "batch 1": dict(batch=1), "1024 tokens": dict(seq_len=1024),
    # k of 2 KB a token or more, q over 4 KB
    "32q/16k": dict(k_heads=16), "32q/32k": dict(k_heads=32), "16q/16k": dict(heads=16, k_heads=16),
    "48q/8k": dict(heads=48), "64q/8k, batch 8": dict(heads=64, batch=8),
    "64q/16k, batch 8": dict(heads=64, k_heads=16, batch=8),
    # half the head rotated (the results transposed, as Hugging Face's are)
    "half rotary": dict(rotary_percent=0.5),
    "half rotary 16q/4k": dict(heads=16, k_heads=4, rotary_percent=0.5),
    "half rotary 8q/8k": dict(heads=8, rotary_percent=0.5),
    "half rotary 8q/2k": dict(heads=8, k_heads=2, rotary_percent=0.5),
    "fp32": dict(dtype="fp32"),
}
# (function, shape) pairs the rule leaves alone, or where the rules before chose the same plan
# (Cohere's loads first on 4 warps where k fills 2 KB): the same plan on both sides.
CONTROLS = {("cohere", "half rotary"), ("cohere", "half rotary 16q/4k"),
            ("cohere", "half rotary 8q/8k"), ("cohere", "fp32"), ("glm", "fp32"),
            ("cohere", "32q/16k"), ("cohere", "32q/32k")}
PAIRS = {"cohere": "interleaved", "glm": "glm"}


def largest_difference(a, b, what) -> float:
    """The largest absolute difference between two sides' results ``a`` and ``b`` (sequences of
    tensors), after asserting that they have the same strides and agree within two units in the
    last place (another tile may fuse a multiply-add where this one does not)."""
    worst = 0.0
    for x, y in zip(a, b, strict=True):
        assert x.stride() == y.stride(), what
        diff = (x.float() - y.float()).abs()
        tol = 2 * torch.finfo(x.dtype).eps * (y.float().abs() + 1)
        assert (diff <= tol).all(), what
        worst = max(worst, diff.max().item())
    return worst


def plan_of(module, fn) -> str:
    module._PLANS.clear()
    fn()
    (plan,) = module._PLANS.values()
    c = plan.constexprs
    return (f"{c['BLOCK_S']} x {c['BLOCK_H']} on {plan.num_warps}, loads first "
            f"{c['LOADS_FIRST']}, all_heads {c['ALL_HEADS']}, INTERLEAVED {c['INTERLEAVED']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    assert rope_qk.launch is _launch.thin_launch  # as the package runs
    before = flag_off_copy("WORDS_128B_HF_TILES")
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_words_hd64"), "rounds": args.rounds,
              "shapes": {}}
    result["provenance"]["command"] = "python scripts/qk_words_hd64.py"
    start = time.time()

    for name, kw in SHAPES.items():
        p = QKProblem(**dict(dict(head_dim=64, rotary_percent=1.0), **kw))
        for function, pairs in PAIRS.items():
            for direction in ("forward", "backward"):
                bw = direction == "backward"
                a, b = hf_call(rope_qk, p, bw, pairs)(), hf_call(before, p, bw, pairs)()
                worst = largest_difference(a, b, (name, function, direction))
                row = medians({"rule": hf_call(rope_qk, p, bw, pairs),
                               "before": hf_call(before, p, bw, pairs)}, p.nbytes, copy,
                              args.rounds)
                row["ratio"] = round(row["rule"] / row["before"], 4)
                row["mbytes"] = round(p.nbytes / 1e6, 1)
                row["max_abs_difference"] = worst
                row["tiles"] = {"rule": plan_of(rope_qk, hf_call(rope_qk, p, bw, pairs)),
                                "before": plan_of(before, hf_call(before, p, bw, pairs))}
                key = f"{function}: {name}"
                if (function, name) in CONTROLS:
                    assert row["tiles"]["rule"] == row["tiles"]["before"], (name, row["tiles"])
                    key += " (control)"
                else:
                    assert row["tiles"]["rule"] != row["tiles"]["before"], (name, row["tiles"])
                result["shapes"].setdefault(key, {})[direction] = row
                print(f"{function:6s} {name:26s} {direction:8s} rule {row['rule']:.3f} before "
                      f"{row['before']:.3f} ratio {row['ratio']:.3f}  [{row['tiles']['rule']}] "
                      f"[{time.time() - start:.0f} s]", flush=True)
                del a, b
        del p
        torch.cuda.empty_cache()

    ratios = [r["ratio"] for key, shape in result["shapes"].items() if "control" not in key
              for r in shape.values()]
    print(f"rule / before {min(ratios):.3f} .. {max(ratios):.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
