"""CPU kernels: backward of the fused projection (``fully_fused_projection``); the launcher is
in ``projection``.

Gaussians in fixed chunks of ``CHUNK`` per work item over threads (``_common.parallel_for``);
each Gaussian sums its cameras in order, and each chunk writes its share of ``v_viewmats``,
summed chunk by chunk afterwards, so the result does not depend on the number of threads.
"""

from __future__ import annotations

from numba import njit

from ..shared.typed import like
from ._common import sm
from .projection_fwd import load_camera, load_covar, to_camera

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


@njit(cache=True, inline="always", error_model="numpy")
def write_zero_grads(covars, v_means, v_covars, v_quats, v_scales, b, n, zero):
    """The gradients of Gaussian (b, n) where no camera sees it: +0 (the reference's; the
    chain rule through its covariance would give the same values, some of them -0)."""
    for e in range(3):
        v_means[b, n, e] = zero
    if covars.shape[0] > 0:
        for e in range(6):
            v_covars[b, n, e] = zero
    else:
        for e in range(4):
            v_quats[b, n, e] = zero
        for e in range(3):
            v_scales[b, n, e] = zero


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
    Arrays are only indexed here, in the kernel (see ``projection_fwd.forward_kernel``: array
    arguments of per-Gaussian calls cost an atomic reference count each)."""
    n_b, n_g = means.shape[0], means.shape[1]
    n_c = viewmats.shape[1]
    want_vm = vm_part.shape[0] > 0
    calc_comp = v_comps.shape[0] > 0
    chunks_per_b = (n_g + CHUNK - 1) // CHUNK
    for ch in range(first, n_b * chunks_per_b, step):
        b = ch // chunks_per_b
        n0 = (ch - b * chunks_per_b) * CHUNK
        if want_vm:
            for c in range(n_c):
                for e in range(12):
                    vm_part[ch, c, e] = 0
        for n in range(n0, min(n_g, n0 + CHUNK)):
            mx, my, mz = means[b, n, 0], means[b, n, 1], means[b, n, 2]
            zero = like(mx, 0.0)
            seen = False
            for c in range(n_c):
                seen = seen or (radii[b, c, n, 0] > 0 and radii[b, c, n, 1] > 0)
            if not seen:  # culled in every camera (half the Gaussians of a real view)
                write_zero_grads(covars, v_means, v_covars, v_quats, v_scales, b, n, zero)
                continue
            cov = load_covar(covars, quats, scales, b, n)
            gm0 = zero
            gm1 = zero
            gm2 = zero
            # full-matrix entries of d loss / d world covariance
            gs0 = zero
            gs1 = zero
            gs2 = zero
            gs3 = zero
            gs4 = zero
            gs5 = zero
            for c in range(n_c):
                if radii[b, c, n, 0] <= 0 or radii[b, c, n, 1] <= 0:
                    continue
                r, t, k = load_camera(viewmats, Ks, b, c)
                g, vr, vcov = backward_one(
                    mx, my, mz, cov, r, t, k, width, height, eps2d, model,
                    v_means2d[b, c, n, 0], v_means2d[b, c, n, 1], v_depths[b, c, n],
                    v_conics[b, c, n, 0], v_conics[b, c, n, 1], v_conics[b, c, n, 2],
                    v_comps[b, c, n] if calc_comp else zero, calc_comp)
                # mean_c = R m + t
                gm0 += r[0] * g[0] + r[3] * g[1] + r[6] * g[2]
                gm1 += r[1] * g[0] + r[4] * g[1] + r[7] * g[2]
                gm2 += r[2] * g[0] + r[5] * g[1] + r[8] * g[2]
                gs0 += vcov[0]
                gs1 += vcov[1]
                gs2 += vcov[2]
                gs3 += vcov[3]
                gs4 += vcov[4]
                gs5 += vcov[5]
                if want_vm:
                    for row in range(3):
                        vm_part[ch, c, 4 * row + 0] += vr[3 * row + 0] + g[row] * mx
                        vm_part[ch, c, 4 * row + 1] += vr[3 * row + 1] + g[row] * my
                        vm_part[ch, c, 4 * row + 2] += vr[3 * row + 2] + g[row] * mz
                        vm_part[ch, c, 4 * row + 3] += g[row]
            v_means[b, n, 0] = gm0
            v_means[b, n, 1] = gm1
            v_means[b, n, 2] = gm2
            if covars.shape[0] > 0:
                two = like(zero, 2.0)
                v_covars[b, n, 0] = gs0
                v_covars[b, n, 1] = two * gs1
                v_covars[b, n, 2] = two * gs2
                v_covars[b, n, 3] = gs3
                v_covars[b, n, 4] = two * gs4
                v_covars[b, n, 5] = gs5
            else:
                q = sm.quat_scale_to_covar_vjp(
                    quats[b, n, 0], quats[b, n, 1], quats[b, n, 2], quats[b, n, 3],
                    scales[b, n, 0], scales[b, n, 1], scales[b, n, 2],
                    gs0, gs1, gs2, gs1, gs3, gs4, gs2, gs4, gs5,
                )
                v_quats[b, n, 0] = q[0]
                v_quats[b, n, 1] = q[1]
                v_quats[b, n, 2] = q[2]
                v_quats[b, n, 3] = q[3]
                v_scales[b, n, 0] = q[4]
                v_scales[b, n, 1] = q[5]
                v_scales[b, n, 2] = q[6]


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
