"""Checks of the camera arguments of 3DGUT (``fully_fused_projection_with_ut``,
``rasterize_to_pixels_eval3d``, ``rasterization(with_ut=..., with_eval3d=...)``): the lens
coefficients, the f-theta parameters, the rolling shutter and the unscented transform's
parameters; and their conversion to what a backend takes (``backends/ut_camera.py``).

Each check raises one ``ValueError`` naming the argument, before any compute: a coefficient
tensor of the wrong shape (pinhole radial [..., C, 6], fisheye radial [..., C, 4],
tangential [..., C, 2], thin prism [..., C, 4]; coefficients the camera model does not take),
NaN or Inf coefficients, a lens that folds over inside the image (its radial map stops
increasing before it reaches the image's farthest corner, so two directions land on one
pixel), ``viewmats_rs`` without a rolling shutter or a rolling shutter without it.

The checks that read coefficient values (finite, folds) are skipped inside
:func:`.validation.internal_call`, where ``rasterization`` checked them once at its entry.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from ..backends.ut_camera import FThetaParams, UTCamera, UTParams
from ..constants import (
    FTHETA_ANGLE_TO_PIXELDIST,
    FTHETA_PIXELDIST_TO_ANGLE,
    SHUTTER_CODES,
    SHUTTER_GLOBAL,
    UT_CAMERA_MODELS,
)
from .validation import Shapes, check_bool, check_choice, check_tensor, values_trusted

FOLD_SAMPLES = 4096  # radii (or angles) at which a lens's radial map is checked to increase
# how far past the image's corner (in normalised radius) a pinhole's map is followed when it
# has not reached the corner yet: 10 is a ray at 84 degrees
PINHOLE_FOLD_REACH = 10.0

_SHUTTER_ROWS = (SHUTTER_CODES["ROLLING_TOP_TO_BOTTOM"], SHUTTER_CODES["ROLLING_BOTTOM_TO_TOP"])


def shutter_code(rolling_shutter: object) -> int:
    """gsplat's ``RollingShutterType`` (tilesplat's or gsplat's own enum) → its code."""
    name = getattr(rolling_shutter, "name", None)
    if name not in SHUTTER_CODES:
        raise ValueError(f"expected rolling_shutter to be a RollingShutterType "
                         f"({', '.join(SHUTTER_CODES)}), got {rolling_shutter!r}")
    return SHUTTER_CODES[name]


def ut_params_of(ut_params: Any) -> UTParams:
    """gsplat's ``UnscentedTransformParameters`` checked: alpha > 0, kappa > -3 (so the sigma
    points' spread alpha² (3 + kappa) is positive), a margin >= 0."""
    try:
        alpha, beta, kappa = ut_params.alpha, ut_params.beta, ut_params.kappa
        margin = ut_params.in_image_margin_factor
        require_all = ut_params.require_all_sigma_points_valid
    except AttributeError as exc:
        raise ValueError(f"expected ut_params to be an UnscentedTransformParameters, got "
                         f"{ut_params!r}") from exc
    for name, value in (("alpha", alpha), ("beta", beta), ("kappa", kappa),
                        ("in_image_margin_factor", margin)):
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
            raise ValueError(f"expected ut_params.{name} to be a finite number, got {value!r}")
    if alpha <= 0:
        raise ValueError(f"expected ut_params.alpha > 0, got {alpha!r}")
    if kappa <= -3:
        raise ValueError(f"expected ut_params.kappa > -3 (sigma points need alpha² (3 + kappa) "
                         f"> 0), got {kappa!r}")
    if margin < 0:
        raise ValueError(f"expected ut_params.in_image_margin_factor >= 0, got {margin!r}")
    check_bool("ut_params.require_all_sigma_points_valid", require_all)
    return UTParams(float(alpha), float(beta), float(kappa), float(margin), require_all)


