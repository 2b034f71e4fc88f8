"""The thin launch path: a numba kernel launched by ``cuLaunchKernel`` with arguments packed
straight from the tensors, without numba's per-launch dispatch.

Why: ``kernel[grid, block, stream](*args)`` in numba-cuda 0.30 types every argument, builds
a ctypes object or a memory view per argument in Python (``_Kernel._prepare_args``, ~3.5 µs
per array) and a launch configuration per call, and the backend enters the device's numba
context around it (``cuCtxPushCurrent``/``PopCurrent``). On the H200 that was 2.1 ms of a
training step's host time (docs/benchmarks.md).

What runs where (all of it on the host):

- first launch of a kernel with a set of argument types on a device: the signature is
  derived from the arguments (a tensor is ``dtype[:, ...]`` C-contiguous, or any layout when
  it is not; a Python int ``int64``, float ``float64``, bool ``boolean``: the types of
  ``kernels.KERNELS``), compiled once through the dispatcher (``Dispatcher.compile``, in
  the device's numba context), and its CUfunction fetched (``cuKernelGetFunction``). The
  packer's parameter layout (:mod:`.ptx_abi`) is compared with the compiled kernel's PTX
  ``.entry`` and, where the driver has it, ``cuKernelGetParamInfo``. A difference, a
  numba-cuda outside the checked versions, a debug, cooperative or launch-config-sensitive
  kernel, or any error there: that kernel keeps ``kernel[...]``, with one log line;
- every launch: a packing function generated for the signature checks each argument's type,
  dtype, rank, contiguity and device and writes numba's flattened values (:mod:`.ptx_abi`)
  into the signature's persistent parameter buffer with one ``struct.pack_into``; then one
  ``cuLaunchKernel`` on PyTorch's current raw stream of the device
  (``torch._C._cuda_getCurrentRawStream``), with a device guard only when the current device
  differs. An argument that does not fit any compiled signature goes to ``kernel[...]`` for
  that launch (numba then types it, or raises as before).

The driver rejects a launch in a thread without a current context (``CUDA_ERROR_INVALID_
CONTEXT``): the device's primary context is then made current once and the launch retried.
The buffer is reused: ``cuLaunchKernel`` copies the parameters before it returns; a lock
keeps two threads from packing one buffer at the same time. Under numba's simulator nothing
here runs (``runtime.SIMULATOR``). What this module asks of CUDA (compile, driver, current
device and stream) is a :class:`.thin_driver.Backend`; tests and the host benchmark replace
it with :func:`installed`.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from numba.core import types as nt

from . import ptx_abi
from .thin_driver import Backend, Compiled, cuda_backend

ENV = "TILESPLAT_CUDA_THIN_LAUNCH"

log = logging.getLogger(__name__)

_ARRAY_DTYPES = {
    torch.float32: nt.float32, torch.float64: nt.float64, torch.float16: nt.float16,
    torch.int64: nt.int64, torch.int32: nt.int32, torch.int16: nt.int16, torch.int8: nt.int8,
    torch.uint8: nt.uint8, torch.bool: nt.boolean,
}
_TORCH_DTYPES = {v: k for k, v in _ARRAY_DTYPES.items()}
_SCALARS = {
    bool: nt.boolean, int: nt.int64, float: nt.float64, np.bool_: nt.boolean,
    np.int64: nt.int64, np.int32: nt.int32, np.float32: nt.float32, np.float64: nt.float64,
}


class Plan:
    """One (kernel, signature, device): its CUfunction, buffer, pointer array, packer."""

    __slots__ = ("index", "argtypes", "params", "function", "context", "buffer", "pointers",
                 "address", "pack", "launched")

    def __init__(self, index: int, argtypes: tuple, classes: tuple, compiled: Compiled) -> None:
        self.index, self.argtypes = index, argtypes
        self.params = ptx_abi.layout(argtypes)
        self.function, self.context = compiled.function, compiled.context
        self.buffer = ctypes.create_string_buffer(ptx_abi.buffer_size(self.params))
        base = ctypes.addressof(self.buffer)
        # cuLaunchKernel's kernelParams: one pointer per parameter, into the buffer
        self.pointers = (ctypes.c_void_p * max(1, len(self.params)))(
            *[base + p.offset for p in self.params])
        self.address = ctypes.addressof(self.pointers)
        self.pack = make_packer(argtypes, classes, self.params, index, self.buffer)
        self.launched = False  # an error at the first launch is the thin path's: kernel[...]


def make_packer(argtypes: tuple, classes: tuple, params: tuple, index: int,
                buffer: Any) -> Callable:
    """``pack(args) -> bool``: writes ``args`` into ``buffer`` as ``params`` lays them out, or
    returns False (writing nothing) when an argument does not fit ``argtypes`` on device
    ``index`` (scalars: of exactly the Python ``classes`` the plan was built for).
    Generated per signature: one straight-line function, no loop per argument."""
    names: dict[str, Any] = {"T": torch.Tensor, "pack_into": struct.Struct(
        ptx_abi.struct_format(params)).pack_into, "buf": buffer, "dev": index}
    checks = []
    for i, ty in enumerate(argtypes):
        a = f"a{i}"
        if isinstance(ty, nt.Array):
            names[f"d{i}"] = _TORCH_DTYPES[ty.dtype]
            contiguous = f" or not {a}.is_contiguous()" if ty.layout == "C" else ""
            checks += [f"if not isinstance({a}, T) or {a}.dtype is not d{i} or "
                       f"{a}.get_device() != dev{contiguous}: return False",
                       f"s{i} = {a}.shape",
                       f"if len(s{i}) != {ty.ndim}: return False",
                       f"t{i} = {a}.stride()"]
        else:
            names[f"c{i}"] = classes[i]
            checks.append(f"if type({a}) is not c{i}: return False")
    values = [_value_of(p, argtypes[p.arg]) for p in params]
    unpack = "".join(f"a{i}, " for i in range(len(argtypes)))
    lines = ["def pack(args):", f"    if len(args) != {len(argtypes)}: return False"]
    if argtypes:
        lines.append(f"    ({unpack}) = args")
    lines += [f"    {c}" for c in checks]
    lines += [f"    pack_into(buf, 0, {', '.join(values)})", "    return True"]
    exec("\n".join(lines), names)  # noqa: S102 - code built above from the signature only
    return names["pack"]


def _value_of(p: ptx_abi.Param, ty: Any) -> str:
    """The expression the packer writes for parameter ``p`` (of argument ``a{p.arg}``)."""
    a = f"a{p.arg}"
    if p.field == "value":
        return a
    itemsize = _TORCH_DTYPES[ty.dtype].itemsize
    if p.field.startswith("shape"):
        return f"s{p.arg}[{p.field[5:]}]"
    if p.field.startswith("strides"):  # torch counts elements, numba bytes
        return f"t{p.arg}[{p.field[7:]}] * {itemsize}"
    return {"meminfo": "0", "parent": "0", "nitems": f"{a}.numel()",
            "itemsize": str(itemsize), "data": f"{a}.data_ptr()"}[p.field]


def signature(args: tuple, index: int) -> tuple | None:
    """The numba argument types of ``args`` (see the module docstring), or None when one
    does not fit the thin path (a CPU tensor or one of another device, an unknown type)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dtype = _ARRAY_DTYPES.get(a.dtype)
            if dtype is None or a.get_device() != index:
                return None
            out.append(nt.Array(dtype, a.dim(), "C" if a.is_contiguous() else "A"))
        else:
            ty = _SCALARS.get(type(a))
            if ty is None:
                return None
            out.append(ty)
    return tuple(out)


