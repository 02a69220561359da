"""Why rope_qk loads its angle table ``evict_last`` (GPU only).

    python scripts/qk_table_hint.py [--out figures/qk_table_hint.json] [--rounds 5]

A q+k call reads, per token, q and k once and one row of the angle table (the cos/sin cache,
Hugging Face's cos and sin, or TransformerEngine's angles). The row is shared: every sequence
with a token at that position reads it again. Between two such reads the call streams the q and
k of a whole sequence through L2 (16 x 4096 tokens of 16 q / 4 k heads: 40 MB), which evicts the
row, so each read goes to memory: 512 B a token on top of the 10 KB of q and k moved, bytes the
benchmark does not count (it counts each row used once). This script shows it in two ways, in
shuffled rounds, as a fraction of the run's 2 GB copy (``triton.testing.do_bench`` median):

1. ``ceiling``: a Triton copy of q and k in one launch (one token a program, 4 warps); the same
   copy whose stores also wait on the token's cos/sin cache row (``x + 0 * row``), the row
   loaded normally or ``evict_last``.
2. ``entry points``: the package's rope_qk against the same file with the hint removed (its
   source with ``eviction_policy="evict_last"`` deleted, loaded as a module), both launched
   through the package's thin launch, at the benchmark's q+k shapes, forward and backward,
   Liger-Kernel beside where it runs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rope_kernels import _launch  # noqa: E402
from rope_kernels import rope_qk as hinted  # noqa: E402
from rope_kernels.bench import (QKProblem, QKVProblem, _liger_qk, copy_bandwidth_gbps,  # noqa: E402
                                provenance, time_ms_host_ahead)
from rope_kernels.bench import shuffled_rounds as bench_shuffled_rounds  # noqa: E402

# name -> QKProblem arguments (bf16, 16 x 4096 tokens, 32 q / 8 k heads of 128 unless said)
SHAPES = {
    "16q/4k": dict(heads=16, k_heads=4), "8q/8k": dict(heads=8), "32q/8k": {},
    "32q/32k": dict(k_heads=32), "64q/8k": dict(heads=64), "head_dim 64": dict(head_dim=64),
    "fp32": dict(dtype="fp32"), "fp16 16q/4k": dict(dtype="fp16", heads=16, k_heads=4),
    "1024 tokens": dict(seq_len=1024), "8192 tokens": dict(seq_len=8192),
    "batch 1": dict(batch=1), "batch 2": dict(batch=2), "batch 4": dict(batch=4),
    "16q/4k batch 4": dict(heads=16, k_heads=4, batch=4), "half rotary": dict(rotary_percent=0.5),
}
MODES = ("cache out of place", "cache in place", "hf", "cache backward", "hf backward")


@triton.jit
def copy_qk_kernel(q_ptr, q_out_ptr, k_ptr, k_out_ptr, table_ptr, seq_len,
                   Q_HEADS: tl.constexpr, K_HEADS: tl.constexpr, D: tl.constexpr,
                   READ_ROW: tl.constexpr, EVICT_LAST: tl.constexpr):
    """Copy one token's q [Q_HEADS, D] and k [K_HEADS, D]; with READ_ROW the stores also depend
    on the token's table row [D] (row ``token % seq_len``), which changes no value."""
    token = tl.program_id(0).to(tl.int64)
    qc = tl.arange(0, Q_HEADS)[:, None] * D + tl.arange(0, D)[None, :]
    kc = tl.arange(0, K_HEADS)[:, None] * D + tl.arange(0, D)[None, :]
    q = tl.load(q_ptr + token * Q_HEADS * D + qc)
    k = tl.load(k_ptr + token * K_HEADS * D + kc)
    if READ_ROW:
        rows = table_ptr + (token % seq_len) * D + tl.arange(0, D)
        if EVICT_LAST:
            row = tl.load(rows, eviction_policy="evict_last")
        else:
            row = tl.load(rows)
        q = (q.to(tl.float32) + 0.0 * row[None, :]).to(q.dtype)
        k = (k.to(tl.float32) + 0.0 * row[None, :]).to(k.dtype)
    tl.store(q_out_ptr + token * Q_HEADS * D + qc, q)
    tl.store(k_out_ptr + token * K_HEADS * D + kc, k)


