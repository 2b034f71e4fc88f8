"""From a camera-space covariance to the conic: the projection through the camera's Jacobian
(J C J^T, EWA splatting), the ``eps2d`` blur with its compensation, and the inverse; with
their VJPs.

A symmetric 2x2 matrix is the 3-tuple ``(xx, xy, yy)``; the determinant is clamped at
``constants.DET_MIN`` before the inversion, as the reference does.
"""

from __future__ import annotations

import math

from ...constants import DET_MIN
from .typed import like

FUNCTIONS = ("project_covar", "project_covar_vjp", "add_blur", "conic_from_covar2d", "conic_vjp")


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


def add_blur(c00, c01, c11, eps2d):
    """Adds eps2d to the diagonal; returns (c00', c11', det_before, det_after clamped)."""
    eps2d = like(c00, eps2d)
    det_orig = c00 * c11 - c01 * c01
    c00 = c00 + eps2d
    c11 = c11 + eps2d
    det = max(c00 * c11 - c01 * c01, like(c00, DET_MIN))
    return c00, c11, det_orig, det


def conic_from_covar2d(c00, c01, c11, det):
    """Inverse (a, b, c) of the symmetric 2x2 covariance with determinant det."""
    inv = like(det, 1.0) / det
    return c11 * inv, -c01 * inv, c00 * inv


def conic_vjp(c00, c01, c11, eps2d, va, vb, vc, vcomp, calc_comp):
    """Gradient of the conic (and of the compensation when calc_comp) w.r.t. the 2D covariance
    *before* eps2d, as full-matrix entries (v00, v01, v11).

    conic = inverse(C + eps2d I) with det clamped at DET_MIN, compensation =
    sqrt(max(det(C) / det(C + eps2d I), 0)).
    """
    eps2d = like(c00, eps2d)
    e00 = c00 + eps2d
    e11 = c11 + eps2d
    det_raw = e00 * e11 - c01 * c01
    det = max(det_raw, like(c00, DET_MIN))
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
    if det_raw < like(c00, DET_MIN):
        v_det = like(c00, 0.0) * v_det
    v00 += v_det * e11
    v11 += v_det * e00
    v01 += -v_det * c01
    return v00, v01, v11
