"""Where the q+k calls lose time against a copy under 1 GB: a scan over sizes (GPU only).

    python scripts/qk_size_scan.py [--out figures/qk_size_scan_h200.json] [--rounds 5]

Under 1 GB the q+k calls (the cos/sin cache, Hugging Face's tables) fall short of a copy of the
same bytes by a few microseconds a call, more than rope_2d does on one tensor of the same bytes
(docs/performance_notes.md, the shortfalls). This times, at bf16 32 q / 8 k heads of 128 and 16
sequences of 512-4096 tokens (168-1343 MB), in shuffled rounds (``bench.time_ms``, do_bench's
median, as the benchmark):

- ``copy_same``: a contiguous device copy of the same bytes (the benchmark's ``copy_same_gbps``);
- ``stream SxH Nw``: a Triton kernel that copies q and k into new tensors in one launch, programs
  of S tokens x H heads on N warps in the order of rope_qk's (a token's head blocks of q, then
  of k): the q+k access pattern with no angles, no positions and no arithmetic;
- ``cache``: ``rope_qk.rope_cos_sin_cache`` out of place, its default plan, and forced tiles;
  ``parts outer`` / ``parts inner``: the default tile with q's programs all before k's
  (``rope_qk.PARTS_OUTER``) or each token's head blocks of q and k side by side;
- ``cache in place`` and ``hf`` (``rope_qk.rope_cos_sin`` on Hugging Face's [b, h, s, d] views),
  likewise;
- ``rope_2d bshd``: our TE-style call on one bshd tensor of 40 heads (the bytes of q and k).

For each it gives the median time, its distance from ``copy_same`` in microseconds, and a line
fitted to time against bytes over the sizes (intercept: microseconds a call pays whatever its
size; slope: as GB/s). A fixed distance points at the first and last waves of programs, a
distance that grows with the bytes at the steady stream.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

import torch
import triton
import triton.language as tl

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from qk_in_place_rotated_only import _tile  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402
from rope_kernels.api import apply_rotary_pos_emb  # noqa: E402

SEQ_LENS = (512, 1024, 2048, 4096)
BATCH, Q_HEADS, K_HEADS, HEAD_DIM = 16, 32, 8, 128


@triton.jit
def stream_qk_kernel(q_ptr, q_out_ptr, k_ptr, k_out_ptr, tokens,
                     Q_WIDTH: tl.constexpr, K_WIDTH: tl.constexpr, BLOCK_S: tl.constexpr,
                     BLOCK_E: tl.constexpr, PARTS_OUTER: tl.constexpr):
    """q [tokens, Q_WIDTH] and k [tokens, K_WIDTH] copied to q_out and k_out: a program copies
    BLOCK_S tokens x BLOCK_E elements, head blocks of q then of k fastest, then token blocks
    (``PARTS_OUTER``: all of q's programs, then all of k's)."""
    Q_BLOCKS: tl.constexpr = Q_WIDTH // BLOCK_E
    K_BLOCKS: tl.constexpr = K_WIDTH // BLOCK_E
    pid = tl.program_id(0)
    if PARTS_OUTER:
        q_programs = tl.cdiv(tokens, BLOCK_S) * Q_BLOCKS
        if pid < q_programs:
            pid_h = pid % Q_BLOCKS
            pid_s = pid // Q_BLOCKS
        else:
            pid_h = Q_BLOCKS + (pid - q_programs) % K_BLOCKS
            pid_s = (pid - q_programs) // K_BLOCKS
    else:
        pid_h = pid % (Q_BLOCKS + K_BLOCKS)
        pid_s = pid // (Q_BLOCKS + K_BLOCKS)
    s = (pid_s * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)[:, None]
    e = tl.arange(0, BLOCK_E)[None, :]
    mask = s < tokens
    if pid_h < Q_BLOCKS:
        offsets = s * Q_WIDTH + pid_h * BLOCK_E + e
        tl.store(q_out_ptr + offsets, tl.load(q_ptr + offsets, mask=mask), mask=mask)
    else:
        offsets = s * K_WIDTH + (pid_h - Q_BLOCKS) * BLOCK_E + e
        tl.store(k_out_ptr + offsets, tl.load(k_ptr + offsets, mask=mask), mask=mask)


def stream(q, k, block_s, block_e, num_warps, parts_outer=False):
    """The streaming kernel on q, k [tokens, width] into new tensors, as one launch."""
    tokens, q_width, k_width = q.shape[0], q.shape[1], k.shape[1]
    blocks = q_width // block_e + k_width // block_e
    grid = (triton.cdiv(tokens, block_s) * blocks,)

    def call():
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        stream_qk_kernel[grid](q, q_out, k, k_out, tokens, Q_WIDTH=q_width, K_WIDTH=k_width,
                               BLOCK_S=block_s, BLOCK_E=block_e, PARTS_OUTER=parts_outer,
                               num_warps=num_warps)
        return q_out, k_out
    return call


# Forced tiles of the cache call (the default at this shape is one token's 8 heads on 2 warps).
CACHE_TILES = {"2x8 4w": _tile(2, 8, 4)}
STREAMS = {"1x8 2w": (1, 1024, 2, False), "2x8 4w": (2, 1024, 4, False),
           "1x8 2w parts outer": (1, 1024, 2, True), "2x8 4w parts outer": (2, 1024, 4, True)}


def forced(config, call, **flags):
    """``call`` on the plan that ``config`` gives in place of rope_qk's default_config (None: the
    default) with rope_qk's module ``flags`` set (e.g. ``PARTS_OUTER=True``): planned once here,
    then put in rope_qk's plan table under the call's key for each launch (and the default plan
    of that key put back after it). The plan is the returned call's ``plan``."""
    saved = dict(rope_qk._PLANS)
    rope_qk._PLANS.clear()
    default = rope_qk.default_config
    before_flags = {name: getattr(rope_qk, name) for name in flags}
    if config is not None:
        rope_qk.default_config = lambda *args, **kwargs: dict(config)
    for name, value in flags.items():
        setattr(rope_qk, name, value)
    try:
        call()
    finally:
        rope_qk.default_config = default
        for name, value in before_flags.items():
            setattr(rope_qk, name, value)
    (key, plan), = rope_qk._PLANS.items()
    rope_qk._PLANS.clear()
    rope_qk._PLANS.update(saved)

    def run():
        before = rope_qk._PLANS.get(key)
        rope_qk._PLANS[key] = plan
        try:
            return call()
        finally:
            if before is None:
                rope_qk._PLANS.pop(key)
            else:
                rope_qk._PLANS[key] = before
    run.plan = plan
    return run


