"""GPT-OSS's, OpenAI's privacy filter's and NanoChat's functions of ``rope_kernels.hf`` at their
models' shapes, against Llama's function of ours on the same q and k, transformers' own functions
and a copy of the same bytes (GPU only).

    python scripts/hf_conventions.py [--out figures/hf_conventions_h200.json] [--rounds 3]

GPT-OSS's cos and sin have one entry per pair (``[b, s, head_dim / 2]``), the privacy filter's
too with interleaved pairs, and NanoChat rotates by -theta: the kernel reads the narrower tables
(or negates sin) and otherwise takes the tiles of Llama's tables. This measures what that costs
or saves against Llama's call given the same q and k and the table it would take (``cat(cos,
cos)``, one entry per channel), in bf16, on the ``[b, h, s, d]`` views of ``[b, s, h, d]``
projections that models hand over, ``batch`` x 4096 tokens:

- ``gpt_oss``: 64 q / 8 k heads of 64 (gpt-oss-20b's and -120b's attention);
- ``privacy_filter``: 14 q / 2 k heads of 64 (transformers' default OpenAIPrivacyFilterConfig);
- ``nanochat``: 10 q / 10 k heads of 128 (nanochat's d20).

Rows, each timed with ``bench.time_ms`` (do_bench median, L2 flushed) in shuffled rounds:
``ours`` (the family's function, forward), ``ours backward`` (its kernel's backward call),
``ours llama`` (Llama's function of ours, same q and k, the duplicated table; for the
privacy filter Cohere's, its interleaved twin), ``transformers`` (the family's own function,
eager, forward), ``copy_same`` (a copy of the bytes ``ours`` moves). Bytes: q and k read and
written, plus each call's cos and sin read once. Before timing, each call of ours is checked
against the family's function run in float64. ``decode``: 64 tokens of one sequence, back-to-back
calls (``bench.time_per_call_us``, Python launch included).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import rope_kernels.hf as hf  # noqa: E402
from rope_kernels import bench, rope_qk  # noqa: E402

# family -> (transformers module, q heads, k heads, head_dim, ours, Llama's pairing of ours, pairs)
FAMILIES = {
    "gpt_oss": ("gpt_oss", 64, 8, 64, hf.apply_rotary_pos_emb_gpt_oss, hf.apply_rotary_pos_emb,
                "half_per_pair"),
    "privacy_filter": ("openai_privacy_filter", 14, 2, 64,
                       hf.apply_rotary_pos_emb_gpt_oss_interleaved,
                       hf.apply_rotary_pos_emb_interleaved, "interleaved_per_pair"),
    "nanochat": ("nanochat", 10, 10, 128, hf.apply_rotary_pos_emb_nanochat,
                 hf.apply_rotary_pos_emb, "half_negated"),
}
TOKENS = 4096


def _inputs(q_heads, k_heads, head_dim, batch, tokens, per_pair, seed=0):
    """q, k ([b, h, s, d] views of [b, s, h, d]), the family's cos and sin, and the table Llama's
    (or Cohere's) function takes for the same rotation."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, tokens, q_heads, head_dim, device="cuda", generator=g,
                    dtype=torch.bfloat16).transpose(1, 2)
    k = torch.randn(batch, tokens, k_heads, head_dim, device="cuda", generator=g,
                    dtype=torch.bfloat16).transpose(1, 2)
    angles = torch.rand(batch, tokens, head_dim // 2, device="cuda", generator=g) * 6.3
    if per_pair:
        cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
        return q, k, cos, sin
    emb = torch.cat((angles, angles), -1)
    return q, k, emb.cos().bfloat16(), emb.sin().bfloat16()


def _llama_tables(cos, sin, pairs):
    """The table of one entry per channel that Llama's (Cohere's) function takes for the
    rotation ``pairs``' function does with ``cos`` and ``sin``."""
    if pairs == "half_per_pair":
        return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    if pairs == "interleaved_per_pair":
        return cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    return cos, -sin  # NanoChat's -theta


def _check(want, got):
    for w, g in zip(want, got):
        torch.testing.assert_close(g.double(), w, rtol=2e-2, atol=2e-2)


def _checked_call(family: str, batch: int, tokens: int):
    """The family's shape, its function, Llama's (Cohere's) function of ours and transformers'
    own, with inputs of ``batch`` x ``tokens``; both functions of ours checked first against
    transformers' function run in float64. -> (shape dict, ours, llama, theirs, pairs,
    (q, k, cos, sin), (lcos, lsin))."""
    module_name, hq, hk, d, ours, llama, pairs = FAMILIES[family]
    theirs = importlib.import_module(
        f"transformers.models.{module_name}.modeling_{module_name}").apply_rotary_pos_emb
    q, k, cos, sin = _inputs(hq, hk, d, batch, tokens, pairs.endswith("_per_pair"))
    lcos, lsin = _llama_tables(cos, sin, pairs)
    want = theirs(q.double(), k.double(), cos.double(), sin.double())  # the family's, exact
    _check(want, ours(q, k, cos, sin))
    _check(want, llama(q, k, lcos, lsin))  # the same rotation
    shape = dict(family=family, batch=batch, tokens=tokens, q_heads=hq, k_heads=hk, head_dim=d)
    return shape, ours, llama, theirs, pairs, (q, k, cos, sin), (lcos, lsin)


def fresh_like(x: torch.Tensor) -> torch.Tensor:
    """x's values in a new buffer of x's layout (the in-place calls rotate their own copy; the
    scripts hf_deepseek.py and hf_vision.py use it too)."""
    # (x's strides may leave gaps: as_strided over a buffer as large as x's span)
    span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride()))
    out = torch.empty(span, dtype=x.dtype, device=x.device).as_strided(x.size(), x.stride())
    out.copy_(x)
    return out


