"""The thd A/B scripts' candidates are made from rope_2d.py by text and must compute what the
package computes, bit for bit, or their timings compare different work:
``scripts/thd_first_wave.py`` (the first programs search cu_seqlens instead of waiting for the
pre-pass), ``scripts/thd_angle_rows.py`` (cos/sin on more of the tile's rows) and
``scripts/thd_pre_pass_scatter.py`` (the pre-pass of before, a guess and a search by token
blocks, and other forms of the package's by sequence blocks). Each script
stops if rope_2d.py no longer has the text it replaces; loading it here is that check. Runs on
CPU (interpreter, which has no programmatic dependent launch) and GPU (with it, where the GPU
has it)."""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import tempfile

import pytest
import torch

from conftest import DEVICE, ROOT, load_file, randn


@pytest.fixture(scope="module")
def folder():
    return pathlib.Path(tempfile.mkdtemp())


@pytest.fixture(scope="module")
def first_wave(folder):
    script = load_file(ROOT / "scripts" / "thd_first_wave.py", "thd_first_wave")
    # 1 program per SM: on a GPU some programs search and the rest wait (see pack below);
    # 1000: all of them search.
    return script, {k: script.first_wave_module(k, folder) for k in (1, 1000)}


@pytest.fixture(scope="module")
def angle_rows(folder):
    script = load_file(ROOT / "scripts" / "thd_angle_rows.py", "thd_angle_rows")
    return script, {"4 rows": script.angle_rows_module("angle_rows_4", 4, folder),
                    "every row": script.angle_rows_module("angle_rows_all", 2**20, folder)}


@pytest.fixture(scope="module")
def pre_pass_scatter(folder):
    script = load_file(ROOT / "scripts" / "thd_pre_pass_scatter.py", "thd_pre_pass_scatter")
    sides = script.load_sides(folder)
    return script, {name: sides[name] for name in script.CANDIDATES}


