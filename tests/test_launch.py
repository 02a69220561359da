"""rope_2d's launch path: launch plans cached by call signature, and (on a GPU) the package's thin
launch (rope_kernels/_launch.py) that calls the kernel Triton compiled for a signature without
going through Triton's dispatch.

The thin launch is only correct if, for a given plan, the kernel it reuses is the one Triton's
dispatch would pick. These tests check exactly that (same CompiledKernel object) over dtypes,
layouts, strides and pointer alignments, that repeated calls with fresh data stay correct, and
that every broken part of its contract falls back to Triton's dispatch.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

from conftest import DEVICE, ON_GPU, assert_rope_close, randn
from rope_kernels import RotaryPositionEmbedding, _launch, rope_2d, rope_reference

# The module (the package exports the function under the same name).
r2 = importlib.import_module("rope_kernels.rope_2d")
_r1 = importlib.import_module("rope_kernels.rope_1d")

gpu = pytest.mark.skipif(not ON_GPU, reason="the thin launch exists only for compiled kernels")


def _views(fmt, dtype, seed):
    """(name, t) pairs of one logical shape: contiguous, strided, and with a pointer that is
    not 16-byte aligned (a view starting one element into its storage)."""
    shape = {"sbhd": (6, 3, 4, 32), "bshd": (3, 6, 4, 32), "thd": (18, 4, 32)}[fmt]
    base = randn((2,) + shape, dtype, seed)
    flat = randn((base.numel() + 1,), dtype, seed + 1)
    return [
        ("contiguous", base[0]),
        ("strided", base.transpose(0, 1)[:, 0] if fmt != "thd" else base[1]),
        ("misaligned", flat[1:].view(base.shape)[0]),
    ]


def _kwargs(fmt):
    if fmt == "thd":
        return {"cu_seqlens": torch.tensor([0, 5, 5, 18], dtype=torch.int32, device=DEVICE)}
    return {}


def _dispatch(plan, pointers):
    """What Triton's own dispatch launches for this plan (and returns, on a GPU)."""
    return r2.rope_2d_kernel[plan.grid](*pointers, *plan.scalars, **plan.constexprs,
                                        num_warps=plan.num_warps, **plan.options)


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("interleaved", [False, True])
def test_repeated_calls_match_reference(fmt, dtype, interleaved, seed):
    """Three calls per view, each on fresh values: the first builds the plan (and, on a GPU, goes
    through Triton's dispatch), the later ones reuse it."""
    kw = _kwargs(fmt)
    emb = RotaryPositionEmbedding(24, interleaved=interleaved, device=DEVICE)(20)
    for name, t in _views(fmt, dtype, seed):
        for call in range(3):
            t.copy_(randn(t.shape, dtype, seed + 10 * call))
            out = rope_2d(t, emb, fmt, interleaved=interleaved, **kw)
            ref = rope_reference(t.double(), emb, fmt, interleaved=interleaved, **kw)
            assert_rope_close(out, ref, dtype, f"{name} view, call {call}")


@gpu
@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_thin_launch_reuses_the_kernel_triton_picks(fmt, dtype, seed, monkeypatch):
    monkeypatch.setattr(r2, "_PLANS", {})  # only this test's plans
    kw = _kwargs(fmt)
    emb = RotaryPositionEmbedding(32, device=DEVICE)(20)
    for name, t in _views(fmt, dtype, seed):
        out = torch.empty_like(t)
        for _ in range(3):  # two dispatches confirm the kernel, the third call takes the thin path
            rope_2d(t, emb, fmt, out=out, **kw)
        plans = [p for k, p in r2._PLANS.items()
                 if k[1] == t.shape and k[2] == t.stride() and k[3] == out.stride()
                 and k[4] == t.dtype and k[0] == fmt]
        assert len(plans) == 1, f"{name}: expected one plan, found {len(plans)}"
        plan = plans[0]
        pointers = (t, emb, out, kw.get("cu_seqlens", t), t)
        cached = _launch.last_compiled(plan, pointers)
        assert cached is not None
        assert _dispatch(plan, pointers) is cached, f"{name}: Triton picked another kernel"


@gpu
def test_misaligned_pointer_gets_its_own_kernel(seed, monkeypatch):
    """A pointer that is not 16-byte aligned must not reuse a kernel compiled assuming it is."""
    monkeypatch.setattr(r2, "_PLANS", {})
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    flat = randn((8 * 2 * 4 * 32 + 1,), torch.bfloat16, seed)
    aligned_t = flat[:-1].view(8, 2, 4, 32)
    shifted_t = flat[1:].view(8, 2, 4, 32)  # same shape and strides, pointer + 2 bytes
    for t in (aligned_t, shifted_t, aligned_t, shifted_t):
        assert_rope_close(rope_2d(t, emb), rope_reference(t.double(), emb), torch.bfloat16)
    key = next(k for k in r2._PLANS if k[1] == aligned_t.shape and k[4] == torch.bfloat16
               and k[2] == aligned_t.stride())
    alignments = {k[1] == 0 for k in r2._PLANS[key].compiled}  # (device, t address % 16, ...)
    assert alignments == {True, False}


@gpu
def test_launch_hook_disables_thin_path(seed):
    """With a Triton launch hook installed (profilers use them), every launch goes through
    Triton's dispatch so that the hook sees it."""
    knobs = pytest.importorskip("triton").knobs
    seen = []
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    for _ in range(3):  # the plan and kernel exist: the next call would take the thin path
        rope_2d(t, emb)
    chain = knobs.runtime.launch_enter_hook
    hook = lambda metadata: seen.append(metadata)  # noqa: E731
    if hasattr(chain, "add"):  # a HookChain (recent Triton)
        chain.add(hook)
    else:
        knobs.runtime.launch_enter_hook = hook
    try:
        rope_2d(t, emb)
    finally:
        if hasattr(chain, "remove"):
            chain.remove(hook)
        else:
            knobs.runtime.launch_enter_hook = chain
    assert len(seen) == 1
    assert not _launch.hooks_installed()


class _Chain:
    """Stands for Triton's HookChain: hooks in ``calls``."""

    def __init__(self, *calls):
        self.calls = list(calls)


class _Runtime:
    """Stands for ``triton.knobs.runtime``: what ``_dispatch_is_plain`` reads."""

    def __init__(self, enter=None, leave=None, debug=False, stages=None):
        self.launch_enter_hook, self.launch_exit_hook = enter, leave
        self.debug, self.add_stages_inspection_hook = debug, stages


class _Kernel:
    def __init__(self, debug=False, pre_run_hooks=()):
        self.debug, self.pre_run_hooks = debug, list(pre_run_hooks)


def _hook(*args):
    return None


@pytest.mark.parametrize("runtime,kernel,plain", [
    (_Runtime(_Chain(), _Chain()), _Kernel(), True),  # recent Triton, nothing installed
    (_Runtime(), _Kernel(), True),  # older Triton: hooks are None by default
    (_Runtime(_Chain(_hook), _Chain()), _Kernel(), False),
    (_Runtime(_Chain(), _Chain(_hook)), _Kernel(), False),
    (_Runtime(_hook, _Chain()), _Kernel(), False),  # a plain callable set as the hook
    (_Runtime(_Chain(), _hook), _Kernel(), False),
    (_Runtime(None, _hook), _Kernel(), False),
    (_Runtime(_Chain(), _Chain(), debug=True), _Kernel(), False),
    (_Runtime(_Chain(), _Chain(), stages=_hook), _Kernel(), False),
    (_Runtime(_Chain(), _Chain()), _Kernel(debug=True), False),
    (_Runtime(_Chain(), _Chain()), _Kernel(pre_run_hooks=[_hook]), False),
    (_Runtime(_Chain(), _Chain()), None, True),  # hooks_installed() asks without a kernel
    (_Runtime(_Chain(_hook), None), None, False),
])
def test_dispatch_is_plain_reads_every_hook(runtime, kernel, plain, monkeypatch):
    """The thin path steps aside whenever Triton's dispatch would do more than launch: a launch
    hook (a HookChain in use or a plain callable), a stage-inspection hook, debug mode, or the
    kernel's own debug flag or pre-run hooks. Runs without a GPU (pure Python)."""
    monkeypatch.setattr(_launch, "_RUNTIME", runtime)
    assert _launch._dispatch_is_plain(kernel) is plain


@pytest.mark.parametrize("mode,plain", [("", True), ("gsan", False), ("fpsan,consan", False)])
@pytest.mark.parametrize("hooks", ["chains", "none"])
def test_dispatch_is_plain_steps_aside_for_a_sanitizer(mode, plain, hooks, monkeypatch):
    """A sanitizer (``triton.knobs.compilation.instrumentation_mode``) is part of the key Triton
    picks a kernel by: with one on, its dispatch compiles an instrumented kernel (on 3.8 and 3.9
    with gsan, one that takes extra arguments), so the thin path must not launch the plain one it
    kept. Both the attribute-read path (hooks as HookChains) and the general one (hooks None)."""
    runtime = _Runtime(_Chain(), _Chain()) if hooks == "chains" else _Runtime()
    monkeypatch.setattr(_launch, "_RUNTIME", runtime)
    monkeypatch.setattr(_launch, "_COMPILATION", types.SimpleNamespace(instrumentation_mode=mode))
    assert _launch._dispatch_is_plain(_Kernel()) is plain
    assert _launch._dispatch_is_plain(None) is plain