def module_copy(name: str, path) -> object:
    """The kernel file at ``path`` (a rope_qk.py or rope_2d.py) loaded as its own module ``name``,
    with its own plan table, launched through the package's thin launch as the package's own is
    (the scripts' A/B sides)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    module.launch = _launch.thin_launch
    return module


def flag_off_copy(flag: str):
    """The A/B's side before a rule behind a module flag of rope_qk: the package's file loaded
    again as its own module (``module_copy``) with ``flag`` False, after checking that the
    package runs with it on."""
    assert getattr(hinted, flag) is True, flag
    module = module_copy(f"rope_qk_{flag.lower()}_off", hinted.__file__)
    setattr(module, flag, False)
    return module


def unhinted_module():
    """rope_qk.py with its table hint removed, as a module launched like the package's."""
    source = pathlib.Path(hinted.__file__).read_text()
    hint = ', eviction_policy="evict_last")'  # in _table_row, where every table load goes
    if source.count(hint) != 1:
        raise RuntimeError("rope_qk.py does not load its table in one _table_row: "
                           "update this script")
    plain = source.replace(hint, ")")
    folder = pathlib.Path(tempfile.mkdtemp())
    path = folder / "rope_qk_unhinted.py"
    path.write_text(plain)
    return module_copy("rope_qk_unhinted", path)


