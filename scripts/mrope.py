"""``apply_mrope_with_cos_sin_cache`` (multimodal RoPE, ``rope_kernels/rope_mrope.py``) against
the plain cos/sin-cache call at the same shapes, vLLM's native PyTorch path, Liger-Kernel's
Qwen2-VL M-RoPE kernel where installed, and a copy of the same bytes (GPU only).

    python scripts/mrope.py [--out figures/mrope_h200.json] [--rounds 5] [--sweep]

Shapes (bf16, q and k views into one packed qkv buffer as vLLM passes them, positions int64
[3, tokens] drawn below 8192):
- Qwen2.5-VL-7B: 28 q / 4 k heads of 128, ``mrope_section`` [16, 24, 24], 16384 and 65536 tokens;
- Qwen3-VL-8B: 32 q / 8 k heads of 128, [24, 20, 20] interleaved, 65536 tokens;
- GLM-4.1V-9B: 32 q / 2 k heads of 128, half of each head rotated, [8, 12, 12], 65536 tokens.

Rows per shape, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled
rounds:
- ``mrope`` / ``mrope in place``: ours (``validate=False``);
- ``cache`` / ``cache in place``: ``apply_rope_with_cos_sin_cache`` with the T positions only
  (plain RoPE through the tuned q+k kernel: what the sections cost);
- ``vllm native``: vLLM's ``MRotaryEmbedding.forward_native`` formula in PyTorch eager (the
  cache in the model's dtype, gathered, sections concatenated, rotated, cat);
- ``liger``: Liger-Kernel's ``qwen2vl_mrope`` forward (in place, HF's cos/sin [3, 1, tokens,
  head_dim] in bf16, built beforehand and not timed), contiguous sections and whole heads only;
- ``copy_same``: a copy of the bytes ``mrope`` moves.
Bytes: q and k read and written once (in place with part of the head rotated: the rotated
channels only), the positions (3 x 8 B a token) and each token's rotary_dim float32 cache values
(cos and sin of every pair once, from the rows of its section's position). The peers are
charged the same bytes (what the job needs), not the extra bytes their own paths move.
A decode-sized call (64 tokens, Qwen2.5-VL-7B's heads) is timed back to back
(``bench.time_per_call_us``: Python launch included). ``--sweep`` also times the kernel's tiles
(heads per block, rows per program, warps) at 65536 tokens. Before timing, each call is checked
against the float64 reference, the in-place calls against the out-of-place ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from hf_conventions import timing_fields  # noqa: E402
from rope_kernels import (apply_mrope_with_cos_sin_cache, apply_mrope_with_cos_sin_cache_inplace,  # noqa: E402
                          apply_rope_with_cos_sin_cache, apply_rope_with_cos_sin_cache_inplace,
                          bench, rope_mrope)
from rope_kernels.reference import mrope_cos_sin_cache_reference  # noqa: E402

HEAD_DIM, MAX_POSITION = 128, 8192
# name -> (tokens, q heads, k heads, rotary_dim, mrope_section, interleaved sections)
SHAPES = {
    "qwen2.5-vl-7b 16384": (16384, 28, 4, 128, [16, 24, 24], False),
    "qwen2.5-vl-7b 65536": (65536, 28, 4, 128, [16, 24, 24], False),
    "qwen3-vl-8b 65536": (65536, 32, 8, 128, [24, 20, 20], True),
    "glm-4.1v-9b 65536": (65536, 32, 2, 64, [8, 12, 12], False),
}


def make_cache(rotary_dim):
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32,
                                              device="cuda") / rotary_dim)
    freqs = torch.arange(MAX_POSITION, dtype=torch.float32, device="cuda")[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), -1)


def make_inputs(tokens, q_heads, k_heads, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(tokens, (q_heads + 2 * k_heads) * HEAD_DIM, device="cuda",
                      dtype=torch.bfloat16, generator=g)
    positions = torch.randint(0, MAX_POSITION, (3, tokens), device="cuda", generator=g)
    return (qkv[:, :q_heads * HEAD_DIM], qkv[:, q_heads * HEAD_DIM:(q_heads + k_heads) * HEAD_DIM],
            positions)


def vllm_native(positions, query, key, cache, section, interleaved):
    """vLLM's MRotaryEmbedding.forward_native (half-split pairs), in PyTorch eager."""
    cos, sin = cache[positions].chunk(2, dim=-1)  # [3, T, R/2]
    if interleaved:
        j = torch.arange(cos.shape[-1], device=cos.device)
        on_h, on_w = (j % 3 == 1) & (j < 3 * section[1]), (j % 3 == 2) & (j < 3 * section[2])
        cos = torch.where(on_w, cos[2], torch.where(on_h, cos[1], cos[0]))
        sin = torch.where(on_w, sin[2], torch.where(on_h, sin[1], sin[0]))
    else:
        cos = torch.cat([m[i] for i, m in enumerate(cos.split(section, dim=-1))], dim=-1)
        sin = torch.cat([m[i] for i, m in enumerate(sin.split(section, dim=-1))], dim=-1)
    rotary_dim = cache.shape[-1]
    out = []
    for x in (query, key):
        x = x.view(x.shape[0], -1, HEAD_DIM)
        rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
        x1, x2 = rot.chunk(2, dim=-1)
        c, s = cos[:, None], sin[:, None]
        rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
        out.append(torch.cat((rot, rest), dim=-1).flatten(1))
    return out


