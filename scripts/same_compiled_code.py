"""Whether two versions of ``rope_qk.py`` compile the benchmark's q+k plans to the same machine
code (no GPU needed).

    python scripts/same_compiled_code.py --before REV [--capability 90]

A change to the kernel file that only adds branches behind constexprs a recorded plan does not
take (a new ``ANGLES`` value, say) should leave the recorded figures standing; this says whether
it does. It loads the file at git revision REV and the working tree's as modules of their own,
with Triton's interpreter off, plans each call below on meta tensors as for a CUDA GPU (the
tiles and constexprs the entry points choose there), compiles both files' launches for
``sm_<capability>`` through the stand-in driver of ``tests/test_compiled_tiles.py`` (nothing is
launched) and compares the plans and the SASS (``cuobjdump -sass``). Calls: the cos/sin cache
(half-split and interleaved pairs, the whole head and half of it rotated, out of place and in
place, forward and backward), Hugging
Face's functions (Llama's, Cohere's, GLM's; the whole head and half of it; in place), fused QKV
(half-split, interleaved), FlashInfer's ``rope_pos_ids`` (both pairings, the whole head and half
of it, forward, backward and in place; where both files have it), at the benchmark's q+k shape (16 x 4096 tokens, 32 q / 8 k heads of
128) and at head_dim 64 with 16 q / 4 k heads, in bf16 and fp32. Prints one line per launch
and exits 1 if any differs.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_compiled_tiles import compile_qk, cuobjdump, gpu_launch, load_compiled, meta  # noqa: E402


def calls(qk, dtype, hq, hk, d):
    """name -> a call of ``qk``'s entry points on meta tensors (one launch each)."""
    b, s = 16, 4096
    tokens = b * s
    positions = meta(tokens, dtype=torch.int64)
    q, k = meta(tokens, hq * d, dtype=dtype), meta(tokens, hk * d, dtype=dtype)
    hq_view = meta(b, s, hq, d, dtype=dtype).transpose(1, 2)
    hk_view = meta(b, s, hk, d, dtype=dtype).transpose(1, 2)
    qkv = meta(s, 8, 8, 6 * d, dtype=dtype)
    freqs = meta(s, 1, 1, d, dtype=torch.float32)
    out = {}
    for neox in (True, False):
        pairs = "half-split" if neox else "interleaved"
        for rotary_dim in (d, d // 2):
            cache = meta(4096, rotary_dim, dtype=torch.float32)
            name = f"cache {pairs} rotary {rotary_dim}"
            for backward in (False, True):
                step = "backward" if backward else "forward"
                out[f"{name} {step}"] = lambda cache=cache, neox=neox, backward=backward: (
                    qk.rope_cos_sin_cache(positions, q, k, d, cache, neox, backward=backward))
            out[f"{name} in place"] = lambda cache=cache, neox=neox: qk.rope_cos_sin_cache(
                positions, q, k, d, cache, neox, query_out=q, key_out=k)
        out[f"fused qkv {pairs}"] = lambda neox=neox: qk.rope_qkv(
            qkv, freqs, freqs, (4 * d, d, d), "sbhd", None, not neox)
    if hasattr(qk, "rope_pos_ids"):  # FlashInfer's positions, the angles computed (ANGLES 5)
        q3, k3 = meta(tokens, hq, d, dtype=dtype), meta(tokens, hk, d, dtype=dtype)
        for interleave in (False, True):
            for rotary_dim in (d, d // 2):
                inv_freq = meta(rotary_dim // 2, dtype=torch.float32)
                name = (f"pos_ids {'interleaved' if interleave else 'half-split'} rotary "
                        f"{rotary_dim}")
                for backward in (False, True):
                    step = "backward" if backward else "forward"
                    out[f"{name} {step}"] = (
                        lambda inv_freq=inv_freq, interleave=interleave, backward=backward:
                        qk.rope_pos_ids(positions, q3, k3, inv_freq, interleave,
                                        backward=backward))
                out[f"{name} in place"] = lambda inv_freq=inv_freq, interleave=interleave: (
                    qk.rope_pos_ids(positions, q3, k3, inv_freq, interleave, q_out=q3,
                                    k_out=k3))
    for pairs in ("half", "interleaved", "glm"):
        for rotary_dim in (d, d // 2):
            if pairs == "interleaved" and rotary_dim != d:
                continue
            cos = meta(1, s, rotary_dim, dtype=dtype)
            for backward in (False, True):
                step = "backward" if backward else "forward"
                out[f"hf {pairs} rotary {rotary_dim} {step}"] = (
                    lambda cos=cos, pairs=pairs, backward=backward: qk.rope_cos_sin(
                        hq_view, hk_view, cos, cos, 1, backward=backward, pairs=pairs))
            out[f"hf {pairs} rotary {rotary_dim} in place"] = lambda cos=cos, pairs=pairs: (
                qk.rope_cos_sin(hq_view, hk_view, cos, cos, 1, pairs=pairs, q_out=hq_view,
                                k_out=hk_view))
    return out


def shared(plan, other) -> dict:
    """``plan``'s constexprs but those ``other`` lacks whose value is off (False or 0): a
    constexpr one file adds that the other's code does not know, off, leaves the plan the same
    (the SASS says whether the code is)."""
    return {k: v for k, v in plan.constexprs.items() if k in other.constexprs or v}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision of the other rope_qk.py")
    parser.add_argument("--capability", type=int, default=90)
    args = parser.parse_args(argv)
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{args.before}:rope_kernels/rope_qk.py"],
        capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        before_path = pathlib.Path(tmp) / "rope_qk_before.py"
        before_path.write_text(source)
        before = load_compiled(before_path, "rope_qk_before")
        after = load_compiled(ROOT / "rope_kernels" / "rope_qk.py", "rope_qk_after")
        differ = 0
        for dtype in (torch.bfloat16, torch.float32):
            for hq, hk, d in ((32, 8, 128), (16, 4, 64)):
                both = [calls(m, dtype, hq, hk, d) for m in (before, after)]
                for name in both[0]:
                    if name not in both[1]:  # a call the older file does not have
                        continue
                    launches = [gpu_launch(m, made[name]) for m, made in zip((before, after), both)]
                    (plan_b, ptrs_b), (plan_a, ptrs_a) = launches
                    same_plan = (plan_b.grid, plan_b.scalars, shared(plan_b, plan_a),
                                 plan_b.num_warps, ptrs_b) == (plan_a.grid, plan_a.scalars,
                                                               shared(plan_a, plan_b),
                                                               plan_a.num_warps, ptrs_a)
                    sass = [cuobjdump(compile_qk(m, launch, args.capability), "-sass")
                            for m, launch in zip((before, after), launches)]
                    same = same_plan and sass[0] == sass[1]
                    differ += not same
                    print(f"{'same   ' if same else 'DIFFERS'} {str(dtype)[6:]:8s} {hq}q/{hk}k "
                          f"d{d:<4d} {name}" + ("" if same_plan else " (plan)"), flush=True)
    print(f"{differ} of the launches differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
