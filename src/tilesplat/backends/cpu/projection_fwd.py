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
def project_lane(mx, my, mz, cov, r, t, k, op, has_op, want_comp, width, height, eps2d, near,
                 far, radius_clip, model):
    """One Gaussian in one camera, from scalars and tuples only, the reference's projection
    and culling (``backends/torch/projection.py``): valid where the depth is in (near, far),
    the blurred 2D covariance is positive definite, the opacity (times the compensation when
    wanted) is >= ALPHA_SKIP, a radius exceeds radius_clip and the box meets the image.
    Branch-free on the Gaussian: every quantity is computed and the outputs are selected by
    the validity, so a loop over Gaussians of it vectorises. Returns (rx, ry, u, v, depth,
    conic a, b, c, compensation), 0 (but the depth) where not valid."""
    zero = like(mx, 0.0)
    mc = camera_mean(r, t, mx, my, mz)
    depth = mc[2]
    cc = sm.transform_covar(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                            cov[0], cov[1], cov[2], cov[3], cov[4], cov[5])
    u, v, j = sm.project(model, mc[0], mc[1], mc[2], k[0], k[1], k[2], k[3], width, height)
    c00, c01, c11 = sm.project_covar(j[0], j[1], j[2], j[3], j[4], j[5], cc[0], cc[1], cc[2],
                                     cc[3], cc[4], cc[5])
    e00, e11, det_orig, det = sm.add_blur(c00, c01, c11, eps2d)
    det_raw = e00 * e11 - c01 * c01
    valid = in_depth_range(depth, near, far) & (det_raw > zero)
    ratio = det_orig / det
    comp = math.sqrt(ratio) if valid & (ratio > zero) else zero
    op = op * comp if want_comp else op
    ratio_op = max(op / like(mx, ALPHA_SKIP), like(mx, 1.0))
    extend_op = min(like(mx, RADIUS_SIGMAS), math.sqrt(like(mx, 2.0) * math.log(ratio_op)))
    extend = extend_op if has_op else like(mx, RADIUS_SIGMAS)
    valid = valid & ((op >= like(mx, ALPHA_SKIP)) | (not has_op))
    rx = like(mx, math.ceil(extend * math.sqrt(max(e00, zero))))
    ry = like(mx, math.ceil(extend * math.sqrt(max(e11, zero))))
    valid = valid & ((rx > radius_clip) | (ry > radius_clip))
    valid = valid & (u + rx > zero) & (u - rx < like(mx, width))
    valid = valid & (v + ry > zero) & (v - ry < like(mx, height))
    a_, b_, c_ = sm.conic_from_covar2d(e00, c01, e11, det)
    return (rx if valid else zero, ry if valid else zero, u if valid else zero,
            v if valid else zero, depth, a_ if valid else zero, b_ if valid else zero,
            c_ if valid else zero, comp if valid else zero)


# rows of a block's scratch (``forward_kernel``): its inputs, then one camera's results
G_COV, G_MEAN, G_OP = 0, 6, 9  # covariance 6, mean 3, opacity
N_IN = 10
R_RX, R_RY, R_U, R_V, R_DEPTH, R_A, R_B, R_C, R_COMP = range(N_IN, N_IN + 9)
N_ROWS = N_IN + 9
# Scratch rows are BLOCK + PAD long: rows of exactly 4 KiB would put a column's values in one
# set of the L1 cache, more of them than it has ways.
PAD = 16


@njit(cache=True, inline="always", error_model="numpy")
def load_gaussians(means, covars, quats, scales, b, n0, n1, blk):
    """blk[0..5, n - n0] = the world covariance (symmetric 6-tuple) and blk[6..8, n - n0] the
    mean of Gaussian (b, n), n0 <= n < n1, in loops of their own (they vectorise); the
    backward's scratch has the same first rows."""
    # unsigned indices: NumPy's wrap-around of negative ones would keep LLVM from seeing
    # contiguous accesses
    u0, u1 = np.uint64(n0), np.uint64(n1)
    if covars.shape[0] > 0:
        for n in range(u0, u1):
            for e in range(6):
                blk[G_COV + e, n - u0] = covars[b, n, e]
    else:
        for n in range(u0, u1):
            c6 = sm.quat_scale_to_covar(quats[b, n, 0], quats[b, n, 1], quats[b, n, 2],
                                        quats[b, n, 3], scales[b, n, 0], scales[b, n, 1],
                                        scales[b, n, 2])
            i = n - u0
            blk[0, i], blk[1, i], blk[2, i] = c6[0], c6[1], c6[2]
            blk[3, i], blk[4, i], blk[5, i] = c6[3], c6[4], c6[5]
    for n in range(u0, u1):
        for e in range(3):
            blk[G_MEAN + e, n - u0] = means[b, n, e]


