"""Scalar math shared by the native backends, written once as plain Python functions.

Every function here takes and returns scalars (tuples for vectors and matrices), so that it
compiles for any Numba target: the CPU backend wraps each one with ``numba.njit`` (with
``inline="always"`` for the per-pair ones) and the CUDA backend with
``numba.cuda.jit(device=True)``, through :func:`build`. The functions also run as plain Python
(handy in a debugger).

Rules that keep float32 kernels float32 (Numba types a Python float literal as float64 and
promotes): every constant goes through ``like(x, c)``, which casts ``c`` to the type of ``x``
inside compiled code and costs nothing after constant folding; integer conversions go through
:func:`as_int32`. Only ``math.sqrt`` and ``math.atan2`` are called, and the builtins ``min``,
``max`` and ``abs`` of scalars, which both targets provide.

Conventions: a symmetric 3x3 matrix is the 6-tuple ``(xx, xy, xz, yy, yz, zz)`` and a
symmetric 2x2 one ``(xx, xy, yy)``. The gradient of a loss with respect to a symmetric matrix
is given per entry of the full matrix (``v_xy`` is d loss / d M[0, 1] = d loss / d M[1, 0]),
which is what autograd reports for a tensor used as a full matrix. Quaternions are
``(w, x, y, z)``.

Stable names used by the CPU and CUDA backends: ``like``, ``as_int32``, ``exp_neg``,
``gaussian_sigma``, ``quat_to_rotmat``, ``rotmat_vjp``, ``normalize4_vjp``,
``quat_scale_to_covar``, ``quat_scale_to_preci``, ``quat_scale_to_covar_vjp``,
``quat_scale_to_preci_vjp``, ``transform_covar``, ``transform_covar_vjp``, ``project_covar``,
``project_covar_vjp``,
``pinhole_proj``, ``pinhole_proj_vjp``, ``ortho_proj``, ``ortho_proj_vjp``, ``fisheye_proj``,
``fisheye_proj_vjp``, ``add_blur``, ``conic_from_covar2d``, ``conic_vjp``, ``sh_basis``,
``sh_basis_vjp``, ``normalize3_vjp``.
"""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir
from numba.core import types as nb_types
from numba.extending import intrinsic, overload

__all__ = ["FUNCTIONS", "build"]


# ---------------------------------------------------------------------------------------------
# typed constants


def like(x, c):
    """``c`` converted to the type of ``x`` (in compiled code; plain Python returns ``c``)."""
    return c


@overload(like, inline="always")
def _like_overload(x, c):
    target = x

    def impl(x, c):  # pragma: no cover - compiled
        return target(c)

    return impl


def as_int32(x):
    """``x`` truncated to a 32-bit integer (vectorises where a 64-bit conversion would not)."""
    return int(x)


@overload(as_int32, inline="always")
def _as_int32_overload(x):
    def impl(x):  # pragma: no cover - compiled
        return np.int32(x)

    return impl


# ---------------------------------------------------------------------------------------------
# compositing

_LN2_HI = 0.693145751953125  # ln 2 split so that n * _LN2_HI is exact for n < 2**9
_LN2_LO = 1.4286068203094173e-06
_EXP_MAX = 43.66  # exp(-s) is taken as exp(-min(s, _EXP_MAX)): 2**-63 there


def pow2_neg(x, n):
    """2**-n as the float type of ``x``, for integer 0 <= n <= 126 (compiled: the exponent
    field written directly, a subtraction and a shift; plain Python: ``ldexp``)."""
    return math.ldexp(1.0, -int(n))


@intrinsic
def _pow2_neg_bits(typingctx, x, n):
    if not isinstance(x, nb_types.Float) or not isinstance(n, nb_types.Integer):
        return None
    bits = x.bitwidth
    bias, mantissa = (127, 23) if bits == 32 else (1023, 52)

    def codegen(context, builder, signature, args):
        ity = ir.IntType(bits)
        n_val = context.cast(builder, args[1], signature.args[1],
                             nb_types.int32 if bits == 32 else nb_types.int64)
        exponent = builder.sub(ir.Constant(ity, bias), n_val)
        field = builder.shl(exponent, ir.Constant(ity, mantissa))
        return builder.bitcast(field, context.get_value_type(signature.return_type))

    return x(x, n), codegen


@overload(pow2_neg, inline="always")
def _pow2_neg_overload(x, n):
    def impl(x, n):  # pragma: no cover - compiled
        return _pow2_neg_bits(x, n)

    return impl


