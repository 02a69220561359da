"""Checks the solutions of notebook 05 (notebooks/solutions/05_backward_pass.py) against autograd
of the float64 reference, on RoPE tables and on random non-symmetric tables.

The module is loaded by conftest.load_solution (its file name starts with a digit).
"""


import pytest
import torch

from conftest import load_solution

from conftest import DEVICE, randn  # noqa: E402
from rope_kernels import RotaryPositionEmbedding, rope_1d, rope_2d, rope_reference  # noqa: E402

sol = load_solution("05_backward_pass")


def _random_table(s, d2, seed=7):
    """Angles in [0, 20): the two halves of each row differ (not a RoPE table)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(s, 1, 1, d2, generator=g) * 20).to(DEVICE)


def _autograd_grad(t, freqs, g, **kw):
    t64 = t.detach().double().requires_grad_(True)
    rope_reference(t64, freqs, **kw).backward(g.double())
    return t64.grad


# ---------------------------------------------------------------- exercise 1: adjoint_pair


@pytest.mark.parametrize("launcher", [rope_2d, rope_1d], ids=["2d", "1d"])
@pytest.mark.parametrize("table", ["rope", "random"])
@pytest.mark.parametrize("kw", [{}, {"interleaved": True}, {"tensor_format": "bshd"}])
def test_adjoint_identity(launcher, table, kw):
    shape = (5, 3, 2, 8) if kw.get("tensor_format") != "bshd" else (3, 5, 2, 8)
    x, g = randn(shape, seed=1), randn(shape, seed=2)
    freqs = (RotaryPositionEmbedding(8, interleaved=kw.get("interleaved", False),
                                     device=DEVICE)(5) if table == "rope" else _random_table(5, 8))
    lhs, rhs = sol.adjoint_pair(x, g, freqs, launcher=launcher, **kw)
    scale = x.double().norm().item() * g.double().norm().item()
    assert abs(lhs - rhs) <= 1e-6 * scale
    # And lhs really is <R x, g> (a function returning (0, 0) fails here).
    ref = (rope_reference(x.double(), freqs, **kw) * g.double()).sum().item()
    assert abs(lhs - ref) <= 1e-6 * scale
    assert abs(ref) > 1e-3


def test_adjoint_identity_fails_for_a_wrong_backward():
    """Guards the test: a backward that only negates sin breaks the identity on a random table."""
    x, g = randn((5, 3, 2, 8), seed=1), randn((5, 3, 2, 8), seed=2)
    freqs = _random_table(5, 8)

    def negate_only(t, f, backward=False, **kw):
        return rope_reference(t, -f if backward else f, **kw)
    lhs, rhs = sol.adjoint_pair(x, g, freqs, launcher=negate_only)
    assert abs(lhs - rhs) > 1e-2


# ---------------------------------------------------------------- exercise 2: te_unfused_backward


@pytest.mark.parametrize("table", ["rope", "random"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [8, 12])
def test_te_unfused_backward_matches_autograd(table, fmt, interleaved, rotary_dim):
    s, b, h, d = 6, 2, 3, 12
    shape = (s, b, h, d) if fmt == "sbhd" else (b, s, h, d)
    t = randn(shape, torch.float64, seed=3)
    g = randn(shape, torch.float64, seed=4)
    freqs = (RotaryPositionEmbedding(d, rotary_dim / d, interleaved=interleaved,
                                     device=DEVICE)(s + 3)
             if table == "rope" else _random_table(s + 3, rotary_dim))
    want = _autograd_grad(t, freqs, g, tensor_format=fmt, interleaved=interleaved)
    got = sol.te_unfused_backward(g, freqs, fmt, interleaved)
    assert got.shape == want.shape and got.dtype == torch.float64
    assert (got - want).abs().max().item() < 1e-12
    if table == "random":
        # Negating the angles alone is not the transpose for such a table.
        naive = rope_reference(g, -freqs, fmt, interleaved=interleaved)
        assert (naive - want).abs().max().item() > 1e-2


def test_te_unfused_backward_float32_and_passthrough():
    t = randn((5, 2, 2, 16), torch.float32, seed=5)
    g = randn((5, 2, 2, 16), torch.float32, seed=6)
    freqs = RotaryPositionEmbedding(16, 0.5, device=DEVICE)(5)
    got = sol.te_unfused_backward(g, freqs)
    assert got.dtype == torch.float32
    assert torch.equal(got[..., 8:], g[..., 8:])
    want = _autograd_grad(t, freqs, g)
    assert (got.double() - want).abs().max().item() < 1e-5


# ---------------------------------------------------------------- exercise 3: round_trip


@pytest.mark.parametrize("launcher", [rope_2d, rope_1d], ids=["2d", "1d"])
@pytest.mark.parametrize("kw", [{}, {"interleaved": True}, {"tensor_format": "bshd"}])
def test_round_trip_returns_the_input(launcher, kw):
    shape = (9, 2, 3, 16) if kw.get("tensor_format") != "bshd" else (2, 9, 3, 16)
    x = randn(shape, torch.float32, seed=8)
    freqs = RotaryPositionEmbedding(16, interleaved=kw.get("interleaved", False),
                                    device=DEVICE)(9)
    back = sol.round_trip(x, freqs, launcher=launcher, **kw)
    assert back.shape == x.shape
    assert (back - x).abs().max().item() < 1e-5
    # The forward alone is far from the identity, so the test is not vacuous.
    assert (launcher(x, freqs, **kw) - x).abs().max().item() > 0.1


def test_round_trip_bf16_within_a_few_ulps():
    x = randn((9, 2, 3, 16), torch.bfloat16, seed=9)
    freqs = RotaryPositionEmbedding(16, device=DEVICE)(9)
    back = sol.round_trip(x, freqs).double()
    x64 = x.double()
    assert ((back - x64).abs() <= 1e-5 + 4 * torch.finfo(torch.bfloat16).eps * x64.abs().clamp(
        min=1.0)).all()


def test_round_trip_is_not_identity_for_a_non_symmetric_table():
    x = randn((5, 2, 2, 8), torch.float32, seed=10)
    back = sol.round_trip(x, _random_table(5, 8))
    assert (back - x).abs().max().item() > 1e-2
