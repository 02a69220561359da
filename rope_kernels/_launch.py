"""The package's fast launch path for its Triton kernels (the kernel files work without it).

Triton's dispatch, ``kernel[grid](*args)``, costs tens of microseconds of Python per call: it
re-derives the specialisation of every argument each time. A kernel file's launch *plan* already
fixes everything that specialisation depends on except the device and the pointers' 16-byte
alignment (dtypes, sizes and strides are in the plan's key). So once Triton's dispatch has
returned the compiled kernel for a (plan, device, alignments), later calls can hand the
arguments straight to that kernel's C launcher, ``CompiledKernel.run``.

That uses Triton internals, so the contract is checked at run time and any mismatch falls back
to Triton's own dispatch:

- a compiled kernel is reused only after a second dispatch for the same (plan, device,
  alignments) returned the *same* kernel object (so nothing else went into Triton's choice);
- nothing Triton's dispatch would do on the way is active: launch enter/exit hooks (profilers),
  pre-run hooks, a stage-inspection hook, debug mode, a sanitizer (instrumentation mode, which
  makes Triton compile another kernel);
- the compiled kernel has the attributes the call uses (``run``, ``function``,
  ``packed_metadata``), and the launcher accepts the call: a ``TypeError``/``AttributeError``/
  ``ValueError`` from it (raised while parsing arguments, before any launch) switches the thin
  path off for the process with a warning, and that call goes through the dispatch.

On triton 3.6 to 3.9, where the compiled kernel's launcher is the Python wrapper this was
written against (``CudaLauncher`` around a C function: on 3.6 one generated per kernel signature,
on 3.7 to 3.9 the driver module's one for every kernel, given the argument annotations and
signature bytes it parses with; no scratch memory, no tensor descriptors, no sanitizer), the call
goes one step further down, to that C function, with the arguments the wrapper would pass it. Any
other version or launcher is called through ``CompiledKernel.run``.

``RECORDING``: while it is a list, every launch appends ``(kernel, plan, pointers)`` to it. The
public entry points use this to remember, per call signature, the one launch a call makes
(see ``api.py``) as a ``Shortcut``, so that a repeated call goes from its arguments straight to
this function, or, once the shortcut is armed, to a launch plan of the package's own small C
launcher (``_LAUNCH_C``), which takes only the call's tensors and reads their addresses: the
kernel's other parameters are fixed in the plan, checked once against the parameter sizes the
CUDA driver reports for the kernel.

Checked with triton 3.6.0, 3.7.1 (the version torch 2.13's CUDA build pins), 3.8.0 and 3.9.0 on
the GPU machine; CI runs triton 3.7.1 on a CPU, where kernels are interpreted and this path is
never taken. (3.8's launcher is 3.7's plus a sanitizer's extra kernel arguments, refused here,
and 3.9's is 3.8's with one more of them; with torch imported their driver asks torch for the
current device and stream, as 3.6's and 3.7's do.)
"""

from __future__ import annotations

import operator
import os
import struct
import sys
import warnings

import torch
import triton

# The interpreter (no GPU) has no compiled kernels to reuse.
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
ENABLED = True  # set False to always go through Triton's dispatch
SHORTEST = True  # set False to send the shortcuts' launches through thin_launch (Shortcut)
RECORDING = None  # a list while an entry point records the launches of a call
_MISSING = object()
_DRIVERS = triton.runtime.driver
_DRIVER_FIELD = "_active" in getattr(_DRIVERS, "__dict__", ())  # DriverConfig's own field
_torch_cuda = torch.cuda
_cuda_get_device = getattr(torch._C, "_cuda_getDevice", None)
# Triton's CUDA driver asks torch.cuda.current_device; its C function answers the same once CUDA
# is initialised (None: this torch lacks what the shortcut needs).
_TORCH_CURRENT_DEVICE = (torch.cuda.current_device if _cuda_get_device is not None
                         and hasattr(torch.cuda, "_initialized") else None)