def test_dispatch_is_plain_reads_tritons_own_sanitizer_knob(monkeypatch):
    """The knob read above is the one this Triton's dispatch puts into its kernel key."""
    knobs = pytest.importorskip("triton").knobs
    assert _launch._COMPILATION is knobs.compilation
    monkeypatch.setattr(knobs.compilation, "instrumentation_mode", "gsan")
    assert not _launch._dispatch_is_plain(None)
    assert _launch.hooks_installed()


def _confirmed_plan(t, emb):
    """The plan of rope_2d(t, emb) after enough calls for the thin path to own it."""
    r2._PLANS.clear()
    for _ in range(3):
        rope_2d(t, emb)
    (plan,) = r2._PLANS.values()
    (key, entry), = plan.compiled.items()
    assert entry is not None and not isinstance(entry, _launch._Pending)
    return plan, key, entry[0]


@gpu
def test_thin_launch_falls_back_when_the_launcher_rejects_the_call(seed, monkeypatch):
    """A Triton whose CompiledKernel.run takes other arguments: the call must still be right,
    through Triton's dispatch, and the thin path switch itself off with a warning."""
    monkeypatch.setattr(_launch, "ENABLED", True)
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    t = randn((8, 2, 4, 32), torch.bfloat16, seed)
    plan, key, compiled = _confirmed_plan(t, emb)

    class Changed:  # a launcher with another signature
        function, packed_metadata = compiled.function, compiled.packed_metadata

        def run(self, *args):
            raise TypeError(f"function takes exactly {len(args) + 1} arguments")

    plan.compiled[key] = (Changed(), plan.compiled[key][1], None)
    t2 = randn(t.shape, torch.bfloat16, seed + 1)
    with pytest.warns(RuntimeWarning, match="thin launch path off"):
        out = rope_2d(t2, emb)
    assert_rope_close(out, rope_reference(t2.double(), emb), torch.bfloat16)
    assert _launch.ENABLED is False
    out = rope_2d(t2, emb)  # and from now on, Triton's dispatch
    assert_rope_close(out, rope_reference(t2.double(), emb), torch.bfloat16)


@gpu
def test_direct_launch_on_the_triton_it_was_checked_on(seed, monkeypatch):
    """On triton 3.6 to 3.9 the thin path calls the C launch function under CudaLauncher (this
    says whether that path is really taken on the version the GPU runs); elsewhere it must not."""
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(_launch, "ENABLED", True)
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    t = randn((8, 2, 4, 32), torch.bfloat16, seed)
    plan, key, compiled = _confirmed_plan(t, emb)
    direct = plan.compiled[key][2]
    assert (direct is not None) == triton.__version__.startswith(_launch._DIRECT_TRITON)
    if direct is not None:  # 3.6: a C function per kernel; 3.7 to 3.9: one, told how to parse
        assert (direct[3] is None) == triton.__version__.startswith("3.6.")
    t2 = randn(t.shape, torch.bfloat16, seed + 1)
    assert_rope_close(rope_2d(t2, emb), rope_reference(t2.double(), emb), torch.bfloat16)


@pytest.mark.parametrize("version,kind,direct", [
    ("3.6.0", "generated", True), ("3.6.1", "driver", False),
    ("3.7.1", "driver", True), ("3.7.0", "generated", False), ("3.7.1", "wrapped", False),
    ("3.8.0", "driver", True), ("3.8.0", "generated", False), ("3.8.0", "wrapped", False),
    ("3.9.0", "driver", True), ("3.9.0", "wrapped", False),
    ("3.10.0", "driver", False), ("3.5.1", "generated", False)])
def test_direct_call_only_on_the_launchers_it_was_checked_against(version, kind, direct,
                                                                  monkeypatch):
    """(CPU and GPU) The direct call, and with it the shortcuts' own launcher, applies to triton
    3.6's generated C function and to the driver-module function of 3.7 to 3.9; any other version,
    a launch function of the other kind (a tensor-descriptor wrapper on 3.7, say), or a kernel
    that needs scratch memory or was built with a sanitizer gets None and goes through
    CompiledKernel.run."""

    def driver_launch(*args):
        raise AssertionError("not called")

    def generated(*args):
        raise AssertionError("not called")

    generated.__module__ = "__triton_launcher"
    drivers = types.SimpleNamespace(
        active=types.SimpleNamespace(utils=types.SimpleNamespace(launch=driver_launch)))
    monkeypatch.setattr(_launch, "_DRIVERS", drivers)
    monkeypatch.setattr(_launch.triton, "__version__", version)

    class CudaLauncher:  # the attributes _direct reads, as Triton's launcher has them
        global_scratch_size = profile_scratch_size = 0
        launch_cooperative_grid, launch_pdl = False, True
        arg_annotations, kernel_signature = ["annotation"], b"\x01"

        def __init__(self):  # an instance attribute, as Triton sets it
            self.launch = {"generated": generated, "driver": driver_launch,
                           "wrapped": lambda *args: driver_launch(*args)}[kind]

    launcher = CudaLauncher()
    compiled = types.SimpleNamespace(run=launcher,
                                     metadata=types.SimpleNamespace(instrumentation_mode=""))
    found = _launch._direct(compiled)
    assert (found is not None) is direct
    if direct:
        parsing = None if version.startswith("3.6.") else (["annotation"], b"\x01")
        assert found == (launcher.launch, False, True, parsing)
        # 3.8's and 3.9's launchers with gsan on append the sanitizer's state to the arguments.
        launcher.gsan_enabled = True
        assert _launch._direct(compiled) is None
        launcher.gsan_enabled = False
        assert _launch._direct(compiled) == found
        compiled.metadata.instrumentation_mode = "consan"  # any other sanitizer too
        assert _launch._direct(compiled) is None
        compiled.metadata.instrumentation_mode = ""
        launcher.global_scratch_size = 64  # a kernel that needs scratch memory: not direct
        assert _launch._direct(compiled) is None


@gpu
def test_direct_launch_falls_back_when_its_c_function_rejects_the_call(seed, monkeypatch):
    monkeypatch.setattr(_launch, "ENABLED", True)
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    t = randn((8, 2, 4, 32), torch.bfloat16, seed)
    plan, key, compiled = _confirmed_plan(t, emb)

    def changed(*args):  # a C launch function that takes other arguments
        raise TypeError(f"function takes exactly {len(args) + 1} arguments")

    compiled_entry, tail, direct = plan.compiled[key]
    parsing = direct[3] if direct is not None else None
    plan.compiled[key] = (compiled_entry, tail, (changed, False, False, parsing))
    t2 = randn(t.shape, torch.bfloat16, seed + 1)
    with pytest.warns(RuntimeWarning, match="thin launch path off"):
        out = rope_2d(t2, emb)
    assert_rope_close(out, rope_reference(t2.double(), emb), torch.bfloat16)
    assert _launch.ENABLED is False


@gpu
def test_thin_launch_needs_the_same_kernel_twice(seed, monkeypatch):
    """If Triton's dispatch returns another kernel the second time for the same plan, device and
    alignments, something outside the plan's key went into its choice: never reuse it."""
    monkeypatch.setattr(_launch, "ENABLED", True)
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    plan, key, compiled = _confirmed_plan(t, emb)
    plan.compiled[key] = _launch._Pending(object())  # "the first dispatch returned another one"
    rope_2d(t, emb)
    assert plan.compiled[key] is None  # marked: never reuse
    for _ in range(2):  # later calls go through the dispatch and do not re-confirm
        assert_rope_close(rope_2d(t, emb), rope_reference(t.double(), emb), torch.float32)
        assert plan.compiled[key] is None


def test_current_device_is_the_drivers():
    """The thin path asks torch's C function for the current device only where Triton's driver
    would ask torch.cuda.current_device; any other driver is asked itself."""

    class OtherDriver:
        def get_current_device(self):
            return 7

    assert _launch._current_device(OtherDriver()) == 7
    if ON_GPU:
        import triton

        driver = triton.runtime.driver.active
        assert driver.get_current_device is _launch._TORCH_CURRENT_DEVICE
        assert _launch._current_device(driver) == torch.cuda.current_device()


@gpu
def test_thin_launch_steps_aside_for_triton_debug_mode(seed, monkeypatch):
    knobs = pytest.importorskip("triton").knobs
    emb = RotaryPositionEmbedding(32, device=DEVICE)(8)
    t = randn((8, 2, 4, 32), torch.float32, seed)
    _confirmed_plan(t, emb)
    monkeypatch.setattr(knobs.runtime, "debug", True)
    assert not _launch._dispatch_is_plain(r2.rope_2d_kernel)


