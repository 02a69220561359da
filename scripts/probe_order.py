"""Session-4 probe: program order for bshd, in place vs new output, small tiles for interleaved."""
import importlib, json, os, pathlib, sys, time
import torch
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from rope_kernels.bench import Problem, _liger, copy_bandwidth_gbps, time_ms  # noqa: E402
from rope_kernels.reference import rope_reference  # noqa: E402
r2 = importlib.import_module("rope_kernels.rope_2d")
OUT = pathlib.Path(os.environ.get("OUT", "gpu-out"))
copy = copy_bandwidth_gbps()
print(torch.cuda.get_device_name(), round(copy), flush=True)
res = []
liger = _liger()
probs = {"bshd default": dict(tensor_format="bshd"), "bshd h16": dict(tensor_format="bshd", heads=16),
         "bshd b4": dict(tensor_format="bshd", batch=4), "bshd s1024": dict(tensor_format="bshd", seq_len=1024),
         "bshd d64": dict(tensor_format="bshd", head_dim=64), "bshd b2 s8192": dict(tensor_format="bshd", batch=2, seq_len=8192),
         "sbhd default": dict(tensor_format="sbhd")}
cfgs = [(2, 1, 16, 4), (1, 2, 16, 4), (1, 1, 32, 4), (2, 2, 8, 4), (4, 1, 8, 4), (1, 1, 16, 4), (2, 1, 32, 8), (1, 4, 8, 4)]
for name, kw in probs.items():
    p = Problem(**kw)
    line = [name]
    if liger is not None and (mk := liger(p, "forward")):
        line.append(f"liger {p.nbytes / time_ms(mk) / 1e6 / copy:.3f}")
    for order in (0, 1, 2):
        best = (0, None)
        for bs, bb, bh, nw in cfgs:
            if bh > p.heads:
                continue
            cfg = dict(block_s=bs, block_b=bb, block_h=bh, num_warps=nw, order=order)
            f = p.nbytes / time_ms(lambda: r2.rope_2d(p.t, p.freqs, p.tensor_format, config=cfg)) / 1e6 / copy
            res.append(dict(problem=name, cfg=cfg, frac=f))
            best = max(best, (f, (bs, bb, bh, nw)))
        line.append(f"order{order} {best[0]:.3f} {best[1]}")
        if order == 0:
            bs, bb, bh, nw = best[1]
            cfg = dict(block_s=bs, block_b=bb, block_h=bh, num_warps=nw, order=0)
            t = p.t.clone()
            f = p.nbytes / time_ms(lambda: r2.rope_2d(t, p.freqs, p.tensor_format, out=t, config=cfg)) / 1e6 / copy
            line.append(f"in-place {f:.3f}")
    print("  ".join(line), flush=True)
# interleaved small tiles
p = Problem("sbhd", interleaved=True)
ref = rope_reference(p.t.double(), p.freqs, "sbhd", None, True)
best = []
for bs in (1, 2, 4):
    for bb in (1, 2, 4):
        for bh in (1, 2, 4, 8, 16):
            for nw in (1, 2, 4):
                tile = bs * bb * bh * 256
                if tile > 16384 or tile < 256:
                    continue
                cfg = dict(block_s=bs, block_b=bb, block_h=bh, num_warps=nw)
                y = r2.rope_2d(p.t, p.freqs, "sbhd", interleaved=True, config=cfg)
                assert ((y.double() - ref).abs() <= 1e-2 * (1 + ref.abs())).all()
                f = p.nbytes / time_ms(lambda: r2.rope_2d(p.t, p.freqs, "sbhd", interleaved=True, config=cfg)) / 1e6 / copy
                best.append((round(f, 3), cfg))
best.sort(key=lambda x: -x[0])
print("interleaved top:", best[:6], flush=True)
print("interleaved worst:", best[-3:], flush=True)
(OUT / "order.json").write_text(json.dumps(dict(res=res, interleaved=best), indent=0, default=str))