def _floats(name: str, values: object, n: int) -> tuple[float, ...]:
    try:
        out = tuple(float(v) for v in values)  # type: ignore[union-attr]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"expected {name} to be {n} numbers, got {values!r}") from exc
    if len(out) != n:
        raise ValueError(f"expected {name} to be {n} numbers, got {len(out)}: {values!r}")
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name} contains NaN or Inf: {values!r}")
    return out


def ftheta_params_of(ftheta_coeffs: Any) -> FThetaParams:
    """gsplat's ``FThetaCameraDistortionParameters`` checked: six finite coefficients per
    polynomial, a positive max angle, an invertible linear term."""
    name = "ftheta_coeffs"
    try:
        reference = ftheta_coeffs.reference_poly
        bw, fw = ftheta_coeffs.pixeldist_to_angle_poly, ftheta_coeffs.angle_to_pixeldist_poly
        max_angle, cde = ftheta_coeffs.max_angle, ftheta_coeffs.linear_cde
    except AttributeError as exc:
        raise ValueError(f"expected {name} to be a FThetaCameraDistortionParameters, got "
                         f"{ftheta_coeffs!r}") from exc
    codes = {"PIXELDIST_TO_ANGLE": FTHETA_PIXELDIST_TO_ANGLE,
             "ANGLE_TO_PIXELDIST": FTHETA_ANGLE_TO_PIXELDIST}
    if getattr(reference, "name", None) not in codes:
        raise ValueError(f"expected {name}.reference_poly to be a FThetaPolynomialType, got "
                         f"{reference!r}")
    bw = _floats(f"{name}.pixeldist_to_angle_poly", bw, 6)
    fw = _floats(f"{name}.angle_to_pixeldist_poly", fw, 6)
    (max_angle,) = _floats(f"{name}.max_angle", [max_angle], 1)
    c, d, e = _floats(f"{name}.linear_cde", cde, 3)
    if max_angle <= 0:
        raise ValueError(f"expected {name}.max_angle > 0, got {max_angle!r}")
    if c - e * d == 0:
        raise ValueError(f"{name}.linear_cde = {(c, d, e)} makes the linear term "
                         "[[c, d], [e, 1]] singular (c - e d = 0)")
    return FThetaParams(codes[reference.name], bw, fw, max_angle, (c, d, e))  # type: ignore


def check_camera(
    shapes: Shapes,
    camera_model: str,
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    radial_coeffs: Tensor | None,  # [..., C, 6] or [..., C, 4]
    tangential_coeffs: Tensor | None,  # [..., C, 2]
    thin_prism_coeffs: Tensor | None,  # [..., C, 4]
    ftheta_coeffs: Any,
    rolling_shutter: object,
    viewmats_rs: Tensor | None,  # [..., C, 4, 4]
) -> UTCamera:
    """The camera of a 3DGUT op checked but for its values (``shapes`` has the batch dims and
    C bound), as a ``UTCamera`` whose tensors keep their [..., C] dims; the caller includes its
    tensors in its dtype and device checks (:func:`tensors`), then checks the values
    (:func:`check_camera_values`)."""
    check_choice("camera_model", camera_model, UT_CAMERA_MODELS)
    named = {"radial_coeffs": radial_coeffs, "tangential_coeffs": tangential_coeffs,
             "thin_prism_coeffs": thin_prism_coeffs, "viewmats_rs": viewmats_rs}
    for name, t in named.items():
        if t is not None:
            check_tensor(name, t)
    takes = {"pinhole": ("radial_coeffs", "tangential_coeffs", "thin_prism_coeffs"),
             "fisheye": ("radial_coeffs",), "ftheta": ()}[camera_model]
    for name in ("radial_coeffs", "tangential_coeffs", "thin_prism_coeffs"):
        if named[name] is not None and name not in takes:
            raise ValueError(f"{name} is not a parameter of camera_model={camera_model!r} "
                             f"(it takes {', '.join(takes) or 'ftheta_coeffs'})")
    if radial_coeffs is not None:
        shapes.check("radial_coeffs", radial_coeffs,
                     "..., C, 6" if camera_model == "pinhole" else "..., C, 4")
    if tangential_coeffs is not None:
        shapes.check("tangential_coeffs", tangential_coeffs, "..., C, 2")
    if thin_prism_coeffs is not None:
        shapes.check("thin_prism_coeffs", thin_prism_coeffs, "..., C, 4")
    ftheta = None
    if camera_model == "ftheta":
        if ftheta_coeffs is None:
            raise ValueError("camera_model='ftheta' needs ftheta_coeffs "
                             "(a FThetaCameraDistortionParameters)")
        ftheta = ftheta_params_of(ftheta_coeffs)
    elif ftheta_coeffs is not None:
        raise ValueError(f"ftheta_coeffs is a parameter of camera_model='ftheta', not "
                         f"{camera_model!r}")
    shutter = shutter_code(rolling_shutter)
    shutter_name = rolling_shutter.name  # type: ignore[attr-defined]
    if shutter == SHUTTER_GLOBAL and viewmats_rs is not None:
        raise ValueError("viewmats_rs=... is for a rolling shutter (the pose at the end of its "
                         "exposure); with rolling_shutter=GLOBAL leave it None")
    if shutter != SHUTTER_GLOBAL:
        if viewmats_rs is None:
            raise ValueError(f"rolling_shutter={shutter_name} needs viewmats_rs "
                             "(the pose at the end of the exposure) [..., C, 4, 4]")
        shapes.check("viewmats_rs", viewmats_rs, "..., C, 4, 4")
        size, what = (height, "height") if shutter in _SHUTTER_ROWS else (width, "width")
        if size < 2:
            raise ValueError(f"rolling_shutter={shutter_name} needs an image {what} "
                             f">= 2 (its time runs from the first to the last), got {size}")
    return UTCamera(camera_model, radial_coeffs, tangential_coeffs, thin_prism_coeffs, ftheta,
                    shutter, viewmats_rs)


