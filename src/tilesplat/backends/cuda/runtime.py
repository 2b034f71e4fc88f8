"""Runtime of the cuda backend: simulator switch, array views, PyTorch's stream, options.

Options (read by every launch, so a benchmark can switch them between calls):

- ``warp_skip`` (env ``TILESPLAT_CUDA_WARP_SKIP``, default on): in the ``per_pixel``
  backward, a warp skips a splat that none of its lanes needs, and starts each batch at the
  warp's largest ``last_id``. Off: every lane of every warp walks every splat of the tile.
- ``exact_transmittance`` (env ``TILESPLAT_CUDA_EXACT_T``, default on): the ``per_pixel``
  backward replays each pixel's transmittance product front to back before walking back,
  instead of taking ``T_final = 1 - render_alphas``, which in float32 keeps only ~6e-8 of
  absolute precision (6e-4 relative once T_final nears the 1e-4 stop). Costs about one
  colourless forward pass; off gives gsplat's cheaper and less precise recovery.
- ``splat_batch`` (env ``TILESPLAT_CUDA_SPLAT_BATCH``, 32 or 256, default 32): the number of
  splats (= threads of a block) one ``per_splat`` backward batch holds.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from numba import cuda

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
    """The options in force: ``{"warp_skip", "exact_transmittance", "splat_batch"}``."""
    return {
        "warp_skip": _options.get("warp_skip", _env_bool("TILESPLAT_CUDA_WARP_SKIP", True)),
        "exact_transmittance": _options.get(
            "exact_transmittance", _env_bool("TILESPLAT_CUDA_EXACT_T", True)
        ),
        "splat_batch": _options.get("splat_batch", _env_batch()),
    }


def set_options(
    warp_skip: bool | None = None,
    splat_batch: int | None = None,
    exact_transmittance: bool | None = None,
) -> None:
    """Sets backend options; ``None`` leaves an option as it is. See the module docstring."""
    for name, value in (("warp_skip", warp_skip), ("exact_transmittance", exact_transmittance)):
        if value is not None:
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
            _options[name] = value
    if splat_batch is not None:
        _options["splat_batch"] = _check_batch(splat_batch, "splat_batch")


def reset_options() -> None:
    """Back to the environment's (or the built-in) defaults."""
    _options.clear()


def view(t: torch.Tensor) -> Any:
    """A zero-copy kernel argument for a contiguous tensor.

    On a GPU: a numba device array over ``__cuda_array_interface__``. Under the simulator:
    the numpy view of a CPU tensor (the simulator writes results back into it).
    """
    t = t.detach()
    if SIMULATOR:
        if t.device.type != "cpu":
            raise ValueError(f"the CUDA simulator needs CPU tensors, got {t.device}")
        return t.numpy()
    if t.device.type != "cuda":
        raise ValueError(f"backend 'cuda' needs CUDA tensors, got tensors on {t.device}")
    # no sync: every kernel runs on the stream the tensor was produced on (PyTorch's current)
    return cuda.as_cuda_array(t, sync=False)


def optional(t: torch.Tensor | None, like: torch.Tensor, ndim: int, dtype=None) -> Any:
    """``view(t)``, or a one-element placeholder of ``ndim`` dims when ``t`` is None."""
    if t is None:
        t = torch.zeros((1,) * ndim, dtype=dtype or like.dtype, device=like.device)
    return view(t)


_streams: dict[int, Any] = {}


def stream(device: torch.device) -> Any:
    """PyTorch's current stream on ``device`` as a numba stream (0 under the simulator)."""
    if SIMULATOR:
        return 0
    handle = torch.cuda.current_stream(device).cuda_stream
    if handle not in _streams:
        _streams[handle] = cuda.external_stream(handle)
    return _streams[handle]


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
