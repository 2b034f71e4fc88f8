"""CPU kernels: backward of the fused projection (``fully_fused_projection``); the launcher is
in ``projection``.

Gaussians in fixed chunks of ``CHUNK`` per work item over threads (``_common.parallel_for``);
each Gaussian sums its cameras in order, and each chunk writes its share of ``v_viewmats``,
summed chunk by chunk afterwards, so the result does not depend on the number of threads.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..shared.typed import like
from ._common import sm
from .projection_fwd import G_COV, G_MEAN, PAD, load_camera, load_gaussians, to_camera

CHUNK = 1024  # Gaussians per work item (fixed: the v_viewmats sum order depends on it)

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, inline="always", error_model="numpy")
def backward_one(mx, my, mz, cov, r, t, k, width, height, eps2d, model, vu, vv, vd, va, vb, vc,
                 vcomp, calc_comp):
    """Gradients of one visible Gaussian in one camera, from scalars and tuples only.

    Returns (g, vr, vcov): g = d loss / d mean_c (3-tuple), vr = d loss / d R (9-tuple),
    vcov = d loss / d world covariance (full-matrix entries, symmetric 6-tuple).
    """
    mc, cc = to_camera(r, t, mx, my, mz, cov)
    fx, fy, cx, cy = k[0], k[1], k[2], k[3]
    u, v, j = sm.project(model, mc[0], mc[1], mc[2], fx, fy, cx, cy, width, height)
    c00, c01, c11 = sm.project_covar(j[0], j[1], j[2], j[3], j[4], j[5], cc[0], cc[1], cc[2],
                                     cc[3], cc[4], cc[5])
    v00, v01, v11 = sm.conic_vjp(c00, c01, c11, eps2d, va, vb, vc, vcomp, calc_comp)
    vj, vcc = sm.project_covar_vjp(j[0], j[1], j[2], j[3], j[4], j[5], cc[0], cc[1], cc[2],
                                   cc[3], cc[4], cc[5], v00, v01, v11)
    gx, gy, gz = sm.project_vjp(model, mc[0], mc[1], mc[2], fx, fy, cx, cy, width, height, vu,
                                vv, vj)
    gz = gz + vd
    vr, vcov = sm.transform_covar_vjp(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8],
                                      cov[0], cov[1], cov[2], cov[3], cov[4], cov[5], vcc[0],
                                      vcc[1], vcc[2], vcc[3], vcc[4], vcc[5])
    return (gx, gy, gz), vr, vcov


# Rows of a chunk's scratch (``backward_kernel``): the inputs, one camera's upstream
# gradients, the sums over the cameras, one camera's shares of v_viewmats, the results.
B_COV, B_MEAN = G_COV, G_MEAN  # world covariance 6, mean 3 (``load_gaussians``)
B_VIS = 9  # 1 where the current camera sees the Gaussian (both radii > 0), else 0
B_VU, B_VV, B_VD, B_VA, B_VB, B_VC, B_VCOMP = range(10, 17)
B_GM, B_GS, B_SEEN = 17, 20, 26  # d loss / d mean 3, d loss / d world covariance 6, any camera
B_G, B_VR = 27, 30  # d loss / d mean_c 3 and d loss / d R 9 (for v_viewmats)
B_OUT = 39  # v_quats 4 and v_scales 3, or v_covars 6
N_BROWS = 46
# Scratch rows are CHUNK + PAD long (``projection_fwd.PAD``): the backward's 46 rows of
# exactly 4 KiB took ~10 % more time.


@njit(cache=True, inline="always", error_model="numpy")
def load_chunk(means, covars, quats, scales, b, n0, n1, blk):
    """blk[B_COV, B_MEAN rows, n - n0] for Gaussians n0 <= n < n1 of batch b
    (``projection_fwd.load_gaussians``: the same rows); the sums and B_SEEN zeroed."""
    load_gaussians(means, covars, quats, scales, b, n0, n1, blk)
    for row in range(B_GM, B_SEEN + 1):
        for i in range(np.uint64(n1 - n0)):
            blk[row, i] = 0.0


@njit(cache=True, inline="always", error_model="numpy")
def load_camera_rows(radii, v_means2d, v_depths, v_conics, v_comps, b, c, n0, n1, blk):
    """Camera c's visibility and upstream gradients of Gaussians n0 <= n < n1 into blk."""
    u0, u1 = np.uint64(n0), np.uint64(n1)
    for n in range(u0, u1):
        vis = (radii[b, c, n, 0] > 0) & (radii[b, c, n, 1] > 0)
        blk[B_VIS, n - u0] = 1.0 if vis else 0.0
        blk[B_SEEN, n - u0] = 1.0 if vis else blk[B_SEEN, n - u0]
    for n in range(u0, u1):
        blk[B_VU, n - u0] = v_means2d[b, c, n, 0]
        blk[B_VV, n - u0] = v_means2d[b, c, n, 1]
    for n in range(u0, u1):
        blk[B_VD, n - u0] = v_depths[b, c, n]
    for n in range(u0, u1):
        blk[B_VA, n - u0] = v_conics[b, c, n, 0]
        blk[B_VB, n - u0] = v_conics[b, c, n, 1]
        blk[B_VC, n - u0] = v_conics[b, c, n, 2]
    if v_comps.shape[0] > 0:
        for n in range(u0, u1):
            blk[B_VCOMP, n - u0] = v_comps[b, c, n]
    else:
        for i in range(u1 - u0):
            blk[B_VCOMP, i] = 0.0