# ---- state: on/off, the backend, the plans -------------------------------------------------

_enabled: list[bool | None] = [None]  # None: from the environment, read at the first launch
_backend: list[Backend | None] = [None]
_disabled_why: list[str | None] = [None]  # the whole path is off (version, no driver)
_plans: dict[Any, list[Plan] | str] = {}  # kernel -> its plans, or why it keeps kernel[...]
_streams: dict[int, Any] = {}
_lock = threading.RLock()


def _env_enabled() -> bool:
    raw = os.environ.get(ENV, "")
    if raw.lower() in ("", "1", "true", "on", "yes"):
        return True
    if raw.lower() in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"environment variable {ENV} must be 0 or 1, got {raw!r}")


def enabled() -> bool:
    """Whether launches on a GPU take the thin path (default on; env ``TILESPLAT_CUDA_THIN_
    LAUNCH=0`` or :func:`set_enabled` turns it off)."""
    if _enabled[0] is None:
        _enabled[0] = _env_enabled()
    return _enabled[0]


def set_enabled(value: bool | None) -> None:
    """Turns the thin path on or off in this process; None: back to the environment's."""
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"set_enabled takes a bool or None, got {value!r}")
    _enabled[0] = value


def reset() -> None:
    """Forgets every compiled plan and refusal (the next launch of each kernel builds again)."""
    _plans.clear()
    _streams.clear()
    _disabled_why[0] = None


