"""What Triton makes of the kernels' tiles, compiled for an H100/H200 (sm_90) without a GPU.

Triton picks which thread holds which element of a tile. On a 3-D tile [positions, heads,
channels] whose cos/sin are broadcast over the heads, Triton 3.7 put the threads over the heads,
and the cos/sin went through shared memory to meet them (more registers, barriers; 5-18% slower
on an H200 than the same code compiled by Triton 3.6, figures/flat_tiles_h200_triton37.json).
The kernels now hold 2-D tiles, rows of one position each. These tests compile the kernel files
for sm_90 through Triton's ``warmup`` with a stand-in driver (no GPU, no launch) and check the
compiled kernels for what that change bought, so that a rewrite that brings the conversion back
fails here, in CI, before a GPU run measures it:

- Hugging Face's transposed half-rotary call (``rope_qk``'s whole rows in 4 x 4 tiles): no
  shared memory and at most 64 registers (the 3-D tile: 1 KB and 94 on Triton 3.7.1; the 2-D
  one: none and 64 on 3.6 and on 3.7.1);
- the cos/sin cache's programs issue q's loads before the positions' (``X_FIRST``; ptxas moves
  the positions' load first without the kernel's barrier), except its gathered rows on 2 warps,
  which issue the positions' load first (``POSITIONS_FIRST``);
- fused QKV (``rope_qk``'s whole rows on the pairs' tile) and ``rope_2d``'s bshd tile (8
  positions x 4 heads of whole rows): at most 64 registers (96 each with the 3-D tiles on Triton
  3.7.1; checked on 3.7.1 only, the other tests skip on other versions).

And that the kernels build, each for its own target, for other GPUs: a T4 (sm_75), an A100
(sm_80), an L4 or RTX 40 (sm_89), a B200 (sm_100) and an RTX 50 (sm_120), in bf16, fp16 and fp32,
the thd path through programmatic dependent launch from sm_90 (they have run on sm_90 only).

And that with rotary_dim 20 of 80 channels, where the compiler cannot prove the pairs' second
half or the channels past rotary_dim aligned, ``rope_qk``'s ``GATHER`` moves every element of q
and k in vectors, the partners gathered in registers (without it, the pairs' tiles move every
element alone).

And, on Triton 3.6 to 3.9, that thd's one-warp count tiles (2 tokens x 8 heads of 128, 32-128
sequences) keep the boundaries of cu_seqlens in registers: Triton 3.9.0 moved the one load the
tile's tokens shared through shared memory and 30 more registers, and ran 64 and 128 sequences
5-12% slower on an H200 than 3.6, until each token loaded them itself (``BOUNDS_EACH``).

On a version not named, or without Triton's CUDA backend and its binaries, the tests skip.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch
import triton

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECKED = ("3.6.", "3.7.")  # the HF call's code was read on both; the rest on 3.7.1 only
COUNT_CHECKED = ("3.6.", "3.7.", "3.8.", "3.9.")  # thd's count tiles: read on each
ON_37 = triton.__version__.startswith("3.7.")
NVIDIA_BIN = pathlib.Path(triton.__file__).parent / "backends" / "nvidia" / "bin"

pytestmark = pytest.mark.skipif(
    not triton.__version__.startswith(COUNT_CHECKED) or not (NVIDIA_BIN / "ptxas").exists(),
    reason=f"compiled code checked on triton {COUNT_CHECKED} with its CUDA backend's binaries")
read_on_checked = pytest.mark.skipif(not triton.__version__.startswith(CHECKED),
                                     reason=f"compiled code checked on triton {CHECKED}")


@contextlib.contextmanager
def stand_in_driver(capability: int = 90):
    """A stand-in driver for a GPU of compute ``capability`` (sm_90 by default) while a kernel
    compiles (``warmup`` launches nothing); the real one (or none, on a CPU) is put back at
    once, so that no other test sees it."""
    from triton.backends import DriverBase
    from triton.backends.compiler import GPUTarget
    from triton.runtime.driver import driver

    class Sm90(DriverBase):
        @classmethod
        def is_active(cls):
            return True

        def get_current_target(self):
            return GPUTarget("cuda", capability, 32)

        def get_current_device(self):
            # Triton keeps a kernel's compile target per device id (its binder, made on the
            # first compile for that id): one id per capability, so that each target compiles
            # its own code and none is answered from another's cache.
            return 1000 + capability  # (no real GPU has such an id)

        def get_current_stream(self, device=None):
            return 0

        def get_active_torch_device(self):
            return torch.device("cpu")

        def map_python_to_cpp_type(self, ty):
            return ty

        def get_benchmarker(self):
            return None

        def get_device_interface(self):
            return torch.cuda

        def get_empty_cache_for_benchmark(self):
            return None

        def clear_cache(self, cache):
            pass

    saved = driver.__dict__.get("_active")
    driver.set_active(Sm90())
    try:
        yield
    finally:
        driver._active = saved


def load_compiled(path: pathlib.Path, name: str):
    """The kernel file at ``path`` loaded as its own module ``name`` with the interpreter off
    (Triton reads TRITON_INTERPRET when ``@triton.jit`` runs); the environment is put back at
    once."""
    saved_env = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env
    return module


@pytest.fixture(scope="module")
def compiled_modules():
    """The kernel files loaded as their own modules, compiled (``load_compiled``)."""
    return {name: load_compiled(ROOT / "rope_kernels" / f"{name}.py", f"compiled_{name}")
            for name in ("rope_2d", "rope_qk")}


def cuobjdump(compiled, option: str) -> str:
    """``cuobjdump option`` on a compiled kernel's cubin (``-res-usage``, ``-sass``)."""
    tool = NVIDIA_BIN / "cuobjdump"
    if not tool.exists():
        pytest.skip("no cuobjdump in triton's CUDA backend")
    path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"rope_tiles_{os.getpid()}.cubin"
    path.write_bytes(compiled.asm["cubin"])
    try:
        return subprocess.run([str(tool), option, str(path)], capture_output=True, text=True,
                              check=True).stdout
    finally:
        path.unlink()


