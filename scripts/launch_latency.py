"""Where the microseconds of a decode-sized RoPE call go, for every entry point (GPU only).

    python scripts/launch_latency.py [--out figures/launch_latency.json] [--rounds 5]

Each row is the time per call of a Python loop of back-to-back calls (CUDA events around 2000
calls, best of 3), i.e. max(host time, GPU time): at decode size the GPU work is ~2 us, so this is
the host's cost of the call. Host time on the lent machines drifts by several microseconds for
seconds at a time, so the rows are timed in --rounds (5) rounds, every row once a round, and each
row reports its minimum over the rounds (``us_per_call``) and its maximum (``us_per_call_max``).
Shapes: 64 sequences of one token, 32 heads (q+k: 32 q and 8 k heads), head_dim 128, bf16. Also
the host-only pieces (argument checks, the plan lookup), timed with time.perf_counter, so the rows
can be read as sums.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import torch
import triton

import rope_kernels as rk
from rope_kernels import _launch, _ops, rope_qk
from rope_kernels._validate import validate_rope_args
from rope_kernels.bench import graph_replay as graph_of, provenance, time_per_call_us


ROUNDS = 5


def host_us(fn, n=20000) -> float:
    for _ in range(100):
        fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    dev = torch.device("cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    b, h, hk, d = 64, 32, 8, 128
    t = torch.randn(b, 1, h, d, device=dev, dtype=torch.bfloat16, generator=g)
    freqs = rk.RotaryPositionEmbedding(d, device=dev)(4096)
    starts = torch.randint(0, 4000, (b,), device=dev, dtype=torch.int32, generator=g)
    # (name, fn, host-only?, switches: (object, attribute, value) set while the row is timed)
    registered = []
    # torch.compile's rows come last: in one run (H200, 2026-11-23) the eager calls timed after
    # a compiled one were up to 6 us slower than in a fresh process.
    compile_rows = []

    def row(name, fn, host=False, switches=()):
        registered.append((name, fn, host, switches))

    # TransformerEngine-style apply_rotary_pos_emb, bshd [64, 1, 32, 128] bf16
    row("torch.empty_like(t) alone", lambda: torch.empty_like(t))
    # What PyTorch itself pays per call on the same host, for scale: one native elementwise
    # kernel through the dispatcher, with and without allocating its output.
    neg_out = torch.empty_like(t)
    row("torch reference: t.neg() (allocation + one native kernel, through the dispatcher)",
        lambda: t.neg())
    row("torch reference: torch.neg(t, out=o) (one native kernel, output given)",
        lambda: torch.neg(t, out=neg_out))
    for label, sp in (("with start_positions", starts), ("no start_positions", None)):
        call = lambda sp=sp: rk.apply_rotary_pos_emb(t, freqs, "bshd", sp, fused=True)  # noqa: E731
        fast = lambda sp=sp: rk.apply_rotary_pos_emb(t, freqs, "bshd", sp, fused=True,  # noqa: E731
                                                     validate=False)
        row(f"te {label}: default call (values checked: host copy)", call)
        row(f"te {label}: validate=False", fast)
        row(f"te {label}: validate=False, shortcut through thin_launch (no shortest path)",
            fast, switches=[(_launch, "SHORTEST", False)])
        row(f"te {label}: validate=False, full path (no shortcut)", fast,
            switches=[(rk.api._SHORTCUTS, "enabled", False)])
        row(f"te {label}: rope_2d directly (no checks)", lambda sp=sp: rk.rope_2d(t, freqs, "bshd", sp))
        row(f"te {label}: torch.ops.rope_kernels.rope (the dispatcher)",
            lambda sp=sp: _ops.rope(t, freqs, "bshd", sp, False, None, 1, 0, "2d", False))
        row(f"te {label}: validate=False, Triton's own dispatch (thin launch off)", fast,
            switches=[(_launch, "ENABLED", False)])
        row(f"te {label}: CUDA graph replay of the default call", graph_of(call))
        compile_rows.append((f"te {label}: torch.compile(mode='reduce-overhead') of the default "
                             "call", call))
    # The thin launch taken apart, on the plan of the last rope_2d call.
    import importlib

    r2 = importlib.import_module("rope_kernels.rope_2d")
    for _ in range(3):  # the thin path owns a plan's kernel from the third call on
        rk.rope_2d(t, freqs, "bshd")
    plan = r2._PLANS[next(reversed(r2._PLANS))]
    pointers = (t, freqs, torch.empty_like(t), t, t)
    entry = next(v for v in plan.compiled.values() if isinstance(v, tuple))
    compiled, tail, direct = entry
    driver = triton.runtime.driver.active
    dev = driver.get_current_device()
    stream = driver.get_current_stream(dev)
    ptrs = [p.data_ptr() for p in pointers]
    g0, g1, g2 = plan.grid
    row("launch pieces: CompiledKernel.run alone, arguments ready (Triton's launcher)",
        lambda: compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                             None, None, None, *ptrs, *tail))
    if direct is not None:
        c_launch, cooperative, pdl, parsing = direct
        if parsing is None:  # triton 3.6: a C function generated for the kernel
            def c_call():
                c_launch(g0, g1, g2, stream, compiled.function, cooperative, pdl, None, None,
                         compiled.packed_metadata, None, None, None, *ptrs, *tail)
        else:  # triton 3.7 to 3.9: the driver's C function, told how to parse the arguments
            def c_call():
                c_launch(g0, g1, g2, stream, compiled.function, cooperative, pdl,
                         compiled.packed_metadata, None, None, None, None, None, *parsing,
                         (*ptrs, *tail))
        row("launch pieces: Triton's C launch function alone, arguments ready (what the thin "
            "launch calls)", c_call)
    else:
        print("(the compiled kernel's launcher is not the one the direct call was written for)")
    # The armed shortcuts' own launcher, given the call's tensors as a Shortcut gives them (t
    # fills the two unused pointer arguments too); it reads the distinct ones' addresses.
    slots = [next(i for i, x in enumerate(pointers) if x is p) for p in pointers]
    shortcut = _launch.Shortcut(r2.rope_2d_kernel, plan, slots, ())
    own = _launch._own_plan(compiled, plan, shortcut.sources, shortcut.tensors)
    if own is not None:
        own_launch, own_plan = own
        row("launch pieces: the shortcuts' own C launcher alone, tensors ready (what an armed "
            "shortcut calls; it reads their addresses)",
            lambda: own_launch(own_plan, stream, pointers, ()))
    else:
        print("(the shortcuts' own launcher does not apply here)")
    row("launch pieces: _launch.thin_launch (pointers, device, stream, checks + the above)",
        lambda: _launch.thin_launch(r2.rope_2d_kernel, plan, pointers))
    row("host only: driver.get_current_device() + get_current_stream()",
        lambda: driver.get_current_stream(driver.get_current_device()), True)
    if _launch._EMPTY_STRIDED_CUDA is not None:
        row("host only: the shortest path's allocation (inductor's empty_strided_cuda)",
            lambda: _launch._EMPTY_STRIDED_CUDA(tuple(t.shape), t.stride(), t.dtype), True)
    row("host only: torch.empty_like(t)", lambda: torch.empty_like(t), True)
    row("host only: data_ptr() of the 5 pointer arguments", lambda: [p.data_ptr() for p in pointers], True)
    # What a call pays before its launch on an armed shortcut: the tensor check (one guard a
    # tensor given; a None one is left out) and the test that Triton's dispatch is plain.
    for tensors in ((t, freqs), (t, freqs, starts)):
        check = _launch.tensor_check(tensors)
        if check:
            row(f"host only: a shortcut's tensor check, {len(tensors)} tensors",
                lambda check=check, tensors=tensors: check(*tensors), True)
    row("host only: _launch._dispatch_is_plain (Triton's hooks and debug flags)",
        lambda: _launch._dispatch_is_plain(r2.rope_2d_kernel), True)
    row("host only: metadata checks, signature remembered",
        lambda: validate_rope_args(t, freqs, "bshd", starts, False, None, 1, 0, True, False), True)
    row("host only: value checks of start_positions (host copy)",
        lambda: validate_rope_args(t, freqs, "bshd", starts, False, None, 1, 0, True, True), True)

    # FlashInfer-style apply_rope_with_cos_sin_cache: 64 tokens, 32 q + 8 k heads
    q = torch.randn(b, h * d, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(b, hk * d, device=dev, dtype=torch.bfloat16, generator=g)
    f = freqs[:, 0, 0, : d // 2]
    cache = torch.cat((f.cos(), f.sin()), -1).contiguous()
    positions = torch.randint(0, 4096, (b,), device=dev, generator=g)
    call = lambda: rk.apply_rope_with_cos_sin_cache(positions, q, k, d, cache)  # noqa: E731
    row("cache: default call (positions checked: host copy)", call)
    row("cache: validate=False",
        lambda: rk.apply_rope_with_cos_sin_cache(positions, q, k, d, cache, validate=False))
    inplace = lambda: rk.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache,  # noqa: E731
                                                               validate=False)
    row("cache: in place, validate=False", inplace)
    row("cache: in place, validate=False, shortcut through thin_launch (no shortest path)",
        inplace, switches=[(_launch, "SHORTEST", False)])
    row("cache: in place, validate=False, full path (no shortcut)", inplace,
        switches=[(rk.api._SHORTCUTS, "enabled", False)])
    row("cache: rope_qk.rope_cos_sin_cache directly", lambda: rope_qk.rope_cos_sin_cache(
        positions, q, k, d, cache))
    row("cache: CUDA graph replay of the in-place default call", graph_of(
        lambda: rk.apply_rope_with_cos_sin_cache_inplace(positions, q, k, d, cache)))
    try:
        from liger_kernel.ops.rope import rope_forward

        ql, kl = q.view(b, 1, h, d).transpose(1, 2), k.view(b, 1, hk, d).transpose(1, 2)
        cos, sin = torch.cat((f, f), -1)[:1].cos()[None].bfloat16(), torch.cat((f, f), -1)[:1].sin()[None].bfloat16()
        row("Liger-Kernel rope_forward (q+k in place; positions 0 only)",
            lambda: rope_forward(ql, kl, cos, sin))
    except Exception as e:  # noqa: BLE001
        print("Liger-Kernel not timed:", type(e).__name__, e)

    # Hugging Face-style hf.apply_rotary_pos_emb: q [64, 32, 1, 128], k [64, 8, 1, 128]
    qh, kh = q.view(b, 1, h, d).transpose(1, 2), k.view(b, 1, hk, d).transpose(1, 2)
    ang = torch.cat((f, f), -1)[positions][:, None]
    cos, sin = ang.cos().bfloat16(), ang.sin().bfloat16()
    row("hf: apply_rotary_pos_emb", lambda: rk.hf.apply_rotary_pos_emb(qh, kh, cos, sin))

    # TransformerEngine-style apply_fused_qkv_rotary_pos_emb: qkv [1, 64, 8, 6 * 128] sbhd
    qkv = torch.randn(1, b, hk, 6 * d, device=dev, dtype=torch.bfloat16, generator=g)
    row("qkv: validate=False", lambda: rk.apply_fused_qkv_rotary_pos_emb(
        qkv, freqs, freqs, [4 * d, d, d], validate=False))

    def measure(group):
        values = {name: [] for name, *_ in group}
        for _ in range(args.rounds):
            for name, fn, host, switches in group:
                saved = [(obj, attr, getattr(obj, attr)) for obj, attr, _ in switches]
                for obj, attr, value in switches:
                    setattr(obj, attr, value)
                try:
                    values[name].append(host_us(fn) if host else time_per_call_us(fn))
                finally:
                    for obj, attr, value in saved:
                        setattr(obj, attr, value)
        return values

    print(f"timing {len(registered)} rows, {args.rounds} rounds")
    rounds = measure(registered)
    rounds.update(measure([(name, torch.compile(call, mode="reduce-overhead", fullgraph=True),
                            False, ()) for name, call in compile_rows]))
    rows = {name: round(min(v), 2) for name, v in rounds.items()}
    spread = {name: round(max(v), 2) for name, v in rounds.items()}
    for name in rows:
        print(f"{rows[name]:8.2f} us  (max {spread[name]:7.2f})  {name}")

    result = {"provenance": provenance(0.0, "launch_latency"), "us_per_call": rows,
              "us_per_call_max": spread, "rounds": args.rounds,
              "triton": triton.__version__, "thin_launch_enabled_at_end": _launch.ENABLED}
    result["provenance"].pop("copy_gbps")
    result["provenance"].pop("bytes")
    result["provenance"]["command"] = "python scripts/launch_latency.py"
    result["provenance"]["timing"] = (
        f"back-to-back calls timed with CUDA events (bench.time_per_call_us), in {args.rounds} "
        "rounds, every row once a round: us_per_call the fastest round, us_per_call_max the "
        "slowest; 'host only' rows time.perf_counter over 20000 calls")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
