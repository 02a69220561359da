"""Tensors on a GPU other than the current one: every entry point launches on the tensors' device
and its current stream (and, on one GPU, on the current stream, whichever it is).

Triton launches a kernel on the *current* CUDA device and that device's current stream, whatever
device the tensors are on. A model spread over several GPUs in one process (transformers'
``device_map="auto"``, pipeline stages) calls RoPE with tensors on ``cuda:1`` while ``cuda:0``
is current: launched there, the kernel either fails (Triton's dispatch refuses a pointer the
current device cannot reach) or, with peer access on, runs on the other GPU's stream, unordered
with the work that wrote its inputs. The kernel files' ``launch`` and the package's
``thin_launch`` make the tensors' device current for the launch.

The first test runs everywhere, with stand-ins for the tensor, the kernel and torch's current
device; the others need two GPUs (``nvidia-h100-x2``).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import rope_kernels.flashinfer
import rope_kernels.hf
from conftest import ON_GPU, ROOT, assert_rope_close, load_file, randn
from rope_kernels import (RotaryPositionEmbedding, _launch, apply_fused_qkv_rotary_pos_emb,
                          apply_rope_with_cos_sin_cache, apply_rope_with_cos_sin_cache_inplace,
                          apply_rotary_pos_emb)

# The kernel files as a user copies them: launched through their own ``launch`` (Triton's
# dispatch), which the package replaces with ``thin_launch`` in its own modules.
COPIED = {name: load_file(ROOT / "rope_kernels" / f"{name}.py", f"copied_{name}")
          for name in ("rope_2d", "rope_qk")}

TWO_GPUS = ON_GPU and not _launch.INTERPRETED and torch.cuda.device_count() >= 2
needs_two_gpus = pytest.mark.skipif(not TWO_GPUS, reason="needs two CUDA GPUs")


class _FakeDevices:
    """Stand-ins for torch's current CUDA device: ``current`` and ``switch(i)``, a context that
    makes device i current and restores the previous one, as ``torch.cuda.device`` does."""

    def __init__(self):
        self.current = 0

    @contextlib.contextmanager
    def switch(self, device):
        index = device if isinstance(device, int) else device.index
        previous, self.current = self.current, index
        try:
            yield
        finally:
            self.current = previous


class _FakeTensor:
    def __init__(self, index):
        self.device = torch.device("cuda", index)

    def get_device(self):
        return self.device.index


class _FakeKernel:
    """``kernel[grid](*args, **kw)`` records the device current at the launch."""

    def __init__(self, devices):
        self.devices, self.launched_on = devices, []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.launched_on.append(self.devices.current)


@pytest.mark.parametrize("where", ["rope_2d", "rope_qk", "thin_launch"])
def test_launch_makes_the_tensors_device_current(where, monkeypatch):
    """Each launcher launches with the device of its first pointer argument current, and puts
    the caller's current device back."""
    devices = _FakeDevices()
    if where == "thin_launch":
        monkeypatch.setattr(_launch, "INTERPRETED", False)
        monkeypatch.setattr(_launch, "ENABLED", False)  # Triton's dispatch: the stand-in kernel
        monkeypatch.setattr(_launch, "_cuda_get_device", lambda: devices.current)
        launcher = _launch.thin_launch
    else:
        monkeypatch.setattr(torch.cuda, "current_device", lambda: devices.current)
        launcher = COPIED[where].launch
    monkeypatch.setattr(torch.cuda, "device", devices.switch)
    kernel = _FakeKernel(devices)
    plan = COPIED["rope_qk"].Plan((1, 1, 1), (), {}, 4)
    for tensor_device, current in [(1, 0), (0, 1), (2, 2), (0, 0), (3, 1)]:
        devices.current = current
        launcher(kernel, plan, (_FakeTensor(tensor_device), _FakeTensor(tensor_device)))
        assert kernel.launched_on[-1] == tensor_device, (tensor_device, current)
        assert devices.current == current, "the caller's current device was not put back"