def registers(compiled) -> int:
    """Registers per thread of a compiled kernel, from its cubin (``cuobjdump -res-usage``)."""
    return int(re.search(r"REG:(\d+)", cuobjdump(compiled, "-res-usage")).group(1))


def meta(*shape, dtype):
    return torch.empty(*shape, device="meta", dtype=dtype)


def gpu_launch(qk, call):
    """(plan, pointer dtypes) of the one launch ``call()`` makes through an entry point of the
    compiled module ``qk`` on meta tensors, planned as for a CUDA GPU (``_plan`` told one) and
    not made."""
    launches = []
    real_plan, real_launch, real_check = qk._plan, qk.launch, qk._check_device
    qk._plan = lambda *a, **k: real_plan(*a, **{**k, "device": torch.device("cuda")})
    qk.launch = lambda kernel, plan, pointers: launches.append((plan, [p.dtype for p in pointers]))
    qk._check_device = lambda x: None
    try:
        call()
    finally:
        qk._plan, qk.launch, qk._check_device = real_plan, real_launch, real_check
    (launch,) = launches
    return launch


def hf_half_rotary(qk, dtype=torch.bfloat16):
    """The launch of Hugging Face's GPT-NeoX call: q [16, 32, 4096, 128] and k (8 heads) as
    [b, h, s, d] views of [b, s, h, d] memory, half the head rotated, contiguous results."""
    b, s, hq, hk, d, rd = 16, 4096, 32, 8, 128, 64
    q = meta(b, s, hq, d, dtype=dtype).transpose(1, 2)
    k = meta(b, s, hk, d, dtype=dtype).transpose(1, 2)
    cos, sin = meta(1, s, rd, dtype=dtype), meta(1, s, rd, dtype=dtype)
    return gpu_launch(qk, lambda: qk.rope_cos_sin(q, k, cos, sin))


def fused_qkv(qk, dtype=torch.bfloat16, interleaved=False):
    """The launch of TE's fused QKV forward, sbhd qkv [4096, 8, 8 groups, (4 q + k + v) x 128]
    into q, k, v (addresses even: interleaved pairs are read as words)."""
    qkv, freqs = meta(4096, 8, 8, 6 * 128, dtype=dtype), meta(4096, 1, 1, 128, dtype=torch.float32)
    return gpu_launch(qk, lambda: qk.rope_qkv(qkv, freqs, freqs, (4 * 128, 128, 128), "sbhd",
                                              None, interleaved))


def compile_qk(qk, launch, capability=90):
    """A launch (``gpu_launch``) compiled for ``capability``."""
    plan, pointers = launch
    with stand_in_driver(capability):
        return qk.rope_qk_kernel.warmup(*pointers, *plan.scalars, **plan.constexprs,
                                        num_warps=plan.num_warps, grid=plan.grid)


@read_on_checked
def test_hf_transposed_whole_rows_use_no_shared_memory(compiled_modules):
    """The q+k kernel's whole-row tiles keep each token's cos/sin in its threads' registers."""
    qk = compiled_modules["rope_qk"]
    launch = plan, _ = hf_half_rotary(qk)
    assert plan.constexprs["ROW"] == 128  # the whole-row path is the one compiled
    compiled = compile_qk(qk, launch)
    assert compiled.metadata.shared == 0
    assert registers(compiled) <= 64


@pytest.mark.skipif(not ON_37, reason="read on triton 3.7.1 only")
def test_fused_qkv_whole_rows_registers(compiled_modules):
    qk = compiled_modules["rope_qk"]
    launch = plan, _ = fused_qkv(qk)
    assert plan.constexprs["ROW"] == 128
    assert registers(compile_qk(qk, launch)) <= 64


def rope_2d_gpu_plan(r2, t, freqs, tensor_format, cu_seqlens=None, backward=False, config=None,
                     interleaved=False, words=False, in_place=False):
    """rope_2d's plan for meta tensors as for tensors on a GPU (default_config told a CUDA
    device); ``in_place``: as ``rope_2d`` plans ``out=t``, on t narrowed to rotary_dim."""
    real = r2.default_config
    out = torch.empty_like(t)
    if in_place:
        t = out = t[..., :freqs.shape[-1]]
    try:
        r2.default_config = lambda *a, **k: real(*a[:5], torch.device("cuda"), *a[6:], **k)
        return r2._make_plan(t, freqs, out, tensor_format, cu_seqlens, None,
                             interleaved, 1, 0, backward, config, words)
    finally:
        r2.default_config = real


def compile_rope_2d(r2, plan, dtype, capability=90, seq_info=torch.int32):
    with stand_in_driver(capability):
        return r2.rope_2d_kernel.warmup(dtype, torch.float32, dtype, seq_info, torch.int32,
                                        *plan.scalars, **plan.constexprs,
                                        num_warps=plan.num_warps, grid=plan.grid)


def compile_rope_2d_bshd(r2, backward=False, capability=90):
    """rope_2d's tile at TE's bshd shape (16 x 4096 x 32 heads of 128, bf16), compiled for sm_90."""
    t = torch.empty(16, 4096, 32, 128, device="meta", dtype=torch.bfloat16)
    freqs = torch.empty(4096, 1, 1, 128, device="meta", dtype=torch.float32)
    plan = rope_2d_gpu_plan(r2, t, freqs, "bshd", backward=backward, config={"fast_trig": True})
    c = plan.constexprs
    assert (c["BLOCK_S"], c["BLOCK_B"], c["BLOCK_H"], c["ROW"], plan.num_warps) == (8, 1, 4, 128, 4)
    return compile_rope_2d(r2, plan, torch.bfloat16, capability)