_data_ptr = torch.Tensor.data_ptr
_low_bits = (15).__and__  # x -> x & 15
# Inductor's allocation (what its generated code calls): the caching allocator on the current
# CUDA device without the dispatcher (0.1-0.3 us less than torch.empty_like on the H200 hosts
# measured). None where this torch lacks it; then the shortcuts allocate through
# torch.empty_strided.
_TORCH_GUARDS = getattr(getattr(torch._C, "_dynamo", None), "guards", None)
_EMPTY_STRIDED_CUDA = getattr(_TORCH_GUARDS, "_empty_strided_cuda", None)
_TENSOR_GUARDS = getattr(_TORCH_GUARDS, "TensorGuards", None)
_GUARDS_KEPT = None  # whether _TENSOR_GUARDS keeps its contract (tested on first use)


def _guards_for(tensors):
    """torch.compile's tensor guards for ``tensors``, every size and stride static."""
    return _TENSOR_GUARDS(*tensors, dynamic_dims_sizes=[list(x.shape) for x in tensors],
                          dynamic_dims_strides=[list(x.stride()) for x in tensors]).check


def _guards_keep_contract() -> bool:
    """The contract ``tensor_check`` relies on, tried on small CPU tensors: a check accepts
    other tensors with the same metadata, and refuses another dtype, shape, stride, device,
    ``requires_grad`` or a non-tensor in any place."""
    a, b = torch.empty(2, 3), torch.empty(4, dtype=torch.int32)
    check = _guards_for((a, b))
    same = torch.empty(4, dtype=torch.int32)
    refused = [(torch.empty(2, 3, dtype=torch.float64), b), (torch.empty(3, 2), b),
               (torch.empty(3, 2).t(), b), (a[:, :2], b), (torch.empty(1, 2, 3), b),
               (torch.empty(2, 3, requires_grad=True), b), (torch.empty(2, 3, device="meta"), b),
               (a, torch.empty(5, dtype=torch.int32)), (a, torch.empty(4, dtype=torch.int64)),
               (a, None), (None, b), (a, 4)]
    return (check(a, b) is True and check(torch.empty(2, 3), same) is True
            and not any(check(*args) for args in refused))


def tensor_check(tensors):
    """``check(*others)``: True only where each of ``others`` is a tensor with the dtype, device,
    shape, strides, ``requires_grad`` and dispatch keys of the one at its place in ``tensors``.

    It is torch.compile's own tensor guard (C++; for four tensors a third of the time of
    building a key of their metadata in Python and hashing it). It also returns False where one
    tensor object fills two places (torch 2.11 and 2.13). A private torch class, so its
    contract is tried once per process (``_guards_keep_contract``); None where this torch has
    no such class or it fails that test (the caller then keys on the metadata itself).
    """
    global _GUARDS_KEPT
    if _TENSOR_GUARDS is None:
        return None
    try:
        if _GUARDS_KEPT is None:
            _GUARDS_KEPT = _guards_keep_contract()
        return _guards_for(tensors) if _GUARDS_KEPT else None
    except (TypeError, ValueError, RuntimeError, AttributeError):
        _GUARDS_KEPT = False
        return None


class _Pending:
    """The kernel Triton's dispatch returned the first time, awaiting confirmation."""

    __slots__ = ("compiled",)

    def __init__(self, compiled):
        self.compiled = compiled


_RUNTIME = getattr(getattr(triton, "knobs", None), "runtime", None)
_COMPILATION = getattr(getattr(triton, "knobs", None), "compilation", None)


def _dispatch_is_plain(kernel) -> bool:
    """True when Triton's dispatch would do nothing but pick and launch the kernel."""
    try:
        # Recent Triton (3.6 on): the launch hooks are HookChains, empty by default, and a
        # JITFunction has ``debug`` and ``pre_run_hooks``. A sanitizer (instrumentation mode)
        # makes the dispatch pick another kernel. Attribute reads only: this runs on every
        # launch.
        runtime = _RUNTIME
        return not (runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls
                    or runtime.debug or runtime.add_stages_inspection_hook is not None
                    or _COMPILATION.instrumentation_mode or kernel.debug or kernel.pre_run_hooks)
    except AttributeError:
        return _dispatch_is_plain_any(kernel)


