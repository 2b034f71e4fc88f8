"""A capture's own lens, kept for 3DGUT (``camera_mode = "native"``): what a COLMAP camera
becomes in the coefficients of gsplat 1.5.3's ``rasterization(with_ut=True, ...)``.

gsplat's cameras (``backends/torch/lens.py``, the reference):

- ``pinhole`` with ``radial_coeffs`` [6] = k1..k6 of OpenCV's rational factor
  ``(1 + k1 r² + k2 r⁴ + k3 r⁶) / (1 + k4 r² + k5 r⁴ + k6 r⁶)``, ``tangential_coeffs`` [2] =
  p1, p2 and ``thin_prism_coeffs`` [4] = s1..s4 (``du += s1 r² + s2 r⁴``, ``dv += s3 r² +
  s4 r⁴``), all of the normalised point (x/z, y/z): COLMAP's perspective models;
- ``fisheye`` with ``radial_coeffs`` [4] = k1..k4 of ``theta_d = theta (1 + k1 theta² + ... +
  k4 theta⁸)``: COLMAP's ``OPENCV_FISHEYE`` (the distortion of the equidistant point).

The map (COLMAP's parameter order after fx, fy, cx, cy, or f, cx, cy):

=====================  ===========  ==============================================
COLMAP model           camera       coefficients
=====================  ===========  ==============================================
SIMPLE_RADIAL (k)      pinhole      radial (k, 0, 0, 0, 0, 0), tangential (0, 0)
RADIAL (k1 k2)         pinhole      radial (k1, k2, 0, 0, 0, 0), tangential (0, 0)
OPENCV (k1 k2 p1 p2)   pinhole      radial (k1, k2, 0, 0, 0, 0), tangential (p1, p2)
FULL_OPENCV            pinhole      radial (k1, k2, k3, k4, k5, k6), tangential (p1, p2)
(k1 k2 p1 p2 k3..k6)
OPENCV_FISHEYE         fisheye      radial (k1, k2, k3, k4)
SIMPLE_RADIAL_FISHEYE  fisheye      radial (k, 0, 0, 0)
RADIAL_FISHEYE         fisheye      radial (k1, k2, 0, 0)
THIN_PRISM_FISHEYE     fisheye      radial (k1, k2, k3, k4), when its tangential and
(k1 k2 p1 p2 k3 k4                  thin-prism terms (of the equidistant point, which gsplat's
sx1 sy1)                            fisheye lacks) move no pixel by more than NEGLIGIBLE_PX
=====================  ===========  ==============================================

The coefficients act on normalised points, so they stay as they are when the image is
downscaled (the focal lengths and centre scale, ``undistort.Camera.scaled``). A camera with no
such lens (``FOV``, or a thin prism gsplat cannot express) is undistorted on load in native
mode too, and says so in its log line (:mod:`.native`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from . import camera_models as cm

# a thin prism's terms that move no pixel further than this are left out (data/undistort.py's
# NEGLIGIBLE_PX, which leaves such a distortion as it is)
NEGLIGIBLE_PX = 0.1


@dataclass(frozen=True)
class Lens:
    """One camera's lens in gsplat's layout (see the module docstring).

    Attributes:
        camera_model: ``pinhole`` or ``fisheye`` (the rasterizer's).
        radial: 6 numbers for a pinhole, 4 for a fisheye.
        tangential: (p1, p2) of a pinhole, None for a fisheye.
        thin_prism: (s1, s2, s3, s4), or None.
    """

    camera_model: str
    radial: tuple[float, ...]
    tangential: tuple[float, float] | None = None
    thin_prism: tuple[float, float, float, float] | None = None

    def coeffs(self) -> dict[str, Tensor]:
        """The rasterizer's keywords of this lens (``radial_coeffs`` [6] or [4], and
        ``tangential_coeffs`` [2], ``thin_prism_coeffs`` [4] where given), float32."""
        out = {"radial_coeffs": self.radial, "tangential_coeffs": self.tangential,
               "thin_prism_coeffs": self.thin_prism}
        return {k: torch.tensor(v, dtype=torch.float32) for k, v in out.items() if v is not None}


def _pad(values: Sequence[float], n: int) -> tuple[float, ...]:
    return tuple(float(v) for v in values) + (0.0,) * (n - len(values))


def lens_of(model: str, params: Sequence[float], width: int, height: int) -> Lens | None:
    """The :class:`Lens` of a COLMAP camera (``model``, its ``params``, image size), or None
    when gsplat's cameras cannot hold it (pinhole and equidistant models need none: their
    camera is the rasterizer's as it is)."""
    array = np.asarray(params, dtype=np.float64)
    k = cm.extra_params(model, array)
    if model in ("SIMPLE_RADIAL", "RADIAL"):
        return Lens("pinhole", _pad(k, 6), (0.0, 0.0))
    if model == "OPENCV":
        return Lens("pinhole", _pad(k[:2], 6), (float(k[2]), float(k[3])))
    if model == "FULL_OPENCV":
        return Lens("pinhole", _pad([*k[:2], *k[4:8]], 6), (float(k[2]), float(k[3])))
    if model in ("OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        return Lens("fisheye", _pad(k, 4))
    if model == "THIN_PRISM_FISHEYE":
        k1, k2, _, _, k3, k4, _, _ = k
        radial_only = np.array([*cm.intrinsics(model, array), k1, k2, k3, k4])
        moved = cm.max_displacement(
            model, array, width, height,
            lambda rays: cm.img_from_ray("OPENCV_FISHEYE", radial_only, rays)[0])
        return Lens("fisheye", _pad([k1, k2, k3, k4], 4)) if moved <= NEGLIGIBLE_PX else None
    return None


def stacked(lenses: Sequence[Lens | None]) -> dict[str, Tensor] | None:
    """The rasterizer's lens keywords of C cameras (each coefficient [C, n]), or None when no
    camera has a lens.

    Raises:
        ValueError: cameras of different lens kinds in one batch.
    """
    kinds = {None if ln is None else (ln.camera_model, ln.tangential is None,
                                      ln.thin_prism is None) for ln in lenses}
    if len(kinds) > 1:
        raise ValueError("a batch needs cameras of one lens kind, got "
                         + ", ".join(sorted(str(k) for k in kinds)))
    if lenses[0] is None:
        return None
    per = [ln.coeffs() for ln in lenses]  # type: ignore[union-attr]
    return {k: torch.stack([c[k] for c in per]) for k in per[0]}