@pytest.mark.skipif(not ON_37, reason="read on triton 3.7.1 only")
def test_rope_2d_bshd_tile_registers(compiled_modules):
    """rope_2d's bshd tile (8 positions x 4 heads of 128, whole rows, bf16, 4 warps) compiles to
    at most 64 registers a thread (the 3-D tile: 96 on Triton 3.7.1)."""
    assert registers(compile_rope_2d_bshd(compiled_modules["rope_2d"])) <= 64


@read_on_checked
@pytest.mark.parametrize("backward", [False, True])
def test_rope_2d_reads_its_angle_table_evict_last(compiled_modules, backward):
    """The angle table's loads carry the evict_last hint (rope_2d._table: every batch element
    reads the rows again, and without it the streamed x evicts them from L2), and x's loads
    do not: the hint is on the table only."""
    ptx = compile_rope_2d_bshd(compiled_modules["rope_2d"], backward).asm["ptx"]
    loads = [line for line in ptx.splitlines() if re.search(r"\bld\.global", line)]
    hinted = [line for line in loads if "evict_last" in line or "cache_hint" in line]
    assert hinted and len(hinted) < len(loads), (len(hinted), len(loads))


def cache_call(qk, dtype=torch.bfloat16, tokens=16 * 4096, hq=32, hk=8, d=128, rotary_dim=None):
    """The launch of the cos/sin cache call out of place: by default 16 x 4096 tokens, 32 q / 8 k
    heads of 128 all rotated, int64 positions (programs of one token's 8 heads on an H200); a
    cache of 4096 rows of ``rotary_dim`` (``d`` if None) channels."""
    q, k = meta(tokens, hq * d, dtype=dtype), meta(tokens, hk * d, dtype=dtype)
    positions = meta(tokens, dtype=torch.int64)
    cache = meta(4096, rotary_dim or d, dtype=torch.float32)
    return gpu_launch(qk, lambda: qk.rope_cos_sin_cache(positions, q, k, d, cache))


def global_accesses(sass: str, op: str = "LDG") -> list:
    """The global loads (``op`` "LDG") or stores ("STG") of disassembled SASS, in program
    order, with their width (``LDG.E.128``, ``STG.E.U16``, ...)."""
    return re.findall(rf"\b{op}\.E[.\w]*", sass)


def streamed_accesses(sass: str) -> tuple:
    """(stores, loads) of disassembled SASS (``global_accesses``) but the loads of tables read
    ``evict_last`` (the cos/sin rows, the angle table): those of q, k or x, and of positions."""
    return global_accesses(sass, "STG"), [op for op in global_accesses(sass) if ".EL" not in op]


def assert_gathered_in_vectors(sass: str):
    """With the partners gathered (``GATHER``): no 2-byte load or store of the streamed tensors,
    16-byte ones among them, and the partners moved between threads (SHFL.IDX)."""
    stores, loads = streamed_accesses(sass)
    assert not {"STG.E.U16", "LDG.E.U16"} & set(stores + loads), (stores, loads)
    assert "STG.E.128" in stores and "LDG.E.128" in loads, (stores, loads)
    assert "SHFL.IDX" in sass


def assert_narrowed_rows_in_vectors(sass: str, store: str):
    """In place, the heads narrowed to an unaligned rotary_dim and their rows gathered: every
    store of the streamed tensors ``store`` wide (8 bytes at 20 channels, 16 at 24), no 2-byte
    load, and the partners moved between threads (SHFL.IDX)."""
    stores, loads = streamed_accesses(sass)
    assert set(stores) == {store} and "LDG.E.U16" not in loads, (stores, loads)
    assert "SHFL.IDX" in sass


def sass_loads(compiled) -> list:
    """The global loads of a compiled kernel's SASS (``cuobjdump -sass``), in program order."""
    return global_accesses(cuobjdump(compiled, "-sass"))


@read_on_checked
@pytest.mark.parametrize("loads_before_positions", [True, False])
def test_cache_issues_q_loads_before_the_positions(compiled_modules, loads_before_positions,
                                                   monkeypatch):
    """In the cache's programs (one head block of q or k), q's first 16-byte load (LDG.E.128)
    comes before the int64 positions' load (LDG.E.64) with ``X_FIRST``: its barrier keeps ptxas
    from moving the positions' load above q's, where a program would hold nothing of q in flight
    until the position came. With it off, ptxas puts the positions' load first: the order the
    barrier is there to change."""
    qk = compiled_modules["rope_qk"]
    monkeypatch.setattr(qk, "LOADS_BEFORE_POSITIONS", loads_before_positions)
    monkeypatch.setattr(qk, "_PLANS", {})
    launch = plan, _ = cache_call(qk)
    assert plan.constexprs["X_FIRST"] == loads_before_positions
    assert (plan.constexprs["ALL_HEADS"], plan.constexprs["BLOCK_H"]) == (False, 8)
    loads = sass_loads(compile_qk(qk, launch))
    first_q, first_position = loads.index("LDG.E.128"), loads.index("LDG.E.64")
    assert (first_q < first_position) == loads_before_positions, loads


