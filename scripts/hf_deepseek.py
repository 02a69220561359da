"""``hf.apply_rotary_pos_emb_deepseek`` (DeepSeek V3's ``apply_rotary_pos_emb_interleave``)
at the shapes of the models that call it, against transformers' own function, Llama's function
of ours on the same views and a copy of the same bytes; its backward on
``rope_qk.DEEPSEEK_BACKWARD_K_BLOCKS``' blocks and on the blocks before (GPU only).

    python scripts/hf_deepseek.py [--out figures/hf_deepseek_h200.json] [--rounds 5]

The attention of these models (multi-head latent attention) splits each query head into
``nope`` channels and 64 rotary ones, and the compressed key-value projection ``[b, s, lora +
64]`` into the latent and one shared rotary key head; it rotates the two rotary slices, as views,
``[b, h, s, 64]`` and ``[b, 1, s, 64]``. Shapes (transformers 5.24's default configurations: heads,
nope, lora), bf16, 4096 tokens, the batch giving 270-550 MB:

- ``deepseek_v3``: 128 heads, nope 128, lora 512, batch 4;
- ``glm_moe_dsa`` (GLM-5): 64, 192, 512, batch 4;
- ``mistral4``: 32, 64, 256, batch 8;
- ``glm4_moe_lite``: 20, 192, 512, batch 16;
- ``youtu``: 16, 128, 512, batch 16;
- held out from the probe behind ``DEEPSEEK_BACKWARD_K_BLOCKS``: ``longcat_flash`` (64, 128,
  512, batch 4) and ``bailing_hybrid`` (32, 128, 512, batch 8).

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds:
``ours`` (forward), ``ours backward`` (the kernel's backward call) and ``ours backward k blocks
before`` (the same with ``DEEPSEEK_BACKWARD_K_BLOCKS`` off, through a copy of the package's
rope_qk.py: the A/B), ``ours in place``, ``llama's of ours`` and ``llama's of ours in place``
(``rope_kernels.hf.apply_rotary_pos_emb`` on the same views: what the q+k path reaches there with
half-split pairs), ``transformers`` (DeepSeek V3's function, eager) and ``copy_same`` (a copy of
the bytes ``ours`` moves). Bytes: q's and k's rotary slices read and written, plus cos and sin
read once per token (the half that the function reads). Before timing, ours is checked against
transformers' function in float64; both sides of the A/B are compared bit for bit
(``same_bits``). ``decode``: 64 tokens of one sequence at DeepSeek V3's heads, back-to-back
calls (``bench.time_per_call_us``, Python launch included).
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
from qk_table_hint import flag_off_copy  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402

ROPE = 64  # qk_rope_head_dim of every model here
TOKENS = 4096
# model -> (heads, nope, lora, batch); the last two are held out
SHAPES = {
    "deepseek_v3": (128, 128, 512, 4),
    "glm_moe_dsa": (64, 192, 512, 4),
    "mistral4": (32, 64, 256, 8),
    "glm4_moe_lite": (20, 192, 512, 16),
    "youtu": (16, 128, 512, 16),
    "longcat_flash": (64, 128, 512, 4),
    "bailing_hybrid": (32, 128, 512, 8),
}
HELD_OUT = ("longcat_flash", "bailing_hybrid")


def _views(heads: int, nope: int, lora: int, batch: int, tokens: int, seed=0):
    """q_rot, k_rot (DeepSeek's views of its projections) and cos, sin (Llama's layout, bf16),
    as its attention passes them."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q_states = torch.randn(batch, tokens, heads, nope + ROPE, device="cuda", generator=g,
                           dtype=torch.bfloat16)
    kv = torch.randn(batch, tokens, lora + ROPE, device="cuda", generator=g, dtype=torch.bfloat16)
    q = q_states[..., nope:].transpose(1, 2)
    k = kv[..., lora:].view(batch, tokens, 1, ROPE).transpose(1, 2)
    angles = torch.rand(batch, tokens, ROPE // 2, device="cuda", generator=g) * 6.3
    angles = torch.cat((angles, angles), -1)
    return q, k, angles.cos().bfloat16(), angles.sin().bfloat16()


def measure(model: str, rounds: int, copy_gbps: float, before) -> list[dict]:
    heads, nope, lora, batch = SHAPES[model]
    theirs = importlib.import_module(
        f"transformers.models.{model}.modeling_{model}").apply_rotary_pos_emb_interleave
    q, k, cos, sin = _views(heads, nope, lora, batch, TOKENS)
    exact = theirs(q.double(), k.double(), cos.double(), sin.double())
    for got, want in zip(hf.apply_rotary_pos_emb_deepseek(q, k, cos, sin), exact):
        torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)
    q_in, k_in = fresh_like(q), fresh_like(k)
    lq_in, lk_in = fresh_like(q), fresh_like(k)
    backward = lambda: rope_qk.rope_cos_sin(q, k, cos, sin, 1, backward=True, pairs="deepseek")
    old_backward = lambda: before.rope_cos_sin(q, k, cos, sin, 1, backward=True,
                                               pairs="deepseek")
    same_bits = all(torch.equal(a, b) for a, b in zip(backward(), old_backward()))
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size() + 2 * batch * TOKENS * ROPE // 2 * 2
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls = {
        "ours": lambda: hf.apply_rotary_pos_emb_deepseek(q, k, cos, sin),
        "ours backward": backward,
        "ours backward k blocks before": old_backward,
        "ours in place": lambda: hf.apply_rotary_pos_emb_deepseek_inplace(q_in, k_in, cos, sin),
        "llama's of ours": lambda: hf.apply_rotary_pos_emb(q, k, cos, sin),
        "llama's of ours in place": lambda: hf.apply_rotary_pos_emb_inplace(lq_in, lk_in, cos,
                                                                            sin),
        "transformers": lambda: theirs(q, k, cos, sin),
        "copy_same": lambda: dst.copy_(src),
    }
    with torch.no_grad():
        times = bench.shuffled_times(calls, rounds)
    rows = []
    for name in calls:
        row = dict(model=model, heads=heads, nope=nope, lora=lora, rope=ROPE, batch=batch,
                   tokens=TOKENS, held_out=model in HELD_OUT, call=name,
                   **timing_fields(times[name], nbytes, copy_gbps))
        if name == "ours backward":
            row["speed_over_before"] = [old_ms / ms for ms, old_ms in  # per round
                                        zip(times[name], times["ours backward k blocks before"])]
            row["same_bits"] = same_bits
        rows.append(row)
    return rows


