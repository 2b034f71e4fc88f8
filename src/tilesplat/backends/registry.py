"""Backend registry: which implementation of an op runs for a given backend and device.

Backends register their ops when their package is imported; packages are imported lazily on
the first dispatch that needs them, so ``import tilesplat`` loads no kernel code.

Where an op lives (the same names in every backend):

- ``ops/<module>.py`` holds the public function, its validation and (for a differentiable op)
  the ``torch.autograd.Function``; it asks :func:`resolve` for ``(op, backend)``.
- ``backends/<backend>/<module>.py``, with the *same module name* as in ``ops/``
  (``covariance``, ``projection``, ``sh``, ``intersect``, ``rasterize``, ``camera``,
  ``indices``, ``twodgs``, ``ssim``, ``ut``), holds the launchers: plain functions that
  allocate the outputs and launch the kernels. A backend may keep the kernels themselves in
  modules named ``<module>_<part>.py`` beside it (``projection_fwd``, ``rasterize_bwd``, ...),
  which only the launcher module and their siblings import.
- A differentiable op registers ``DiffOp(<module>.forward, <module>.backward)``; a plain op
  (and an op whose implementation differentiates itself, as the 2DGS ones do) registers
  ``<module>.<op name>``. Each is one line in ``backends/<backend>/__init__.py``.
- ``tests/ops/test_<op>.py`` runs the op through every backend against the reference
  (parametrised over the backends and the batch dims ``(), (2,), (1, 2)``).

So an op is ``ops/<module>.py`` + ``backends/<b>/<module>.py`` per backend + one registration
line per backend + its test. A backend that lacks an op just does not register it: ``auto``
falls back to the reference, an explicit backend raises ``NotImplementedError``.

Selection, strongest first: the ``backend=`` argument of a call, :func:`use_backend`
(context manager), :func:`set_backend`, the environment variable ``TILESPLAT_BACKEND``,
then ``"auto"``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..constants import BACKENDS, BACKWARD_SCHEMES

_MODULES = {
    "torch": "tilesplat.backends.torch",
    "cpu": "tilesplat.backends.cpu",
    "cuda": "tilesplat.backends.cuda",
}


@dataclass(frozen=True)
class DiffOp:
    """A differentiable op of one backend: launchers called by ``ops/`` autograd Functions."""

    forward: Callable[..., Any]
    backward: Callable[..., Any]


_impls: dict[tuple[str, str], Any] = {}
_loaded: dict[str, str | None] = {}  # backend -> None when imported, else why it failed
_warned: set[tuple[str, str, str]] = set()
_lock = threading.Lock()
_state = threading.local()
_global: dict[str, str | None] = {"backend": None, "scheme": None}


def register(op: str, backend: str, impl: Any) -> None:
    """Registers ``impl`` as the implementation of ``op`` for ``backend``."""
    if backend not in _MODULES:
        raise ValueError(f"backend must be one of {sorted(_MODULES)}, got {backend!r}")
    _impls[(op, backend)] = impl


def _check_name(backend: str) -> str:
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    return backend


def _load(backend: str) -> str | None:
    """Imports a backend's module once; returns None on success, else the reason it failed."""
    with _lock:
        if backend not in _loaded:
            try:
                importlib.import_module(_MODULES[backend])
                _loaded[backend] = None
            except ImportError as exc:  # e.g. numba or numba-cuda not installed
                _loaded[backend] = f"{type(exc).__name__}: {exc}"
        return _loaded[backend]