def test_plan_cache_is_bounded(monkeypatch, seed):
    monkeypatch.setattr(r2, "_MAX_PLANS", 3)
    monkeypatch.setattr(r2, "_PLANS", {})
    emb = RotaryPositionEmbedding(8, device=DEVICE)(16)
    for s in range(1, 8):
        t = randn((s, 1, 1, 8), torch.float32, seed + s)
        assert_rope_close(rope_2d(t, emb), rope_reference(t.double(), emb), torch.float32)
        assert len(r2._PLANS) <= 3


def test_in_place(seed):
    emb = RotaryPositionEmbedding(16, 0.5, device=DEVICE)(12)
    t = randn((12, 2, 3, 32), torch.bfloat16, seed)
    expected = rope_2d(t, emb)
    assert rope_2d(t, emb, out=t) is t
    assert torch.equal(t, expected)


@pytest.mark.parametrize("bad", ["shape", "dtype"])
def test_out_must_match_t(bad, seed):
    emb = RotaryPositionEmbedding(16, device=DEVICE)(12)
    t = randn((12, 2, 3, 16), torch.float32, seed)
    out = torch.empty((12, 2, 3, 8) if bad == "shape" else t.shape,
                      dtype=torch.float32 if bad == "shape" else torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="out must match t"):
        rope_2d(t, emb, out=out)



@pytest.mark.parametrize("head_dim,rotary_dim", [(32, 8), (40, 8), (96, 64), (24, 12), (200, 100)])
@pytest.mark.parametrize("element_size", [2, 4])
@pytest.mark.parametrize("interleaved,tensor_format", [(False, "sbhd"), (False, "bshd"), (True, "sbhd"),
                                                       (False, "thd")])
@pytest.mark.parametrize("on_gpu", [False, True])
def test_block_sizes_are_powers_of_two(head_dim, rotary_dim, element_size, interleaved,
                                       tensor_format, on_gpu):
    """Block sizes are tl.arange sizes: the compiler rejects anything but powers of two (the
    interpreter does not), e.g. for partial rotary with a head width that is not one."""
    for seq_rows, batch, heads in [(1, 1, 1), (7, 3, 5), (4096, 16, 32), (3, 300, 64)]:
        cfg = dict(r2._config(seq_rows, batch, heads, head_dim, rotary_dim, on_gpu,
                              element_size, interleaved, tensor_format))
        for name in ("block_s", "block_b", "block_h", "num_warps"):
            assert cfg[name] >= 1 and cfg[name] & (cfg[name] - 1) == 0, f"{name}={cfg[name]}"
        # no block larger than its axis needs (rounded up to a power of two)
        for name, n in (("block_s", seq_rows), ("block_b", batch), ("block_h", heads)):
            assert cfg[name] <= r2._next_pow2(n), f"{name}={cfg[name]} for {n}"


@pytest.mark.parametrize("head_dim,rotary_dim", [(32, 8), (40, 8), (200, 100)])
def test_1d_default_block_is_a_power_of_two(head_dim, rotary_dim, seed):
    emb = RotaryPositionEmbedding(rotary_dim, device=DEVICE)(5)
    t = randn((5, 2, 3, head_dim), torch.float32, seed)
    assert_rope_close(_r1.rope_1d(t, emb), rope_reference(t.double(), emb), torch.float32)


@pytest.mark.parametrize("on_gpu", [False, True])
def test_config_of_an_empty_launch(on_gpu):
    """Zero rows, batch or heads (an empty tensor) must still give valid block sizes."""
    for sizes in [(0, 1, 2, 2), (5, 0, 2, 8), (5, 2, 0, 8)]:
        cfg = dict(r2._config(*sizes, sizes[3], on_gpu, 4, False, "sbhd"))
        assert min(cfg.values()) >= 1


@pytest.mark.parametrize("fmt,shape", [("sbhd", (0, 2, 3, 8)), ("bshd", (2, 0, 3, 8)),
                                       ("thd", (0, 3, 8))])
def test_empty_input(fmt, shape):
    emb = RotaryPositionEmbedding(8, device=DEVICE)(4)
    kw = {"cu_seqlens": torch.tensor([0, 0], dtype=torch.int32, device=DEVICE)} if fmt == "thd" else {}
    t = torch.empty(shape, device=DEVICE)
    assert rope_2d(t, emb, fmt, **kw).shape == t.shape


@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
def test_padded_batch_group_with_start_positions(fmt, seed):
    """With batch blocks in groups (bshd: pairs), an odd batch leaves padded programs in the last
    group: they must store nothing and read no start position past the end. The element after
    start_positions is a sentinel that an unmasked read would turn into an angle-table row about
    8 GB past the table. (The hypothesis test hit that as an illegal memory access on the H200;
    whether this test faults without the mask depends on what memory lies there.)"""
    batch, seq, heads, d = 3, 5, 2, 16
    emb = RotaryPositionEmbedding(d, device=DEVICE)(seq + 4)
    shape = (seq, batch, heads, d) if fmt == "sbhd" else (batch, seq, heads, d)
    t = randn(shape, torch.float32, seed)
    buf = torch.tensor([1, 4, 0, 2**27 - 1], dtype=torch.int32, device=DEVICE)
    starts = buf[:batch]
    for config in (None, dict(block_b=1, group_b=2)):
        out = rope_2d(t, emb, fmt, start_positions=starts, config=config)
        ref = rope_reference(t.double(), emb, fmt, start_positions=starts)
        assert_rope_close(out, ref, torch.float32)