@read_on_checked
@pytest.mark.parametrize("positions_first", [True, False])
def test_gathered_cache_issues_the_positions_load_first(compiled_modules, positions_first,
                                                        monkeypatch):
    """The cache's gathered rows on 2 warps (8 q / 2 k heads, 20 of 80 channels rotated: 16
    tokens x 2 heads): with ``POSITIONS_FIRST`` the int64 positions' load (LDG.E.64) comes
    before q's first 16-byte load (LDG.E.128), and the table's rows, which wait on it, after the
    barrier; without it, the positions' load after q's (``X_FIRST`` alone)."""
    qk = compiled_modules["rope_qk"]
    monkeypatch.setattr(qk, "GATHERED_POSITIONS_FIRST", positions_first)
    monkeypatch.setattr(qk, "_PLANS", {})
    launch = plan, _ = cache_call(qk, tokens=64 * 4096, hq=8, hk=2, d=80, rotary_dim=20)
    c = plan.constexprs
    assert (c["GATHER"], c["X_FIRST"], c["POSITIONS_FIRST"], plan.num_warps) == (
        True, True, positions_first, 2)
    loads = sass_loads(compile_qk(qk, launch))
    first_q, first_position = loads.index("LDG.E.128"), loads.index("LDG.E.64")
    assert (first_position < first_q) == positions_first, loads


def pythia_launch(qk, hf: bool, dtype=torch.bfloat16):
    """The launch of Pythia 2.8B's call, 20 of 80 channels rotated (bf16 unless ``dtype``; 32
    heads of q and of k, 4096 tokens): Hugging Face's on the [b, h, s, d] views models hand
    over, or the cos/sin cache's out of place."""
    tokens, heads, head_dim, rotary_dim = 4096, 32, 80, 20
    if hf:
        q = meta(4, 1024, heads, head_dim, dtype=dtype).transpose(1, 2)
        cos = meta(1, 1024, rotary_dim, dtype=dtype)
        return gpu_launch(qk, lambda: qk.rope_cos_sin(q, q, cos, cos))
    q = meta(tokens, heads * head_dim, dtype=dtype)
    positions = meta(tokens, dtype=torch.int64)
    cache = meta(8192, rotary_dim, dtype=torch.float32)
    return gpu_launch(qk, lambda: qk.rope_cos_sin_cache(positions, q, q, head_dim, cache, True))


@pytest.mark.parametrize("gathered,told", [(True, True), (False, False), (False, True)])
@pytest.mark.parametrize("call", ["hf", "cache"])
def test_gathered_partners_move_q_and_k_in_vectors(compiled_modules, call, gathered, told,
                                                   monkeypatch):
    """With rotary_dim 20 the compiler cannot prove the pairs' second half (channel 10) or the
    channels past rotary_dim (from byte 40 of the row) aligned, and the pairs' tiles move every
    element of q and k with a 2-byte load and store (LDG.E.U16, STG.E.U16; 0.33-0.44 of copy on
    an H200). With ``GATHERED_PARTNERS`` (``GATHER``) each row moves in two aligned pieces, the
    rotary block and the rest, in 8- or 16-byte vectors, and the partners come from registers
    (SHFL): no load or store of q or k is 2 bytes wide. (The cos/sin rows, read ``evict_last``,
    are a few elements a token and stay per element.) Read on Triton 3.8.0; the cause, integer
    arguments specialized on their divisibility by 16 and no finer, is the same from 3.6 to 3.9.
    The pairs' tiles told that rotary_dim is a multiple of 4 (``CHANNEL_MULTIPLES``, which the
    gathered rows do not need here) move 4 and 8 bytes at a time, none 16."""
    qk = compiled_modules["rope_qk"]
    monkeypatch.setattr(qk, "GATHERED_PARTNERS", gathered)
    monkeypatch.setattr(qk, "CHANNEL_MULTIPLES", told)
    monkeypatch.setattr(qk, "_PLANS", {})
    launch = plan, _ = pythia_launch(qk, call == "hf")
    assert plan.constexprs["GATHER"] == gathered
    assert plan.constexprs["CHANNEL_MULTIPLE"] == (4 if told and not gathered else 0)
    sass = cuobjdump(compile_qk(qk, launch), "-sass")
    stores, loads = streamed_accesses(sass)
    if gathered:
        assert_gathered_in_vectors(sass)
    elif told:
        assert set(stores) == {"STG.E", "STG.E.64"} and "LDG.E.U16" not in loads, (stores, loads)
    else:
        assert set(stores) == {"STG.E.U16"} and "LDG.E.128" not in loads, (stores, loads)


def in_place_launch(qk, hf: bool, head_dim: int, rotary_dim: int, dtype=torch.bfloat16):
    """The launch of an in-place call with ``rotary_dim`` of ``head_dim`` channels rotated (32
    heads of q and of k, 4096 tokens): Hugging Face's on [b, h, s, d] views, or the cos/sin
    cache's (vLLM's in-place call)."""
    tokens, heads = 4096, 32
    if hf:
        q, k = (meta(4, 1024, heads, head_dim, dtype=dtype).transpose(1, 2) for _ in "qk")
        cos = meta(1, 1024, rotary_dim, dtype=dtype)
        return gpu_launch(qk, lambda: qk.rope_cos_sin(q, k, cos, cos, q_out=q, k_out=k))
    q, k = (meta(tokens, heads * head_dim, dtype=dtype) for _ in "qk")
    positions = meta(tokens, dtype=torch.int64)
    cache = meta(8192, rotary_dim, dtype=torch.float32)
    return gpu_launch(qk, lambda: qk.rope_cos_sin_cache(positions, q, k, head_dim, cache, True,
                                                        query_out=q, key_out=k))


@pytest.mark.parametrize("gathered", [True, False])
@pytest.mark.parametrize("head_dim,rotary_dim,store", [(80, 20, "STG.E.64"),
                                                       (96, 24, "STG.E.128")])