def cuda_simulator() -> bool:
    """True when numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def set_backend(backend: str | None) -> None:
    """Sets the process-wide default backend (``None`` goes back to the environment/auto)."""
    _global["backend"] = None if backend is None else _check_name(backend)


@contextlib.contextmanager
def use_backend(backend: str) -> Iterator[None]:
    """Context manager: calls inside it use ``backend`` unless they pass ``backend=``."""
    _check_name(backend)
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    stack.append(backend)
    try:
        yield
    finally:
        stack.pop()


def current_backend() -> str:
    """The backend name a call without ``backend=`` uses now (may be ``"auto"``)."""
    stack = getattr(_state, "stack", None)
    if stack:
        return stack[-1]
    if _global["backend"] is not None:
        return _global["backend"]
    env = os.environ.get("TILESPLAT_BACKEND")
    if env:
        if env not in BACKENDS:
            raise ValueError(
                f"environment variable TILESPLAT_BACKEND must be one of {list(BACKENDS)}, "
                f"got {env!r}"
            )
        return env
    return "auto"


def set_backward_scheme(scheme: str | None) -> None:
    """Sets the default backward scheme (``per_pixel`` or ``per_splat``; None resets)."""
    _global["scheme"] = None if scheme is None else check_backward_scheme(scheme)


def check_backward_scheme(scheme: str) -> str:
    if not isinstance(scheme, str) or scheme not in BACKWARD_SCHEMES:
        raise ValueError(f"backward_scheme must be one of {list(BACKWARD_SCHEMES)}, got {scheme!r}")
    return scheme


def current_backward_scheme(scheme: str | None = None) -> str:
    """Resolves the backward scheme: argument, then set_backward_scheme, env, ``per_pixel``."""
    if scheme is not None:
        return check_backward_scheme(scheme)
    if _global["scheme"] is not None:
        return _global["scheme"]
    env = os.environ.get("TILESPLAT_BACKWARD_SCHEME")
    if env:
        if env not in BACKWARD_SCHEMES:
            raise ValueError(
                "environment variable TILESPLAT_BACKWARD_SCHEME must be one of "
                f"{list(BACKWARD_SCHEMES)}, got {env!r}"
            )
        return env
    return "per_pixel"


def _native_for(device: torch.device) -> str | None:
    if device.type == "cuda":
        return "cuda"
    if device.type == "cpu":
        return "cpu"
    return None


def _warn_once(op: str, wanted: str, why: str) -> None:
    key = (op, wanted, why)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            f"tilesplat: op {op!r} falls back to the 'torch' reference backend "
            f"(backend {wanted!r} unavailable: {why})",
            RuntimeWarning,
            stacklevel=4,
        )


def resolve_name(op: str, device: torch.device, backend: str | None = None) -> str:
    """The concrete backend that runs ``op`` on tensors of ``device``."""
    name = _check_name(backend) if backend is not None else current_backend()
    if name == "auto":
        native = _native_for(device)
        if native is None:
            return "torch"
        why = _load(native)
        if why is None and (op, native) in _impls:
            return native
        _warn_once(op, native, why or f"op not implemented by backend {native!r}")
        return "torch"
    why = _load(name)
    if why is not None:
        raise NotImplementedError(f"backend {name!r} cannot be used: {why}")
    if (op, name) not in _impls:
        raise NotImplementedError(f"op {op!r} is not implemented by backend {name!r}")
    if name == "cuda" and device.type != "cuda" and not cuda_simulator():
        raise ValueError(
            f"backend 'cuda' needs CUDA tensors, got tensors on {device} "
            "(set NUMBA_ENABLE_CUDASIM=1 to run the CUDA kernels in numba's simulator)"
        )
    if name == "cpu" and device.type != "cpu":
        raise ValueError(f"backend 'cpu' needs CPU tensors, got tensors on {device}")
    return name


def resolve(op: str, device: torch.device, backend: str | None = None) -> tuple[str, Any]:
    """Returns ``(backend_name, impl)`` for ``op`` on ``device``."""
    name = resolve_name(op, device, backend)
    if name == "torch":
        _load("torch")
    return name, _impls[(op, name)]


def available() -> dict[str, str | None]:
    """Imports every backend; maps its name to None when usable, else the reason."""
    return {name: _load(name) for name in _MODULES}


def implemented_ops(backend: str) -> list[str]:
    """The ops a backend registers (imports it first)."""
    _load(backend)
    return sorted(op for (op, b) in _impls if b == backend)