def _liger(q, k, positions, cache, section, interleaved, rotary_dim):
    """Liger's forward on [1, heads, T, d] views of our [T, heads * d] buffers (its own
    transposes are then no copies), or None where it cannot run this call."""
    if interleaved or rotary_dim != HEAD_DIM:
        return None
    try:
        from liger_kernel.ops.qwen2vl_mrope import qwen2vl_mrope_forward
    except Exception:  # noqa: BLE001
        return None
    tokens = q.shape[0]
    cos, sin = cache[positions].chunk(2, dim=-1)  # [3, T, R/2]
    cos = torch.cat((cos, cos), -1)[:, None].to(q.dtype)  # HF's [3, 1, T, d]
    sin = torch.cat((sin, sin), -1)[:, None].to(q.dtype)
    qc, kc = q.contiguous(), k.contiguous()
    qv = qc.view(1, tokens, -1, HEAD_DIM).transpose(1, 2)
    kv = kc.view(1, tokens, -1, HEAD_DIM).transpose(1, 2)
    return lambda: qwen2vl_mrope_forward(qv, kv, cos, sin, section)


def calls_of(tokens, q_heads, k_heads, rotary_dim, section, interleaved):
    q, k, positions = make_inputs(tokens, q_heads, k_heads)
    cache = make_cache(rotary_dim)
    kw = dict(mrope_section=section, mrope_interleaved=interleaved, validate=False)
    q_out, k_out = apply_mrope_with_cos_sin_cache(positions, q, k, HEAD_DIM, cache, **kw)
    for got, x in ((q_out, q), (k_out, k)):
        ref = mrope_cos_sin_cache_reference(positions, x, HEAD_DIM, cache, section, interleaved)
        torch.testing.assert_close(got.double(), ref, rtol=2**-7, atol=1e-5)
    q_in, k_in = q.clone(), k.clone()
    apply_mrope_with_cos_sin_cache_inplace(positions, q_in, k_in, HEAD_DIM, cache, **kw)
    assert torch.equal(q_in, q_out) and torch.equal(k_in, k_out), "in place differs"
    nq, nk = vllm_native(positions, q, k, cache.to(q.dtype), section, interleaved)
    # (vLLM's path rounds cos and sin to the model's dtype: a few elements differ by 2 bf16 ulps.)
    torch.testing.assert_close(nq.double(), q_out.double(), rtol=2**-6, atol=6e-2)
    qc, kc = q.clone(), k.clone()
    t_pos = positions[0]
    size = q.element_size()
    heads = q_heads + k_heads
    moved = 2 * heads * tokens * HEAD_DIM * size + 8 * 3 * tokens + tokens * rotary_dim * 4
    moved_in_place = moved - 2 * heads * tokens * (HEAD_DIM - rotary_dim) * size
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls = {
        "mrope": (lambda: apply_mrope_with_cos_sin_cache(positions, q, k, HEAD_DIM, cache, **kw),
                  moved),
        "mrope in place": (lambda: apply_mrope_with_cos_sin_cache_inplace(
            positions, q_in, k_in, HEAD_DIM, cache, **kw), moved_in_place),
        "cache": (lambda: apply_rope_with_cos_sin_cache(t_pos, q, k, HEAD_DIM, cache,
                                                        validate=False),
                  moved - 16 * tokens),
        "cache in place": (lambda: apply_rope_with_cos_sin_cache_inplace(
            t_pos, qc, kc, HEAD_DIM, cache, validate=False), moved_in_place - 16 * tokens),
        "vllm native": (lambda: vllm_native(positions, q, k, cache.to(q.dtype), section,
                                            interleaved), moved),
        "copy_same": (lambda: dst.copy_(src), moved),
    }
    liger = _liger(q, k, positions, cache, section, interleaved, rotary_dim)
    if liger is not None:
        calls["liger"] = (liger, moved)
    return calls


