"""Checks the solutions of notebook 01 (notebooks/solutions/01_roformer_math.py) in float64.

The module is loaded by conftest.load_solution (its file name starts with a digit).
"""

import math

import pytest
import torch

from conftest import load_solution

from rope_kernels import RotaryPositionEmbedding, rope_reference  # noqa: E402

sol = load_solution("01_roformer_math")

CPU = torch.device("cpu")


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g)


def _table64(positions, d, base=10000.0, interleaved=False):
    """Float64 angle table [len(positions), 1, 1, d] in the layout rope_reference expects."""
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    f = torch.as_tensor(positions, dtype=torch.float64)[:, None] * theta[None, :]
    f = f.repeat_interleave(2, dim=-1) if interleaved else torch.cat((f, f), dim=-1)
    return f.reshape(len(positions), 1, 1, d)


# ---------------------------------------------------------------- exercise 1: rope_complex


@pytest.mark.parametrize("shape", [(16, 2, 3, 64), (5, 1, 1, 8), (9, 4, 2, 128)])
def test_rope_complex_matches_reference_float64_table(shape):
    x = _randn(*shape)
    s, d = shape[0], shape[-1]
    out = sol.rope_complex(x, torch.arange(s), base=10000.0)
    ref = rope_reference(x, _table64(range(s), d, interleaved=True), "sbhd", interleaved=True)
    assert out.shape == x.shape and out.dtype == torch.float64
    assert (out - ref).abs().max().item() < 1e-12


def test_rope_complex_matches_te_table():
    # The module's table is float32, so agreement is to float32 rounding of the angles only.
    s, d = 32, 64
    x = _randn(s, 2, 3, d, seed=1)
    freqs = RotaryPositionEmbedding(d, interleaved=True, device=CPU)(s)
    ref = rope_reference(x, freqs, "sbhd", interleaved=True)
    out = sol.rope_complex(x, torch.arange(s))
    assert torch.allclose(out, ref, atol=1e-5, rtol=0)


def test_rope_complex_arbitrary_positions_and_base():
    positions = [7, 0, 1000, 3, 8191]
    d, base = 32, 500000.0
    x = _randn(len(positions), 2, 2, d, seed=2)
    out = sol.rope_complex(x, torch.tensor(positions), base=base)
    # One table row per sequence row: rope_reference uses row m for sequence index m.
    ref = torch.cat(
        [
            rope_reference(x[i : i + 1], _table64([p], d, base, interleaved=True), interleaved=True)
            for i, p in enumerate(positions)
        ]
    )
    assert (out - ref).abs().max().item() < 1e-10


def test_rope_complex_is_interleaved_not_half_split():
    # Guards the comparison itself: the two layouts give different results.
    s, d = 8, 16
    x = _randn(s, 1, 2, d, seed=3)
    out = sol.rope_complex(x, torch.arange(s))
    half = rope_reference(x, _table64(range(s), d), "sbhd", interleaved=False)
    assert (out - half).abs().max().item() > 1e-3


# ---------------------------------------------------------------- exercise 2: angles and wavelengths


def test_last_pair_angle():
    angle = sol.last_pair_angle(8191, 128, 10000.0)
    assert math.isclose(angle, 8191 * 10000.0 ** (-126 / 128), rel_tol=1e-12)
    assert math.isclose(angle, 0.945882, abs_tol=1e-6)
    table = RotaryPositionEmbedding(128, device=CPU)(8192)  # float32, half-split: last pair at 63
    assert math.isclose(angle, table[8191, 0, 0, 63].item(), rel_tol=1e-5)
    assert sol.last_pair_angle(8191, 128, 500000.0) < angle / 40


def test_pair_wavelengths():
    d = 128
    w = sol.pair_wavelengths(d, 10000.0)
    assert w.shape == (d // 2,) and w.dtype == torch.float64
    inv = RotaryPositionEmbedding(d, device=CPU).inv_freq.double()
    assert torch.allclose(w, 2 * math.pi / inv, rtol=1e-6, atol=0)
    assert math.isclose(w[0].item(), 2 * math.pi, rel_tol=1e-12)
    assert math.isclose(w[-1].item(), 2 * math.pi * 10000.0 ** (126 / 128), rel_tol=1e-12)
    assert bool((w[1:] > w[:-1]).all())


# ---------------------------------------------------------------- exercise 3: rope_partial


@pytest.mark.parametrize("rotary_percent", [0.5, 0.25, 1.0])
def test_rope_partial_matches_reference(rotary_percent):
    s, d = 24, 64
    x = _randn(s, 2, 3, d, seed=4)
    out = sol.rope_partial(x, rotary_percent)
    freqs = RotaryPositionEmbedding(d, rotary_percent=rotary_percent, device=CPU)(s)
    d2 = freqs.shape[-1]
    assert torch.allclose(out, rope_reference(x, freqs, "sbhd"), atol=1e-5, rtol=0)
    exact = rope_reference(x, _table64(range(s), d2), "sbhd")
    assert (out - exact).abs().max().item() < 1e-12


def test_rope_partial_passthrough_and_norm():
    s, d = 16, 64
    x = _randn(s, 2, 3, d, seed=5)
    out = sol.rope_partial(x, 0.5)
    assert torch.equal(out[..., d // 2 :], x[..., d // 2 :])
    assert not torch.allclose(out[1:, ..., : d // 2], x[1:, ..., : d // 2])  # it did rotate
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)
    assert torch.allclose(out[0], x[0], atol=1e-15, rtol=0)  # position 0: identity
