"""Checks the solutions of notebook 07 (notebooks/solutions/07_packed_sequences_and_serving.py)
against the package's kernels and the float64 reference."""

import pytest
import torch

from conftest import DEVICE, assert_rope_close, load_solution, randn
from rope_kernels import (RotaryPositionEmbedding, apply_rope_with_cos_sin_cache, rope_2d,
                          rope_reference)

sol = load_solution("07_packed_sequences_and_serving")


@pytest.mark.parametrize("cp_size,starts", [(1, False), (1, True), (2, False), (2, True)])
def test_token_rows_drive_the_kernel_like_the_reference(cp_size, starts):
    """Each token rotated by the table row token_rows gives it equals the reference for the
    packed tensor; and the kernel's pre-pass path gives the same (its output checked)."""
    lengths = [4, 0, 8, 4, 12] if cp_size == 2 else [3, 0, 5, 1, 7]
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32,
                      device=DEVICE)
    sp = torch.tensor([2, 0, 1, 3, 0], dtype=torch.int32, device=DEVICE) if starts else None
    rows = sol.token_rows(cu, cp_size, cp_size - 1, sp)
    emb = RotaryPositionEmbedding(8, device=DEVICE)(32)
    t = randn((int(cu[-1]) // cp_size, 2, 8), torch.float32, 3)
    ref = rope_reference(t.double(), emb, "thd", sp, False, cu, cp_size, cp_size - 1)
    per_token = torch.stack([rope_reference(t.double()[i][None, None], emb[int(r):int(r) + 1])
                             [0, 0] for i, r in enumerate(rows.tolist())])
    assert torch.allclose(per_token, ref, atol=1e-12)
    out = rope_2d(t, emb, "thd", sp, cu_seqlens=cu, cp_size=cp_size, cp_rank=cp_size - 1,
                  config=dict(token_rows=True))
    assert_rope_close(out, ref, torch.float32)


def test_token_rows_is_not_a_python_loop_over_sequences():
    cu = torch.arange(0, 2 * 50001, 2, dtype=torch.int32)  # 50000 sequences of 2 tokens
    rows = sol.token_rows(cu)
    assert rows.tolist()[:6] == [0, 1, 0, 1, 0, 1] and len(rows) == 100000


@pytest.mark.parametrize("lengths,block_m,expected", [
    ([8, 8, 8], 4, 0.0), ([8, 1], 4, 0.25), ([16, 1, 1, 1], 4, 0.5625), ([], 4, 0.0), ([3], 4, 0.0),
    ([4096] + [4] * 15, 4, 1 - (1024 + 15) / (1024 * 16))])
def test_grid_waste(lengths, block_m, expected):
    assert sol.grid_waste(lengths, block_m) == pytest.approx(expected)


@pytest.mark.parametrize("is_neox", [True, False])
def test_cache_and_reference_match_the_package(is_neox):
    cache = sol.make_cos_sin_cache(64, 12, device=DEVICE)
    assert cache.shape == (64, 12) and cache.dtype == torch.float32
    assert torch.allclose(cache[:, :6] ** 2 + cache[:, 6:] ** 2, torch.ones(64, 6, device=DEVICE))
    positions = torch.tensor([5, 0, 63, 5], device=DEVICE)
    q, k = randn((4, 3 * 16), torch.float32, 1), randn((4, 16), torch.float32, 2)
    qo, ko = apply_rope_with_cos_sin_cache(positions, q, k, 16, cache, is_neox)
    assert_rope_close(qo, sol.rope_with_cache(positions, q, 16, cache, is_neox), torch.float32)
    assert_rope_close(ko, sol.rope_with_cache(positions, k, 16, cache, is_neox), torch.float32)
    # able to fail: the other pairing gives another result
    other = sol.rope_with_cache(positions, q, 16, cache, not is_neox)
    assert not torch.allclose(qo.double(), other, atol=1e-3)


def test_llama31_frequencies_match_the_package():
    """Exercise 4 against rope_qk.inv_freq_table (float64 both, the package's rounded to float32
    once): within one float32 rounding; every regime present at head_dim 128, and a plain table
    differs (able to fail)."""
    from rope_kernels import rope_qk

    ours = sol.llama31_inv_freq(128)
    table = rope_qk.inv_freq_table(128, 8, 5e5, torch.device("cpu"), (1, 4, 8192))
    assert ours.dtype == torch.float64 and ours.shape == (64,)
    torch.testing.assert_close(ours.float(), table, rtol=2**-23, atol=0)
    plain = 5e5 ** (-2 * torch.arange(64, dtype=torch.float64) / 128)
    scaled, kept = torch.isclose(ours, plain / 8), torch.isclose(ours, plain)
    assert scaled.any() and kept.any() and (~scaled & ~kept).any()
    assert not torch.allclose(sol.llama31_inv_freq(128, rope_scale=4).float(), table)


@pytest.mark.parametrize("section,interleaved", [([16, 24, 24], False), ([24, 20, 20], True),
                                                 ([2, 0, 6], False)])
def test_mrope_axes_and_rotation_match_the_package(section, interleaved, seed):
    """Exercise 5: the axes as the reference rules give them (interleaved [24, 20, 20]: 24, 20
    and 20 pairs), and the rotation built from them against apply_mrope_with_cos_sin_cache; a
    map with H and W swapped gives other numbers (able to fail)."""
    from rope_kernels import apply_mrope_with_cos_sin_cache

    rotary_dim = 2 * sum(section)
    axes = sol.mrope_axes(rotary_dim, section, interleaved)
    assert axes.dtype == torch.int64 and axes.shape == (rotary_dim // 2,)
    assert [int((axes == a).sum()) for a in range(3)] == list(section)
    if not interleaved:
        assert torch.equal(axes, torch.repeat_interleave(torch.arange(3), torch.tensor(section)))
    else:
        assert axes[:6].tolist() == [0, 1, 2, 0, 1, 2] and axes[-4:].tolist() == [0, 0, 0, 0]
    g = torch.Generator().manual_seed(seed)
    cache = sol.make_cos_sin_cache(256, rotary_dim, device=DEVICE)
    positions = torch.randint(0, 256, (3, 6), generator=g).to(DEVICE)
    x = randn((6, 2 * (rotary_dim + 8)), torch.float32, seed)
    ours, _ = apply_mrope_with_cos_sin_cache(positions, x, x[:, :rotary_dim + 8], rotary_dim + 8,
                                             cache, mrope_section=section,
                                             mrope_interleaved=interleaved)
    theirs = sol.mrope_with_cache(positions, x, rotary_dim + 8, cache, section, interleaved)
    assert_rope_close(ours, theirs, torch.float32)
    swapped = sol.mrope_with_cache(positions[[0, 2, 1]], x, rotary_dim + 8, cache, section,
                                   interleaved)
    assert not torch.allclose(swapped, theirs)
