"""The unscented-transform projection's math for the native kernels (``cpu/ut_projection.py``
and ``cuda/ut_projection.py``), written once as plain Python and compiled for each Numba
target by :func:`compile_for`: the camera rows' layout, the lens models and the rolling
shutter (``world_to_image``: the reference's ``backends/torch/lens.py``), the seven sigma
points of a Gaussian and their footprint (weighted mean and scatter, the ``eps2d`` blur, the
compensation, the opacity and image culls and the radii: the reference's
``backends/torch/ut.py`` ``project_with_ut``).

Unlike the scalar functions of :mod:`..shared` (``build``), these take arrays (a camera's
float64 row, the pose's scratch rotation, translation and quaternion, the sigma points), so
each target compiles them with its own decorator; every copy calls the others' copies of the
same target and the target's scalar math ``sm`` (:func:`compile_for`). The math is float64
whatever the data's type (each result rounded once by the kernel that stores it).

A camera's row (one per camera, built by ``backends/ut_launch.py``'s ``camera_rows`` from
the reference's ``Lens`` and ``Shutter``): start pose R0 (row-major), t0, end pose R1, t1,
their quaternions (w, x, y, z), focal lengths, principal point, radial k1..k6 (fisheye:
k1..k4), tangential p1, p2, thin prism s1..s4, the fisheye's max angle (columns ``P_*``).
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

from ...constants import (
    ALPHA_SKIP,
    FTHETA_ANGLE_TO_PIXELDIST,
    FTHETA_NEWTON_STEPS,
    NEWTON_TOLERANCE,
    PINHOLE_MIN_RADIAL_FACTOR,
    RADIUS_SIGMAS,
    ROLLING_SHUTTER_ITERATIONS,
    SHUTTER_CODES,
)
from . import covariance as sm  # quat_to_rotmat; a target's compiled copy replaces it

# the eigenvalue bound of the radii: b + sqrt(max(EIGEN_GAP_MIN, b² - det)) (gsplat's 0.01,
# the reference's backends/torch/ut.py)
EIGEN_GAP_MIN = 0.01
# lens models of the kernels
MODEL_PINHOLE, MODEL_OPENCV, MODEL_FISHEYE, MODEL_FTHETA = 0, 1, 2, 3
# shutter codes (constants.SHUTTER_CODES; a dict is no Numba global)
TOP_TO_BOTTOM = SHUTTER_CODES["ROLLING_TOP_TO_BOTTOM"]
LEFT_TO_RIGHT = SHUTTER_CODES["ROLLING_LEFT_TO_RIGHT"]
BOTTOM_TO_TOP = SHUTTER_CODES["ROLLING_BOTTOM_TO_TOP"]
RIGHT_TO_LEFT = SHUTTER_CODES["ROLLING_RIGHT_TO_LEFT"]
# columns of a camera's row
P_R0, P_T0, P_R1, P_T1, P_Q0, P_Q1 = 0, 9, 12, 21, 24, 28
P_F, P_C, P_K, P_P, P_S, P_MAX_ANGLE = 32, 34, 36, 42, 44, 48
N_PARAMS = 49

# in the order they call each other
FUNCTIONS = ("_horner", "_horner_derivative", "project", "_transform", "_shutter_time", "_pose",
             "world_to_image", "sigma_points", "footprint")


def compile_for(decorator: Callable[[Callable[..., Any]], Any], target_sm: Any
                ) -> types.SimpleNamespace:
    """Copies of :data:`FUNCTIONS` for one target, each decorated by ``decorator`` (e.g.
    ``numba.njit(error_model="numpy")`` or ``numba.cuda.jit(device=True, inline=True)``), with
    this module's globals but ``sm`` = ``target_sm`` (the target's scalar math) and every
    function name the decorated copy."""
    namespace = dict(globals())
    namespace["sm"] = target_sm
    out = {}
    for name in FUNCTIONS:
        fn = globals()[name]
        copy = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__,
                                  fn.__closure__)
        copy.__qualname__ = fn.__qualname__
        copy.__module__ = fn.__module__
        copy.__doc__ = fn.__doc__
        out[name] = namespace[name] = decorator(copy)
    return types.SimpleNamespace(**out)


# ---------------------------------------------------------------------------------------------
# the camera


def _horner(coeffs, x):
    y = 0.0
    for i in range(coeffs.shape[0] - 1, -1, -1):
        y = y * x + coeffs[i]
    return y


def _horner_derivative(coeffs, x):
    y = 0.0
    for i in range(coeffs.shape[0] - 1, 0, -1):
        y = y * x + i * coeffs[i]
    return y


def project(cam, model, ft, eps, width, height, margin, x, y, z):
    """Image point (u, v) of camera-space (x, y, z) and whether it is valid: in front, within
    the margin, the model's own test (``Lens.project``). ``ft`` [6 + 6 + 1 + 3 + 1]: the
    f-theta's angle → pixel distance and pixel distance → angle polynomials, its max angle,
    (c, d, e) and which polynomial is the reference; ``eps`` the data type's machine epsilon
    (the norm of a point on the optical axis, as the reference's)."""
    front = z > 0.0
    safe_z = z if front else 1.0
    ok = front
    if model == MODEL_PINHOLE or model == MODEL_OPENCV:
        a = x / safe_z
        b = y / safe_z
        if model == MODEL_OPENCV:
            r2 = a * a + b * b
            k = cam[P_K:P_K + 6]
            icd = (1.0 + r2 * (k[0] + r2 * (k[1] + r2 * k[2]))) / (
                1.0 + r2 * (k[3] + r2 * (k[4] + r2 * k[5])))
            p1, p2 = cam[P_P], cam[P_P + 1]
            s = cam[P_S:P_S + 4]
            du = 2 * p1 * a * b + p2 * (r2 + 2 * a * a) + r2 * (s[0] + r2 * s[1])
            dv = p1 * (r2 + 2 * b * b) + 2 * p2 * a * b + r2 * (s[2] + r2 * s[3])
            a = icd * a + du
            b = icd * b + dv
            ok = ok and icd > PINHOLE_MIN_RADIAL_FACTOR
        u = a * cam[P_F] + cam[P_C]
        v = b * cam[P_F + 1] + cam[P_C + 1]
    else:
        norm = math.hypot(x, y)
        if not norm > 0.0:
            norm = eps
        theta_full = math.atan2(norm, safe_z)
        dx = x / norm
        dy = y / norm
        if model == MODEL_FISHEYE:
            theta = min(theta_full, cam[P_MAX_ANGLE])
            t2 = theta * theta
            k = cam[P_K:P_K + 4]
            theta_d = theta * (1.0 + t2 * (k[0] + t2 * (k[1] + t2 * (k[2] + t2 * k[3]))))
            ok = front and theta_d > 0.0
            u = cam[P_F] * theta_d * dx + cam[P_C]
            v = cam[P_F + 1] * theta_d * dy + cam[P_C + 1]
        else:
            theta = min(theta_full, ft[12])
            fw = ft[0:6]
            bw = ft[6:12]
            if ft[16] == FTHETA_ANGLE_TO_PIXELDIST:
                delta = _horner(fw, theta)
                converged = front
            else:  # Newton's inverse of the backward polynomial from the forward one's value
                delta = _horner(fw, theta)
                converged = False
                for _ in range(FTHETA_NEWTON_STEPS):
                    step = (_horner(bw, delta) - theta) / _horner_derivative(bw, delta)
                    delta -= step
                    if abs(step) < NEWTON_TOLERANCE:
                        converged = True
                        break
            qx = delta * dx
            qy = delta * dy
            u = ft[13] * qx + ft[14] * qy + cam[P_C]
            v = ft[15] * qx + qy + cam[P_C + 1]
            ok = front and converged
        if not ok:
            u = 0.0
            v = 0.0
    if not front:
        u = 0.0
        v = 0.0
    mx = width * margin
    my = height * margin
    ok = ok and u >= -mx and u < width + mx and v >= -my and v < height + my
    return u, v, ok


def _pose(cam, rolling, tau, eps, rot, t, q):
    """rot [9], t [3]: the pose at time tau (``Shutter.pose``): the start pose without a
    rolling shutter, else the slerp of the quaternions and the lerp of the translations
    (q [4] scratch)."""
    if not rolling:
        for i in range(9):
            rot[i] = cam[P_R0 + i]
        for i in range(3):
            t[i] = cam[P_T0 + i]
        return
    q0 = cam[P_Q0:P_Q0 + 4]
    q1 = cam[P_Q1:P_Q1 + 4]
    cos = q0[0] * q1[0] + q0[1] * q1[1] + q0[2] * q1[2] + q0[3] * q1[3]
    sign = -1.0 if cos < 0.0 else 1.0
    cos = abs(cos)
    if cos > 1.0 - eps:
        for i in range(4):
            q[i] = q0[i] + tau * (sign * q1[i] - q0[i])
    else:
        angle = math.acos(min(cos, 1.0))
        sin = math.sin(angle)
        w0 = math.sin((1.0 - tau) * angle) / sin
        w1 = math.sin(tau * angle) / sin
        for i in range(4):
            q[i] = w0 * q0[i] + w1 * sign * q1[i]
    r = sm.quat_to_rotmat(q[0], q[1], q[2], q[3])  # normalises, as the slerp's normalize
    for i in range(9):
        rot[i] = r[i]
    for i in range(3):
        t[i] = (1.0 - tau) * cam[P_T0 + i] + tau * cam[P_T1 + i]


def _transform(rot, t, p0, p1, p2):
    return (rot[0] * p0 + rot[1] * p1 + rot[2] * p2 + t[0],
            rot[3] * p0 + rot[4] * p1 + rot[5] * p2 + t[1],
            rot[6] * p0 + rot[7] * p1 + rot[8] * p2 + t[2])


def _shutter_time(shutter, u, v, width, height):
    if shutter == TOP_TO_BOTTOM:
        return math.floor(v) / (height - 1)
    if shutter == LEFT_TO_RIGHT:
        return math.floor(u) / (width - 1)
    if shutter == BOTTOM_TO_TOP:
        return (height - math.ceil(v)) / (height - 1)
    if shutter == RIGHT_TO_LEFT:
        return (width - math.ceil(u)) / (width - 1)
    return 0.0


def world_to_image(cam, model, ft, shutter, rolling, eps, width, height, margin, p0, p1, p2,
                   rot, t, q):
    """(u, v, valid) of a world point (``lens.world_to_image``): the start pose's projection;
    on a rolling shutter, from it (or the end pose's where it is invalid)
    ROLLING_SHUTTER_ITERATIONS projections at the pose of the last image point's time."""
    c0, c1, c2 = _transform(cam[P_R0:P_R0 + 9], cam[P_T0:P_T0 + 3], p0, p1, p2)
    u0, v0, ok0 = project(cam, model, ft, eps, width, height, margin, c0, c1, c2)
    if not rolling:
        return u0, v0, ok0
    c0, c1, c2 = _transform(cam[P_R1:P_R1 + 9], cam[P_T1:P_T1 + 3], p0, p1, p2)
    u1, v1, ok1 = project(cam, model, ft, eps, width, height, margin, c0, c1, c2)
    u, v = (u0, v0) if ok0 else (u1, v1)
    for _ in range(ROLLING_SHUTTER_ITERATIONS):
        _pose(cam, rolling, _shutter_time(shutter, u, v, width, height), eps, rot, t, q)
        c0, c1, c2 = _transform(rot, t, p0, p1, p2)
        u, v, _ = project(cam, model, ft, eps, width, height, margin, c0, c1, c2)
    if ok0 or ok1:
        return u, v, True
    return u1, v1, False


# ---------------------------------------------------------------------------------------------
# the unscented transform


def sigma_points(pts, m0, m1, m2, r, s0, s1, s2, spread):
    """pts [7, 3]: the mean (m0, m1, m2) and, per axis i, the mean ± spread × scale_i × column
    i of the rotation ``r`` (row-major 9-tuple)."""
    pts[0, 0] = m0
    pts[0, 1] = m1
    pts[0, 2] = m2
    for i in range(3):
        s = spread * (s0 if i == 0 else (s1 if i == 1 else s2))
        for k in range(3):
            pts[1 + i, k] = pts[0, k] + s * r[3 * k + i]
            pts[4 + i, k] = pts[0, k] - s * r[3 * k + i]


def footprint(img, valid, w_mean0, w_mean1, w_cov0, eps2d, has_opac, opacity, radius_clip,
              width, height):
    """The 2D Gaussian of the projected sigma points img [7, 2] (``valid``: the depth and
    sigma-point tests so far): (valid, rx, ry, mean x, mean y, conic xx, xy, yy, compensation)
    after the ``eps2d`` blur (its compensation), the opacity cull (``opacity`` × compensation
    >= ALPHA_SKIP, which also tightens the radii, when ``has_opac``), the radius clip and the
    image cull; zeros where not valid."""
    mx = 0.0
    my = 0.0
    for sp in range(7):
        w = w_mean0 if sp == 0 else w_mean1
        mx += w * img[sp, 0]
        my += w * img[sp, 1]
    c00 = 0.0
    c01 = 0.0
    c11 = 0.0
    for sp in range(7):
        w = w_cov0 if sp == 0 else w_mean1
        du = img[sp, 0] - mx
        dv = img[sp, 1] - my
        c00 += w * du * du
        c01 += w * du * dv
        c11 += w * dv * dv
    det_orig = c00 * c11 - c01 * c01
    a = c00 + eps2d
    cc = c11 + eps2d
    det = a * cc - c01 * c01
    valid = valid and det > 0.0
    safe_det = det if valid else 1.0
    comp = math.sqrt(max(det_orig / safe_det, 0.0))
    extend = RADIUS_SIGMAS
    if has_opac:
        opac = opacity * comp
        valid = valid and opac >= ALPHA_SKIP
        extend = min(extend, math.sqrt(2.0 * math.log(max(opac / ALPHA_SKIP, 1.0))))
    half = 0.5 * (a + cc)
    v1 = half + math.sqrt(max(half * half - det, EIGEN_GAP_MIN))
    r1 = extend * math.sqrt(max(v1, 0.0))
    rx = math.ceil(min(extend * math.sqrt(max(a, 0.0)), r1))
    ry = math.ceil(min(extend * math.sqrt(max(cc, 0.0)), r1))
    valid = valid and not (rx <= radius_clip and ry <= radius_clip)
    valid = valid and mx + rx > 0 and mx - rx < width and my + ry > 0 and my - ry < height
    if not valid:
        return False, 0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
    return True, int(rx), int(ry), mx, my, cc / safe_det, -c01 / safe_det, a / safe_det, comp
