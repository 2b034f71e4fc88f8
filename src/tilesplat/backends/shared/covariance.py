"""3D covariances: from a quaternion and scales (covariance and precision), and carried from the
world into a camera's frame (R C R^T); each with its VJP.

Quaternions are ``(w, x, y, z)``, normalised inside; a symmetric 3x3 matrix is the 6-tuple
``(xx, xy, xz, yy, yz, zz)``, its gradient given per entry of the full matrix (see
``shared/__init__.py``).
"""

from __future__ import annotations

import math

from .typed import like

FUNCTIONS = (
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
)


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
# world -> camera


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


def transform_covar_vjp(r00, r01, r02, r10, r11, r12, r20, r21, r22, c00, c01, c02, c11, c12,
                        c22, v00, v01, v02, v11, v12, v22):
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