@pytest.mark.parametrize("call", ["hf", "cache"])
def test_in_place_unaligned_rotary_moves_q_and_k_in_vectors(compiled_modules, call, head_dim,
                                                           rotary_dim, store, gathered,
                                                           monkeypatch):
    """In place, only the first rotary_dim channels of each head are read and written: runs of
    40 or 48 bytes. Without ``IN_PLACE_GATHER`` and ``CHANNEL_MULTIPLES`` each element of them
    moved with a 2-byte load and store (STG.E.U16; 0.13-0.16 of copy on an H200, counting the
    bytes moved): the compiler knew neither rotary_dim / 2 nor rotary_dim to be a multiple of a
    vector. With them, the runs are whole rows masked at rotary_dim, a multiple of 4 (8) the
    kernel is told of: every store of q and k 8 (16) bytes wide, the partners from registers
    (SHFL)."""
    qk = compiled_modules["rope_qk"]
    monkeypatch.setattr(qk, "IN_PLACE_GATHER", gathered)
    monkeypatch.setattr(qk, "CHANNEL_MULTIPLES", gathered)
    monkeypatch.setattr(qk, "_PLANS", {})
    launch = plan, _ = in_place_launch(qk, call == "hf", head_dim, rotary_dim)
    assert plan.constexprs["GATHER"] == gathered
    assert plan.scalars[7:9] == (rotary_dim, rotary_dim)  # the heads narrowed to rotary_dim
    sass = cuobjdump(compile_qk(qk, launch), "-sass")
    if gathered:
        assert_narrowed_rows_in_vectors(sass, store)
    else:
        stores, loads = streamed_accesses(sass)
        assert set(stores) == {"STG.E.U16"} and "LDG.E.U16" in loads, (stores, loads)


@pytest.mark.parametrize("gathered,told,in_place", [
    (True, True, False), (False, False, False), (False, True, False), (True, True, True),
    (False, False, True)])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
def test_rope_2d_gathered_partners_move_x_in_vectors(compiled_modules, fmt, gathered, told,
                                                     in_place, monkeypatch):
    """rope_2d with 20 of 80 channels rotated (TransformerEngine's rotary_percent 0.25 on heads of
    80, bf16, forward): without ``GATHERED_PARTNERS`` every load and store of x is a 2-byte one
    (LDG.E.U16, STG.E.U16); with it (``GATHER``) none is: the rotary block and the rest move in
    16-byte vectors and the partners between threads (SHFL.IDX). Read on Triton 3.8.0. The
    pairs' tile told that rotary_dim is a multiple of 4 (``CHANNEL_MULTIPLES``) moves 4 and 8
    bytes at a time. In place (``out=t``: the heads narrowed to their 20 rotated channels, 40 B
    runs) the gathered rows, masked at rotary_dim, store 8 bytes at a time (``IN_PLACE_GATHER``
    and ``CHANNEL_MULTIPLES``); without them, 2."""
    r2 = compiled_modules["rope_2d"]
    monkeypatch.setattr(r2, "GATHERED_PARTNERS" if not in_place else "IN_PLACE_GATHER", gathered)
    monkeypatch.setattr(r2, "CHANNEL_MULTIPLES", told)
    r2._config.cache_clear()
    shape = {"sbhd": (4096, 16, 32, 80), "bshd": (16, 4096, 32, 80), "thd": (65536, 32, 80)}[fmt]
    x = torch.empty(*shape, device="meta", dtype=torch.bfloat16)
    freqs = torch.empty(4096, 1, 1, 20, device="meta", dtype=torch.float32)
    # thd in 4096 sequences: the tiles read the pre-pass's token rows (a tile that counts the
    # boundaries calls Triton's own @jit helpers, which do not compile with the interpreter on)
    cu_seqlens = torch.empty(4097, device="meta", dtype=torch.int32) if fmt == "thd" else None
    plan = rope_2d_gpu_plan(r2, x, freqs, fmt, cu_seqlens, config={"fast_trig": True, "pdl": False},
                            in_place=in_place)
    assert plan.constexprs["GATHER"] == gathered
    assert plan.constexprs["TOKEN_ROWS"] == (fmt == "thd")
    assert plan.constexprs["CHANNEL_MULTIPLE"] == (4 if told and (in_place or not gathered) else 0)
    sass = cuobjdump(compile_rope_2d(r2, plan, torch.bfloat16), "-sass")
    r2._config.cache_clear()
    stores, loads = streamed_accesses(sass)
    if gathered and in_place:
        assert_narrowed_rows_in_vectors(sass, "STG.E.64")
    elif gathered:
        assert_gathered_in_vectors(sass)
    elif told:
        assert set(stores) <= {"STG.E", "STG.E.64"} and "LDG.E.U16" not in loads, (stores, loads)
    else:
        assert set(stores) == {"STG.E.U16"} and "LDG.E.U16" in loads, (stores, loads)


