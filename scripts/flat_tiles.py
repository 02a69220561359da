"""rope_2d's and rope_qk's whole-row 2-D tiles against the 3-D tiles before them (GPU only).

    mkdir -p /tmp/before && for f in rope_2d rope_qk; do
        git show b16f619:rope_kernels/$f.py > /tmp/before/$f.py; done
    python scripts/flat_tiles.py --before /tmp/before [--out figures/flat_tiles_h200_triton36.json]

Until b16f619 a program of ``rope_2d`` held its tile as [BLOCK_S, BLOCK_B*BLOCK_H, channels] and
one of ``rope_qk`` (whole rows) as [BLOCK_S, BLOCK_H, channels], with the positions' cos/sin
[BLOCK_S, channels] broadcast over the middle axis. Triton 3.6 gives each thread rows of one
position and keeps cos/sin in registers; Triton 3.7 spreads the threads over the middle axis, so
cos/sin move through shared memory (barriers, up to 96 registers) to meet them. The tiles are
now 2-D, [ROWS, channels] with positions fastest, and cos/sin are broadcast to the rows
(``_per_row`` in both files): the same arithmetic on the same values.

Both sides are launched as the package launches (its thin launch), at their default configs;
``same_bits`` says whether they agree bit for bit, each computed on NaN-filled memory (they must). Shuffled rounds
(``bench.shuffled_rounds``), medians as a fraction of the run's 2 GB copy; problems under
200 MB timed with the host kept ahead (``bench.time_ms_host_ahead``). Bytes as the benchmark
counts them. Run it once per Triton version (the figures hold one file each).
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

from rope_kernels import rope_qk  # noqa: E402
from rope_kernels.bench import (Problem, QKProblem, QKVProblem, copy_bandwidth_gbps,  # noqa: E402
                                provenance)

sys.path.insert(0, str(ROOT / "scripts"))
from qk_table_hint import hf_call, medians, module_copy, qkv_call  # noqa: E402

rope_2d = sys.modules["rope_kernels.rope_2d"]  # the package exports the function

# TE-style kernel: name -> bench.Problem arguments (bf16, 4096 x 16 x 32 x 128 unless said);
# "in_place" rotates a copy of t in place
TE_SHAPES = {
    "sbhd": {}, "sbhd head_dim 64": dict(head_dim=64), "sbhd 8 heads": dict(heads=8),
    "sbhd batch 1": dict(batch=1), "sbhd fp32": dict(dtype="fp32"),
    "sbhd half rotary": dict(rotary_percent=0.5), "sbhd fp16 s1024": dict(dtype="fp16", seq_len=1024),
    "sbhd head_dim 256": dict(head_dim=256, heads=16), "sbhd interleaved": dict(interleaved=True),
    "bshd": dict(tensor_format="bshd"), "bshd head_dim 64": dict(tensor_format="bshd", head_dim=64),
    "bshd 8 heads": dict(tensor_format="bshd", heads=8), "bshd batch 1": dict(tensor_format="bshd", batch=1),
    "bshd batch 4": dict(tensor_format="bshd", batch=4),
    "bshd half rotary": dict(tensor_format="bshd", rotary_percent=0.5),
    "bshd fp32": dict(tensor_format="bshd", dtype="fp32"),
    "bshd s8192": dict(tensor_format="bshd", seq_len=8192),
    "bshd head_dim 256": dict(tensor_format="bshd", head_dim=256, heads=16),
    "bshd in place": dict(tensor_format="bshd", in_place=True),
    "bshd 8 heads in place": dict(tensor_format="bshd", heads=8, in_place=True),
    "bshd interleaved fp32": dict(tensor_format="bshd", interleaved=True, dtype="fp32"),
    "thd 16 seqs": dict(tensor_format="thd", n_seqs=16),
    "thd 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
    "thd 16384 x 8, 8 heads": dict(tensor_format="thd", seq_len=8, batch=16384, heads=8),
    "thd 64 seqs, 8 heads": dict(tensor_format="thd", seq_len=4096, batch=32, heads=8, n_seqs=64),
}
# q+k kernel, whole rows: Hugging Face's partial rotary (transposed results; QKProblem, half the
# head rotated unless said) and fused QKV in 16-bit (QKVProblem)
HF_SHAPES = {
    "half rotary": {}, "half rotary fp16": dict(dtype="fp16"),
    "half rotary fp32": dict(dtype="fp32"), "quarter rotary": dict(rotary_percent=0.25),
    "16q/4k": dict(heads=16, k_heads=4), "64q/8k, batch 8": dict(heads=64, batch=8),
    "head_dim 64": dict(head_dim=64), "1024 tokens": dict(seq_len=1024), "batch 1": dict(batch=1),
}
QKV_SHAPES = {
    "8 groups x 4 q": {}, "64 groups x 4 q, 2 x 2048": dict(heads=64, batch=2, seq_len=2048),
    "8 groups x 1 q, batch 8": dict(q_per_group=1, batch=8),
    "half rotary": dict(rotary_percent=0.5), "fp16": dict(dtype="fp16"),
}


def poisoned(call):
    """``call()``'s results, with the caching allocator's free blocks filled with NaN first, so
    that a result it did not write shows (a fresh block may hold an equal earlier result)."""
    torch.cuda.empty_cache()  # free cached blocks (which may hold old results) go back first
    free = torch.cuda.mem_get_info()[0]
    block = torch.full((max(free // 4 - (1 << 28), 0),), float("nan"), device="cuda")
    del block
    out = call()
    return (out,) if torch.is_tensor(out) else tuple(out)


def same_bits(new, old) -> bool:
    """Both sides' results, each computed on NaN-filled memory, equal bit for bit (same strides)
    and free of NaN (the inputs have none)."""
    a, b = poisoned(new), poisoned(old)
    return all(torch.equal(x, y) and x.stride() == y.stride() and not x.isnan().any().item()
               for x, y in zip(a, b))


def te_calls(module, p: Problem, backward: bool, in_place: bool):
    """(checked call, timed call): in place, the checked call rotates a copy of the input and the
    timed one the same buffer again and again."""
    x = p.grad if backward else p.t

    def call():
        out = x.clone() if in_place else None
        return module.rope_2d(x if out is None else out, p.freqs, p.tensor_format,
                              interleaved=p.interleaved, cu_seqlens=p.cu_seqlens,
                              backward=backward, out=out)
    if not in_place:
        return call, call
    buf = x.clone()

    def timed():
        return module.rope_2d(buf, p.freqs, p.tensor_format, interleaved=p.interleaved,
                              cu_seqlens=p.cu_seqlens, backward=backward, out=buf)
    return call, timed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=pathlib.Path, required=True,
                        help="folder with the rope_2d.py and rope_qk.py of the commit before")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    before_2d = module_copy("rope_2d_before", args.before / "rope_2d.py")  # thin launch too
    before_qk = module_copy("rope_qk_before", args.before / "rope_qk.py")
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "flat_tiles"), "rounds": args.rounds,
              "te": {}, "hf_transposed": {}, "fused_qkv": {}}
    result["provenance"]["command"] = "python scripts/flat_tiles.py --before DIR"
    start = time.time()

    def record(part, name, direction, fns, nbytes, bits):
        row = medians(fns, nbytes, copy, args.rounds)
        row["ratio"] = round(row["2-D tiles"] / row["3-D tiles"], 4)
        row["same_bits"] = bits
        result[part].setdefault(name, {})[direction] = row
        print(f"{part:13s} {name:26s} {direction:8s} {row}  [{time.time() - start:.0f} s]",
              flush=True)

    for name, kw in TE_SHAPES.items():
        kw = dict(kw)
        in_place = kw.pop("in_place", False)
        p = Problem(**kw)
        for direction in ("forward", "backward"):
            bw = direction == "backward"
            new, new_timed = te_calls(rope_2d, p, bw, in_place)
            old, old_timed = te_calls(before_2d, p, bw, in_place)
            record("te", name, direction, {"2-D tiles": new_timed, "3-D tiles": old_timed},
                   p.nbytes, same_bits(new, old))
        del p
        torch.cuda.empty_cache()

    def half_rotary(**kw):
        return QKProblem(**dict(dict(rotary_percent=0.5), **kw))

    for part, shapes, problem, call in (("hf_transposed", HF_SHAPES, half_rotary, hf_call),
                                        ("fused_qkv", QKV_SHAPES, QKVProblem, qkv_call)):
        for name, kw in shapes.items():
            p = problem(**kw)
            for direction in ("forward", "backward"):
                bw = direction == "backward"
                record(part, name, direction,
                       {"2-D tiles": call(rope_qk, p, bw), "3-D tiles": call(before_qk, p, bw)},
                       p.nbytes, same_bits(call(rope_qk, p, bw), call(before_qk, p, bw)))
            del p
            torch.cuda.empty_cache()

    rows = [r for part in ("te", "hf_transposed", "fused_qkv")
            for shape in result[part].values() for r in shape.values()]
    print(f"2-D / 3-D tiles {min(r['ratio'] for r in rows):.3f} .. "
          f"{max(r['ratio'] for r in rows):.3f}; same bits everywhere: "
          f"{all(r['same_bits'] for r in rows)}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
