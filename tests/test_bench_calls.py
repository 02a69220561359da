"""What the benchmark times is what it says: every call of every entry point's implementations,
ours and the peers', forward and backward, at a small shape of each pairing and of partial
rotary, against a float64 rotation of the problem's own input; compiled on a GPU, in the
interpreter on a CPU. A call that rotated the wrong channels, or skipped the pass-through, would
otherwise be timed and recorded as doing the job. (Left out: torch.compile's calls, which compile
the eager formula checked here, seconds a compile; and CUDA-graph replays of calls checked here,
whose warm-up rotates an in-place problem before the replay.)"""

from __future__ import annotations

import pytest
import torch

from rope_kernels import bench
from rope_kernels.reference import rope_reference
from test_qkv import _reference as qkv_reference
from test_serving import reference as cache_reference

ATOL = 2e-5  # fp32 problems: a few float32 ulps of values of order 1 (sin/cos of fp32 angles)
PAIRINGS = [dict(interleaved=False, rotary_percent=1.0), dict(interleaved=True, rotary_percent=1.0),
            dict(interleaved=False, rotary_percent=0.5), dict(interleaved=True, rotary_percent=0.5)]


@pytest.fixture(autouse=True)
def problems_here(monkeypatch):
    """The benchmark builds its problems on the GPU; without one, here (the interpreter)."""
    if not torch.cuda.is_available():
        monkeypatch.setattr(bench, "DEVICE", "cpu")


def _timed_calls(impls: dict, make_problem, direction: str):
    """(name, problem, result) of every implementation that applies, each on a fresh problem
    (in-place calls rotate the problem's own tensors; every problem is made from one seed, so
    the expected values come from yet another, untouched one)."""
    ran = []
    for name, make in impls.items():
        if name.startswith("torch.compile") or "CUDA graph" in name:
            continue  # (the graph replays a call checked here, warmed up on its own buffers)
        p = make_problem()
        fn = make(p, direction)
        if fn is not None:
            ran.append((name, p, fn()))
    assert any("ours" in name for name, _, _ in ran)
    return ran


@pytest.mark.parametrize("pairing", PAIRINGS, ids=lambda p: f"{p}")
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_te_style_calls(fmt, pairing, direction):
    def make():
        return bench.Problem(fmt, "fp32", seq_len=64, batch=2, heads=4, head_dim=64,
                             n_seqs=5 if fmt == "thd" else None, **pairing)

    ref = make()
    x = ref.t if direction == "forward" else ref.grad
    angles = ref.freqs.double() * (1 if direction == "forward" else -1)
    expected = rope_reference(x.double(), angles, **ref.kwargs())
    for name, p, out in _timed_calls(bench.implementations(), make, direction):
        if name.startswith("Liger"):
            # q and k: the two halves of the heads, copied; its backward is timed on the same
            # tensors as its forward (the same bytes), returns (q, k, cos, sin)
            out = torch.cat(out[:2], dim=1).transpose(1, 2)
            if direction == "backward":
                on_t = rope_reference(ref.t.double(), angles, **ref.kwargs())
                torch.testing.assert_close(out.double(), on_t, atol=ATOL, rtol=0, msg=name)
                continue
        elif isinstance(out, tuple):  # autograd.grad
            (out,) = out
        torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("pairing", PAIRINGS, ids=lambda p: f"{p}")
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_qk_calls(pairing, direction):
    def make():
        return bench.QKProblem("fp32", seq_len=64, batch=2, heads=4, k_heads=2, head_dim=64,
                               **pairing)

    ref = make()
    q, k = (ref.q, ref.k) if direction == "forward" else (ref.gq, ref.gk)
    cos, sin = ref.cache.chunk(2, dim=-1)
    cache = torch.cat((cos, sin * (1 if direction == "forward" else -1)), dim=-1)
    for name, p, out in _timed_calls(bench.qk_implementations(decode=True), make, direction):
        if out is None:  # in place
            out = (p.q, p.k) if direction == "forward" else (p.gq, p.gk)
        got = []
        for x, o in zip((q, k), out):
            if o.dim() == 2:  # [tokens, heads * d]
                o = o.view(x.shape)
            elif o.shape != x.shape:  # [b, h, s, d]
                o = o.transpose(1, 2)
            got.append(o)
        for x, o in zip((q, k), got):
            expected = cache_reference(ref.positions, p.tokens(x), p.head_dim, cache,
                                       not p.interleaved).view(x.shape)
            torch.testing.assert_close(o.double(), expected, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("pairing", PAIRINGS, ids=lambda p: f"{p}")
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_qkv_calls(pairing, direction):
    def make():
        return bench.QKVProblem("fp32", seq_len=64, batch=2, heads=2, q_per_group=2, head_dim=64,
                                **pairing)

    for name, p, out in _timed_calls(bench.qkv_implementations(), make, direction):
        angles = p.freqs.double()
        if direction == "forward":  # (nothing in place: p's tensors are as made)
            expected = qkv_reference(p.qkv.double(), angles, angles, p.splits,
                                     interleaved=p.interleaved)
            for o, e in zip(out, expected):
                torch.testing.assert_close(o.double(), e, atol=ATOL, rtol=0, msg=name)
        else:
            gq, gk, gv = (g.double() for g in p.grads)
            gq = rope_reference(gq, -angles, interleaved=p.interleaved)
            gk = rope_reference(gk, -angles, interleaved=p.interleaved)
            expected = torch.cat((gq.reshape(*gq.shape[:2], p.heads, -1), gk, gv), dim=3)
            torch.testing.assert_close(out.double(), expected, atol=ATOL, rtol=0, msg=name)