def _dispatch_is_plain_any(kernel) -> bool:
    """``_dispatch_is_plain`` for what its attribute reads do not cover: no kernel (None), a
    hook set as a plain callable, no hook attributes of that kind (older Triton)."""
    runtime = _RUNTIME
    if runtime is None:
        return False
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    if ((enter is not None and getattr(enter, "calls", True))
            or (leave is not None and getattr(leave, "calls", True))
            or getattr(runtime, "add_stages_inspection_hook", None) is not None
            or getattr(runtime, "debug", False)
            or getattr(_COMPILATION, "instrumentation_mode", "")):
        return False
    return kernel is None or not (getattr(kernel, "debug", False)
                                  or getattr(kernel, "pre_run_hooks", None))


def hooks_installed() -> bool:
    """True when a Triton launch hook (a profiler, for instance) must see every launch."""
    return not _dispatch_is_plain(None)


def _usable(compiled) -> bool:
    return all(getattr(compiled, name, None) is not None
               for name in ("run", "function", "packed_metadata"))


# Triton versions whose CudaLauncher the direct call and the shortcuts' own launcher were
# checked against on the GPU machine: 3.6 generates a C launch function per kernel signature;
# 3.7 to 3.9 have one C launch function for every kernel, told how to parse the arguments (the
# kernel's parameters are the same in all four: its non-constexpr arguments in order, then the
# global and profile scratch pointers; 3.8 and 3.9 append a sanitizer's state when gsan is on).
_DIRECT_TRITON = ("3.6.", "3.7.", "3.8.", "3.9.")


def _direct(compiled):
    """(C launch function, cooperative, pdl, parsing) when the compiled kernel's launcher is the
    CudaLauncher of triton 3.6 to 3.9 with nothing of its own to do per call (no scratch
    memory to allocate, no tensor descriptors to build, no sanitizer state to pass), else None.
    ``parsing``: None on 3.6; on 3.7 to 3.9 the launcher's (argument annotations, kernel
    signature), which its C function takes."""
    launcher = compiled.run
    c_launch = getattr(launcher, "launch", None)
    version = triton.__version__
    if (type(launcher).__name__ != "CudaLauncher"
            or getattr(launcher, "global_scratch_size", 1) != 0
            or getattr(launcher, "profile_scratch_size", 1) != 0
            or getattr(launcher, "gsan_enabled", False)
            or getattr(getattr(compiled, "metadata", None), "instrumentation_mode", "")):
        return None
    try:
        if version.startswith("3.6."):
            if getattr(c_launch, "__module__", None) != "__triton_launcher":
                return None
            parsing = None
        elif version.startswith(_DIRECT_TRITON):  # 3.7 on
            # The driver module's own launch function: wrap_handle_tensordesc returns it
            # unwrapped when the kernel takes no tensor descriptor.
            if c_launch is not _DRIVERS.active.utils.launch:
                return None
            parsing = (launcher.arg_annotations, launcher.kernel_signature)
        else:
            return None
        return c_launch, bool(launcher.launch_cooperative_grid), bool(launcher.launch_pdl), parsing
    except AttributeError:
        return None


def disable(reason: str) -> None:
    global ENABLED
    if ENABLED:
        warnings.warn(f"rope_kernels: thin launch path off, using Triton's dispatch ({reason})",
                      RuntimeWarning, stacklevel=3)
    ENABLED = False


def _device_index() -> int:
    """torch's current CUDA device (its C function where this torch has it: no Python
    lazy-initialisation check, which a tensor on a GPU has already passed)."""
    return _cuda_get_device() if _cuda_get_device is not None else torch.cuda.current_device()


def _current_device(driver) -> int:
    """The driver's current device. For Triton's CUDA driver, whose get_current_device is
    torch.cuda.current_device, torch's C function gives the same index once CUDA is initialised
    (what that Python function returns after its lazy-initialisation check, 0.2 us less)."""
    if driver.get_current_device is _TORCH_CURRENT_DEVICE and _torch_cuda._initialized:
        return _cuda_get_device()
    return driver.get_current_device()