@njit(cache=True, inline="always", error_model="numpy")
def backward_chunk(blk, count, r, t, k, width, height, eps2d, model, calc_comp, want_vm):
    """One camera (r, t, k) of the chunk's first ``count`` Gaussians: adds what it sees of
    them to the B_GM and B_GS sums (+0 where it does not see one: the sums stay those of the
    cameras that do, bit for bit), and (want_vm) writes B_G and B_VR. Branch-free over the
    Gaussians and on one array, so it vectorises; model: a constant in the pinhole's own loop."""
    for i in range(np.uint64(count)):
        zero = like(blk[0, i], 0.0)
        vis = blk[B_VIS, i] > zero
        cov = (blk[0, i], blk[1, i], blk[2, i], blk[3, i], blk[4, i], blk[5, i])
        g, vr, vcov = backward_one(
            blk[B_MEAN, i], blk[B_MEAN + 1, i], blk[B_MEAN + 2, i], cov, r, t, k, width,
            height, eps2d, model, blk[B_VU, i], blk[B_VV, i], blk[B_VD, i], blk[B_VA, i],
            blk[B_VB, i], blk[B_VC, i], blk[B_VCOMP, i], calc_comp)
        # mean_c = R m + t
        gm0 = r[0] * g[0] + r[3] * g[1] + r[6] * g[2]
        gm1 = r[1] * g[0] + r[4] * g[1] + r[7] * g[2]
        gm2 = r[2] * g[0] + r[5] * g[1] + r[8] * g[2]
        blk[B_GM, i] = blk[B_GM, i] + (gm0 if vis else zero)
        blk[B_GM + 1, i] = blk[B_GM + 1, i] + (gm1 if vis else zero)
        blk[B_GM + 2, i] = blk[B_GM + 2, i] + (gm2 if vis else zero)
        for e in range(6):
            blk[B_GS + e, i] = blk[B_GS + e, i] + (vcov[e] if vis else zero)
        if want_vm:
            blk[B_G, i], blk[B_G + 1, i], blk[B_G + 2, i] = g[0], g[1], g[2]
            blk[B_VR, i], blk[B_VR + 1, i], blk[B_VR + 2, i] = vr[0], vr[1], vr[2]
            blk[B_VR + 3, i], blk[B_VR + 4, i], blk[B_VR + 5, i] = vr[3], vr[4], vr[5]
            blk[B_VR + 6, i], blk[B_VR + 7, i], blk[B_VR + 8, i] = vr[6], vr[7], vr[8]


@njit(cache=True, inline="always", error_model="numpy")
def add_viewmat_shares(blk, count, vm_part, ch, c):
    """vm_part[ch, c] += the chunk's shares of camera c's v_viewmats, Gaussian by Gaussian in
    order (a sum whose order is fixed)."""
    for i in range(np.uint64(count)):
        if blk[B_VIS, i] > 0:
            for row in range(3):
                gr = blk[B_G + row, i]
                vm_part[ch, c, 4 * row + 0] += blk[B_VR + 3 * row, i] + gr * blk[B_MEAN, i]
                vm_part[ch, c, 4 * row + 1] += blk[B_VR + 3 * row + 1, i] + gr * blk[B_MEAN + 1, i]
                vm_part[ch, c, 4 * row + 2] += blk[B_VR + 3 * row + 2, i] + gr * blk[B_MEAN + 2, i]
                vm_part[ch, c, 4 * row + 3] += gr


