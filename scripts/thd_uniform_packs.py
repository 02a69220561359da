"""Packs of many equal short sequences (thd): ours next to flash-attn's Triton rotary.

    ROPE_PEER_DIR=DIR python scripts/thd_uniform_packs.py [--out FILE.json]

The benchmark's thd sweep cuts its tokens at random into sequences of mixed lengths; this script
measures the uniform packs a peer was reported fastest on (16384 sequences of 8 tokens), and
more of that kind: n_seqs sequences of ``length`` tokens each, bf16, head_dim 128, forward and
backward. Ours: the public ``apply_rotary_pos_emb`` (validate=False) forward, ``rope_2d``
backward (the benchmark's own callables for them). flash-attn: ``apply_rotary`` from
flash_attn/ops/triton/rotary.py (an installed flash-attn, else a copy of that one file in
$ROPE_PEER_DIR, as for the benchmark). Its grid has one row per sequence on CUDA's second grid
axis, which holds at most 65535: packs of more sequences are recorded as not launchable.

Bytes as in the benchmark (read t + write out + the float32 angle rows used); fractions of the
device copy measured in the same run; each row is the median of 3 rounds that alternate the
implementations, each round a do_bench median.

Where our call's time goes (same rounds, same bytes counted, all as fractions of the 2 GiB copy):
- ``ours_main_only``: the main kernel alone, each token's table row written beforehand by the
  package's pre-pass (outside the timed region): the call without its pre-pass.
- ``ours_no_search``: the two launches as the package makes them (programmatic dependent launch
  where the GPU has it), but with a pre-pass that knows every sequence has ``length`` tokens and
  writes ``token % length`` with no search: the floor of the two-kernel design. Its output is
  checked equal to the package's.
- ``copy_same_size``: torch's device-to-device copy of ``t`` (2 x t's bytes): what a copy of this
  size reaches against the 2 GiB copy.
- ``pre_pass_us``: the package's pre-pass alone (do_bench median of 3).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels.bench import (Problem, _flash_attn, _ours_api, copy_bandwidth_gbps,  # noqa: E402
                                provenance, time_ms)

r2 = importlib.import_module("rope_kernels.rope_2d")  # the module (the package exports the function)

PACKS = [  # (n_seqs, tokens per sequence, heads)
    (16384, 8, 32),
    (16384, 8, 8),
    (4096, 64, 32),
    (65536, 4, 32),
    (65536, 4, 8),
]
CUDA_GRID_Y_MAX = 65535


@triton.jit
def uniform_token_rows(rows_ptr, n_tokens, length, PDL_TRIGGER: tl.constexpr, BLOCK: tl.constexpr):
    """Each token's table row when every sequence has ``length`` tokens: no search."""
    if PDL_TRIGGER:
        tl.extra.cuda.gdc_launch_dependents()
    token = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(rows_ptr + token, token % length, mask=token < n_tokens)


def budget_fns(p: Problem, length: int, direction: str):
    """The call without its pre-pass, with a pre-pass that does not search, and a copy of t.
    Returns (callables by name, the copy's bytes, the package's pre-pass alone in us)."""
    x = p.t if direction == "forward" else p.grad
    backward = direction == "backward"
    n_tokens = x.shape[0]
    ref = r2.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens, backward=backward)

    def plan(out, config):  # the package's launch plan for x -> out
        return r2._make_plan(x, p.freqs, out, "thd", p.cu_seqlens, None, False, 1, 0, backward,
                             config, False)

    # Main kernel alone: rows written once by the package's pre-pass, outside the timed region.
    rows = torch.empty(n_tokens, dtype=torch.int32, device=x.device)
    pre = r2.pre_pass_plan(n_tokens, p.n_seqs)

    def pre_pass():
        r2.launch(r2.thd_positions_kernel, pre, (p.cu_seqlens, p.cu_seqlens, rows))

    pre_pass()
    out_main = torch.full_like(x, float("nan"))
    plan_main = plan(out_main, dict(pdl=False))
    # Two launches, the first without a search (PDL as the package decides).
    out_two = torch.full_like(x, float("nan"))
    plan_two = plan(out_two, None)
    pdl = plan_two.constexprs["PDL_WAIT"]
    block = 256  # tokens a program of uniform_token_rows

    def two_launches():
        token_rows = torch.empty(n_tokens, dtype=torch.int32, device=x.device)
        uniform_token_rows[(triton.cdiv(n_tokens, block),)](token_rows, n_tokens, length,
                                                           PDL_TRIGGER=pdl, BLOCK=block,
                                                           num_warps=4)
        r2.launch(r2.rope_2d_kernel, plan_two, (x, p.freqs, out_two, token_rows, x))

    def main_only():
        r2.launch(r2.rope_2d_kernel, plan_main, (x, p.freqs, out_main, rows, x))

    copy_out = torch.empty_like(x)
    fns = {"ours_main_only": main_only, "ours_no_search": two_launches,
           "copy_same_size": lambda: copy_out.copy_(x)}
    for name in ("ours_main_only", "ours_no_search"):
        fns[name]()
    if x.is_cuda:
        torch.cuda.synchronize()
    for name, out in (("ours_main_only", out_main), ("ours_no_search", out_two)):
        if not torch.equal(out, ref):
            raise AssertionError(f"{name} differs from rope_2d on {n_tokens} tokens ({direction})")
    pre_us = sorted(time_ms(pre_pass) for _ in range(3))[1] * 1e3
    return fns, 2 * x.numel() * x.element_size(), pre_us


