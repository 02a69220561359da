"""``hf.apply_rotary_pos_emb_2d`` (the SAM family's ``apply_rotary_pos_emb_2d``) at the shapes
SAM 3's ViT and SAM 2 Video's memory attention call it with, against transformers' own
function and a copy of the same bytes (GPU only).

    python scripts/hf_sam.py [--out figures/hf_sam_h200.json] [--rounds 5]

q and k are the transposed views of ``[b, s, h, d]`` projections, cos and sin ``[1, s, d]``
float32 (the axial rotary module's, channels 2j and 2j+1 at one angle), bf16:

- ``sam3 vit window``: SAM 3's ViT (``Sam3ViTConfig``'s defaults: 16 heads of 64, windows of 24 x
  24 patches) at 8 images of 1008 x 1008 pixels: 72 windows of 576 tokens; q and k in one launch;
- ``sam3 vit global``: its global layers at the same 8 images: 5184 tokens;
- ``sam2 video memory``: SAM 2 Video's memory attention's cross-attention (its config's
  defaults: one head of 256, a 64 x 64 feature map) for 8 objects: q of 4096 tokens, k the
  memory of 7 frames (``repeat_freqs_k``) and 64 object-pointer tokens passed through
  (``num_k_exclude_rope``): q and k apart, the angles repeated, k's passed tokens concatenated
  as transformers' function does.

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds, and
again with ``bench.time_ms_host_ahead`` (the same with the GPU kept busy after each flush, so
that a Python launch longer than the flush is not timed: ``host_ahead_us``); ours also back to
back (``us_per_call``, ``bench.time_per_call_us``: the larger of the launch and the GPU time):
``ours``, ``ours in place`` (q and k's rotated tokens written where they lie), ``transformers``
(the modeling module's function, eager) and ``copy_same`` (a copy of the bytes ``ours`` moves).
Bytes: q and k read and the results written once (in place: k's rotated tokens only), plus cos
and sin read once (``[1, s, d]``). Before timing, ours is checked against transformers' function
in float64, and the in-place call against ours out of place (bits).
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import rope_kernels.hf as hf  # noqa: E402
from hf_conventions import timing_fields, write_record  # noqa: E402
from rope_kernels import bench  # noqa: E402

# name -> (transformers' module, batch, heads, head_dim, q tokens, memory frames, passed tokens)
SHAPES = {
    "sam3 vit window": ("sam3", 8 * 9, 16, 64, 576, 1, 0),
    "sam3 vit global": ("sam3", 8, 16, 64, 5184, 1, 0),
    "sam2 video memory": ("sam2_video", 8, 1, 256, 4096, 7, 64),
}


def views(batch, heads, head_dim, tokens, k_tokens, seed=0):
    """q ``[b, h, s, d]`` and k ``[b, h, s_k, d]`` (transposed views of projections), cos and
    sin ``[1, s, d]`` of random angles, one per pair, repeat_interleaved."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(batch, n, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                        generator=g).transpose(1, 2) for n in (tokens, k_tokens))
    angles = torch.rand(1, tokens, head_dim // 2, device="cuda", generator=g) * 6.3
    angles = angles.repeat_interleave(2, -1)
    return q, k, angles.cos(), angles.sin()


def measure(name: str, rounds: int, copy_gbps: float) -> list[dict]:
    family, batch, heads, head_dim, tokens, frames, passed = SHAPES[name]
    theirs = importlib.import_module(
        f"transformers.models.{family}.modeling_{family}").apply_rotary_pos_emb_2d
    q, k, cos, sin = views(batch, heads, head_dim, tokens, frames * tokens + passed)
    kw = dict(num_k_exclude_rope=passed, repeat_freqs_k=True) if family != "sam3" else {}
    result = hf.apply_rotary_pos_emb_2d(q, k, cos, sin, **kw)
    exact = theirs(q.double(), k.double(), cos.double(), sin.double(), **kw)
    for got, want in zip(result, exact):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    q_in, k_in = q.clone(), k.clone()
    hf.apply_rotary_pos_emb_2d_inplace(q_in, k_in, cos, sin, **kw)
    assert torch.equal(q_in, result[0]) and torch.equal(k_in, result[1]), "in place differs"
    size = q.element_size()
    table = 2 * cos.numel() * cos.element_size()
    moved = 2 * (q.numel() + k.numel()) * size + table
    moved_in_place = moved - 2 * passed * batch * heads * head_dim * size
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls = {
        "ours": (lambda: hf.apply_rotary_pos_emb_2d(q, k, cos, sin, **kw), moved),
        "ours in place": (lambda: hf.apply_rotary_pos_emb_2d_inplace(q_in, k_in, cos, sin, **kw),
                          moved_in_place),
        "transformers": (lambda: theirs(q, k, cos, sin, **kw), moved),
        "copy_same": (lambda: dst.copy_(src), moved),
    }
    fns = {n: fn for n, (fn, _) in calls.items()}
    with torch.no_grad():
        times = bench.shuffled_times(fns, rounds)
        ahead = bench.shuffled_times(fns, rounds, timer=bench.time_ms_host_ahead)
        per_call = {n: bench.time_per_call_us(fns[n], calls=200)
                    for n in ("ours", "ours in place")}
    rows = []
    for call, (_, nbytes) in calls.items():
        row = dict(shape=name, batch=batch, heads=heads, head_dim=head_dim, tokens=tokens,
                   k_tokens=frames * tokens + passed, call=call,
                   **timing_fields(times[call], nbytes, copy_gbps))
        host = timing_fields(ahead[call], nbytes, copy_gbps)
        row.update(host_ahead_us=host["time_us"], host_ahead_of_copy=host["of_copy"])
        if call in per_call:
            row["us_per_call"] = per_call[call]
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "figures" / "hf_sam_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name in SHAPES:
        new = measure(name, args.rounds, copy_gbps)
        for r in new:
            print(f"{name:18s} {r['call']:14s} {r['mbytes']:8.1f} MB {r['time_us']:8.1f} us "
                  f"{r['of_copy']:.3f}; host ahead {r['host_ahead_us']:8.1f} us "
                  f"{r['host_ahead_of_copy']:.3f}"
                  + (f"; back to back {r['us_per_call']:.1f} us" if "us_per_call" in r else ""),
                  flush=True)
        rows += new
    write_record(args.out, copy_gbps, "hf_sam", argv, args.rounds,
                 "q and k read and the results written once (in place: k's rotated tokens "
                 "only), plus cos and sin (float32, [1, s, d]) read once", rows)


if __name__ == "__main__":
    main()