def thin_launch(kernel, plan, pointers):
    """Launch ``kernel`` for ``plan`` (grid, scalars, constexprs, num_warps, options: launch
    options such as ``launch_pdl``, compiled) on the device of ``pointers[0]``."""
    if not INTERPRETED:
        index = pointers[0].get_device()
        if index >= 0 and index != _device_index():
            # Triton's dispatch and the direct call below launch on the current device and its
            # stream: make the tensors' device current (a model spread over several GPUs in one
            # process, device_map="auto"), as the kernel files' own launch does.
            with torch.cuda.device(index):
                return thin_launch(kernel, plan, pointers)
    if RECORDING is not None:
        RECORDING.append((kernel, plan, pointers))
    thin = ENABLED and not INTERPRETED and _dispatch_is_plain(kernel)
    if thin:
        # The active driver: DriverConfig.active's work, without its property call, once set.
        driver = (_DRIVERS._active if _DRIVER_FIELD else None) or _DRIVERS.active
        device = _current_device(driver)
        # Raw addresses: Triton's launcher takes ints as they are, where for a tensor it calls
        # data_ptr() and asks the driver about the pointer, per argument and call. The key holds
        # each address modulo 16: Triton specialises on 16-byte alignment.
        ptrs = [*map(_data_ptr, pointers)]
        key = (device, *map(_low_bits, ptrs))
        entry = plan.compiled.get(key)
        if entry is not None and entry.__class__ is tuple:
            compiled, tail, direct = entry
            stream = driver.get_current_stream(device)
            try:
                if direct is not None:
                    # CudaLauncher.__call__'s call, its scratch buffers None (none needed).
                    c_launch, cooperative, pdl, parsing = direct
                    if parsing is None:  # triton 3.6
                        c_launch(*plan.grid, stream, compiled.function, cooperative, pdl, None,
                                 None, compiled.packed_metadata, None, None, None, *ptrs, *tail)
                    else:  # triton 3.7 to 3.9
                        c_launch(*plan.grid, stream, compiled.function, cooperative, pdl,
                                 compiled.packed_metadata, None, None, None, None, None,
                                 *parsing, (*ptrs, *tail))
                else:
                    # The arguments JITFunction.run passes: no launch metadata, no hooks (checked).
                    compiled.run(*plan.grid, stream, compiled.function, compiled.packed_metadata,
                                 None, None, None, *ptrs, *tail)
                return compiled
            except (TypeError, AttributeError, ValueError, SystemError) as e:
                disable(f"the compiled kernel's launcher rejected the call: {e}")
                thin = False
    compiled = kernel[plan.grid](*pointers, *plan.scalars, **plan.constexprs,
                                 num_warps=plan.num_warps, **plan.options)
    if thin:
        seen = plan.compiled.get(key, _MISSING)
        if seen is _MISSING:
            plan.compiled[key] = _Pending(compiled) if _usable(compiled) else None
        elif isinstance(seen, _Pending):
            # Confirmed only if Triton's dispatch picked the same kernel the second time; a
            # None entry means "never reuse for this key": keep dispatching.
            plan.compiled[key] = ((compiled, (*plan.scalars, *plan.constexprs.values()),
                                   _direct(compiled))
                                  if compiled is seen.compiled else None)
    return compiled


