"""``rope_kernels.flashinfer``'s apply_rope_pos_ids family (the angles computed in the kernel)
against the cos/sin-cache call at the same serving shapes, and a copy of the same bytes (GPU
only).

    python scripts/flashinfer_pos_ids.py [--out figures/flashinfer_pos_ids_h200.json] [--rounds 5]

q ``[nnz, 32, 128]`` and k ``[nnz, 8, 128]`` bf16 (Llama 3 8B's heads), views into one packed
qkv buffer as FlashInfer's example passes them, positions int32 in shuffled order below 8192.
Shapes: nnz 16384 and 65536 with half-split pairs and default frequencies; at 65536 also Llama
3.1's frequencies, interleaved pairs, and half of each head rotated (rotary_dim 64).

Rows per shape, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled
rounds:
- ``pos_ids`` / ``pos_ids in place``: ``apply_rope_pos_ids`` (``apply_llama31_rope_pos_ids``);
- ``cache`` / ``cache in place``: ``apply_rope_with_cos_sin_cache`` on a cache of 8192 rows made
  from the same frequencies (FlashInfer's other way to the same rotation);
- ``ragged``: ``apply_rope`` on 16 segments covering the tokens (two launches: positions, then
  the rotation; ``validate=False``);
- ``copy_same``: a copy of the bytes ``pos_ids`` moves.
Bytes: q and k read and written once (in place with part of the head rotated: only the rotated
channels), plus the positions (4 B a token); the cache calls also read each token's cache row
(rotary_dim float32 values), counted. A decode-sized call (64 tokens) is timed back to back
(``bench.time_per_call_us``: Python launch included) for pos_ids, in place and the cache call.
Before timing, each call is checked against the float64 reference and the in-place calls against
the out-of-place ones (bits).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import rope_kernels.flashinfer as fi  # noqa: E402
from hf_conventions import timing_fields  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402
from rope_kernels.reference import pos_ids_reference  # noqa: E402

Q_HEADS, K_HEADS, HEAD_DIM, MAX_POSITION = 32, 8, 128, 8192
# name -> (tokens, llama31, interleave, rotary_dim)
SHAPES = {
    "16384 tokens": (16384, False, False, None),
    "65536 tokens": (65536, False, False, None),
    "65536 tokens, llama 3.1": (65536, True, False, None),
    "65536 tokens, interleaved": (65536, False, True, None),
    "65536 tokens, rotary_dim 64": (65536, False, False, 64),
}


def make_inputs(tokens, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn(tokens, Q_HEADS + 2 * K_HEADS, HEAD_DIM, device="cuda",
                      dtype=torch.bfloat16, generator=g)
    pos_ids = torch.randint(0, MAX_POSITION, (tokens,), device="cuda", dtype=torch.int32,
                            generator=g)
    return qkv[:, :Q_HEADS], qkv[:, Q_HEADS:Q_HEADS + K_HEADS], pos_ids


def calls_of(tokens, llama31, interleave, rotary_dim):
    q, k, pos_ids = make_inputs(tokens)
    kw = dict(rotary_dim=rotary_dim, interleave=interleave)
    if llama31:
        out_fn, in_fn = fi.apply_llama31_rope_pos_ids, fi.apply_llama31_rope_pos_ids_inplace
        table = rope_qk.inv_freq_table(rotary_dim or HEAD_DIM, 8, 5e5, q.device, (1, 4, 8192))
    else:
        out_fn, in_fn = fi.apply_rope_pos_ids, fi.apply_rope_pos_ids_inplace
        table = rope_qk.inv_freq_table(rotary_dim or HEAD_DIM, 1, 1e4, q.device)
    angles = torch.arange(MAX_POSITION, device="cuda", dtype=torch.float32)[:, None] * table
    cache = torch.cat((angles.cos(), angles.sin()), -1)
    q_rope, k_rope = out_fn(q, k, pos_ids, **kw)
    for got, x in ((q_rope, q), (k_rope, k)):
        torch.testing.assert_close(got.double(), pos_ids_reference(pos_ids, x, table, interleave),
                                   rtol=2**-7, atol=1e-5)
    q_in, k_in = q.clone(), k.clone()
    in_fn(q_in, k_in, pos_ids, **kw)
    assert torch.equal(q_in, q_rope) and torch.equal(k_in, k_rope), "in place differs"
    # the cache call's q and k flattened ([nnz, heads * head_dim] views of the same buffers)
    q2, k2 = q.flatten(1), k.flatten(1)
    cq, ck = fi.apply_rope_with_cos_sin_cache(pos_ids, q2, k2, HEAD_DIM, cache,
                                              is_neox=not interleave, validate=False)
    torch.testing.assert_close(cq.view_as(q).double(), q_rope.double(), rtol=2**-7, atol=1e-2)
    qc, kc = q_in.flatten(1).clone(), k_in.flatten(1).clone()
    bounds = torch.linspace(0, tokens, 17, device="cuda").round().to(torch.int32)
    offsets = torch.randint(0, MAX_POSITION // 2, (16,), device="cuda", dtype=torch.int32)
    rotary = rotary_dim or HEAD_DIM
    size = q.element_size()
    qk = (Q_HEADS + K_HEADS) * tokens
    moved = 2 * qk * HEAD_DIM * size + 4 * tokens
    moved_in_place = 2 * qk * rotary * size + 4 * tokens
    cache_rows = tokens * rotary * 4
    ragged_kw = dict(kw, validate=False)
    if llama31:
        ragged = lambda: fi.apply_llama31_rope(q, k, bounds, offsets, **ragged_kw)  # noqa: E731
    else:
        ragged = lambda: fi.apply_rope(q, k, bounds, offsets, **ragged_kw)  # noqa: E731
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    neox = not interleave
    return {
        "pos_ids": (lambda: out_fn(q, k, pos_ids, **kw), moved),
        "pos_ids in place": (lambda: in_fn(q_in, k_in, pos_ids, **kw), moved_in_place),
        "cache": (lambda: fi.apply_rope_with_cos_sin_cache(pos_ids, q2, k2, HEAD_DIM, cache,
                                                           is_neox=neox, validate=False),
                  moved + cache_rows),
        "cache in place": (lambda: fi.apply_rope_with_cos_sin_cache_inplace(
            pos_ids, qc, kc, HEAD_DIM, cache, is_neox=neox, validate=False),
            moved_in_place + cache_rows),
        "ragged": (ragged, moved),
        "copy_same": (lambda: dst.copy_(src), moved),
    }


def measure(name, rounds, copy_gbps):
    tokens, llama31, interleave, rotary_dim = SHAPES[name]
    calls = calls_of(tokens, llama31, interleave, rotary_dim)
    fns = {n: fn for n, (fn, _) in calls.items()}
    with torch.no_grad():
        times = bench.shuffled_times(fns, rounds)
    rows = []
    for call, (_, nbytes) in calls.items():
        rows.append(dict(shape=name, tokens=tokens, llama31=llama31, interleave=interleave,
                         rotary_dim=rotary_dim or HEAD_DIM, call=call,
                         **timing_fields(times[call], nbytes, copy_gbps)))
    return rows


def decode_rows():
    calls = calls_of(64, False, False, None)
    rows = []
    with torch.no_grad():
        for call in ("pos_ids", "pos_ids in place", "cache", "cache in place", "ragged"):
            rows.append(dict(shape="decode 64 tokens", tokens=64, call=call,
                             us_per_call=bench.time_per_call_us(calls[call][0], calls=2000)))
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "flashinfer_pos_ids_h200.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for name in SHAPES:
        new = measure(name, args.rounds, copy_gbps)
        for r in new:
            print(f"{name:28s} {r['call']:17s} {r['mbytes']:8.1f} MB {r['time_us']:8.1f} us "
                  f"{r['of_copy']:.3f}", flush=True)
        rows += new
    for r in decode_rows():
        print(f"{r['shape']:28s} {r['call']:17s} back to back {r['us_per_call']:.1f} us",
              flush=True)
        rows.append(r)
    prov = bench.provenance(copy_gbps, "flashinfer_pos_ids")
    prov["command"] = "python scripts/flashinfer_pos_ids.py " + " ".join(
        argv if argv is not None else sys.argv[1:])
    prov["bytes"] = ("q and k read and written once (in place with part of the head rotated: "
                     "the rotated channels only), plus 4 B of position a token; the cache calls "
                     "also each token's cache row (rotary_dim float32)")
    prov["timing"] = (f"triton.testing.do_bench median over {args.rounds} shuffled rounds (L2 "
                      "flushed per call); decode: back-to-back calls timed with CUDA events, "
                      "Python launch included")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    print("wrote", args.out)


if __name__ == "__main__":
    main()