@contextlib.contextmanager
def installed(backend: Backend) -> Iterator[Backend]:
    """Uses ``backend`` instead of CUDA inside the block (tests, the host benchmark)."""
    saved = _backend[0], dict(_plans), dict(_streams), _disabled_why[0]
    _backend[0] = backend
    reset()
    try:
        yield backend
    finally:
        _backend[0] = saved[0]
        reset()
        _plans.update(saved[1])
        _streams.update(saved[2])
        _disabled_why[0] = saved[3]


def plans_of(kernel: Any) -> list[Plan] | str | None:
    """The plans built for ``kernel``, or why it keeps ``kernel[...]`` (None: never seen)."""
    return _plans.get(kernel)


def launch(kernel: Any, grid: Any, block: Any, device: torch.device, args: tuple) -> bool:
    """Launches ``kernel`` over ``grid`` x ``block`` on ``device``'s current stream, True; or
    False when this launch is not the thin path's (off, not a numba CUDA kernel, arguments
    that fit no compiled signature, a kernel it refused): the caller then uses kernel[...]."""
    if not (_enabled[0] if _enabled[0] is not None else enabled()):
        return False
    found = _plans.get(kernel)
    if found.__class__ is str:
        return False
    if found is None and not _is_numba_kernel(kernel):
        _plans[kernel] = "not a numba CUDA kernel"  # no log line: nothing to tell
        return False
    backend = _backend[0] or _default_backend()
    if backend is None:
        return False
    # grid and block as numba takes them: an int or a tuple of 1 to 3 ints
    gx, gy, gz = (grid, 1, 1) if grid.__class__ is int else (*grid, 1, 1)[:3]
    bx, by, bz = (block, 1, 1) if block.__class__ is int else (*block, 1, 1)[:3]
    index = device.index
    current = backend.current_device()
    if index is None:
        index = current
    with _lock:  # one parameter buffer per plan: pack and launch without another thread
        plan = None
        try:
            if found is not None:
                for p in found:
                    if p.index == index and p.pack(args):
                        plan = p
                        break
            if plan is None:
                plan = _new_plan(kernel, args, index, backend)
        except struct.error:  # an int beyond its type: numba says so, in its own words
            return False
        if plan is None:
            return False
        raw = backend.raw_stream(index)
        driver = backend.driver
        stream = _streams.get(raw)
        if stream is None:
            if len(_streams) > 64:
                _streams.clear()
            stream = _streams[raw] = driver.CUstream(raw)
        if current == index:
            err = _launch(driver, plan, gx, gy, gz, bx, by, bz, stream)
        else:
            with backend.device_guard(index):
                err = _launch(driver, plan, gx, gy, gz, bx, by, bz, stream)
        if err is None:
            plan.launched = True
            return True
        if not plan.launched:  # nothing was launched: numba launches it, and from now on
            _refuse(kernel, f"its first cuLaunchKernel failed: {err!r}")
            return False
    raise RuntimeError(f"cuLaunchKernel failed: {err!r} (grid {(gx, gy, gz)}, block "
                       f"{(bx, by, bz)})")