@njit(cache=True, inline="always", error_model="numpy")
def load_block(means, covars, quats, scales, opacities, b, n0, n1, blk):
    """:func:`load_gaussians`, and blk[G_OP, n - n0] the opacity (1 where there are none)."""
    load_gaussians(means, covars, quats, scales, b, n0, n1, blk)
    u0, u1 = np.uint64(n0), np.uint64(n1)
    if opacities.shape[0] > 0:
        for n in range(u0, u1):
            blk[G_OP, n - u0] = opacities[b, n]
    else:
        for n in range(u0, u1):
            blk[G_OP, n - u0] = 1.0


@njit(cache=True, inline="always", error_model="numpy")
def project_block(blk, count, r, t, k, has_op, want_comp, width, height, eps2d, near, far,
                  radius_clip, model):
    """The first ``count`` Gaussians of the block in one camera (r, t, k): from blk's G_* rows
    into its R_* rows, in one loop over one array (each extra array it wrote needed LLVM's
    run-time alias checks, past whose limit it did not vectorise). model: a constant where this
    is inlined for the pinhole's own loop."""
    for i in range(np.uint64(count)):
        cov6 = (blk[0, i], blk[1, i], blk[2, i], blk[3, i], blk[4, i], blk[5, i])
        rx, ry, u, v, depth, ca, cb, cc, comp = project_lane(
            blk[G_MEAN, i], blk[G_MEAN + 1, i], blk[G_MEAN + 2, i], cov6, r, t, k,
            blk[G_OP, i], has_op, want_comp, width, height, eps2d, near, far, radius_clip,
            model)
        blk[R_RX, i], blk[R_RY, i], blk[R_U, i], blk[R_V, i] = rx, ry, u, v
        blk[R_DEPTH, i], blk[R_A, i], blk[R_B, i], blk[R_C, i] = depth, ca, cb, cc
        blk[R_COMP, i] = comp


@njit(cache=True, inline="always", error_model="numpy")
def store_block(blk, b, c, n0, n1, radii, means2d, depths, conics, comps):
    """The block's results (R_* rows) to the outputs [b, c, n0:n1]."""
    u0, u1 = np.uint64(n0), np.uint64(n1)
    for n in range(u0, u1):
        depths[b, c, n] = blk[R_DEPTH, n - u0]
    for n in range(u0, u1):
        radii[b, c, n, 0] = np.int32(blk[R_RX, n - u0])
        radii[b, c, n, 1] = np.int32(blk[R_RY, n - u0])
    for n in range(u0, u1):
        means2d[b, c, n, 0] = blk[R_U, n - u0]
        means2d[b, c, n, 1] = blk[R_V, n - u0]
    for n in range(u0, u1):
        conics[b, c, n, 0] = blk[R_A, n - u0]
        conics[b, c, n, 1] = blk[R_B, n - u0]
        conics[b, c, n, 2] = blk[R_C, n - u0]
    if comps.shape[0] > 0:
        for n in range(u0, u1):
            comps[b, c, n] = blk[R_COMP, n - u0]


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
    """Items first, first + step, ... of (batch, block of BLOCK Gaussians).

    covars [B,N,6] or [0,0,6]; quats/scales [B,N,*] or empty; opacities [B,N] or [0,0];
    comps [B,C,N] or [0,0,0]. Outputs radii [B,C,N,2], means2d, depths, conics.

    A block's inputs go to rows of a scratch array first (:func:`load_block`); then each
    camera runs one branch-free loop over the block (:func:`project_lane`), which LLVM
    vectorises (the first camera model, pinhole, has a loop of its own with the model a
    constant; the others, any registered one, dispatch per Gaussian), and its results are
    stored. Arrays are read and written here, in the kernel: a compiled function that takes
    an array argument increments and decrements its reference count (an atomic on memory the
    threads share) on every call."""
    n_b, n_g = means.shape[0], means.shape[1]
    n_c = viewmats.shape[1]
    per_b = (n_g + BLOCK - 1) // BLOCK
    has_op = opacities.shape[0] > 0
    want_comp = comps.shape[0] > 0
    blk = np.empty((N_ROWS, BLOCK + PAD), means.dtype)
    for item in range(first, n_b * per_b, step):
        b = item // per_b
        n0 = (item - b * per_b) * BLOCK
        n1 = min(n_g, n0 + BLOCK)
        load_block(means, covars, quats, scales, opacities, b, n0, n1, blk)
        for c in range(n_c):
            r, t, k = load_camera(viewmats, Ks, b, c)
            if model == 0:  # the first camera model (pinhole): its own loop, vectorised
                project_block(blk, n1 - n0, r, t, k, has_op, want_comp, width, height, eps2d,
                              near, far, radius_clip, 0)
            else:  # any other registered model, dispatched per Gaussian
                project_block(blk, n1 - n0, r, t, k, has_op, want_comp, width, height, eps2d,
                              near, far, radius_clip, model)
            store_block(blk, b, c, n0, n1, radii, means2d, depths, conics, comps)