@njit(cache=True, inline="always", error_model="numpy")
def finish_chunk(blk, count, has_covars):
    """The gradients of the world covariance (B_OUT: v_covars 6, or v_quats 4 and v_scales 3)
    from the sums; +0 for a Gaussian no camera sees (the reference's; the chain rule through
    its covariance would give the same values, some of them -0)."""
    for i in range(np.uint64(count)):
        zero = like(blk[0, i], 0.0)
        gs0, gs1, gs2 = blk[B_GS, i], blk[B_GS + 1, i], blk[B_GS + 2, i]
        gs3, gs4, gs5 = blk[B_GS + 3, i], blk[B_GS + 4, i], blk[B_GS + 5, i]
        if has_covars:
            two = like(zero, 2.0)
            blk[B_OUT, i], blk[B_OUT + 1, i], blk[B_OUT + 2, i] = gs0, two * gs1, two * gs2
            blk[B_OUT + 3, i], blk[B_OUT + 4, i], blk[B_OUT + 5, i] = gs3, two * gs4, gs5
        else:
            seen = blk[B_SEEN, i] > zero
            q = sm.quat_scale_to_covar_vjp(blk[B_OUT + 0, i], blk[B_OUT + 1, i],
                                           blk[B_OUT + 2, i], blk[B_OUT + 3, i],
                                           blk[B_OUT + 4, i], blk[B_OUT + 5, i],
                                           blk[B_OUT + 6, i], gs0, gs1, gs2, gs1, gs3, gs4,
                                           gs2, gs4, gs5)
            for e in range(7):
                blk[B_OUT + e, i] = q[e] if seen else zero


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(
    first,
    step,
    means,
    covars,
    quats,
    scales,
    viewmats,
    Ks,
    width,
    height,
    eps2d,
    model,
    radii,
    v_means2d,
    v_depths,
    v_conics,
    v_comps,
    v_means,
    v_covars,
    v_quats,
    v_scales,
    vm_part,
):
    """v_comps [B,C,N] or [0,0,0]; v_covars [B,N,6] or empty; v_quats/v_scales or empty;
    vm_part [n_chunks, C, 12] (R and t of each camera) or [0, C, 12].

    Each Gaussian sums its cameras in order and adds its v_viewmats share to vm_part[ch].
    A chunk's inputs and upstream gradients go to rows of a scratch array; each camera is one
    branch-free loop over them (``backward_chunk``), which LLVM vectorises. Arrays are only
    indexed here, in the kernel (see ``projection_fwd.forward_kernel``: array arguments of
    per-Gaussian calls cost an atomic reference count each)."""
    n_b, n_g = means.shape[0], means.shape[1]
    n_c = viewmats.shape[1]
    want_vm = vm_part.shape[0] > 0
    calc_comp = v_comps.shape[0] > 0
    has_covars = covars.shape[0] > 0
    chunks_per_b = (n_g + CHUNK - 1) // CHUNK
    blk = np.empty((N_BROWS, CHUNK + PAD), means.dtype)
    for ch in range(first, n_b * chunks_per_b, step):
        b = ch // chunks_per_b
        n0 = (ch - b * chunks_per_b) * CHUNK
        n1 = min(n_g, n0 + CHUNK)
        count = n1 - n0
        if want_vm:
            for c in range(n_c):
                for e in range(12):
                    vm_part[ch, c, e] = 0
        load_chunk(means, covars, quats, scales, b, n0, n1, blk)
        for c in range(n_c):
            load_camera_rows(radii, v_means2d, v_depths, v_conics, v_comps, b, c, n0, n1, blk)
            r, t, k = load_camera(viewmats, Ks, b, c)
            if model == 0:  # the first camera model (pinhole): its own loop, vectorised
                backward_chunk(blk, count, r, t, k, width, height, eps2d, 0, calc_comp, want_vm)
            else:  # any other registered model, dispatched per Gaussian
                backward_chunk(blk, count, r, t, k, width, height, eps2d, model, calc_comp,
                               want_vm)
            if want_vm:
                add_viewmat_shares(blk, count, vm_part, ch, c)
        u0, u1 = np.uint64(n0), np.uint64(n1)
        if not has_covars:
            for n in range(u0, u1):
                for e in range(4):
                    blk[B_OUT + e, n - u0] = quats[b, n, e]
                for e in range(3):
                    blk[B_OUT + 4 + e, n - u0] = scales[b, n, e]
        finish_chunk(blk, count, has_covars)
        for n in range(u0, u1):
            for e in range(3):
                v_means[b, n, e] = blk[B_GM + e, n - u0]
        if has_covars:
            for n in range(u0, u1):
                for e in range(6):
                    v_covars[b, n, e] = blk[B_OUT + e, n - u0]
        else:
            for n in range(u0, u1):
                for e in range(4):
                    v_quats[b, n, e] = blk[B_OUT + e, n - u0]
            for n in range(u0, u1):
                for e in range(3):
                    v_scales[b, n, e] = blk[B_OUT + 4 + e, n - u0]


@njit(cache=True, error_model="numpy")
def reduce_viewmats(vm_part, n_b, v_viewmats):
    """v_viewmats [B, C, 4, 4]: the chunks' shares summed in chunk order; row 3 is 0."""
    per_b = vm_part.shape[0] // n_b
    zero = like(vm_part[0, 0, 0], 0.0)
    for b in range(n_b):
        for c in range(vm_part.shape[1]):
            for e in range(12):
                s = zero
                for ch in range(b * per_b, (b + 1) * per_b):
                    s += vm_part[ch, c, e]
                v_viewmats[b, c, e // 4, e % 4] = s
            for e in range(4):
                v_viewmats[b, c, 3, e] = zero