def exp_neg(s):
    """exp(-s) for s >= 0 without a libm call, so that loops of it vectorise.

    s = n ln2 + r with |r| <= ln2 / 2; exp(-r) by its degree-7 Taylor polynomial in Horner
    form (truncation below 1e-8 relative); times 2**-n, exact, built in the exponent field
    (:func:`pow2_neg`). Relative error ~1e-7 in float32 (1 ulp), ~1e-8 in float64.
    s is clamped to [0, 43.66]: beyond it the result stays exp(-43.66) ~ 1e-19, far below any
    alpha threshold.
    """
    s = min(max(s, like(s, 0.0)), like(s, _EXP_MAX))
    n = as_int32(s * like(s, 1.4426950408889634) + like(s, 0.5))
    nf = like(s, n)
    r = nf * like(s, _LN2_HI) - s + nf * like(s, _LN2_LO)  # -s + n ln2, in [-ln2/2, ln2/2]
    p = like(s, 1.0 / 5040.0)
    p = p * r + like(s, 1.0 / 720.0)
    p = p * r + like(s, 1.0 / 120.0)
    p = p * r + like(s, 1.0 / 24.0)
    p = p * r + like(s, 1.0 / 6.0)
    p = p * r + like(s, 0.5)
    p = p * r + like(s, 1.0)
    p = p * r + like(s, 1.0)
    return p * pow2_neg(s, n)  # exact: p in [0.7, 1.42] and n <= 63 keep it a normal number


def gaussian_sigma(a, b, c, dx, dy):
    """sigma = 0.5 (a dx^2 + c dy^2) + b dx dy for conic (a, b, c) and d = mean - pixel."""
    return like(a, 0.5) * (a * dx * dx + c * dy * dy) + b * dx * dy


# ---------------------------------------------------------------------------------------------
# quaternions, scales and 3D covariances


def quat_to_rotmat(w, x, y, z):
    """Rotation matrix (row-major 9-tuple) of the normalised quaternion (w, x, y, z)."""
    inv = like(w, 1.0) / max(math.sqrt(w * w + x * x + y * y + z * z), like(w, 1e-12))
    w = w * inv
    x = x * inv
    y = y * inv
    z = z * inv
    one = like(w, 1.0)
    two = like(w, 2.0)
    return (
        one - two * (y * y + z * z),
        two * (x * y - w * z),
        two * (x * z + w * y),
        two * (x * y + w * z),
        one - two * (x * x + z * z),
        two * (y * z - w * x),
        two * (x * z - w * y),
        two * (y * z + w * x),
        one - two * (x * x + y * y),
    )


def rotmat_vjp(w, x, y, z, v00, v01, v02, v10, v11, v12, v20, v21, v22):
    """Gradient of quat_to_rotmat w.r.t. the *normalised* quaternion (w, x, y, z) given
    (already normalised), from the gradient v of the 3x3 matrix."""
    two = like(w, 2.0)
    gw = two * (-z * v01 + y * v02 + z * v10 - x * v12 - y * v20 + x * v21)
    gx = two * (
        y * v01 + z * v02 + y * v10 - two * x * v11 - w * v12 + z * v20 + w * v21 - two * x * v22
    )
    gy = two * (
        -two * y * v00 + x * v01 + w * v02 + x * v10 + z * v12 - w * v20 + z * v21 - two * y * v22
    )
    gz = two * (
        -two * z * v00 - w * v01 + x * v02 + w * v10 - two * z * v11 + y * v12 + x * v20 + y * v21
    )
    return gw, gx, gy, gz


def normalize4_vjp(w, x, y, z, gw, gx, gy, gz):
    """Gradient w.r.t. q of q / max(|q|, 1e-12), given the gradient g of the result."""
    norm = math.sqrt(w * w + x * x + y * y + z * z)
    if norm <= like(w, 1e-12):
        inv = like(w, 1e12)
        return gw * inv, gx * inv, gy * inv, gz * inv
    inv = like(w, 1.0) / norm
    nw = w * inv
    nx = x * inv
    ny = y * inv
    nz = z * inv
    d = nw * gw + nx * gx + ny * gy + nz * gz
    return (gw - nw * d) * inv, (gx - nx * d) * inv, (gy - ny * d) * inv, (gz - nz * d) * inv


def _rs_gram(w, x, y, z, sx, sy, sz):
    """M M^T with M = R(q) diag(s), as a symmetric 6-tuple."""
    r00, r01, r02, r10, r11, r12, r20, r21, r22 = quat_to_rotmat(w, x, y, z)
    m00 = r00 * sx
    m01 = r01 * sy
    m02 = r02 * sz
    m10 = r10 * sx
    m11 = r11 * sy
    m12 = r12 * sz
    m20 = r20 * sx
    m21 = r21 * sy
    m22 = r22 * sz
    return (
        m00 * m00 + m01 * m01 + m02 * m02,
        m00 * m10 + m01 * m11 + m02 * m12,
        m00 * m20 + m01 * m21 + m02 * m22,
        m10 * m10 + m11 * m11 + m12 * m12,
        m10 * m20 + m11 * m21 + m12 * m22,
        m20 * m20 + m21 * m21 + m22 * m22,
    )