def uniform_problem(n_seqs: int, length: int, heads: int) -> Problem:
    """n_seqs sequences of ``length`` tokens each (Problem's thd with n_seqs None)."""
    return Problem(tensor_format="thd", seq_len=length, batch=n_seqs, heads=heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="figures/thd_uniform_packs.json")
    args = parser.parse_args()
    copy = copy_bandwidth_gbps()
    ours = _ours_api("2d")  # the benchmark's "triton-2d (ours)"
    flash_attn = _flash_attn()
    rows = []
    for n_seqs, length, heads in PACKS:
        p = uniform_problem(n_seqs, length, heads)
        for direction in ("forward", "backward"):
            fns = {"ours": ours(p, direction)}
            extra, copy_bytes, pre_us = budget_fns(p, length, direction)
            fns.update(extra)
            note = None
            if flash_attn is None:
                note = "flash-attn not available (set ROPE_PEER_DIR)"
            elif n_seqs > CUDA_GRID_Y_MAX:
                note = f"flash-attn cannot launch: one grid row per sequence, > {CUDA_GRID_Y_MAX}"
            else:
                fns["flash_attn"] = flash_attn(p, direction)
            for fn in fns.values():
                fn()
            runs = {name: [] for name in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    nbytes = copy_bytes if name == "copy_same_size" else p.nbytes
                    runs[name].append(nbytes / time_ms(fn) / 1e6 / copy)
            frac = {name: sorted(v)[1] for name, v in runs.items()}
            rows.append(dict(n_seqs=n_seqs, tokens_per_seq=length, heads=heads, head_dim=128,
                             dtype="bf16", direction=direction, bytes=p.nbytes,
                             ours=round(frac["ours"], 4),
                             flash_attn=round(frac["flash_attn"], 4) if "flash_attn" in frac else None,
                             ours_main_only=round(frac["ours_main_only"], 4),
                             ours_no_search=round(frac["ours_no_search"], 4),
                             copy_same_size=round(frac["copy_same_size"], 4),
                             pre_pass_us=round(pre_us, 2),
                             note=note))
            print(f"{n_seqs:6d} x {length:3d} tokens, {heads:2d} heads, {direction:8s} "
                  f"ours {frac['ours']:.3f}  flash-attn "
                  + (f"{frac['flash_attn']:.3f}" if "flash_attn" in frac else f"- ({note})")
                  + f"  | main only {frac['ours_main_only']:.3f}, no search "
                  f"{frac['ours_no_search']:.3f}, copy {frac['copy_same_size']:.3f}, "
                  f"pre-pass {pre_us:.1f} us",
                  flush=True)
        del p
        torch.cuda.empty_cache()
    prov = provenance(copy, "thd_uniform_packs")
    prov["command"] = "ROPE_PEER_DIR=DIR python scripts/thd_uniform_packs.py"
    prov["bytes"] += "; copy_same_size: read t + write its copy"
    prov["timing"] = ("triton.testing.do_bench median (L2 flushed per call), median of 3 rounds "
                      "alternating the implementations")
    pathlib.Path(args.out).write_text(json.dumps(dict(provenance=prov, rows=rows), indent=1) + "\n")


if __name__ == "__main__":
    main()
