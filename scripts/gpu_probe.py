"""GPU probes behind the kernels' design choices (run on the GPU machine; results -> CSV/JSON).

    python scripts/gpu_probe.py --out DIR [--only trig,configs,decode]

- trig:    accuracy of Triton's tl.cos/tl.sin on float32 angles up to 1e5 rad, against float64;
- configs: the 2-D kernel's GB/s for a grid of tile shapes / warps / batch chunks, per problem
           (the data behind rope_2d.default_config; shown in notebook 04);
- decode:  where the time of a decode-sized call goes (launch path pieces, microseconds per call).
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels import apply_rotary_pos_emb, rope_1d, rope_2d  # noqa: E402
from rope_kernels.bench import Problem, copy_bandwidth_gbps, time_ms, time_per_call_us  # noqa: E402


@triton.jit
def _trig_kernel(x_ptr, cos_ptr, sin_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(cos_ptr + i, tl.cos(x), mask=i < n)
    tl.store(sin_ptr + i, tl.sin(x), mask=i < n)


def probe_trig() -> dict:
    res = {}
    for hi in (3.2, 100.0, 1000.0, 8192.0, 1e5):
        x = torch.linspace(0, hi, 1 << 20, device="cuda", dtype=torch.float32)
        c, s = torch.empty_like(x), torch.empty_like(x)
        _trig_kernel[(triton.cdiv(x.numel(), 1024),)](x, c, s, x.numel(), BLOCK=1024)
        x64 = x.double()
        res[f"max_abs_err_up_to_{hi:g}"] = max((c.double() - x64.cos()).abs().max().item(),
                                               (s.double() - x64.sin()).abs().max().item())
    return res


def probe_configs(copy_gbps: float) -> list[dict]:
    """Stage 1: tile shapes (block_s x block_h, 4 warps). Stage 2: for the 3 best tiles, the
    batch chunking (batch_per_program) and 8 warps."""
    rows = []
    problems = {
        "sbhd bf16 default": dict(tensor_format="sbhd"),
        "bshd bf16 default": dict(tensor_format="bshd"),
        "sbhd bf16 rp0.5": dict(tensor_format="sbhd", rotary_percent=0.5),
        "sbhd fp32 default": dict(tensor_format="sbhd", dtype="fp32"),
        "sbhd bf16 interleaved": dict(tensor_format="sbhd", interleaved=True),
        "thd bf16 256 seqs": dict(tensor_format="thd", n_seqs=256),
        "thd bf16 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
        "sbhd bf16 d256": dict(tensor_format="sbhd", head_dim=256),
        "sbhd bf16 seq8192": dict(tensor_format="sbhd", seq_len=8192),
        "bshd bf16 b1 h64 s2048": dict(tensor_format="bshd", seq_len=2048, batch=1, heads=64),
        "bshd bf16 b2 s8192": dict(tensor_format="bshd", seq_len=8192, batch=2),
    }

    def one(name, p, c, kwargs):
        try:
            ms = time_ms(lambda: rope_2d(p.t, p.freqs, config=c, **kwargs), rep=40)
        except Exception as e:  # noqa: BLE001
            rows.append(dict(problem=name, config=json.dumps(c), error=str(e)[:200]))
            return
        rows.append(dict(problem=name, config="default" if c is None else json.dumps(c), ms=ms,
                         gbps=p.nbytes / ms / 1e6, frac=p.nbytes / ms / 1e6 / copy_gbps))

    for name, kw in problems.items():
        p = Problem(**kw)
        kwargs = p.kwargs()
        start = len(rows)
        one(name, p, None, kwargs)
        for bs, bh in itertools.product([1, 2, 4, 8, 16, 32], [1, 2, 4, 8, 16]):
            if 512 <= bs * bh * p.head_dim <= 8192:
                one(name, p, dict(block_s=bs, block_h=bh, num_warps=4), kwargs)
        stage1 = sorted((r for r in rows[start:] if "gbps" in r and r["config"] != "default"),
                        key=lambda r: -r["gbps"])[:3]
        for r in stage1:
            base = json.loads(r["config"])
            for bpp in (1, 2, 4, 8, 16):
                one(name, p, dict(base, batch_per_program=bpp), kwargs)
            one(name, p, dict(base, num_warps=8), kwargs)
        ms1 = time_ms(lambda: rope_1d(p.t, p.freqs, **kwargs), rep=40)
        rows.append(dict(problem=name, config="rope_1d default", ms=ms1,
                         gbps=p.nbytes / ms1 / 1e6, frac=p.nbytes / ms1 / 1e6 / copy_gbps))
        del p
        torch.cuda.empty_cache()
    return rows


@triton.jit
def _empty_kernel(x_ptr):
    pass


def probe_decode() -> dict:
    res = {}
    for batch in (1, 64, 256):
        p = Problem("bshd", seq_len=1, batch=batch)
        t, f = p.t, p.freqs
        res[f"b{batch} apply_rotary_pos_emb fused (validate)"] = time_per_call_us(
            lambda: apply_rotary_pos_emb(t, f, "bshd", fused=True))
        res[f"b{batch} rope_2d direct"] = time_per_call_us(lambda: rope_2d(t, f, "bshd"))
        res[f"b{batch} rope_1d direct"] = time_per_call_us(lambda: rope_1d(t, f, "bshd"))
        res[f"b{batch} do_bench rope_2d (GPU time)"] = time_ms(lambda: rope_2d(t, f, "bshd")) * 1e3
    t = torch.empty(8, device="cuda")
    res["empty triton launch"] = time_per_call_us(lambda: _empty_kernel[(1,)](t))
    res["torch.empty_like"] = time_per_call_us(lambda: torch.empty_like(t))
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=pathlib.Path, required=True)
    ap.add_argument("--only", default="trig,configs,decode")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    only = args.only.split(",")
    copy = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    if "trig" in only:
        trig = probe_trig()
        print("trig:", json.dumps(trig))
        (args.out / "trig.json").write_text(json.dumps(trig, indent=1))
    if "decode" in only:
        dec = probe_decode()
        print("decode:", json.dumps({k: round(v, 2) for k, v in dec.items()}, indent=1))
        (args.out / "decode.json").write_text(json.dumps(dec, indent=1))
    if "configs" in only:
        import pandas as pd

        df = pd.DataFrame(probe_configs(copy))
        df.to_csv(args.out / "configs.csv", index=False)
        best = df.dropna(subset=["gbps"]).sort_values("gbps").groupby("problem").tail(1)
        dflt = df[df.config == "default"][["problem", "gbps", "frac"]]
        one = df[df.config == "rope_1d default"][["problem", "gbps", "frac"]]
        print("best:\n", best[["problem", "config", "gbps", "frac"]].to_string())
        print("default:\n", dflt.to_string())
        print("1d:\n", one.to_string())


if __name__ == "__main__":
    main()
