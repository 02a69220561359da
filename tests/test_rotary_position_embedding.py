"""RotaryPositionEmbedding is TransformerEngine's module: its arguments in its order, its position
interpolation (only with both of its arguments set, as TE applies it), ``inv_freq`` in the state
dict, and tables in ``inv_freq``'s dtype, so that a model cast to bf16 gets TE's bf16 table (which
the fused call then converts, tests/test_freqs_dtypes.py). Where TE's module code is at hand (the
study group's ``shared/te/ref.py``, copied from TE's rope.py), the tables are compared with it bit
for bit."""

from __future__ import annotations

import functools
import inspect
import os
import pathlib

import pytest
import torch

from conftest import DEVICE, ROOT, load_file, randn
from rope_kernels import RotaryPositionEmbedding, apply_rotary_pos_emb

TE_ARGS = ["dim", "rotary_percent", "seq_len_interpolation_factor",
           "pretrained_max_position_embeddings", "rotary_base", "interleaved"]


def test_arguments_are_tes_in_its_order():
    params = inspect.signature(RotaryPositionEmbedding).parameters
    positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == TE_ARGS
    assert params["device"].kind is inspect.Parameter.KEYWORD_ONLY
    defaults = {n: params[n].default for n in TE_ARGS[1:]}
    assert defaults == {"rotary_percent": 1.0, "seq_len_interpolation_factor": None,
                        "pretrained_max_position_embeddings": None, "rotary_base": 10000.0,
                        "interleaved": False}


def _plain(dim, n, offset=0, scale=None, base=10000.0):
    """TE's table written out: positions (times ``scale``) outer inv_freq, two halves."""
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=DEVICE) / dim)
    positions = torch.arange(n, dtype=torch.float32, device=DEVICE) + offset
    if scale is not None:
        positions *= scale
    f = torch.outer(positions, inv)
    return torch.cat((f, f), dim=-1).reshape(n, 1, 1, dim)


@pytest.mark.parametrize("n", [24, 64, 100])
def test_interpolation_as_te_applies_it(n):
    """Both arguments set: fixed scaling up to pretrained * factor positions, dynamic past it.
    The factor alone changes nothing (TE's condition)."""
    dim, factor, pretrained = 32, 2, 24
    assert torch.equal(RotaryPositionEmbedding(dim, 1.0, factor, device=DEVICE)(n, offset=3),
                       _plain(dim, n, offset=3))
    got = RotaryPositionEmbedding(dim, 1.0, factor, pretrained, device=DEVICE)(n, offset=3)
    scale = 1 / factor if n <= pretrained * factor else 1 / (n / pretrained)
    assert torch.equal(got, _plain(dim, n, offset=3, scale=scale))
    assert not torch.equal(got, _plain(dim, n, offset=3))


def test_positional_call_and_state_dict():
    emb = RotaryPositionEmbedding(32, 0.5, None, None, 500.0, True, device=DEVICE)
    assert emb.rotary_base == 500.0 and emb.interleaved and emb.rotary_dim == 16
    table = emb(10)
    assert torch.equal(table[..., 0::2], table[..., 1::2])  # interleaved: [f0, f0, f1, f1, ...]
    assert list(emb.state_dict()) == ["inv_freq"]
    other = RotaryPositionEmbedding(32, 0.5, rotary_base=500.0, interleaved=True, device=DEVICE)
    other.load_state_dict(emb.state_dict(), strict=True)


def test_module_cast_to_bf16_gives_a_bf16_table_the_fused_call_takes():
    emb = RotaryPositionEmbedding(32, device=DEVICE).to(torch.bfloat16)
    table = emb(16, offset=300)
    assert table.dtype == torch.bfloat16
    positions = torch.arange(16, dtype=torch.bfloat16, device=DEVICE) + 300
    f = torch.outer(positions, emb.inv_freq)
    assert torch.equal(table, torch.cat((f, f), dim=-1).reshape(16, 1, 1, 32))
    t = randn((16, 2, 3, 32), torch.bfloat16)
    assert torch.equal(apply_rotary_pos_emb(t, table, fused=True),
                       apply_rotary_pos_emb(t, table.float(), fused=True))


@functools.cache
def _te_module():
    """TE's RotaryPositionEmbedding from the study group's copy of its rope.py, or None (loaded
    once for the parametrized tests below)."""
    folder = os.environ.get("ROPE_TE_DIR") or os.environ.get("ROPE_TE_REF")
    path = pathlib.Path(folder) / "ref.py" if folder else ROOT.parent / "shared" / "te" / "ref.py"
    if not path.is_file():
        return None
    return load_file(path, "_te_ref_for_tables").RotaryPositionEmbedding


@pytest.mark.parametrize("cast", [None, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("kwargs", [
    {}, {"rotary_percent": 0.5}, {"interleaved": True}, {"rotary_base": 500000.0},
    {"seq_len_interpolation_factor": 4},
    {"seq_len_interpolation_factor": 2.5, "pretrained_max_position_embeddings": 64},
    {"seq_len_interpolation_factor": 3, "pretrained_max_position_embeddings": 10,
     "interleaved": True, "rotary_percent": 0.5}], ids=str)
def test_tables_are_tes_bit_for_bit(kwargs, cast):
    te_module = _te_module()
    if te_module is None:
        pytest.skip("TE's module code (shared/te/ref.py, or $ROPE_TE_DIR/ref.py) is not here")
    if DEVICE.type == "cuda":
        torch.cuda.set_device(0)  # TE's module puts inv_freq on the current CUDA device
    ours, te = RotaryPositionEmbedding(64, **kwargs, device=DEVICE), te_module(64, **kwargs)
    if cast is not None:
        ours, te = ours.to(cast), te.to(cast)
    for n, offset in [(8, 3), (100, 7), (1000, 0)]:
        want = te(n, offset=offset)
        got = ours(n, offset=offset)
        assert got.dtype == want.dtype and torch.equal(got, want.to(got.device)), (n, offset)
