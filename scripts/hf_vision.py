"""``hf.apply_rotary_pos_emb_vision`` (the vision encoders' ``apply_rotary_pos_emb_vision`` of
Qwen2-VL and its kind) at the shapes of the encoders that call it, against transformers' own
function and a copy of the same bytes (GPU only).

    python scripts/hf_vision.py [--out figures/hf_vision_h200.json] [--rounds 5] [--tiles]
        [--tokens 32768 65536] [--models qwen2_5_vl ...]

A vision encoder packs every image's patches into one sequence with no batch axis and rotates q
and k ``[tokens, heads, head_dim]`` by cos and sin ``[tokens, head_dim]`` (float32: its rotary
module computes them so) of each patch's row and column (and frame). Qwen's encoders take q and k
as views of one fused projection ``[tokens, 3, heads, head_dim]``; MiniMax M3 VL's and Inkling
2's from separate projections. Shapes (transformers 5.24's default vision configurations: heads x
head_dim), bf16, ``--tokens`` patches (default 32768, and 65536 held out: Qwen2-VL's image
processor makes at most 5120 patches of 14 pixels of an image by default, and a batch of images
or a video packs all of theirs into one call):

- ``qwen2_5_vl`` (Qwen2-VL, Qwen2.5-VL, Ernie 4.5 VL): 16 x 80, fused qkv;
- ``qwen3_vl`` (Qwen3-VL, Qwen3.5, Kimi K2.5, PaddleOCR-VL): 16 x 72, fused qkv;
- ``glm4v``: 12 x 128, fused qkv;
- ``mlcd``: 16 x 104, fused qkv;
- ``step3p7``: 16 x 96, fused qkv;
- ``minimax_m3_vl``: 16 x 80, 78 channels rotated (its cos narrower than the head), separate
  projections;
- ``inkling2``: 16 x 64, interleaved pairs (``apply_rotary_pos_emb_vision_interleaved``),
  separate projections.

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds:
``ours`` (forward), ``ours backward`` (the kernel's backward call), ``ours in place``; the same
three through a copy of the package's rope_qk.py with ``VISION_TILES`` and ``STRIDE_MULTIPLES``
off (``before``, ``before backward``, ``before in place``: the A/B, ``speed_over_before`` per
round, forward's and backward's bits compared), ``transformers`` (the module's own function,
eager) and ``copy_same`` (a copy of the bytes ``ours`` moves). Bytes: q and k read and written once (in place: their rotated channels), plus
cos and sin read once. Before timing, ours is checked against transformers' function in float64.
``--tiles`` adds the forward on other tiles and switches (``TILES``), the probe behind the rule.
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
from qk_table_hint import module_copy  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402

# model -> (heads, head_dim, rotary_dim, fused qkv, interleaved pairs)
SHAPES = {
    "qwen2_5_vl": (16, 80, 80, True, False),
    "qwen3_vl": (16, 72, 72, True, False),
    "glm4v": (12, 128, 128, True, False),
    "mlcd": (16, 104, 104, True, False),
    "step3p7": (16, 96, 96, True, False),
    "minimax_m3_vl": (16, 80, 78, False, False),
    "inkling2": (16, 64, 64, False, True),
}
# --tiles: name -> (rope_qk.default_config's config, or None for the rules'; rope_qk's switches
# set while planning). "BSxBHxW": tokens x heads a program on W warps; "a": all heads of a token
# in one program; "g": whole rows, the partners gathered in registers.
TILES = {
    "rules, no stride multiples": (None, dict(STRIDE_MULTIPLES=False)),
    **{"{}x{}x{}{}".format(s, h, w, "a" if a else ""): (
        dict(block_s=s, block_h=h, num_warps=w, all_heads=a), {})
       for s, h, w, a in [(1, 16, 2, True), (1, 16, 4, True), (1, 16, 2, False),
                          (1, 16, 4, False), (2, 8, 2, False), (4, 4, 2, False),
                          (1, 8, 2, False), (1, 8, 1, False), (2, 8, 1, False),
                          (2, 16, 4, False), (4, 8, 4, False), (8, 4, 4, False)]},
    **{"{}x{}x{}g".format(s, h, w): (
        dict(block_s=s, block_h=h, num_warps=w, all_heads=False, whole_rows=True, gather=True),
        {}) for s, h, w in [(1, 4, 1), (1, 8, 1), (1, 8, 2), (2, 8, 2), (1, 16, 2), (4, 4, 2)]},
}


def views(model: str, tokens: int, seed=0):
    """q, k (as the model's encoder makes them), cos, sin (float32, Llama's layout; Inkling 2's
    repeat_interleaved) and our function."""
    heads, head_dim, rotary_dim, fused, interleaved = SHAPES[model]
    g = torch.Generator(device="cuda").manual_seed(seed)
    bf16 = dict(device="cuda", generator=g, dtype=torch.bfloat16)
    if fused:
        qkv = torch.randn(tokens, 3 * heads * head_dim, **bf16)
        q, k, _ = qkv.view(tokens, 3, heads, head_dim).permute(1, 0, 2, 3).unbind(0)
    else:
        q = torch.randn(tokens, heads * head_dim, **bf16).view(tokens, heads, head_dim)
        k = torch.randn(tokens, heads * head_dim, **bf16).view(tokens, heads, head_dim)
    angles = torch.rand(tokens, rotary_dim // 2, device="cuda", generator=g) * 6.3
    angles = (angles.repeat_interleave(2, -1) if interleaved
              else torch.cat((angles, angles), -1))
    ours = (hf.apply_rotary_pos_emb_vision_interleaved if interleaved
            else hf.apply_rotary_pos_emb_vision)
    return q, k, angles.cos(), angles.sin(), ours


def tile_call(call, config, switches):
    """``call()`` (a forward through ``rope_qk.rope_cos_sin``) planned on ``config`` (None: the
    rules) with ``switches`` set: its plan made once, then swapped in for each call (planning per
    call would be timed). ``scripts/hf_complex.py`` probes its tiles with it too, and
    ``scripts/hf_deepseek_v4.py`` plans on the rules' tile with it."""
    rules, plans = rope_qk.default_config, rope_qk._PLANS
    saved = {name: getattr(rope_qk, name) for name in switches}
    if config is not None:
        rope_qk.default_config = lambda *a, **kw: dict(config)
    for name, value in switches.items():
        setattr(rope_qk, name, value)
    rope_qk._PLANS = {}
    try:
        call()
        own = rope_qk._PLANS
    finally:
        rope_qk.default_config, rope_qk._PLANS = rules, plans
        for name, value in saved.items():
            setattr(rope_qk, name, value)

    def planned():
        rope_qk._PLANS = own
        try:
            return call()
        finally:
            rope_qk._PLANS = plans
    return planned


