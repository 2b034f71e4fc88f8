"""COLMAP's camera models in NumPy: pixels to rays and back, vectorised over many points.

The formulas are COLMAP's (``src/colmap/sensor/models.h``, documented at
https://colmap.github.io/cameras.html): image points are in pixels with the centre of the top-
left pixel at (0.5, 0.5); a perspective model distorts the normalised point (x/z, y/z); a
perspective fisheye model distorts the equidistant point (theta x/r, theta y/r), theta the
angle to the optical axis; FOV distorts the radius as atan(2 r tan(omega/2)) / omega. The
inverse of a distortion is COLMAP's damped Newton iteration (100 steps at most, each at most
10% of the point's radius or 0.1, stopping when the squared step falls below 1e-10), here
with a central-difference Jacobian, run on every point at once.

Rays are [..., 3] camera-space directions (OpenCV axes, z forward), not normalised: a
perspective model's rays have z = 1; a fisheye model's are unit vectors and may point
sideways (theta up to 180 degrees).

Used by the undistortion (:mod:`.undistort`) and by the captures the tests ray cast through a
distorted lens (:mod:`.captures`). Runs on the CPU in float64; no pycolmap needed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

# model -> number of focal lengths (1: f, 2: fx fy) and the names of its extra parameters
MODELS: dict[str, tuple[int, tuple[str, ...]]] = {
    "SIMPLE_PINHOLE": (1, ()),
    "PINHOLE": (2, ()),
    "SIMPLE_RADIAL": (1, ("k",)),
    "RADIAL": (1, ("k1", "k2")),
    "OPENCV": (2, ("k1", "k2", "p1", "p2")),
    "FULL_OPENCV": (2, ("k1", "k2", "p1", "p2", "k3", "k4", "k5", "k6")),
    "OPENCV_FISHEYE": (2, ("k1", "k2", "k3", "k4")),
    "THIN_PRISM_FISHEYE": (2, ("k1", "k2", "p1", "p2", "k3", "k4", "sx1", "sy1")),
    "SIMPLE_RADIAL_FISHEYE": (1, ("k",)),
    "RADIAL_FISHEYE": (1, ("k1", "k2")),
    "FOV": (2, ("omega",)),
    "SIMPLE_FISHEYE": (1, ()),
    "FISHEYE": (2, ()),
}
PINHOLE_MODELS = ("SIMPLE_PINHOLE", "PINHOLE")
# distort the normalised point (x/z, y/z)
PERSPECTIVE_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV",
                      "FULL_OPENCV")
# distort the equidistant point (theta x / r, theta y / r)
FISHEYE_MODELS = ("OPENCV_FISHEYE", "THIN_PRISM_FISHEYE", "SIMPLE_RADIAL_FISHEYE",
                  "RADIAL_FISHEYE", "SIMPLE_FISHEYE", "FISHEYE")
# the models whose zero-distortion limit is the rasterizer's equidistant fisheye
EQUIDISTANT_MODELS = FISHEYE_MODELS

NEWTON_STEPS = 100
NEWTON_MIN_STEP2 = 1e-10
NEWTON_REL_RADIUS = 0.1
NEWTON_RADIUS = 0.1
_EPS = np.finfo(np.float64).eps
_FOV_EPS = 1e-4  # COLMAP's switch to the Taylor expansions of the FOV model


def check_model(model: str, params: np.ndarray, where: str) -> None:
    """ValueError naming ``where`` when the model is unknown here or the parameter count wrong."""
    if model not in MODELS:
        raise ValueError(
            f"{where}: the camera model {model} is not supported; supported: "
            + ", ".join(MODELS)
        )
    n_focal, extra = MODELS[model]
    if len(params) != n_focal + 2 + len(extra):
        raise ValueError(
            f"{where}: {model} takes {n_focal + 2 + len(extra)} parameters, got {len(params)}"
        )


def intrinsics(model: str, params: np.ndarray) -> tuple[float, float, float, float]:
    """(fx, fy, cx, cy) of a camera."""
    p = [float(v) for v in params]
    if MODELS[model][0] == 1:
        return p[0], p[0], p[1], p[2]
    return p[0], p[1], p[2], p[3]


def extra_params(model: str, params: np.ndarray) -> np.ndarray:
    """The distortion parameters (after the focal lengths and principal point)."""
    return np.asarray(params[MODELS[model][0] + 2:], dtype=np.float64)


# --- distortions: (u, v) -> (du, dv), the displacement COLMAP adds ------------------------


def _radial_tangential(u: np.ndarray, v: np.ndarray, k: np.ndarray, model: str):
    r2 = u * u + v * v
    if model == "SIMPLE_RADIAL":
        radial = k[0] * r2
        return u * radial, v * radial
    if model == "RADIAL":
        radial = k[0] * r2 + k[1] * r2 * r2
        return u * radial, v * radial
    if model == "OPENCV":
        k1, k2, p1, p2 = k
        radial = k1 * r2 + k2 * r2 * r2
        return (u * radial + 2 * p1 * u * v + p2 * (r2 + 2 * u * u),
                v * radial + 2 * p2 * u * v + p1 * (r2 + 2 * v * v))
    if model == "FULL_OPENCV":
        k1, k2, p1, p2, k3, k4, k5, k6 = k
        r4, r6 = r2 * r2, r2 * r2 * r2
        radial = (1 + k1 * r2 + k2 * r4 + k3 * r6) / (1 + k4 * r2 + k5 * r4 + k6 * r6)
        return (u * radial + 2 * p1 * u * v + p2 * (r2 + 2 * u * u) - u,
                v * radial + 2 * p2 * u * v + p1 * (r2 + 2 * v * v) - v)
    if model == "THIN_PRISM_FISHEYE":  # of the equidistant point, as COLMAP's
        k1, k2, p1, p2, k3, k4, sx1, sy1 = k
        radial = r2 * (k1 + r2 * (k2 + r2 * (k3 + r2 * k4)))
        return (u * radial + 2 * p1 * u * v + p2 * (r2 + 2 * u * u) + sx1 * r2,
                v * radial + 2 * p2 * u * v + p1 * (r2 + 2 * v * v) + sy1 * r2)
    if model not in ("OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        return np.zeros_like(u), np.zeros_like(v)  # pinhole, equidistant: no distortion
    # a polynomial in theta^2 (u, v are the equidistant point here)
    radial = np.zeros_like(r2)
    power = r2
    for c in k:
        radial = radial + c * power
        power = power * r2
    return u * radial, v * radial


def _fov_factor(r2: np.ndarray, omega: float, inverse: bool) -> np.ndarray:
    """COLMAP's FOV radius factor (distorted / undistorted radius, or its inverse)."""
    w2 = omega * omega
    if w2 < _FOV_EPS:
        return w2 * r2 / 3.0 - w2 / 12.0 + 1.0
    t = np.tan(omega / 2.0)
    r = np.sqrt(r2)
    with np.errstate(divide="ignore", invalid="ignore"):
        if inverse:
            exact = np.tan(r * omega) / (r * 2.0 * t)
            small = omega * (w2 * r2 + 3.0) / (6.0 * t)
        else:
            exact = np.arctan(r * 2.0 * t) / (r * omega)
            small = -2.0 * t * (4.0 * r2 * t * t - 3.0) / (3.0 * omega)
    return np.where(r2 < _FOV_EPS, small, exact)