def _launch(driver: Any, plan: Plan, gx, gy, gz, bx, by, bz, stream) -> Any:
    """One cuLaunchKernel of the packed buffer; the error, or None."""
    (err,) = driver.cuLaunchKernel(plan.function, gx, gy, gz, bx, by, bz, 0, stream,
                                   plan.address, 0)
    if err == driver.CUresult.CUDA_SUCCESS:
        return None
    if err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT and plan.context is not None:
        driver.cuCtxSetCurrent(plan.context)  # a thread that never used this device
        (err,) = driver.cuLaunchKernel(plan.function, gx, gy, gz, bx, by, bz, 0, stream,
                                       plan.address, 0)
    return None if err == driver.CUresult.CUDA_SUCCESS else err


MAX_PLANS = 16  # signatures per kernel; more means arguments that change type every call


def _new_plan(kernel: Any, args: tuple, index: int, backend: Backend) -> Plan | None:
    """Compiles and checks a plan for ``args`` and packs them (None: these arguments, or
    this kernel, keep kernel[...]; struct.error: an int beyond its type, for that launch)."""
    argtypes = signature(args, index)
    if argtypes is None:
        return None
    found = _plans.get(kernel)
    if found is not None and len(found) >= MAX_PLANS:
        _refuse(kernel, f"more than {MAX_PLANS} argument signatures")
        return None
    try:
        ptx_abi.layout(argtypes)  # TypeError: a type the packer does not lay out
        compiled = backend.compile(kernel, argtypes, index)
        plan = Plan(index, argtypes, tuple(type(a) for a in args), compiled)
        why = _check(plan, compiled)
    except Exception as exc:  # any surprise in numba's private API: keep kernel[...]
        why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        _refuse(kernel, why)
        return None
    if found is None:
        found = _plans[kernel] = []
    found.insert(0, plan)
    if not plan.pack(args):
        _refuse(kernel, "the packer rejects the arguments it was built for")
        return None
    return plan


def _check(plan: Plan, compiled: Compiled) -> str | None:
    """None when the packer's layout is the compiled kernel's (its PTX, and the driver's
    parameter offsets where it reports them), else the difference."""
    why = ptx_abi.mismatch(plan.params, ptx_abi.entry_params(compiled.ptx, compiled.entry))
    info = compiled.param_info
    if why is not None or info is None:
        return why
    for i, p in enumerate(plan.params):
        got = info(i)
        if got is None:  # a driver without cuKernelGetParamInfo: the PTX check stands
            return None
        if got != (p.offset, p.size):
            return (f"the driver puts parameter {i} ({p.field} of argument {p.arg}) at offset "
                    f"{got[0]}, {got[1]} bytes; the packer at {p.offset}, {p.size}")
    if info(len(plan.params)) is not None:
        return f"the driver reports more than the packer's {len(plan.params)} parameters"
    return None


def _refuse(kernel: Any, why: str) -> None:
    _plans[kernel] = why
    name = getattr(getattr(kernel, "py_func", None), "__name__", repr(kernel))
    log.warning("tilesplat: kernel %s keeps numba's kernel[...] launch: %s", name, why)


def _is_numba_kernel(kernel: Any) -> bool:
    try:
        from numba.cuda.dispatcher import CUDADispatcher
    except ImportError:  # the simulator has no CUDADispatcher
        return False
    return isinstance(kernel, CUDADispatcher)


def _default_backend() -> Backend | None:
    """The CUDA backend (:func:`.thin_driver.cuda_backend`), built at the first launch; None
    with one log line when it cannot be (a numba-cuda this path was not checked with, no
    cuda-bindings)."""
    if _disabled_why[0] is not None:
        return None
    try:
        backend = cuda_backend()
    except Exception as exc:
        _disabled_why[0] = f"{type(exc).__name__}: {exc}"
        log.warning("tilesplat: the thin launch path is off, kernels launch with numba's "
                    "kernel[...]: %s", _disabled_why[0])
        return None
    _backend[0] = backend
    return backend
