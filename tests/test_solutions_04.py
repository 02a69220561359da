"""Checks the solutions of notebook 04 (notebooks/solutions/04_triton_2d_batch_reuse.py).

The module is loaded by conftest.load_solution (its file name starts with a digit).
"""

import importlib
import math

import pytest
import torch

from conftest import ROOT, load_solution

from conftest import DEVICE, ON_GPU, randn  # noqa: E402
from rope_kernels import RotaryPositionEmbedding, rope_2d  # noqa: E402

k2 = importlib.import_module("rope_kernels.rope_2d")  # the module (the package exports the function)

sol = load_solution("04_triton_2d_batch_reuse")

# ---------------------------------------------------------------- exercise 1: launch_plan

SHAPES = [
    # (shape, format, rotary_dim, element_size, interleaved)
    ((4096, 16, 32, 128), "sbhd", 128, 2, False),   # TE's default
    ((4096, 16, 32, 128), "sbhd", 128, 4, False),   # fp32
    ((4096, 16, 32, 128), "sbhd", 64, 2, False),    # rotary_percent 0.5
    ((4096, 16, 32, 256), "sbhd", 256, 2, False),
    ((16, 1024, 32, 128), "bshd", 128, 2, False),
    ((4096, 16, 32, 128), "sbhd", 128, 2, True),    # interleaved
    ((1, 64, 32, 128), "bshd", 128, 2, False),      # decode
    ((65536, 32, 128), "thd", 128, 2, False),
    ((65536, 32, 128), "thd", 128, 4, False),       # thd fp32: 4 tokens x 4 heads
    ((1000, 8, 64), "thd", 64, 2, False),           # thd, few narrow heads: several tokens a tile
    ((100, 2, 32), "thd", 32, 4, False),
    ((7, 3, 5, 24), "sbhd", 12, 4, False),
    ((5, 9, 3, 10), "bshd", 6, 2, True),
    ((1, 2048, 64, 128), "bshd", 128, 2, False),    # batch 1: the 16-head tile
    ((8192, 2, 32, 128), "sbhd", 128, 4, False),    # batch 2, fp32
    ((12, 2, 3, 32), "sbhd", 8, 2, False),          # width 4 + 4 + 32 = 40: not a power of two
    ((16, 4096, 16, 128), "bshd", 128, 2, False),   # 4 KB rows of all heads: tiled whole
    ((16, 4096, 32, 64), "bshd", 64, 2, True),      # head_dim 64, interleaved
    ((64, 1, 8, 128), "bshd", 128, 2, False),       # decode with 2 KB rows
    ((16, 4096, 16, 128), "bshd", 128, 4, False),   # fp32: 8 KB rows, the usual tile
    ((16, 4096, 32, 128), "bshd", 128, 2, False),   # 8 positions x 4 heads: gathered sines
    ((16, 4096, 32, 128), "bshd", 96, 2, False),    # the same tile, rotary 96: no gather
    ((16, 4096, 8, 128), "bshd", 96, 2, False),     # rows of all heads, rotary 96
    ((16, 4096, 16, 256), "bshd", 256, 2, False),   # 512 B rows: bshd keeps the pairs
    ((4096, 16, 16, 256), "sbhd", 256, 2, False),   # the same rows in sbhd: whole
]


def _canonical_sizes(shape, fmt):
    if fmt == "sbhd":
        return shape
    if fmt == "bshd":
        b, s, h, d = shape
        return (s, b, h, d)
    n, h, d = shape
    return (n, 1, h, d)


@pytest.mark.parametrize("whole_rows", [False, True])
@pytest.mark.parametrize("on_gpu", [True, False])
@pytest.mark.parametrize("shape,fmt,rotary_dim,esize,interleaved", SHAPES)
def test_launch_plan_matches_default_config(monkeypatch, whole_rows, on_gpu, shape, fmt,
                                            rotary_dim, esize, interleaved):
    """The plan matches the package's rule, with whole rows off (the default) and on."""
    monkeypatch.setattr(k2, "WHOLE_ROWS", whole_rows)
    s, b, h, d = _canonical_sizes(shape, fmt)
    device = torch.device("cuda", 7) if on_gpu else torch.device("cpu")  # only .type is read
    want = k2.default_config(s, b, h, d, rotary_dim, device, esize, interleaved, fmt)
    grid, cfg = sol.launch_plan(shape, fmt, rotary_dim, esize, interleaved,
                                sm_count=132 if on_gpu else None, whole_rows=whole_rows)
    assert cfg == want
    b_blocks = math.ceil(b / want["block_b"])
    group = min(want["group_b"], b_blocks)
    assert grid == (math.ceil(s / want["block_s"]) * math.ceil(h / want["block_h"])
                    * math.ceil(b_blocks / group) * group, 1, 1)


