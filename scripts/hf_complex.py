"""The complex-angle functions of ``rope_kernels.hf`` (Llama 4's and DeepSeek V2's
``apply_rotary_emb``, Llama 4's ``vision_apply_rotary_emb``) at their models' shapes, against the
same call on contiguous cos and sin, transformers' own functions and a copy of the same bytes
(GPU only).

    python scripts/hf_complex.py [--out figures/hf_complex_h200.json] [--rounds 5]
        [--models llama4 deepseek_v2 llama4_vision] [--tiles]

These models hand the attention its angles as complex numbers, ``freqs_cis`` (complex64, cos + i
sin of each pair's angle), and transformers' function multiplies channels 2j and 2j+1, taken as a
complex number, by them in float32. Ours reads the angles' real and imaginary parts in place as
the kernel's cos and sin: float32 tables of stride 2, the sine one element after the cosine (the
interleaved call of one entry per pair, GPT-OSS's table layout). Shapes, bf16:

- ``llama4``: Llama 4 Scout's and Maverick's text attention, 40 q / 8 k heads of 128, q and k
  ``[b, s, h, d]`` views of their projections, ``freqs_cis`` ``[b, s, 64]``, batches of 4096
  tokens;
- ``deepseek_v2``: DeepSeek-V2's, 128 q heads, q's rotary slice (64 of 192 channels) of
  ``[b, s, 128, 192]`` transposed to ``[b, h, s, d]``, and k's (64 of 576 channels) of the
  compressed kv, one head;
- ``llama4_vision``: Llama 4's vision encoder, 16 heads of 88, 577 patches an image (336 pixels
  in patches of 14, and the class token), ``freqs_ci`` ``[577, 1, 44]`` shared by the images.

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds:
``ours`` (forward), ``ours backward`` (the kernel's backward call), ``ours in place``,
``contiguous tables`` (GPT-OSS's interleaved function of ours, the same rotation, on
``freqs.real.contiguous()`` and ``freqs.imag.contiguous()`` made beforehand: what reading the
angles in place costs, the same bits checked; off the vision tiles, so for the vision encoder
it is also the rules' tile), ``ours tiles before`` (the vision encoder's forward with
``VISION_TILES`` off: the A/B of its tile), ``transformers`` (the module's own function,
eager), ``copy_same`` (a copy of the bytes ``ours`` moves) and ``copy_views`` (q and k copied
into tensors of their layout: the in-place calls' reads and writes, two launches). Bytes: q and
k read and written once, plus the angles (8 bytes a pair) read once (``copy_views`` moves no
angles, and is counted as if it did, as the calls it is set against). Before timing, ours is
checked against transformers' function. ``decode``: Llama 4's 64 tokens of one sequence,
back-to-back calls (``bench.time_per_call_us``, Python launch included). ``--tiles`` adds the
forward on the tiles of ``scripts/hf_vision.py``'s probe (``TILES``; not the gathered partners,
which are half-split pairs).
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
from hf_conventions import fresh_like, timing_fields, write_record  # noqa: E402
from hf_vision import TILES, tile_call  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402

# model -> (transformers module, function name there, ours, q heads, k heads, head_dim, heads
# axis; and the sizes: batches of 4096 tokens, or images of 577 patches)
MODELS = {
    "llama4": ("llama4", "apply_rotary_emb", hf.apply_rotary_emb_llama4, 40, 8, 128, 2, [2, 8]),
    "deepseek_v2": ("deepseek_v2", "apply_rotary_emb", hf.apply_rotary_emb_deepseek_v2, 128, 1,
                    64, 1, [2, 4]),
    "llama4_vision": ("llama4", "vision_apply_rotary_emb", hf.apply_rotary_emb_llama4_vision, 16,
                      16, 88, 2, [16, 64]),
}
TOKENS, PATCHES = 4096, 577


def inputs(model: str, size: int, tokens: int = TOKENS, seed=0):
    """xq, xk (as the model's attention makes them) and the angles (complex64) for ``size``
    sequences of ``tokens`` (images of 577 patches for the vision encoder)."""
    _, _, _, hq, hk, d, _, _ = MODELS[model]
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf16 = dict(device="cuda", generator=g, dtype=torch.bfloat16)
    s = PATCHES if model == "llama4_vision" else tokens
    if model == "deepseek_v2":
        xq = torch.randn(size, s, hq, 192, **bf16)[..., 128:].transpose(1, 2)
        xk = torch.randn(size, s, 576, **bf16)[..., 512:].view(size, 1, s, d)
    else:
        xq = torch.randn(size, s, hq * d, **bf16).view(size, s, hq, d)
        xk = torch.randn(size, s, hk * d, **bf16).view(size, s, hk, d)
    rows = 1 if model == "llama4_vision" else size
    theta = torch.rand(rows, s, d // 2, device="cuda", generator=g) * 6.3
    freqs = torch.polar(torch.ones_like(theta), theta)
    if model == "llama4_vision":
        freqs = freqs.reshape(s, 1, d // 2)  # (its rotary module's shape)
    return xq, xk, freqs


def _checked(model: str, size: int, tokens: int = TOKENS):
    """The inputs, ours, transformers' function and the contiguous-table call of ours (GPT-OSS's
    interleaved function on cos and sin made beforehand), ours checked against both."""
    module, name, ours, _, _, d, heads_axis, _ = MODELS[model]
    theirs = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"),
                     name)
    xq, xk, freqs = inputs(model, size, tokens)
    table = freqs.reshape(-1, xq.shape[3 - heads_axis], d // 2)
    cos, sin = table.real.contiguous(), table.imag.contiguous()

    def contiguous():
        return hf.apply_rotary_pos_emb_gpt_oss_interleaved(xq, xk, cos, sin, heads_axis)

    got = ours(xq, xk, freqs)
    for g, w, c in zip(got, theirs(xq, xk, freqs), contiguous()):
        torch.testing.assert_close(g.double(), w.double(), rtol=2e-2, atol=2e-2)
        assert torch.equal(g, c), "the complex call and the contiguous-table call differ"
    return xq, xk, freqs, ours, theirs, contiguous, (cos, sin)


def measure(model: str, size: int, rounds: int, copy_gbps: float, tiles: bool) -> list[dict]:
    _, _, _, hq, hk, d, heads_axis, _ = MODELS[model]
    xq, xk, freqs, ours, theirs, contiguous, (cos, sin) = _checked(model, size)
    in_place = getattr(hf, ours.__name__ + "_inplace")
    q_in, k_in = fresh_like(xq), fresh_like(xk)
    table = torch.view_as_real(freqs.reshape(cos.shape))
    qk_bytes = 2 * (xq.numel() + xk.numel()) * xq.element_size()
    nbytes = qk_bytes + freqs.numel() * freqs.element_size()
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # (the pairs our function passes: the vision encoder's plan on the vision tiles)
    pairs = "vision_interleaved_complex" if model == "llama4_vision" else "interleaved_complex"
    calls = {
        "ours": lambda: ours(xq, xk, freqs),
        "ours backward": lambda: rope_qk.rope_cos_sin(
            xq, xk, table[..., 0], table[..., 1], heads_axis, backward=True, pairs=pairs),
        "ours in place": lambda: in_place(q_in, k_in, freqs),
        "contiguous tables": contiguous,
        "transformers": lambda: theirs(xq, xk, freqs),
        "copy_same": lambda: dst.copy_(src),
        # (the in-place calls' ceiling: their reads and writes in the views' runs, two launches)
        "copy_views": lambda: (q_in.copy_(xq), k_in.copy_(xk)),
    }
    if model == "llama4_vision":  # the A/B of its tile (rope_qk._vision_tile)
        calls["ours tiles before"] = tile_call(
            lambda: rope_qk.rope_cos_sin(xq, xk, table[..., 0], table[..., 1], heads_axis,
                                         pairs=pairs),
            None, dict(VISION_TILES=False))
    if tiles:
        def forward():
            return rope_qk.rope_cos_sin(xq, xk, table[..., 0], table[..., 1], heads_axis,
                                        pairs=pairs)

        for name, (config, switches) in TILES.items():
            if not (config and config.get("gather")):  # (gathered partners: half-split pairs)
                calls[f"ours {name}"] = tile_call(forward, config, switches)
    with torch.no_grad():
        times = bench.shuffled_times(calls, rounds)
    shape = dict(model=model, size=size, q_heads=hq, k_heads=hk, head_dim=d,
                 tokens=xq.shape[3 - heads_axis])
    rows = [dict(**shape, call=name, **timing_fields(times[name], nbytes, copy_gbps))
            for name in calls]
    rows[0]["speed_over_contiguous"] = [c / o for o, c in zip(times["ours"],
                                                              times["contiguous tables"])]
    if "ours tiles before" in times:
        rows[0]["speed_over_tiles_before"] = [b / o for o, b in zip(times["ours"],
                                                                    times["ours tiles before"])]
    return rows


def decode() -> list[dict]:
    """Llama 4's decode-sized call: 64 tokens of one sequence, back to back."""
    xq, xk, freqs, ours, theirs, contiguous, _ = _checked("llama4", 1, 64)
    calls = {"ours": lambda: ours(xq, xk, freqs), "contiguous tables": contiguous,
             "transformers": lambda: theirs(xq, xk, freqs)}
    with torch.no_grad():
        return [dict(model="llama4", size=1, tokens=64, call=f"decode {name}",
                     us_per_call=bench.time_per_call_us(fn, repeats=4))
                for name, fn in calls.items()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "hf_complex_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--tiles", action="store_true")
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for model in args.models:
        for size in MODELS[model][-1]:
            new = measure(model, size, args.rounds, copy_gbps, args.tiles)
            for r in new:
                ratios = [r[key] for key in ("speed_over_contiguous", "speed_over_tiles_before")
                          if key in r]
                print(f"{model:14s} {size:3d} {r['call']:18s} {r['mbytes']:7.1f} MB "
                      f"{r['time_us']:8.1f} us {r['of_copy']:.3f}"
                      + "".join(f" x{sorted(x)[len(x) // 2]:.3f}" for x in ratios), flush=True)
            rows += new
    if "llama4" in args.models:
        rows += decode()
        for r in rows[-3:]:
            print(f"llama4 {r['call']:26s} {r['us_per_call']:.1f} us", flush=True)
    write_record(args.out, copy_gbps, "hf_complex", argv, args.rounds,
                 "q and k read and written once, plus the complex angles (8 bytes a pair) read "
                 "once", rows)


if __name__ == "__main__":
    main()
