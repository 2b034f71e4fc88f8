"""Public camera ops and types of gsplat 1.5.3: ``world_to_cam``, ``proj``, and the types of
3DGUT's cameras (``RollingShutterType``, ``UnscentedTransformParameters``,
``FThetaCameraDistortionParameters``), which ``ops/ut.py`` takes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from torch import Tensor

from ..backends.cameras import CAMERA_MODELS
from ..backends.registry import resolve
from ..constants import FTHETA_ANGLE_TO_PIXELDIST, FTHETA_PIXELDIST_TO_ANGLE
from .validation import (
    Shapes,
    check_choice,
    check_finite,
    check_positive_int,
    check_tensor,
    common_float,
)

FTHETA_CODES = {"PIXELDIST_TO_ANGLE": FTHETA_PIXELDIST_TO_ANGLE,
                "ANGLE_TO_PIXELDIST": FTHETA_ANGLE_TO_PIXELDIST}


class RollingShutterType(Enum):
    """Shutter of a camera (gsplat's names and values): a rolling shutter exposes the image row
    by row (or column by column) from the pose ``viewmats`` to ``viewmats_rs`` (3DGUT)."""

    ROLLING_TOP_TO_BOTTOM = 0
    ROLLING_LEFT_TO_RIGHT = 1
    ROLLING_BOTTOM_TO_TOP = 2
    ROLLING_RIGHT_TO_LEFT = 3
    GLOBAL = 4

    def to_cpp(self) -> int:
        """What tilesplat's kernels take for it (gsplat's C++ enum; tilesplat has no C++
        extension): the shutter's code of ``constants.SHUTTER_CODES``."""
        from .lens import shutter_code

        return shutter_code(self)


@dataclass
class UnscentedTransformParameters:
    """Sigma-point parameters of gsplat's 3DGUT projection (``fully_fused_projection_with_ut``):
    spread ``alpha``, ``beta``, ``kappa``; a sigma point is valid within
    ``in_image_margin_factor`` × the image size of the image; all of them must be valid, or
    one suffices (``require_all_sigma_points_valid``)."""

    alpha: float = 0.1
    beta: float = 2.0
    kappa: float = 0.0
    in_image_margin_factor: float = 0.1
    require_all_sigma_points_valid: bool = True

    def to_cpp(self) -> Any:
        """What tilesplat's kernels take for it (gsplat's C++ struct): the checked
        ``backends.ut_camera.UTParams`` (``ValueError`` naming a bad field)."""
        from .lens import ut_params_of

        return ut_params_of(self)


class FThetaPolynomialType(Enum):
    PIXELDIST_TO_ANGLE = 0
    ANGLE_TO_PIXELDIST = 1

    def to_cpp(self) -> int:
        """What tilesplat's kernels take for it (gsplat's C++ enum): the polynomial's code,
        ``constants.FTHETA_PIXELDIST_TO_ANGLE`` or ``FTHETA_ANGLE_TO_PIXELDIST``."""
        return FTHETA_CODES[self.name]


@dataclass
class FThetaCameraDistortionParameters:
    """F-theta camera parameters of gsplat (``camera_model="ftheta"``, 3DGUT only): the pixel
    distance as a polynomial of the angle to the optical axis and back (increasing powers;
    ``reference_poly`` says which one is exact, the other starts Newton's inverse of it), the
    angle clamp ``max_angle`` and the linear term [[c, d], [e, 1]] of ``linear_cde``."""

    reference_poly: FThetaPolynomialType
    pixeldist_to_angle_poly: tuple[float, float, float, float, float, float]
    angle_to_pixeldist_poly: tuple[float, float, float, float, float, float]
    max_angle: float
    linear_cde: tuple[float, float, float]

    def to_cpp(self) -> Any:
        """What tilesplat's kernels take for it (gsplat's C++ struct): the checked
        ``backends.ut_camera.FThetaParams`` (``ValueError`` naming a bad field)."""
        from .lens import ftheta_params_of

        return ftheta_params_of(self)


def world_to_cam(
    means: Tensor,  # [..., N, 3]
    covars: Tensor,  # [..., N, 3, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Gaussians from world to camera coordinates (gsplat's ``world_to_cam``).

    Args:
        means: centres in world space. [..., N, 3]
        covars: covariances in world space. [..., N, 3, 3]
        viewmats: world-to-camera matrices. [..., C, 4, 4]
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (the torch reference serves all).

    Returns:
        means_c [..., C, N, 3] and covars_c [..., C, N, 3, 3] = R Σ Rᵀ.
    """
    named = {"means": means, "covars": covars, "viewmats": viewmats}
    for name, t in named.items():
        check_tensor(name, t)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    s.check("covars", covars, "..., N, 3, 3")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    _, device = common_float(named)
    check_finite(named)
    batch, N, C = means.shape[:-2], s["N"], s["C"]
    _, impl = resolve("world_to_cam", device, backend)
    means_c, covars_c = impl(means.reshape(-1, N, 3), covars.reshape(-1, N, 3, 3),
                             viewmats.reshape(-1, C, 4, 4))
    return means_c.reshape(*batch, C, N, 3), covars_c.reshape(*batch, C, N, 3, 3)


def proj(
    means: Tensor,  # [..., C, N, 3]
    covars: Tensor,  # [..., C, N, 3, 3]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    camera_model: str = "pinhole",
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Projection of camera-space Gaussians to the image (gsplat's ``proj``), no ``eps2d``.

    Args:
        means: centres in camera space. [..., C, N, 3]
        covars: covariances in camera space. [..., C, N, 3, 3]
        Ks: intrinsics. [..., C, 3, 3]
        width, height: image size in pixels (the pinhole Jacobian clamps to the widened view).
        camera_model: one of ``backends.cameras.CAMERA_MODELS`` (``pinhole``, ``ortho``,
            ``fisheye``; ``ftheta`` projects only by the unscented transform:
            ``fully_fused_projection_with_ut``).
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (the torch reference serves all).

    Returns:
        means2d [..., C, N, 2] and covars2d [..., C, N, 2, 2] = J Σ Jᵀ.
    """
    if camera_model == "ftheta":
        raise ValueError("proj(camera_model='ftheta'): the f-theta camera projects only by the "
                         "unscented transform (fully_fused_projection_with_ut), as in gsplat")
    check_choice("camera_model", camera_model, CAMERA_MODELS)
    width = check_positive_int("width", width)
    height = check_positive_int("height", height)
    named = {"means": means, "covars": covars, "Ks": Ks}
    for name, t in named.items():
        check_tensor(name, t)
    s = Shapes()
    s.check("means", means, "..., C, N, 3")
    s.check("covars", covars, "..., C, N, 3, 3")
    s.check("Ks", Ks, "..., C, 3, 3")
    _, device = common_float(named)
    check_finite(named)
    batch, C, N = means.shape[:-3], s["C"], s["N"]
    _, impl = resolve("proj", device, backend)
    means2d, covars2d = impl(means.reshape(-1, C, N, 3), covars.reshape(-1, C, N, 3, 3),
                             Ks.reshape(-1, C, 3, 3), width, height, camera_model)
    return means2d.reshape(*batch, C, N, 2), covars2d.reshape(*batch, C, N, 2, 2)