def pack(cp_size, seed):
    """Sequences of mixed lengths, one of them empty, each a multiple of 2 * cp_size tokens;
    more of them on a GPU, whose first wave is at least one program per SM."""
    lens = [6, 72, 2, 0, 122, 34, 8]
    if DEVICE.type == "cuda":
        lens = lens * 40
    lens = [2 * cp_size * ((n + 2 * cp_size - 1) // (2 * cp_size)) for n in lens]
    cu_seqlens = torch.tensor([0, *itertools.accumulate(lens)], dtype=torch.int32, device=DEVICE)
    x = randn((int(cu_seqlens[-1]) // cp_size, 4, 64), torch.float32, seed=seed)
    freqs = randn((4096, 1, 1, 48), torch.float32, seed=seed + 1)
    start = torch.randint(0, 50, (len(lens),), generator=torch.Generator().manual_seed(seed),
                          dtype=torch.int32).to(DEVICE)
    return x, freqs, cu_seqlens, start


def rotated(module, x, freqs, cu_seqlens, config, **kwargs):
    """``module``'s rope_2d of ``x`` into a NaN-filled output."""
    out = torch.full_like(x, float("nan"))
    module.rope_2d(x, freqs, "thd", cu_seqlens=cu_seqlens, out=out, config=config, **kwargs)
    return out


# Whole rows and pairs, forward and backward; the last two cases with start positions and context
# parallelism (rank 1 of 2), which the first programs' own search must apply as the pre-pass does.
CASES = [(False, False, False), (True, True, False), (True, False, True), (False, True, True)]


@pytest.mark.parametrize("whole_rows, backward, cp_and_start", CASES)
def test_first_wave_candidate_gives_the_package_bits(first_wave, whole_rows, backward,
                                                     cp_and_start, seed):
    script, modules = first_wave
    cp_size = 2 if cp_and_start else 1
    x, freqs, cu_seqlens, start = pack(cp_size, seed)
    config = dict(token_rows=True, whole_rows=whole_rows, block_s=2, block_h=4, num_warps=2)
    kwargs = dict(backward=backward)
    if cp_and_start:
        kwargs.update(cp_size=2, cp_rank=1, start_positions=start)
    ref = rotated(script.r2, x, freqs, cu_seqlens, config, **kwargs)
    for per_sm, module in modules.items():
        assert torch.equal(rotated(module, x, freqs, cu_seqlens, config, **kwargs), ref), per_sm


@pytest.mark.parametrize("backward", [False, True])
def test_angle_rows_candidates_give_the_package_bits(angle_rows, backward, seed):
    script, modules = angle_rows
    x, freqs, cu_seqlens, _ = pack(1, seed)
    config = dict(token_rows=True, whole_rows=True, block_s=2, block_h=4, num_warps=2)
    ref = rotated(script.r2, x, freqs, cu_seqlens, config, backward=backward)
    for name, module in modules.items():
        plan = module._make_plan(x, freqs, torch.empty_like(x), "thd", cu_seqlens, None, False,
                                 1, 0, backward, config)
        assert plan.constexprs["ANGLE_ROWS"] == (4 if name == "4 rows" else 8)  # 2 x 4 rows
        assert torch.equal(rotated(module, x, freqs, cu_seqlens, config, backward=backward),
                           ref), name


SCATTER_PACKS = ["random 0-10", "one long", "empty ends", "equal 4"]


@pytest.mark.parametrize("lengths", SCATTER_PACKS)
@pytest.mark.parametrize("cp_and_start", [False, True])
def test_pre_pass_scatter_candidate_gives_the_package_rows(pre_pass_scatter, lengths,
                                                           cp_and_start, seed):
    """Token rows of the pre-pass alone (every token written: the buffer starts at -1), then
    whole calls, against the package's. Packs: 701 sequences of 0-10 tokens at random (many
    empty); one sequence of 3000 tokens among 300 of 0-4 (its program walks many steps); 501
    sequences whose first and last 100 are empty; 299 of 4 tokens. The odd counts leave the last
    program a partial block wherever it takes more than one sequence."""
    script, candidates = pre_pass_scatter
    cp_size = 2 if cp_and_start else 1
    g = torch.Generator().manual_seed(seed)
    if lengths == "random 0-10":
        lens = torch.randint(0, 6, (701,), generator=g)
    elif lengths == "one long":
        lens = torch.randint(0, 3, (301,), generator=g)
        lens[137] = 1500
    elif lengths == "empty ends":
        lens = torch.randint(0, 6, (501,), generator=g)
        lens[:100] = 0
        lens[-100:] = 0
    else:
        lens = torch.full((299,), 2)
    lens = 2 * cp_size * lens
    n_seqs = lens.numel()
    cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(
        torch.int32).to(DEVICE)
    n_tokens = int(cu_seqlens[-1]) // cp_size
    start = torch.randint(0, 50, (n_seqs,), generator=g, dtype=torch.int32).to(DEVICE)
    rows = {}
    for name, m in (("package", script.r2), *candidates.items()):
        rows[name] = torch.full((n_tokens,), -1, dtype=torch.int32, device=DEVICE)
        plan = m.pre_pass_plan(n_tokens, n_seqs, cp_size, cp_size - 1, cp_and_start)
        if name != "package" and plan.constexprs.get("SEQS", 1) > 1:
            assert n_seqs % plan.constexprs["SEQS"], "the last block should be partial"
        m.launch(m.thd_positions_kernel, plan,
                 (cu_seqlens, start if cp_and_start else cu_seqlens, rows[name]))
    assert (rows["package"] >= 0).all()
    x = randn((n_tokens, 2, 32), torch.float32, seed=seed)
    freqs = randn((8192, 1, 1, 32), torch.float32, seed=seed + 1)
    config = dict(token_rows=True, whole_rows=True, block_s=32, block_h=2, num_warps=2)
    kwargs = dict(cp_size=2, cp_rank=1, start_positions=start) if cp_and_start else {}
    ref = rotated(script.r2, x, freqs, cu_seqlens, config, **kwargs)
    for name, candidate in candidates.items():
        assert torch.equal(rows[name], rows["package"]), name
        assert torch.equal(rotated(candidate, x, freqs, cu_seqlens, config, **kwargs), ref), name


def test_timed_rounds_writes_medians_and_a_scripts_own_timing_line(monkeypatch, tmp_path):
    """``thd_sides.timed_rounds`` (every thd A/B script's timing loop), with the clocks stubbed:
    fractions of copy for calls, microseconds for the entries the script picks, medians over the
    rounds, and a script's own ``timing`` line in the provenance in place of the default (a
    duplicate keyword stopped thd_pre_pass_guess.py and thd_pre_pass_rounds.py after their first
    round once)."""
    sides = load_file(ROOT / "scripts" / "thd_sides.py", "thd_sides_under_test")
    times = iter([1.0, 2.0, 0.004, 2.0, 4.0, 0.002, 4.0, 1.0, 0.003])  # ms, call order below
    monkeypatch.setattr(sides, "time_ms_host_ahead", lambda f: next(times))
    monkeypatch.setattr(sides, "time_ms", lambda f: next(times))
    monkeypatch.setattr(sides, "provenance", lambda copy, mode: dict(copy_gbps=copy, mode=mode))
    monkeypatch.setattr(sides.random, "shuffle", lambda keys: None)
    args = argparse.Namespace(out=str(tmp_path / "t.json"), rounds=3)
    calls = {("pack", "fwd a"): None, ("pack", "pre a"): None}
    table = sides.timed_rounds(calls, {"pack": (1e6, 2e6)}, 1.0, args, "s.py",
                               dict(timing="mine"), microseconds=lambda w: w.startswith("pre"))
    # 1e6 bytes in t ms at 1 GB/s: 1 / t; fwd rounds (1, 2), (2, 4), (4, 1) ms; pre 4, 2, 3 us.
    assert table == {"pack": {"fwd a": [0.5, 0.5], "pre a": [3.0]}}
    written = json.loads((tmp_path / "t.json").read_text())
    assert written["table"] == table
    assert written["provenance"]["timing"] == "mine"
    assert written["provenance"]["rounds_done"] == 3