def every_plan(all_heads, token_blocks_fastest, has_v, q_heads, k_heads, block_h, block_hk):
    """In place of rope_qk._parts_outer: every plan of one head block in memory order ordered by
    part, whatever its blocks hold."""
    return not all_heads and not token_blocks_fastest


def same(a, b) -> bool:
    """The results of two calls (a tensor, or a tuple of them) equal bit for bit."""
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    return all(torch.equal(x, y) for x, y in zip(a, b))


def calls(seq_len):
    """name -> (call, bytes the benchmark counts for it), at 16 sequences of ``seq_len`` tokens."""
    p = bench.QKProblem(seq_len=seq_len, batch=BATCH, heads=Q_HEADS, k_heads=K_HEADS,
                        head_dim=HEAD_DIM)
    q, k = p.tokens(p.q), p.tokens(p.k)
    qi, ki = q.clone(), k.clone()
    src = torch.empty(p.nbytes // 2 // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = bench.Problem("bshd", "bf16", seq_len, BATCH, Q_HEADS + K_HEADS, HEAD_DIM)
    fns = {"copy_same": (lambda: dst.copy_(src), p.nbytes)}
    same_bits = {}  # forced tiles: their results equal the default plan's, bit for bit
    for name, (block_s, block_e, warps, parts_outer) in STREAMS.items():
        fns[f"stream {name}"] = (stream(q, k, block_s, block_e, warps, parts_outer), p.nbytes)
        q_out, k_out = fns[f"stream {name}"][0]()
        assert torch.equal(q_out, q) and torch.equal(k_out, k), name
    cache = lambda: rope_qk.rope_cos_sin_cache(p.positions, q, k, HEAD_DIM, p.cache)  # noqa: E731
    fns["cache"] = (cache, p.nbytes)
    expected = cache()
    for name, config in CACHE_TILES.items():
        fns[f"cache {name}"] = (forced(config, cache), p.nbytes)
        same_bits[f"cache {name}"] = same(fns[f"cache {name}"][0](), expected)
    # The program order by part (rope_qk.PARTS_OUTER) on and off, whatever the rule chooses.
    for name, flag in (("cache parts outer", True), ("cache parts inner", False)):
        fns[name] = (forced(None, cache, PARTS_OUTER=flag), p.nbytes)
        same_bits[name] = same(fns[name][0](), expected)
    in_place = lambda: rope_qk.rope_cos_sin_cache(  # noqa: E731
        p.positions, qi, ki, HEAD_DIM, p.cache, query_out=qi, key_out=ki)
    fns["cache in place"] = (in_place, p.nbytes)
    fns["cache in place parts outer"] = (forced(None, in_place, PARTS_OUTER=True), p.nbytes)
    fns["cache in place parts inner"] = (forced(None, in_place, PARTS_OUTER=False), p.nbytes)
    hq, hk = p.q.transpose(1, 2), p.k.transpose(1, 2)
    hf = lambda: rope_qk.rope_cos_sin(hq, hk, p.cos, p.sin, 1)  # noqa: E731
    fns["hf"] = (hf, p.nbytes)
    # Hugging Face's 4 KB blocks of q at this shape leave k's blocks half empty: the rule keeps
    # them in the order before; here they are forced into the order by part.
    fns["hf parts outer"] = (forced(None, hf, PARTS_OUTER=True, _parts_outer=every_plan),
                             p.nbytes)
    expected = hf()
    same_bits["hf parts outer"] = same(fns["hf parts outer"][0](), expected)
    fns["rope_2d bshd"] = (lambda: apply_rotary_pos_emb(t.t, t.freqs, "bshd", fused=True,
                                                         validate=False), t.nbytes)
    return fns, p, same_bits


# The timing of the A/B scripts that time with ``bench.time_ms_host_ahead`` (bench.provenance's
# own "timing" describes the benchmark's do_bench).
HOST_AHEAD_TIMING = ("bench.time_ms_host_ahead median (L2 flushed per call, the GPU kept busy "
                     "after each flush so that the host is ahead and the time is the GPU's "
                     "alone), every call once a round in shuffled rounds; decode per_call_us: "
                     "back-to-back calls timed with CUDA events (bench.time_per_call_us), "
                     "Python launch included, through the script's module copies and launcher")


def provenance(copy_gbps: float, mode: str, command: str, timing: str | None = None) -> dict:
    """``bench.provenance`` (which records the checkout's commit and source digest) with the
    script's command line, and the commit again as ``source_commit``, the name these scripts'
    records give it; ``timing``, if given, replaces the benchmark's description of its timer."""
    record = bench.provenance(copy_gbps, mode)
    record.update(command=command, source_commit=record["commit"])
    if timing is not None:
        record["timing"] = timing
    return record


def fit(sizes_bytes, times_us):
    """Least-squares line time = intercept + bytes / bandwidth: (intercept us, bandwidth GB/s)."""
    n = len(sizes_bytes)
    mx, my = sum(sizes_bytes) / n, sum(times_us) / n
    sxx = sum((x - mx) ** 2 for x in sizes_bytes)
    slope = sum((x - mx) * (y - my) for x, y in zip(sizes_bytes, times_us)) / sxx  # us per byte
    return my - slope * mx, 1e-3 / slope


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for seq_len in SEQ_LENS:
        fns, p, same_bits = calls(seq_len)
        nbytes = p.nbytes
        fractions = bench.shuffled_rounds({n: f for n, (f, _) in fns.items()}, nbytes, copy_gbps,
                                          args.rounds)
        # Times from the fractions (each call's own byte count only matters for rope_2d's row).
        times = {n: [nbytes / (f * copy_gbps) / 1e3 for f in fr] for n, fr in fractions.items()}
        copy_us = statistics.median(times["copy_same"])
        for name, ts in times.items():
            t_us = statistics.median(ts)
            rows.append(dict(name=name, seq_len=seq_len, batch=BATCH, mbytes=fns[name][1] / 1e6,
                             time_us=t_us, spread_us=[min(ts), max(ts)],
                             of_copy=fns[name][1] / (t_us * 1e3) / copy_gbps,
                             beyond_copy_same_us=t_us - copy_us * fns[name][1] / nbytes,
                             same_bits=same_bits.get(name)))
        print(f"{seq_len:5d} tokens x {BATCH}, {nbytes / 1e6:.0f} MB: " + ", ".join(
            f"{r['name']} {r['of_copy']:.3f} ({r['beyond_copy_same_us']:+.1f} us)"
            for r in rows if r["seq_len"] == seq_len), flush=True)
        print(f"  forced tiles equal to the default plan bit for bit: {same_bits}")
        del fns, p
        torch.cuda.empty_cache()
    fits = {}
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        intercept, gbps = fit([r["mbytes"] * 1e6 for r in mine], [r["time_us"] for r in mine])
        fits[name] = dict(intercept_us=intercept, slope_gbps=gbps, slope_of_copy=gbps / copy_gbps)
        print(f"{name:16s} time = {intercept:5.2f} us + bytes / {gbps:6.0f} GB/s "
              f"({gbps / copy_gbps:.3f} of copy)")
    record = dict(provenance=provenance(copy_gbps, "qk_size_scan",
                                        f"python scripts/qk_size_scan.py --rounds {args.rounds}"),
                  rows=rows, fits=fits)
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
