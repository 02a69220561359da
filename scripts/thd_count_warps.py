"""thd: the warps of 8-head tiles (2 KB token rows, bf16) that count the boundaries, in packs of
few sequences (rope_2d's ONE_WARP_MIN_BOUNDS), measured on the GPU.

131072 tokens of 8 heads of 128 cut at random into 4-64 sequences or into 16 of 8192, and 32
heads in 16 sequences, forward: the package's call (pkg), the count on 2, 4 or 1 warps (1 warp
with the pairs' loads, not whole rows), the pre-pass (config token_rows) with the main kernel's
wait after or before its x loads, and a torch copy of the same bytes. Every variant's output is
compared bit for bit with the package's (DIFF lines). Each entry: fractions of the device copy
bandwidth as (time_ms_host_ahead, time_ms = do_bench-style) medians over shuffled rounds.

usage: python scripts/thd_count_warps.py OUT.json ROUNDS   (5 rounds: about a minute on an H200)
"""
import json, random, sys, time
import torch
sys.path.insert(0, ".")
import importlib
r2 = importlib.import_module("rope_kernels.rope_2d")
from rope_kernels.bench import Problem, copy_bandwidth_gbps, time_ms_host_ahead, time_ms, provenance
out_path, rounds = sys.argv[1], int(sys.argv[2])
copy = copy_bandwidth_gbps()
packs = {}
for n in (4, 16, 32, 64):
    packs[f"h8 random {n}"] = Problem("thd", seq_len=8192, batch=16, heads=8, n_seqs=n)
packs["h8 uniform 16x8192"] = Problem("thd", seq_len=8192, batch=16, heads=8)
packs["h32 random 16"] = Problem("thd", seq_len=4096, batch=16, heads=32, n_seqs=16)
V = {"pkg": None, "count 2w": dict(token_rows=False, num_warps=2), "count 4w": dict(token_rows=False, num_warps=4),
     "pre lf": dict(token_rows=True, wait_first=False, num_warps=2), "pre wf": dict(token_rows=True, wait_first=True, num_warps=2),
     "count 1w pairs": dict(token_rows=False, num_warps=1, whole_rows=False)}
fns, nb = {}, {}
for pname, p in packs.items():
    x = p.t
    ref = r2.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens)
    for vname, cfg in V.items():
        o = torch.full_like(x, float("nan"))
        f = lambda x=x, p=p, o=o, cfg=cfg: r2.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens, out=o, config=cfg)
        f(); torch.cuda.synchronize()
        if not torch.equal(o, ref): print("DIFF", pname, vname)
        fns[(pname, vname)] = f
    co = torch.empty_like(x)
    fns[(pname, "copy same")] = lambda co=co, x=x: co.copy_(x)
    nb[pname] = (p.nbytes, 2 * x.numel() * x.element_size(), p.max_len)
keys = list(fns); res = {k: [] for k in keys}; resb = {k: [] for k in keys}
for r in range(rounds):
    random.shuffle(keys)
    for k in keys:
        by = nb[k[0]][0] if k[1] != "copy same" else nb[k[0]][1]
        res[k].append(by / time_ms_host_ahead(fns[k]) / 1e6 / copy)
        resb[k].append(by / time_ms(fns[k]) / 1e6 / copy)
    print("round", r, flush=True)
table = {}
for (pname, c), v in res.items():
    table.setdefault(pname, {})[c] = (round(sorted(v)[len(v) // 2], 4), round(sorted(resb[(pname, c)])[len(v) // 2], 4))
for pname, t in table.items():
    print(f"{pname:20s} max_len {nb[pname][2]:6d} " + " ".join(f"{c}={v[0]:.3f}/{v[1]:.3f}" for c, v in t.items()))
prov = provenance(copy, "probe")
prov.update(command=f"python scripts/thd_count_warps.py {out_path} {rounds}",
            timing=f"(time_ms_host_ahead, time_ms) medians of {rounds} shuffled rounds (L2 flushed per call)")
json.dump(dict(provenance=prov, table=table), open(out_path, "w"), indent=1)