def tensors(camera: UTCamera) -> dict[str, Tensor | None]:
    """The camera's tensors by argument name (for the dtype, device and finite checks)."""
    return {"radial_coeffs": camera.radial, "tangential_coeffs": camera.tangential,
            "thin_prism_coeffs": camera.thin_prism, "viewmats_rs": camera.viewmats_rs}


# ---------------------------------------------------------------------------------------------
# checks of values


def check_camera_values(camera: UTCamera, Ks: Tensor, width: int, height: int) -> None:
    """The coefficients finite (whatever ``set_check_finite`` says: the fold check needs them)
    and no lens folding over inside the image; skipped inside ``internal_call``."""
    if values_trusted():
        return
    named = {"Ks": Ks, "radial_coeffs": camera.radial, "tangential_coeffs": camera.tangential,
             "thin_prism_coeffs": camera.thin_prism}
    for name, t in named.items():
        if t is not None and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{name} contains {bad} NaN or Inf value(s)")
    K = Ks.detach().double().reshape(-1, 3, 3)
    if camera.radial is not None:
        k = camera.radial.detach().double().reshape(-1, camera.radial.shape[-1])
        _check_radial_fold(camera.model, k, K, width, height)
    if camera.ftheta is not None:
        _check_ftheta_fold(camera.ftheta, K, width, height)


def _poly(coeffs, x: Tensor) -> Tensor:
    y = torch.zeros_like(x)
    for c in reversed(coeffs):
        y = y * x + c
    return y


def _corner_radius(offsets: Tensor) -> Tensor:
    """The largest norm [I] of the image corners' offsets [I, 4, 2]."""
    return offsets.norm(dim=-1).amax(dim=-1)


def _corners(K: Tensor, width: int, height: int) -> Tensor:
    """The image corners [1, 4, 2] in pixels."""
    return K.new_tensor([[0, 0], [width, 0], [0, height], [width, height]])[None]