def quat_scale_to_covar(w, x, y, z, sx, sy, sz):
    """Covariance R S S R^T (symmetric 6-tuple) from a quaternion and scales."""
    return _rs_gram(w, x, y, z, sx, sy, sz)


def quat_scale_to_preci(w, x, y, z, sx, sy, sz):
    """Precision R S^-1 S^-1 R^T (symmetric 6-tuple) from a quaternion and scales."""
    one = like(sx, 1.0)
    return _rs_gram(w, x, y, z, one / sx, one / sy, one / sz)


def _rs_gram_vjp(w, x, y, z, sx, sy, sz, g00, g01, g02, g10, g11, g12, g20, g21, g22):
    """Gradients (v_quat 4, v_s 3) of M M^T, M = R(q) diag(s), from the full 3x3 gradient g."""
    r00, r01, r02, r10, r11, r12, r20, r21, r22 = quat_to_rotmat(w, x, y, z)
    # d/dM of M M^T: (g + g^T) M
    s00 = g00 + g00
    s01 = g01 + g10
    s02 = g02 + g20
    s11 = g11 + g11
    s12 = g12 + g21
    s22 = g22 + g22
    m00 = r00 * sx
    m01 = r01 * sy
    m02 = r02 * sz
    m10 = r10 * sx
    m11 = r11 * sy
    m12 = r12 * sz
    m20 = r20 * sx
    m21 = r21 * sy
    m22 = r22 * sz
    vm00 = s00 * m00 + s01 * m10 + s02 * m20
    vm01 = s00 * m01 + s01 * m11 + s02 * m21
    vm02 = s00 * m02 + s01 * m12 + s02 * m22
    vm10 = s01 * m00 + s11 * m10 + s12 * m20
    vm11 = s01 * m01 + s11 * m11 + s12 * m21
    vm12 = s01 * m02 + s11 * m12 + s12 * m22
    vm20 = s02 * m00 + s12 * m10 + s22 * m20
    vm21 = s02 * m01 + s12 * m11 + s22 * m21
    vm22 = s02 * m02 + s12 * m12 + s22 * m22
    vsx = vm00 * r00 + vm10 * r10 + vm20 * r20
    vsy = vm01 * r01 + vm11 * r11 + vm21 * r21
    vsz = vm02 * r02 + vm12 * r12 + vm22 * r22
    inv = like(w, 1.0) / max(math.sqrt(w * w + x * x + y * y + z * z), like(w, 1e-12))
    gw, gx, gy, gz = rotmat_vjp(
        w * inv,
        x * inv,
        y * inv,
        z * inv,
        vm00 * sx,
        vm01 * sy,
        vm02 * sz,
        vm10 * sx,
        vm11 * sy,
        vm12 * sz,
        vm20 * sx,
        vm21 * sy,
        vm22 * sz,
    )
    vw, vx, vy, vz = normalize4_vjp(w, x, y, z, gw, gx, gy, gz)
    return vw, vx, vy, vz, vsx, vsy, vsz


def quat_scale_to_covar_vjp(w, x, y, z, sx, sy, sz, g00, g01, g02, g10, g11, g12, g20, g21, g22):
    """(v_w, v_x, v_y, v_z, v_sx, v_sy, v_sz) of quat_scale_to_covar from the full gradient."""
    return _rs_gram_vjp(w, x, y, z, sx, sy, sz, g00, g01, g02, g10, g11, g12, g20, g21, g22)


def quat_scale_to_preci_vjp(w, x, y, z, sx, sy, sz, g00, g01, g02, g10, g11, g12, g20, g21, g22):
    """(v_w, v_x, v_y, v_z, v_sx, v_sy, v_sz) of quat_scale_to_preci from the full gradient."""
    one = like(sx, 1.0)
    ix = one / sx
    iy = one / sy
    iz = one / sz
    vw, vx, vy, vz, vix, viy, viz = _rs_gram_vjp(
        w, x, y, z, ix, iy, iz, g00, g01, g02, g10, g11, g12, g20, g21, g22
    )
    return vw, vx, vy, vz, -vix * ix * ix, -viy * iy * iy, -viz * iz * iz


# ---------------------------------------------------------------------------------------------
# world -> camera -> image