def shuffled_rounds(fns: dict, nbytes: int, copy: float, rounds: int, timer=None) -> dict:
    """name -> median fraction of copy over ``rounds`` shuffled rounds (``bench.shuffled_rounds``,
    timed by ``timer``: do_bench unless given)."""
    return {name: round(sorted(v)[len(v) // 2], 4)
            for name, v in bench_shuffled_rounds(fns, nbytes, copy, rounds, timer=timer).items()}


def medians(fns: dict, nbytes: int, copy: float, rounds: int) -> dict:
    """``shuffled_rounds``, timed with the host kept ahead of the GPU (``time_ms_host_ahead``)
    under 200 MB, where do_bench's medians fall on one of two levels."""
    return shuffled_rounds(fns, nbytes, copy, rounds,
                           timer=time_ms_host_ahead if nbytes < 200e6 else None)


def hf_call(module, p: QKProblem, backward: bool = False, pairs: str = "half"):
    """Hugging Face's call on ``module``'s ``rope_cos_sin``: q and k as the ``[b, h, s, d]`` views
    of ``[b, s, h, d]`` memory that models hand over (made here, outside the timed call), the
    first ``rotary_dim`` channels of cos and sin; ``pairs`` as ``rope_cos_sin`` takes it (Llama's
    ``"half"``, Cohere's ``"interleaved"``, GLM's ``"glm"``)."""
    q, k = (p.gq, p.gk) if backward else (p.q, p.k)
    q, k = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = p.cos[..., :p.rotary_dim], p.sin[..., :p.rotary_dim]
    return lambda: module.rope_cos_sin(q, k, cos, sin, 1, backward=backward, pairs=pairs)


def qkv_call(module, p: QKVProblem, backward: bool = False):
    """TransformerEngine's fused QKV on ``module``: the packed tensor into q, k, v, or back."""
    if backward:
        return lambda: module.rope_qkv_backward(*p.grads, p.freqs, p.freqs, p.splits)
    return lambda: module.rope_qkv(p.qkv, p.freqs, p.freqs, p.splits)


def calls(module, p: QKProblem, mode: str):
    """``mode``'s call on ``module``: the cos/sin cache's with the problem's pairing (``is_neox``
    unless ``p.interleaved``), or Hugging Face's half-split call (``hf_call``)."""
    q, k = p.tokens(p.q), p.tokens(p.k)
    gq, gk = p.tokens(p.gq), p.tokens(p.gk)
    neox = not p.interleaved
    if mode == "cache out of place":
        return lambda: module.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache, neox)
    if mode == "cache in place":
        return lambda: module.rope_cos_sin_cache(p.positions, q, k, p.head_dim, p.cache, neox,
                                                 query_out=q, key_out=k)
    if mode == "cache backward":
        return lambda: module.rope_cos_sin_cache(p.positions, gq, gk, p.head_dim, p.cache, neox,
                                                 backward=True)
    return hf_call(module, p, backward=mode != "hf")  # "hf backward"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    assert hinted.launch is _launch.thin_launch  # both sides launch the same way
    plain = unhinted_module()
    liger = _liger_qk()
    copy = copy_bandwidth_gbps()
    result = {"provenance": provenance(copy, "qk_table_hint"), "rounds": args.rounds,
              "ceiling": {}, "entry_points": {}}
    result["provenance"]["command"] = "python scripts/qk_table_hint.py"
    start = time.time()

    for name in ("16q/4k", "8q/8k", "32q/8k"):
        p = QKProblem(**SHAPES[name])
        q, k = p.tokens(p.q), p.tokens(p.k)
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        tokens = q.shape[0]

        def copy_call(read_row, evict_last):
            return lambda: copy_qk_kernel[(tokens,)](
                q, q_out, k, k_out, p.cache, p.seq_len, Q_HEADS=p.heads, K_HEADS=p.k_heads,
                D=p.head_dim, READ_ROW=read_row, EVICT_LAST=evict_last, num_warps=4)
        fns = {"copy": copy_call(False, False), "copy + row": copy_call(True, False),
               "copy + row evict_last": copy_call(True, True)}
        for fn in fns.values():  # the copies copy, whatever the row
            q_out.fill_(float("nan"))
            fn()
            assert torch.equal(q_out, q) and torch.equal(k_out, k)
        result["ceiling"][name] = shuffled_rounds(fns, p.nbytes, copy, args.rounds)
        print(f"{name:16s} ceiling  {result['ceiling'][name]}  [{time.time() - start:.0f} s]",
              flush=True)
        del p, q, k, q_out, k_out
        torch.cuda.empty_cache()

    for name, kw in SHAPES.items():
        p = QKProblem(**kw)
        rows = {}
        for mode in MODES:
            new, old = calls(hinted, p, mode), calls(plain, p, mode)
            a, b = new(), old()
            if mode != "cache in place":  # the hint changes no value
                assert all(torch.equal(x, y) for x, y in zip(a, b)), (name, mode)
            fns = {"hinted": new, "unhinted": old}
            if liger is not None and mode in ("cache in place", "hf", "hf backward"):
                lig = liger(p, "backward" if mode == "hf backward" else "forward")
                if lig is not None:
                    fns["Liger (in place)"] = lig
            rows[mode] = shuffled_rounds(fns, p.nbytes, copy, args.rounds)
            print(f"{name:16s} {mode:20s} {rows[mode]}  [{time.time() - start:.0f} s]",
                  flush=True)
        result["entry_points"][name] = rows
        del p
        torch.cuda.empty_cache()

    p = QKVProblem()  # fused QKV, TransformerEngine's angles: sbhd memory and bshd memory
    for fmt in ("sbhd", "bshd"):
        qkv = p.qkv if fmt == "sbhd" else torch.randn(p.qkv.transpose(0, 1).shape,
                                                     device="cuda", dtype=p.qkv.dtype)
        fns = {"hinted": lambda: hinted.rope_qkv(qkv, p.freqs, p.freqs, p.splits, fmt),
               "unhinted": lambda: plain.rope_qkv(qkv, p.freqs, p.freqs, p.splits, fmt)}
        result["entry_points"][f"fused QKV {fmt}"] = {
            "forward": shuffled_rounds(fns, p.nbytes, copy, args.rounds)}
        print(f"fused QKV {fmt}: {result['entry_points'][f'fused QKV {fmt}']}", flush=True)
        del qkv

    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print("wrote", args.out)


if __name__ == "__main__":
    main()
