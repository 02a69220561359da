"""The q+k kernel's program order for transposed results against the order before it (GPU only).

    python scripts/qk_transposed_order.py [--out figures/qk_transposed_order_h200.json] [--rounds 7]

Hugging Face's partial rotary (GPT-NeoX's function, GLM's) returns contiguous ``[b, h, s, d]``
results for the ``[b, h, s, d]`` views of ``[b, s, h, d]`` projections that models hand over, so
each program reads a run of heads of each of its tokens and writes a run of tokens of each of its
heads. With head blocks as the fastest program axis (the order of every other call), programs
that run side by side write to as many heads, each far from the others in the results; with
token blocks fastest (``rope_qk.TRANSPOSED_TOKEN_BLOCKS_FASTEST``, the default since this
script) they write neighbouring tokens of the same heads. Same tiles on both sides. The package
takes that order in rows of 256 B or more only, so at head_dim 64 in 16-bit both sides take the
same plan (a control, as the whole head rotated is).

Both sides are ``rope_kernels/rope_qk.py``: as imported, and a second copy loaded as its own
module with ``TRANSPOSED_TOKEN_BLOCKS_FASTEST = False``, both launched through the package's thin
launch. Both must give the same bits and the same result strides. Shuffled rounds
(``bench.shuffled_rounds``), forward and backward (the kernel's backward call on the same views),
medians as a fraction of the run's 2 GB copy; problems under 200 MB are timed with the host kept
ahead of the GPU (``bench.time_ms_host_ahead``). Bytes as the benchmark counts them.
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

# (function, name) -> QKProblem arguments: bf16, 16 x 4096 tokens, 32 q / 8 k heads of 128, half
# the head rotated unless said. GLM's pairs are interleaved (read as words).
SHAPES = {
    ("gpt-neox", "half rotary"): {}, ("gpt-neox", "half rotary fp16"): dict(dtype="fp16"),
    ("gpt-neox", "half rotary fp32"): dict(dtype="fp32"),
    ("gpt-neox", "quarter rotary"): dict(rotary_percent=0.25),
    ("gpt-neox", "16q/4k"): dict(heads=16, k_heads=4),
    ("gpt-neox", "64q/8k, batch 8"): dict(heads=64, batch=8),
    ("gpt-neox", "head_dim 64"): dict(head_dim=64),
    ("gpt-neox", "head_dim 64 fp32"): dict(head_dim=64, dtype="fp32"),
    ("gpt-neox", "16q/2k"): dict(heads=16, k_heads=2),
    ("gpt-neox", "1024 tokens"): dict(seq_len=1024), ("gpt-neox", "batch 2"): dict(batch=2),
    ("gpt-neox", "batch 1"): dict(batch=1),
    ("glm", "half rotary"): {}, ("glm", "half rotary fp16"): dict(dtype="fp16"),
    ("glm", "half rotary fp32"): dict(dtype="fp32"), ("glm", "head_dim 64"): dict(head_dim=64),
    ("glm", "16q/4k"): dict(heads=16, k_heads=4), ("glm", "1024 tokens"): dict(seq_len=1024),
    ("glm", "batch 1"): dict(batch=1),
    # controls: results in the inputs' layout, not transposed, so the same plan on both sides
    ("gpt-neox", "whole head rotated (control)"): dict(rotary_percent=1.0),
    ("glm", "whole head rotated (control)"): dict(rotary_percent=1.0),
}
PAIRS = {"gpt-neox": "half", "glm": "glm"}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    assert rope_qk.launch is _launch.thin_launch  # as the package runs
    before = flag_off_copy("TRANSPOSED_TOKEN_BLOCKS_FASTEST")
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_transposed_order"), "rounds": args.rounds,
              "shapes": {}}
    result["provenance"]["command"] = "python scripts/qk_transposed_order.py"
    start = time.time()

    for (function, name), kw in SHAPES.items():
        p = QKProblem(**dict(dict(rotary_percent=0.5, interleaved=function == "glm"), **kw))
        pairs = PAIRS[function]
        for direction in ("forward", "backward"):
            bw = direction == "backward"
            a, b = hf_call(rope_qk, p, bw, pairs)(), hf_call(before, p, bw, pairs)()
            same = all(torch.equal(x, y) and x.stride() == y.stride() for x, y in zip(a, b))
            assert same, (function, name, direction)  # the same bits in the same layout
            row = medians({"tokens fastest": hf_call(rope_qk, p, bw, pairs),
                           "heads fastest": hf_call(before, p, bw, pairs)}, p.nbytes, copy,
                          args.rounds)
            row["ratio"] = round(row["tokens fastest"] / row["heads fastest"], 4)
            row["mbytes"] = round(p.nbytes / 1e6, 1)
            result["shapes"].setdefault(f"{function}: {name}", {})[direction] = row
            print(f"{function:8s} {name:30s} {direction:8s} {row}  [{time.time() - start:.0f} s]",
                  flush=True)
        del p, a, b
        torch.cuda.empty_cache()

    ratios = [r["ratio"] for key, shape in result["shapes"].items() if "control" not in key
              for r in shape.values()]
    print(f"tokens fastest / heads fastest {min(ratios):.3f} .. {max(ratios):.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
