"""CPU kernels: fused projection of 3D Gaussians (``fully_fused_projection``) forward, with
the reference's culling (``backends/torch/projection.py``), and the helpers its backward
(``projection_bwd``) shares. The launchers are in ``projection``.

Blocks of Gaussians run over threads (``_common.parallel_for``), all cameras in turn; the
camera model is ``shared.cameras``' dispatch on its code (its index in
``backends/cameras.CAMERA_MODELS``).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...constants import ALPHA_SKIP, RADIUS_SIGMAS
from ..shared.typed import like
from ._common import BLOCK, sm

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, inline="always", error_model="numpy")
def load_covar(covars, quats, scales, b, n):
    """The world covariance (symmetric 6-tuple) of Gaussian (b, n)."""
    if covars.shape[0] > 0:
        return (covars[b, n, 0], covars[b, n, 1], covars[b, n, 2], covars[b, n, 3],
                covars[b, n, 4], covars[b, n, 5])
    return sm.quat_scale_to_covar(quats[b, n, 0], quats[b, n, 1], quats[b, n, 2],
                                  quats[b, n, 3], scales[b, n, 0], scales[b, n, 1],
                                  scales[b, n, 2])


@njit(cache=True, error_model="numpy")
def load_camera(viewmats, Ks, b, c):
    """(R 9-tuple, t 3-tuple, (fx, fy, cx, cy)) of camera (b, c)."""
    r = (viewmats[b, c, 0, 0], viewmats[b, c, 0, 1], viewmats[b, c, 0, 2],
         viewmats[b, c, 1, 0], viewmats[b, c, 1, 1], viewmats[b, c, 1, 2],
         viewmats[b, c, 2, 0], viewmats[b, c, 2, 1], viewmats[b, c, 2, 2])
    t = (viewmats[b, c, 0, 3], viewmats[b, c, 1, 3], viewmats[b, c, 2, 3])
    k = (Ks[b, c, 0, 0], Ks[b, c, 1, 1], Ks[b, c, 0, 2], Ks[b, c, 1, 2])
    return r, t, k


@njit(cache=True, error_model="numpy")
def camera_mean(r, t, mx, my, mz):
    """The mean (3-tuple) in the camera of rotation r (9-tuple), t (3-tuple)."""
    return (
        r[0] * mx + r[1] * my + r[2] * mz + t[0],
        r[3] * mx + r[4] * my + r[5] * mz + t[1],
        r[6] * mx + r[7] * my + r[8] * mz + t[2],
    )


@njit(cache=True, error_model="numpy")
def to_camera(r, t, mx, my, mz, cov):
    """(mean_c 3-tuple, covar_c 6-tuple) in the camera of rotation r (9-tuple), t (3-tuple)."""
    mc = camera_mean(r, t, mx, my, mz)
    cc = sm.transform_covar(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                            cov[0], cov[1], cov[2], cov[3], cov[4], cov[5])
    return mc, cc


@njit(cache=True, inline="always", error_model="numpy")
def in_depth_range(depth, near, far):
    """near < depth < far, compared in depth's dtype."""
    return (depth > like(depth, near)) & (depth < like(depth, far))


