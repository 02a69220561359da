"""Property tests: random shapes (non-powers of two), random strides and offsets, every option.

Each example draws a layout, sizes, a rotary_dim, a view with arbitrary strides (permuted,
sliced, offset into a larger buffer), and checks forward and backward of both kernels against
the float64 reference and its autograd. Block sizes are drawn too, so partial tiles and masks
are exercised at every boundary.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEVICE, ON_GPU, assert_rope_close, randn, strided_with_poison
from rope_kernels import (RotaryPositionEmbedding, apply_rotary_pos_emb, rope_1d, rope_2d,
                          rope_reference)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SETTINGS = settings(max_examples=60 if ON_GPU else 30, deadline=None, derandomize=False,
                    suppress_health_check=[HealthCheck.too_slow])


def _strided_view(draw, shape, dtype, seed):
    """A tensor of `shape` whose memory is a permuted, sliced, offset view of a bigger buffer."""
    ndim = len(shape)
    order = draw(st.permutations(range(ndim)))  # memory order of the dims
    steps = [draw(st.sampled_from([1, 1, 2])) for _ in range(ndim)]
    offset = draw(st.integers(0, 3))
    big_shape = [shape[d] * steps[d] for d in order]
    flat = randn((offset + int(torch.tensor(big_shape).prod()),), dtype, seed)
    base = flat[offset:].view(big_shape)
    base = base[tuple(slice(None, None, steps[d]) for d in order)]
    inverse = [order.index(d) for d in range(ndim)]
    view = base.permute(*inverse)
    assert tuple(view.shape) == tuple(shape)
    return view


def _strided_vector(draw, x):
    """1-D ``x`` as a view with a drawn stride and offset into a bigger buffer, as
    ``position_ids[:, 0]`` is; the elements between hold -7, which a kernel that ignores the
    stride would read as a position or a sequence boundary."""
    step = draw(st.sampled_from([1, 1, 2, 3]))
    offset = draw(st.integers(0, 2))
    buf = torch.full((offset + x.numel() * step,), -7, dtype=x.dtype, device=x.device)
    view = buf[offset::step]
    view.copy_(x)
    return view


@st.composite
def rope_case(draw):
    fmt = draw(st.sampled_from(["sbhd", "bshd", "thd"]))
    dtype = draw(st.sampled_from(DTYPES))
    heads = draw(st.integers(1, 5))
    head_dim = 2 * draw(st.integers(1, 20))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    interleaved = draw(st.booleans())
    cp_size = draw(st.sampled_from([1, 1, 2, 3]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kw = dict(tensor_format=fmt, interleaved=interleaved, cp_size=cp_size,
              cp_rank=draw(st.integers(0, cp_size - 1)))
    if fmt == "thd":
        n_seqs = draw(st.integers(1, 5))
        lengths = [draw(st.integers(0, 9)) * 2 * cp_size for _ in range(n_seqs)]
        cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32)
        kw["cu_seqlens"] = _strided_vector(draw, cu.to(DEVICE))
        shape = (int(cu[-1]) // cp_size, heads, head_dim)
        longest, n_starts = max(lengths), n_seqs
    else:
        seq = draw(st.integers(1, 12)) * (2 if cp_size > 1 else 1)
        batch = draw(st.integers(1, 4))
        shape = (seq, batch, heads, head_dim) if fmt == "sbhd" else (batch, seq, heads, head_dim)
        longest, n_starts = seq * cp_size, batch
    margin = 0
    if cp_size == 1 and draw(st.booleans()):
        margin = draw(st.integers(0, 7))
        starts = torch.randint(0, margin + 1, (n_starts,), generator=g, dtype=torch.int32)
        kw["start_positions"] = _strided_vector(draw, starts.to(DEVICE))
    extra_rows = draw(st.integers(0, 5))
    # RotaryPositionEmbedding(head_dim, rotary_percent) builds the table of dim = rotary_dim.
    emb = RotaryPositionEmbedding(rotary_dim, interleaved=interleaved,
                                  rotary_base=draw(st.sampled_from([10000.0, 500000.0])),
                                  device=DEVICE)(max(longest + margin, 1) + extra_rows)
    t = _strided_view(draw, shape, dtype, seed)
    grad = _strided_view(draw, shape, dtype, seed + 1)
    return t, grad, emb, dtype, kw


@st.composite
def launch_config(draw):
    return dict(block_s=draw(st.sampled_from([1, 2, 4, 8])), block_b=draw(st.sampled_from([1, 2, 4])),
                block_h=draw(st.sampled_from([1, 2, 4])), group_b=draw(st.integers(1, 3)),
                num_warps=4,
                whole_rows=draw(st.booleans()), gather_sines=draw(st.booleans()))


@pytest.mark.parametrize("kernel", ["1d", "2d"])
@SETTINGS
@given(case=rope_case(), config=launch_config(), block_rows=st.sampled_from([1, 4, 16, 64]))
def test_forward_and_backward_match_float64_reference(kernel, case, config, block_rows):
    t, grad, emb, dtype, kw = case
    t_before = t.clone()
    if kernel == "1d":
        run = lambda x, backward: rope_1d(x, emb, backward=backward, block_rows=block_rows, **kw)  # noqa: E731
    else:
        run = lambda x, backward: rope_2d(x, emb, backward=backward, config=config, **kw)  # noqa: E731
    out = run(t, False)
    t64 = t.detach().double().requires_grad_(True)
    ref = rope_reference(t64, emb, **kw)
    assert_rope_close(out, ref, dtype, "forward")
    assert out.is_contiguous() and out.shape == t.shape and out.dtype == dtype
    assert torch.equal(t, t_before), "the input was modified"
    # Backward: the kernel with sin negated must equal autograd's vector-Jacobian product.
    ref.backward(grad.double())
    assert_rope_close(run(grad, True), t64.grad, dtype, "backward")


@pytest.mark.parametrize("kernel", ["1d", "2d"])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
def test_strided_start_positions_and_cu_seqlens(kernel, fmt, seed):
    """start_positions and cu_seqlens taken as strided views (``position_ids[:, 0]``, every other
    entry of a buffer whose other entries are poison): through the public function, forward and
    backward against the float64 reference."""
    freqs = RotaryPositionEmbedding(16, device=DEVICE)(40)
    kw = {"start_positions": strided_with_poison([5, 0, 17])}  # 3 batch elements or sequences
    shape = {"sbhd": (6, 3, 2, 16), "bshd": (3, 6, 2, 16), "thd": (11, 2, 16)}[fmt]
    if fmt == "thd":
        kw["cu_seqlens"] = strided_with_poison([0, 4, 4, 11])
    t = randn(shape, torch.float32, seed).requires_grad_(True)
    assert kw["start_positions"].stride() == (2,)
    out = apply_rotary_pos_emb(t, freqs, fmt, fused=True, kernel=kernel, **kw)
    t64 = t.detach().double().requires_grad_(True)
    ref = rope_reference(t64, freqs, fmt, **kw)
    assert_rope_close(out, ref, torch.float32, "forward")
    grad = randn(shape, torch.float32, seed + 1)
    ref.backward(grad.double())
    (dt,) = torch.autograd.grad(out, t, grad)
    assert_rope_close(dt, t64.grad, torch.float32, "backward")


@pytest.mark.parametrize("launcher", [rope_1d, rope_2d], ids=["1d", "2d"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [4, 6])
def test_backward_is_exact_transpose_of_forward(launcher, interleaved, rotary_dim):
    """The kernel is linear in t: build its Jacobian J column by column from the forward, and
    J^T row by row from the backward, and compare both with the float64 reference Jacobian.
    (torch.autograd.gradcheck needs float64 kernels; the kernels compute in float32, so the
    linear-map check replaces it with the same content.) Uses a non-symmetric angle table, so
    it would catch a backward that merely negates sin without exchanging the pair's sines."""
    s, b, h, d = 3, 2, 1, 6
    g = torch.Generator().manual_seed(7)
    emb = (torch.rand(s, 1, 1, rotary_dim, generator=g) * 20).to(DEVICE)
    n = s * b * h * d
    eye = torch.eye(n, device=DEVICE).view(n, s, b, h, d)
    kw = dict(interleaved=interleaved)
    jac = torch.stack([launcher(e, emb, **kw).reshape(-1) for e in eye], 1)  # column k = J e_k
    jac_t = torch.stack([launcher(e, emb, backward=True, **kw).reshape(-1) for e in eye], 1)
    ref = torch.stack([rope_reference(e.double(), emb, **kw).reshape(-1) for e in eye], 1)
    torch.testing.assert_close(jac.double(), ref, rtol=0, atol=2e-6)
    torch.testing.assert_close(jac_t.double(), ref.T, rtol=0, atol=2e-6)