def transform_covar(r00, r01, r02, r10, r11, r12, r20, r21, r22, c00, c01, c02, c11, c12, c22):
    """R C R^T for a 3x3 R (row-major) and a symmetric C; returns a symmetric 6-tuple."""
    # rows of R C
    a00 = r00 * c00 + r01 * c01 + r02 * c02
    a01 = r00 * c01 + r01 * c11 + r02 * c12
    a02 = r00 * c02 + r01 * c12 + r02 * c22
    a10 = r10 * c00 + r11 * c01 + r12 * c02
    a11 = r10 * c01 + r11 * c11 + r12 * c12
    a12 = r10 * c02 + r11 * c12 + r12 * c22
    a20 = r20 * c00 + r21 * c01 + r22 * c02
    a21 = r20 * c01 + r21 * c11 + r22 * c12
    a22 = r20 * c02 + r21 * c12 + r22 * c22
    return (
        a00 * r00 + a01 * r01 + a02 * r02,
        a00 * r10 + a01 * r11 + a02 * r12,
        a00 * r20 + a01 * r21 + a02 * r22,
        a10 * r10 + a11 * r11 + a12 * r12,
        a10 * r20 + a11 * r21 + a12 * r22,
        a20 * r20 + a21 * r21 + a22 * r22,
    )


def transform_covar_vjp(
    r00,
    r01,
    r02,
    r10,
    r11,
    r12,
    r20,
    r21,
    r22,
    c00,
    c01,
    c02,
    c11,
    c12,
    c22,
    v00,
    v01,
    v02,
    v11,
    v12,
    v22,
):
    """Gradients of R C R^T given the symmetric full-matrix gradient v.

    Returns (v_R row-major 9-tuple, v_C symmetric 6-tuple of full-matrix entries):
    v_R = 2 V R C and v_C = R^T V R.
    """
    # B = V R
    b00 = v00 * r00 + v01 * r10 + v02 * r20
    b01 = v00 * r01 + v01 * r11 + v02 * r21
    b02 = v00 * r02 + v01 * r12 + v02 * r22
    b10 = v01 * r00 + v11 * r10 + v12 * r20
    b11 = v01 * r01 + v11 * r11 + v12 * r21
    b12 = v01 * r02 + v11 * r12 + v12 * r22
    b20 = v02 * r00 + v12 * r10 + v22 * r20
    b21 = v02 * r01 + v12 * r11 + v22 * r21
    b22 = v02 * r02 + v12 * r12 + v22 * r22
    two = like(r00, 2.0)
    v_r = (
        two * (b00 * c00 + b01 * c01 + b02 * c02),
        two * (b00 * c01 + b01 * c11 + b02 * c12),
        two * (b00 * c02 + b01 * c12 + b02 * c22),
        two * (b10 * c00 + b11 * c01 + b12 * c02),
        two * (b10 * c01 + b11 * c11 + b12 * c12),
        two * (b10 * c02 + b11 * c12 + b12 * c22),
        two * (b20 * c00 + b21 * c01 + b22 * c02),
        two * (b20 * c01 + b21 * c11 + b22 * c12),
        two * (b20 * c02 + b21 * c12 + b22 * c22),
    )
    # R^T V R = R^T B
    v_c = (
        r00 * b00 + r10 * b10 + r20 * b20,
        r00 * b01 + r10 * b11 + r20 * b21,
        r00 * b02 + r10 * b12 + r20 * b22,
        r01 * b01 + r11 * b11 + r21 * b21,
        r01 * b02 + r11 * b12 + r21 * b22,
        r02 * b02 + r12 * b12 + r22 * b22,
    )
    return v_r, v_c


def project_covar(j00, j01, j02, j10, j11, j12, c00, c01, c02, c11, c12, c22):
    """J C J^T (symmetric 2x2 as (xx, xy, yy)) for a 2x3 J and a symmetric 3x3 C."""
    a00 = j00 * c00 + j01 * c01 + j02 * c02
    a01 = j00 * c01 + j01 * c11 + j02 * c12
    a02 = j00 * c02 + j01 * c12 + j02 * c22
    a10 = j10 * c00 + j11 * c01 + j12 * c02
    a11 = j10 * c01 + j11 * c11 + j12 * c12
    a12 = j10 * c02 + j11 * c12 + j12 * c22
    return (
        a00 * j00 + a01 * j01 + a02 * j02,
        a00 * j10 + a01 * j11 + a02 * j12,
        a10 * j10 + a11 * j11 + a12 * j12,
    )