# --------------------------------------------------------------------------------------------
# On two GPUs: each entry point with its tensors on one device while the other is current.


def _inputs(seed):
    """Every entry point's arguments, made on the CPU (moved per device by the cases)."""
    s, b, h, d = 48, 2, 4, 64
    angles = RotaryPositionEmbedding(d)(512).view(512, d)[:, : d // 2]  # the cache's angles
    lengths = torch.randint(1, 9, (200,), generator=torch.Generator().manual_seed(seed))
    return dict(
        sbhd=randn((s, b, h, d), torch.bfloat16, seed, "cpu"),
        freqs=RotaryPositionEmbedding(d, 0.5)(256),
        start=torch.tensor([3, 100], dtype=torch.int32),
        # 200 sequences: the thd call takes the per-token pre-pass (and PDL on Hopper GPUs).
        thd=randn((int(lengths.sum()), h, d), torch.float16, seed + 1, "cpu"),
        cu_seqlens=torch.cat((torch.zeros(1, dtype=torch.int32),
                              lengths.cumsum(0).to(torch.int32))),
        few=torch.tensor([0, 5, 40, 96], dtype=torch.int32),
        qkv=randn((s, b, 2, 6 * d), torch.bfloat16, seed + 2, "cpu"),
        positions=torch.randint(0, 512, (37,), generator=torch.Generator().manual_seed(seed)),
        query=randn((37, 8 * d), torch.bfloat16, seed + 3, "cpu"),
        key=randn((37, 2 * d), torch.bfloat16, seed + 4, "cpu"),
        cache=torch.cat((angles.cos(), angles.sin()), 1),
        hf_q=randn((b, s, 8, d), torch.float32, seed + 5, "cpu"),
        hf_k=randn((b, s, 2, d), torch.float32, seed + 6, "cpu"),
        hf_angles=randn((b, s, d // 2), torch.float32, seed + 7, "cpu"),
        # FlashInfer's ragged batch of the 37 tokens: 3 segments, one empty
        ragged_indptr=torch.tensor([0, 20, 20, 37], dtype=torch.int32),
        ragged_offsets=torch.tensor([5, 0, 3000], dtype=torch.int32),
    )


def _hf_cos_sin(a):
    """Hugging Face's cos and sin, [b, s, d], from the inputs' half-width angles."""
    emb = torch.cat((a["hf_angles"], a["hf_angles"]), -1)
    return emb.cos(), emb.sin()


def _calls(validate):
    """name -> (function of the inputs on one device -> its outputs)."""
    def te(fmt, start=False, **kw):
        def call(a):
            t = {"sbhd": a["sbhd"], "bshd": a["sbhd"].transpose(0, 1), "thd": a["thd"]}[fmt]
            extra = dict(kw, cu_seqlens=a["cu_seqlens"] if fmt == "thd" else None,
                         start_positions=a["start"] if start else None)
            return (apply_rotary_pos_emb(t, a["freqs"], fmt, fused=True, validate=validate,
                                         **extra),)
        return call

    def few_thd(a):
        t = a["thd"][:96]
        return (apply_rotary_pos_emb(t, a["freqs"], "thd", cu_seqlens=a["few"], fused=True,
                                     validate=validate, interleaved=True),)

    def hf(a):
        cos, sin = _hf_cos_sin(a)
        return rope_kernels.hf.apply_rotary_pos_emb(a["hf_q"].transpose(1, 2),
                                                    a["hf_k"].transpose(1, 2), cos, sin)

    def in_place(a):
        q, k = a["query"].clone(), a["key"].clone()
        apply_rope_with_cos_sin_cache_inplace(a["positions"], q, k, 64, a["cache"],
                                              validate=validate)
        return q, k

    return {
        "te sbhd": te("sbhd"),
        "te bshd start_positions": te("bshd", start=True),
        "te bshd 1d kernel": te("bshd", kernel="1d"),
        "te thd pre-pass": te("thd"),
        "te thd few sequences interleaved": few_thd,
        "fused qkv": lambda a: apply_fused_qkv_rotary_pos_emb(a["qkv"], a["freqs"], a["freqs"],
                                                              [4 * 64, 64, 64]),
        "cos/sin cache": lambda a: apply_rope_with_cos_sin_cache(
            a["positions"], a["query"], a["key"], 64, a["cache"], is_neox=False,
            validate=validate),
        "cos/sin cache in place": in_place,
        "flashinfer pos_ids": lambda a: rope_kernels.flashinfer.apply_rope_pos_ids(
            a["query"].unflatten(1, (-1, 64)), a["key"].unflatten(1, (-1, 64)), a["positions"],
            interleave=True),
        "flashinfer ragged": lambda a: rope_kernels.flashinfer.apply_llama31_rope(
            a["query"].unflatten(1, (-1, 64)), a["key"].unflatten(1, (-1, 64)),
            a["ragged_indptr"], a["ragged_offsets"], validate=validate),
        "hugging face": hf,
        "rope_2d file alone, thd pre-pass": lambda a: (COPIED["rope_2d"].rope_2d(
            a["thd"], a["freqs"], "thd", cu_seqlens=a["cu_seqlens"]),),
        "rope_qk file alone": lambda a: COPIED["rope_qk"].rope_cos_sin_cache(
            a["positions"], a["query"], a["key"], 64, a["cache"], True),
    }


CALL_NAMES = list(_calls(True))


def _to(inputs, device):
    return {name: x.to(device) for name, x in inputs.items()}


@needs_two_gpus
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("name", CALL_NAMES)
def test_each_entry_point_on_the_other_gpu(name, validate, seed):
    """The call on cuda:1 with cuda:0 current (and the other way round), repeated so that it
    also goes through the remembered launch, gives the bits of the same call on the current
    device, and leaves the current device as it was."""
    inputs = _inputs(seed)
    call = _calls(validate)[name]
    with torch.cuda.device(0):
        on_current = _to(inputs, "cuda:0")
        for _ in range(3):  # by the third call the signature's launch is armed for cuda:0
            expected = [o.cpu() for o in call(on_current)]
    for current, other in [(0, 1), (1, 0)]:
        with torch.cuda.device(current):
            on_other = _to(inputs, f"cuda:{other}")
            for repeat in range(4):  # the full path, then the shortcut's remembered launch
                outputs = call(on_other)
                assert torch.cuda.current_device() == current
                assert all(o.device == torch.device("cuda", other) for o in outputs)
                for o, e in zip(outputs, expected):
                    assert torch.equal(o.cpu(), e), f"{name}: call {repeat} on cuda:{other}"


@needs_two_gpus
def test_reference_on_the_other_gpu(seed):
    """One call checked against the float64 reference too (the bits above are compared with
    the same call on the current device)."""
    inputs = _to(_inputs(seed), "cuda:1")
    with torch.cuda.device(0):
        out = apply_rotary_pos_emb(inputs["sbhd"], inputs["freqs"], "sbhd", fused=True)
    ref = apply_rotary_pos_emb(inputs["sbhd"].cpu().double(), inputs["freqs"].cpu(), "sbhd")
    assert_rope_close(out.cpu(), ref, torch.bfloat16)


def _each_call_reads_what_was_written(name, call, ready, expected, repeats, writer):
    """``repeats`` times: NaN into a copy of the float inputs, then, on the stream that
    ``writer()`` makes current, a sleep of tens of milliseconds and the real values copied in;
    the call, made at once, must give ``expected`` (the bits of the call on ``ready``). A call
    launched on another stream reads the NaNs."""
    poisoned = {k: x.clone() for k, x in ready.items()}
    for repeat in range(repeats):
        for x in poisoned.values():
            if x.is_floating_point():
                x.fill_(float("nan"))
        with writer():
            torch.cuda._sleep(50_000_000)
            for k, x in poisoned.items():
                x.copy_(ready[k])
        outputs = call(poisoned)
        for o, e in zip(outputs, expected):
            assert torch.equal(o.cpu(), e), f"{name}: call {repeat} read unwritten inputs"


@needs_two_gpus
@pytest.mark.parametrize("name", ["te sbhd", "te bshd 1d kernel", "te thd pre-pass", "fused qkv",
                                  "cos/sin cache", "cos/sin cache in place", "hugging face",
                                  "rope_2d file alone, thd pre-pass", "rope_qk file alone"])
def test_ordered_on_the_tensors_stream(name, seed):
    """The inputs are written on cuda:1's stream behind a long sleep, and the call is made with
    cuda:0 current: launched on the tensors' device and stream, it reads them after they are
    written. (Launched on cuda:0's stream with peer access on, it would read the NaNs the
    inputs held before.)"""
    inputs = _inputs(seed)
    call = _calls(False)[name]
    with torch.cuda.device(0):
        expected = [o.cpu() for o in call(_to(inputs, "cuda:0"))]
    ready = _to(inputs, "cuda:1")
    torch.cuda.synchronize(1)
    with torch.cuda.device(0):
        for peer in (0, 1):  # peer access on both ways where the GPUs have it
            if torch.cuda.can_device_access_peer(peer, 1 - peer):
                torch.empty(1, device=f"cuda:{peer}").copy_(
                    torch.ones(1, device=f"cuda:{1 - peer}"))
        _each_call_reads_what_was_written(name, call, ready, expected, 3,
                                          writer=lambda: torch.cuda.device(1))


@pytest.mark.skipif(not ON_GPU or _launch.INTERPRETED, reason="needs a GPU")
@pytest.mark.parametrize("name", CALL_NAMES)
def test_ordered_on_a_side_stream(name, seed):
    """One GPU, a side stream current (as a serving loop's own stream): the inputs are written
    on it behind a long sleep, and each call, five times (the full path, then the remembered
    launch, armed from the third call where it arms), launches on it and reads them after they
    are written. (Launched on the default stream, it would read the NaNs they held before.)"""
    inputs = _inputs(seed)
    call = _calls(False)[name]
    ready = _to(inputs, "cuda")
    expected = [o.cpu() for o in call(ready)]
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        _each_call_reads_what_was_written(name, call, ready, expected, 5,
                                          writer=contextlib.nullcontext)
    torch.cuda.synchronize()


@needs_two_gpus
def test_gradients_on_the_other_gpu(seed):
    """Autograd's backward of the TE-style and Hugging Face calls on cuda:1, cuda:0 current."""
    inputs = _inputs(seed)
    results = []
    for device, current in [("cuda:0", 0), ("cuda:1", 0)]:
        a = _to(inputs, device)
        t = a["sbhd"].float().requires_grad_(True)
        q = a["hf_q"].transpose(1, 2).requires_grad_(True)
        cos, sin = _hf_cos_sin(a)
        with torch.cuda.device(current):
            out = apply_rotary_pos_emb(t, a["freqs"], "sbhd", fused=True)
            q_out, k_out = rope_kernels.hf.apply_rotary_pos_emb(q, a["hf_k"].transpose(1, 2),
                                                                cos, sin)
            ((out * out).sum() + (q_out * q_out).sum() + k_out.sum()).backward()
        results.append([t.grad.cpu(), q.grad.cpu()])
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)


@needs_two_gpus
def test_compiled_calls_on_the_other_gpu(seed):
    """Under torch.compile (each entry point one custom operator in the graph), cuda:1 tensors
    with cuda:0 current: the bits of the same compiled calls on cuda:0."""
    inputs = _inputs(seed)

    def step(t, freqs, positions, query, key, cache):
        out = apply_rotary_pos_emb(t, freqs, "sbhd", fused=True, validate=False)
        q, k = apply_rope_with_cos_sin_cache(positions, query, key, 64, cache, validate=False)
        return out, q, k

    compiled = torch.compile(step, fullgraph=True)
    names = ("sbhd", "freqs", "positions", "query", "key", "cache")
    with torch.cuda.device(0):
        expected = [o.cpu() for o in compiled(*(inputs[n].to("cuda:0") for n in names))]
        for repeat in range(2):
            outputs = compiled(*(inputs[n].to("cuda:1") for n in names))
            assert torch.cuda.current_device() == 0
            for o, e in zip(outputs, expected):
                assert o.device == torch.device("cuda", 1)
                assert torch.equal(o.cpu(), e), f"compiled call {repeat} on cuda:1"


def _split_device_map(model, first, second) -> dict:
    """accelerate's device map of a model whose decoder layers are split in two halves: the
    first half and every other module on ``first``, the second half on ``second``."""
    device_map = {}

    def visit(prefix, module):
        for name, child in module.named_children():
            if isinstance(child, torch.nn.ModuleList):
                for i in range(len(child)):
                    device_map[f"{prefix}{name}.{i}"] = first if i < len(child) // 2 else second
            elif any(isinstance(m, torch.nn.ModuleList) for m in child.modules()):
                visit(f"{prefix}{name}.", child)
            else:
                device_map[f"{prefix}{name}"] = first
    visit("", model)
    return device_map


def _sleep_on_cuda_1(module, args):
    with torch.cuda.device(1):
        torch.cuda._sleep(20_000_000)


def _inference(model, ids):
    """Logits of one forward pass and a greedy generation of 5 tokens (a prefill, then decode
    steps with the key-value cache, each a repeated call of the same signature), no gradient."""
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        gen = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    return logits, gen.sequences, torch.stack(gen.scores)


@needs_two_gpus
@pytest.mark.parametrize("arch", ["llama", "gpt_neox"])
def test_transformers_model_split_over_two_gpus(arch, seed, monkeypatch):
    """End to end, what ``device_map="auto"`` does: a tiny transformers model dispatched by
    accelerate over cuda:0 and cuda:1 (one decoder layer on each), cuda:0 current, cuda:1 busy
    (a long kernel on its stream before its layer). With our function assigned over
    transformers', the second layer calls it with cuda:1 tensors; a forward pass, a greedy
    generation (its decode steps take the eager shortcut), and training's logits and every
    gradient match transformers' own function on the same split model. (accelerate's copies
    between the GPUs turn peer access on, so a launch on cuda:0 would read cuda:1's q and k;
    the busy stream makes it read them before they are written.)"""
    accelerate = pytest.importorskip("accelerate", reason="accelerate is a test extra")
    pytest.importorskip("transformers", reason="transformers is a test extra")
    from test_hf import _logits_and_grads, _tiny_model

    config, model, module, ids = _tiny_model(arch, seed)
    device_map = _split_device_map(model, 0, 1)
    model = accelerate.dispatch_model(model, device_map)
    for name, device in device_map.items():
        if device == 1:  # cuda:1 busy: its layer's q and k are written after a long kernel
            model.get_submodule(name).register_forward_pre_hook(_sleep_on_cuda_1)
    calls = set()

    def ours(q, k, *args, **kw):
        calls.add((q.device, torch.cuda.current_device()))
        return rope_kernels.hf.apply_rotary_pos_emb(q, k, *args, **kw)

    with torch.cuda.device(0):
        expected = _inference(model, ids) + _logits_and_grads(model, ids)
        monkeypatch.setattr(module, "apply_rotary_pos_emb", ours)
        got = _inference(model, ids) + _logits_and_grads(model, ids)
    assert calls == {(torch.device("cuda", 0), 0), (torch.device("cuda", 1), 0)}, calls
    (logits, sequences, scores, train_logits, grads) = expected
    (logits2, sequences2, scores2, train_logits2, grads2) = got
    torch.testing.assert_close(logits2, logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(sequences2, sequences)
    torch.testing.assert_close(scores2, scores, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(train_logits2, train_logits, rtol=1e-5, atol=1e-5)
    assert grads2.keys() == grads.keys()
    for name in grads:
        assert grads2[name].device == grads[name].device
        torch.testing.assert_close(grads2[name], grads[name], rtol=1e-4, atol=1e-5, msg=name)
