"""The CUDA side of the thin launch path (:mod:`.thin_launch`): numba-cuda compiles a
kernel for a signature and hands over its CUfunction, cuda-bindings' driver launches it,
torch says which device and stream are current.

This is the only module of the thin path that touches numba-cuda's private launch API
(``Dispatcher.compile`` -> ``_Kernel``, ``_Kernel._codelibrary.get_cufunc().handle``, a
``CUkernel`` in 0.30), so the versions it was read against are gated here; the layout it
packs is checked against each compiled kernel's PTX (:mod:`.ptx_abi`) anyway. Everything here
runs once per (kernel, signature, device), at its first launch, in the device's numba
context; nothing per launch.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# numba-cuda versions whose private launch API this path was read against and checked with;
# others keep kernel[...].
CHECKED_NUMBA_CUDA = ((0, 30), (0, 31))  # [first, past the last)


@dataclass
class Compiled:
    """A kernel compiled for one signature on one device: what a launch needs."""

    function: Any  # CUfunction (or anything the driver's cuLaunchKernel takes)
    ptx: str  # its PTX, for the layout check
    entry: str | None = None  # its .entry name in the PTX
    context: Any = None  # the device's primary context (made current on INVALID_CONTEXT)
    # i -> (offset, size) of parameter i as the driver lays it out, None past the last one
    # (or when the driver cannot tell)
    param_info: Callable[[int], tuple[int, int] | None] | None = None


@dataclass
class Backend:
    """What the thin path asks of CUDA. ``driver``: ``cuda.bindings.driver`` (its
    ``cuLaunchKernel``, ``CUresult``, ``CUstream``, ``cuCtxSetCurrent``); ``current_device``:
    the current device index; ``raw_stream``: index -> PyTorch's current raw stream handle;
    ``compile``: (dispatcher, argtypes, index) -> :class:`Compiled`; ``device_guard``: index
    -> a context manager making that device current (only entered when it is not)."""

    driver: Any
    current_device: Callable[[], int]
    raw_stream: Callable[[int], int]
    compile: Callable[[Any, tuple, int], Compiled]
    device_guard: Callable[[int], Any] = torch.cuda.device


def cuda_backend() -> Backend:
    """The backend of a real GPU: cuda-bindings' driver, torch's current device and raw
    stream, :func:`compile_kernel`; RuntimeError when the installed numba-cuda is not one
    this path was checked with, ImportError without cuda-bindings."""
    from importlib import metadata

    from cuda.bindings import driver

    version = metadata.version("numba-cuda")
    low, high = CHECKED_NUMBA_CUDA
    if not low <= version_tuple(version) < high:
        raise RuntimeError(
            f"numba-cuda {version} is outside the versions it was checked with "
            f"({'.'.join(map(str, low))} to before {'.'.join(map(str, high))})")
    return Backend(driver, torch._C._cuda_getDevice, torch._C._cuda_getCurrentRawStream,
                   compile_kernel)


def version_tuple(text: str) -> tuple[int, ...]:
    """``"0.30.4"`` -> ``(0, 30, 4)``, up to the first piece that is not a number."""
    out = []
    for piece in text.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        out.append(int(digits.group()))
    return tuple(out)


def compile_kernel(kernel: Any, argtypes: tuple, index: int) -> Compiled:
    """Compiles ``kernel`` for ``argtypes`` on GPU ``index`` and fetches its CUfunction, in
    the device's numba context (the only context calls of the thin path; once per plan)."""
    from cuda.bindings import driver
    from numba import cuda

    if kernel.extensions:
        raise RuntimeError("the kernel has argument extensions")
    with cuda.gpus[index]:
        compiled = kernel.compile(argtypes)
        if tuple(compiled.argument_types) != tuple(argtypes):
            raise RuntimeError(f"numba compiled {compiled.argument_types}, not {argtypes}")
        for flag in ("debug", "cooperative", "launch_config_sensitive"):
            if getattr(compiled, flag, False):
                raise RuntimeError(f"the kernel is {flag.replace('_', '-')}")
        compiled.bind()  # loads (and initialises) its module in this context
        cufunc = compiled._codelibrary.get_cufunc()
        handle = cufunc.handle
        function = handle
        param_info = None
        if isinstance(handle, driver.CUkernel):
            function = _ok(driver.cuKernelGetFunction(handle), "cuKernelGetFunction")
            if hasattr(driver, "cuKernelGetParamInfo"):
                def param_info(i: int, h=handle) -> tuple[int, int] | None:
                    err, offset, size = driver.cuKernelGetParamInfo(h, i)
                    return None if int(err) != 0 else (int(offset), int(size))
        context = _ok(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        cc = cuda.get_current_device().compute_capability
        ptx = compiled.inspect_asm(cc)
    return Compiled(function, ptx, entry=getattr(cufunc, "name", None), context=context,
                    param_info=param_info)


def _ok(result: tuple, what: str) -> Any:
    """The value of a cuda-bindings call ``(CUresult, value...)``; RuntimeError on an error."""
    err, *values = result
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return values[0] if len(values) == 1 else tuple(values)