def project_covar_vjp(j00, j01, j02, j10, j11, j12, c00, c01, c02, c11, c12, c22, v00, v01, v11):
    """Gradients of J C J^T given the full-matrix gradient v (v01 per off-diagonal entry).

    Returns (v_J as a 2x3 6-tuple, v_C as a symmetric 6-tuple of full-matrix entries).
    """
    # v_C = J^T V J
    b00 = v00 * j00 + v01 * j10
    b01 = v00 * j01 + v01 * j11
    b02 = v00 * j02 + v01 * j12
    b10 = v01 * j00 + v11 * j10
    b11 = v01 * j01 + v11 * j11
    b12 = v01 * j02 + v11 * j12
    vc00 = j00 * b00 + j10 * b10
    vc01 = j00 * b01 + j10 * b11
    vc02 = j00 * b02 + j10 * b12
    vc11 = j01 * b01 + j11 * b11
    vc12 = j01 * b02 + j11 * b12
    vc22 = j02 * b02 + j12 * b12
    # v_J = 2 V J C (V and C symmetric); B = V J is [[b00 b01 b02], [b10 b11 b12]]
    two = like(j00, 2.0)
    vj00 = two * (b00 * c00 + b01 * c01 + b02 * c02)
    vj01 = two * (b00 * c01 + b01 * c11 + b02 * c12)
    vj02 = two * (b00 * c02 + b01 * c12 + b02 * c22)
    vj10 = two * (b10 * c00 + b11 * c01 + b12 * c02)
    vj11 = two * (b10 * c01 + b11 * c11 + b12 * c12)
    vj12 = two * (b10 * c02 + b11 * c12 + b12 * c22)
    return (vj00, vj01, vj02, vj10, vj11, vj12), (vc00, vc01, vc02, vc11, vc12, vc22)


def pinhole_proj(tx, ty, tz, fx, fy, cx, cy, width, height):
    """Pinhole projection of a camera-space point: (u, v, J 2x3 as 6-tuple).

    u = fx x / z + cx, v = fy y / z + cy; the Jacobian uses the point with x/z and y/z clamped
    to the field of view widened by 30% (as 3DGS), so that it stays bounded off-screen.
    """
    width = like(tz, width)
    height = like(tz, height)
    u = fx * tx / tz + cx
    v = fy * ty / tz + cy
    tan_x = like(tz, 0.5) * width / fx
    tan_y = like(tz, 0.5) * height / fy
    lim_xp = (width - cx) / fx + like(tz, 0.3) * tan_x
    lim_xn = cx / fx + like(tz, 0.3) * tan_x
    lim_yp = (height - cy) / fy + like(tz, 0.3) * tan_y
    lim_yn = cy / fy + like(tz, 0.3) * tan_y
    lx = tz * min(max(tx / tz, -lim_xn), lim_xp)
    ly = tz * min(max(ty / tz, -lim_yn), lim_yp)
    z2 = tz * tz
    zero = like(tz, 0.0)
    return u, v, (fx / tz, zero, -fx * lx / z2, zero, fy / tz, -fy * ly / z2)


def pinhole_proj_vjp(tx, ty, tz, fx, fy, cx, cy, width, height, vu, vv, vj00, vj02, vj11, vj12):
    """Gradient (v_tx, v_ty, v_tz) of pinhole_proj from v_u, v_v and v_J (its nonzero
    entries), following the clamp as autograd does (the gradient passes inside the bounds)."""
    width = like(tz, width)
    height = like(tz, height)
    z2 = tz * tz
    vtx = vu * fx / tz
    vty = vv * fy / tz
    vtz = -(vu * fx * tx + vv * fy * ty) / z2
    tan_x = like(tz, 0.5) * width / fx
    tan_y = like(tz, 0.5) * height / fy
    lim_xp = (width - cx) / fx + like(tz, 0.3) * tan_x
    lim_xn = cx / fx + like(tz, 0.3) * tan_x
    lim_yp = (height - cy) / fy + like(tz, 0.3) * tan_y
    lim_yn = cy / fy + like(tz, 0.3) * tan_y
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


def ortho_proj(tx, ty, tz, k00, k02, k11, k12):
    """Orthographic projection: (u, v, J) with u = fx x + cx, v = fy y + cy."""
    zero = like(tz, 0.0)
    return k00 * tx + k02, k11 * ty + k12, (k00, zero, zero, zero, k11, zero)


def ortho_proj_vjp(k00, k11, vu, vv):
    """Gradient (v_tx, v_ty, v_tz) of ortho_proj (J is constant)."""
    return vu * k00, vv * k11, like(k00, 0.0) * vu


_FISHEYE_EPS = 1e-7


def fisheye_proj(x, y, z, k00, k02, k11, k12):
    """Equidistant fisheye projection (as gsplat's reference): (u, v, J 2x3 6-tuple)."""
    eps = like(x, _FISHEYE_EPS)
    rho = math.sqrt(x * x + y * y)
    r = rho + eps
    theta = math.atan2(r, z + eps)
    u = x * k00 * theta / r + k02
    v = y * k11 * theta / r + k12
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
            k00 * (x2 * a + y2 * b),
            k00 * xy * (a - b),
            -k00 * x * inv,
            k11 * xy * (a - b),
            k11 * (y2 * a + x2 * b),
            -k11 * y * inv,
        ),
    )


