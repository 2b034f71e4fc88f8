"""Runtime of the cuda backend: simulator switch, hardware limits, launches, options.

Every launch goes through :func:`launch`. On a GPU it takes the thin path first
(:mod:`.thin_launch`: arguments packed straight from the tensors, one ``cuLaunchKernel`` on
PyTorch's current stream of the tensors' device, no numba context per launch); a launch the
thin path does not take, and every launch under the simulator, goes through numba's
``kernel[grid, block, stream]``: it enters the numba context of the tensors' device
(``cuda:1`` launches on GPU 1), turns tensor arguments into cached zero-copy views and
launches on PyTorch's current stream of that device. Both count the launch
(:func:`launch_stats`). Launchers check the hardware limits (threads per block, grid
dimensions, static shared memory, int32 index range) before they launch.

Options (read by every launch, so a benchmark can switch them between calls):

- ``warp_skip`` (env ``TILESPLAT_CUDA_WARP_SKIP``, default on): in the ``per_pixel``
  backward, a warp skips a splat that none of its lanes needs, and starts each batch at the
  warp's largest ``last_id``. Off: every lane of every warp walks every splat of the tile.
- ``exact_transmittance`` (env ``TILESPLAT_CUDA_EXACT_T``, default on): the ``per_pixel``
  backward starts each pixel from the transmittance the forward kept (``T_final``), instead
  of ``1 - render_alphas``, which in float32 keeps only ~6e-8 of absolute precision (6e-4
  relative once T_final nears the 1e-4 stop). Off gives gsplat's less precise recovery.
- ``splat_batch`` (env ``TILESPLAT_CUDA_SPLAT_BATCH``, 32 or 256, default 32): the number of
  splats (= threads of a block) one ``per_splat`` backward batch holds.
- ``deterministic`` (env ``TILESPLAT_CUDA_DETERMINISTIC``, default off; a call's
  ``rasterization(deterministic=)`` wins for that call's backward): no float atomics on
  the gradient path, so that two runs give bitwise-equal gradients. The rasterization
  backward writes each (intersection, warp) part of a splat's gradient to its own row, and
  :mod:`.segment` sums the rows of each Gaussian in a fixed order; the projection backward
  writes one row per camera, summed over the cameras by PyTorch. Costs memory (a row per
  intersection and warp) and a sort.
- ``thin_launch`` (env ``TILESPLAT_CUDA_THIN_LAUNCH``, default on; read at the first launch,
  switched in-process by ``thin_launch.set_enabled``): launches on a GPU take the thin path
  of :mod:`.thin_launch`. Off: every launch is numba's ``kernel[...]``. The simulator always
  uses ``kernel[...]``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from numba import cuda

from .. import call_options
from . import thin_launch

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
SPLAT_BATCHES = (32, 256)


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in ("1", "true", "on", "yes"):
        return True
    if raw.lower() in ("0", "false", "off", "no"):
        return False
    raise ValueError(f"environment variable {name} must be 0 or 1, got {raw!r}")


def _check_batch(value: Any, what: str) -> int:
    if value not in SPLAT_BATCHES:
        raise ValueError(f"{what} must be one of {SPLAT_BATCHES}, got {value!r}")
    return int(value)


def _env_batch() -> int:
    raw = os.environ.get("TILESPLAT_CUDA_SPLAT_BATCH")
    if not raw:
        return 32
    try:
        value = int(raw)
    except ValueError:
        value = raw
    return _check_batch(value, "environment variable TILESPLAT_CUDA_SPLAT_BATCH")


_options: dict[str, Any] = {}


def get_options() -> dict[str, Any]:
    """The options in force: ``{"warp_skip", "exact_transmittance", "splat_batch",
    "deterministic"}``."""
    return {
        "warp_skip": _options.get("warp_skip", _env_bool("TILESPLAT_CUDA_WARP_SKIP", True)),
        "exact_transmittance": _options.get(
            "exact_transmittance", _env_bool("TILESPLAT_CUDA_EXACT_T", True)
        ),
        "splat_batch": _options.get("splat_batch", _env_batch()),
        "deterministic": _deterministic(),
    }


def _deterministic() -> bool:
    """A call's own choice (``rasterization(deterministic=)``, :mod:`..call_options`), else
    :func:`set_options`', else the environment's."""
    per_call = call_options.deterministic()
    if per_call is not None:
        return per_call
    return _options.get("deterministic", _env_bool("TILESPLAT_CUDA_DETERMINISTIC", False))


def set_options(
    warp_skip: bool | None = None,
    splat_batch: int | None = None,
    exact_transmittance: bool | None = None,
    deterministic: bool | None = None,
) -> None:
    """Sets backend options; ``None`` leaves an option as it is. See the module docstring."""
    flags = (("warp_skip", warp_skip), ("exact_transmittance", exact_transmittance),
             ("deterministic", deterministic))
    for name, value in flags:
        if value is not None:
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
            _options[name] = value
    if splat_batch is not None:
        _options["splat_batch"] = _check_batch(splat_batch, "splat_batch")


def reset_options() -> None:
    """Back to the environment's (or the built-in) defaults."""
    _options.clear()


