"""TransformerEngine's test matrix (tests/pytorch/test_fused_rope.py), against a float64 reference.

TE compares its fused kernel with its own unfused code in float32; here every kernel output and
gradient is compared with ``rope_reference`` run in float64, with tolerances set by the dtype
(conftest.TOLERANCES). On a GPU the sizes are TE's (seq 2048/4096, hidden 128/256, batch 2,
64 heads); in the CPU interpreter they are scaled down to what it can afford, keeping every
other axis of the matrix.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, randn
from rope_kernels import RotaryPositionEmbedding, apply_rotary_pos_emb, rope_reference

if ON_GPU:
    SEQ_LENGTHS, HIDDEN_SIZES, BATCH, HEADS = [2048, 4096], [128, 256], 2, 64
    CU_SEQLENS = [0, 400, 542, 711, 727, 752, 1270, 1426, 1450, 1954, 2044, 2048]
else:
    # Non-powers of two on purpose: rotary_dim 12 -> 6 pairs exercises the channel masks.
    SEQ_LENGTHS, HIDDEN_SIZES, BATCH, HEADS = [24], [16, 24], 2, 3
    CU_SEQLENS = [0, 5, 6, 13, 13, 21, 40]


def _overlapping_grad(output: torch.Tensor) -> torch.Tensor:
    """Incoming gradient is a broadcast scalar: stride 0 everywhere."""
    return output.sum() * 2


def _non_overlapping_grad(output: torch.Tensor) -> torch.Tensor:
    """Incoming gradient is a full tensor."""
    return torch.sum(output * torch.ones_like(output))


def _check(t, emb, kernel, dtype, loss_func, **kwargs):
    """Forward and gradient of the fused kernel vs autograd through the float64 reference."""
    t_ref = t.detach().double().requires_grad_(True)
    out = apply_rotary_pos_emb(t, emb, fused=True, kernel=kernel, **kwargs)
    ref = rope_reference(t_ref, emb, **kwargs)
    assert out.dtype == dtype and out.is_contiguous()
    assert_rope_close(out, ref, dtype, "forward")
    loss_func(out).backward()
    loss_func(ref).backward()
    assert_rope_close(t.grad, t_ref.grad, dtype, "gradient")
    t.grad = None


@pytest.mark.parametrize("kernel", ["1d", "2d"])
@pytest.mark.parametrize("start_positions", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seq_length", SEQ_LENGTHS)
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("rotary_percent", [0.5, 1.0])
@pytest.mark.parametrize("margin", [0, 10])
@pytest.mark.parametrize("transpose", [None, (0, 1), (2, 3)])
@pytest.mark.parametrize("tensor_format", ["sbhd", "bshd"])
@pytest.mark.parametrize("loss_func", [_overlapping_grad, _non_overlapping_grad])
@pytest.mark.parametrize("cp_size", [1, 2])
@pytest.mark.parametrize("interleaved", [True, False])
def test_fused_rope(kernel, dtype, seq_length, hidden_size, rotary_percent, margin, transpose,
                    tensor_format, loss_func, cp_size, interleaved, start_positions, seed):
    if margin == 0 and start_positions:
        pytest.skip("TE: start_positions needs a table longer than the sequence (margin > 0)")
    if ON_GPU and kernel == "1d" and seq_length > 2048:
        pytest.skip("the 1-D kernel runs TE's sizes at seq 2048 only, to bound GPU time")
    g = torch.Generator().manual_seed(seed)
    t = randn((seq_length - margin, BATCH, HEADS, hidden_size), dtype, seed)
    starts = (torch.randint(0, margin, (BATCH,), generator=g, dtype=torch.int32).to(DEVICE)
              if start_positions else None)
    if tensor_format == "bshd":
        t = t.transpose(0, 1).contiguous()
    if transpose:
        t = t.transpose(*transpose).contiguous().transpose(*transpose)  # same shape, new strides
    t.requires_grad = True
    emb = RotaryPositionEmbedding(hidden_size, rotary_percent, interleaved=interleaved,
                                  device=DEVICE)(seq_length * cp_size)
    for cp_rank in range(cp_size):
        _check(t, emb, kernel, dtype, loss_func, tensor_format=tensor_format,
               start_positions=starts, interleaved=interleaved, cp_size=cp_size, cp_rank=cp_rank)


@pytest.mark.parametrize("kernel", ["1d", "2d"])
@pytest.mark.parametrize("start_positions", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("rotary_percent", [0.5, 1.0])
@pytest.mark.parametrize("transpose", [None, (1, 2)])
@pytest.mark.parametrize("loss_func", [_overlapping_grad, _non_overlapping_grad])
@pytest.mark.parametrize("cp_size", [1, 2])
@pytest.mark.parametrize("interleaved", [True, False])
def test_fused_rope_thd(kernel, dtype, hidden_size, rotary_percent, transpose, loss_func, cp_size,
                        interleaved, start_positions, seed):
    margin = 10
    g = torch.Generator().manual_seed(seed)
    n_seqs = len(CU_SEQLENS) - 1
    starts = (torch.randint(0, margin, (n_seqs,), generator=g, dtype=torch.int32).to(DEVICE)
              if start_positions else None)
    # With context parallelism every sequence is padded to a multiple of 2 * cp_size, as in TE.
    padded = [0]
    for begin, end in zip(CU_SEQLENS[:-1], CU_SEQLENS[1:]):
        padded.append(padded[-1] + math.ceil((end - begin) / (2 * cp_size)) * (2 * cp_size))
    cu_seqlens = torch.tensor(padded if cp_size > 1 else CU_SEQLENS, dtype=torch.int32,
                              device=DEVICE)
    t = randn((int(cu_seqlens[-1]) // cp_size, HEADS, hidden_size), dtype, seed)
    if transpose:
        t = t.transpose(*transpose).contiguous().transpose(*transpose)
    t.requires_grad = True
    # TE sizes the table by the whole packed length; + margin covers the start positions.
    emb = RotaryPositionEmbedding(hidden_size, rotary_percent, interleaved=interleaved,
                                  device=DEVICE)(int(cu_seqlens[-1]) + margin)
    for cp_rank in range(cp_size):
        _check(t, emb, kernel, dtype, loss_func, tensor_format="thd", start_positions=starts,
               interleaved=interleaved, cu_seqlens=cu_seqlens, cp_size=cp_size, cp_rank=cp_rank)