# Other GPUs. The kernels run compiled on H100 and H200 only (sm_90); this checks that each
# kernel and its main variants build for the GPUs learners and users have: Colab's T4 (sm_75, no
# native bf16 conversions), the A100 (sm_80), the L4 and RTX 40 series (sm_89), and Blackwell's
# B200 (sm_100) and RTX 50 series (sm_120). From sm_90 the thd plans overlap the pre-pass and the
# main kernel through programmatic dependent launch (``rope_2d._pdl_available``), so those targets
# compile that path; older ones compile the plain path and must not see its instructions. It
# compiles; nothing runs on such a GPU here.
OTHER_GPUS = {75: "T4", 80: "A100", 89: "L4, RTX 40", 100: "B200", 120: "RTX 50"}
# With the interpreter on, Triton's own @jit helpers (tl.min, tl.max, ...) are interpreted
# functions, which a compiled kernel cannot call (the thd pre-pass calls tl.min): there the tests
# run in a process of their own with the interpreter off.
INTERPRETING = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
in_compiled_process = pytest.mark.skipif(
    INTERPRETING, reason="run by test_other_gpus_in_a_compiled_process")
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def assert_passed_in_a_compiled_process(selection: str, ran: int):
    """This file's tests matching ``-k selection`` run in a process with the interpreter off:
    all ``ran`` of them pass."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    proc = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
                           "-o", "addopts=", "-k", selection], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0 and f"{ran} passed" in proc.stdout, proc.stdout[-4000:]


@read_on_checked
@pytest.mark.skipif(not INTERPRETING, reason="the other-GPU tests run in this process")
def test_other_gpus_in_a_compiled_process():
    ran = 3 * len(OTHER_GPUS) * len(DTYPES)  # the three tests below
    assert_passed_in_a_compiled_process("compiles_for_other_gpus", ran)


def built_for(compiled, capability) -> bool:
    """Whether ``compiled`` was built for ``capability`` (its PTX's target; sm_90a and sm_100a
    are the arch-specific targets Triton picks from sm_90): Triton keeps a kernel's target per
    device id, and a stand-in that reused one id would answer every later target from the first
    one's cache. And whether its shared memory fits the 48 KB every one of these GPUs gives a
    block without an opt-in (the tiles use 1-2 KB)."""
    target = re.search(r"^\.target (sm_\d+)a?\b", compiled.asm["ptx"], re.M).group(1)
    return (target == f"sm_{capability}" and bool(compiled.asm["cubin"])
            and compiled.metadata.shared <= 48 * 1024)


@read_on_checked
@pytest.mark.parametrize("capability", OTHER_GPUS, ids=lambda c: f"sm_{c}")
def test_thd_plans_take_pdl_from_sm_90(compiled_modules, capability, monkeypatch):
    """What the builds below assume of each GPU: ``_pdl_available`` (compiled kernels on an
    NVIDIA GPU) says yes from compute capability 9.0 and no below it."""
    r2 = compiled_modules["rope_2d"]
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda device=None: divmod(capability, 10))
    monkeypatch.setattr(torch.version, "hip", None)
    assert r2._pdl_available(torch.device("cuda")) == (capability >= 90)
    assert not r2._pdl_available(torch.device("cpu"))


def uses_pdl(compiled) -> bool:
    return "griddepcontrol" in compiled.asm["ptx"]


def ptxas_for(capability):
    """Skip a target whose ptxas this Triton lacks (from sm_100 it calls ptxas-blackwell)."""
    name = "ptxas-blackwell" if capability >= 100 else "ptxas"
    if not (NVIDIA_BIN / name).exists():
        pytest.skip(f"no {name} in triton's CUDA backend")


@read_on_checked
@in_compiled_process
@pytest.mark.parametrize("capability", OTHER_GPUS, ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_2d_compiles_for_other_gpus(compiled_modules, capability, dtype):
    """bshd forward and backward (whole rows, the backward's gathered sines), sbhd interleaved
    pairs read as words, and thd's pre-pass with the main kernel reading its token rows (waiting
    for them after and before its x loads, through PDL from sm_90)."""
    ptxas_for(capability)
    r2 = compiled_modules["rope_2d"]
    t = torch.empty(8, 1024, 16, 128, device="meta", dtype=dtype)
    freqs = torch.empty(1024, 1, 1, 128, device="meta", dtype=torch.float32)
    fast = {"fast_trig": dtype != torch.float32}
    for backward in (False, True):
        plan = rope_2d_gpu_plan(r2, t, freqs, "bshd", backward=backward, config=fast)
        assert built_for(compile_rope_2d(r2, plan, dtype, capability), capability)
    sbhd = torch.empty(1024, 8, 16, 128, device="meta", dtype=dtype)
    plan = rope_2d_gpu_plan(r2, sbhd, freqs, "sbhd", config=fast, interleaved=True, words=True)
    assert plan.constexprs["PAIRS_AS_WORDS"]
    assert built_for(compile_rope_2d(r2, plan, dtype, capability), capability)
    thd = torch.empty(8192, 16, 128, device="meta", dtype=dtype)
    cu_seqlens = torch.empty(301, device="meta", dtype=torch.int32)
    pdl = capability >= 90  # as _pdl_available decides on such a GPU
    for wait_first in (False, True):
        plan = rope_2d_gpu_plan(r2, thd, freqs, "thd", cu_seqlens,
                                config={**fast, "pdl": pdl, "wait_first": wait_first})
        assert plan.constexprs["TOKEN_ROWS"] and plan.constexprs["PDL_WAIT"] == pdl
        assert plan.constexprs["WAIT_FIRST"] == (pdl and wait_first)
        compiled = compile_rope_2d(r2, plan, dtype, capability)
        assert built_for(compiled, capability) and uses_pdl(compiled) == pdl
    pre = r2.pre_pass_plan(8192, 300, pdl=pdl)
    with stand_in_driver(capability):
        compiled = r2.thd_positions_kernel.warmup(torch.int32, torch.int32, torch.int32,
                                                  *pre.scalars, **pre.constexprs,
                                                  num_warps=pre.num_warps, grid=pre.grid)
    assert built_for(compiled, capability) and uses_pdl(compiled) == pdl


@read_on_checked
@in_compiled_process
@pytest.mark.parametrize("capability", OTHER_GPUS, ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_qk_compiles_for_other_gpus(compiled_modules, capability, dtype):
    """The q+k kernel's Hugging Face transposed whole rows, fused QKV's plan, half-split and
    with interleaved pairs read as words, and Pythia's 20 of 80 channels (the partners gathered
    in registers, ``GATHER``) through Hugging Face's call and the cache's."""
    ptxas_for(capability)
    qk = compiled_modules["rope_qk"]
    for hf in (True, False):
        launch = pythia_launch(qk, hf, dtype)
        assert launch[0].constexprs["GATHER"]
        assert built_for(compile_qk(qk, launch, capability), capability)
    assert built_for(compile_qk(qk, hf_half_rotary(qk, dtype), capability), capability)
    assert built_for(compile_qk(qk, fused_qkv(qk, dtype), capability), capability)
    words = fused_qkv(qk, dtype, interleaved=True)
    assert words[0].constexprs["INTERLEAVED"] == 2
    assert built_for(compile_qk(qk, words, capability), capability)


def hf_launch(qk, dtype, heads, k_heads, head_dim, width, pairs="half"):
    """The launch (``gpu_launch``) of ``qk.rope_cos_sin`` with ``pairs``: q and k as the
    [4, h, 1024, head_dim] views of [b, s, h, d] memory that models hand over, cos and sin
    [1, 1024, width]."""
    hq = meta(4, 1024, heads, head_dim, dtype=dtype).transpose(1, 2)
    hk = meta(4, 1024, k_heads, head_dim, dtype=dtype).transpose(1, 2)
    cos, sin = meta(1, 1024, width, dtype=dtype), meta(1, 1024, width, dtype=dtype)
    return gpu_launch(qk, lambda: qk.rope_cos_sin(hq, hk, cos, sin, pairs=pairs))


def serving_and_hf_launches(qk, dtype) -> dict:
    """{name: launch (``gpu_launch``)} of the cos/sin cache call (per-token positions: half-split
    pairs out of place, interleaved pairs in place, read as words) and Hugging Face's interleaved
    pairings at head_dim 64 (``WORDS_128B_HF_TILES``: Cohere's whole head at 32 q / 8 k heads and
    16 q / 4 k, GLM's half of it with its table of one entry a pair), and the other conventions
    at their models' shapes: GPT-OSS's (64 q / 8 k heads of 64, a table entry per pair),
    OpenAI's privacy filter's (the same, interleaved) and NanoChat's (-theta, heads of 128)."""
    positions, cache = meta(4096, dtype=torch.int64), meta(8192, 128, dtype=torch.float32)
    q, k = meta(4096, 32 * 128, dtype=dtype), meta(4096, 8 * 128, dtype=dtype)
    launches = {
        "cache": gpu_launch(qk, lambda: qk.rope_cos_sin_cache(positions, q, k, 128, cache, True)),
        "cache, interleaved, in place": gpu_launch(qk, lambda: qk.rope_cos_sin_cache(
            positions, q, k, 128, cache, False, query_out=q, key_out=k))}
    # FlashInfer's apply_rope_pos_ids: the angles from a frequency per pair, in the kernel
    q3, k3 = meta(4096, 32, 128, dtype=dtype), meta(4096, 8, 128, dtype=dtype)
    launches["pos_ids"] = gpu_launch(qk, lambda: qk.rope_pos_ids(
        positions, q3, k3, meta(64, dtype=torch.float32)))
    launches["pos_ids, interleaved, in place, half rotary"] = gpu_launch(qk, lambda: (
        qk.rope_pos_ids(positions, q3, k3, meta(32, dtype=torch.float32), True, q3, k3)))
    for name, heads, k_heads, head_dim, width, pairs in (
            ("cohere", 32, 8, 64, 64, "interleaved"),
            ("cohere, 16q/4k", 16, 4, 64, 64, "interleaved"),
            ("glm, half rotary", 32, 8, 64, 32, "glm"),
            ("gpt_oss", 64, 8, 64, 32, "half_per_pair"),
            ("privacy filter", 16, 4, 64, 32, "interleaved_per_pair"),
            ("nanochat", 16, 16, 128, 128, "half_negated")):
        launches[name] = hf_launch(qk, dtype, heads, k_heads, head_dim, width, pairs)
    return launches


def head_count_launches(qk, dtype=torch.bfloat16) -> dict:
    """{name: launch} of calls that ``rope_qk.HEAD_COUNT_TILES`` plans in 16-bit: Hugging Face's
    tables at 20 q / 20 k heads of 128 (loads first on 2 warps, q in a block of 32 heads) and 14
    q / 2 k of 64 (Qwen2.5 0.5B's: loads first, 2 tokens a program; SmolLM2 135M's 9 / 3 the
    same on one warp) and 32 q / 32 k of 96 (Phi-3 mini's: loads first, one token), the cache
    at 28 q / 4 k of 128 (Qwen2.5 7B's: 2 tokens x 4 heads), 20 q / 20 k of 128 and 32 q / 32 k
    of 96 (loads first on 4 warps) and 40 q / 8 k of 64 (2 tokens x 8)."""
    positions = meta(4096, dtype=torch.int64)
    launches = {}
    for name, heads, k_heads, head_dim in (("hf 20q/20k", 20, 20, 128), ("hf 14q/2k", 14, 2, 64),
                                           ("hf 9q/3k", 9, 3, 64), ("hf hd96 32q/32k", 32, 32, 96)):
        launches[name] = hf_launch(qk, dtype, heads, k_heads, head_dim, head_dim)
    for name, heads, k_heads, head_dim in (("cache 28q/4k", 28, 4, 128),
                                           ("cache 20q/20k", 20, 20, 128),
                                           ("cache hd96 32q/32k", 32, 32, 96),
                                           ("cache 40q/8k", 40, 8, 64)):
        q = meta(4096, heads * head_dim, dtype=dtype)
        k = meta(4096, k_heads * head_dim, dtype=dtype)
        cache = meta(8192, head_dim, dtype=torch.float32)
        launches[name] = gpu_launch(qk, lambda: qk.rope_cos_sin_cache(positions, q, k, head_dim,
                                                                      cache, True))
    return launches


@read_on_checked
def test_head_count_plans_hold_q_and_k_in_registers(compiled_modules):
    """``HEAD_COUNT_TILES``'s plans compiled for sm_90, where they were measured, keep their
    tiles in registers: no local memory, no stack (loads first at 20 q / 20 k heads of 128 on 2
    warps holds two 32-head blocks: 168 registers a thread on Triton 3.6; so does Phi-3 mini's
    32 / 32 of 96, padded to 128 channels)."""
    qk = compiled_modules["rope_qk"]
    launches = head_count_launches(qk)
    modes = {name: (plan.constexprs, plan.num_warps) for name, (plan, _) in launches.items()}
    for name in ("hf 20q/20k", "hf hd96 32q/32k", "cache hd96 32q/32k"):
        assert modes[name][0]["LOADS_FIRST"] and modes[name][0]["BLOCK_H"] == 32, name
    assert modes["hf 14q/2k"][0]["LOADS_FIRST"] and modes["hf 14q/2k"][0]["BLOCK_S"] == 2
    assert (modes["cache 28q/4k"][0]["BLOCK_S"], modes["cache 28q/4k"][0]["BLOCK_H"]) == (2, 4)
    four = ("cache 20q/20k", "cache hd96 32q/32k")
    assert all(warps == (4 if name in four else 1 if name == "hf 9q/3k" else 2)
               for name, (_, warps) in modes.items())
    for name, launch in launches.items():
        usage = cuobjdump(compile_qk(qk, launch), "-res-usage")
        assert re.search(r"STACK:0 ", usage) and re.search(r"LOCAL:0\b", usage), (name, usage)


@read_on_checked
@in_compiled_process
@pytest.mark.parametrize("capability", OTHER_GPUS, ids=lambda c: f"sm_{c}")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_qk_serving_and_hf_compiles_for_other_gpus(compiled_modules, capability, dtype):
    """The serving and Hugging Face plans, as the entry points make them for a GPU: the cache's
    per-token positions, FlashInfer's angles from a frequency per pair (SFU cos/sin in 16-bit),
    interleaved pairs read as words, Cohere's loads-first programs, GLM's
    table of one entry a pair, GPT-OSS's, OpenAI's privacy filter's and NanoChat's, and the
    tiles of ``HEAD_COUNT_TILES`` (``head_count_launches``)."""
    ptxas_for(capability)
    qk = compiled_modules["rope_qk"]
    launches = serving_and_hf_launches(qk, dtype)
    modes = {name: plan.constexprs for name, (plan, _) in launches.items()}
    for name, launch in head_count_launches(qk, dtype).items():
        assert built_for(compile_qk(qk, launch, capability), capability), name
    assert modes["cache"]["HAS_POSITIONS"] and modes["cache"]["INTERLEAVED"] == 0
    half_split = ("cache", "gpt_oss", "nanochat", "pos_ids")
    assert all(modes[name]["INTERLEAVED"] == (0 if name in half_split else 2) for name in launches)
    assert modes["cohere"]["LOADS_FIRST"] == (dtype != torch.float32)
    assert modes["glm, half rotary"]["ANGLES"] == qk.ANGLES["cos_sin_half"]
    assert modes["gpt_oss"]["ANGLES"] == modes["privacy filter"]["ANGLES"] == modes[
        "glm, half rotary"]["ANGLES"]
    assert modes["nanochat"]["ANGLES"] == qk.ANGLES["cos_sin_neg"]
    for name in ("pos_ids", "pos_ids, interleaved, in place, half rotary"):
        assert modes[name]["ANGLES"] == qk.ANGLES["inv_freq"] and modes[name]["HAS_POSITIONS"]
        assert modes[name]["FAST_TRIG"] == (dtype != torch.float32)
    for name, launch in launches.items():
        assert built_for(compile_qk(qk, launch, capability), capability), name


@pytest.mark.skipif(not INTERPRETING, reason="the count-tile tests run in this process")
def test_thd_count_tiles_in_a_compiled_process():
    assert_passed_in_a_compiled_process("count_tiles_keep", 6)  # the test below


@in_compiled_process
@pytest.mark.parametrize("n_seqs", [32, 64, 128])
@pytest.mark.parametrize("backward", [False, True])
def test_thd_one_warp_count_tiles_keep_the_boundaries_in_registers(compiled_modules, n_seqs,
                                                                   backward):
    """thd, 131072 tokens of 8 heads of 128 in bf16, in 32, 64 and 128 sequences: default_config
    gives tiles of 2 tokens on one warp that count the boundaries, each token loading them
    (``BOUNDS_EACH``). Compiled for sm_90: no shared memory and at most 100 registers (the
    shared load: 512 B and 127-128 registers on 3.9.0; loaded as one [1, BOUNDS] row, 2 KB and
    104-128 registers at 32 sequences on 3.6; 96-100 with neither, on 3.6 to 3.9)."""
    r2 = compiled_modules["rope_2d"]
    t = meta(131072, 8, 128, dtype=torch.bfloat16)
    freqs = meta(8192, 1, 1, 128, dtype=torch.float32)
    cu_seqlens = meta(n_seqs + 1, dtype=torch.int32)
    plan = rope_2d_gpu_plan(r2, t, freqs, "thd", cu_seqlens, backward=backward,
                            config={"fast_trig": True})
    c = plan.constexprs
    assert (plan.num_warps, c["BLOCK_S"], c["BLOCK_H"], c["ROW"], c["TOKEN_ROWS"]) == (
        1, 2, 8, 128, False)
    assert c["SEQ_BOUNDS"] == r2._next_pow2(n_seqs + 1) and c["BOUNDS_EACH"]
    compiled = compile_rope_2d(r2, plan, torch.bfloat16)
    assert compiled.metadata.shared == 0
    assert registers(compiled) <= 100