def fisheye_proj_vjp(x, y, z, k00, k11, vu, vv, vj00, vj01, vj02, vj10, vj11, vj12):
    """Gradient (v_x, v_y, v_z) of fisheye_proj by reverse mode through its formulas."""
    eps = like(x, _FISHEYE_EPS)
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
    gx = vu * k00 * theta / r
    gy = vv * k11 * theta / r
    g_theta = (vu * k00 * x + vv * k11 * y) / r
    g_r = -(vu * k00 * x + vv * k11 * y) * theta / (r * r)
    # J entries
    g_a = vj00 * k00 * x2 + (vj01 * k00 + vj10 * k11) * xy + vj11 * k11 * y2
    g_b = vj00 * k00 * y2 - (vj01 * k00 + vj10 * k11) * xy + vj11 * k11 * x2
    g_x2 = vj00 * k00 * a + vj11 * k11 * b
    g_y2 = vj00 * k00 * b + vj11 * k11 * a
    g_xy = (vj01 * k00 + vj10 * k11) * (a - b)
    g_inv = -(vj02 * k00 * x + vj12 * k11 * y)
    gx += -vj02 * k00 * inv
    gy += -vj12 * k11 * inv
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


def add_blur(c00, c01, c11, eps2d):
    """Adds eps2d to the diagonal; returns (c00', c11', det_before, det_after clamped)."""
    eps2d = like(c00, eps2d)
    det_orig = c00 * c11 - c01 * c01
    c00 = c00 + eps2d
    c11 = c11 + eps2d
    det = max(c00 * c11 - c01 * c01, like(c00, 1e-10))
    return c00, c11, det_orig, det


def conic_from_covar2d(c00, c01, c11, det):
    """Inverse (a, b, c) of the symmetric 2x2 covariance with determinant det."""
    inv = like(det, 1.0) / det
    return c11 * inv, -c01 * inv, c00 * inv


def conic_vjp(c00, c01, c11, eps2d, va, vb, vc, vcomp, calc_comp):
    """Gradient of the conic (and of the compensation when calc_comp) w.r.t. the 2D covariance
    *before* eps2d, as full-matrix entries (v00, v01, v11).

    conic = inverse(C + eps2d I) with det clamped at 1e-10, compensation =
    sqrt(max(det(C) / det(C + eps2d I), 0)).
    """
    eps2d = like(c00, eps2d)
    e00 = c00 + eps2d
    e11 = c11 + eps2d
    det_raw = e00 * e11 - c01 * c01
    det = max(det_raw, like(c00, 1e-10))
    inv = like(c00, 1.0) / det
    a = e11 * inv
    b = -c01 * inv
    c = e00 * inv
    v_det = -(va * a + vb * b + vc * c) * inv
    v00 = vc * inv
    v11 = va * inv
    v01 = -like(c00, 0.5) * vb * inv
    if calc_comp:
        det_orig = c00 * c11 - c01 * c01
        ratio = det_orig * inv
        if ratio > like(c00, 0.0):
            v_ratio = vcomp * like(c00, 0.5) / math.sqrt(ratio)
            v_orig = v_ratio * inv
            v_det += -v_ratio * ratio * inv
            v00 += v_orig * c11
            v11 += v_orig * c00
            v01 += -v_orig * c01
    if det_raw < like(c00, 1e-10):
        v_det = like(c00, 0.0) * v_det
    v00 += v_det * e11
    v11 += v_det * e00
    v01 += -v_det * c01
    return v00, v01, v11


# ---------------------------------------------------------------------------------------------
# spherical harmonics (real, Sloan's form, as gsplat's reference)

_SH = (
    0.2820947917738781,
    0.48860251190292,
    1.092548430592079,
    0.5462742152960395,
    0.9461746957575601,
    0.3153915652525201,
    2.285228997322329,
    0.4570457994644658,
    1.445305721320277,
    0.5900435899266435,
    1.865881662950577,
    1.119528997770346,
    4.683325804901025,
    2.007139630671868,
    3.31161143515146,
    0.47308734787878,
    1.770130769779931,
    0.6258357354491763,
    1.984313483298443,
    1.006230589874905,
)


