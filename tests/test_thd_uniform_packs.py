"""The measurement behind figures/thd_uniform_packs.json checks what it times: its two variants of
our call (the main kernel alone, and a pre-pass that writes ``token % length`` with no search)
must give the package's output, and a wrong length must be caught. Runs on CPU (interpreter) and
GPU; the timing itself is replaced by one call."""

from __future__ import annotations

import types

import pytest
import torch

from conftest import DEVICE, ROOT, load_file, randn
from rope_kernels import RotaryPositionEmbedding


@pytest.fixture(scope="module")
def script():
    return load_file(ROOT / "scripts" / "thd_uniform_packs.py", "thd_uniform_packs")


def uniform_pack(n_seqs, length, heads, head_dim, dtype, seed):
    n_tokens = n_seqs * length
    return types.SimpleNamespace(
        t=randn((n_tokens, heads, head_dim), dtype, seed=seed),
        grad=randn((n_tokens, heads, head_dim), dtype, seed=seed + 1),
        freqs=RotaryPositionEmbedding(head_dim, device=DEVICE)(length),
        cu_seqlens=torch.arange(0, n_tokens + 1, length, dtype=torch.int32, device=DEVICE),
        n_seqs=n_seqs)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_budget_variants_match_the_package(script, monkeypatch, direction, seed):
    timed = []
    monkeypatch.setattr(script, "time_ms", lambda fn: (timed.append(fn()), 0.001)[1])
    # 300 sequences (above TOKEN_ROWS_ABOVE): the package's own call uses the pre-pass too.
    p = uniform_pack(300, 4, 2, 16, torch.bfloat16, seed)
    fns, copy_bytes, pre_us = script.budget_fns(p, 4, direction)
    assert set(fns) == {"ours_main_only", "ours_no_search", "copy_same_size"}
    assert copy_bytes == 2 * p.t.numel() * p.t.element_size()
    assert len(timed) == 3 and pre_us == pytest.approx(1.0)
    x = p.t if direction == "forward" else p.grad
    out = fns["copy_same_size"]()
    assert torch.equal(out, x)


def test_budget_catches_wrong_rows(script, monkeypatch, seed):
    monkeypatch.setattr(script, "time_ms", lambda fn: 0.001)
    p = uniform_pack(300, 4, 2, 16, torch.float32, seed)
    with pytest.raises(AssertionError, match="ours_no_search differs"):
        script.budget_fns(p, 3, "forward")  # rows token % 3 (in the table) are the wrong rows