class Shortcut:
    """The one launch of an eager call signature, from the call's tensors: what a repeated call
    of a public entry point runs instead of its checks and the launcher's planning (``api.py``).

    ``slots`` gives, for each of the kernel's pointer arguments, its index among the call's
    tensors (its inputs, then its new outputs); ``outs`` holds ``(shape, stride, dtype, device)``
    of each new output. The same tensor often fills several pointer arguments (an unused one
    gets a placeholder; an in-place call reads and writes one tensor), so each call asks only
    the distinct tensors for their addresses (``tensors``: their indices; ``used`` gets them);
    ``sources`` says which of those fills each pointer argument.

    Once the thin path has confirmed the kernel for the current device with every pointer
    16-byte aligned, on triton 3.6 to 3.9, the shortcut *arms*: ``ready`` then holds a launch
    plan of this package's own C launcher (``_own_plan``: the kernel's parameters fixed once,
    checked against the parameter list the driver reports). A call takes that shortest path if
    nothing differs from when it was armed: no hook or debug mode, no recording, the same driver
    and current device. It allocates its outputs through the caching allocator directly and
    hands the call's tensors to the plan, which reads the distinct ones' addresses and launches
    unless an address is not 16-byte aligned or another CUDA context is current. Anything else
    goes through ``thin_launch``.
    """

    __slots__ = ("kernel", "plan", "tensors", "used", "sources", "spread", "outs", "alloc",
                 "ready", "check")

    def __init__(self, kernel, plan, slots, outs):
        self.kernel, self.plan, self.outs = kernel, plan, outs
        self.tensors = tuple(sorted(set(slots)))  # the distinct tensors' indices
        self.used = _getter(self.tensors)
        self.sources = tuple(self.tensors.index(i) for i in slots)
        self.spread = _getter(self.sources)
        self.alloc = tuple((shape, stride, dtype) for shape, stride, dtype, _ in outs)
        self.ready = None  # (driver, device, stream_of, launch, launch plan)
        self.check = None  # its signature's tensor check (api._Shortcuts.remember), or False

    def __call__(self, inputs):
        """Launch for ``inputs`` (a tuple of the call's tensors); returns the new outputs."""
        ready = self.ready
        outs = None
        if (ready is not None and SHORTEST and ENABLED and RECORDING is None
                and _dispatch_is_plain(self.kernel) and _DRIVERS._active is ready[0]
                and _cuda_get_device() == ready[1]):
            _, device, stream_of, launch, plan = ready
            outs = [_EMPTY_STRIDED_CUDA(*args) for args in self.alloc]
            try:
                # None: launched; False: not this call (an address not 16-byte aligned, or
                # another CUDA context current), which thin_launch then takes. The launcher
                # reads the distinct tensors' addresses itself.
                if launch(plan, stream_of(device), inputs, outs) is None:
                    return outs
            except (TypeError, AttributeError, ValueError, SystemError) as e:
                disable(f"the shortcut's launcher rejected the call: {e}")
        if outs is None:
            outs = [torch.empty_strided(shape, stride, dtype=dtype, device=device)
                    for shape, stride, dtype, device in self.outs]
        pointers = self.spread(self.used((*inputs, *outs)))
        thin_launch(self.kernel, self.plan, pointers)
        if ready is None:
            self._arm(pointers)
        return outs

    def _arm(self, pointers):
        """Fill ``ready`` if the shortest path applies to this launch's kernel (see above)."""
        driver = _DRIVERS._active if _DRIVER_FIELD else None
        if (not ENABLED or INTERPRETED or driver is None or _EMPTY_STRIDED_CUDA is None
                or driver.get_current_device is not _TORCH_CURRENT_DEVICE
                or not _torch_cuda._initialized):
            return
        device = _cuda_get_device()
        # The cheap condition first: this runs after every launch of a shortcut not yet armed
        # (on every call where the launcher is not the one the direct call was written for).
        entry = self.plan.compiled.get((device, *[0] * len(pointers)))
        if entry is None or entry.__class__ is not tuple or entry[2] is None:
            return
        try:  # the allocation gives what torch.empty_strided would (the contract, checked)
            probes = [_EMPTY_STRIDED_CUDA(shape, stride, dtype)
                      for shape, stride, dtype, _ in self.outs]
        except (TypeError, ValueError, RuntimeError):
            return
        if any((p.shape, p.stride(), p.dtype, p.device) != (shape, stride, dtype, out_device)
               or out_device != torch.device("cuda", device)
               for p, (shape, stride, dtype, out_device) in zip(probes, self.outs)):
            return
        compiled, _, (_, cooperative, pdl, _) = entry
        if cooperative or pdl:
            return
        own = _own_plan(compiled, self.plan, self.sources, self.tensors)
        if own is not None:
            self.ready = (driver, device, driver.get_current_stream, *own)