MIN_NUMBA_CUDA = (0, 21)  # numba.cuda.types (device_math) and launch_bounds


def parse_version(text: str) -> tuple[int, ...]:
    """``"0.30.4"`` -> ``(0, 30, 4)``; a suffix such as ``rc1`` or ``+local`` is ignored."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def check_numba_cuda_version(text: str) -> None:
    """Raises ImportError naming the floor when numba-cuda ``text`` is older than it."""
    if parse_version(text) < MIN_NUMBA_CUDA:
        floor = ".".join(map(str, MIN_NUMBA_CUDA))
        raise ImportError(
            f"backend 'cuda' needs numba-cuda >= {floor}, found {text}: "
            f"pip install -U 'numba-cuda[cu13]>={floor}'"
        )


# Hardware limits every launcher checks before it launches (CUDA compute capability >= 7).
MAX_BLOCK_THREADS = 1024
MAX_GRID_YZ = 65_535  # gridDim.y and gridDim.z; larger image batches go in chunks
STATIC_SHARED_BYTES = 48 * 1024  # static shared memory per block without an opt-in
REGISTERS_PER_SM = 65_536
INDEX_LIMIT = 2**31 - 1  # offsets, flatten_ids and last_ids are int32


def jit(body: Callable, threads: int | None = None) -> Any:
    """``cuda.jit`` of a kernel body; ``threads`` (the block size it is launched with) becomes
    its launch bound, so that ptxas keeps registers x threads within the register file."""
    if SIMULATOR or threads is None:  # the simulator's jit takes no launch bounds
        return cuda.jit(body)
    return cuda.jit(body, launch_bounds=int(threads))


# ---- launches: device context, views, placeholders, statistics -------------------------

_stats = {"launches": 0, "launcher_calls": 0, "host_s": 0.0, "kernel_s": 0.0}
_depth = [0]
_VIEW_CACHE_SIZE = 256
_views: dict[tuple, Any] = {}
_placeholders: dict[tuple, torch.Tensor] = {}
_streams: dict[tuple, Any] = {}


def launch_stats() -> dict[str, float]:
    """Counters since :func:`reset_launch_stats`: ``launches`` (numba kernel launches),
    ``launcher_calls`` (calls of the backend's op launchers), ``host_s`` (seconds of Python
    in the launchers outside the kernel calls: views, allocations, checks) and ``kernel_s``
    (seconds inside the kernel calls: numba's dispatch, plus the kernels themselves under the
    simulator)."""
    return dict(_stats)


def reset_launch_stats() -> None:
    """Zeroes the counters of :func:`launch_stats`."""
    _stats.update(launches=0, launcher_calls=0, host_s=0.0, kernel_s=0.0)


def launcher(fn: Callable) -> Callable:
    """Counts a launcher's calls and its Python time outside kernel calls (``launch_stats``)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        _depth[0] += 1
        kernel_before = _stats["kernel_s"]
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _depth[0] -= 1
            if _depth[0] == 0:
                _stats["launcher_calls"] += 1
                spent = time.perf_counter() - t0
                _stats["host_s"] += spent - (_stats["kernel_s"] - kernel_before)

    return wrapped


