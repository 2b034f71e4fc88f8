"""Camera models: for each, a projection and its VJP, and the dispatch on the model's code.

A model ``<name>`` is the pair

- ``<name>_proj(x, y, z, fx, fy, cx, cy, width, height) -> (u, v, J)``: the image point of the
  camera-space point (x, y, z) and the 2x3 Jacobian d(u, v)/d(x, y, z) as a row-major
  6-tuple, which carries the covariance onto the image (``conic.project_covar``);
- ``<name>_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj) -> (vx, vy, vz)``:
  the gradient w.r.t. (x, y, z) from those of u, v and J (``vj``, a 6-tuple);

and one branch in :func:`project` and :func:`project_vjp`, under its code in
``constants.CAMERA_CODES``, which the CPU and CUDA kernels call with that code. Its twin in
the reference is ``backends/torch/camera.py``. Adding a model touches those three files and
no other (docs/README.md, "where things go").

Only points in the depth range (near, far) give values that count: the CPU kernels hand a
model the point (1, 1, 1) in place of the others, the CUDA ones skip them. Off-screen points
are projected and then culled by their box.
"""

from __future__ import annotations

import math

from ...constants import CAMERA_CODES, FISHEYE_EPS
from .typed import like

FUNCTIONS = (
    "_pinhole_bounds",
    "pinhole_proj",
    "pinhole_proj_vjp",
    "ortho_proj",
    "ortho_proj_vjp",
    "fisheye_proj",
    "fisheye_proj_vjp",
    "project",
    "project_vjp",
)

# Module-level ints: Numba freezes them into the kernels (it cannot read a dict there).
PINHOLE = CAMERA_CODES["pinhole"]
ORTHO = CAMERA_CODES["ortho"]
FISHEYE = CAMERA_CODES["fisheye"]


# ---------------------------------------------------------------------------------------------
# the models


def _pinhole_bounds(tz, fx, fy, cx, cy, width, height):
    """(x+, x-, y+, y-): x/z is clamped to [-x-, x+] and y/z to [-y-, y+] in the pinhole
    Jacobian, the field of view widened by 30% (as 3DGS)."""
    width = like(tz, width)
    height = like(tz, height)
    tan_x = like(tz, 0.5) * width / fx
    tan_y = like(tz, 0.5) * height / fy
    lim_xp = (width - cx) / fx + like(tz, 0.3) * tan_x
    lim_xn = cx / fx + like(tz, 0.3) * tan_x
    lim_yp = (height - cy) / fy + like(tz, 0.3) * tan_y
    lim_yn = cy / fy + like(tz, 0.3) * tan_y
    return lim_xp, lim_xn, lim_yp, lim_yn


def pinhole_proj(tx, ty, tz, fx, fy, cx, cy, width, height):
    """Pinhole projection of a camera-space point: (u, v, J 2x3 as 6-tuple).

    u = fx x / z + cx, v = fy y / z + cy; the Jacobian uses the point with x/z and y/z clamped
    to the field of view widened by 30% (as 3DGS), so that it stays bounded off-screen.
    """
    u = fx * tx / tz + cx
    v = fy * ty / tz + cy
    lim_xp, lim_xn, lim_yp, lim_yn = _pinhole_bounds(tz, fx, fy, cx, cy, width, height)
    lx = tz * min(max(tx / tz, -lim_xn), lim_xp)
    ly = tz * min(max(ty / tz, -lim_yn), lim_yp)
    z2 = tz * tz
    zero = like(tz, 0.0)
    return u, v, (fx / tz, zero, -fx * lx / z2, zero, fy / tz, -fy * ly / z2)


def pinhole_proj_vjp(tx, ty, tz, fx, fy, cx, cy, width, height, vu, vv, vj):
    """Gradient (v_tx, v_ty, v_tz) of pinhole_proj from v_u, v_v and v_J (a 2x3 6-tuple),
    following the clamp as autograd does (the gradient passes inside the bounds)."""
    vj00, _, vj02, _, vj11, vj12 = vj
    z2 = tz * tz
    vtx = vu * fx / tz
    vty = vv * fy / tz
    vtz = -(vu * fx * tx + vv * fy * ty) / z2
    lim_xp, lim_xn, lim_yp, lim_yn = _pinhole_bounds(tz, fx, fy, cx, cy, width, height)
    rx = tx / tz
    ry = ty / tz
    qx = min(max(rx, -lim_xn), lim_xp)
    qy = min(max(ry, -lim_yn), lim_yp)
    lx = tz * qx
    ly = tz * qy
    z3 = z2 * tz
    two = like(tz, 2.0)
    # J00 = fx / z, J11 = fy / z, J02 = -fx lx / z^2, J12 = -fy ly / z^2
    vtz += -(vj00 * fx + vj11 * fy) / z2
    vtz += two * (vj02 * fx * lx + vj12 * fy * ly) / z3
    vlx = -vj02 * fx / z2
    vly = -vj12 * fy / z2
    # lx = z * clamp(x / z)
    vtz += vlx * qx + vly * qy
    if rx >= -lim_xn and rx <= lim_xp:
        vtx += vlx
        vtz -= vlx * tx / tz
    if ry >= -lim_yn and ry <= lim_yp:
        vty += vly
        vtz -= vly * ty / tz
    return vtx, vty, vtz