def decode() -> list[dict]:
    heads, nope, lora, _ = SHAPES["deepseek_v3"]
    q, k, cos, sin = _views(heads, nope, lora, 1, 64)
    import transformers.models.deepseek_v3.modeling_deepseek_v3 as deepseek_v3

    with torch.no_grad():
        return [dict(model="deepseek_v3", heads=heads, batch=1, tokens=64, call=f"decode {name}",
                     us_per_call=bench.time_per_call_us(fn, repeats=4))
                for name, fn in (
                    ("ours", lambda: hf.apply_rotary_pos_emb_deepseek(q, k, cos, sin)),
                    ("transformers",
                     lambda: deepseek_v3.apply_rotary_pos_emb_interleave(q, k, cos, sin)))]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "hf_deepseek_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    before = flag_off_copy("DEEPSEEK_BACKWARD_K_BLOCKS")
    rows = []
    for model in SHAPES:
        rows += measure(model, args.rounds, copy_gbps, before)
        for r in rows[-8:]:
            print(f"{model:15s} {r['call']:30s} {r['mbytes']:8.1f} MB {r['time_us']:8.1f} us "
                  f"{r['of_copy']:.3f}", flush=True)
    rows += decode()
    for r in rows[-2:]:
        print(f"{r['call']:20s} {r['us_per_call']:.1f} us", flush=True)
    write_record(args.out, copy_gbps, "hf_deepseek", argv, args.rounds,
                 "q's and k's rotary slices read and written, plus the half of cos and sin that "
                 "the function reads, read once per token (bf16)", rows)


if __name__ == "__main__":
    main()
