"""thd: which path the package takes for a pack (rope_2d's TOKEN_ROWS_ABOVE,
WIDE_TOKEN_ROWS_ABOVE and WAIT_FIRST_MEAN_TOKENS), measured on the GPU.

For packs of 8, 16 and 32 heads of 128 (bf16) and 8 heads in fp32, cut at random (or into equal
lengths), forward and backward, each of:
  count   every tile counts the boundaries below its tokens (config token_rows=False; packs of at
          most 512 sequences)
  pre lf  the per-token pre-pass, the main kernel's x loads before its wait for it (PDL)
  pre wf  the same, waiting before the x loads (config wait_first=True)
  pkg     the package's own choice; copy same: a torch copy of the same bytes.
Every variant's output is compared bit for bit with the package's (DIFF lines). Fractions of
the device copy bandwidth, medians of ``time_ms_host_ahead`` over shuffled rounds.

usage: python scripts/thd_policy.py OUT.json ROUNDS [PREFIXES]   (5 rounds: about 4 minutes on an
H200). PREFIXES, comma-separated (say h16,h32), keeps only the packs whose names start with one.
"""
import json, random, sys, time
import torch
sys.path.insert(0, ".")
import importlib
r2 = importlib.import_module("rope_kernels.rope_2d")
from rope_kernels.bench import Problem, copy_bandwidth_gbps, time_ms_host_ahead, provenance
out_path, rounds = sys.argv[1], int(sys.argv[2])
prefixes = tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("",)
copy = copy_bandwidth_gbps()
packs = {}


def add(name, **kw):
    if name.startswith(prefixes):
        packs[name] = Problem("thd", **kw)


for n in (64, 128, 256, 512, 1024, 2048, 4096, 16384, 65536):
    add(f"h8 random {n}", seq_len=8, batch=16384, heads=8, n_seqs=n)
add("h8 uniform x8", seq_len=8, batch=16384, heads=8)
add("h8 uniform x512", seq_len=512, batch=256, heads=8)
# 16-bit rows wider than 2 KB: 32, 48 and 63 sequences share the count's slot of 64 boundaries.
for n in (16, 32, 48, 63, 64, 128, 256):
    add(f"h16 random {n}", seq_len=8, batch=8192, heads=16, n_seqs=n)
for n in (16, 32, 48, 63, 64, 128, 256):
    add(f"h32 random {n}", seq_len=4, batch=16384, heads=32, n_seqs=n)
add("h32 uniform x1024", seq_len=1024, batch=64, heads=32)
for n in (32, 64, 128):
    add(f"fp32 h8 random {n}", seq_len=8, batch=8192, heads=8, n_seqs=n, dtype="fp32")
V = {"count": dict(token_rows=False), "pre lf": dict(token_rows=True, wait_first=False),
     "pre wf": dict(token_rows=True, wait_first=True)}
fns, nb, pk = {}, {}, {}
for pname, p in packs.items():
    for direction in ("fwd", "bwd"):
        x = p.t if direction == "fwd" else p.grad
        bw = direction == "bwd"
        ref = r2.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens, backward=bw)
        ref64 = None
        vs = dict(V, pkg=None)
        if p.n_seqs > 512:
            vs.pop("count")
        for vname, cfg in vs.items():
            o = torch.full_like(x, float("nan"))
            f = lambda x=x, p=p, bw=bw, o=o, cfg=cfg: r2.rope_2d(x, p.freqs, "thd", cu_seqlens=p.cu_seqlens, backward=bw, out=o, config=cfg)
            f(); torch.cuda.synchronize()
            if not torch.equal(o, ref):
                print("DIFF", pname, direction, vname, (o.float() - ref.float()).abs().max().item())
            fns[(pname, direction, vname)] = f
        if direction == "fwd":
            plan = r2._make_plan(x, p.freqs, torch.empty_like(x), "thd", p.cu_seqlens, None, False, 1, 0, False, None)
            pk[pname] = dict(TOKEN_ROWS=plan.constexprs["TOKEN_ROWS"], WAIT_FIRST=plan.constexprs["WAIT_FIRST"],
                             warps=plan.num_warps, n_tokens=x.shape[0], n_seqs=p.n_seqs, mb=round(p.nbytes / 1e6))
        nb[(pname, direction)] = p.nbytes
    co = torch.empty_like(p.t)
    fns[(pname, "fwd", "copy same")] = lambda co=co, x=p.t: co.copy_(x)
    nb[(pname, "copy")] = 2 * p.t.numel() * p.t.element_size()
keys = list(fns); res = {k: [] for k in keys}; t0 = time.time()
for r in range(rounds):
    random.shuffle(keys)
    for k in keys:
        ms = time_ms_host_ahead(fns[k])
        by = nb[(k[0], k[1])] if k[2] != "copy same" else nb[(k[0], "copy")]
        res[k].append(by / ms / 1e6 / copy)
    print("round", r, round(time.time() - t0), flush=True)
table = {}
for (pname, d, c), v in res.items():
    table.setdefault(pname, {}).setdefault(d, {})[c] = round(sorted(v)[len(v) // 2], 4)
for pname, t in table.items():
    print(f"{pname:18s} {pk[pname]}")
    for d, row in t.items():
        print(f"   {d} " + " ".join(f"{c}={v:.3f}" for c, v in sorted(row.items())))
prov = provenance(copy, "probe")
prov.update(command=" ".join(["python scripts/thd_policy.py"] + sys.argv[1:]),
            timing=f"time_ms_host_ahead median of {rounds} shuffled rounds (L2 flushed per call)")
json.dump(dict(provenance=prov, package=pk, table=table), open(out_path, "w"), indent=1)