def _first_fold(x: Tensor, rho: Tensor, reach: Tensor) -> list[tuple[int, float]]:
    """Cameras whose radial map rho [I, S] (at increasing x [I, S] from 0) stops increasing
    before it first reaches ``reach`` [I]: (camera, x where it stops)."""
    rises = torch.cat([rho[:, :1] > 0, rho[:, 1:] > rho[:, :-1]], dim=1)
    reached = rho >= reach[:, None]
    samples = torch.arange(rho.shape[1], device=rho.device)
    # the samples up to the first that reaches the corner (all of them where none does)
    first = torch.where(reached.any(1), reached.float().argmax(1), rho.shape[1] - 1)
    bad = ~rises & (samples[None] <= first[:, None])
    out = []
    for i in bad.any(1).nonzero().flatten().tolist():
        j = int(bad[i].float().argmax())
        out.append((i, float(x[i, max(j - 1, 0)])))
    return out


def _check_radial_fold(camera_model: str, k: Tensor, K: Tensor, width: int,
                       height: int) -> None:
    """OpenCV pinhole: r icD(r) over the undistorted normalised radius r; fisheye:
    theta (1 + k1 theta² + ...) over the angle theta in [0, pi/2] (a point behind the camera
    projects nowhere). Either must increase until it reaches the image's farthest corner."""
    f = torch.stack([K[:, 0, 0], K[:, 1, 1]], dim=-1)[:, None]
    corner = _corner_radius((_corners(K, width, height) - K[:, None, :2, 2]) / f)  # [I]
    unit = torch.linspace(0.0, 1.0, FOLD_SAMPLES + 1, dtype=K.dtype, device=K.device)[1:]
    if camera_model == "pinhole":
        x = unit[None] * (PINHOLE_FOLD_REACH * corner.clamp_min(1.0))[:, None]
        r2 = x * x
        num = _poly([1.0, k[:, 0:1], k[:, 1:2], k[:, 2:3]], r2)
        den = _poly([1.0, k[:, 3:4], k[:, 4:5], k[:, 5:6]], r2)
        rho, what = x * num / den, "r icD(r) (normalised radius)"
    else:
        x = unit[None].expand(k.shape[0], -1) * (math.pi / 2)
        rho = x * _poly([1.0, *(k[:, i:i + 1] for i in range(4))], x * x)
        what = "theta_d(theta) (angle, rad)"
    for i, at in _first_fold(x, rho, corner):
        raise ValueError(
            f"radial_coeffs of camera {i} fold over inside the image: {what} stops "
            f"increasing at {at:.4g}, before it reaches the image's farthest corner "
            f"({float(corner[i]):.4g} normalised); two directions would land on one pixel")


def _check_ftheta_fold(ft: FThetaParams, K: Tensor, width: int, height: int) -> None:
    """The reference polynomial must increase over the image: the angle → pixel distance one
    until it reaches the farthest corner (angles up to min(max_angle, pi/2)), the pixel
    distance → angle one up to that corner (or until min(max_angle, pi/2))."""
    c, d, e = ft.linear_cde
    q = _corners(K, width, height) - (K[:, None, :2, 2] + 0.5)
    uv = torch.stack([q[..., 0] - d * q[..., 1], -e * q[..., 0] + c * q[..., 1]], -1) / (
        c - e * d)
    corner = _corner_radius(uv)  # pixels [I]
    top = min(ft.max_angle, math.pi / 2)
    unit = torch.linspace(0.0, 1.0, FOLD_SAMPLES + 1, dtype=K.dtype, device=K.device)[1:][None]
    if ft.reference == FTHETA_ANGLE_TO_PIXELDIST:
        x = unit.expand(K.shape[0], -1) * top
        rho, reach, what = _poly(ft.angle_to_pixeldist, x), corner, "angle_to_pixeldist_poly"
    else:
        x = unit * corner[:, None]
        rho, reach = _poly(ft.pixeldist_to_angle, x), torch.full_like(corner, top)
        what = "pixeldist_to_angle_poly"
    for i, at in _first_fold(x, rho, reach):
        raise ValueError(
            f"ftheta_coeffs.{what} folds over inside the image of camera {i}: it stops "
            f"increasing at {at:.4g}, before the image's farthest corner "
            f"({float(corner[i]):.4g} px from the principal point); two directions would land "
            "on one pixel")
