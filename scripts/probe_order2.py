"""Session-4 probe 2: grouped program order for bshd; interleaved through a partner load."""
import importlib, json, os, pathlib, sys
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
         "bshd d64": dict(tensor_format="bshd", head_dim=64), "bshd fp32": dict(tensor_format="bshd", dtype="fp32"),
         "bshd d256": dict(tensor_format="bshd", head_dim=256, heads=16)}
cfgs = [(2, 1, 16, 4), (1, 1, 32, 4), (4, 1, 8, 4), (1, 1, 16, 4), (2, 1, 32, 8), (4, 1, 16, 8), (2, 1, 8, 4), (1, 1, 8, 4)]
for name, kw in probs.items():
    p = Problem(**kw)
    line = [name]
    if liger is not None and (mk := liger(p, "forward")):
        line.append(f"liger {p.nbytes / time_ms(mk) / 1e6 / copy:.3f}")
    for order, group in ((0, 1), (1, 1), (3, 2), (3, 4), (3, 8)):
        best = (0, None)
        for bs, bb, bh, nw in cfgs:
            if bh > p.heads or bs * bh * p.head_dim * p.t.element_size() > 32768:
                continue
            cfg = dict(block_s=bs, block_b=bb, block_h=bh, num_warps=nw, order=order, group_b=group)
            f = p.nbytes / time_ms(lambda: r2.rope_2d(p.t, p.freqs, p.tensor_format, config=cfg)) / 1e6 / copy
            res.append(dict(problem=name, cfg=cfg, frac=f))
            best = max(best, (f, (bs, bb, bh, nw)))
        line.append(f"o{order}g{group} {best[0]:.3f} {best[1]}")
    print("  ".join(line), flush=True)
for name, kw in {"sbhd interleaved": dict(tensor_format="sbhd", interleaved=True),
                 "bshd interleaved": dict(tensor_format="bshd", interleaved=True),
                 "sbhd interleaved fp32": dict(tensor_format="sbhd", interleaved=True, dtype="fp32")}.items():
    p = Problem(**kw)
    ref = rope_reference(p.t.double(), p.freqs, p.tensor_format, None, True)
    best = []
    for flat in (False, True):
        for bs in (1, 2, 4):
            for bb in (1, 2, 4):
                for bh in (1, 2, 4, 8, 16, 32):
                    for nw in (1, 2, 4, 8):
                        tile = bs * bb * bh * 128 * p.t.element_size()
                        if tile > (32768 if flat else 4096) or (nw == 8 and tile < 16384) or (nw == 1 and tile > 4096):
                            continue
                        cfg = dict(block_s=bs, block_b=bb, block_h=bh, num_warps=nw, il_flat=flat)
                        y = r2.rope_2d(p.t, p.freqs, p.tensor_format, interleaved=True, config=cfg)
                        assert ((y.double() - ref).abs() <= 1e-2 * (1 + ref.abs())).all(), cfg
                        f = p.nbytes / time_ms(lambda: r2.rope_2d(p.t, p.freqs, p.tensor_format, interleaved=True, config=cfg)) / 1e6 / copy
                        best.append((round(f, 3), cfg))
    best.sort(key=lambda x: -x[0])
    print(name, "top:", best[:3], flush=True)
    print(name, "top split/join:", [b for b in best if not b[1]["il_flat"]][:2], flush=True)
    res.append(dict(problem=name, ranking=best))
(OUT / "order2.json").write_text(json.dumps(res, indent=0, default=str))