def test_launch_plan_te_default_on_h200():
    grid, cfg = sol.launch_plan((4096, 16, 32, 128), "sbhd", 128, 2, sm_count=132)
    assert (cfg["block_s"], cfg["block_b"], cfg["block_h"]) == (2, 1, 16)
    assert grid == (2048 * 2 * 16, 1, 1)


@pytest.mark.parametrize("shape,fmt,rotary_dim,interleaved", [
    ((7, 3, 5, 24), "sbhd", 12, False),
    ((5, 9, 3, 10), "bshd", 6, True),
    ((19, 3, 14), "thd", 8, False),
    ((300, 2, 20, 8), "sbhd", 8, False),
])
def test_launch_plan_matches_the_launch(monkeypatch, shape, fmt, rotary_dim, interleaved):
    """Spy on the kernel launch: rope_2d's real grid and block sizes equal the plan."""
    launches = []

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((tuple(grid), kwargs))
            return launch

    monkeypatch.setattr(k2, "rope_2d_kernel", Spy())
    t = randn(shape, torch.float32, seed=1)
    emb = RotaryPositionEmbedding(rotary_dim, interleaved=interleaved, device=DEVICE)(40)
    kw = {}
    if fmt == "thd":
        kw["cu_seqlens"] = torch.tensor([0, 4, 11, 19], dtype=torch.int32, device=DEVICE)
    rope_2d(t, emb, fmt, interleaved=interleaved, **kw)
    assert len(launches) == 1
    grid, kwargs = launches[0]
    sm = torch.cuda.get_device_properties(DEVICE).multi_processor_count if ON_GPU else None
    plan_grid, cfg = sol.launch_plan(shape, fmt, rotary_dim, 4, interleaved, sm_count=sm)
    assert grid == plan_grid
    assert (kwargs["BLOCK_S"], kwargs["BLOCK_B"], kwargs["BLOCK_H"], kwargs["num_warps"]) == (
        cfg["block_s"], cfg["block_b"], cfg["block_h"], cfg["num_warps"])


# ---------------------------------------------------------------- exercise 2: check_config


@pytest.mark.parametrize("config,kw", [
    (dict(block_s=4, block_b=2, block_h=2), {}),                      # all partial
    (dict(block_s=1, block_b=1, block_h=8), {}),
    (dict(block_s=8, block_b=4, block_h=1, group_b=3), {"rotary_dim": 24}),
    (dict(block_s=2, block_b=2, block_h=4), {"rotary_dim": 24, "interleaved": True}),
    (dict(block_s=4, block_b=2, block_h=2),
     {"shape": (3, 7, 5, 10), "tensor_format": "bshd", "rotary_dim": 6}),
    (dict(block_s=2, block_b=2, block_h=2), {"dtype": torch.bfloat16}),
])
def test_check_config_passes_for_the_real_kernel(config, kw):
    res = sol.check_config(config, device=DEVICE, **kw)
    assert res["all_written"] and res["margins_clean"] and res["within_tol"] and res["ok"], res


def test_check_config_catches_a_missing_write():
    def lazy(t, freqs, fmt, out=None, interleaved=False, config=None):
        rope_2d(t, freqs, fmt, out=out, interleaved=interleaved, config=config)
        out[-1, -1, -1, 0] = float("nan")  # one element never written
        return out
    res = sol.check_config(dict(block_s=4, block_b=2, block_h=2), device=DEVICE,
                           launcher=lazy)
    assert not res["all_written"] and not res["ok"]


def test_check_config_catches_a_stray_write_and_a_wrong_value():
    def stray(t, freqs, fmt, out=None, interleaved=False, config=None):
        rope_2d(t, freqs, fmt, out=out, interleaved=interleaved, config=config)
        torch.as_strided(out, (1,), (1,), out.storage_offset() + out.numel()).fill_(0.0)
        return out
    res = sol.check_config(dict(block_s=4, block_b=2, block_h=2), device=DEVICE,
                           launcher=stray)
    assert res["all_written"] and not res["margins_clean"] and not res["ok"]

    def wrong(t, freqs, fmt, out=None, interleaved=False, config=None):
        out.copy_(t)  # no rotation at all
        return out
    res = sol.check_config(dict(block_s=4, block_b=2, block_h=2), device=DEVICE,
                           launcher=wrong)
    assert res["all_written"] and res["margins_clean"] and not res["within_tol"]
    assert not res["ok"] and res["max_abs_err"] > 0.1