def _interleaved_layouts(dtype, seed):
    """(name, t, out, pairs as words?) for interleaved rotation of [s, b, h, d] with d = 20 and
    rotary_dim 12 (so 8 channels are copied through): the layouts that allow one word per pair
    and those that fall back to splitting a [..., HALF, 2] tile."""
    s, b, h, d = 5, 3, 4, 20
    t = randn((s, b, h, d), dtype, seed)
    flat = randn((t.numel() + 1,), dtype, seed + 1)
    wide = randn((s, b, h, d + 1), dtype, seed + 2)
    poison = lambda x: torch.full_like(x, float("nan"))  # noqa: E731
    out_flat = torch.full((t.numel() + 1,), float("nan"), dtype=dtype, device=DEVICE)
    return [
        ("contiguous", t, poison(t), True),
        ("heads transposed", t.transpose(1, 2).contiguous().transpose(1, 2), poison(t), True),
        ("odd address of t", flat[1:].view(t.shape), poison(t), False),
        ("odd address of out", t, out_flat[1:].view(t.shape), False),
        ("odd head stride", wide[..., :d], poison(t), False),
        ("channels strided", t.transpose(2, 3).contiguous().transpose(2, 3), poison(t), False),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backward", [False, True])
def test_interleaved_pairs_as_words_and_fallback(dtype, backward, seed):
    """Interleaved pairs are read as one 32-bit (64-bit for float32) word each when the layout
    allows, and split from a [..., HALF, 2] tile otherwise. Both paths, with channels copied
    through, against the float64 reference; the chosen path is checked too, so neither can be
    silently lost."""
    emb = RotaryPositionEmbedding(12, interleaved=True, device=DEVICE)(8)
    for name, t, out, words in _interleaved_layouts(dtype, seed):
        assert r2._pairs_as_words(t, out) is words, name
        before = t.clone()
        r2._PLANS.clear()  # so that the one plan left afterwards is this call's
        rope_2d(t, emb, "sbhd", interleaved=True, backward=backward, out=out)
        ref = rope_reference(t.double(), emb, "sbhd", interleaved=True)
        if backward:  # R(-theta): the reference with the angles negated
            ref = rope_reference(t.double(), -emb, "sbhd", interleaved=True)
        assert_rope_close(out, ref, dtype, f"{name} ({'words' if words else 'split'})")
        assert torch.equal(t, before), f"{name}: t was modified"
        (plan,) = r2._PLANS.values()
        assert plan.constexprs["PAIRS_AS_WORDS"] is words, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cp_size,starts", [(1, False), (1, True), (2, False), (2, True)])
@pytest.mark.parametrize("backward", [False, True])
@pytest.mark.parametrize("pre_pass_programs,pre_pass_tokens,count_bounds_max",
                         [(1024, 256, 256), (3, 4, 1)])
def test_thd_token_rows_pre_pass(dtype, cp_size, starts, backward, pre_pass_programs,
                                 pre_pass_tokens, count_bounds_max, seed, monkeypatch):
    """Packs of many sequences: the pre-pass that writes each token's table row gives what the
    in-kernel search gives and what the reference gives, empty sequences, context parallelism
    and start positions included. By default one pre-pass program takes every sequence; with
    about 3 programs of 4 sequences, walked 4 tokens a step, each program searches 2 steps and
    walks several, the last one's block partial. The in-kernel search is the count of
    boundaries (COUNT_BOUNDS_MAX 256: 16 boundary slots for these 8-10 sequences) or, with
    COUNT_BOUNDS_MAX 1, the binary search."""
    monkeypatch.setattr(r2, "PRE_PASS_PROGRAMS", pre_pass_programs)
    monkeypatch.setattr(r2, "PRE_PASS_TOKENS", pre_pass_tokens)
    monkeypatch.setattr(r2, "COUNT_BOUNDS_MAX", count_bounds_max)
    r2._PRE_PLANS.clear()
    lengths = [4, 0, 6, 2, 8, 0, 2, 4, 12, 2] if cp_size == 1 else [4, 0, 8, 4, 12, 0, 4, 8]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32,
                      device=DEVICE)
    n = len(lengths)
    sp = (torch.randint(0, 5, (n,), generator=torch.Generator().manual_seed(seed),
                        dtype=torch.int32).to(DEVICE) if starts else None)
    emb = RotaryPositionEmbedding(16, 0.5, device=DEVICE)(40)
    t = randn((int(cu[-1]) // cp_size, 3, 16), dtype, seed)
    ref = rope_reference(t.double(), -emb if backward else emb, "thd", sp, False, cu, cp_size, 1 % cp_size)
    outs = []
    for token_rows in (False, True):
        r2._PLANS.clear()
        out = rope_2d(t, emb, "thd", sp, cu_seqlens=cu, cp_size=cp_size, cp_rank=1 % cp_size,
                      backward=backward, config=dict(token_rows=token_rows))
        (plan,) = r2._PLANS.values()
        assert plan.constexprs["TOKEN_ROWS"] is token_rows
        counts = not token_rows and count_bounds_max > 1
        assert plan.constexprs["SEQ_BOUNDS"] == (16 if counts else 0)
        assert_rope_close(out, ref, dtype, f"token_rows={token_rows}")
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("cp_size,starts", [(1, False), (2, True)])
def test_thd_pre_pass_on_a_large_pack(cp_size, starts, seed):
    """1500 sequences of 0-3 tokens (doubled for cp_size 2), past TOKEN_ROWS_ABOVE, so the default
    takes the pre-pass, in 750 programs of 2 sequences. Against the reference, output poisoned
    with NaN."""
    g = torch.Generator().manual_seed(seed)
    n = 1500
    lengths = torch.randint(0, 4, (n,), generator=g) * cp_size * 2
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32).to(DEVICE)
    sp = torch.randint(0, 5, (n,), generator=g, dtype=torch.int32).to(DEVICE) if starts else None
    emb = RotaryPositionEmbedding(8, device=DEVICE)(32)
    t = randn((int(cu[-1]) // cp_size, 2, 8), torch.float32, seed)
    r2._PLANS.clear()
    r2._PRE_PLANS.clear()
    out = torch.full_like(t, float("nan"))
    rope_2d(t, emb, "thd", sp, cu_seqlens=cu, cp_size=cp_size, cp_rank=cp_size - 1, out=out)
    (plan,) = r2._PLANS.values()
    assert plan.constexprs["TOKEN_ROWS"] is True
    (pre,) = r2._PRE_PLANS.values()
    assert pre.grid[0] == 750 and pre.constexprs["SEQS"] == 2  # 1500 sequences, 2 a program
    assert_rope_close(out, rope_reference(t.double(), emb, "thd", sp, False, cu, cp_size,
                                          cp_size - 1), torch.float32)


def _token_rows_reference(cu, n_tokens, starts, cp_size, cp_rank):
    """Each token's table row, from torch.searchsorted (what thd_positions_kernel writes)."""
    local_cu = cu.long().cpu() // cp_size
    token = torch.arange(n_tokens)
    seq = torch.searchsorted(local_cu, token, right=True) - 1
    begin = local_cu[seq]
    cur_len = local_cu[seq + 1] - begin
    local = token - begin
    half = cur_len // 2
    pos = local if cp_size == 1 else torch.where(
        local < half, local + cp_rank * half, cur_len * cp_size - (cp_rank + 1) * half + local - half)
    return pos + (starts.long().cpu()[seq] if starts is not None else 0)


@pytest.mark.parametrize("seqs,tokens,lengths", [
    (4, 4, "mixed"),     # 2 search steps; runs of 8-20 tokens, walked 4 a step
    (8, 2, "empty"),     # most sequences empty: blocks with no token, steps that span sequences
    (1, 4, "ones"),      # a sequence per program, no search step
    (64, 8, "equal"),    # one program, its window past the last sequence (masked)
    (2, 4, "one long"),  # one sequence of 120 tokens: its program walks 30 steps
    (16, 256, "mixed"),  # steps wider than a program's run (masked)
])
@pytest.mark.parametrize("cp_size,starts", [(1, False), (2, True)])
def test_thd_pre_pass_rows(seqs, tokens, lengths, cp_size, starts, seed):
    """thd_positions_kernel alone against searchsorted, into a poisoned buffer: every token's
    row, whatever the block of sequences a program takes and the tokens a step, empty
    sequences, empty blocks, a long sequence, a partial last block, context parallelism and
    start positions; nothing written past the last token."""
    g = torch.Generator().manual_seed(seed)
    n = 41
    if lengths == "mixed":
        lens = torch.randint(1, 6, (n,), generator=g)
    elif lengths == "empty":
        lens = torch.randint(0, 4, (n,), generator=g) * (torch.rand(n, generator=g) < 0.25)
        lens[-1] = 1
    elif lengths == "equal":
        lens = torch.full((n,), 3, dtype=torch.long)
    elif lengths == "one long":
        lens = torch.randint(0, 3, (n,), generator=g)
        lens[17] = 60
    else:
        lens = torch.ones(n, dtype=torch.long)
    lens = lens * 2 * cp_size
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lens.cumsum(0)]).to(torch.int32)
    sp = torch.randint(0, 9, (n,), generator=g, dtype=torch.int32) if starts else None
    n_tokens = int(cu[-1]) // cp_size
    cp_rank = cp_size - 1
    rows = torch.full((n_tokens + 7,), -12345, dtype=torch.int32, device=DEVICE)
    plan = r2.Plan((-(-n // seqs), 1, 1), (n_tokens, n, cp_size, cp_rank),
                   dict(HAS_START=starts, USE_CP=cp_size > 1, PDL_TRIGGER=False, SEQS=seqs,
                        STEPS=seqs.bit_length() - 1, TOKENS=tokens), 4)
    cu_d = cu.to(DEVICE)
    r2.launch(r2.thd_positions_kernel, plan, (cu_d, sp.to(DEVICE) if starts else cu_d, rows))
    want = _token_rows_reference(cu, n_tokens, sp, cp_size, cp_rank)
    assert torch.equal(rows[:n_tokens].cpu().long(), want)
    assert (rows[n_tokens:] == -12345).all(), "the pre-pass wrote past the last token"


def test_pre_pass_plan_blocks():
    """About PRE_PASS_PROGRAMS programs of a power-of-two block of sequences, every sequence in
    one, and the binary search's steps cover a block."""
    for n_seqs in (129, 1024, 1025, 4096, 65536, 65537):
        plan = r2.pre_pass_plan(8 * n_seqs, n_seqs)
        seqs = plan.constexprs["SEQS"]
        assert seqs & (seqs - 1) == 0 and 2 ** plan.constexprs["STEPS"] == seqs
        assert plan.grid[0] * seqs >= n_seqs > (plan.grid[0] - 1) * seqs
        assert r2.PRE_PASS_PROGRAMS // 2 < plan.grid[0] <= r2.PRE_PASS_PROGRAMS or seqs == 1, n_seqs
        assert plan.constexprs["TOKENS"] == r2.PRE_PASS_TOKENS


def test_pdl_only_where_the_gpu_has_it():
    """Programmatic dependent launch is planned only with the pre-pass, on compiled kernels of a
    compute capability 9.0+ GPU; config={'pdl': False} turns it off."""
    cu = torch.arange(0, 2 * 200 + 1, 2, dtype=torch.int32, device=DEVICE)
    t = randn((400, 2, 8), torch.bfloat16, 0)
    emb = RotaryPositionEmbedding(8, device=DEVICE)(4)
    hopper = ON_GPU and torch.cuda.get_device_capability()[0] >= 9
    for config, token_rows, want in ((None, True, hopper), (dict(pdl=False), True, False),
                                     (dict(token_rows=False), False, False),
                                     (dict(wait_first=True), True, hopper),
                                     (dict(wait_first=True, pdl=False), True, False)):
        r2._PLANS.clear()
        rope_2d(t, emb, "thd", cu_seqlens=cu, config=config)
        (plan,) = r2._PLANS.values()
        assert plan.constexprs["TOKEN_ROWS"] is token_rows
        assert plan.constexprs["PDL_WAIT"] is want
        assert plan.constexprs["WAIT_FIRST"] is (want and bool((config or {}).get("wait_first")))
        assert plan.options == dict(r2.LAUNCH_OPTIONS, **(dict(launch_pdl=True) if want else {}))
        if token_rows:
            (pre,) = (p for k, p in r2._PRE_PLANS.items() if r2._PLANS.get(k) is plan)
            assert pre.constexprs["PDL_TRIGGER"] is want


@pytest.mark.skipif(not ON_GPU or torch.cuda.get_device_capability()[0] < 9,
                    reason="programmatic dependent launch needs a compiled kernel on a GPU of "
                           "compute capability 9.0 or later")
@pytest.mark.parametrize("wait_first", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_pdl_main_kernel_waits_for_the_pre_pass(dtype, wait_first, monkeypatch):
    """With PDL the main kernel starts while the pre-pass runs; it must still read this call's
    token rows. Packs change from call to call with the same shapes (so the token-row buffer
    the allocator hands back holds the previous pack's rows, which a missing wait would read),
    and the pre-pass is made slow and short of programs (16 programs of 4096 sequences, each
    walking its 16384 tokens 32 a step, 12 search steps each): all of its programs start at
    once and let the main kernel start, whose first programs then reach their token rows long
    before the pre-pass has written them. (With the default pre-pass its programs that start
    last write the last tokens, which the main kernel reaches last: a missing wait would rarely
    show.)"""
    monkeypatch.setattr(r2, "PRE_PASS_PROGRAMS", 16)
    monkeypatch.setattr(r2, "PRE_PASS_TOKENS", 32)
    r2._PLANS.clear()
    r2._PRE_PLANS.clear()
    n_seqs, n_tokens = 65536, 262144
    emb = RotaryPositionEmbedding(64, device=DEVICE)(2 * n_tokens)
    t = randn((n_tokens, 2, 64), dtype, 3)
    g = torch.Generator().manual_seed(5)
    outs, refs = [], []
    for _ in range(6):
        cuts = torch.randperm(n_tokens - 1, generator=g)[: n_seqs - 1].sort().values + 1
        cu = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([n_tokens])])
        cu = cu.to(torch.int32).to(DEVICE)
        out = torch.full_like(t, float("nan"))
        rope_2d(t, emb, "thd", cu_seqlens=cu, out=out, config=dict(wait_first=wait_first))
        outs.append(out)
        refs.append(rope_2d(t, emb, "thd", cu_seqlens=cu, config=dict(pdl=False)))
    plan = next(p for p in r2._PLANS.values() if p.constexprs["PDL_WAIT"])
    assert plan.options == dict(r2.LAUNCH_OPTIONS, launch_pdl=True)
    assert plan.constexprs["WAIT_FIRST"] is wait_first
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert torch.equal(out, ref), f"pack {i}: differs from the launch without PDL"
    assert_rope_close(outs[-1], rope_reference(t.double(), emb, "thd", cu_seqlens=cu), dtype)


@pytest.mark.parametrize("cp_size", [1, 2])
@pytest.mark.parametrize("one_warp", [False, True])
@pytest.mark.parametrize("n_seqs", [1, 2, 7, 31, 127, 128, 200])
def test_thd_count_of_boundaries(n_seqs, one_warp, cp_size, seed):
    """Every tile counts the boundaries below its tokens while n_seqs + 1 fits COUNT_BOUNDS_MAX
    (token_rows forced off past TOKEN_ROWS_ABOVE): sequences of 0-5 tokens (x 2 on each of 2
    context-parallel ranks, whose boundaries are cu_seqlens // cp_size), so empty ones repeat
    boundaries, tiles of 4 tokens span several sequences and the last one is partial, and start
    positions come from each token's sequence. Both loads of the boundaries: one shared by the
    tile's tokens (2 warps), and one per token (BOUNDS_EACH: one warp, several tokens).
    Output poisoned with NaN, against the reference."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 6, (n_seqs,), generator=g)
    lengths[-1] += 1  # at least one token
    if int(lengths.sum()) % (2 if cp_size > 1 else 4) == 0:
        lengths[-1] += 1  # a partial last tile of block_s = 4 tokens
    if cp_size > 1:
        lengths = lengths * 2 * cp_size  # global lengths: two equal chunks on each rank
    cu = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(torch.int32).to(DEVICE)
    sp = torch.randint(0, 7, (n_seqs,), generator=g, dtype=torch.int32).to(DEVICE)
    emb = RotaryPositionEmbedding(8, device=DEVICE)(32)
    t = randn((int(cu[-1]) // cp_size, 2, 8), torch.float32, seed)
    assert t.shape[0] % 4  # the last tile is partial
    cp_rank = cp_size - 1
    r2._PLANS.clear()
    out = torch.full_like(t, float("nan"))
    rope_2d(t, emb, "thd", sp, cu_seqlens=cu, out=out, cp_size=cp_size, cp_rank=cp_rank,
            config=dict(token_rows=False, block_s=4, num_warps=1 if one_warp else 2))
    (plan,) = r2._PLANS.values()
    assert plan.constexprs["SEQ_BOUNDS"] == 1 << n_seqs.bit_length()  # next power of 2 >= n + 1
    assert plan.constexprs["BOUNDS_EACH"] is one_warp
    assert plan.constexprs["USE_CP"] is (cp_size > 1)
    ref = rope_reference(t.double(), emb, "thd", sp, cu_seqlens=cu, cp_size=cp_size,
                         cp_rank=cp_rank)
    assert_rope_close(out, ref, torch.float32)


def test_thd_count_slot():
    """The one definition of when tiles count (the plan's SEQ_BOUNDS and default_config's
    one-warp rule): n_seqs + 1 boundaries in the next power of two, while they fit
    COUNT_BOUNDS_MAX and there is no pre-pass."""
    most = r2.COUNT_BOUNDS_MAX
    assert [r2._count_slot(n, False) for n in (0, 1, 2, 3, 31, 32)] == [1, 2, 4, 4, 32, 64]
    assert r2._count_slot(most - 1, False) == most
    assert r2._count_slot(most, False) == 0  # one boundary too many: the binary search
    assert r2._count_slot(7, True) == 0  # the pre-pass's rows instead


def test_thd_one_warp_for_2kb_rows_with_few_sequences(monkeypatch):
    """default_config's thd rule: 16-bit token rows of more than 1 KB and at most 2 KB run on one
    warp when the tiles count the boundaries (at most TOKEN_ROWS_ABOVE sequences) in a slot of at
    least ONE_WARP_MIN_BOUNDS (from 32 sequences at 64); not with fewer or more sequences, other
    rows, float32, or on the CPU. (With ``WHOLE_ROWS`` off, the default; on, it doubles the warps,
    test_default_config_whole_rows.)"""
    monkeypatch.setattr(r2, "WHOLE_ROWS", False)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    cfg = lambda heads, n_seqs, device=gpu, esize=2, d=128: r2.default_config(  # noqa: E731
        65536, 1, heads, d, d, device, esize, False, "thd", n_seqs=n_seqs)
    assert cfg(8, 64)["num_warps"] == 1
    assert cfg(16, 64, d=64)["num_warps"] == 1
    assert cfg(8, r2.TOKEN_ROWS_ABOVE)["num_warps"] == 1
    assert cfg(8, r2.ONE_WARP_MIN_BOUNDS // 2)["num_warps"] == 1  # 33 boundaries: a slot of 64
    for few in (r2.ONE_WARP_MIN_BOUNDS // 2 - 1, 16, 4, 1):  # slots of 32 boundaries or fewer
        assert cfg(8, few)["num_warps"] == 2, few
    without = {k: v for k, v in cfg(8, 64).items() if k != "num_warps"}
    assert without == {k: v for k, v in cfg(8, None).items() if k != "num_warps"}
    for other in (cfg(8, r2.TOKEN_ROWS_ABOVE + 1), cfg(8, None), cfg(32, 64), cfg(4, 64),
                  cfg(8, 64, esize=4), cfg(8, 64, cpu)):
        assert other["num_warps"] != 1, other


def test_thd_policy_pre_pass_and_wait_first():
    """Which thd path a pack takes (scripts/thd_policy.py measured the rules): the pre-pass above
    TOKEN_ROWS_ABOVE sequences, or above WIDE_TOKEN_ROWS_ABOVE for 16-bit token rows wider than
    2 KB; with it, 16-bit rows of more than 1 KB and at most 2 KB wait for it before their x loads
    where sequences average WAIT_FIRST_MEAN_TOKENS tokens or more. Checked through the plan that a
    call makes (WAIT_FIRST needs PDL, so it is False on the CPU and on GPUs without it)."""
    wide, narrow = r2.WIDE_TOKEN_ROWS_ABOVE, r2.TOKEN_ROWS_ABOVE
    assert wide < narrow
    # wide rows count while the count's slot holds at most 64 boundaries (63 sequences)
    assert (r2._count_slot(wide, False), r2._count_slot(wide + 1, False)) == (64, 128)
    for heads, d, esize, n_seqs, want in (
            (16, 128, 2, wide, False), (16, 128, 2, wide + 1, True), (32, 128, 2, wide + 1, True),
            (8, 128, 2, wide + 1, False), (8, 128, 2, narrow, False), (8, 128, 2, narrow + 1, True),
            (8, 128, 4, wide + 1, False), (8, 128, 4, narrow + 1, True),  # fp32 4 KB rows: count
            (32, 64, 2, wide + 1, True), (4, 128, 2, narrow + 1, True)):
        assert r2._token_rows(n_seqs, heads * d * esize, esize) is want, (heads, d, esize, n_seqs)
    mean = r2.WAIT_FIRST_MEAN_TOKENS
    for n_tokens, row_bytes, esize, want in (
            (mean * 256, 2048, 2, True), (mean * 256 - 1, 2048, 2, False),
            (mean * 256, 1024, 2, False), (mean * 256, 4096, 2, False), (mean * 256, 2048, 4, False)):
        assert r2._wait_first(n_tokens, 256, row_bytes, esize) is want, (n_tokens, row_bytes, esize)

    pdl = ON_GPU and r2._pdl_available(torch.device(DEVICE))
    emb = RotaryPositionEmbedding(128, device=DEVICE)(1024)
    for heads, n_tokens, n_seqs, rows, first in ((16, 64, wide + 1, True, False),
                                                  (16, 64, wide, False, False),
                                                  (8, 64 * (narrow + 1), narrow + 1, True, True),
                                                  (8, 4 * (narrow + 1), narrow + 1, True, False)):
        t = randn((n_tokens, heads, 128), torch.bfloat16, 0)
        cu = torch.linspace(0, n_tokens, n_seqs + 1, device=DEVICE).round().to(torch.int32)
        plan = r2._make_plan(t, emb, t.clone(), "thd", cu, None, False, 1, 0, False, None)
        assert plan.constexprs["TOKEN_ROWS"] is rows, (heads, n_tokens, n_seqs)
        assert plan.constexprs["WAIT_FIRST"] is (first and pdl), (heads, n_tokens, n_seqs)
        forced = r2._make_plan(t, emb, t.clone(), "thd", cu, None, False, 1, 0, False,
                               dict(token_rows=True, wait_first=not first))
        assert forced.constexprs["WAIT_FIRST"] is (not first and pdl)


def test_default_config_whole_rows(monkeypatch):
    """By default (``WHOLE_ROWS = False``) 16-bit half-split rows of 256 B or more (head_dim 128
    and up) on a GPU keep the pairs' tile and warps and move them as whole rows, in every format,
    in place and with partial rotary too, except bshd rows of more than 256 B (head_dim 256),
    which keep the pairs. bshd tiles of 4 positions or more gather the
    backward's partner sines in registers (``gather_sines``) where rotary_dim is a power of two.
    fp32, interleaved pairs, 128 B rows and the CPU keep the pairs. With ``WHOLE_ROWS = True`` every format takes whole rows on twice the
    tile's warps (at most 8)."""
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert r2.WHOLE_ROWS is False
    assert r2.WHOLE_ROW_FORMATS == ("sbhd", "bshd", "thd")
    assert (r2.GATHER_SINES_FORMATS, r2.GATHER_SINES_POSITIONS) == (("bshd",), 4)
    # TE's default shape, sbhd bf16: the 2 x 16-head tile of 8 KB on 4 warps, as whole rows.
    assert r2.default_config(4096, 16, 32, 128, 128, gpu, 2, False, "sbhd") == dict(
        block_s=2, block_b=1, block_h=16, group_b=16, num_warps=4, whole_rows=True,
        gather_sines=False, gather=False)
    # bshd: 8 positions x 4 heads on 4 warps, as whole rows whose backward gathers its sines.
    assert r2.default_config(4096, 16, 32, 128, 128, gpu, 2, False, "bshd") == dict(
        block_s=8, block_b=1, block_h=4, group_b=2, num_warps=4, whole_rows=True,
        gather_sines=True, gather=False)
    # bshd in place: one position's 8 heads on 2 warps, as whole rows (one position: no gather).
    assert r2.default_config(4096, 16, 32, 128, 128, gpu, 2, False, "bshd", in_place=True) == dict(
        block_s=1, block_b=1, block_h=8, group_b=1, num_warps=2, whole_rows=True,
        gather_sines=False, gather=False)

    def cfg(*args, whole=False, **kw):
        monkeypatch.setattr(r2, "WHOLE_ROWS", whole)
        return r2.default_config(*args, **kw)

    def pairs_of(config):
        return dict(config, whole_rows=False, gather_sines=False)

    # The default: whole rows on the pairs' warps (the 1-warp thd rule's tile stays on 1 warp);
    # gathered sines in bshd tiles of 4 positions or more.
    assert cfg(131072, 1, 8, 128, 128, gpu, 2, False, "thd", n_seqs=64)["num_warps"] == 1
    for args, kw, gather in (((4096, 16, 32, 128, 128, gpu, 2, False, "sbhd"), {}, False),
                             ((4096, 16, 32, 128, 64, gpu, 2, False, "sbhd"), {}, False),
                             ((4096, 16, 32, 128, 96, gpu, 2, False, "sbhd"), {}, False),
                             ((4096, 16, 32, 128, 128, gpu, 2, False, "sbhd"), {"in_place": True},
                              False),
                             ((4096, 64, 8, 128, 128, gpu, 2, False, "sbhd"), {}, False),  # 4 pos.
                             ((4096, 16, 16, 256, 256, gpu, 2, False, "sbhd"), {}, False),
                             ((65536, 1, 32, 128, 128, gpu, 2, False, "thd"), {"n_seqs": 4096},
                              False),
                             ((131072, 1, 8, 128, 128, gpu, 2, False, "thd"), {"n_seqs": 64},
                              False),
                             ((1, 64, 32, 128, 128, gpu, 2, False, "sbhd"), {}, False),  # decode
                             ((4096, 16, 32, 128, 128, gpu, 2, False, "bshd"), {}, True),
                             ((4096, 16, 32, 128, 64, gpu, 2, False, "bshd"), {}, True),
                             ((4096, 16, 8, 128, 128, gpu, 2, False, "bshd"), {}, False),  # 2 KB
                             ((4096, 16, 8, 128, 96, gpu, 2, False, "bshd"), {}, False),  # 1 pos.
                             ((4096, 16, 32, 128, 96, gpu, 2, False, "bshd"), {}, False),  # 96
                             ((4096, 16, 32, 128, 128, gpu, 2, False, "bshd"), {"in_place": True},
                              False),
                             ((1, 64, 32, 128, 128, gpu, 2, False, "bshd"), {}, False)):  # decode
        default = cfg(*args, **kw)
        assert default["whole_rows"] is True, args
        assert default["gather_sines"] is gather, args
        assert gather is (default["block_s"] >= 4 and args[-1] == "bshd"
                          and args[4] in (64, 128)), args
        # With the flag on: the same tile as whole rows on twice the warps.
        assert cfg(*args, whole=True, **kw) == dict(
            default, num_warps=min(8, 2 * default["num_warps"])), args
    # bshd tiles of several positions whose rotary_dim is not a power of two: whole rows whose
    # backward computes the partners' sines again.
    args = (4096, 16, 32, 128, 96, gpu, 2, False, "bshd")
    default = cfg(*args)
    assert (default["block_s"], default["whole_rows"], default["gather_sines"]) == (4, True, False)
    # bshd rows of more than 256 B keep the pairs (the flag on still takes whole rows).
    assert r2.BSHD_WHOLE_ROW_MAX_BYTES == 256
    args = (4096, 16, 16, 256, 256, gpu, 2, False, "bshd")
    assert cfg(*args) == pairs_of(cfg(*args))
    assert cfg(*args, whole=True)["whole_rows"] is True
    assert cfg(4096, 16, 16, 256, 256, gpu, 2, False, "sbhd")["whole_rows"] is True
    # Never whole rows: fp32, interleaved pairs, 128 B rows, the interpreter.
    for args in ((4096, 16, 32, 128, 128, gpu, 4, False, "sbhd"),  # fp32
                 (4096, 16, 32, 128, 128, gpu, 4, False, "thd"),
                 (4096, 16, 32, 128, 128, gpu, 4, False, "bshd"),
                 (4096, 16, 32, 128, 128, gpu, 2, True, "sbhd"),  # interleaved
                 (4096, 16, 32, 128, 128, gpu, 2, True, "bshd"),
                 (4096, 16, 32, 64, 64, gpu, 2, False, "sbhd"),  # 128 B rows
                 (4096, 16, 32, 64, 64, gpu, 2, False, "thd"),
                 (4096, 16, 32, 64, 64, gpu, 2, False, "bshd"),
                 (4096, 16, 32, 128, 128, cpu, 2, False, "sbhd"),  # the interpreter
                 (4096, 16, 32, 128, 128, cpu, 2, False, "bshd")):
        assert cfg(*args, whole=True) == cfg(*args) == pairs_of(cfg(*args)), args
    # The whole-row default keeps the pairs' tile: only the flag differs from the pairs' rule.
    for fmt in ("sbhd", "bshd"):
        monkeypatch.setattr(r2, "WHOLE_ROW_FORMATS", ())
        pairs = r2.default_config(4096, 16, 32, 128, 128, gpu, 2, False, fmt)
        monkeypatch.undo()
        assert pairs_of(r2.default_config(4096, 16, 32, 128, 128, gpu, 2, False, fmt)) == pairs


def test_whole_rows_default_reaches_the_plan(monkeypatch):
    """A default config with ``whole_rows`` (as with ``WHOLE_ROWS = True``) gives the plan's ``ROW`` (the next power of two of
    head_dim, no separate channels past rotary_dim), and the rotation stays right."""
    monkeypatch.setattr(r2, "_PLANS", {})
    real = r2.default_config
    monkeypatch.setattr(r2, "default_config", lambda *a, **k: dict(real(*a, **k), whole_rows=True))
    freqs = RotaryPositionEmbedding(80, device=DEVICE)(6)
    t = randn((6, 2, 3, 100), torch.bfloat16, 0)
    out = rope_2d(t, freqs, "sbhd")
    (plan,) = r2._PLANS.values()
    assert (plan.constexprs["ROW"], plan.constexprs["PASS"]) == (128, 0)
    assert_rope_close(out, rope_reference(t.double(), freqs, "sbhd"), torch.bfloat16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["sbhd", "bshd"])
@pytest.mark.parametrize("head_dim, rotary_dim", [(20, 12), (20, 16), (32, 32)])
def test_whole_rows_with_a_table_whose_halves_differ(dtype, fmt, head_dim, rotary_dim):
    """Whole rows take channel c's angle from the table's column c, as the pairs' path does, so an
    angle table whose two halves differ (any freqs TransformerEngine accepts) rotates the same:
    forward against the float64 reference, backward against autograd through it, with the pairs,
    with whole rows, and with whole rows whose backward gathers the partners' sines in registers
    (``gather_sines``; a power-of-two rotary_dim: here 16 of 20 and 32 of 32; 12 falls back to
    computing them again). A gather that took a channel's own sine, or the wrong channel's,
    would fail the backward here, where RoPE's own tables (two equal halves) would not show it."""
    shape = (5, 3, 2, head_dim) if fmt == "sbhd" else (3, 5, 2, head_dim)
    t = randn(shape, dtype, 0)
    grad = randn(shape, dtype, 1)
    freqs = 3 * randn((9, 1, 1, rotary_dim), torch.float32, 2)  # halves differ
    t64 = t.double().requires_grad_(True)
    ref = rope_reference(t64, freqs, fmt)
    ref.backward(grad.double())
    for config in ({"whole_rows": False}, {"whole_rows": True, "gather_sines": False},
                   {"whole_rows": True, "gather_sines": True, "block_s": 4}):
        for backward, want in ((False, ref.detach()), (True, t64.grad)):
            r2._PLANS.clear()
            out = torch.full_like(t, float("nan"))
            rope_2d(grad if backward else t, freqs, fmt, backward=backward, out=out,
                    config=config)
            (plan,) = r2._PLANS.values()
            gathered = config.get("gather_sines") and backward and rotary_dim != 12
            assert plan.constexprs["GATHER_SINES"] == (rotary_dim if gathered else 0)
            assert_rope_close(out, want, dtype, f"{config} backward={backward}")


def test_thd_default_takes_the_pre_pass_for_many_sequences(monkeypatch):
    monkeypatch.setattr(r2, "TOKEN_ROWS_ABOVE", 3)
    r2._PLANS.clear()
    emb = RotaryPositionEmbedding(8, device=DEVICE)(8)
    for cu, expected in (([0, 2, 5, 8], False), ([0, 2, 3, 5, 8], True)):
        t = randn((8, 1, 8), torch.float32, 0)
        cu = torch.tensor(cu, dtype=torch.int32, device=DEVICE)
        assert_rope_close(rope_2d(t, emb, "thd", cu_seqlens=cu),
                          rope_reference(t.double(), emb, "thd", cu_seqlens=cu), torch.float32)
        plan = r2._PLANS[next(reversed(r2._PLANS))]
        assert plan.constexprs["TOKEN_ROWS"] is expected


# Every entry point once, in a fresh process: its results saved for a bitwise comparison.
# argv: output path, "pinned" or "unpinned" (the package's LAUNCH_OPTIONS emptied: the control).
_FP_FUSION_SCRIPT = r"""
import importlib, sys
import torch
import rope_kernels
from rope_kernels import hf

import triton
import triton.language as tl


@triton.jit
def mul_add(a_ptr, b_ptr, c_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(y_ptr + i, tl.load(a_ptr + i, mask=m) * tl.load(b_ptr + i, mask=m)
             + tl.load(c_ptr + i, mask=m), mask=m)


options = {"enable_fp_fusion": True}
if sys.argv[2] == "unpinned":
    options = {}
    for name in ("rope_kernels.rope_2d", "rope_kernels.rope_qk"):
        importlib.import_module(name).LAUNCH_OPTIONS.clear()
g = torch.Generator(device="cuda").manual_seed(0)
out = {}
# The control's own kernel: a * b + c, fused or not as the options and the environment say (the
# package's kernels write their rotations as tl.fma, which no setting unfuses).
a, b, c = (torch.randn(1 << 16, device="cuda", generator=g) for _ in range(3))
y = torch.empty_like(a)
mul_add[(64,)](a, b, c, y, a.numel(), BLOCK=1024, **options)
out["mul_add"] = y
for dtype in (torch.float32, torch.bfloat16):
    rnd = lambda *shape: torch.randn(shape, device="cuda", dtype=dtype, generator=g)
    freqs = rope_kernels.RotaryPositionEmbedding(64)(256).cuda()
    t = rnd(256, 2, 4, 64)
    out[f"2d {dtype}"] = rope_kernels.apply_rotary_pos_emb(t, freqs, "sbhd", fused=True)
    out[f"1d {dtype}"] = rope_kernels.apply_rotary_pos_emb(t, freqs, "sbhd", fused=True,
                                                          kernel="1d")
    qkv = rnd(256, 2, 2, 4 * 64)
    out[f"qkv {dtype}"] = torch.cat(rope_kernels.apply_fused_qkv_rotary_pos_emb(
        qkv, freqs, freqs, [2 * 64, 64, 64]), 2)
    q, k = rnd(512, 4 * 64), rnd(512, 2 * 64)
    angles = freqs[:, 0, 0, :32].float()
    cache = torch.cat((angles.cos(), angles.sin()), -1)
    positions = torch.randint(0, 256, (512,), device="cuda", generator=g)
    out[f"cache {dtype}"] = torch.cat(rope_kernels.apply_rope_with_cos_sin_cache(
        positions, q, k, 64, cache), -1)
    cos, sin = torch.cat((angles, angles), -1).cos()[None], torch.cat((angles, angles), -1).sin()[None]
    qh, kh = rnd(2, 4, 256, 64), rnd(2, 2, 256, 64)
    out[f"hf {dtype}"] = torch.cat(hf.apply_rotary_pos_emb(qh, kh, cos.to(dtype), sin.to(dtype)), 1)
torch.save({k: v.cpu() for k, v in out.items()}, sys.argv[1])
"""


@gpu
def test_fused_multiply_adds_stay_on_whatever_tritons_default(tmp_path):
    """Every kernel is launched with ``enable_fp_fusion=True`` (``LAUNCH_OPTIONS``; rope_1d's
    launch), the default of Triton 3.6-3.9, which 3.9 warns turns off in 3.10: with
    TRITON_DEFAULT_FP_FUSION=0 (3.10's default, early) every entry point gives the same bits as
    with Triton's default, and no launch leaves Triton to choose (3.9's warning). Control: with the
    package's options emptied, the same setting changes some results (a * b + c of the script's
    own kernel, launched without the option, at least), so the comparison can fail."""
    import os
    import subprocess
    import sys

    script = tmp_path / "fp_fusion.py"
    script.write_text(_FP_FUSION_SCRIPT)

    def run(name, pinning, fusion_default):
        env = dict(os.environ, TRITON_CACHE_DIR=str(tmp_path / f"cache_{name}"))
        env.pop("TRITON_DEFAULT_FP_FUSION", None)
        if fusion_default is not None:
            env["TRITON_DEFAULT_FP_FUSION"] = fusion_default
        path = tmp_path / f"{name}.pt"
        done = subprocess.run([sys.executable, str(script), str(path), pinning], env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return torch.load(path), done.stderr

    default, stderr = run("default", "pinned", None)
    assert "TRITON_DEFAULT_FP_FUSION" not in stderr, stderr[-3000:]
    off, _ = run("off", "pinned", "0")
    for key, ref in default.items():
        assert torch.equal(off[key], ref), f"{key}: TRITON_DEFAULT_FP_FUSION=0 changed the result"
    control, _ = run("control", "unpinned", "0")
    assert any(not torch.equal(control[key], default[key])
               for key in default if not key.startswith("1d")), \
        "with the options emptied, fusion off should change some result: the test cannot fail"


@pytest.mark.parametrize("fmt", ["sbhd", "bshd", "thd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim, rotary_dim", [(80, 20), (96, 24), (20, 12), (64, 8)])
def test_rope_2d_gathered_partners(fmt, dtype, head_dim, rotary_dim, seed, monkeypatch):
    """rotary_dim not a multiple of 16 (``GATHERED_PARTNERS``, the kernel's ``GATHER``): whole
    rows cut at the rotary block (``ROW`` the power of two >= rotary_dim, at least 16; ``PASS``
    the one >= the channels after it, 0 where none are left), the partners gathered in
    registers, with start positions where TransformerEngine allows them (context parallelism in
    thd). Forward and backward into NaN-poisoned outputs against the float64 reference and
    autograd through it (a table whose halves differ, so that a partner taken from the wrong
    channel shows), the same bits with the switch off (the pairs' tile), and the backward's
    partner sines gathered (``gather_sines``, rotary_dim 8, a power of two) or computed again.
    In place (``out=t``: the heads narrowed to rotary_dim, the rest neither read nor written) the
    narrowed rows are gathered too (``IN_PLACE_GATHER``: ROW the rotary block, PASS 0, the kernel
    told of rotary_dim's multiple), the same bits as out of place, with the switch off too."""
    monkeypatch.setattr(r2, "_PLANS", {})
    kw = {}
    if fmt == "thd":
        kw = dict(cu_seqlens=torch.tensor([0, 4, 4, 16], dtype=torch.int32, device=DEVICE),
                  cp_size=2, cp_rank=1)
        shape = (8, 3, head_dim)
    else:
        shape = (6, 3, 2, head_dim) if fmt == "sbhd" else (3, 6, 2, head_dim)
        kw["start_positions"] = torch.tensor([5, 0, 17], dtype=torch.int32, device=DEVICE)
    t = randn(shape, dtype, seed)
    grad = randn(shape, dtype, seed + 1)
    freqs = 3 * randn((40, 1, 1, rotary_dim), torch.float32, seed + 2)  # halves differ
    t64 = t.double().requires_grad_(True)
    ref = rope_reference(t64, freqs, fmt, **kw)
    ref.backward(grad.double())
    block = max(16, 1 << (rotary_dim - 1).bit_length())
    for backward, x, want in ((False, t, ref.detach()), (True, grad, t64.grad)):
        results = {}
        for gathered in (True, False):
            monkeypatch.setattr(r2, "GATHERED_PARTNERS", gathered)
            r2._config.cache_clear()
            r2._PLANS.clear()
            out = torch.full_like(x, float("nan"))
            rope_2d(x, freqs, fmt, backward=backward, out=out, **kw)
            (plan,) = r2._PLANS.values()
            c = plan.constexprs
            assert c["GATHER"] == gathered, c
            if gathered:
                assert c["ROW"] == block and c["PASS"] == (
                    1 << (head_dim - block - 1).bit_length() if head_dim > block else 0), c
            results[gathered] = out
        assert_rope_close(results[True], want, dtype, f"backward={backward}")
        assert torch.equal(results[True], results[False]), backward
        monkeypatch.setattr(r2, "GATHERED_PARTNERS", True)
        for in_place_gather in (True, False):
            monkeypatch.setattr(r2, "IN_PLACE_GATHER", in_place_gather)
            r2._config.cache_clear()
            r2._PLANS.clear()
            y = x.clone()
            rope_2d(y, freqs, fmt, backward=backward, out=y, **kw)
            (plan,) = r2._PLANS.values()
            c = plan.constexprs
            assert c["GATHER"] == in_place_gather and plan.scalars[3:5] == (rotary_dim,) * 2, c
            if in_place_gather:
                assert (c["ROW"], c["PASS"]) == (block, 0), c
                assert c["CHANNEL_MULTIPLE"] == min(8, rotary_dim & -rotary_dim), c
            assert torch.equal(y, results[True]), (backward, in_place_gather)
        monkeypatch.setattr(r2, "IN_PLACE_GATHER", True)
        for gather_sines in (True, False):
            out = torch.full_like(x, float("nan"))
            rope_2d(x, freqs, fmt, backward=backward, out=out,
                    config={"gather_sines": gather_sines, "block_s": 4}, **kw)
            assert torch.equal(out, results[True]), (backward, gather_sines)


def test_default_config_gathers_partners_only_where_rotary_dim_is_unaligned(monkeypatch):
    """``gather`` (whole rows, the partners gathered in registers): half-split pairs with part of
    the head rotated and rotary_dim not a multiple of 16, in 16-bit and float32, on a GPU and in
    the interpreter, every format; not with interleaved pairs, the whole head rotated, a
    multiple of 16, or the switch off. In sbhd and in the interpreter the tile is the pairs', on
    2 warps at most (the pairs' 4 warps ran 0.66-0.89 of copy, 2 warps 0.86-0.97:
    figures/rope2d_gathered_h200.json); on a GPU in bshd and thd, out of place, in 16-bit, the
    tiles of ``GATHERED_TILES`` on 1 warp, heads first: rows of 160-192 B (80 or 96 channels) 16
    to a program (1 position or token x 16 heads, 2 x 8 with 8 heads, 4 x 4 with 4), in bshd
    rows of 193-320 B (160 channels) 8 (figures/rope2d_gathered_one_warp_h200.json). Emptied,
    the table gives the pairs' tile again."""
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    tile = ("block_s", "block_b", "block_h", "num_warps")
    for head_dim, rotary_dim in ((80, 20), (96, 24), (160, 40), (20, 12), (64, 8)):
        for args, own_tile in (
                ((4096, 16, 32, head_dim, rotary_dim, gpu, 2, False, "sbhd"), None),
                ((4096, 16, 32, head_dim, rotary_dim, gpu, 4, False, "bshd"), None),
                ((4096, 16, 32, head_dim, rotary_dim, gpu, 2, False, "bshd"),
                 {80: (1, 1, 16, 1), 96: (1, 1, 16, 1), 160: (1, 1, 8, 1)}.get(head_dim)),
                ((4096, 16, 4, head_dim, rotary_dim, gpu, 2, False, "bshd"),
                 {80: (4, 1, 4, 1), 96: (4, 1, 4, 1), 160: (2, 1, 4, 1)}.get(head_dim)),
                ((1, 16, 32, head_dim, rotary_dim, gpu, 2, False, "bshd"),
                 {80: (1, 1, 16, 1), 96: (1, 1, 16, 1), 160: (1, 1, 8, 1)}.get(head_dim)),
                ((1, 16, 4, head_dim, rotary_dim, gpu, 2, False, "bshd"),
                 {80: (1, 1, 4, 1), 96: (1, 1, 4, 1), 160: (1, 1, 4, 1)}.get(head_dim)),
                ((65536, 1, 32, head_dim, rotary_dim, gpu, 2, False, "thd"),
                 (1, 1, 16, 1) if head_dim in (80, 96) else None),
                ((65536, 1, 16, head_dim, rotary_dim, gpu, 2, False, "thd"),
                 (1, 1, 16, 1) if head_dim in (80, 96) else None),
                ((65536, 1, 8, head_dim, rotary_dim, gpu, 2, False, "thd"),
                 (2, 1, 8, 1) if head_dim in (80, 96) else None),
                ((65536, 1, 32, head_dim, rotary_dim, gpu, 4, False, "thd"), None),
                ((65536, 1, 32, head_dim, rotary_dim, cpu, 2, False, "thd"), None)):
            cfg = r2.default_config(*args)
            assert cfg["gather"] and cfg["whole_rows"], (args, cfg)
            assert not r2.default_config(*args[:7], True, *args[8:])["gather"], args
            monkeypatch.setattr(r2, "GATHERED_PARTNERS", False)
            r2._config.cache_clear()
            off = r2.default_config(*args)
            monkeypatch.setattr(r2, "GATHERED_PARTNERS", True)
            r2._config.cache_clear()
            assert not off["gather"]
            if own_tile is None:
                assert {k: cfg[k] for k in tile[:3]} == {k: off[k] for k in tile[:3]}, args
                assert cfg["group_b"] == off["group_b"], args
                assert cfg["num_warps"] == min(2, off["num_warps"]), (args, cfg, off)
            else:
                assert tuple(cfg[k] for k in tile) == own_tile, (args, cfg)
                own_tiles = r2.GATHERED_TILES
                monkeypatch.setattr(r2, "GATHERED_TILES", {})
                pairs = r2.default_config(*args)
                monkeypatch.setattr(r2, "GATHERED_TILES", own_tiles)
                assert {k: pairs[k] for k in tile[:3]} == {k: off[k] for k in tile[:3]}, args
    for head_dim, rotary_dim in ((80, 32), (128, 64), (64, 16), (80, 80), (20, 20)):
        assert not r2.default_config(4096, 16, 32, head_dim, rotary_dim, gpu)["gather"]
    # In place the heads are narrowed to rotary_dim (head_dim is rotary_dim): gathered where it
    # is not a multiple of 16 (IN_PLACE_GATHER), on a GPU in 2 positions x 8 heads on 2 warps.
    for rotary_dim, gathered in ((20, True), (24, True), (12, True), (32, False), (64, False)):
        for fmt, (seq_rows, batch) in (("sbhd", (4096, 16)), ("bshd", (4096, 16)),
                                       ("thd", (65536, 1))):
            for device, esize in ((gpu, 2), (gpu, 4), (cpu, 2)):
                args = (seq_rows, batch, 32, rotary_dim, rotary_dim, device, esize, False, fmt,
                        True, True, 4096 if fmt == "thd" else None)
                cfg = r2.default_config(*args)
                assert cfg["gather"] == gathered, (args, cfg)
                if gathered and device == gpu:
                    tile = {k: cfg[k] for k in ("block_s", "block_b", "block_h", "num_warps")}
                    assert tile == dict(block_s=2, block_b=1, block_h=8, num_warps=2), args
                monkeypatch.setattr(r2, "IN_PLACE_GATHER", False)
                r2._config.cache_clear()
                assert not r2.default_config(*args)["gather"], args
                monkeypatch.setattr(r2, "IN_PLACE_GATHER", True)
                r2._config.cache_clear()