def sh_basis(degree, x, y, z):
    """The 25 real SH basis values at the unit direction (x, y, z); entries beyond degree are
    0. Indices follow gsplat (k = l^2 + l + m)."""
    zero = like(x, 0.0)
    b1 = b2 = b3 = b4 = b5 = b6 = b7 = b8 = zero
    b9 = b10 = b11 = b12 = b13 = b14 = b15 = zero
    b16 = b17 = b18 = b19 = b20 = b21 = b22 = b23 = b24 = zero
    b0 = like(x, _SH[0])
    if degree >= 1:
        k = like(x, _SH[1])
        b1 = -k * y
        b2 = k * z
        b3 = -k * x
    if degree >= 2:
        z2 = z * z
        tb = -like(x, _SH[2]) * z
        ta = like(x, _SH[3])
        c1 = x * x - y * y
        s1 = like(x, 2.0) * x * y
        b6 = like(x, _SH[4]) * z2 - like(x, _SH[5])
        b7 = tb * x
        b5 = tb * y
        b8 = ta * c1
        b4 = ta * s1
        if degree >= 3:
            tc = -like(x, _SH[6]) * z2 + like(x, _SH[7])
            tb = like(x, _SH[8]) * z
            ta = -like(x, _SH[9])
            c2 = x * c1 - y * s1
            s2 = x * s1 + y * c1
            b12 = z * (like(x, _SH[10]) * z2 - like(x, _SH[11]))
            b13 = tc * x
            b11 = tc * y
            b14 = tb * c1
            b10 = tb * s1
            b15 = ta * c2
            b9 = ta * s2
            if degree >= 4:
                td = z * (-like(x, _SH[12]) * z2 + like(x, _SH[13]))
                tc = like(x, _SH[14]) * z2 - like(x, _SH[15])
                tb = -like(x, _SH[16]) * z
                ta = like(x, _SH[17])
                c3 = x * c2 - y * s2
                s3 = x * s2 + y * c2
                b20 = like(x, _SH[18]) * z2 * (like(x, _SH[10]) * z2 - like(x, _SH[11])) - like(
                    x, _SH[19]
                ) * (like(x, _SH[4]) * z2 - like(x, _SH[5]))
                b21 = td * x
                b19 = td * y
                b22 = tc * c1
                b18 = tc * s1
                b23 = tb * c2
                b17 = tb * s2
                b24 = ta * c3
                b16 = ta * s3
    return (
        b0,
        b1,
        b2,
        b3,
        b4,
        b5,
        b6,
        b7,
        b8,
        b9,
        b10,
        b11,
        b12,
        b13,
        b14,
        b15,
        b16,
        b17,
        b18,
        b19,
        b20,
        b21,
        b22,
        b23,
        b24,
    )


def sh_basis_vjp(degree, x, y, z, g):
    """Gradient (v_x, v_y, v_z) of sum_k g[k] * sh_basis(degree, x, y, z)[k], treating x, y,
    z as independent (the normalisation is handled by normalize3_vjp). g: any indexable of 25
    (a tuple, or a local array on either target)."""
    zero = like(x, 0.0)
    two = like(x, 2.0)
    gx = zero
    gy = zero
    gz = zero
    if degree >= 1:
        k = like(x, _SH[1])
        gy -= k * g[1]
        gz += k * g[2]
        gx -= k * g[3]
    if degree >= 2:
        z2 = z * z
        kb = like(x, _SH[2])
        tb = -kb * z
        ta = like(x, _SH[3])
        c1 = x * x - y * y
        s1 = two * x * y
        gz += like(x, _SH[4]) * two * z * g[6]
        gx += tb * g[7]
        gz -= kb * x * g[7]
        gy += tb * g[5]
        gz -= kb * y * g[5]
        gx += ta * two * x * g[8]
        gy -= ta * two * y * g[8]
        gx += ta * two * y * g[4]
        gy += ta * two * x * g[4]
        if degree >= 3:
            three = like(x, 3.0)
            tc = -like(x, _SH[6]) * z2 + like(x, _SH[7])
            dtc = -like(x, _SH[6]) * two * z
            kb3 = like(x, _SH[8])
            tb = kb3 * z
            ta = -like(x, _SH[9])
            c2 = x * c1 - y * s1
            s2 = x * s1 + y * c1
            gz += (three * like(x, _SH[10]) * z2 - like(x, _SH[11])) * g[12]
            gx += tc * g[13]
            gz += dtc * x * g[13]
            gy += tc * g[11]
            gz += dtc * y * g[11]
            gx += tb * two * x * g[14]
            gy -= tb * two * y * g[14]
            gz += kb3 * c1 * g[14]
            gx += tb * two * y * g[10]
            gy += tb * two * x * g[10]
            gz += kb3 * s1 * g[10]
            # c2 = Re (x + iy)^3, s2 = Im (x + iy)^3
            gx += ta * three * c1 * g[15]
            gy -= ta * three * s1 * g[15]
            gx += ta * three * s1 * g[9]
            gy += ta * three * c1 * g[9]
            if degree >= 4:
                four = like(x, 4.0)
                td = z * (-like(x, _SH[12]) * z2 + like(x, _SH[13]))
                dtd = -three * like(x, _SH[12]) * z2 + like(x, _SH[13])
                tc = like(x, _SH[14]) * z2 - like(x, _SH[15])
                dtc = like(x, _SH[14]) * two * z
                kb4 = like(x, _SH[16])
                tb = -kb4 * z
                ta = like(x, _SH[17])
                p3 = like(x, _SH[10]) * z2 - like(x, _SH[11])
                gz += (
                    like(x, _SH[18]) * (two * z * p3 + z2 * like(x, _SH[10]) * two * z)
                    - like(x, _SH[19]) * like(x, _SH[4]) * two * z
                ) * g[20]
                gx += td * g[21]
                gz += dtd * x * g[21]
                gy += td * g[19]
                gz += dtd * y * g[19]
                gx += tc * two * x * g[22]
                gy -= tc * two * y * g[22]
                gz += dtc * c1 * g[22]
                gx += tc * two * y * g[18]
                gy += tc * two * x * g[18]
                gz += dtc * s1 * g[18]
                gx += tb * three * c1 * g[23]
                gy -= tb * three * s1 * g[23]
                gz -= kb4 * c2 * g[23]
                gx += tb * three * s1 * g[17]
                gy += tb * three * c1 * g[17]
                gz -= kb4 * s2 * g[17]
                gx += ta * four * c2 * g[24]
                gy -= ta * four * s2 * g[24]
                gx += ta * four * s2 * g[16]
                gy += ta * four * c2 * g[16]
    return gx, gy, gz