def ortho_proj(x, y, z, fx, fy, cx, cy, width, height):
    """Orthographic projection: (u, v, J) with u = fx x + cx, v = fy y + cy."""
    zero = like(z, 0.0)
    return fx * x + cx, fy * y + cy, (fx, zero, zero, zero, fy, zero)


def ortho_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj):
    """Gradient (v_x, v_y, v_z) of ortho_proj (J is constant)."""
    return vu * fx, vv * fy, like(fx, 0.0) * vu


def fisheye_proj(x, y, z, fx, fy, cx, cy, width, height):
    """Equidistant fisheye projection (as gsplat's reference): (u, v, J 2x3 6-tuple)."""
    eps = like(x, FISHEYE_EPS)
    rho = math.sqrt(x * x + y * y)
    r = rho + eps
    theta = math.atan2(r, z + eps)
    u = x * fx * theta / r + cx
    v = y * fy * theta / r + cy
    x2 = x * x + eps
    y2 = y * y
    xy = x * y
    x2y2 = x2 + y2
    inv = like(x, 1.0) / (x2y2 + z * z)
    b = math.atan2(r, z) / r / x2y2
    a = z * inv / x2y2
    return (
        u,
        v,
        (
            fx * (x2 * a + y2 * b),
            fx * xy * (a - b),
            -fx * x * inv,
            fy * xy * (a - b),
            fy * (y2 * a + x2 * b),
            -fy * y * inv,
        ),
    )


def fisheye_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj):
    """Gradient (v_x, v_y, v_z) of fisheye_proj by reverse mode through its formulas."""
    vj00, vj01, vj02, vj10, vj11, vj12 = vj
    eps = like(x, FISHEYE_EPS)
    one = like(x, 1.0)
    two = like(x, 2.0)
    rho = math.sqrt(x * x + y * y)
    r = rho + eps
    ze = z + eps
    theta = math.atan2(r, ze)
    x2 = x * x + eps
    y2 = y * y
    xy = x * y
    x2y2 = x2 + y2
    q = x2y2 + z * z
    inv = one / q
    at = math.atan2(r, z)
    b = at / r / x2y2
    a = z * inv / x2y2
    # means2d: u = fx x theta / r + cx, v = fy y theta / r + cy
    gx = vu * fx * theta / r
    gy = vv * fy * theta / r
    g_theta = (vu * fx * x + vv * fy * y) / r
    g_r = -(vu * fx * x + vv * fy * y) * theta / (r * r)
    # J entries
    g_a = vj00 * fx * x2 + (vj01 * fx + vj10 * fy) * xy + vj11 * fy * y2
    g_b = vj00 * fx * y2 - (vj01 * fx + vj10 * fy) * xy + vj11 * fy * x2
    g_x2 = vj00 * fx * a + vj11 * fy * b
    g_y2 = vj00 * fx * b + vj11 * fy * a
    g_xy = (vj01 * fx + vj10 * fy) * (a - b)
    g_inv = -(vj02 * fx * x + vj12 * fy * y)
    gx += -vj02 * fx * inv
    gy += -vj12 * fy * inv
    # a = z inv / x2y2
    gz = g_a * inv / x2y2
    g_inv += g_a * z / x2y2
    g_x2y2 = -g_a * a / x2y2
    # b = at / r / x2y2
    g_at = g_b / (r * x2y2)
    g_r += -g_b * b / r
    g_x2y2 += -g_b * b / x2y2
    # at = atan2(r, z); theta = atan2(r, z + eps): d atan2(p, q) = (q dp - p dq) / (p^2 + q^2)
    den = r * r + z * z
    g_r += g_at * z / den
    gz += -g_at * r / den
    den_e = r * r + ze * ze
    g_r += g_theta * ze / den_e
    gz += -g_theta * r / den_e
    # inv = 1 / (x2y2 + z^2)
    g_q = -g_inv * inv * inv
    g_x2y2 += g_q
    gz += g_q * two * z
    g_x2 += g_x2y2
    g_y2 += g_x2y2
    gx += g_x2 * two * x + g_xy * y
    gy += g_y2 * two * y + g_xy * x
    # r = sqrt(x^2 + y^2) + eps
    gx += g_r * x / rho
    gy += g_r * y / rho
    return gx, gy, gz


# ---------------------------------------------------------------------------------------------
# dispatch on the model's code


def project(model, x, y, z, fx, fy, cx, cy, width, height):
    """(u, v, J) of camera model code ``model`` (pinhole for an unknown code: the launchers
    check the name)."""
    if model == ORTHO:
        return ortho_proj(x, y, z, fx, fy, cx, cy, width, height)
    if model == FISHEYE:
        return fisheye_proj(x, y, z, fx, fy, cx, cy, width, height)
    return pinhole_proj(x, y, z, fx, fy, cx, cy, width, height)


def project_vjp(model, x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj):
    """(v_x, v_y, v_z) of :func:`project` for model code ``model``, from v_u, v_v, v_J."""
    if model == ORTHO:
        return ortho_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj)
    if model == FISHEYE:
        return fisheye_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj)
    return pinhole_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj)
