"""In-place q+k calls with part of the head rotated: tiles for the narrowed heads, against a
streaming kernel of the same access pattern (GPU only).

    python scripts/qk_in_place_narrow_tiles.py [--out figures/qk_in_place_narrow_tiles_h200.json]
                                               [--rounds 5]

In place, rope_qk plans such a call on heads narrowed to ``rotary_dim`` (see
scripts/qk_in_place_rotated_only.py): every head is a run of ``rotary_dim`` channels, read and
written, then a gap of ``head_dim - rotary_dim`` channels left alone. Runs of 128 or 256 bytes
with gaps between them are not what the tiles of whole heads were chosen for.

At the benchmark's q+k shape (16 x 4096 tokens, 32 q / 8 k heads of 128, half rotated) and
variations (32 k heads, a quarter rotated, heads of 64, heads of 256 in bf16), forward unless
said, for Hugging Face's in-place call and the cos/sin cache in place, in shuffled rounds
(``bench.time_ms_host_ahead``, median), as fractions of the run's 2 GB copy counting the bytes
moved (the rotated channels of q and k read and written once, and the cos/sin rows):
- ``rule``: the package's default plan;
- ``before``: the tile the rules gave before ``NARROWED_ROWS`` (the flag off);
- other tiles of the narrowed plan;
- ``stream``: the best of three tiles of a kernel that only reads and writes the same runs of q
  and k in place (x * (1 + 2**-20): no load is dropped), one launch for both: what the access
  pattern allows a streaming kernel here, the ceiling to compare with;
- ``copy_same``: a contiguous copy of the same number of bytes.
Every tile's results are checked bit for bit against the out-of-place call's (``same_bits``).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import qk_in_place_rotated_only as narrowed  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402


@triton.jit
def stream_kernel(q_ptr, k_ptr, q_rows, k_rows, q_blocks, HEAD_DIM: tl.constexpr,
                  RUN: tl.constexpr, BLOCK_R: tl.constexpr):
    """Rows [q_rows or k_rows, HEAD_DIM] of q then k: the first RUN channels of each row read and
    written back scaled (a store of what was loaded could be dropped). RUN is known when the
    kernel compiles, so its masks cover whole vectors of the largest power of two dividing it (a
    power of two: no channel masked; scripts/qk_in_place_unaligned.py times other RUNs)."""
    pid = tl.program_id(0)
    r = tl.arange(0, BLOCK_R)[:, None]
    c = tl.arange(0, triton.next_power_of_2(RUN))[None, :]
    if pid < q_blocks:
        rows = pid * BLOCK_R + r
        mask = (rows < q_rows) & (c < RUN)
        ptrs = q_ptr + rows.to(tl.int64) * HEAD_DIM + c
    else:
        rows = (pid - q_blocks) * BLOCK_R + r
        mask = (rows < k_rows) & (c < RUN)
        ptrs = k_ptr + rows.to(tl.int64) * HEAD_DIM + c
    x = tl.load(ptrs, mask=mask)
    tl.store(ptrs, x * (1 + 2**-20), mask=mask)


def stream(q, k, head_dim, run, block_rows, num_warps):
    """The streaming kernel on contiguous q and k ([..., head_dim]) as one launch."""
    q_rows, k_rows = q.numel() // head_dim, k.numel() // head_dim
    q_blocks = triton.cdiv(q_rows, block_rows)
    grid = (q_blocks + triton.cdiv(k_rows, block_rows),)
    return lambda: stream_kernel[grid](q, k, q_rows, k_rows, q_blocks, HEAD_DIM=head_dim,
                                       RUN=run, BLOCK_R=block_rows, num_warps=num_warps)


TILE = narrowed._tile
TILES = {"1x8 2w": TILE(1, 8, 2), "2x16 2w": TILE(2, 16, 2), "1x8 2w rows": TILE(1, 8, 2, True),
         "2x8 2w rows": TILE(2, 8, 2, True), "4x4 2w rows": TILE(4, 4, 2, True),
         "1x16 2w rows": TILE(1, 16, 2, True)}
STREAM_TILES = ((8, 1), (16, 2), (64, 4))  # rows, warps
SETS = [  # dtype, direction, QKProblem arguments
    ("fp32", "forward", dict(rotary_percent=0.5)),
    ("fp32", "backward", dict(rotary_percent=0.5)),
    ("fp32", "forward", dict(rotary_percent=0.5, k_heads=32)),
    ("fp32", "forward", dict(rotary_percent=0.25)),
    ("fp32", "forward", dict(rotary_percent=0.5, head_dim=64, batch=32)),
    ("bf16", "forward", dict(rotary_percent=0.5)),
    ("bf16", "forward", dict(rotary_percent=0.5, head_dim=256, batch=8)),
]


def before_config(kind, p, element_size):
    """The tile of the narrowed plan without NARROWED_ROWS."""
    saved = rope_qk.NARROWED_ROWS
    rope_qk.NARROWED_ROWS = False
    try:
        return rope_qk.default_config(
            p.seq_len, p.heads, p.k_heads, p.rotary_dim, element_size, True, False,
            rope_qk.ANGLES["cos_sin" if kind == "hf" else "cache"], p.rotary_dim, True,
            narrowed=True)
    finally:
        rope_qk.NARROWED_ROWS = saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "qk_in_place_narrow_tiles_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a GPU")
        return 1
    copy = bench.copy_bandwidth_gbps()
    result = dict(provenance=bench.provenance(copy, "qk_in_place_narrow_tiles"),
                  rounds=args.rounds, timer="bench.time_ms_host_ahead, median of rounds",
                  bytes="the rotated channels of q and k read and written once + the cos/sin "
                        "rows (QKProblem.rotated_nbytes)", sets={})
    started = time.time()
    for dtype, direction, kw in SETS:
        p = bench.QKProblem(dtype, **kw)
        backward = direction == "backward"
        src_q, src_k = (p.gq, p.gk) if backward else (p.q, p.k)
        fns, same_bits, plans = {}, {}, {}
        for kind in ("hf", "cache"):
            configs = {"rule": None, "before": before_config(kind, p, src_q.element_size()),
                       **TILES}
            want = [x.clone() for x in narrowed.call(kind, p, backward,
                                                     *narrowed.views(kind, p, src_q, src_k),
                                                     out=False)]
            work_q, work_k = src_q.clone(), src_k.clone()  # the timed calls rotate these
            for name, config in configs.items():
                q, k = narrowed.views(kind, p, src_q.clone(), src_k.clone())
                plan, _ = narrowed.planned(kind, p, backward, q, k, config)  # rotates q, k once
                torch.cuda.synchronize()
                same_bits[f"{kind} {name}"] = bool(torch.equal(q, want[0])
                                                   and torch.equal(k, want[1]))
                plans[f"{kind} {name}"] = narrowed.describe(plan)
                del q, k
                q, k = narrowed.views(kind, p, work_q, work_k)
                plan, pointers = narrowed.planned(kind, p, backward, q, k, config)
                fns[f"{kind} {name}"] = (lambda plan=plan, pointers=pointers:
                                         rope_qk.launch(rope_qk.rope_qk_kernel, plan, pointers))
            del want
        work_q, work_k = src_q.clone(), src_k.clone()
        for rows, warps in STREAM_TILES:
            fns[f"stream {rows}r {warps}w"] = stream(work_q, work_k, p.head_dim, p.rotary_dim,
                                                     rows, warps)
        rounds = bench.shuffled_rounds(fns, p.rotated_nbytes, copy, args.rounds,
                                       timer=bench.time_ms_host_ahead)
        moved = {n: round(statistics.median(v), 4) for n, v in rounds.items()}
        best_stream = max((n for n in moved if n.startswith("stream")), key=moved.get)
        key = f"{dtype} {direction} " + " ".join(f"{a}={b}" for a, b in kw.items())
        result["sets"][key] = dict(
            mbytes_moved=round(p.rotated_nbytes / 1e6, 1),
            copy_same=round(bench.copy_same_bytes_gbps(p.rotated_nbytes) / copy, 4),
            stream=dict(best=best_stream, fraction=moved[best_stream]),
            rule_over_before={kind: round(moved[f"{kind} rule"] / moved[f"{kind} before"], 4)
                              for kind in ("hf", "cache")},
            rule_over_stream={kind: round(moved[f"{kind} rule"] / moved[best_stream], 4)
                              for kind in ("hf", "cache")},
            moved=dict(sorted(moved.items(), key=lambda item: -item[1])),
            spread={n: round(max(v) - min(v), 4) for n, v in rounds.items()},
            plans=plans, same_bits=same_bits)
        s = result["sets"][key]
        print(f"[{time.time() - started:.0f} s] {key}: rule/before {s['rule_over_before']}, "
              f"rule/stream {s['rule_over_stream']}, stream {moved[best_stream]}, "
              f"all bits equal: {all(same_bits.values())}", flush=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        del p, fns, src_q, src_k, work_q, work_k
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
