"""Shared test helpers: device choice, fresh random inputs, and dtype-justified tolerances.

On a machine without CUDA the kernels run in Triton's interpreter (rope_kernels turns it on at
import), so the same tests run everywhere; tests marked ``gpu`` need compiled kernels.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch

import rope_kernels  # noqa: F401  (turns the interpreter on when there is no GPU)

ROOT = pathlib.Path(__file__).resolve().parents[1]
ON_GPU = torch.cuda.is_available()


def _restore_lang_after_device_calls():
    """Triton's interpreter (3.7.1, as read) swaps triton.language's builtins for interpreted
    ones while a kernel runs and puts them back after it; but a @triton.jit function called from
    a kernel (ours, or Triton's own ``tl.sum``, whose globals hold ``triton.language.core``)
    swaps them again and never puts them back. ``tl.core`` then stays patched for the rest of
    the process, and a kernel compiled later in it (tests/test_compiled_tiles.py) fails to
    build its IR. This wraps such calls so that each puts back what it swapped."""
    interp = importlib.import_module("triton.runtime.interpreter")
    cls, patch = getattr(interp, "InterpretedFunction", None), getattr(interp, "_patch_lang", None)
    if cls is None or patch is None or getattr(cls, "_rope_restores", False):
        return
    call = cls.__call__

    def patched_call(self, *args, **kwargs):
        saved = interp._patch_lang
        scopes = []

        def patch_and_keep(fn):
            scope = saved(fn)
            scopes.append(scope)
            return scope

        interp._patch_lang = patch_and_keep
        try:
            return call(self, *args, **kwargs)
        finally:
            interp._patch_lang = saved
            for scope in reversed(scopes):
                if hasattr(scope, "restore"):
                    scope.restore()

    cls.__call__ = patched_call
    cls._rope_restores = True


_restore_lang_after_device_calls()
DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")

# Tolerances, |out - ref| <= atol + rtol * |ref| against a float64 reference:
# - rtol is one unit in the last place of the output dtype (eps): a GPU rounds the float32
#   result to nearest (half an ulp); the interpreter truncates float32 -> bfloat16 (up to one
#   ulp). float32 gets 8 ulps because cos/sin of large angles carry a few ulps of error.
# - atol covers the float32 arithmetic x1*cos - x2*sin (a few 1e-7 times |x| with |x| <~ 5,
#   the inputs being standard normal) where the result itself is near zero.
TOLERANCES = {
    torch.float32: (8 * torch.finfo(torch.float32).eps, 1e-5),
    torch.float16: (torch.finfo(torch.float16).eps, 1e-5),
    torch.bfloat16: (torch.finfo(torch.bfloat16).eps, 1e-5),
}


def randn(shape, dtype=torch.float32, seed=None, device=DEVICE) -> torch.Tensor:
    """Standard normal values made on the CPU from a seeded generator (reproducible on any
    device), then moved. Fresh per test: the seed is drawn from pytest's test id by callers."""
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


def assert_rope_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, what: str = "out"):
    """Elementwise check against a float64 reference; NaN (an unwritten element) always fails."""
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    rtol, atol = TOLERANCES[dtype]
    out64, ref64 = out.detach().double(), ref.detach().double()
    err = (out64 - ref64).abs()
    bound = atol + rtol * ref64.abs()
    bad = ~(err <= bound)  # NaN compares False -> counted as bad
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {out.numel()} elements outside tolerance "
            f"(rtol={rtol:.2e}, atol={atol:.0e}); first at {idx}: got {out64[idx].item()!r}, "
            f"expected {ref64[idx].item()!r}")


