"""The measurement behind figures/qk_positions_cost_h200.json checks what it times: its variant of
our in-place cache call without the positions load must write the package's bits where the
positions are 0, 1, 2, ..., must really ignore ``positions`` (other positions, other bits), and
must leave rope_qk's planning as it was. Runs on CPU (interpreter) and GPU."""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from conftest import DEVICE, ON_GPU, ROOT, load_file, randn

qk = importlib.import_module("rope_kernels.rope_qk")


@pytest.fixture(scope="module")
def script():
    return load_file(ROOT / "scripts" / "qk_positions_cost.py", "qk_positions_cost")


def problem(seed, seq_len=6, heads=4, k_heads=2, head_dim=16):
    angles = randn((seq_len, head_dim // 2), seed=seed) * 3
    return types.SimpleNamespace(
        seq_len=seq_len, head_dim=head_dim,
        q=randn((seq_len, heads * head_dim), torch.bfloat16, seed=seed + 1),
        k=randn((seq_len, k_heads * head_dim), torch.bfloat16, seed=seed + 2),
        gq=randn((seq_len, heads * head_dim), torch.bfloat16, seed=seed + 3),
        gk=randn((seq_len, k_heads * head_dim), torch.bfloat16, seed=seed + 4),
        positions=torch.arange(seq_len, device=DEVICE),
        cache=torch.cat((angles.cos(), angles.sin()), -1),
        tokens=lambda x: x)


@pytest.mark.parametrize("backward", [False, True])
def test_no_positions_variant_writes_the_package_bits(script, backward, seed, monkeypatch):
    if not ON_GPU:  # the script synchronizes CUDA before comparing
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    plan = qk._plan
    script.same_bits(problem(seed), backward)
    assert qk._plan is plan


def test_no_positions_variant_ignores_positions(script, seed):
    p = problem(seed)
    p.positions = torch.tensor([3, 0, 5, 1, 4, 2], device=DEVICE)
    outs = []
    for positions in (True, False):
        q, k = p.q.clone(), p.k.clone()
        script.ours(p, False, q, k, positions)()
        outs.append(q)
    assert not torch.equal(outs[0], outs[1])
    # ... and rotates each token by its own index's row, as the package does at positions 0..n-1
    q = p.q.clone()
    p.positions = torch.arange(p.seq_len, device=DEVICE)
    script.ours(p, False, q, p.k.clone())()
    assert torch.equal(q, outs[1])
