"""Camera models of the rasterizer (``camera_model=``): one module each, and the table below.

A model ``<name>`` is the module ``backends/cameras/<name>.py`` holding

- ``<name>_proj(x, y, z, fx, fy, cx, cy, width, height) -> (u, v, J)``: the image point of
  the camera-space point (x, y, z) and the 2x3 Jacobian d(u, v)/d(x, y, z) as a row-major
  6-tuple, which carries the covariance onto the image (``shared/conic.project_covar``);
- ``<name>_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj) -> (vx, vy, vz)``:
  the gradient w.r.t. (x, y, z) from those of u, v and J (``vj``, a 6-tuple);
- ``FUNCTIONS``: those two and the helpers they call (named ``_<name>_...``), the scalar
  math that ``shared.build`` compiles for the CPU and CUDA kernels (the rules of
  ``backends/shared``: scalars and tuples, constants through ``like``);
- ``<name>_torch(means_c, Ks, width, height) -> (means2d, J)``: its twin for the reference,
  camera-space points [B, C, N, 3] and intrinsics [B, C, 3, 3] to image points [B, C, N, 2]
  and the Jacobian [B, C, N, 2, 3], plain differentiable PyTorch.

and one line in :data:`CAMERA_MODELS`, whose index is the code the native kernels dispatch on
(``shared/cameras.py`` writes that dispatch from this table). Validation, every backend and
``rasterization(camera_model=...)`` take a model from there. This module imports none of them:
``import tilesplat`` reads only the names.

Only points in the depth range (near, far) give values that count: the CPU kernels hand a
model the point (1, 1, 1) in place of the others, the CUDA ones skip them. Off-screen points
are projected and then culled by their box.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# one line per camera model, its index its code (the first is the kernels' fallback)
CAMERA_MODELS = (
    "pinhole",
    "ortho",
    "fisheye",
)


def camera_code(name: str) -> int:
    """The code the native kernels dispatch on for camera model ``name``."""
    if name not in CAMERA_MODELS:
        raise ValueError(f"camera_model must be one of {list(CAMERA_MODELS)}, got {name!r}")
    return CAMERA_MODELS.index(name)


def camera_module(name: str) -> ModuleType:
    """The module of camera model ``name`` (imported on first use)."""
    camera_code(name)
    return importlib.import_module(f"{__name__}.{name}")
