"""Reference: the exact cameras of 3DGUT, as gsplat 1.5.3 defines them (``Cameras.cuh``) —
image point of a camera-space point, the camera ray of an image point (the distortion
inverted by Newton's method), and the rolling shutter's pose at the time of a pixel.

Plain PyTorch on tensors of any shape: a camera's parameters are shaped to broadcast against
the points it maps ([*cameras, 1, ..., k]), so one call maps every point of every camera. Each
function is the twin of a scalar ``@njit(inline="always")`` function the native backends will
share, and keeps gsplat's control flow in vector form: a Newton loop that ``break``s becomes a
fixed number of steps under a mask of the entries still iterating. Nothing here is
differentiated (gsplat's 3DGUT gives no gradient to the camera), so the branches of the
models are ``torch.where`` on values that may be garbage where they are not taken.

Models (``UTCamera.model``):

- perfect pinhole (``pinhole`` without coefficients): ``p = f (x, y) / z + c``;
- OpenCV pinhole (``pinhole`` with any of radial k1..k6, tangential p1, p2, thin prism
  s1..s4): ``p = f (icD uv + delta(uv)) + c``, ``uv = (x, y) / z``,
  ``icD = (1 + k1 r² + k2 r⁴ + k3 r⁶) / (1 + k4 r² + k5 r⁴ + k6 r⁶)``, ``r² = |uv|²``;
  a point with ``icD <= 0.8`` is invalid;
- OpenCV fisheye (``fisheye``, k1..k4): ``p = f (theta_d / |xy|) (x, y) + c`` with
  ``theta_d = theta (1 + k1 theta² + ... + k4 theta⁸)``, theta the angle to the optical axis,
  clamped to the lens's max angle;
- f-theta (``ftheta``): pixel distance ``delta(theta)`` from the reference polynomial (or the
  Newton inverse of the backward one), the offset ``A delta (x, y) / |xy|`` with
  ``A = [[c, d], [e, 1]]``, around the principal point moved by half a pixel (gsplat: the
  model's image origin is the first pixel's centre).

Every model marks a point behind the camera (z <= 0) invalid and maps it to (0, 0), and a
point outside the image widened by ``margin`` × its size invalid.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ...constants import (
    FISHEYE_MAX_ANGLE_START,
    FISHEYE_NEWTON_STEPS,
    FTHETA_ANGLE_TO_PIXELDIST,
    FTHETA_NEWTON_STEPS,
    MIN_2D_NORM,
    NEWTON_TOLERANCE,
    PINHOLE_MIN_RADIAL_FACTOR,
    PINHOLE_NEWTON_STEPS,
    ROLLING_SHUTTER_ITERATIONS,
    SHUTTER_CODES,
    SHUTTER_GLOBAL,
)
from ..ut_camera import UTCamera
from .covariance import quat_to_rotmat

# ---------------------------------------------------------------------------------------------
# polynomials and Newton's method


def horner(coeffs: Sequence[Tensor | float], x: Tensor) -> Tensor:
    """c0 + c1 x + c2 x² + ... for ``coeffs`` in increasing powers (tensors broadcast)."""
    y = torch.zeros_like(x)
    for c in reversed(coeffs):
        y = y * x + c
    return y


def newton_inverse(f: Callable[[Tensor], Tensor], df: Callable[[Tensor], Tensor], start: Tensor,
                   target: Tensor | float, steps: int) -> tuple[Tensor, Tensor]:
    """x with f(x) = target by at most ``steps`` Newton steps from ``start``; an entry stops
    (converged) after its first step shorter than NEWTON_TOLERANCE, as gsplat's loop breaks.

    Returns x and whether it converged (both shaped as ``start`` and ``target`` broadcast).
    """
    x = start + torch.zeros_like(torch.as_tensor(target, dtype=start.dtype, device=start.device))
    converged = torch.zeros(x.shape, dtype=torch.bool, device=x.device)
    for _ in range(steps):
        dx = (f(x) - target) / df(x)
        x = torch.where(converged, x, x - dx)
        converged = converged | (dx.abs() < NEWTON_TOLERANCE)
    return x, converged


def _cbrt(x: Tensor) -> Tensor:
    return torch.sign(x) * x.abs().pow(1.0 / 3.0)


def smallest_positive_root(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """The smallest positive real root of ``1 + a x + b x² + c x³`` (inf where there is none).

    With y = 1/x it is the largest positive root of the monic ``y³ + a y² + b y + c``, which
    holds every degree (c = 0 is a root y = 0, never positive): Cardano's formula where the
    cubic has one real root, the trigonometric form's largest where it has three.
    """
    p = b - a * a / 3.0
    q = 2.0 * a**3 / 27.0 - a * b / 3.0 + c
    disc = (q / 2.0) ** 2 + (p / 3.0) ** 3
    root = disc.clamp_min(0.0).sqrt()
    one_real = _cbrt(-q / 2.0 + root) + _cbrt(-q / 2.0 - root)
    p_neg = p.clamp_max(-torch.finfo(p.dtype).tiny)  # three real roots: p < 0
    m = 2.0 * torch.sqrt(-p_neg / 3.0)
    phi = torch.acos((3.0 * q / (p_neg * m)).clamp(-1.0, 1.0))
    three_real = m * torch.cos(phi / 3.0)
    y = torch.where(disc >= 0, one_real, three_real) - a / 3.0
    return torch.where(y > 0, 1.0 / y.clamp_min(torch.finfo(y.dtype).tiny),
                       torch.full_like(y, math.inf))


# ---------------------------------------------------------------------------------------------
# poses and the rolling shutter


def rotmat_to_quat(R: Tensor) -> Tensor:
    """Unit quaternions (w, x, y, z) [..., 4] of rotation matrices [..., 3, 3]; each from the
    largest of |w|, |x|, |y|, |z| (the others are divided by it), so none loses precision."""
    m00, m01, m02 = R[..., 0, 0], R[..., 0, 1], R[..., 0, 2]
    m10, m11, m12 = R[..., 1, 0], R[..., 1, 1], R[..., 1, 2]
    m20, m21, m22 = R[..., 2, 0], R[..., 2, 1], R[..., 2, 2]
    four_sq = torch.stack([1 + m00 + m11 + m22, 1 + m00 - m11 - m22,
                           1 - m00 + m11 - m22, 1 - m00 - m11 + m22], dim=-1)  # 4 w², 4 x², ...
    big = four_sq.argmax(dim=-1, keepdim=True)
    s = torch.sqrt(four_sq.gather(-1, big).clamp_min(0.0))[..., 0] * 2.0  # 4 |largest|
    candidates = torch.stack([
        torch.stack([s / 4, (m21 - m12) / s, (m02 - m20) / s, (m10 - m01) / s], dim=-1),
        torch.stack([(m21 - m12) / s, s / 4, (m01 + m10) / s, (m02 + m20) / s], dim=-1),
        torch.stack([(m02 - m20) / s, (m01 + m10) / s, s / 4, (m12 + m21) / s], dim=-1),
        torch.stack([(m10 - m01) / s, (m02 + m20) / s, (m12 + m21) / s, s / 4], dim=-1),
    ], dim=-2)  # [..., 4 candidates, 4]
    q = candidates.gather(-2, big[..., None].expand(*big.shape[:-1], 1, 4))[..., 0, :]
    return q / q.norm(dim=-1, keepdim=True)


def slerp(q0: Tensor, q1: Tensor, tau: Tensor) -> Tensor:
    """Unit quaternion at ``tau`` on the shorter arc from q0 (tau = 0) to q1 (tau = 1), as
    glm's ``slerp`` then ``normalize``: q1 is negated when the arc through it is the longer
    one; nearly equal quaternions are interpolated linearly. ``tau`` may leave [0, 1]
    (extrapolation, as gsplat's shutter time does for points projected off the image)."""
    tau = tau[..., None]
    cos = (q0 * q1).sum(-1, keepdim=True)
    q1 = torch.where(cos < 0, -q1, q1)
    cos = cos.abs()
    near = cos > 1.0 - torch.finfo(cos.dtype).eps
    angle = torch.acos(cos.clamp(max=1.0))
    sin = torch.sin(angle)
    safe_sin = torch.where(near, torch.ones_like(sin), sin)
    arc = (torch.sin((1.0 - tau) * angle) * q0 + torch.sin(tau * angle) * q1) / safe_sin
    q = torch.where(near, q0 + tau * (q1 - q0), arc)
    return q / q.norm(dim=-1, keepdim=True)


def shutter_time(points: Tensor, shutter: int, width: int, height: int) -> Tensor:
    """The exposure time in [0, 1] of image points [..., 2] (pixels) on a rolling shutter:
    row by row (top to bottom: floor(y) / (H - 1); bottom to top: (H - ceil(y)) / (H - 1)) or
    column by column; 0 for the global shutter. A pixel centre (i + 0.5) gets i / (H - 1)."""
    x, y = points[..., 0], points[..., 1]
    if shutter == SHUTTER_CODES["ROLLING_TOP_TO_BOTTOM"]:
        return torch.floor(y) / (height - 1)
    if shutter == SHUTTER_CODES["ROLLING_LEFT_TO_RIGHT"]:
        return torch.floor(x) / (width - 1)
    if shutter == SHUTTER_CODES["ROLLING_BOTTOM_TO_TOP"]:
        return (height - torch.ceil(y)) / (height - 1)
    if shutter == SHUTTER_CODES["ROLLING_RIGHT_TO_LEFT"]:
        return (width - torch.ceil(x)) / (width - 1)
    return torch.zeros_like(x)


def _pad(t: Tensor, point_dims: int, tail: int) -> Tensor:
    """[*cameras, *tail] → [*cameras, 1 × point_dims, *tail], to broadcast against points."""
    lead = t.shape[: t.dim() - tail]
    return t.reshape(*lead, *([1] * point_dims), *t.shape[t.dim() - tail:])


class Shutter:
    """The poses of a shutter: world → camera ``viewmats`` at the start of the exposure and
    ``viewmats_rs`` at its end; the pose at time tau is the linear interpolation of the
    translations and the slerp of the rotations (gsplat's ``interpolate_shutter_pose``)."""

    def __init__(self, viewmats: Tensor, viewmats_rs: Tensor | None, shutter: int, width: int,
                 height: int, point_dims: int) -> None:
        """``viewmats``, ``viewmats_rs``: [*cameras, 4, 4]; the points posed by it have
        ``point_dims`` dims after the camera dims."""
        self.code, self.width, self.height = shutter, width, height
        self.R0 = _pad(viewmats[..., :3, :3], point_dims, 2)
        self.t0 = _pad(viewmats[..., :3, 3], point_dims, 1)
        self.rolling = viewmats_rs is not None and shutter != SHUTTER_GLOBAL
        if self.rolling:
            self.R1 = _pad(viewmats_rs[..., :3, :3], point_dims, 2)
            self.t1 = _pad(viewmats_rs[..., :3, 3], point_dims, 1)
            self.q0, self.q1 = rotmat_to_quat(self.R0), rotmat_to_quat(self.R1)

    def pose(self, tau: Tensor | float) -> tuple[Tensor, Tensor]:
        """(R [..., 3, 3], t [..., 3]) at time ``tau`` (a tensor of the points' shape, or a
        number); the start pose itself (no quaternion round trip) without a rolling shutter."""
        if not self.rolling:
            return self.R0, self.t0
        tau = torch.as_tensor(tau, dtype=self.t0.dtype, device=self.t0.device)
        R = quat_to_rotmat(slerp(self.q0, self.q1, tau))
        t = (1.0 - tau[..., None]) * self.t0 + tau[..., None] * self.t1
        return R, t

    def time(self, points: Tensor) -> Tensor:
        """The exposure time of image points [..., 2]."""
        return shutter_time(points, self.code, self.width, self.height)


def transform(R: Tensor, t: Tensor, p: Tensor) -> Tensor:
    """R p + t for points [..., 3] (R [..., 3, 3] and t [..., 3] broadcast)."""
    return (R @ p[..., None])[..., 0] + t


# ---------------------------------------------------------------------------------------------
# lens models


def opencv_distortion(uv: Tensor, k: Tensor, p: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """OpenCV's radial factor icD [...] and offset delta [..., 2] at undistorted normalised
    points uv [..., 2], for radial k [..., 6], tangential p [..., 2], thin prism s [..., 4]."""
    u, v = uv[..., 0], uv[..., 1]
    r2 = u * u + v * v
    k1, k2, k3, k4, k5, k6 = k.unbind(-1)
    icD = horner([1.0, k1, k2, k3], r2) / horner([1.0, k4, k5, k6], r2)
    p1, p2 = p.unbind(-1)
    s1, s2, s3, s4 = s.unbind(-1)
    du = 2 * p1 * u * v + p2 * (r2 + 2 * u * u) + r2 * (s1 + r2 * s2)
    dv = p1 * (r2 + 2 * v * v) + 2 * p2 * u * v + r2 * (s3 + r2 * s4)
    return icD, torch.stack([du, dv], dim=-1)


def _opencv_residual_jacobian(x, y, xd, yd, k, p, s):
    """The distortion minus its target (xd, yd) at (x, y), and its Jacobian; ``ok`` is False
    where the radial factor is <= 0 (a flipped point, which no lens makes)."""
    k1, k2, k3, k4, k5, k6 = k.unbind(-1)
    p1, p2 = p.unbind(-1)
    s1, s2, s3, s4 = s.unbind(-1)
    r = x * x + y * y
    num, den = horner([1.0, k1, k2, k3], r), horner([1.0, k4, k5, k6], r)
    d = num / den
    # d(icD)/d(r²) by the quotient rule
    d_r = (horner([k1, 2 * k2, 3 * k3], r) * den - num * horner([k4, 2 * k5, 3 * k6], r)) / (
        den * den)
    fx = d * x + 2 * p1 * x * y + p2 * (r + 2 * x * x) + s1 * r + s2 * r * r - xd
    fy = d * y + 2 * p2 * x * y + p1 * (r + 2 * y * y) + s3 * r + s4 * r * r - yd
    fx_x = d + 2 * x * x * d_r + 2 * p1 * y + 6 * p2 * x + 2 * x * (s1 + 2 * s2 * r)
    fx_y = 2 * x * y * d_r + 2 * p1 * x + 2 * p2 * y + 2 * y * (s1 + 2 * s2 * r)
    fy_x = 2 * x * y * d_r + 2 * p2 * y + 2 * p1 * x + 2 * x * (s3 + 2 * s4 * r)
    fy_y = d + 2 * y * y * d_r + 2 * p2 * x + 6 * p1 * y + 2 * y * (s3 + 2 * s4 * r)
    return fx, fy, fx_x, fx_y, fy_x, fy_y, d > 0


def opencv_undistort(uv_d: Tensor, k: Tensor, p: Tensor, s: Tensor) -> tuple[Tensor, Tensor]:
    """Undistorted normalised points [..., 2] of distorted ones by at most PINHOLE_NEWTON_STEPS
    Newton steps from the distorted point itself; an entry stops unconverged at a flipped
    point or a Jacobian with |det| < NEWTON_TOLERANCE, converged after a step shorter than
    NEWTON_TOLERANCE in both coordinates. Returns the points and whether they converged."""
    xd, yd = uv_d[..., 0], uv_d[..., 1]
    x, y = xd, yd
    active = torch.ones(xd.shape, dtype=torch.bool, device=xd.device)
    converged = torch.zeros_like(active)
    for _ in range(PINHOLE_NEWTON_STEPS):
        fx, fy, fx_x, fx_y, fy_x, fy_y, ok = _opencv_residual_jacobian(x, y, xd, yd, k, p, s)
        det = fx_y * fy_x - fx_x * fy_y
        step = active & ok & (det.abs() >= NEWTON_TOLERANCE)
        safe_det = torch.where(step, det, torch.ones_like(det))
        dx = (fx * fy_y - fy * fx_y) / safe_det
        dy = (fy * fx_x - fx * fy_x) / safe_det
        x = torch.where(step, x + dx, x)
        y = torch.where(step, y + dy, y)
        done = step & (dx.abs() < NEWTON_TOLERANCE) & (dy.abs() < NEWTON_TOLERANCE)
        converged = converged | done
        active = step & ~done
    return torch.stack([x, y], dim=-1), converged


def fisheye_max_angle(radial: Tensor, focal: Tensor, principal: Tensor, width: int,
                      height: int) -> Tensor:
    """The largest angle [*cameras] a fisheye (k1..k4 [*cameras, 4]) projects, in float64:
    where theta_d(theta) stops increasing (its derivative's first positive root: the cubic's in
    theta² when k4 = 0; else Newton's root from 1.57 rad, none if it fails), at most the
    angle of the image's farthest corner as an equidistant lens would see it."""
    k1, k2, k3, k4 = radial.double().unbind(-1)
    theta_cubic = torch.sqrt(smallest_positive_root(3 * k1, 5 * k2, 7 * k3))

    def slope(t):  # d theta_d / d theta
        return horner([1.0, 3 * k1, 5 * k2, 7 * k3, 9 * k4], t * t)

    def curvature(t):
        return t * horner([6 * k1, 20 * k2, 42 * k3, 72 * k4], t * t)

    start = torch.full_like(k1, FISHEYE_MAX_ANGLE_START)
    theta_newton, ok = newton_inverse(slope, curvature, start, 0.0, FISHEYE_NEWTON_STEPS)
    theta_newton = torch.where(ok & (theta_newton > 0), theta_newton,
                               torch.full_like(k1, math.inf))
    theta = torch.where(k4 == 0, theta_cubic, theta_newton)
    f, c = focal.double(), principal.double()
    far_x = torch.maximum(width - c[..., 0], c[..., 0])
    far_y = torch.maximum(height - c[..., 1], c[..., 1])
    corner = torch.sqrt(far_x * far_x + far_y * far_y)
    return torch.minimum(theta, torch.maximum(corner / f[..., 0], corner / f[..., 1]))


class Lens:
    """The lens of each camera, shaped to broadcast against the points it maps (``point_dims``
    dims after the camera dims): ``project`` and ``unproject`` dispatch on the model."""

    def __init__(self, camera: UTCamera, Ks: Tensor, width: int, height: int, margin: float,
                 point_dims: int) -> None:
        """``camera``'s tensors and ``Ks`` [*cameras, 3, 3] lead with the same camera dims."""
        self.model, self.width, self.height, self.margin = camera.model, width, height, margin
        focal = torch.stack([Ks[..., 0, 0], Ks[..., 1, 1]], dim=-1)
        principal = Ks[..., :2, 2]
        self.focal = _pad(focal, point_dims, 1)
        self.principal = _pad(principal, point_dims, 1)
        zeros = focal.new_zeros(focal.shape[:-1])

        def coeffs(t: Tensor | None, n: int) -> Tensor:
            return _pad(torch.stack([zeros] * n, dim=-1) if t is None else t, point_dims, 1)

        self.opencv = camera.model == "pinhole" and any(
            t is not None for t in (camera.radial, camera.tangential, camera.thin_prism))
        if self.opencv:
            self.k = coeffs(camera.radial, 6)
            self.p = coeffs(camera.tangential, 2)
            self.s = coeffs(camera.thin_prism, 4)
        elif camera.model == "fisheye":
            self.k = coeffs(camera.radial, 4)
            k = torch.stack([zeros] * 4, dim=-1) if camera.radial is None else camera.radial
            max_angle = fisheye_max_angle(k, focal, principal, width, height)
            # Newton's start for the inverse: the equidistant slope that reaches the max angle
            # at the image's half size (gsplat's crude backward polynomial)
            half = torch.maximum(width / 2.0 / focal[..., 0].double(),
                                 height / 2.0 / focal[..., 1].double())
            self.max_angle = _pad(max_angle.to(focal.dtype)[..., None], point_dims, 1)[..., 0]
            self.inverse_slope = _pad((max_angle / half).to(focal.dtype)[..., None],
                                      point_dims, 1)[..., 0]
        elif camera.model == "ftheta":
            self.ftheta = camera.ftheta
            # the model's image origin is the centre of the first pixel
            self.principal = self.principal + 0.5

    # -- forward: camera-space points → image points

    def _in_image(self, image: Tensor) -> Tensor:
        mx, my = self.width * self.margin, self.height * self.margin
        x, y = image[..., 0], image[..., 1]
        return (x >= -mx) & (x < self.width + mx) & (y >= -my) & (y < self.height + my)

    def project(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """Image points [..., 2] of camera-space points [..., 3] and whether each is valid
        (in front of the camera, within the margin, and the model's own test)."""
        z = p[..., 2]
        front = z > 0
        safe_z = torch.where(front, z, torch.ones_like(z))
        if self.model == "pinhole":
            uv = p[..., :2] / safe_z[..., None]
            ok = front
            if self.opencv:
                icD, delta = opencv_distortion(uv, self.k, self.p, self.s)
                uv = icD[..., None] * uv + delta
                ok = ok & (icD > PINHOLE_MIN_RADIAL_FACTOR)
            image = uv * self.focal + self.principal
        else:
            image, ok = self._project_angular(p, front, safe_z)
        image = torch.where(front[..., None], image, torch.zeros_like(image))
        return image, ok & self._in_image(image)

    def _project_angular(self, p: Tensor, front: Tensor, safe_z: Tensor):
        """fisheye and f-theta: the image radius is a function of the angle to the axis."""
        norm = torch.hypot(p[..., 0], p[..., 1])
        norm = torch.where(norm > 0, norm, torch.full_like(norm, torch.finfo(norm.dtype).eps))
        theta_full = torch.atan2(norm, safe_z)
        direction = p[..., :2] / norm[..., None]
        if self.model == "fisheye":
            # clamped to the max angle; gsplat's "theta <= max_angle" test after the clamp
            # always holds, so a clamped point stays valid (the code, not its comment)
            theta = torch.minimum(theta_full, self.max_angle)
            theta_d = theta * horner([1.0, *self.k.unbind(-1)], theta * theta)
            ok = front & (theta_d > 0)  # a negative radius flips the point: no lens does that
            image = self.focal * theta_d[..., None] * direction + self.principal
            return torch.where(ok[..., None], image, torch.zeros_like(image)), ok
        ft = self.ftheta
        theta = theta_full.clamp_max(ft.max_angle)
        if ft.reference == FTHETA_ANGLE_TO_PIXELDIST:
            delta, converged = horner(ft.angle_to_pixeldist, theta), front
        else:
            bw = ft.pixeldist_to_angle
            delta, converged = newton_inverse(
                lambda d: horner(bw, d), lambda d: horner(_derivative(bw), d),
                horner(ft.angle_to_pixeldist, theta), theta, FTHETA_NEWTON_STEPS)
        c, d, e = ft.linear_cde
        q = delta[..., None] * direction
        offset = torch.stack([c * q[..., 0] + d * q[..., 1], e * q[..., 0] + q[..., 1]], dim=-1)
        ok = front & converged
        image = offset + self.principal
        return torch.where(ok[..., None], image, torch.zeros_like(image)), ok

    # -- backward: image points → camera rays

    def unproject(self, image: Tensor) -> tuple[Tensor, Tensor]:
        """Unit camera-space rays [..., 3] through image points [..., 2] and whether each is
        valid (the inverse converged, and the fisheye's angle is below its max angle);
        invalid rays are (0, 0, 1)."""
        if self.model == "pinhole":
            uv = (image - self.principal) / self.focal
            ok = torch.ones(uv.shape[:-1], dtype=torch.bool, device=uv.device)
            if self.opencv:
                uv, ok = opencv_undistort(uv, self.k, self.p, self.s)
            ray = torch.cat([uv, torch.ones_like(uv[..., :1])], dim=-1)
            ray = ray / ray.norm(dim=-1, keepdim=True)
        else:
            if self.model == "fisheye":
                uv = (image - self.principal) / self.focal
                delta = uv.norm(dim=-1)
                k = [1.0, *self.k.unbind(-1)]
                dk = [1.0, *(n * c for n, c in zip((3, 5, 7, 9), self.k.unbind(-1), strict=True))]
                theta, ok = newton_inverse(
                    lambda t: t * horner(k, t * t), lambda t: horner(dk, t * t),
                    self.inverse_slope * delta, delta, FISHEYE_NEWTON_STEPS)
                ok = ok & (theta >= 0) & (theta < self.max_angle)
            else:
                ft = self.ftheta
                c, d, e = ft.linear_cde
                q = image - self.principal
                uv = torch.stack([q[..., 0] - d * q[..., 1], -e * q[..., 0] + c * q[..., 1]],
                                 dim=-1) / (c - e * d)
                delta = uv.norm(dim=-1)
                if ft.reference == FTHETA_ANGLE_TO_PIXELDIST:
                    fw = ft.angle_to_pixeldist
                    theta, ok = newton_inverse(
                        lambda t: horner(fw, t), lambda t: horner(_derivative(fw), t),
                        horner(ft.pixeldist_to_angle, delta), delta, FTHETA_NEWTON_STEPS)
                else:
                    theta = horner(ft.pixeldist_to_angle, delta)
                    ok = torch.ones(delta.shape, dtype=torch.bool, device=delta.device)
            off_axis = delta >= MIN_2D_NORM
            scale = torch.sin(theta) / torch.where(off_axis, delta, torch.ones_like(delta))
            ray = torch.cat([scale[..., None] * uv, torch.cos(theta)[..., None]], dim=-1)
            axis = torch.zeros_like(ray)
            axis[..., 2] = 1.0
            ray = torch.where(off_axis[..., None], ray, axis)
        axis = torch.zeros_like(ray)
        axis[..., 2] = 1.0
        return torch.where(ok[..., None], ray, axis), ok


def _derivative(poly: Sequence[float]) -> list[float]:
    """Coefficients of the derivative of a polynomial given in increasing powers."""
    return [n * c for n, c in enumerate(poly)][1:]


# ---------------------------------------------------------------------------------------------
# the camera with its shutter


def world_to_image(lens: Lens, shutter: Shutter, points: Tensor) -> tuple[Tensor, Tensor]:
    """Image points [..., 2] of world points [..., 3] and whether each is valid.

    Global shutter: the projection at the start pose. Rolling shutter: from the projection at
    the start pose (or, where that is invalid, at the end pose), ROLLING_SHUTTER_ITERATIONS
    times the projection at the pose of the time of the last image point. A point valid at
    neither pose is invalid (at its end-pose projection); any other is valid wherever the
    iteration ends (gsplat checks no margin there).
    """
    image0, valid0 = lens.project(transform(shutter.R0, shutter.t0, points))
    if not shutter.rolling:
        return image0, valid0
    image1, valid1 = lens.project(transform(shutter.R1, shutter.t1, points))
    image = torch.where(valid0[..., None], image0, image1)
    for _ in range(ROLLING_SHUTTER_ITERATIONS):
        R, t = shutter.pose(shutter.time(image))
        image, _ = lens.project(transform(R, t, points))
    valid = valid0 | valid1
    return torch.where(valid[..., None], image, image1), valid


def pixel_rays(lens: Lens, shutter: Shutter, pixels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """World rays through image points [..., 2]: origins [..., 3] (the camera centre at the
    pixel's time), unit directions [..., 3] and whether each ray is valid."""
    ray, valid = lens.unproject(pixels)
    R, t = shutter.pose(shutter.time(pixels))
    Rt = R.transpose(-1, -2)
    origin = -(Rt @ t[..., None])[..., 0]
    return origin.expand(ray.shape), (Rt @ ray[..., None])[..., 0], valid


__all__ = ["Lens", "Shutter", "pixel_rays", "world_to_image"]
