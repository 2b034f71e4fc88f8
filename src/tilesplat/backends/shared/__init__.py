"""Scalar math shared by the native backends, written once as plain Python functions and
compiled for each Numba target by :func:`build`.

Every function takes and returns scalars (tuples for vectors and matrices), so that it
compiles for any target: the CPU backend wraps each one with ``numba.njit`` (``cpu/_common.py``)
and the CUDA backend with ``numba.cuda.jit(device=True)`` (``cuda/device_math.py``). The
functions also run as plain Python (handy in a debugger, and what numba's CUDA simulator runs).

Modules, by domain (each lists its compiled functions in ``FUNCTIONS``):

- ``typed``: ``like``, ``as_int32``, ``pow2_neg``, the typed intrinsics the others use;
- ``compositing``: ``exp_neg``, ``gaussian_sigma``, the per-pair math of the rasterizers;
- ``covariance``: quaternion and scales to 3D covariance / precision, world to camera;
- ``conic``: camera covariance to the 2D covariance, the ``eps2d`` blur and the conic;
- ``cameras``: the dispatch on a camera model's code (``project``, ``project_vjp``), written
  from the table of ``backends/cameras``, whose modules (one per model) are compiled too;
- ``sh``: the real spherical-harmonics basis and its VJP;
- ``tiles``: which tiles a Gaussian's alpha-threshold ellipse reaches (the tile lists).

``ut_projection`` (3DGUT's lens, shutter and sigma-point footprint) takes arrays, not scalars,
so it is not compiled here: its own ``compile_for`` serves both targets' projection kernels.

Rules that keep float32 kernels float32 (Numba types a Python float literal, and a module
global float, as float64 and promotes): every constant goes through ``like(x, c)``, which casts
``c`` to the type of ``x`` inside compiled code and costs nothing after constant folding;
integer conversions go through ``as_int32``. Only ``math.sqrt``, ``math.atan2`` and
``math.log`` are called, and the builtins ``min``, ``max`` and ``abs`` of scalars, which both
targets provide. Constants of the contract come from ``constants.py`` (Numba freezes module
globals when it compiles).

Conventions: a symmetric 3x3 matrix is the 6-tuple ``(xx, xy, xz, yy, yz, zz)`` and a
symmetric 2x2 one ``(xx, xy, yy)``. The gradient of a loss with respect to a symmetric matrix
is given per entry of the full matrix (``v_xy`` is d loss / d M[0, 1] = d loss / d M[1, 0]),
which is what autograd reports for a tensor used as a full matrix. Quaternions are
``(w, x, y, z)``.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from . import cameras, compositing, conic, covariance, sh, tiles, typed

__all__ = ["MODULES", "build"]

MODULES: tuple[types.ModuleType, ...] = (typed, compositing, covariance, conic,
                                         *cameras.CAMERA_MODULES, cameras, sh, tiles)


def _namespace() -> dict[str, Any]:
    """The modules' globals merged: one name, one object (a clash would let a copy call the
    wrong helper, so it raises)."""
    namespace: dict[str, Any] = {}
    for module in MODULES:
        for key, value in vars(module).items():
            if key.startswith("__") or key == "FUNCTIONS":
                continue
            if key in namespace and namespace[key] is not value:
                raise RuntimeError(f"shared.{module.__name__}: {key!r} is defined twice")
            namespace[key] = value
    return namespace


def build(
    decorator: Callable[[Callable[..., Any]], Any],
    name: str,
    overrides: dict[str, Any] | None = None,
) -> types.ModuleType:
    """Compiles-on-demand copies of every function in the modules' ``FUNCTIONS`` for one
    Numba target.

    ``decorator`` is e.g. ``numba.njit(inline="always")`` or ``numba.cuda.jit(device=True)``.
    Each copy's globals are one namespace holding the decorated copies of all the others, so
    calls between them (across modules too) stay inside compiled code. Nothing compiles here;
    Numba compiles on first call. The result is a module object named ``name`` (Numba resolves
    ``module.function`` inside kernels). ``overrides`` replaces helpers the copies call (e.g.
    ``like`` / ``as_int32``, which a target may have to provide as its own intrinsics).
    """
    namespace = _namespace()
    namespace.update(overrides or {})
    out = types.ModuleType(name, "the shared scalar math compiled for one target")
    for module in MODULES:
        for fn_name in module.FUNCTIONS:
            fn = getattr(module, fn_name)
            copy = types.FunctionType(fn.__code__, namespace, fn_name, fn.__defaults__,
                                      fn.__closure__)
            copy.__doc__ = fn.__doc__
            copy.__qualname__ = fn.__qualname__
            copy.__module__ = fn.__module__
            compiled = decorator(copy)
            namespace[fn_name] = compiled
            setattr(out, fn_name, compiled)
    return out
