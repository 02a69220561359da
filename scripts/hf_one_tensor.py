"""The one-tensor functions of ``rope_kernels.hf`` (Gemma 4's and GPT-J's) at their models'
shapes, on ``rope_qk.ONE_TENSOR_TILES``' tiles and on the tiles before them, against
transformers' own functions and a copy of the same bytes (GPU only).

    python scripts/hf_one_tensor.py [--out figures/hf_one_tensor_h200.json] [--rounds 3]

Gemma 3n's and Gemma 4's attention rotates q and k by separate calls,
``apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2)``, x ``[b, s, h, d]`` after its norm; GPT-J's
(CodeGen's) ``apply_rotary_pos_emb(tensor, sin, cos)`` rotates ``q[..., :rotary_dim]``, a view,
by sin and cos of one entry per pair. Ours runs each through the q+k kernel with a k of no heads.
Shapes, bf16, ``batch`` x ``tokens``:

- ``gemma4 sliding``: q of 8 heads and k of 4, heads of 256 (transformers' default
  Gemma4TextConfig, its sliding-window layers), 4096 tokens;
- ``gemma4 full``: the same head counts, heads of 512 (its full-attention layers);
- ``gptj``: 16 heads of 256, 64 channels rotated (GPT-J 6B), 2048 tokens;
- held out from the probe behind ``ONE_TENSOR_TILES``: ``gemma3n`` k (2 heads of 256, Gemma 3n's
  default), ``heads of 128`` (q of 16 heads, k of 8) and ``codegen 350M`` (16 heads of 64, 32
  channels rotated).

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds:
``ours`` (forward), ``ours tiles before`` (the same call with ``ONE_TENSOR_TILES`` off, through
a copy of the package's rope_qk.py: the A/B), ``ours backward`` and ``ours backward tiles before``
(the kernel's backward call), ``ours in place`` and ``ours in place tiles before``,
``transformers`` (the family's own function, eager) and ``copy_same`` (a copy of the bytes
``ours`` moves). Both sides' results out of place are compared bit for bit (``same_bits``).
Bytes: x's rotated channels read and written, plus cos and sin read once. Before timing, ours is
checked against transformers' function run in float64. ``decode``: 64 tokens of one sequence,
back-to-back calls (``bench.time_per_call_us``, Python launch included).
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
from qk_table_hint import flag_off_copy  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402

# shape name -> (transformers module, parts {name: heads}, head_dim, rotary_dim, tokens)
SHAPES = {
    "gemma4 sliding": ("gemma4", {"q": 8, "k": 4}, 256, 256, 4096),
    "gemma4 full": ("gemma4", {"q": 8, "k": 4}, 512, 512, 4096),
    "gptj": ("gptj", {"q": 16}, 256, 64, 2048),
    "gemma3n": ("gemma3n", {"k": 2}, 256, 256, 4096),
    "heads of 128": ("gemma4", {"q": 16, "k": 8}, 128, 128, 4096),
    "codegen 350M": ("codegen", {"q": 16}, 64, 32, 2048),
}


def _inputs(shape: str, heads: int, batch: int, tokens: int, before=None, seed=0):
    """x (GPT-J: the rotated slice of a wider head, a view), cos and sin, and the calls
    (ours, ours in place, transformers'), ours backward, the bytes, and ``before``'s (a rope_qk
    module) forward and backward calls."""
    module_name, _, head_dim, rotary_dim, _ = SHAPES[shape]
    theirs = importlib.import_module(
        f"transformers.models.{module_name}.modeling_{module_name}").apply_rotary_pos_emb
    g = torch.Generator(device="cuda").manual_seed(seed)
    full = torch.randn(batch, tokens, heads, head_dim, device="cuda", generator=g,
                       dtype=torch.bfloat16)
    x = full[..., :rotary_dim]
    gptj = module_name in ("gptj", "codegen")
    angles = torch.rand(batch, tokens, rotary_dim // 2, device="cuda", generator=g) * 6.3
    if not gptj:
        angles = torch.cat((angles, angles), -1)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    pairs = "interleaved_per_pair" if gptj else "half"
    k0 = x.narrow(2, 0, 0)
    if gptj:
        calls = (lambda: hf.apply_rotary_pos_emb_gptj(x, sin, cos),
                 lambda: hf.apply_rotary_pos_emb_gptj_inplace(x, sin, cos),
                 lambda: theirs(x, sin, cos))
        exact = theirs(x.double(), sin.double(), cos.double())
    else:
        calls = (lambda: hf.apply_rotary_pos_emb_gemma4(x, cos, sin, 2),
                 lambda: hf.apply_rotary_pos_emb_gemma4_inplace(x, cos, sin, 2),
                 lambda: theirs(x, cos, sin, unsqueeze_dim=2))
        exact = theirs(x.double(), cos.double(), sin.double(), unsqueeze_dim=2)
    torch.testing.assert_close(calls[0]().double(), exact, rtol=2e-2, atol=2e-2)
    backward = lambda: rope_qk.rope_cos_sin(x, k0, cos, sin, 2, backward=True, pairs=pairs)
    nbytes = 2 * x.numel() * x.element_size() + 2 * cos.numel() * cos.element_size()
    sides = None
    if before is not None:
        sides = (lambda: before.rope_cos_sin(x, k0, cos, sin, 2, pairs=pairs)[0],
                 lambda: before.rope_cos_sin(x, k0, cos, sin, 2, backward=True, pairs=pairs),
                 lambda: before.rope_cos_sin(x, k0, cos, sin, 2, pairs=pairs, q_out=x,
                                             k_out=k0))
    return calls, backward, nbytes, sides


def measure(shape: str, part: str, batch: int, rounds: int, copy_gbps: float,
            before) -> list[dict]:
    _, parts, head_dim, rotary_dim, tokens = SHAPES[shape]
    (ours, ours_in_place, theirs), backward, nbytes, (old, old_backward, old_in_place) = _inputs(
        shape, parts[part], batch, tokens, before)
    same_bits = (torch.equal(ours(), old()) and torch.equal(backward()[0], old_backward()[0]))
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls = {"ours": ours, "ours tiles before": old, "ours backward": backward,
             "ours backward tiles before": old_backward, "ours in place": ours_in_place,
             "ours in place tiles before": old_in_place,
             "transformers": theirs, "copy_same": lambda: dst.copy_(src)}
    times = bench.shuffled_times(calls, rounds)
    rows = []
    for name in calls:
        row = dict(shape=shape, part=part, heads=parts[part], head_dim=head_dim,
                   rotary_dim=rotary_dim, batch=batch, tokens=tokens, call=name,
                   **timing_fields(times[name], nbytes, copy_gbps))
        if name in ("ours", "ours backward", "ours in place"):
            row["speed_over_before"] = [before_ms / ms for ms, before_ms in  # per round
                                        zip(times[name], times[f"{name} tiles before"])]
            row["same_bits"] = same_bits
        rows.append(row)
    return rows


def decode(shape: str) -> list[dict]:
    _, parts, head_dim, rotary_dim, _ = SHAPES[shape]
    part = "q" if "q" in parts else "k"
    (ours, _, theirs), _, _, _ = _inputs(shape, parts[part], 1, 64)
    return [dict(shape=shape, part=part, heads=parts[part], head_dim=head_dim,
                 rotary_dim=rotary_dim, batch=1, tokens=64, call=f"decode {name}",
                 us_per_call=bench.time_per_call_us(fn, repeats=4))
            for name, fn in (("ours", ours), ("transformers", theirs))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "hf_one_tensor_h200.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    before = flag_off_copy("ONE_TENSOR_TILES")
    rows = []
    for shape, (_, parts, *_) in SHAPES.items():
        for part in parts:
            for batch in args.batches:
                rows += measure(shape, part, batch, args.rounds, copy_gbps, before)
                for r in rows[-8:]:
                    print(f"{shape:15s} {part} b{batch:<3d} {r['call']:14s} "
                          f"{r['mbytes']:8.1f} MB {r['time_us']:8.1f} us {r['of_copy']:.3f}",
                          flush=True)
        rows += decode(shape)
        for r in rows[-2:]:
            print(f"{shape:15s} {r['call']:20s} {r['us_per_call']:.1f} us", flush=True)
    write_record(args.out, copy_gbps, "hf_one_tensor", argv, args.rounds,
                 "x's rotated channels read and written, plus cos and sin read once (bf16)", rows)


if __name__ == "__main__":
    main()
