"""The cos/sin cache's and Hugging Face's q+k calls at models' head counts: the tiles of
``rope_qk.HEAD_COUNT_TILES`` against the rules before them (GPU only).

    python scripts/qk_head_counts.py [--out figures/qk_head_counts_h200.json] [--rounds 5]
    git show 06fe1c9:rope_kernels/rope_qk.py > /tmp/rope_qk_06fe1c9.py
    python scripts/qk_head_counts.py --before /tmp/rope_qk_06fe1c9.py --only SHAPE,... \
        [--out figures/qk_head_counts_more_h200.json]
    git show 683f4f5:rope_kernels/rope_qk.py > /tmp/rope_qk_683f4f5.py
    python scripts/qk_head_counts.py --before /tmp/rope_qk_683f4f5.py --only SHAPE,... \
        [--out figures/qk_model_shapes_h200.json]
    git show 7b5d384:rope_kernels/rope_qk.py > /tmp/rope_qk_7b5d384.py
    python scripts/qk_head_counts.py --before /tmp/rope_qk_7b5d384.py --only SHAPE,... \
        [--out figures/qk_gathered_partners_h200.json]
    python scripts/qk_head_counts.py --before /tmp/rope_qk_0ba0055.py --only SHAPE,... \
        [--out figures/qk_gathered_one_warp_h200.json]
    python scripts/qk_head_counts.py --before /tmp/rope_qk_1a3db4f.py --only SHAPE,... \
        [--out figures/qk_transposed_one_warp_h200.json]
    python scripts/qk_head_counts.py --before /tmp/rope_qk_f999b0f.py --only SHAPE,... \
        --modes "cache out of place,cache backward" [--out figures/qk_positions_first_h200.json]
    python scripts/qk_head_counts.py --before /tmp/rope_qk_5a683c8.py --only SHAPE,... \
        --modes "cache out of place,cache backward" [--out figures/qk_few_k_gathered_h200.json]
    python scripts/qk_head_counts.py --before /tmp/rope_qk_cae2b94.py --only SHAPE,... \
        --modes "hf,hf backward" [--out figures/qk_few_k_transposed_h200.json]

The q+k tile rules were measured at head counts that are powers of two (the benchmark's 32 q / 8
k, 16 / 4, 32 / 32, 64 / 8). Models bring others: NanoChat's 10 / 10, Qwen2.5's 14 / 2, 28 / 4
and 40 / 8, Llama 2 13B's 40 / 40, Phi-3 medium's 40 / 10. There the rules' head blocks of 8 or
16 leave part of a block masked, or their loads-first programs run on 4 warps where 2 move more.
``rope_qk._head_count_tile`` gives 16-bit half-split calls with the whole head rotated, at
head_dim 64 and 128, the tiles a probe found best at such counts (``default_config``). The
third recording takes more models' shapes against the tiles of 683f4f5: few k heads
(``FEW_K_HEAD_TILES``), part of the head rotated with rotary_dim not a multiple of 16
(``PASS_AS_ROWS``), padded rows in Hugging Face's partial rotary (``PADDED_TRANSPOSED_PAIRS``)
and a quarter of 128 B rows through the cache (``PARTIAL_128B_CACHE_TILES``). The fourth takes
the calls whose rotary_dim is not a multiple of 16, in bf16, fp16 and float32, against the tiles
of 7b5d384 (the pairs with the channels past rotary_dim as whole rows, ``PASS_ROWS``): whole
rows with the partners gathered in registers (``GATHERED_PARTNERS``). The fifth takes those
calls' tiles on 1 warp (``GATHERED_ONE_WARP_TILES``) against the tiles of 0ba0055, at five of the
probe's shapes and seven held out. The sixth takes Hugging Face's call on them from 8 q heads and
at rows of 320 B against the tiles of 1a3db4f (``figures/qk_transposed_one_warp_h200.json``).
The seventh takes the cache's gathered calls on 2 warps, out of place forward and backward, with
the positions' load issued before the tile's (``GATHERED_POSITIONS_FIRST``) against f999b0f: its
first run (``figures/qk_positions_first_h200_run1.json``, code of 347a1f6) took every such tile,
after which the rule took tiles of 4 tokens or more, recorded with six shapes held out
(``figures/qk_positions_first_h200.json``). The eighth takes the cache's gathered calls with few k
heads, 8 tokens x 4 q heads with k's blocks of its own heads (``FEW_K_HEAD_GATHERED_BLOCKS``),
against 5a683c8, with six shapes held out: its first run (``..._run1.json``, code of 982f601) had
rows of 256 B (held out) behind, after which those kept their tile, recorded with two more shapes
held out (``figures/qk_few_k_gathered_h200.json``). The ninth takes Hugging Face's gathered calls
with 1 or 2 k heads on tiles of their own by row size, k's blocks of its own heads
(``FEW_K_TRANSPOSED_TILES``), against cae2b94, with eleven shapes held out.

Both sides are ``rope_kernels/rope_qk.py``: as imported, and a second copy loaded as its own module
with ``HEAD_COUNT_TILES = False`` (``--before PATH``: the rope_qk.py at PATH instead, an earlier
revision's, as the second recording compares the rules' later cases with the first's), both launched
through the package's thin launch. Per shape (``SHAPES``: bf16, 16 x 4096 tokens unless said) and
call (``MODES``: Hugging Face's function on the ``[b, h, s, d]`` views models hand over, forward and
backward; the cos/sin cache out of place and in place; ``--modes`` picks others, the cache's
backward among them): both sides' results within a unit in the last place of each other (another
tile may fuse a multiply-add where this one does not; the largest difference is recorded), each
in-place result equal to the same side's out-of-place one, then shuffled rounds
(``bench.shuffled_rounds``; under 200 MB with the host kept ahead of the GPU), medians as a fraction
of the run's 2 GB copy, bytes as the benchmark counts them. Calls whose plan the rule leaves alone
are timed too, marked ``(same plan)``: the rule must not reach the benchmark's head counts (32 q / 8
k and 16 q / 4 k at head_dim 128, 32 q / 8 k at 64), and does not.
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

from rope_kernels import _launch  # noqa: E402
from rope_kernels import rope_qk  # noqa: E402
from rope_kernels.bench import QKProblem, copy_bandwidth_gbps, provenance  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from qk_table_hint import MODES as CALL_MODES  # noqa: E402
from qk_table_hint import calls, flag_off_copy, medians, module_copy  # noqa: E402
from qk_words_hd64 import largest_difference, plan_of  # noqa: E402

# name -> QKProblem arguments (bf16, 16 x 4096 tokens, head_dim 128 unless said)
SHAPES = {
    "10q/10k": dict(heads=10, k_heads=10), "12q/12k": dict(heads=12, k_heads=12),
    "8q/8k": dict(heads=8, k_heads=8), "16q/8k": dict(heads=16, k_heads=8),
    "20q/20k": dict(heads=20, k_heads=20), "24q/8k": dict(heads=24, k_heads=8),
    "28q/4k": dict(heads=28, k_heads=4), "32q/4k": dict(heads=32, k_heads=4),
    "40q/8k": dict(heads=40, k_heads=8), "40q/10k": dict(heads=40, k_heads=10),
    "40q/40k": dict(heads=40, k_heads=40), "56q/8k": dict(heads=56, k_heads=8),
    "20q/20k batch 2": dict(heads=20, k_heads=20, batch=2),
    "10q/10k batch 4": dict(heads=10, k_heads=10, batch=4),
    "28q/4k 1024 tokens": dict(heads=28, k_heads=4, seq_len=1024),
    "20q/20k fp16": dict(heads=20, k_heads=20, dtype="fp16"),
    "hd64 14q/2k": dict(heads=14, k_heads=2, head_dim=64),
    "hd64 12q/12k": dict(heads=12, k_heads=12, head_dim=64),
    "hd64 24q/8k": dict(heads=24, k_heads=8, head_dim=64),
    "hd64 28q/4k": dict(heads=28, k_heads=4, head_dim=64),
    "hd64 40q/8k": dict(heads=40, k_heads=8, head_dim=64),
    "hd64 40q/40k": dict(heads=40, k_heads=40, head_dim=64),
    "hd64 64q/8k": dict(heads=64, k_heads=8, head_dim=64),
    "hd64 14q/2k batch 4": dict(heads=14, k_heads=2, head_dim=64, batch=4),
    "hd64 9q/3k": dict(heads=9, k_heads=3, head_dim=64),
    "hd64 15q/5k": dict(heads=15, k_heads=5, head_dim=64),
    "hd96 32q/32k": dict(heads=32, k_heads=32, head_dim=96),
    "hd96 32q/8k": dict(heads=32, k_heads=8, head_dim=96),
    "hd96 16q/16k": dict(heads=16, k_heads=16, head_dim=96),
    "hd96 32q/32k batch 4": dict(heads=32, k_heads=32, head_dim=96, batch=4),
    # few k heads (multi-query: Falcon 7B's 71 / 1; StarCoder2 3B's 24 / 2)
    "hd64 71q/1k": dict(heads=71, k_heads=1, head_dim=64),
    "hd64 64q/1k": dict(heads=64, k_heads=1, head_dim=64),
    "hd64 48q/2k": dict(heads=48, k_heads=2, head_dim=64),
    "32q/1k": dict(heads=32, k_heads=1), "24q/2k": dict(heads=24, k_heads=2),
    # part of the head rotated: rotary_dim not a multiple of 16 (Pythia 2.8B's and StableLM 3B's
    # 20 of 80, GPT-NeoX 20B's 24 of 96, StableLM 2 12B's 40 of 160), rows padded (Phi-2's 32 of
    # 80), a quarter of 64 (StableLM 2 1.6B's, Pythia 410M's)
    "hd80 32q/32k rot20": dict(heads=32, k_heads=32, head_dim=80, rotary_percent=0.25),
    "hd96 64q/64k rot24 batch 8": dict(heads=64, k_heads=64, head_dim=96, rotary_percent=0.25,
                                       batch=8),
    "hd160 32q/8k rot40": dict(heads=32, k_heads=8, head_dim=160, rotary_percent=0.25),
    "32q/8k rot24": dict(rotary_percent=0.1875),
    "hd80 32q/32k rot32": dict(heads=32, k_heads=32, head_dim=80, rotary_percent=0.4),
    "hd64 32q/32k rot16": dict(heads=32, k_heads=32, head_dim=64, rotary_percent=0.25),
    "hd64 16q/16k rot16": dict(heads=16, k_heads=16, head_dim=64, rotary_percent=0.25),
    # rotary_dim not a multiple of 16 in fp16 and float32 (the fourth recording)
    "hd80 32q/32k rot20 fp16": dict(heads=32, k_heads=32, head_dim=80, rotary_percent=0.25,
                                    dtype="fp16"),
    "hd80 32q/32k rot20 fp32 batch 8": dict(heads=32, k_heads=32, head_dim=80,
                                            rotary_percent=0.25, dtype="fp32", batch=8),
    "hd96 64q/64k rot24 fp32 batch 4": dict(heads=64, k_heads=64, head_dim=96,
                                            rotary_percent=0.25, dtype="fp32", batch=4),
    "hd160 32q/2k rot40": dict(heads=32, k_heads=2, head_dim=160, rotary_percent=0.25),
    # held out from the probe of the fifth recording (the gathered rows on 1 warp)
    "hd96 32q/8k rot24": dict(heads=32, k_heads=8, head_dim=96, rotary_percent=0.25),
    "hd112 32q/32k rot28": dict(heads=32, k_heads=32, head_dim=112, rotary_percent=0.25),
    "hd128 16q/16k rot24": dict(heads=16, k_heads=16, rotary_percent=0.1875),
    "hd80 8q/8k rot20 batch 64": dict(heads=8, k_heads=8, head_dim=80, rotary_percent=0.25,
                                      batch=64),
    "hd96 64q/64k rot24 fp16 batch 8": dict(heads=64, k_heads=64, head_dim=96,
                                            rotary_percent=0.25, dtype="fp16", batch=8),
    "hd80 32q/32k rot20 1024 tokens": dict(heads=32, k_heads=32, head_dim=80,
                                           rotary_percent=0.25, seq_len=1024),
    # the sixth recording (Hugging Face's gathered rows on 1 warp with 8 q heads, and at 320 B)
    "hd80 8q/8k rot20 fp16 batch 64": dict(heads=8, k_heads=8, head_dim=80, rotary_percent=0.25,
                                           dtype="fp16", batch=64),
    "hd128 8q/8k rot24 batch 64": dict(heads=8, k_heads=8, rotary_percent=0.1875, batch=64),
    "hd160 32q/32k rot40 batch 8": dict(heads=32, k_heads=32, head_dim=160, rotary_percent=0.25,
                                        batch=8),
    "hd160 16q/16k rot40": dict(heads=16, k_heads=16, head_dim=160, rotary_percent=0.25),
    "hd80 8q/2k rot20 batch 64": dict(heads=8, k_heads=2, head_dim=80, rotary_percent=0.25,
                                      batch=64),
    "hd96 8q/8k rot24 batch 64": dict(heads=8, k_heads=8, head_dim=96, rotary_percent=0.25,
                                      batch=64),
    "hd160 8q/8k rot40 batch 32": dict(heads=8, k_heads=8, head_dim=160, rotary_percent=0.25,
                                       batch=32),
    "hd112 12q/4k rot28 batch 32": dict(heads=12, k_heads=4, head_dim=112, rotary_percent=0.25,
                                        batch=32),
    # the seventh recording (the positions' load first in the cache's gathered calls on 2 warps)
    "hd160 8q/2k rot40 batch 32": dict(heads=8, k_heads=2, head_dim=160, rotary_percent=0.25,
                                       batch=32),
    "hd80 4q/4k rot20 batch 128": dict(heads=4, k_heads=4, head_dim=80, rotary_percent=0.25,
                                       batch=128),
    "hd96 8q/8k rot24 fp32 batch 32": dict(heads=8, k_heads=8, head_dim=96, rotary_percent=0.25,
                                           dtype="fp32", batch=32),
    # held out from the seventh's first run (after which the rule took 4 tokens a program)
    "hd96 4q/4k rot24 batch 128": dict(heads=4, k_heads=4, head_dim=96, rotary_percent=0.25,
                                       batch=128),
    "hd160 4q/1k rot40 batch 64": dict(heads=4, k_heads=1, head_dim=160, rotary_percent=0.25,
                                       batch=64),
    "hd80 8q/1k rot20 batch 64": dict(heads=8, k_heads=1, head_dim=80, rotary_percent=0.25,
                                      batch=64),
    "hd112 12q/4k rot28 fp16 batch 32": dict(heads=12, k_heads=4, head_dim=112,
                                             rotary_percent=0.25, dtype="fp16", batch=32),
    "hd80 8q/2k rot20 fp32 batch 32": dict(heads=8, k_heads=2, head_dim=80, rotary_percent=0.25,
                                           dtype="fp32", batch=32),
    "hd96 4q/4k rot24 fp32 batch 64": dict(heads=4, k_heads=4, head_dim=96, rotary_percent=0.25,
                                           dtype="fp32", batch=64),
    # the eighth: the cache's gathered calls with few k heads, k's blocks of their own (the
    # probe's shapes above and these two; held out: the six after them)
    "hd80 4q/2k rot20 batch 128": dict(heads=4, k_heads=2, head_dim=80, rotary_percent=0.25,
                                       batch=128),
    "hd96 12q/2k rot24 batch 32": dict(heads=12, k_heads=2, head_dim=96, rotary_percent=0.25,
                                       batch=32),
    "hd96 8q/1k rot24 batch 64": dict(heads=8, k_heads=1, head_dim=96, rotary_percent=0.25,
                                      batch=64),
    "hd96 8q/1k rot24 fp16 batch 64": dict(heads=8, k_heads=1, head_dim=96, rotary_percent=0.25,
                                           dtype="fp16", batch=64),
    "hd160 4q/2k rot40 batch 64": dict(heads=4, k_heads=2, head_dim=160, rotary_percent=0.25,
                                       batch=64),
    "hd128 8q/2k rot24 batch 32": dict(heads=8, k_heads=2, rotary_percent=0.1875, batch=32),
    "hd112 12q/2k rot28 batch 32": dict(heads=12, k_heads=2, head_dim=112, rotary_percent=0.25,
                                        batch=32),
    "hd80 4q/1k rot20 batch 128": dict(heads=4, k_heads=1, head_dim=80, rotary_percent=0.25,
                                       batch=128),
    # held out from the eighth's first run (after which rows of 256 B kept their tile)
    "hd112 8q/1k rot28 batch 64": dict(heads=8, k_heads=1, head_dim=112, rotary_percent=0.25,
                                       batch=64),
    "hd160 8q/1k rot40 batch 32": dict(heads=8, k_heads=1, head_dim=160, rotary_percent=0.25,
                                       batch=32),
    # the ninth: Hugging Face's gathered calls with 1 or 2 k heads (FEW_K_TRANSPOSED_TILES): the
    # probes' shapes above and these seven; held out: the eleven after them
    "hd80 16q/1k rot20 batch 32": dict(heads=16, k_heads=1, head_dim=80, rotary_percent=0.25,
                                       batch=32),
    "hd80 32q/2k rot20 batch 16": dict(heads=32, k_heads=2, head_dim=80, rotary_percent=0.25,
                                       batch=16),
    "hd96 4q/1k rot24 batch 128": dict(heads=4, k_heads=1, head_dim=96, rotary_percent=0.25,
                                       batch=128),
    "hd112 4q/1k rot28 batch 128": dict(heads=4, k_heads=1, head_dim=112, rotary_percent=0.25,
                                        batch=128),
    "hd160 16q/2k rot40 batch 16": dict(heads=16, k_heads=2, head_dim=160, rotary_percent=0.25,
                                        batch=16),
    "hd80 6q/1k rot20 batch 64": dict(heads=6, k_heads=1, head_dim=80, rotary_percent=0.25,
                                      batch=64),
    "hd160 12q/1k rot40 batch 32": dict(heads=12, k_heads=1, head_dim=160, rotary_percent=0.25,
                                        batch=32),
    "hd80 12q/1k rot20 batch 32": dict(heads=12, k_heads=1, head_dim=80, rotary_percent=0.25,
                                       batch=32),
    "hd96 6q/1k rot24 batch 64": dict(heads=6, k_heads=1, head_dim=96, rotary_percent=0.25,
                                      batch=64),
    "hd112 6q/2k rot28 batch 64": dict(heads=6, k_heads=2, head_dim=112, rotary_percent=0.25,
                                       batch=64),
    "hd112 32q/1k rot28 batch 16": dict(heads=32, k_heads=1, head_dim=112, rotary_percent=0.25,
                                        batch=16),
    "hd160 6q/1k rot40 batch 32": dict(heads=6, k_heads=1, head_dim=160, rotary_percent=0.25,
                                       batch=32),
    "hd144 8q/1k rot36 batch 32": dict(heads=8, k_heads=1, head_dim=144, rotary_percent=0.25,
                                       batch=32),
    "hd80 8q/1k rot20 fp16 batch 64": dict(heads=8, k_heads=1, head_dim=80, rotary_percent=0.25,
                                           dtype="fp16", batch=64),
    "hd96 4q/2k rot24 batch 64": dict(heads=4, k_heads=2, head_dim=96, rotary_percent=0.25,
                                      batch=64),
    "hd80 16q/2k rot20 batch 32": dict(heads=16, k_heads=2, head_dim=80, rotary_percent=0.25,
                                       batch=32),
    "hd160 32q/1k rot40 batch 8": dict(heads=32, k_heads=1, head_dim=160, rotary_percent=0.25,
                                       batch=8),
    "hd96 8q/1k rot24 batch 16": dict(heads=8, k_heads=1, head_dim=96, rotary_percent=0.25,
                                      batch=16),
    # the rule leaves these alone (the benchmark's and others)
    "32q/8k": {}, "16q/4k": dict(heads=16, k_heads=4), "16q/16k": dict(heads=16, k_heads=16),
    "12q/2k": dict(heads=12, k_heads=2), "hd64 32q/8k": dict(head_dim=64),
    "hd64 20q/20k": dict(heads=20, k_heads=20, head_dim=64),
    "32q/8k rot64": dict(rotary_percent=0.5),
    "hd64 16q/4k rot32": dict(heads=16, k_heads=4, head_dim=64, rotary_percent=0.5),
}
MODES = ("hf", "hf backward", "cache out of place", "cache in place")


def _plan_label(module, fn) -> str:
    """``plan_of``'s label of ``fn``'s plan, with ``, PASS_ROWS True`` where the plan moves the
    channels past rotary_dim as whole rows (the kernel of 683f4f5 and earlier has no such
    constexpr, that of 7b5d384 has, later ones none), ``, GATHER True`` where it gathers the
    partners in registers and ``, POSITIONS_FIRST True`` where it loads the positions before the
    tile: the same tile may run other code."""
    label = plan_of(module, fn)
    (plan,) = module._PLANS.values()
    return label + "".join(f", {name} True" for name in ("PASS_ROWS", "GATHER", "POSITIONS_FIRST")
                           if plan.constexprs.get(name))


def _in_place_result(module, p: QKProblem):
    """``module``'s in-place cache call on copies of the problem's q and k."""
    q, k = p.tokens(p.q).clone(), p.tokens(p.k).clone()
    module.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache, True, query_out=q,
                              key_out=k)
    return q, k


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", default=None,
                        help="comma-separated shape names (_ for a space)")
    parser.add_argument("--before", type=pathlib.Path, default=None,
                        help="the rope_qk.py of the side before (else HEAD_COUNT_TILES off)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated calls among {CALL_MODES}")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in CALL_MODES]
    if unknown:  # calls() takes any other name for Hugging Face's backward
        parser.error(f"--modes: {unknown} not among {CALL_MODES}")
    assert rope_qk.launch is _launch.thin_launch  # as the package runs
    if args.before is None:
        before = flag_off_copy("HEAD_COUNT_TILES")
    else:
        before = module_copy("rope_qk_before", args.before)
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_head_counts"), "rounds": args.rounds,
              "shapes": {}}
    result["provenance"]["command"] = "python scripts/qk_head_counts.py" + "".join(
        f" --{name} {value}" for name, value in (("before", args.before), ("only", args.only))
        if value is not None)
    if args.modes != ",".join(MODES):
        result["provenance"]["command"] += f' --modes "{args.modes}"'
    if args.before is not None:
        result["provenance"]["before_sha256"] = hashlib.sha256(
            args.before.read_bytes()).hexdigest()[:16]
    names = SHAPES if args.only is None else args.only.replace("_", " ").split(",")
    shapes = {name: SHAPES[name] for name in names}
    start = time.time()

    for name, kw in shapes.items():
        p = QKProblem(**kw)
        for mode in modes:
            sides = {"rule": calls(rope_qk, p, mode), "before": calls(before, p, mode)}
            tiles = {side: _plan_label(module, sides[side])
                     for side, module in (("rule", rope_qk), ("before", before))}
            if mode == "cache in place":
                out_of_place = {m: calls(m, p, "cache out of place")() for m in (rope_qk, before)}
                a, b = _in_place_result(rope_qk, p), _in_place_result(before, p)
                for m, got in ((rope_qk, a), (before, b)):
                    assert all(torch.equal(x, y) for x, y in zip(got, out_of_place[m])), (name, m)
            else:
                a, b = sides["rule"](), sides["before"]()
            worst = largest_difference(a, b, (name, mode))
            row = medians(sides, p.nbytes, copy, args.rounds)
            row["ratio"] = round(row["rule"] / row["before"], 4)
            row["mbytes"] = round(p.nbytes / 1e6, 1)
            row["max_abs_difference"] = worst
            row["tiles"] = tiles
            key = f"{name}: {mode}" + (" (same plan)" if tiles["rule"] == tiles["before"] else "")
            result["shapes"][key] = row
            print(f"{name:20s} {mode:18s} rule {row['rule']:.3f} before {row['before']:.3f} "
                  f"ratio {row['ratio']:.3f}  [{tiles['rule']}] <- [{tiles['before']}] "
                  f"[{time.time() - start:.0f} s]", flush=True)
            del a, b
        del p
        torch.cuda.empty_cache()

    ratios = [r["ratio"] for key, r in result["shapes"].items() if "same plan" not in key]
    print(f"rule / before at {len(ratios)} changed calls: {min(ratios):.3f} .. {max(ratios):.3f}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