def timing_fields(ms: list, nbytes: int, copy_gbps: float) -> dict:
    """A row's timing of ``nbytes`` from its milliseconds per round: the median in us, the
    spread, the fraction of copy (this script's and ``hf_one_tensor.py``'s rows)."""
    us = [t * 1e3 for t in ms]
    median = statistics.median(us)
    return dict(mbytes=nbytes / 1e6, time_us=median, spread_us=[min(us), max(us)],
                of_copy=nbytes / (median * 1e-6) / 1e9 / copy_gbps)


def write_record(path: pathlib.Path, copy_gbps: float, mode: str, argv, rounds: int,
                 bytes_counted: str, rows: list) -> None:
    """The JSON record of a run of ``scripts/{mode}.py``: its provenance (the transformers
    version, the bytes counted and the timing too) and ``rows``."""
    prov = bench.provenance(copy_gbps, mode)
    prov["command"] = f"python scripts/{mode}.py " + " ".join(argv or sys.argv[1:])
    import transformers

    prov["transformers"] = transformers.__version__
    prov["bytes"] = bytes_counted
    prov["timing"] = (f"triton.testing.do_bench median over {rounds} shuffled rounds (L2 "
                      "flushed per call); decode: back-to-back calls timed with CUDA events, "
                      "Python launch included, fastest of 4 rounds. ours backward: the kernel's "
                      "backward call directly")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"provenance": prov, "rows": rows}, indent=1) + "\n")
    print("wrote", path)


def measure(family: str, batch: int, rounds: int, copy_gbps: float) -> list[dict]:
    shape, ours, llama, theirs, pairs, (q, k, cos, sin), (lcos, lsin) = _checked_call(
        family, batch, TOKENS)
    qk_bytes = 2 * (q.numel() + k.numel()) * q.element_size()
    table = 2 * cos.numel() * cos.element_size()
    ltable = 2 * lcos.numel() * lcos.element_size()
    calls = {
        "ours": (lambda: ours(q, k, cos, sin), qk_bytes + table),
        "ours backward": (lambda: rope_qk.rope_cos_sin(q, k, cos, sin, 1, backward=True,
                                                       pairs=pairs), qk_bytes + table),
        "ours llama": (lambda: llama(q, k, lcos, lsin), qk_bytes + ltable),
        "transformers": (lambda: theirs(q, k, cos, sin), qk_bytes + table),
    }
    src = torch.empty((qk_bytes + table) // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    calls["copy_same"] = (lambda: dst.copy_(src), qk_bytes + table)
    times = bench.shuffled_times({name: fn for name, (fn, _) in calls.items()}, rounds)
    return [dict(**shape, call=name, **timing_fields(times[name], nbytes, copy_gbps))
            for name, (_, nbytes) in calls.items()]


def decode(family: str) -> list[dict]:
    shape, ours, llama, theirs, _, (q, k, cos, sin), (lcos, lsin) = _checked_call(family, 1, 64)
    calls = {"ours": lambda: ours(q, k, cos, sin), "ours llama": lambda: llama(q, k, lcos, lsin),
             "transformers": lambda: theirs(q, k, cos, sin)}
    return [dict(**shape, call=f"decode {name}", us_per_call=bench.time_per_call_us(fn, repeats=4))
            for name, fn in calls.items()]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=ROOT / "figures" / "hf_conventions_h200.json")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args(argv)
    copy_gbps = bench.copy_bandwidth_gbps()
    rows = []
    for family in FAMILIES:
        for batch in args.batches:
            rows += measure(family, batch, args.rounds, copy_gbps)
            for r in rows[-5:]:
                print(f"{family:15s} b{batch:<3d} {r['call']:14s} {r['mbytes']:8.1f} MB "
                      f"{r['time_us']:8.1f} us {r['of_copy']:.3f}", flush=True)
        rows += decode(family)
        for r in rows[-3:]:
            print(f"{family:15s} {r['call']:20s} {r['us_per_call']:.1f} us", flush=True)
    write_record(args.out, copy_gbps, "hf_conventions", argv, args.rounds,
                 "q and k read and written, plus the call's cos and sin read once (bf16; "
                 "Llama's call of ours: the duplicated table of one entry per channel)", rows)


if __name__ == "__main__":
    main()