def normalize3_vjp(x, y, z, gx, gy, gz):
    """Gradient w.r.t. v of v / max(|v|, 1e-12), given the gradient g of the result."""
    norm = math.sqrt(x * x + y * y + z * z)
    if norm <= like(x, 1e-12):
        inv = like(x, 1e12)
        return gx * inv, gy * inv, gz * inv
    inv = like(x, 1.0) / norm
    nx = x * inv
    ny = y * inv
    nz = z * inv
    d = nx * gx + ny * gy + nz * gz
    return (gx - nx * d) * inv, (gy - ny * d) * inv, (gz - nz * d) * inv


# ---------------------------------------------------------------------------------------------

FUNCTIONS = (
    "exp_neg",
    "gaussian_sigma",
    "quat_to_rotmat",
    "rotmat_vjp",
    "normalize4_vjp",
    "_rs_gram",
    "quat_scale_to_covar",
    "quat_scale_to_preci",
    "_rs_gram_vjp",
    "quat_scale_to_covar_vjp",
    "quat_scale_to_preci_vjp",
    "transform_covar",
    "transform_covar_vjp",
    "project_covar",
    "project_covar_vjp",
    "pinhole_proj",
    "pinhole_proj_vjp",
    "ortho_proj",
    "ortho_proj_vjp",
    "fisheye_proj",
    "fisheye_proj_vjp",
    "add_blur",
    "conic_from_covar2d",
    "conic_vjp",
    "sh_basis",
    "sh_basis_vjp",
    "normalize3_vjp",
)


def build(
    decorator: Callable[[Callable[..., Any]], Any],
    name: str,
    overrides: dict[str, Any] | None = None,
) -> types.ModuleType:
    """Compiles-on-demand copies of every function of :data:`FUNCTIONS` for one Numba target.

    ``decorator`` is e.g. ``numba.njit(inline="always")`` or ``numba.cuda.jit(device=True)``.
    Each copy's globals see the decorated copies of the others, so calls between them stay
    inside compiled code. Nothing compiles here; Numba compiles on first call. The result is
    a module object named ``name`` (Numba resolves ``module.function`` inside kernels).
    ``overrides`` replaces helpers the copies call (e.g. ``like`` / ``as_int32``, which a target
    may have to provide as its own intrinsics).
    """
    module = sys.modules[__name__]
    namespace: dict[str, Any] = dict(vars(module))
    namespace.update(overrides or {})
    out = types.ModuleType(name, "scalar_math compiled for one target")
    for name in FUNCTIONS:
        fn = getattr(module, name)
        copy = types.FunctionType(fn.__code__, namespace, name, fn.__defaults__, fn.__closure__)
        copy.__doc__ = fn.__doc__
        copy.__qualname__ = fn.__qualname__
        copy.__module__ = fn.__module__
        compiled = decorator(copy)
        namespace[name] = compiled
        setattr(out, name, compiled)
    return out