def measure(name, rounds, copy_gbps):
    tokens, q_heads, k_heads, rotary_dim, section, interleaved = SHAPES[name]
    calls = calls_of(tokens, q_heads, k_heads, rotary_dim, section, interleaved)
    fns = {n: fn for n, (fn, _) in calls.items()}
    with torch.no_grad():
        times = bench.shuffled_times(fns, rounds)
    return [dict(shape=name, tokens=tokens, q_heads=q_heads, k_heads=k_heads,
                 rotary_dim=rotary_dim, mrope_section=section, interleaved=interleaved,
                 call=call, **timing_fields(times[call], nbytes, copy_gbps))
            for call, (_, nbytes) in calls.items()]


def sweep(rounds, copy_gbps):
    """Tiles of the kernel at every shape, out of place."""
    rows = []
    for name in SHAPES:
        tokens, q_heads, k_heads, rotary_dim, section, interleaved = SHAPES[name]
        q, k, positions = make_inputs(tokens, q_heads, k_heads)
        cache = make_cache(rotary_dim)
        moved = (2 * (q_heads + k_heads) * tokens * HEAD_DIM * 2 + 24 * tokens
                 + tokens * rotary_dim * 4)
        fns = {}
        for block_h, rows_per, warps, x_first in itertools.product(
                (2, 4, 8, 16), (16, 32, 64), (4, 8), (False, True)):
            config = dict(BLOCK_S=rows_per // block_h, BLOCK_H=block_h, num_warps=warps,
                          X_FIRST=x_first)
            fns[(block_h, rows_per, warps, x_first)] = (
                lambda c=config: rope_mrope.rope_mrope(positions, q, k, HEAD_DIM, cache, section,
                                                       interleaved, config=c))
        fns["default"] = lambda: rope_mrope.rope_mrope(positions, q, k, HEAD_DIM, cache, section,
                                                       interleaved)
        with torch.no_grad():
            times = bench.shuffled_times(fns, rounds)
        for key, t in times.items():
            row = dict(shape=name, tiles=key if key == "default" else
                       dict(BLOCK_H=key[0], rows=key[1], num_warps=key[2], X_FIRST=key[3]),
                       **timing_fields(t, moved, copy_gbps))
            rows.append(row)
            print(f"sweep {name:22s} {str(key):14s} {row['of_copy']:.3f}", flush=True)
    return rows


def decode_rows():
    calls = calls_of(64, 28, 4, 128, [16, 24, 24], False)
    rows = []
    with torch.no_grad():
        for call in ("mrope", "mrope in place", "cache", "cache in place", "vllm native"):
            rows.append(dict(shape="decode 64 tokens", tokens=64, call=call,
                             us_per_call=bench.time_per_call_us(calls[call][0], calls=2000)))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "figures" / "mrope_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sweep", action="store_true")
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name in SHAPES:
        new = measure(name, args.rounds, copy_gbps)
        for r in new:
            print(f"{name:22s} {r['call']:15s} {r['mbytes']:8.1f} MB {r['time_us']:8.1f} us "
                  f"{r['of_copy']:.3f}", flush=True)
        rows += new
    for r in decode_rows():
        print(f"{r['shape']:22s} {r['call']:15s} back to back {r['us_per_call']:.1f} us",
              flush=True)
        rows.append(r)
    sweep_rows = sweep(args.rounds, copy_gbps) if args.sweep else []
    prov = bench.provenance(copy_gbps, "mrope")
    prov["command"] = "python scripts/mrope.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    prov["bytes"] = ("q and k read and written once (in place with part of the head rotated: "
                     "the rotated channels only), 3 x 8 B of positions a token, and rotary_dim "
                     "float32 cache values a token; the plain cache call without the H and W "
                     "positions; every peer charged what the job needs")
    prov["timing"] = (f"triton.testing.do_bench median over {args.rounds} shuffled rounds (L2 "
                      "flushed per call); decode: back-to-back calls timed with CUDA events, "
                      "Python launch included")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"provenance": prov, "rows": rows, "sweep": sweep_rows},
                                   indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