def hf_reference(x, cos, sin, unsqueeze_dim=1, pairs="half"):
    """transformers' apply_rotary_pos_emb formula in float64 (what the model means, without its
    rounding), partial rotary included: cos, sin [b, s, rotary_dim]. ``pairs`` (the keys of
    ``HF_FUNCTIONS``): Llama's half-split pairs; Cohere's interleaved pairs, cos/sin per channel;
    GLM's interleaved pairs, pair j's cos/sin at channel j (the first half, repeat_interleaved);
    GPT-OSS's half-split and its interleaved pairs (OpenAI's privacy filter), cos/sin
    [b, s, head_dim / 2] of one entry per pair; NanoChat's: Llama's rotated by -theta; DeepSeek
    V3's: GLM's, with each pair's results then written to channels j and j + d/2."""
    if pairs == "deepseek":
        assert cos.shape[-1] == x.shape[-1], "DeepSeek V3's function rotates the whole head"
        y = hf_reference(x, cos, sin, unsqueeze_dim, "glm")
        return torch.cat((y[..., 0::2], y[..., 1::2]), dim=-1)
    cos, sin = cos.double().unsqueeze(unsqueeze_dim), sin.double().unsqueeze(unsqueeze_dim)
    if pairs == "glm":
        cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, -1)
        sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, -1)
    elif pairs == "half_per_pair":
        cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    elif pairs == "interleaved_per_pair":
        cos, sin = cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1)
    elif pairs == "half_negated":
        sin = -sin
    r = cos.shape[-1]
    rot, rest = x.double()[..., :r], x.double()[..., r:]
    if pairs in ("half", "half_per_pair", "half_negated"):
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat((-x2, x1), dim=-1)
    else:
        rotated = torch.stack((-rot[..., 1::2], rot[..., 0::2]), -1).flatten(-2)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)


# rope_kernels.hf's function of each pairing (rope_qk.HF_PAIRS' keys)
HF_FUNCTIONS = {"half": rope_kernels.hf.apply_rotary_pos_emb,
                "interleaved": rope_kernels.hf.apply_rotary_pos_emb_interleaved,
                "glm": rope_kernels.hf.apply_rotary_pos_emb_glm,
                "half_per_pair": rope_kernels.hf.apply_rotary_pos_emb_gpt_oss,
                "interleaved_per_pair": rope_kernels.hf.apply_rotary_pos_emb_gpt_oss_interleaved,
                "half_negated": rope_kernels.hf.apply_rotary_pos_emb_nanochat,
                "deepseek": rope_kernels.hf.apply_rotary_pos_emb_deepseek}


def hf_cos_width(pairs: str, head_dim: int, rotary_dim: int) -> int:
    """cos.shape[-1] for ``pairs``' function to rotate ``rotary_dim`` of ``head_dim`` channels:
    one entry per pair for GPT-OSS's functions (which rotate the whole head), else per channel
    (DeepSeek V3's rotates the whole head too)."""
    if pairs == "deepseek":
        assert rotary_dim == head_dim, "DeepSeek V3's function rotates the whole head"
    if pairs.endswith("_per_pair"):
        assert rotary_dim == head_dim, "GPT-OSS's functions rotate the whole head"
        return rotary_dim // 2
    return rotary_dim


def strided_with_poison(values):
    """int32 ``values`` on DEVICE as a view of stride 2 (as ``position_ids[:, 0]`` is), the
    entries between them -7: a kernel that ignores the stride reads those as positions or
    sequence boundaries."""
    return torch.tensor([v for x in values for v in (x, -7)], dtype=torch.int32,
                        device=DEVICE)[::2]


def count_qk_launches(monkeypatch) -> list:
    """rope_qk's launches from here on, one entry each (the eager shortcut's set aside: a fresh
    ``api._Shortcuts`` with no entries, so every call goes through ``rope_qk.launch``)."""
    import rope_kernels.api
    from rope_kernels import rope_qk

    monkeypatch.setattr(rope_kernels.api, "_SHORTCUTS", rope_kernels.api._Shortcuts())
    launches = []
    real_launch = rope_qk.launch
    monkeypatch.setattr(rope_qk, "launch", lambda *a: launches.append(1) or real_launch(*a))
    return launches


@pytest.fixture
def seed(request) -> int:
    """A seed that differs between tests (fresh inputs) yet reproduces a failing test."""
    import zlib

    return zlib.crc32(request.node.nodeid.encode()) % 2**31


def load_file(path: pathlib.Path, name: str):
    """The Python file at ``path`` as a module called ``name``: the scripts and the notebooks'
    solutions are files, not modules of a package."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_solution(stem: str):
    """The exercise solutions of notebook ``stem`` (notebooks/solutions/<stem>.py) as a module;
    loaded from its path because the file name starts with a digit."""
    return load_file(ROOT / "notebooks" / "solutions" / f"{stem}.py", f"solutions_{stem}")
