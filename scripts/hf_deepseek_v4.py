"""``hf.apply_rotary_pos_emb_deepseek_v4`` (DeepSeek V4's ``apply_rotary_pos_emb(x, cos, sin)``)
at the shapes its attention calls it with, against transformers' own function and a copy of the
same bytes (GPU only).

    python scripts/hf_deepseek_v4.py [--out figures/hf_deepseek_v4_h200.json] [--rounds 5]

DeepSeek V4 lays each head out ``[nope | rope]`` and rotates its last 64 channels, adjacent
channels paired by cos and sin of one entry per pair ``[b, s, 32]`` (float32), on x ``[b, h, s,
d]``: the transposed view of a projection ``[b, s, h, d]``. Ours is one launch
(``rope_qk.rope_trailing``): the rotary slices are the kernel's k, the channels before them its
v (fused QKV's copy), into a new contiguous result, as transformers' ``torch.cat`` returns.
Shapes (transformers 5.24's default ``DeepseekV4Config``), bf16, batch 1:

- ``attention q``: 64 heads of 512 (448 copied, 64 rotated), 4096 and 16384 tokens;
- ``indexer q``: its indexer's 64 heads of 128 (64 copied, 64 rotated), 4096 and 16384 tokens;
- ``shared kv``: the one key-value head of 512, 16384 and 65536 tokens.

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds:
``ours`` (forward), ``ours backward`` (the kernel's backward call: the copy and the rotation by
-theta), ``ours in place`` (the in-place function: ``rope_trailing`` with ``out=x``, the
rotary slice rotated where it lies), ``q+k path in place`` (the same through the q+k functions'
path on the slice: what the in-place function runs under torch.compile, and ran eagerly for many
tokens of many heads until ``trailing_config`` counted the rotated channels in place),
``rules' tile`` (the forward planned on ``default_config``'s tile instead of
``rope_qk.trailing_config``'s: the A/B behind that rule, ``speed_over_rules`` per round, and
whether its bits equal ours), ``transformers`` (the module's function, eager) and ``copy_same``
(a copy of the bytes ``ours`` moves). Bytes: x read and the result written once (in place: the
rotary slice), plus cos and sin read once. ``decode``: one token of the attention's q (and 4
in place), back-to-back calls (``bench.time_per_call_us``). Before timing, ours is checked
against transformers' function in float64, and both in-place calls against ours out of place
(bits).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import rope_kernels.hf as hf  # noqa: E402
from hf_conventions import timing_fields, write_record  # noqa: E402
from hf_vision import tile_call  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402
from transformers.models.deepseek_v4 import modeling_deepseek_v4  # noqa: E402

# name -> (heads, head_dim, rotary channels, token counts)
SHAPES = {
    "attention q": (64, 512, 64, (4096, 16384)),
    "indexer q": (64, 128, 64, (4096, 16384)),
    "shared kv": (1, 512, 64, (16384, 65536)),
}


def views(heads: int, head_dim: int, rope: int, tokens: int, seed=0):
    """x ``[1, h, s, d]`` (the transposed view of a ``[1, s, h, d]`` projection), cos and sin
    ``[1, s, rope / 2]`` in float32."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(1, tokens, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                    generator=g).transpose(1, 2)
    angles = torch.rand(1, tokens, rope // 2, device="cuda", generator=g) * 6.3
    return x, angles.cos(), angles.sin()


def measure(name: str, tokens: int, rounds: int, copy_gbps: float) -> list[dict]:
    heads, head_dim, rope, _ = SHAPES[name]
    theirs = modeling_deepseek_v4.apply_rotary_pos_emb
    x, cos, sin = views(heads, head_dim, rope, tokens)
    ours = hf.apply_rotary_pos_emb_deepseek_v4
    exact = theirs(x.double(), cos.double(), sin.double())
    result = ours(x, cos, sin)
    torch.testing.assert_close(result.double(), exact, rtol=2e-2, atol=2e-2)
    x_in, x_qk = x.clone(), x.clone()
    table = 2 * cos.numel() * cos.element_size()
    x_bytes = 2 * x.numel() * x.element_size()
    rotated = x_bytes * rope // head_dim
    # default_config's tile: rope_qk.trailing_config off (TRAILING_BYTES None) while planning
    forward = tile_call(lambda: rope_qk.rope_trailing(x, cos, sin, 1), None,
                        {"TRAILING_BYTES": None})
    src = torch.empty((x_bytes + table) // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls = {
        "ours": (lambda: ours(x, cos, sin), x_bytes + table),
        "ours backward": (lambda: rope_qk.rope_trailing(x, cos, sin, 1, backward=True),
                          x_bytes + table),
        "ours in place": (lambda: hf.apply_rotary_pos_emb_deepseek_v4_inplace(x_in, cos, sin),
                          rotated + table),
        "q+k path in place": (lambda: hf._apply_one(x_qk.narrow(-1, head_dim - rope, rope), cos,
                                                    sin, 1, "interleaved_per_pair", "x",
                                                    "apply_rotary_pos_emb_deepseek_v4_inplace"),
                              rotated + table),
        "rules' tile": (forward, x_bytes + table),
        "transformers": (lambda: theirs(x, cos, sin), x_bytes + table),
        "copy_same": (lambda: dst.copy_(src), x_bytes + table),
    }
    same_bits = torch.equal(forward(), result)
    for in_place in ("ours in place", "q+k path in place"):
        calls[in_place][0]()
    assert torch.equal(x_in, result) and torch.equal(x_qk, result), "in place differs"
    with torch.no_grad():
        times = bench.shuffled_times({n: fn for n, (fn, _) in calls.items()}, rounds)
    rows = []
    for call, (_, nbytes) in calls.items():
        row = dict(shape=name, heads=heads, head_dim=head_dim, rotary_dim=rope, tokens=tokens,
                   call=call, **timing_fields(times[call], nbytes, copy_gbps))
        if call == "ours":
            row["speed_over_rules"] = [r / t for t, r in zip(times[call], times["rules' tile"])]
            row["same_bits_as_rules"] = same_bits
        rows.append(row)
    return rows


def decode() -> list[dict]:
    """Back-to-back calls at one token of the attention's q, and in place at 4 (a short chunk:
    many tokens of many heads, which took the q+k path in place before)."""
    x, cos, sin = views(64, 512, 64, 1)
    x4, cos4, sin4 = views(64, 512, 64, 4)
    calls = {("1 token", "ours"): lambda: hf.apply_rotary_pos_emb_deepseek_v4(x, cos, sin),
             ("1 token", "ours in place"):
                 lambda: hf.apply_rotary_pos_emb_deepseek_v4_inplace(x, cos, sin),
             ("1 token", "transformers"):
                 lambda: modeling_deepseek_v4.apply_rotary_pos_emb(x, cos, sin),
             ("4 tokens", "ours in place"):
                 lambda: hf.apply_rotary_pos_emb_deepseek_v4_inplace(x4, cos4, sin4)}
    with torch.no_grad():
        return [dict(shape=f"decode: attention q, {tokens}", call=call,
                     us_per_call=bench.time_per_call_us(fn))
                for (tokens, call), fn in calls.items()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "hf_deepseek_v4_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name, (_, _, _, token_counts) in SHAPES.items():
        for tokens in token_counts:
            new = measure(name, tokens, args.rounds, copy_gbps)
            for r in new:
                ratio = r.get("speed_over_rules")
                print(f"{name:12s} {tokens:6d} {r['call']:14s} {r['mbytes']:8.1f} MB "
                      f"{r['time_us']:8.1f} us {r['of_copy']:.3f}"
                      + (f" x{sorted(ratio)[len(ratio) // 2]:.3f} {r['same_bits_as_rules']}"
                         if ratio else ""), flush=True)
            rows += new
    for r in decode():
        print(f"{r['shape']} {r['call']:14s} {r['us_per_call']:.1f} us", flush=True)
        rows.append(r)
    write_record(args.out, copy_gbps, "hf_deepseek_v4", argv, args.rounds,
                 "x read and the result written once (in place: the rotary slice), plus cos and "
                 "sin (float32) read once", rows)


if __name__ == "__main__":
    main()
