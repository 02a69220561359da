"""Two rope_qk tile rules against the rules before them (GPU only).

    python scripts/qk_transposed_tiles.py [--out figures/qk_transposed_tiles_h200.json] [--rounds 7]

1. Transposed outputs. Hugging Face's partial rotary (GPT-NeoX's function) returns contiguous
   ``[b, h, s, d]`` results for the ``[b, h, s, d]`` views of ``[b, s, h, d]`` projections that
   models hand over, so the kernel reads each token's heads side by side and writes each head's
   tokens side by side. ``rope_qk.default_config`` gives such calls (``transposed``) whole rows in
   tiles of 4 tokens x 4 heads on 2 warps; "before" is the same file with ``transposed`` always
   false (the rules that chose their tiles until then). Both sides must give the same bits and
   the same result strides.
2. Fused QKV (TransformerEngine's angle tables) in 16-bit with rows of 256 B or more: whole rows on
   the pairs' tiles against the pairs.

Both sides are ``rope_kernels/rope_qk.py``: as imported, and a second copy loaded as its own
module whose ``default_config`` is wrapped, both launched through the package's thin launch.
Shuffled rounds (``bench.shuffled_rounds``), forward and backward (the kernel's backward call on
the same views), medians as a fraction of the run's 2 GB copy; problems under 200 MB are timed
with the host kept ahead of the GPU (``bench.time_ms_host_ahead``). Bytes as the benchmark counts
them.
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
# A second copy of rope_qk.py as its own module, the calls timed, medians of shuffled rounds.
from qk_table_hint import hf_call, medians, module_copy, qkv_call  # noqa: E402

# name -> QKProblem arguments (bf16, 16 x 4096 tokens, 32 q / 8 k heads of 128, half rotated
# unless said)
HF_SHAPES = {
    "half rotary": {}, "half rotary fp16": dict(dtype="fp16"),
    "half rotary fp32": dict(dtype="fp32"), "quarter rotary": dict(rotary_percent=0.25),
    "16q/4k": dict(heads=16, k_heads=4), "64q/8k, batch 8": dict(heads=64, batch=8),
    "head_dim 64": dict(head_dim=64), "head_dim 64 fp32": dict(head_dim=64, dtype="fp32"),
    "1024 tokens": dict(seq_len=1024), "batch 2": dict(batch=2), "batch 1": dict(batch=1),
    # where the rule does not apply: the same tiles as before
    "16q/2k (unchanged)": dict(heads=16, k_heads=2),
    "whole head rotated (unchanged)": dict(rotary_percent=1.0),
}
QKV_SHAPES = {
    "8 groups x 4 q": {}, "64 groups x 4 q, 2 x 2048": dict(heads=64, batch=2, seq_len=2048),
    "8 groups x 1 q, batch 8": dict(q_per_group=1, batch=8),
    "half rotary": dict(rotary_percent=0.5), "fp16": dict(dtype="fp16"),
}


def wrapped_module(name: str, wrap):
    """rope_qk.py loaded again as its own module, its default_config wrapped by ``wrap``."""
    module = module_copy(name, rope_qk.__file__)
    real = module.default_config
    module.default_config = lambda *args: wrap(real, *args)
    return module


def not_transposed(real, *args):
    return real(*args[:10])  # transposed defaults to False


def qkv_pairs(real, *args):
    return dict(real(*args), whole_rows=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    assert rope_qk.launch is _launch.thin_launch  # as the package runs
    before = wrapped_module("rope_qk_not_transposed", not_transposed)
    pairs = wrapped_module("rope_qk_qkv_pairs", qkv_pairs)
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_transposed_tiles"), "rounds": args.rounds,
              "transposed": {}, "fused_qkv": {}}
    result["provenance"]["command"] = "python scripts/qk_transposed_tiles.py"
    start = time.time()

    for name, kw in HF_SHAPES.items():
        p = QKProblem(**dict(dict(rotary_percent=0.5), **kw))
        for direction in ("forward", "backward"):
            bw = direction == "backward"
            a, b = hf_call(rope_qk, p, bw)(), hf_call(before, p, bw)()
            same = all(torch.equal(x, y) and x.stride() == y.stride() for x, y in zip(a, b))
            assert same, (name, direction)  # the same bits in the same layout
            row = medians({"new": hf_call(rope_qk, p, bw), "before": hf_call(before, p, bw)},
                          p.nbytes, copy, args.rounds)
            row["ratio"] = round(row["new"] / row["before"], 4)
            result["transposed"].setdefault(name, {})[direction] = row
            print(f"{name:30s} {direction:8s} {row}  [{time.time() - start:.0f} s]", flush=True)
        del p, a, b
        torch.cuda.empty_cache()

    for name, kw in QKV_SHAPES.items():
        p = QKVProblem(**kw)
        for direction in ("forward", "backward"):
            bw = direction == "backward"
            a, b = qkv_call(rope_qk, p, bw)(), qkv_call(pairs, p, bw)()
            a, b = (a,) if torch.is_tensor(a) else a, (b,) if torch.is_tensor(b) else b
            # 16-bit: a multiply-add may be fused differently; the formula is the same.
            worst = max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
            row = medians({"whole rows": qkv_call(rope_qk, p, bw), "pairs": qkv_call(pairs, p, bw)},
                          p.nbytes, copy, args.rounds)
            row["ratio"] = round(row["whole rows"] / row["pairs"], 4)
            row["max_abs_difference"] = worst
            result["fused_qkv"].setdefault(name, {})[direction] = row
            print(f"{name:30s} {direction:8s} {row}  [{time.time() - start:.0f} s]", flush=True)
        del p, a, b
        torch.cuda.empty_cache()

    for part in ("transposed", "fused_qkv"):
        ratios = [r["ratio"] for shape in result[part].values() for r in shape.values()]
        print(f"{part}: new / before {min(ratios):.3f} .. {max(ratios):.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
