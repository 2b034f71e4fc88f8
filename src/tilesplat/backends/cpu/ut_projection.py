"""CPU kernels: ``fully_fused_projection_with_ut``, the projection of 3D Gaussians by the
unscented transform through the exact camera (no gradient, as gsplat's). The contract is the
reference's (``backends/torch/ut.py`` ``project_with_ut``, cameras ``backends/torch/lens.py``):
seven sigma points per Gaussian through the lens (perfect or OpenCV pinhole, OpenCV fisheye,
f-theta) at the pose of their pixel's time on a rolling shutter, their weighted mean and
scatter, then the culling and the radii.

One work item is a block of Gaussians of one batch entry (``_common.parallel_for``); each
Gaussian is projected into every camera. The math runs in float64 whatever the data's type
(each result rounded once). The per-camera numbers are the reference's own: the launcher
builds the reference's ``Lens`` and ``Shutter`` (focal lengths, principal point, the lens
coefficients, the fisheye's max angle, the poses and their quaternions) and packs them into
one float64 row per camera (columns ``P_*``), so that the kernel only evaluates the models.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

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
from ..torch.ut import EIGEN_GAP_MIN
from ._common import BLOCK, sm

# lens models of the kernel
MODEL_PINHOLE, MODEL_OPENCV, MODEL_FISHEYE, MODEL_FTHETA = 0, 1, 2, 3
# shutter codes (constants.SHUTTER_CODES; a dict is no Numba global)
TOP_TO_BOTTOM = SHUTTER_CODES["ROLLING_TOP_TO_BOTTOM"]
LEFT_TO_RIGHT = SHUTTER_CODES["ROLLING_LEFT_TO_RIGHT"]
BOTTOM_TO_TOP = SHUTTER_CODES["ROLLING_BOTTOM_TO_TOP"]
RIGHT_TO_LEFT = SHUTTER_CODES["ROLLING_RIGHT_TO_LEFT"]
# columns of a camera's row: start pose R0 (row-major), t0, end pose R1, t1, their quaternions
# (w, x, y, z), focal lengths, principal point, radial k1..k6 (fisheye: k1..k4), tangential
# p1, p2, thin prism s1..s4, the fisheye's max angle
P_R0, P_T0, P_R1, P_T1, P_Q0, P_Q1 = 0, 9, 12, 21, 24, 28
P_F, P_C, P_K, P_P, P_S, P_MAX_ANGLE = 32, 34, 36, 42, 44, 48
N_PARAMS = 49

# ---------------------------------------------------------------------------------------------
# the camera


@njit(cache=True, error_model="numpy")
def _horner(coeffs, x):
    y = 0.0
    for i in range(coeffs.shape[0] - 1, -1, -1):
        y = y * x + coeffs[i]
    return y


@njit(cache=True, error_model="numpy")
def _horner_derivative(coeffs, x):
    y = 0.0
    for i in range(coeffs.shape[0] - 1, 0, -1):
        y = y * x + i * coeffs[i]
    return y


@njit(cache=True, error_model="numpy")
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


@njit(cache=True, error_model="numpy")
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


@njit(cache=True, inline="always", error_model="numpy")
def _transform(rot, t, p0, p1, p2):
    return (rot[0] * p0 + rot[1] * p1 + rot[2] * p2 + t[0],
            rot[3] * p0 + rot[4] * p1 + rot[5] * p2 + t[1],
            rot[6] * p0 + rot[7] * p1 + rot[8] * p2 + t[2])


@njit(cache=True, error_model="numpy")
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


@njit(cache=True, error_model="numpy")
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


@njit(nogil=True, cache=True, error_model="numpy")
def projection_kernel(first, step, means, quats, scales, opacities, cams, model, ft, shutter,
                      rolling, eps, width, height, eps2d, near_plane, far_plane, radius_clip,
                      ut_alpha, ut_beta, ut_kappa, margin, require_all, radii, means2d, depths,
                      conics, comps):
    """Blocks first, first + step, ... of the B * ceil(N / BLOCK) blocks. means [B, N, 3],
    quats [B, N, 4], scales [B, N, 3], opacities [B, N] or [0, 0]; cams [B, C, N_PARAMS];
    outputs radii [B, C, N, 2] int32, means2d [B, C, N, 2], depths [B, C, N], conics
    [B, C, N, 3], comps [B, C, N]."""
    n_batch, n_cams = cams.shape[0], cams.shape[1]
    n = means.shape[1]
    n_blocks = (n + BLOCK - 1) // BLOCK
    has_opac = opacities.shape[0] > 0
    lam = ut_alpha * ut_alpha * (3.0 + ut_kappa) - 3.0
    spread = math.sqrt(3.0 + lam)
    w_mean0 = lam / (3.0 + lam)
    w_mean1 = 1.0 / (2.0 * (3.0 + lam))
    w_cov0 = w_mean0 + 1.0 - ut_alpha * ut_alpha + ut_beta
    pts = np.empty((7, 3))
    img = np.empty((7, 2))
    rot = np.empty(9)
    t = np.empty(3)
    q = np.empty(4)
    for item in range(first, n_batch * n_blocks, step):
        b = item // n_blocks
        blk = item - b * n_blocks
        for g in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            m0, m1, m2 = (np.float64(means[b, g, 0]), np.float64(means[b, g, 1]),
                          np.float64(means[b, g, 2]))
            r = sm.quat_to_rotmat(np.float64(quats[b, g, 0]), np.float64(quats[b, g, 1]),
                                  np.float64(quats[b, g, 2]), np.float64(quats[b, g, 3]))
            pts[0, 0], pts[0, 1], pts[0, 2] = m0, m1, m2
            for i in range(3):  # axis i: column i of R times its scale
                s = spread * np.float64(scales[b, g, i])
                for k in range(3):
                    pts[1 + i, k] = pts[0, k] + s * r[3 * k + i]
                    pts[4 + i, k] = pts[0, k] - s * r[3 * k + i]
            for c in range(n_cams):
                cam = cams[b, c]
                _pose(cam, rolling, 0.5, eps, rot, t, q)
                _, _, depth = _transform(rot, t, m0, m1, m2)
                depths[b, c, g] = depth
                valid = depth >= near_plane and depth <= far_plane
                n_ok = 0
                mx = 0.0
                my = 0.0
                for sp in range(7):
                    u, v, ok = world_to_image(cam, model, ft, shutter, rolling, eps, width,
                                              height, margin, pts[sp, 0], pts[sp, 1],
                                              pts[sp, 2], rot, t, q)
                    img[sp, 0] = u
                    img[sp, 1] = v
                    n_ok += ok
                    w = w_mean0 if sp == 0 else w_mean1
                    mx += w * u
                    my += w * v
                valid = valid and (n_ok == 7 if require_all else n_ok > 0)
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
                    opac = np.float64(opacities[b, g]) * comp
                    valid = valid and opac >= ALPHA_SKIP
                    extend = min(extend, math.sqrt(2.0 * math.log(max(opac / ALPHA_SKIP, 1.0))))
                half = 0.5 * (a + cc)
                v1 = half + math.sqrt(max(half * half - det, EIGEN_GAP_MIN))
                r1 = extend * math.sqrt(max(v1, 0.0))
                rx = math.ceil(min(extend * math.sqrt(max(a, 0.0)), r1))
                ry = math.ceil(min(extend * math.sqrt(max(cc, 0.0)), r1))
                valid = valid and not (rx <= radius_clip and ry <= radius_clip)
                valid = (valid and mx + rx > 0 and mx - rx < width and my + ry > 0
                         and my - ry < height)
                if valid:
                    radii[b, c, g, 0] = int(rx)
                    radii[b, c, g, 1] = int(ry)
                    means2d[b, c, g, 0] = mx
                    means2d[b, c, g, 1] = my
                    conics[b, c, g, 0] = cc / safe_det
                    conics[b, c, g, 1] = -c01 / safe_det
                    conics[b, c, g, 2] = a / safe_det
                    comps[b, c, g] = comp
                else:
                    radii[b, c, g, 0] = 0
                    radii[b, c, g, 1] = 0
                    for k in range(2):
                        means2d[b, c, g, k] = 0.0
                    for k in range(3):
                        conics[b, c, g, k] = 0.0
                    comps[b, c, g] = 0.0