# The shortcuts' own launcher: Triton's C launch function parses every argument of the kernel
# (up to ~95) on every call; this one fixes all but the pointers once, in a plan, and takes
# (plan, stream, the call's input tensors, its new outputs), asking the distinct tensors for
# their addresses itself. Built with Triton's own build helper (the compiler and headers Triton
# needs for its launchers anyway), once per machine (Triton's cache keeps it).
_LAUNCH_C = r"""
#include "cuda.h"
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#define MAX_PARAMS 256

typedef struct {
  CUcontext context;           /* the context current when the plan was made */
  CUfunction function;
  unsigned grid_x, grid_y, grid_z, block_x, shared;
  int n_params, n_addresses, n_pointers;
  int pointer_param[MAX_PARAMS], pointer_source[MAX_PARAMS];
  int tensor[MAX_PARAMS];      /* per address: its tensor among the call's inputs + outputs */
  PyObject *address_of;        /* tensor -> its address (torch.Tensor.data_ptr) */
  uint64_t values[MAX_PARAMS]; /* each parameter in the low bytes of 8 (little-endian) */
  void *params[MAX_PARAMS];
} Plan;

static void free_plan(PyObject *capsule) {
  Plan *plan = PyCapsule_GetPointer(capsule, "rope_kernels.plan");
  Py_XDECREF(plan->address_of);
  free(plan);
}

/* make_plan(function, grid_x, grid_y, grid_z, block_x, shared, values, sources, tensors,
             address_of):
   values: 8 bytes per kernel parameter; sources: int32 per parameter, the index of its address
   among the call's distinct addresses, or -1 for a fixed value; tensors: int32 per distinct
   address, the index of its tensor among the call's inputs followed by its outputs;
   address_of: called on such a tensor, returns its address. */
static PyObject *make_plan(PyObject *self, PyObject *args) {
  unsigned long long function;
  unsigned grid_x, grid_y, grid_z, block_x, shared;
  Py_buffer values, sources, tensors;
  PyObject *address_of;
  if (!PyArg_ParseTuple(args, "KIIIIIy*y*y*O", &function, &grid_x, &grid_y, &grid_z, &block_x,
                        &shared, &values, &sources, &tensors, &address_of))
    return NULL;
  Py_ssize_t n = values.len / 8, n_addresses = tensors.len / 4;
  Plan *plan = NULL;
  if (values.len != 8 * n || sources.len != 4 * n || tensors.len != 4 * n_addresses
      || n > MAX_PARAMS || n_addresses > MAX_PARAMS || !PyCallable_Check(address_of)) {
    PyErr_SetString(PyExc_ValueError, "make_plan: inconsistent parameter lists");
  } else if (!(plan = calloc(1, sizeof(Plan)))) {
    PyErr_NoMemory();
  } else if (cuCtxGetCurrent(&plan->context) != CUDA_SUCCESS || !plan->context) {
    PyErr_SetString(PyExc_RuntimeError, "make_plan: no current CUDA context");
  } else {
    const uint64_t *value = values.buf;
    const int32_t *source = sources.buf;
    plan->function = (CUfunction)(uintptr_t)function;
    plan->grid_x = grid_x; plan->grid_y = grid_y; plan->grid_z = grid_z;
    plan->block_x = block_x; plan->shared = shared;
    plan->n_params = (int)n; plan->n_addresses = (int)n_addresses;
    Py_INCREF(address_of);
    plan->address_of = address_of;
    for (int i = 0; i < n_addresses; i++) {
      plan->tensor[i] = ((const int32_t *)tensors.buf)[i];
      if (plan->tensor[i] < 0) {
        PyErr_SetString(PyExc_ValueError, "make_plan: a negative tensor index");
        break;
      }
    }
    for (int i = 0; i < n && !PyErr_Occurred(); i++) {
      plan->values[i] = value[i];
      plan->params[i] = &plan->values[i];
      if (source[i] >= n_addresses) {
        PyErr_SetString(PyExc_ValueError, "make_plan: an address index out of range");
        break;
      }
      if (source[i] >= 0) {
        plan->pointer_param[plan->n_pointers] = i;
        plan->pointer_source[plan->n_pointers++] = source[i];
      }
    }
  }
  PyBuffer_Release(&values);
  PyBuffer_Release(&sources);
  PyBuffer_Release(&tensors);
  if (PyErr_Occurred()) {
    if (plan) Py_XDECREF(plan->address_of);
    free(plan);
    return NULL;
  }
  return PyCapsule_New(plan, "rope_kernels.plan", free_plan);
}

/* launch(plan, stream, inputs, outputs): inputs and outputs each a tuple or a list of the
   call's tensors (None where a tensor is absent and no address comes from it). None once
   launched; False, launching nothing, when an address is not 16-byte aligned or the current
   CUDA context is not the plan's. */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  Plan *plan = nargs == 4 ? PyCapsule_GetPointer(args[0], "rope_kernels.plan") : NULL;
  if (!plan) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_TypeError, "launch(plan, stream, inputs, outputs)");
    return NULL;
  }
  PyObject *inputs = args[2], *outputs = args[3];
  if (!(PyTuple_Check(inputs) || PyList_Check(inputs))
      || !(PyTuple_Check(outputs) || PyList_Check(outputs))) {
    PyErr_SetString(PyExc_TypeError, "launch: inputs and outputs must be tuples or lists");
    return NULL;
  }
  Py_ssize_t n_inputs = PySequence_Fast_GET_SIZE(inputs);
  Py_ssize_t n_tensors = n_inputs + PySequence_Fast_GET_SIZE(outputs);
  uint64_t addresses[MAX_PARAMS], low_bits = 0;
  CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[1]);
  if (PyErr_Occurred()) return NULL;
  for (int i = 0; i < plan->n_addresses; i++) {
    int k = plan->tensor[i];
    if (k >= n_tensors) {
      PyErr_Format(PyExc_TypeError, "launch: the plan takes tensor %d of the call, which has "
                   "%zd", k, n_tensors);
      return NULL;
    }
    PyObject *address = PyObject_CallOneArg(
        plan->address_of, k < n_inputs ? PySequence_Fast_GET_ITEM(inputs, k)
                                       : PySequence_Fast_GET_ITEM(outputs, k - n_inputs));
    if (!address) return NULL;
    addresses[i] = PyLong_AsUnsignedLongLong(address);
    Py_DECREF(address);
    if (PyErr_Occurred()) return NULL;
    low_bits |= addresses[i];
  }
  CUcontext current = NULL;
  if ((low_bits & 15) || cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != plan->context)
    Py_RETURN_FALSE;
  for (int i = 0; i < plan->n_pointers; i++)
    plan->values[plan->pointer_param[i]] = addresses[plan->pointer_source[i]];
  CUresult status = cuLaunchKernel(plan->function, plan->grid_x, plan->grid_y, plan->grid_z,
                                   plan->block_x, 1, 1, plan->shared, stream, plan->params, NULL);
  if (status != CUDA_SUCCESS) {
    const char *message = NULL;
    cuGetErrorString(status, &message);
    PyErr_Format(PyExc_RuntimeError, "rope_kernels: cuLaunchKernel failed: %s",
                 message ? message : "unknown error");
    return NULL;
  }
  Py_RETURN_NONE;
}

typedef CUresult (*param_info_t)(CUfunction, size_t, size_t *, size_t *);

/* param_sizes(function): the size of each of the kernel's parameters, as the driver reports
   them (cuFuncGetParamInfo, CUDA 12.4 on), or None where the driver cannot say. */
static PyObject *param_sizes(PyObject *self, PyObject *args) {
  unsigned long long function;
  if (!PyArg_ParseTuple(args, "K", &function)) return NULL;
  void *cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  param_info_t info = cuda ? (param_info_t)dlsym(cuda, "cuFuncGetParamInfo") : NULL;
  if (!info) Py_RETURN_NONE;
  PyObject *sizes = PyList_New(0);
  for (size_t i = 0; sizes && i <= MAX_PARAMS; i++) {
    size_t offset, size;
    if (info((CUfunction)(uintptr_t)function, i, &offset, &size) != CUDA_SUCCESS) break;
    PyObject *item = PyLong_FromSize_t(size);
    if (!item || PyList_Append(sizes, item) < 0) Py_CLEAR(sizes);
    Py_XDECREF(item);
  }
  return sizes;
}

static PyMethodDef methods[] = {
    {"make_plan", make_plan, METH_VARARGS, NULL},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, NULL},
    {"param_sizes", param_sizes, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rope_kernels_launch", NULL, -1,
                                    methods};

PyMODINIT_FUNC PyInit_rope_kernels_launch(void) { return PyModule_Create(&module); }
"""
_OWN_LAUNCHER = None  # the built module; False once building it failed
# Bytes of each scalar parameter type, as Triton's launcher passes it (ty_to_cpp).
_PARAM_BYTES = {"i1": 4, "i8": 1, "i16": 2, "i32": 4, "i64": 8,
                "u1": 4, "u8": 1, "u16": 2, "u32": 4, "u64": 8}