def test_reference_gradcheck_float64():
    """The reference itself is differentiable in float64 (it is the ground truth for gradients)."""
    t = randn((4, 2, 2, 6), torch.float64, seed=3).requires_grad_(True)
    emb = RotaryPositionEmbedding(6, 2 / 3, device=DEVICE)(6)
    starts = torch.tensor([0, 2], dtype=torch.int32, device=DEVICE)
    assert torch.autograd.gradcheck(
        lambda x: rope_reference(x, emb, "sbhd", start_positions=starts, interleaved=True), (t,))


def _double_backward_cases():
    from test_compile import _cases  # every entry point, as functions of tensors only

    cases = _cases()
    emb = RotaryPositionEmbedding(32, device=DEVICE)(64)
    cases["te bshd, 1d kernel"] = (
        lambda t: apply_rotary_pos_emb(t, emb, "bshd", fused=True, kernel="1d"),
        [randn((2, 8, 3, 32), torch.float32, 4)])
    return cases


@pytest.mark.parametrize("name", list(_double_backward_cases()))
def test_gradient_of_the_gradient(name):
    """create_graph=True (a gradient penalty): every gradient is differentiable in turn. With the
    flattened outputs f(x) and inputs x, L = <f(x), v> + 2 <x, v> gives g = dL/dx = J^T v + 2v,
    and d<g, w>/dv = J w + 2w = f(w) + 2w: the forward again. The 2<x, v> term gives g a grad_fn
    even where RoPE's backward is not differentiable, so a missing double backward would show as
    a wrong result (2w alone), not only as an error."""
    from test_compile import _flat as flat

    fn, inputs = _double_backward_cases()[name]
    x = [i.clone().requires_grad_(True) for i in inputs]
    out = flat(fn(*x))
    v = randn(out.shape, torch.float32, 11).requires_grad_(True)
    x_flat = torch.cat([i.flatten() for i in x])
    g = torch.autograd.grad((out * v).sum() + 2 * (x_flat * v).sum(), x, create_graph=True)
    w = [randn(i.shape, torch.float32, 20 + n) for n, i in enumerate(inputs)]
    (d_v,) = torch.autograd.grad(sum((gi * wi).sum() for gi, wi in zip(g, w)), v)
    with torch.no_grad():
        expected = flat(fn(*w)) + 2 * torch.cat([wi.flatten() for wi in w])
    torch.testing.assert_close(d_v, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads", [8, 12, 32])
@pytest.mark.parametrize("backward", [False, True])
def test_rope_2d_in_place_bshd_head_dim_128(dtype, heads, backward, seed):
    """rope_2d(out=t) at the shapes of its in-place tiles (on a GPU: 8 heads of one position a
    program; 12 heads leave a partly masked block): float64 reference; a second view of the
    same memory as out (not the same object) takes the out-of-place tiles, also in place."""
    t = randn((3, 17, heads, 128), dtype, seed)
    freqs = RotaryPositionEmbedding(128, device=DEVICE)(17)
    ref = rope_reference(t.double(), freqs, "bshd")
    if backward:  # the transpose: rotation by the negated angles
        ref = rope_reference(t.double(), -freqs, "bshd")
    x = t.clone()
    out = rope_2d(x, freqs, "bshd", backward=backward, out=x)
    assert out is x
    assert_rope_close(x, ref, dtype, "in place")
    y = t.clone()
    rope_2d(y, freqs, "bshd", backward=backward, out=y.view(y.shape))
    assert_rope_close(y, ref, dtype, "in place through another view")


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("whole_rows", [False, True])
def test_rope_2d_in_place_leaves_the_channels_past_rotary_dim(fmt, interleaved, whole_rows, seed,
                                                               monkeypatch):
    """rope_2d(out=t) with 12 of 20 channels rotated: the plan is that of heads narrowed to
    rotary_dim (PASS 0; the channels past it neither read nor written), the rotated channels
    against the float64 reference, the rest bit for bit as they were; out of place the same call
    copies them (PASS 8, or 4 words for interleaved pairs read as words; whole rows, cut at the
    rotary block of 16 channels with the partners gathered since 12 is not a multiple of 16,
    copy the 4 after it)."""
    r2 = importlib.import_module("rope_kernels.rope_2d")  # (the package exports the function)
    monkeypatch.setattr(r2, "_PLANS", {})
    shape = (14, 3, 20) if fmt == "thd" else (7, 2, 3, 20)
    cu = torch.tensor([0, 5, 14], dtype=torch.int32, device=DEVICE) if fmt == "thd" else None
    t = randn(shape, torch.float32, seed)
    freqs = RotaryPositionEmbedding(12, device=DEVICE)(16)
    ref = rope_reference(t.double(), freqs, fmt, None, interleaved, cu)
    config = dict(whole_rows=whole_rows)
    y = rope_2d(t, freqs, fmt, interleaved=interleaved, cu_seqlens=cu, config=config)
    (plan,) = r2._PLANS.values()
    words = plan.constexprs["PAIRS_AS_WORDS"]
    assert plan.constexprs["PASS"] == (4 if whole_rows and not interleaved else 4 if words else 8)
    assert plan.constexprs["GATHER"] == (whole_rows and not interleaved)
    assert_rope_close(y, ref, torch.float32, "out of place")
    x = t.clone()
    r2._PLANS.clear()
    assert rope_2d(x, freqs, fmt, interleaved=interleaved, cu_seqlens=cu, config=config,
                   out=x) is x
    (plan,) = r2._PLANS.values()
    assert plan.constexprs["PASS"] == 0
    assert plan.constexprs["ROW"] == (16 if whole_rows and not interleaved else 0)
    assert_rope_close(x[..., :12], ref[..., :12], torch.float32, "in place")
    assert torch.equal(x[..., 12:], t[..., 12:])


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rotary_dim", [12, 20])
@pytest.mark.parametrize("backward", [False, True])
def test_rope_2d_every_plan_the_same_bits(fmt, dtype, rotary_dim, backward, seed, monkeypatch):
    """rope_2d with whole rows and with the pairs' tile, out of place and in place (heads
    narrowed where part of the head is rotated), 20 or 12 of 20 channels rotated: the same bits
    every way, the float64 rotation within the dtype's tolerance; interleaved pairs (the pairs'
    tile only) out of place and in place alike. The kernel writes its rotation as fused
    multiply-adds: left to contract ``x1 * cos - x2 * sin`` itself, a compiler fuses one product
    or the other depending on the code around it."""
    r2 = importlib.import_module("rope_kernels.rope_2d")
    monkeypatch.setattr(r2, "_PLANS", {})
    shape = (14, 3, 20) if fmt == "thd" else (7, 2, 3, 20)
    cu = torch.tensor([0, 5, 14], dtype=torch.int32, device=DEVICE) if fmt == "thd" else None
    t = randn(shape, dtype, seed)
    for interleaved, layouts in ((False, (False, True)), (True, (False,))):
        freqs = RotaryPositionEmbedding(rotary_dim, interleaved=interleaved,
                                        device=DEVICE)(16)
        ref = rope_reference(t.double(), -freqs if backward else freqs, fmt, None, interleaved,
                             cu)
        results = []
        for whole_rows in layouts:
            kw = dict(interleaved=interleaved, cu_seqlens=cu, backward=backward,
                      config=dict(whole_rows=whole_rows))
            results.append(rope_2d(t, freqs, fmt, **kw))
            x = t.clone()
            rope_2d(x, freqs, fmt, out=x, **kw)
            results.append(x)
        assert_rope_close(results[0], ref, dtype, f"interleaved={interleaved}")
        for i, got in enumerate(results[1:], 1):
            assert torch.equal(got, results[0]), (interleaved, i)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cp_size", [1, 2])
@pytest.mark.parametrize("rotary_dim", [12, 16])
def test_rope_2d_whole_rows(fmt, dtype, cp_size, rotary_dim, seed):
    """rope_2d with whole rows (``config={'whole_rows': True}``: each row loaded once, its
    channels' partners again, one store), head_dim 20 with 12 or 16 channels rotated (a partly
    masked row of 32, 8 or 4 channels passed through): forward and backward against the float64
    reference, the backward's partner sines computed again and (``gather_sines``, rotary_dim 16,
    a power of two) gathered in registers, with start positions where TransformerEngine allows
    them, outputs NaN-poisoned; interleaved pairs keep their own loads (ROW 0). The partners are
    loaded again (``gather`` off: 12 channels would otherwise be gathered in registers,
    tests/test_launch.py's test_rope_2d_gathered_partners)."""
    k2 = importlib.import_module("rope_kernels.rope_2d")  # (the package exports the function)
    cp_rank = cp_size - 1
    kw = {"cp_size": cp_size, "cp_rank": cp_rank}
    if fmt == "thd":
        kw["cu_seqlens"] = torch.tensor([0, 4, 4, 16] if cp_size == 1 else [0, 8, 8, 16],
                                        dtype=torch.int32, device=DEVICE)
        shape = (16 // cp_size, 2, 20)
    else:
        shape = {"sbhd": (6, 3, 2, 20), "bshd": (3, 6, 2, 20)}[fmt]
    if cp_size == 1:
        kw["start_positions"] = torch.tensor([5, 0, 17], dtype=torch.int32, device=DEVICE)
    freqs = RotaryPositionEmbedding(rotary_dim, device=DEVICE)(40)
    t = randn(shape, dtype, seed)
    grad = randn(shape, dtype, seed + 1)
    t64 = t.double().requires_grad_(True)
    ref = rope_reference(t64, freqs, fmt, **kw)
    ref.backward(grad.double())
    pass_words = k2._next_pow2((20 - rotary_dim) // 2)  # channels past rotary_dim, in words
    for interleaved, row, gather in ((False, 32, False), (False, 32, True), (True, 0, False)):
        if interleaved:
            freqs_i = RotaryPositionEmbedding(rotary_dim, interleaved=True, device=DEVICE)(40)
            ref_i = rope_reference(t.double(), freqs_i, fmt, interleaved=True, **kw)
        for backward in (False, True):
            out = torch.full_like(t, float("nan"))
            k2._PLANS.clear()
            rope_2d(grad if backward else t, freqs_i if interleaved else freqs, fmt,
                    interleaved=interleaved, backward=backward, out=out,
                    config={"whole_rows": True, "gather_sines": gather, "gather": False},
                    **kw)
            (plan,) = k2._PLANS.values()
            # Whole rows copy the channels past rotary_dim within the row; pairs read as words
            # copy them as words (elements where the layout does not allow words).
            assert plan.constexprs["ROW"] == row
            assert plan.constexprs["PASS"] in ((0,) if row else (pass_words, 2 * pass_words))
            # Gathered sines: the backward of a power-of-two rotary_dim only.
            assert plan.constexprs["GATHER_SINES"] == (
                rotary_dim if gather and backward and rotary_dim == 16 else 0)
            if interleaved:
                if not backward:
                    assert_rope_close(out, ref_i, dtype, "interleaved forward")
            else:
                assert_rope_close(out, t64.grad if backward else ref, dtype,
                                  f"{'backward' if backward else 'forward'} gather={gather}")