@njit(cache=True, inline="always", error_model="numpy")
def project_one(mx, my, mz, cov, r, t, k, op, has_op, want_comp, width, height, eps2d, near,
                far, radius_clip, model):
    """One Gaussian in one camera, from scalars and tuples only.

    Returns (valid, rx, ry, u, v, depth, conic a, b, c, compensation); rx, ry, u, v, the conic
    and the compensation are 0 when not valid.
    """
    zero = like(mx, 0.0)
    mc = camera_mean(r, t, mx, my, mz)
    depth = mc[2]
    if not in_depth_range(depth, near, far):
        return False, zero, zero, zero, zero, depth, zero, zero, zero, zero
    cc = sm.transform_covar(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                            cov[0], cov[1], cov[2], cov[3], cov[4], cov[5])
    u, v, j = sm.project(model, mc[0], mc[1], mc[2], k[0], k[1], k[2], k[3], width, height)
    c00, c01, c11 = sm.project_covar(j[0], j[1], j[2], j[3], j[4], j[5], cc[0], cc[1], cc[2],
                                     cc[3], cc[4], cc[5])
    e00, e11, det_orig, det = sm.add_blur(c00, c01, c11, eps2d)
    det_raw = e00 * e11 - c01 * c01
    valid = det_raw > zero
    comp = zero
    if valid:
        ratio = det_orig / det
        comp = math.sqrt(ratio) if ratio > zero else zero
    extend = like(mx, RADIUS_SIGMAS)
    if has_op:
        if want_comp:
            op = op * comp
        valid = valid & (op >= like(mx, ALPHA_SKIP))
        ratio_op = max(op / like(mx, ALPHA_SKIP), like(mx, 1.0))
        extend = min(extend, math.sqrt(like(mx, 2.0) * math.log(ratio_op)))
    rx = like(mx, math.ceil(extend * math.sqrt(max(e00, zero))))
    ry = like(mx, math.ceil(extend * math.sqrt(max(e11, zero))))
    valid = valid and not (rx <= radius_clip and ry <= radius_clip)
    valid = valid & (u + rx > zero) & (u - rx < like(mx, width))
    valid = valid & (v + ry > zero) & (v - ry < like(mx, height))
    if not valid:
        return False, zero, zero, zero, zero, depth, zero, zero, zero, zero
    a_, b_, c_ = sm.conic_from_covar2d(e00, c01, e11, det)
    return True, rx, ry, u, v, depth, a_, b_, c_, comp


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(
    first,
    step,
    means,
    covars,
    quats,
    scales,
    opacities,
    viewmats,
    Ks,
    width,
    height,
    eps2d,
    near,
    far,
    radius_clip,
    model,
    radii,
    means2d,
    depths,
    conics,
    comps,
):
    """covars [B,N,6] or [0,0,6]; quats/scales [B,N,*] or empty; opacities [B,N] or [0,0];
    comps [B,C,N] or [0,0,0]. Outputs radii [B,C,N,2], means2d, depths, conics.

    Every array is read and written here, in the kernel: a compiled function that takes an
    array argument increments and decrements its reference count (an atomic on memory the
    threads share) on every call, which cost ~5x the projection's arithmetic per Gaussian."""
    n_b, n_g = means.shape[0], means.shape[1]
    n_c = viewmats.shape[1]
    n_all = n_b * n_g
    has_op = opacities.shape[0] > 0
    want_comp = comps.shape[0] > 0
    for blk in range(first, (n_all + BLOCK - 1) // BLOCK, step):
        for i in range(blk * BLOCK, min(n_all, (blk + 1) * BLOCK)):
            b = i // n_g
            n = i - b * n_g
            mx, my, mz = means[b, n, 0], means[b, n, 1], means[b, n, 2]
            zero = like(mx, 0.0)
            cov = (zero, zero, zero, zero, zero, zero)  # unread where no camera has its depth
            for c in range(n_c):
                r, t, _ = load_camera(viewmats, Ks, b, c)
                if in_depth_range(camera_mean(r, t, mx, my, mz)[2], near, far):
                    cov = load_covar(covars, quats, scales, b, n)
                    break
            op = opacities[b, n] if has_op else like(mx, 1.0)
            for c in range(n_c):
                r, t, k = load_camera(viewmats, Ks, b, c)
                valid, rx, ry, u, v, depth, ca, cb, cc, comp = project_one(
                    mx, my, mz, cov, r, t, k, op, has_op, want_comp, width, height, eps2d,
                    near, far, radius_clip, model)
                depths[b, c, n] = depth
                radii[b, c, n, 0] = np.int32(rx)
                radii[b, c, n, 1] = np.int32(ry)
                means2d[b, c, n, 0] = u
                means2d[b, c, n, 1] = v
                conics[b, c, n, 0] = ca
                conics[b, c, n, 1] = cb
                conics[b, c, n, 2] = cc
                if want_comp:
                    comps[b, c, n] = comp
