"""Checks the solutions of notebook 03 (notebooks/solutions/03_triton_1d_kernel.py).

The module is loaded by conftest.load_solution (its file name starts with a digit). Its
kernel runs in Triton's interpreter on a CPU (rope_kernels turns it on) and compiled on a GPU.
Counts are checked against brute-force simulations of the launch grids.
"""

import itertools

import pytest
import torch

from conftest import load_solution

from conftest import DEVICE, randn  # noqa: E402

sol = load_solution("03_triton_1d_kernel")

MARGIN = 37  # poison on each side of the output window


def _poisoned(shape, dtype):
    numel = 1
    for n in shape:
        numel *= n
    buf = torch.full((numel + 2 * MARGIN,), float("nan"), dtype=dtype, device=DEVICE)
    return buf, buf[MARGIN:MARGIN + numel].view(shape)


# ---------------------------------------------------------------- exercise 1: copy_passthrough


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt,shape,d2,block_rows", [
    ("sbhd", (5, 3, 2, 16), 10, 4),   # 30 rows: 8 programs, the last one half masked
    ("sbhd", (3, 2, 2, 8), 6, 8),
    ("bshd", (2, 7, 3, 24), 8, 16),
    ("thd", (11, 3, 12), 4, 2),
])
def test_copy_passthrough_writes_exactly_the_passthrough_channels(fmt, shape, d2, block_rows,
                                                                  dtype):
    t = randn(shape, dtype, seed=11)
    buf, out = _poisoned(shape, dtype)
    result = sol.copy_passthrough(t, d2, out, fmt, block_rows)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out[..., d2:], t[..., d2:]), "pass-through channels not copied exactly"
    assert torch.isnan(out[..., :d2]).all(), "a rotary channel was written"
    assert torch.isnan(buf[:MARGIN]).all() and torch.isnan(buf[-MARGIN:]).all(), "stray write"


def test_copy_passthrough_strided_input():
    base = randn((4, 6, 3, 16), torch.float32, seed=12)
    t = base.transpose(0, 1)  # sbhd view [6, 4, 3, 16]
    buf, out = _poisoned(t.shape, torch.float32)
    sol.copy_passthrough(t, 6, out, "sbhd", block_rows=8)
    assert torch.equal(out[..., 6:], t[..., 6:])
    assert torch.isnan(out[..., :6]).all()


def test_copy_passthrough_full_rotary_writes_nothing():
    t = randn((3, 2, 2, 8), torch.float32, seed=13)
    buf, out = _poisoned(t.shape, torch.float32)
    sol.copy_passthrough(t, 8, out)
    assert torch.isnan(buf).all()


# ---------------------------------------------------------------- exercise 2: grid_info


def _simulate(n_rows, block_rows):
    programs = 0
    masked_last = 0
    while programs * block_rows < n_rows:
        rows = programs * block_rows + torch.arange(block_rows)
        masked_last = int((rows >= n_rows).sum())
        programs += 1
    return programs, masked_last


@pytest.mark.parametrize("n_rows,block_rows", list(itertools.product([0, 1, 7, 8, 9, 12, 100, 1023],
                                                                     [1, 4, 8, 64])))
def test_grid_info_matches_simulation(n_rows, block_rows):
    assert sol.grid_info(n_rows, block_rows) == _simulate(n_rows, block_rows)


def test_grid_info_te_default():
    n_rows = 4096 * 16 * 32
    assert sol.grid_info(n_rows, 16) == (n_rows // 16, 0)
    assert sol.grid_info(n_rows + 3, 16) == (n_rows // 16 + 1, 13)


# ---------------------------------------------------------------- exercise 3: cos_sin_evaluations


def _simulate_1d(s, b, h, d2, block_rows, half):
    n_rows, count = s * b * h, 0
    for pid in range(-(-n_rows // block_rows)):
        rows = pid * block_rows + torch.arange(block_rows)
        mask = (rows < n_rows)[:, None] & (torch.arange(half) < d2 // 2)[None, :]
        count += 4 * int(mask.sum())  # cos1, cos2, sin1, sin2 per unmasked pair
    return count


def _simulate_2d(s, b, h, d2, block_s, block_h, bpp, half, has_start):
    count = 0
    for ps, ph, pb in itertools.product(range(-(-s // block_s)), range(-(-h // block_h)),
                                        range(-(-b // bpp))):
        s_idx = ps * block_s + torch.arange(block_s)
        mask = (s_idx < s)[:, None] & (torch.arange(half) < d2 // 2)[None, :]
        n_batch = min(bpp, b - pb * bpp)
        count += 4 * int(mask.sum()) * (n_batch if has_start else 1)
    return count


@pytest.mark.parametrize("s,b,h,d2", [(5, 3, 2, 6), (7, 2, 9, 8), (1, 4, 3, 16)])
def test_cos_sin_evaluations_1d(s, b, h, d2):
    half = 1 << max(0, (d2 // 2 - 1).bit_length())
    expected = _simulate_1d(s, b, h, d2, block_rows=4, half=half)
    assert sol.cos_sin_evaluations(s, b, h, d2, "1d") == expected


@pytest.mark.parametrize("has_start", [False, True])
@pytest.mark.parametrize("s,b,h,d2,block_h,bpp", [(5, 3, 2, 6, 8, 3), (7, 4, 9, 8, 4, 2),
                                                  (6, 5, 16, 16, 8, 2)])
def test_cos_sin_evaluations_2d(s, b, h, d2, block_h, bpp, has_start):
    half = 1 << max(0, (d2 // 2 - 1).bit_length())
    expected = _simulate_2d(s, b, h, d2, 2, block_h, bpp, half, has_start)
    got = sol.cos_sin_evaluations(s, b, h, d2, "2d", block_h, bpp, has_start)
    assert got == expected


def test_cos_sin_evaluations_te_default():
    shape = (4096, 16, 32, 128)
    assert sol.cos_sin_evaluations(*shape, "1d") == 4096 * 16 * 32 * 64 * 4
    assert sol.cos_sin_evaluations(*shape, "2d", block_h=8) == 4096 * 64 * 4 * 4
    assert sol.cos_sin_evaluations(*shape, "min") == 4096 * 64 * 2
    ratio = sol.cos_sin_evaluations(*shape, "1d") / sol.cos_sin_evaluations(*shape, "2d", 8)
    assert ratio == 128  # batch 16 x 8 heads per tile share one evaluation