def device_context(device: torch.device) -> Any:
    """The numba context of ``device`` (``cuda:1`` -> GPU 1); a no-op under the simulator."""
    if SIMULATOR or device.type != "cuda":
        return contextlib.nullcontext()
    index = device.index if device.index is not None else torch.cuda.current_device()
    return cuda.gpus[index]


def view(t: torch.Tensor) -> Any:
    """A zero-copy kernel argument for a contiguous tensor.

    On a GPU: a numba device array over ``__cuda_array_interface__``, cached by (pointer,
    shape, strides, dtype): the array holds no reference to the tensor, so a cached view is
    valid for whatever tensor later lives at that address with that layout. Under the
    simulator: the numpy view of a CPU tensor (the simulator writes results back into it).
    """
    t = t.detach()
    if SIMULATOR:
        if t.device.type != "cpu":
            raise ValueError(f"the CUDA simulator needs CPU tensors, got {t.device}")
        return t.numpy()
    if t.device.type != "cuda":
        raise ValueError(f"backend 'cuda' needs CUDA tensors, got tensors on {t.device}")
    key = (t.data_ptr(), t.shape, t.stride(), t.dtype, t.device.index)
    found = _views.get(key)
    if found is None:
        if len(_views) >= _VIEW_CACHE_SIZE:
            _views.clear()
        # no sync: every kernel runs on the stream the tensor was produced on
        found = cuda.from_cuda_array_interface(t.__cuda_array_interface__, owner=None,
                                               sync=False)
        _views[key] = found
    return found


def optional(t: torch.Tensor | None, like: torch.Tensor, ndim: int, dtype=None) -> Any:
    """``t``, or a cached one-element placeholder of ``ndim`` dims when ``t`` is None (the
    kernel never reads it: a flag argument says it is absent)."""
    if t is not None:
        return t
    dtype = dtype or like.dtype
    key = (like.device, dtype, ndim)
    found = _placeholders.get(key)
    if found is None:
        found = _placeholders[key] = torch.zeros((1,) * ndim, dtype=dtype, device=like.device)
    return found


def stream(device: torch.device) -> Any:
    """PyTorch's current stream on ``device`` as a numba stream (0 under the simulator)."""
    if SIMULATOR:
        return 0
    handle = torch.cuda.current_stream(device).cuda_stream
    key = (device.index, handle)
    if key not in _streams:
        with device_context(device):
            _streams[key] = cuda.external_stream(handle)
    return _streams[key]


def launch(kernel: Any, grid: Any, block: Any, device: torch.device, *args: Any) -> None:
    """Launches ``kernel[grid, block]`` on ``device``'s current PyTorch stream: by the thin
    path on a GPU (:mod:`.thin_launch`), else in the numba context of ``device`` with tensor
    arguments as zero-copy views (:func:`view`)."""
    if not SIMULATOR and device.type == "cuda":
        t0 = time.perf_counter()
        if thin_launch.launch(kernel, grid, block, device, args):
            _stats["kernel_s"] += time.perf_counter() - t0
            _stats["launches"] += 1
            return
    with device_context(device):
        argv = [view(a) if isinstance(a, torch.Tensor) else a for a in args]
        st = stream(device)
        t0 = time.perf_counter()
        kernel[grid, block, st](*argv)
        _stats["kernel_s"] += time.perf_counter() - t0
        _stats["launches"] += 1


def float_type(dtype: torch.dtype) -> type:
    """The numpy scalar type a kernel factory is specialised on."""
    if dtype == torch.float32:
        return np.float32
    if dtype == torch.float64:
        return np.float64
    raise TypeError(f"the cuda backend computes in float32 or float64, got {dtype}")


def cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


POISON_INT = -(2**31) + 7


def empty(shape: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An output buffer; with ``TILESPLAT_POISON=1`` filled with NaN (ints: ``POISON_INT``),
    so that a kernel that leaves an element unwritten fails the tests loudly."""
    out = torch.empty(shape, dtype=dtype, device=device)
    if os.environ.get("TILESPLAT_POISON", "0") == "1":
        out.fill_(float("nan") if dtype.is_floating_point else POISON_INT)
    return out
