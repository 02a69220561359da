"""Solutions to the exercises of notebook 06, "RoPE inside a real model".

``tests/test_solutions_06.py`` checks them against transformers' own code, torch._dynamo and the
recorded launch-latency run.

Exercise 1: ``swap_rope``           a context manager that puts our RoPE into a transformers model
                                    module and restores the original afterwards.
Exercise 2: ``count_graph_breaks``  graph breaks and graphs of a function under torch.compile.
Exercise 3: ``latency_budget``      a decode-sized call's microseconds, piece by piece.
Exercise 4: ``complex_tables``      the cos and sin tables the kernel reads from Llama 4's complex
                                    angles, as views of them, and where sin starts.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch

__all__ = ["swap_rope", "count_graph_breaks", "latency_budget", "complex_tables"]


@contextlib.contextmanager
def swap_rope(modeling_module, replacement: Callable | None = None):
    """Exercise 1: within the block, ``modeling_module.apply_rotary_pos_emb`` is
    ``rope_kernels.hf.apply_rotary_pos_emb`` (or ``replacement``); afterwards the original is
    back, also if the block raised. Yields a list that records one entry per call."""
    import rope_kernels.hf

    replacement = replacement or rope_kernels.hf.apply_rotary_pos_emb
    original = modeling_module.apply_rotary_pos_emb
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return replacement(*args, **kwargs)

    modeling_module.apply_rotary_pos_emb = counted
    try:
        yield calls
    finally:
        modeling_module.apply_rotary_pos_emb = original


def count_graph_breaks(fn: Callable, *args) -> tuple[int, int]:
    """Exercise 2: (graph breaks, graphs) of ``fn(*args)`` as torch.compile traces it."""
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(fn)(*args)
    return explanation.graph_break_count, explanation.graph_count


def latency_budget(rows: dict, with_start: bool = True) -> dict:
    """Exercise 3: from ``figures/launch_latency.json``'s ``us_per_call``, the microseconds of a
    TransformerEngine-style decode call (bshd [64, 1, 32, 128] bf16), piece by piece.

    With ``start_positions`` the default call takes the full path (their values are checked on
    the host every call):

    - "Triton's launcher": the C launch function alone, arguments prepared (what the thin
      launch calls);
    - "thin-launch wrapper": _launch.thin_launch minus the above (pointers, device, stream,
      contract checks);
    - "plan lookup and output": rope_2d called directly minus thin_launch (its key, the plan
      lookup, torch.empty_like);
    - "argument checks": the validate=False call on the full path minus rope_2d directly;
    - "value checks (host copy)": the default call minus the above.

    Without them there is nothing to copy to the host, and a repeated call takes the shortcut
    (``api.py``): launcher, wrapper, and "shortcut (key, lookup, output)", the rest of the
    default call. ``parts`` lists the pieces in order; "total, default call" and "CUDA-graph
    replay" are as measured.
    """
    label = "with start_positions" if with_start else "no start_positions"
    launcher = rows["launch pieces: Triton's C launch function alone, arguments ready (what "
                    "the thin launch calls)"]
    thin = rows["launch pieces: _launch.thin_launch (pointers, device, stream, checks + the above)"]
    default = rows[f"te {label}: default call (values checked: host copy)"]
    budget = {"Triton's launcher": launcher, "thin-launch wrapper": thin - launcher}
    if with_start:
        direct = rows[f"te {label}: rope_2d directly (no checks)"]
        full = rows[f"te {label}: validate=False, full path (no shortcut)"]
        budget.update({"plan lookup and output": direct - thin, "argument checks": full - direct,
                       "value checks (host copy)": default - full})
    else:
        budget["shortcut (key, lookup, output)"] = default - thin
    budget["parts"] = list(budget)
    budget["total, default call"] = default
    budget["CUDA-graph replay"] = rows[f"te {label}: CUDA graph replay of the default call"]
    return budget


def complex_tables(freqs_cis: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Exercise 4: ``(cos, sin, offset)`` from Llama 4's complex angles ``freqs_cis`` [b, s, d/2]
    (complex64): cos and sin as float32 views of the angles' own memory (no copy), [b, s, d/2]
    with a stride of 2 along the last axis, and ``offset``, how many float32 elements sin's first
    entry lies past cos's (what the kernel's ``SIN_OFFSET`` says, so that the package can hand
    it cos's tensor, 16-byte aligned, for both)."""
    table = torch.view_as_real(freqs_cis)  # [b, s, d/2, 2]: real and imaginary side by side
    cos, sin = table[..., 0], table[..., 1]
    return cos, sin, (sin.data_ptr() - cos.data_ptr()) // cos.element_size()