def _own_launcher():
    """The shortcuts' C launcher module, built on first use; None where it cannot be built."""
    global _OWN_LAUNCHER
    if _OWN_LAUNCHER is None:
        try:
            from triton.backends.nvidia import driver as nvidia
            from triton.runtime.build import compile_module_from_src

            _OWN_LAUNCHER = compile_module_from_src(
                _LAUNCH_C, "rope_kernels_launch", library_dirs=nvidia.library_dirs(),
                include_dirs=nvidia.include_dirs, libraries=nvidia.libraries)
        except Exception as e:  # noqa: BLE001 (no compiler, other Triton layout, ...)
            warnings.warn(f"rope_kernels: shortcuts stay on thin_launch, their launcher did not "
                          f"build ({type(e).__name__}: {e})", RuntimeWarning, stacklevel=4)
            _OWN_LAUNCHER = False
    return _OWN_LAUNCHER or None


def _own_plan(compiled, plan, sources, tensors):
    """(launch, launch plan) of the shortcuts' C launcher for ``compiled`` launched as ``plan``
    says, its pointer arguments taken from a call's distinct addresses as ``sources`` says (the
    index of each pointer argument's address among them, 0 to their number - 1), address i
    being that of the call's tensor ``tensors[i]`` (an index among its inputs followed by its
    outputs); None where that launcher does not apply. Parameters as Triton's launcher passes
    them: the non-constexpr arguments in the kernel's order (Triton folds arguments it
    specialised, such as a stride of 1, into the code), then the global and profile scratch
    pointers, null when the kernel needs no scratch memory (checked in ``_direct``). The
    driver's own list of the kernel's parameter sizes must agree, or there is no plan."""
    metadata = compiled.metadata
    if (sys.byteorder != "little" or not triton.__version__.startswith(_DIRECT_TRITON)
            or getattr(metadata, "num_ctas", None) != 1 or len(plan.grid) != 3
            or not all(plan.grid)):  # (Triton launches nothing for an empty grid)
        return None
    module = _own_launcher()
    if module is None:
        return None
    try:
        names = compiled.src.fn.arg_names
        signature = compiled.src.signature
        given = dict(zip(names, (*[("pointer", s) for s in sources], *plan.scalars)))
        given.update(plan.constexprs)
        values, where, sizes = [], [], []
        for name, ty in signature.items():
            if ty == "constexpr":
                continue
            value = given[name]
            if ty.startswith("*"):
                sizes.append(8)
                values.append(0)
                where.append(value[1])
            elif ty in _PARAM_BYTES and type(value) in (int, bool):
                sizes.append(_PARAM_BYTES[ty])
                values.append(int(value) & ((1 << 8 * _PARAM_BYTES[ty]) - 1))
                where.append(-1)
            else:
                return None
        sizes += [8, 8]  # the scratch pointers
        values += [0, 0]
        where += [-1, -1]
        if module.param_sizes(compiled.function) != sizes:
            return None
        return module.launch, module.make_plan(
            compiled.function, *plan.grid, 32 * metadata.num_warps, metadata.shared,
            struct.pack(f"<{len(values)}Q", *values), struct.pack(f"<{len(where)}i", *where),
            struct.pack(f"<{len(tensors)}i", *tensors), _data_ptr)
    except (AttributeError, KeyError, TypeError, ValueError, IndexError, RuntimeError):
        return None


def _getter(indices):
    """xs -> tuple of xs[i] for i in indices (itemgetter, a tuple for one index too)."""
    if len(indices) == 1:
        return lambda xs, i=indices[0]: (xs[i],)
    return operator.itemgetter(*indices)


def last_compiled(plan, pointers):
    """The kernel the thin path would launch for these pointers (None if not confirmed)."""
    key = (_current_device(_DRIVERS.active), *[p.data_ptr() & 15 for p in pointers])
    entry = plan.compiled.get(key)
    return None if entry is None or isinstance(entry, _Pending) else entry[0]
