"""Session-3 probe: where the 2-D kernel's last 5-10% of copy bandwidth goes, and what a thin
launch path saves. Not part of the package; results -> $OUT/variants.csv, $OUT/launch.json.

Variants of the non-interleaved 2-D kernel (sbhd/bshd/thd, no start positions, no CP):
  PREFETCH  load batch element b+1 while rotating b (two tiles in flight per program)
  EVICT     x loads evict_first, y stores streaming (.cs): keep the table in L2
  STAGES    tl.range(..., num_stages=STAGES) on the batch loop (0: plain range)
  inplace   out = t (what Liger measures)
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from rope_kernels import rope_2d  # noqa: E402
from rope_kernels.bench import Problem, copy_bandwidth_gbps, time_ms, time_per_call_us  # noqa: E402
from rope_kernels.rope_2d import _canonical, _next_pow2, _positions  # noqa: E402


@triton.jit
def _load3(x_base, x_sh, c1, c2, p, x_stride_d, mask, p_mask, PASS: tl.constexpr, EVICT: tl.constexpr):
    if EVICT:
        x1 = tl.load(x_base + x_sh + c1[None, None, :] * x_stride_d, mask=mask, eviction_policy="evict_first")
        x2 = tl.load(x_base + x_sh + c2[None, None, :] * x_stride_d, mask=mask, eviction_policy="evict_first")
    else:
        x1 = tl.load(x_base + x_sh + c1[None, None, :] * x_stride_d, mask=mask)
        x2 = tl.load(x_base + x_sh + c2[None, None, :] * x_stride_d, mask=mask)
    if PASS > 0:
        xp = tl.load(x_base + x_sh + p[None, None, :] * x_stride_d, mask=p_mask)
    else:
        xp = x1
    return x1, x2, xp


@triton.jit
def variant_kernel(
    x_ptr, freqs_ptr, out_ptr, cu_seqlens_ptr,
    seq_len, batch, heads, rotary_dim, head_dim,
    x_stride_s, x_stride_b, x_stride_h, x_stride_d,
    o_stride_s, o_stride_b, o_stride_h, o_stride_d,
    f_stride_s, f_stride_d, n_seqs, search_steps, batch_per_program,
    IS_THD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, HALF: tl.constexpr,
    PASS: tl.constexpr, PREFETCH: tl.constexpr, EVICT: tl.constexpr, STAGES: tl.constexpr,
):
    pid_s = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_b = tl.program_id(2)
    s_idx = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    h_idx = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    j = tl.arange(0, HALF)
    s_mask = s_idx < seq_len
    h_mask = h_idx < heads
    j_mask = j < rotary_dim // 2
    c1 = j
    c2 = j + rotary_dim // 2
    pos = _positions(s_idx, seq_len, cu_seqlens_ptr, cu_seqlens_ptr, n_seqs, search_steps, 1, 0,
                     IS_THD, False, False)
    sj_mask = s_mask[:, None] & j_mask[None, :]
    row = pos[:, None] * f_stride_s
    f1 = tl.load(freqs_ptr + row + c1[None, :] * f_stride_d, mask=sj_mask, other=0.0)
    f2 = tl.load(freqs_ptr + row + c2[None, :] * f_stride_d, mask=sj_mask, other=0.0)
    cos1 = tl.cos(f1)[:, None, :]
    cos2 = tl.cos(f2)[:, None, :]
    sin1 = tl.sin(f1)[:, None, :]
    sin2 = tl.sin(f2)[:, None, :]
    x_sh = s_idx[:, None, None] * x_stride_s + h_idx[None, :, None] * x_stride_h
    o_sh = s_idx[:, None, None] * o_stride_s + h_idx[None, :, None] * o_stride_h
    mask = s_mask[:, None, None] & h_mask[None, :, None] & j_mask[None, None, :]
    p = rotary_dim + tl.arange(0, max(PASS, 1))
    p_mask = s_mask[:, None, None] & h_mask[None, :, None] & (p < head_dim)[None, None, :]
    b_begin = pid_b * batch_per_program
    b_end = tl.minimum(b_begin + batch_per_program, batch)
    if PREFETCH:
        nx1, nx2, nxp = _load3(x_ptr + b_begin * x_stride_b, x_sh, c1, c2, p, x_stride_d, mask, p_mask, PASS, EVICT)
    for b in tl.range(b_begin, b_end, num_stages=STAGES):
        if PREFETCH:
            x1 = nx1
            x2 = nx2
            xp = nxp
            more = b + 1 < b_end
            nx1, nx2, nxp = _load3(x_ptr + (b + 1) * x_stride_b, x_sh, c1, c2, p, x_stride_d,
                                   mask & more, p_mask & more, PASS, EVICT)
        else:
            x1, x2, xp = _load3(x_ptr + b * x_stride_b, x_sh, c1, c2, p, x_stride_d, mask, p_mask, PASS, EVICT)
        x1 = x1.to(tl.float32)
        x2 = x2.to(tl.float32)
        y1 = (x1 * cos1 - x2 * sin1).to(out_ptr.dtype.element_ty)
        y2 = (x2 * cos2 + x1 * sin2).to(out_ptr.dtype.element_ty)
        o_base = out_ptr + b * o_stride_b
        if EVICT:
            tl.store(o_base + o_sh + c1[None, None, :] * o_stride_d, y1, mask=mask, cache_modifier=".cs")
            tl.store(o_base + o_sh + c2[None, None, :] * o_stride_d, y2, mask=mask, cache_modifier=".cs")
            if PASS > 0:
                tl.store(o_base + o_sh + p[None, None, :] * o_stride_d, xp, mask=p_mask, cache_modifier=".cs")
        else:
            tl.store(o_base + o_sh + c1[None, None, :] * o_stride_d, y1, mask=mask)
            tl.store(o_base + o_sh + c2[None, None, :] * o_stride_d, y2, mask=mask)
            if PASS > 0:
                tl.store(o_base + o_sh + p[None, None, :] * o_stride_d, xp, mask=p_mask)


def variant(t, freqs, tensor_format, cu_seqlens=None, out=None, block_s=2, block_h=8, bpp=None,
            num_warps=4, prefetch=0, evict=0, stages=0, sm=132):
    (rows, batch, heads, head_dim), xs = _canonical(t, tensor_format)
    if out is None:
        out = torch.empty_like(t)
    _, os_ = _canonical(out, tensor_format)
    rotary_dim = freqs.shape[-1]
    is_thd = tensor_format == "thd"
    n_seqs = cu_seqlens.numel() - 1 if is_thd else 1
    tiles = triton.cdiv(rows, block_s) * triton.cdiv(heads, block_h)
    if bpp is None:
        chunks = min(batch, max(1, triton.cdiv(4 * sm, tiles)))
        bpp = triton.cdiv(batch, chunks)
    grid = (triton.cdiv(rows, block_s), triton.cdiv(heads, block_h), triton.cdiv(batch, bpp))
    variant_kernel[grid](
        t, freqs, out, cu_seqlens if is_thd else t, rows, batch, heads, rotary_dim, head_dim,
        *xs, *os_, freqs.stride(0), freqs.stride(-1), n_seqs,
        max(1, (n_seqs - 1).bit_length()) if is_thd else 0, bpp,
        IS_THD=is_thd, BLOCK_S=block_s, BLOCK_H=block_h, HALF=_next_pow2(rotary_dim // 2),
        PASS=_next_pow2(head_dim - rotary_dim) if head_dim > rotary_dim else 0,
        PREFETCH=prefetch, EVICT=evict, STAGES=stages, num_warps=num_warps)
    return out


def probe_variants(copy: float, out_dir: pathlib.Path):
    problems = {
        "sbhd bf16 default": dict(tensor_format="sbhd"),
        "bshd bf16 default": dict(tensor_format="bshd"),
        "sbhd bf16 rp0.5": dict(tensor_format="sbhd", rotary_percent=0.5),
        "sbhd fp32 default": dict(tensor_format="sbhd", dtype="fp32"),
        "bshd bf16 b1 h64": dict(tensor_format="bshd", seq_len=2048, batch=1, heads=64),
        "bshd bf16 b2 s8192": dict(tensor_format="bshd", seq_len=8192, batch=2),
        "thd bf16 4096 seqs": dict(tensor_format="thd", n_seqs=4096),
        "sbhd bf16 d64": dict(tensor_format="sbhd", head_dim=64),
    }
    rows = []
    variants = []
    for pf in (0, 1):
        for ev in (0, 1):
            variants.append(dict(prefetch=pf, evict=ev, stages=0))
    variants.append(dict(prefetch=0, evict=0, stages=2))
    tiles = [(2, 8, 4), (1, 8, 4), (2, 4, 4), (4, 8, 4), (1, 16, 4)]
    for name, kw in problems.items():
        p = Problem(**kw)
        kwargs = p.kwargs()
        ref = rope_2d(p.t, p.freqs, **kwargs)

        def rec(label, fn, check=None):
            try:
                o = fn()
                ok = bool(torch.equal(o, ref)) if check is None else check
                ms = time_ms(fn, rep=40)
            except Exception as e:  # noqa: BLE001
                rows.append(dict(problem=name, variant=label, error=str(e)[:300]))
                print(name, label, "ERROR", str(e)[:300], flush=True)
                return
            rows.append(dict(problem=name, variant=label, ms=ms, gbps=p.nbytes / ms / 1e6,
                             frac=p.nbytes / ms / 1e6 / copy, exact=ok))

        rec("rope_2d current", lambda: rope_2d(p.t, p.freqs, **kwargs))
        buf = p.t.clone()
        rec("rope_2d current inplace", lambda: rope_2d(buf, p.freqs, out=buf, **kwargs), check=True)
        sm = torch.cuda.get_device_properties(0).multi_processor_count
        is_thd = kw["tensor_format"] == "thd"
        for bs, bh, nw in tiles:
            if is_thd:
                bs, bh = bs * bh // 2, 1
            for v in variants:
                label = f"tile {bs}x{bh} w{nw} pf{v['prefetch']} ev{v['evict']} st{v['stages']}"
                rec(label, lambda: variant(p.t, p.freqs, kw["tensor_format"], p.cu_seqlens,
                                           block_s=bs, block_h=bh, num_warps=nw, sm=sm, **v))
            for bpp in (4,):
                rec(f"tile {bs}x{bh} w{nw} pf1 ev1 st0 bpp{bpp}",
                    lambda: variant(p.t, p.freqs, kw["tensor_format"], p.cu_seqlens, block_s=bs,
                                    block_h=bh, num_warps=nw, sm=sm, bpp=bpp, prefetch=1, evict=1))
        g = [r for r in rows if r["problem"] == name and "frac" in r]
        g.sort(key=lambda r: -r["frac"])
        cur = [r for r in g if r["variant"] == "rope_2d current"][0]
        print(f"{name}: current {cur['frac']:.3f}; best " +
              "; ".join(f"{r['variant']} {r['frac']:.3f}{'' if r['exact'] else ' INEXACT'}" for r in g[:4]),
              flush=True)
        del p, ref, buf
        torch.cuda.empty_cache()
    import pandas as pd
    pd.DataFrame(rows).to_csv(out_dir / "variants.csv", index=False)


COPY = []


def probe_launch(out_dir: pathlib.Path):
    """Per-call microseconds of a decode call through the pieces of the launch path."""
    import triton.runtime.jit as jit
    import inspect
    res = {}
    src = inspect.getsource(jit.JITFunction.run)
    (out_dir / "triton_run_source.py").write_text(src)
    from triton.compiler.compiler import CompiledKernel
    (out_dir / "compiled_kernel_source.py").write_text(inspect.getsource(CompiledKernel))
    p = Problem("bshd", seq_len=1, batch=64)
    t, f = p.t, p.freqs
    out = torch.empty_like(t)
    import importlib
    r2 = importlib.import_module("rope_kernels.rope_2d")  # the module, not the function
    from rope_kernels import apply_rotary_pos_emb
    res["rope_2d thin"] = time_per_call_us(lambda: rope_2d(t, f, "bshd"))
    res["rope_2d thin out="] = time_per_call_us(lambda: rope_2d(t, f, "bshd", out=out))
    res["apply_rotary_pos_emb fused validate"] = time_per_call_us(lambda: apply_rotary_pos_emb(t, f, "bshd", fused=True))
    res["apply_rotary_pos_emb fused validate=False"] = time_per_call_us(lambda: apply_rotary_pos_emb(t, f, "bshd", fused=True, validate=False))
    r2.THIN_LAUNCH = False
    res["rope_2d triton dispatch"] = time_per_call_us(lambda: rope_2d(t, f, "bshd"))
    r2.THIN_LAUNCH = True
    # same kernel object as Triton's own dispatch picks, and the same result
    plan = next(iter(pl for k, pl in r2._PLANS.items() if k[1] == t.shape))
    y_thin = rope_2d(t, f, "bshd")
    ptrs = (t, f, y_thin, t, t)
    k = r2.rope_2d_kernel[plan.grid](*ptrs, *plan.scalars, **plan.constexprs, num_warps=plan.num_warps)
    res["same compiled object"] = any(c is k for c in plan.compiled.values())
    y2 = torch.empty_like(t)
    r2.rope_2d_kernel[plan.grid](t, f, y2, t, t, *plan.scalars, **plan.constexprs, num_warps=plan.num_warps)
    res["thin == dispatch output"] = bool(torch.equal(rope_2d(t, f, "bshd"), y2))
    pb = Problem("bshd", seq_len=2048, batch=1, heads=64)
    for thin in (True, False):
        r2.THIN_LAUNCH = thin
        ms = time_ms(lambda: rope_2d(pb.t, pb.freqs, "bshd"))
        res[f"bshd 2048x1x64x128 {'thin' if thin else 'dispatch'} frac of copy"] = pb.nbytes / ms / 1e6 / COPY[0]
    r2.THIN_LAUNCH = True
    res["hooks installed"] = r2._launch_hooks_installed()
    for b in (1, 256):
        pb = Problem("bshd", seq_len=1, batch=b)
        res[f"b{b} rope_2d thin"] = time_per_call_us(lambda: rope_2d(pb.t, pb.freqs, "bshd"))
        res[f"b{b} do_bench gpu us"] = time_ms(lambda: rope_2d(pb.t, pb.freqs, "bshd")) * 1e3
    res["torch.empty_like"] = time_per_call_us(lambda: torch.empty_like(t))
    res["do_bench gpu us"] = time_ms(lambda: rope_2d(t, f, "bshd")) * 1e3
    try:
        from liger_kernel.ops.rope import rope_forward
        b, s, h, d = t.shape
        q = t[:, :, : h // 2].contiguous().transpose(1, 2)
        k = t[:, :, h // 2:].contiguous().transpose(1, 2)
        ff = f[:s, 0, 0][None]
        cos, sin = ff.cos().to(t.dtype), ff.sin().to(t.dtype)
        res["liger"] = time_per_call_us(lambda: rope_forward(q, k, cos, sin))
    except Exception as e:  # noqa: BLE001
        res["liger"] = str(e)[:100]
    print("launch:", json.dumps({k: (round(v, 2) if isinstance(v, float) else v) for k, v in res.items()}, indent=1), flush=True)
    (out_dir / "launch.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    out_dir = pathlib.Path(os.environ.get("OUT", "gpu-out"))
    out_dir.mkdir(parents=True, exist_ok=True)
    which = sys.argv[1:] or ["launch", "variants"]
    t0 = time.time()
    copy = copy_bandwidth_gbps()
    COPY.append(copy)
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s; triton {triton.__version__} torch {torch.__version__}", flush=True)
    if "launch" in which:
        probe_launch(out_dir)
    if "variants" in which:
        probe_variants(copy, out_dir)
    print(f"done in {time.time() - t0:.0f} s")