def measure(model: str, tokens: int, rounds: int, copy_gbps: float, tiles: bool,
            before) -> list[dict]:
    heads, head_dim, rotary_dim, fused, interleaved = SHAPES[model]
    theirs = importlib.import_module(
        f"transformers.models.{model}.modeling_{model}").apply_rotary_pos_emb_vision
    q, k, cos, sin, ours = views(model, tokens)
    exact = theirs(q.double(), k.double(), cos.double(), sin.double())
    for got, want in zip(ours(q, k, cos, sin), exact):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    in_place = getattr(hf, ours.__name__ + "_inplace")
    q_in, k_in = fresh_like(q), fresh_like(k)
    bq_in, bk_in = fresh_like(q), fresh_like(k)
    pairs = "vision_interleaved" if interleaved else "vision"
    table = 2 * cos.numel() * cos.element_size()
    qk_bytes = 2 * (q.numel() + k.numel()) * q.element_size()
    rotated = qk_bytes * rotary_dim // head_dim
    src = torch.empty((qk_bytes + table) // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def kernel(module, backward=False, into=None):
        """rope_qk's call (ours or the side before) on ``[1, tokens, h, d]`` views; in place
        into ``into`` (q, k): the same view objects as inputs and outputs, which is how
        rope_cos_sin tells an in-place call (and plans its narrowed rows)."""
        x, y = (t[None] for t in (into or (q, k)))
        outs = dict(q_out=x, k_out=y) if into else {}
        return lambda: module.rope_cos_sin(x, y, cos, sin, 2, backward=backward, pairs=pairs,
                                           **outs)

    calls = {
        "ours": (lambda: ours(q, k, cos, sin), qk_bytes + table),
        "ours backward": (kernel(rope_qk, True), qk_bytes + table),
        "ours in place": (lambda: in_place(q_in, k_in, cos, sin), rotated + table),
        "before": (kernel(before), qk_bytes + table),
        "before backward": (kernel(before, True), qk_bytes + table),
        "before in place": (kernel(before, into=(bq_in, bk_in)), rotated + table),
        "transformers": (lambda: theirs(q, k, cos, sin), qk_bytes + table),
        "copy_same": (lambda: dst.copy_(src), qk_bytes + table),
    }
    same_bits = {
        "ours": all(torch.equal(a, b) for a, b in zip(kernel(rope_qk)(), kernel(before)())),
        "ours backward": all(torch.equal(a, b) for a, b in zip(kernel(rope_qk, True)(),
                                                               kernel(before, True)())),
    }
    if tiles:
        def forward():
            return rope_qk.rope_cos_sin(q[None], k[None], cos, sin, 2, pairs=pairs)

        for name, (config, switches) in TILES.items():
            if config and config.get("gather") and rotary_dim % 16 == 0:
                continue  # (gathered partners: rotary_dim not a multiple of 16 only)
            calls[f"ours {name}"] = (tile_call(forward, config, switches), qk_bytes + table)
    with torch.no_grad():
        times = bench.shuffled_times({n: fn for n, (fn, _) in calls.items()}, rounds)
    rows = []
    for name, (_, nbytes) in calls.items():
        row = dict(model=model, heads=heads, head_dim=head_dim, rotary_dim=rotary_dim,
                   fused_qkv=fused, interleaved=interleaved, tokens=tokens, call=name,
                   **timing_fields(times[name], nbytes, copy_gbps))
        if name.startswith("ours") and name.replace("ours", "before") in times:
            old = times[name.replace("ours", "before")]
            row["speed_over_before"] = [o / t for t, o in zip(times[name], old)]  # per round
            if name in same_bits:
                row["same_bits"] = same_bits[name]
        rows.append(row)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "hf_vision_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, nargs="+", default=[32768, 65536])
    parser.add_argument("--models", nargs="*", default=list(SHAPES))
    parser.add_argument("--tiles", action="store_true")
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    before = module_copy("rope_qk_before_vision", rope_qk.__file__)
    before.VISION_TILES = before.STRIDE_MULTIPLES = False
    rows = []
    for model, tokens in [(m, t) for t in args.tokens for m in args.models]:
        new = measure(model, tokens, args.rounds, copy_gbps, args.tiles, before)
        for r in new:
            ratio = r.get("speed_over_before")
            print(f"{model:14s} {tokens:6d} {r['call']:22s} {r['mbytes']:7.1f} MB "
                  f"{r['time_us']:8.1f} us {r['of_copy']:.3f}"
                  + (f" x{sorted(ratio)[len(ratio) // 2]:.3f} {r.get('same_bits', '')}"
                     if ratio else ""), flush=True)
        rows += new
    write_record(args.out, copy_gbps, "hf_vision", argv, args.rounds,
                 "q and k read and written once (in place: their rotated channels), plus cos "
                 "and sin (float32) read once", rows)


if __name__ == "__main__":
    main()