def _undistort(model: str, k: np.ndarray, xd: np.ndarray, yd: np.ndarray):
    """(u, v, converged) with u + du(u, v) = xd, v + dv(u, v) = yd: COLMAP's iteration."""
    x0 = np.stack([xd, yd], -1)
    x = x0.copy()
    done = np.zeros(xd.shape, dtype=bool)
    h = 1e-7

    def f(p: np.ndarray) -> np.ndarray:
        du, dv = _radial_tangential(p[..., 0], p[..., 1], k, model)
        return np.stack([du, dv], -1)

    for _ in range(NEWTON_STEPS):
        live = ~done
        if not live.any():
            break
        p = x[live]
        d = f(p)
        # Jacobian of p + d(p), by central differences
        ex = np.array([h, 0.0])
        ey = np.array([0.0, h])
        jx = (f(p + ex) - f(p - ex)) / (2 * h)
        jy = (f(p + ey) - f(p - ey)) / (2 * h)
        a, b = jx[..., 0] + 1.0, jy[..., 0]
        c, e = jx[..., 1], jy[..., 1] + 1.0
        rx, ry = p[..., 0] + d[..., 0] - x0[live][..., 0], p[..., 1] + d[..., 1] - x0[live][..., 1]
        det = a * e - b * c
        with np.errstate(divide="ignore", invalid="ignore"):
            sx = (e * rx - b * ry) / det
            sy = (a * ry - c * rx) / det
        step = np.stack([sx, sy], -1)
        radius2 = np.maximum((p * p).sum(-1) * NEWTON_REL_RADIUS**2, NEWTON_RADIUS**2)
        norm2 = (step * step).sum(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            shrink = np.where(norm2 > radius2, np.sqrt(radius2 / norm2), 1.0)
        step = step * shrink[..., None]
        x[live] = p - step
        idx = np.flatnonzero(live.ravel())
        finished = (step * step).sum(-1) < NEWTON_MIN_STEP2
        done.ravel()[idx[finished]] = True
    return x[..., 0], x[..., 1], done & np.isfinite(x).all(-1)


# --- pixels <-> rays ------------------------------------------------------------------------


def img_from_ray(model: str, params: np.ndarray, rays: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Pixels [..., 2] of camera-space rays [..., 3], and where they are defined [...].

    A perspective model (and FOV) needs z > 0 (as COLMAP's cheirality check); a fisheye model
    takes any direction but the backward axis."""
    fx, fy, cx, cy = intrinsics(model, params)
    k = extra_params(model, params)
    x, y, z = rays[..., 0], rays[..., 1], rays[..., 2]
    if model in FISHEYE_MODELS:
        r = np.sqrt(x * x + y * y)
        theta = np.arctan2(r, z)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(r > _EPS, theta / r, 1.0 / np.maximum(z, _EPS))
        u, v = x * scale, y * scale
        du, dv = _radial_tangential(u, v, k, model)
        valid = theta < np.pi - 1e-9
        return np.stack([fx * (u + du) + cx, fy * (v + dv) + cy], -1), valid
    valid = z >= _EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        u, v = x / z, y / z
    if model == "FOV":
        factor = _fov_factor(u * u + v * v, float(k[0]), inverse=False)
        ud, vd = u * factor, v * factor
    else:
        du, dv = _radial_tangential(u, v, k, model)
        ud, vd = u + du, v + dv
    out = np.stack([fx * ud + cx, fy * vd + cy], -1)
    return np.where(valid[..., None], out, np.nan), valid & np.isfinite(out).all(-1)


def ray_from_img(model: str, params: np.ndarray, xy: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Camera-space rays [..., 3] through pixels xy [..., 2], and where the inverse converged.

    Perspective models give rays with z = 1 (COLMAP's ``CamFromImg``); fisheye models give
    unit rays."""
    fx, fy, cx, cy = intrinsics(model, params)
    k = extra_params(model, params)
    xd, yd = (xy[..., 0] - cx) / fx, (xy[..., 1] - cy) / fy
    if model == "FOV":
        factor = _fov_factor(xd * xd + yd * yd, float(k[0]), inverse=True)
        u, v, ok = xd * factor, yd * factor, np.isfinite(factor)
        return np.stack([u, v, np.ones_like(u)], -1), ok
    if model in PINHOLE_MODELS or model in ("SIMPLE_FISHEYE", "FISHEYE"):
        u, v, ok = xd, yd, np.ones(xd.shape, dtype=bool)
    else:
        u, v, ok = _undistort(model, k, xd, yd)
    if model in PERSPECTIVE_MODELS:
        return np.stack([u, v, np.ones_like(u)], -1), ok
    theta = np.sqrt(u * u + v * v)
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.where(theta > _EPS, np.sin(theta) / theta, 1.0)
    return np.stack([u * s, v * s, np.cos(theta)], -1), ok & (theta < np.pi)


def pixel_grid(width: int, height: int) -> np.ndarray:
    """[height, width, 2] pixel centres (x + 0.5, y + 0.5)."""
    ys, xs = np.meshgrid(np.arange(height) + 0.5, np.arange(width) + 0.5, indexing="ij")
    return np.stack([xs, ys], -1)


def border_points(width: int, height: int) -> np.ndarray:
    """[2 (W + H), 2] the centres of the outermost pixels, as COLMAP scans them."""
    xs = np.arange(width) + 0.5
    ys = np.arange(height) + 0.5
    return np.concatenate([
        np.stack([np.full_like(ys, 0.5), ys], -1),
        np.stack([np.full_like(ys, width - 0.5), ys], -1),
        np.stack([xs, np.full_like(xs, 0.5)], -1),
        np.stack([xs, np.full_like(xs, height - 0.5)], -1),
    ])


def max_off_axis_degrees(model: str, params: np.ndarray, width: int, height: int) -> float:
    """The largest angle between the optical axis and a ray through a border pixel."""
    rays, ok = ray_from_img(model, params, border_points(width, height))
    rays = rays[ok]
    if not len(rays):
        return 180.0
    r = np.sqrt(rays[:, 0] ** 2 + rays[:, 1] ** 2)
    return float(np.degrees(np.arctan2(r, rays[:, 2]).max()))


def max_displacement(model: str, params: np.ndarray, width: int, height: int,
                     reference: Callable[[np.ndarray], np.ndarray]) -> float:
    """The largest distance in pixels, over a grid of the image, between where the camera and
    ``reference`` (rays [..., 3] -> pixels [..., 2], the same intrinsics undistorted) put the
    same rays: how far the distortion moves any pixel."""
    step = max(1, min(width, height) // 32)
    grid = pixel_grid(width, height)[::step, ::step].reshape(-1, 2)
    pts = np.concatenate([grid, border_points(width, height)])
    rays, ok = ray_from_img(model, params, pts)
    if not ok.all():
        return float("inf")
    return float(np.linalg.norm(reference(rays) - pts, axis=-1).max())