# ---------------------------------------------------------------- exercise 3: ideal_time


def test_ideal_time_te_default():
    res = sol.ideal_time((4096, 16, 32, 128), "bf16", copy_gbps=4000.0)
    want = 2 * 4096 * 16 * 32 * 128 * 2 + 4096 * 128 * 4
    assert res["bytes"] == want == 1_075_838_976
    assert math.isclose(res["us"], want / 4000e9 * 1e6, rel_tol=1e-12)
    fp32 = sol.ideal_time((4096, 16, 32, 128), torch.float32, copy_gbps=4000.0)
    assert fp32["bytes"] == 2 * want - 4096 * 128 * 4
    half = sol.ideal_time((16, 4096, 32, 128), "bf16", rotary_dim=64, tensor_format="bshd")
    assert half["bytes"] == 2 * 4096 * 16 * 32 * 128 * 2 + 4096 * 64 * 4


def test_ideal_time_matches_the_recorded_benchmark():
    """The bench's GB/s is bytes / time: rebuild the bytes from each recorded row."""
    pd = pytest.importorskip("pandas")
    df = pd.read_csv(ROOT / "figures" / "bench.csv")
    df = df[df.tensor_format.isin(["sbhd", "bshd"])]
    assert len(df) > 0
    for row in df.itertuples():
        shape = ((row.seq_len, row.batch, row.heads, row.head_dim) if row.tensor_format == "sbhd"
                 else (row.batch, row.seq_len, row.heads, row.head_dim))
        res = sol.ideal_time(shape, row.dtype, row.rotary_dim, row.copy_gbps,
                             tensor_format=row.tensor_format)
        assert math.isclose(res["bytes"], row.gbps * row.ms * 1e6, rel_tol=1e-4), row
        # Nothing beats the copy by more than the timing's noise: the copy is one do_bench
        # median of its own (2 GB), and the largest problems (2 GB, sbhd with 64 heads) reach
        # it (1.0001 of it in the run of 2026-11-26); run to run, medians move by up to ~1%.
        assert res["us"] <= row.ms * 1e3 * 1.01, row


# ---------------------------------------------------------------- exercise 4: whole_row_rotate


@pytest.mark.parametrize("rotary_dim", [16, 10, 4])
def test_whole_row_rotate_matches_the_reference_and_its_transpose(rotary_dim):
    """Forward against rope_reference (float64, partial rotary, a table whose halves differ),
    backward against autograd through the forward, and the kernel's whole-row path against both."""
    from rope_kernels import rope_reference

    t = randn((6, 2, 3, 16), torch.float64, 0)
    grad = randn((6, 2, 3, 16), torch.float64, 1)
    freqs = 3 * randn((6, 1, 1, rotary_dim), torch.float64, 2)
    y = sol.whole_row_rotate(t, freqs)
    torch.testing.assert_close(y, rope_reference(t, freqs, "sbhd"), rtol=1e-12, atol=1e-12)
    t_req = t.clone().requires_grad_(True)
    sol.whole_row_rotate(t_req, freqs).backward(grad)
    dx = sol.whole_row_rotate(grad, freqs, backward=True)
    torch.testing.assert_close(dx, t_req.grad, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(dx, sol.whole_row_rotate(grad, freqs))  # the transpose differs
    k = rope_2d(t.float(), freqs.float(), "sbhd", config={"whole_rows": True})
    torch.testing.assert_close(k.double(), y, rtol=1e-5, atol=1e-5)
    kb = rope_2d(grad.float(), freqs.float(), "sbhd", backward=True, config={"whole_rows": True})
    torch.testing.assert_close(kb.double(), dx, rtol=1e-5, atol=1e-5)


def test_whole_row_rotate_rejects_a_bad_rotary_dim():
    with pytest.raises(ValueError, match="rotary_dim"):
        sol.whole_row_rotate(torch.ones(2, 8), torch.ones(2, 5))
