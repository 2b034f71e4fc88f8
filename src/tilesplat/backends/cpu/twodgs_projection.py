"""CPU kernels: the 2DGS projection (``fully_fused_projection_2dgs``), forward and backward.
The contract is the reference's (``backends/torch/twodgs.py``): ray transforms
M = K [R s_u e_1 | R s_v e_2 | mean_c], the screen box of the unit circle, radii, culling,
normals facing the camera.

Surfels in fixed chunks of ``CHUNK`` per work item (``_common.parallel_for``); each works in
float64 and rounds its outputs once. The backward recomputes the forward per (camera, surfel)
and sums each surfel's cameras in order; each chunk writes its share of the camera gradients
(``v_viewmats``, ``v_Ks``), summed chunk by chunk afterwards, so the result does not depend on
the number of threads. The autograd wiring that calls the launchers is in ``twodgs``.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ...constants import RADIUS_SIGMAS
from ._common import alloc, parallel_for, sm, view

CHUNK = 1024  # surfels per work item (fixed: the camera gradients' sum order depends on it)
RADIUS_FLOOR = 1e-4  # the reference's lower clamp of the squared half extent

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def surfel_frame(means, quats, scales, viewmats, Ks, b, c, n, rq, rot_c, mc, T, M):
    """Fills rq (R(q)), rot_c (R_view R(q)), mc (camera-space mean), T and M = K T [3, 3]
    (float64) of surfel n in camera c of batch b."""
    qn = sm.quat_to_rotmat(np.float64(quats[b, n, 0]), np.float64(quats[b, n, 1]),
                           np.float64(quats[b, n, 2]), np.float64(quats[b, n, 3]))
    for i in range(3):
        for k in range(3):
            rq[i, k] = qn[3 * i + k]
    for i in range(3):
        mc[i] = np.float64(viewmats[b, c, i, 3])
        for k in range(3):
            mc[i] += np.float64(viewmats[b, c, i, k]) * np.float64(means[b, n, k])
            rot_c[i, k] = 0.0
        for k in range(3):
            for m in range(3):
                rot_c[i, k] += np.float64(viewmats[b, c, i, m]) * rq[m, k]
    for i in range(3):
        T[i, 0] = rot_c[i, 0] * np.float64(scales[b, n, 0])
        T[i, 1] = rot_c[i, 1] * np.float64(scales[b, n, 1])
        T[i, 2] = mc[i]
    for i in range(3):
        for k in range(3):
            M[i, k] = 0.0
            for m in range(3):
                M[i, k] += np.float64(Ks[b, c, i, m]) * T[m, k]


@njit(cache=True, error_model="numpy")
def screen_box(M):
    """(ok, dist, mean_x, mean_y, half_x, half_y) of the unit circle's image under M."""
    dist = M[2, 0] * M[2, 0] + M[2, 1] * M[2, 1] - M[2, 2] * M[2, 2]
    ok = dist != 0.0
    d = dist if ok else 1.0
    mx = (M[0, 0] * M[2, 0] + M[0, 1] * M[2, 1] - M[0, 2] * M[2, 2]) / d
    my = (M[1, 0] * M[2, 0] + M[1, 1] * M[2, 1] - M[1, 2] * M[2, 2]) / d
    sx = (M[0, 0] * M[0, 0] + M[0, 1] * M[0, 1] - M[0, 2] * M[0, 2]) / d
    sy = (M[1, 0] * M[1, 0] + M[1, 1] * M[1, 1] - M[1, 2] * M[1, 2]) / d
    hx = math.sqrt(max(mx * mx - sx, RADIUS_FLOOR))
    hy = math.sqrt(max(my * my - sy, RADIUS_FLOOR))
    return ok, d, mx, my, hx, hy


@njit(cache=True, error_model="numpy")
def visible(ok, depth, mx, my, rx, ry, width, height, near, far, radius_clip):
    """The reference's culling rules."""
    v = ok and depth > near and depth < far
    v = v and not (rx <= radius_clip and ry <= radius_clip)
    return v and mx + rx > 0 and mx - rx < width and my + ry > 0 and my - ry < height


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, means, quats, scales, viewmats, Ks, width, height, near, far,
                   radius_clip, radii, means2d, depths, rays, normals):
    """Chunks first, first + step, ... of surfels (all batches and cameras)."""
    n_b, n_g = means.shape[0], means.shape[1]
    n_c = viewmats.shape[1]
    rq = np.empty((3, 3))
    rot_c = np.empty((3, 3))
    mc = np.empty(3)
    T = np.empty((3, 3))
    M = np.empty((3, 3))
    per_b = (n_g + CHUNK - 1) // CHUNK
    for ch in range(first, n_b * per_b, step):
        b = ch // per_b
        n0 = (ch - b * per_b) * CHUNK
        for n in range(n0, min(n_g, n0 + CHUNK)):
            for c in range(n_c):
                surfel_frame(means, quats, scales, viewmats, Ks, b, c, n, rq, rot_c, mc, T, M)
                ok, _, mx, my, hx, hy = screen_box(M)
                rx = math.ceil(RADIUS_SIGMAS * hx)
                ry = math.ceil(RADIUS_SIGMAS * hy)
                keep = visible(ok, mc[2], mx, my, rx, ry, width, height, near, far, radius_clip)
                facing = 1.0 if -(rot_c[0, 2] * mc[0] + rot_c[1, 2] * mc[1]
                                  + rot_c[2, 2] * mc[2]) > 0.0 else -1.0
                radii[b, c, n, 0] = int(rx) if keep else 0
                radii[b, c, n, 1] = int(ry) if keep else 0
                means2d[b, c, n, 0] = mx if keep else 0.0
                means2d[b, c, n, 1] = my if keep else 0.0
                depths[b, c, n] = mc[2] if keep else 0.0
                for i in range(3):
                    normals[b, c, n, i] = rot_c[i, 2] * facing if keep else 0.0
                    for k in range(3):
                        rays[b, c, n, i, k] = M[i, k] if keep else 0.0


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, means, quats, scales, viewmats, Ks, radii, v_means2d, v_depths,
                    v_rays, v_normals, v_means, v_quats, v_scales, vm_part, vk_part):
    """Chunks first, first + step, ...; v_means, v_quats, v_scales [B, N, 3|4|3]; vm_part
    [chunks, C, 4, 4] and vk_part [chunks, C, 3, 3] float64: each chunk's camera gradients."""
    n_b, n_g = means.shape[0], means.shape[1]
    n_c = viewmats.shape[1]
    rq = np.empty((3, 3))
    rot_c = np.empty((3, 3))
    mc = np.empty(3)
    T = np.empty((3, 3))
    M = np.empty((3, 3))
    vM = np.empty((3, 3))
    vT = np.empty((3, 3))
    v_rot = np.empty((3, 3))
    v_rq = np.empty((3, 3))
    v_mc = np.empty(3)
    acc = np.empty(10)  # v_means (3), v_quats (4), v_scales (3) over the cameras
    per_b = (n_g + CHUNK - 1) // CHUNK
    for ch in range(first, n_b * per_b, step):
        b = ch // per_b
        n0 = (ch - b * per_b) * CHUNK
        vm_part[ch] = 0.0
        vk_part[ch] = 0.0
        for n in range(n0, min(n_g, n0 + CHUNK)):
            acc[:] = 0.0
            for c in range(n_c):
                if radii[b, c, n, 0] <= 0 and radii[b, c, n, 1] <= 0:
                    continue  # culled: the outputs are constant zeros
                surfel_frame(means, quats, scales, viewmats, Ks, b, c, n, rq, rot_c, mc, T, M)
                _, d, mx, my, _, _ = screen_box(M)
                for i in range(3):
                    for k in range(3):
                        vM[i, k] = v_rays[b, c, n, i, k]
                gx = np.float64(v_means2d[b, c, n, 0]) / d
                gy = np.float64(v_means2d[b, c, n, 1]) / d
                for k in range(3):
                    t = 1.0 if k < 2 else -1.0
                    vM[0, k] += gx * t * M[2, k]
                    vM[1, k] += gy * t * M[2, k]
                    vM[2, k] += t * (gx * (M[0, k] - 2.0 * mx * M[2, k])
                                     + gy * (M[1, k] - 2.0 * my * M[2, k]))
                for i in range(3):
                    for k in range(3):
                        s = 0.0
                        for m in range(3):
                            s += np.float64(Ks[b, c, m, i]) * vM[m, k]
                            vk_part[ch, c, i, m] += vM[i, k] * T[m, k]
                        vT[i, k] = s
                facing = 1.0 if -(rot_c[0, 2] * mc[0] + rot_c[1, 2] * mc[1]
                                  + rot_c[2, 2] * mc[2]) > 0.0 else -1.0
                for i in range(3):
                    v_mc[i] = vT[i, 2]
                    v_rot[i, 0] = vT[i, 0] * np.float64(scales[b, n, 0])
                    v_rot[i, 1] = vT[i, 1] * np.float64(scales[b, n, 1])
                    v_rot[i, 2] = np.float64(v_normals[b, c, n, i]) * facing
                    acc[7] += vT[i, 0] * rot_c[i, 0]
                    acc[8] += vT[i, 1] * rot_c[i, 1]
                v_mc[2] += np.float64(v_depths[b, c, n])
                for i in range(3):
                    for k in range(3):
                        s = 0.0
                        for m in range(3):
                            s += np.float64(viewmats[b, c, m, i]) * v_rot[m, k]
                            # d rot_c[i, k] / d R_view[i, m] = rq[m, k]
                            vm_part[ch, c, i, m] += v_rot[i, k] * rq[m, k]
                        v_rq[i, k] = s
                    vm_part[ch, c, i, 3] += v_mc[i]
                    for m in range(3):
                        vm_part[ch, c, i, m] += v_mc[i] * np.float64(means[b, n, m])
                        acc[i] += np.float64(viewmats[b, c, m, i]) * v_mc[m]
                w0 = np.float64(quats[b, n, 0])
                x0 = np.float64(quats[b, n, 1])
                y0 = np.float64(quats[b, n, 2])
                z0 = np.float64(quats[b, n, 3])
                inv = 1.0 / max(math.sqrt(w0 * w0 + x0 * x0 + y0 * y0 + z0 * z0), 1e-12)
                q = (w0 * inv, x0 * inv, y0 * inv, z0 * inv)
                gq = sm.rotmat_vjp(q[0], q[1], q[2], q[3], v_rq[0, 0], v_rq[0, 1], v_rq[0, 2],
                                   v_rq[1, 0], v_rq[1, 1], v_rq[1, 2], v_rq[2, 0], v_rq[2, 1],
                                   v_rq[2, 2])
                gq = sm.normalize4_vjp(w0, x0, y0, z0, gq[0], gq[1], gq[2], gq[3])
                for i in range(4):
                    acc[3 + i] += gq[i]
            for i in range(3):
                v_means[b, n, i] = acc[i]
                v_scales[b, n, i] = acc[7 + i] if i < 2 else 0.0
            for i in range(4):
                v_quats[b, n, i] = acc[3 + i]


# ---------------------------------------------------------------------------------------------
# launchers


def forward(
    means: torch.Tensor,  # [B, N, 3]
    quats: torch.Tensor,  # [B, N, 4]
    scales: torch.Tensor,  # [B, N, 3]
    viewmats: torch.Tensor,  # [B, C, 4, 4]
    Ks: torch.Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
) -> tuple[torch.Tensor, ...]:
    """radii [B, C, N, 2] int32, means2d [B, C, N, 2], depths [B, C, N], ray_transforms
    [B, C, N, 3, 3], normals [B, C, N, 3]; culled entries are zero."""
    n_b, n_g = means.shape[:2]
    n_c = viewmats.shape[1]
    dt = means.dtype
    outs = (alloc((n_b, n_c, n_g, 2), torch.int32), alloc((n_b, n_c, n_g, 2), dt),
            alloc((n_b, n_c, n_g), dt), alloc((n_b, n_c, n_g, 3, 3), dt),
            alloc((n_b, n_c, n_g, 3), dt))
    if n_g * n_c:
        parallel_for(forward_kernel, n_b * ((n_g + CHUNK - 1) // CHUNK), view(means),
                     view(quats), view(scales), view(viewmats), view(Ks), float(width),
                     float(height), float(near_plane), float(far_plane), float(radius_clip),
                     *(view(o) for o in outs))
    return outs


def backward(
    inputs: tuple[torch.Tensor, ...],  # means, quats, scales, viewmats, Ks
    radii: torch.Tensor,  # [B, C, N, 2] int32
    v_outs: tuple[torch.Tensor, ...],  # v_means2d, v_depths, v_ray_transforms, v_normals
) -> tuple[torch.Tensor, ...]:
    """v_means [B, N, 3], v_quats [B, N, 4], v_scales [B, N, 3], v_viewmats [B, C, 4, 4],
    v_Ks [B, C, 3, 3]."""
    means, quats, scales, viewmats, Ks = inputs
    n_b, n_g = means.shape[:2]
    n_c = viewmats.shape[1]
    dt = means.dtype
    grads = (alloc((n_b, n_g, 3), dt), alloc((n_b, n_g, 4), dt), alloc((n_b, n_g, 3), dt))
    per_b = (n_g + CHUNK - 1) // CHUNK
    vm_part = np.empty((n_b * per_b, n_c, 4, 4))
    vk_part = np.empty((n_b * per_b, n_c, 3, 3))
    if n_g:
        parallel_for(backward_kernel, n_b * per_b, *(view(t) for t in inputs), view(radii),
                     *(view(v.contiguous()) for v in v_outs), *(view(g) for g in grads),
                     vm_part, vk_part)
    v_viewmats = torch.zeros((n_b, n_c, 4, 4), dtype=torch.float64)
    v_Ks = torch.zeros((n_b, n_c, 3, 3), dtype=torch.float64)
    for b in range(n_b):
        for ch in range(b * per_b, (b + 1) * per_b):  # chunk by chunk, in order
            v_viewmats[b] += torch.from_numpy(vm_part[ch])
            v_Ks[b] += torch.from_numpy(vk_part[ch])
    return (*grads, v_viewmats.to(dt), v_Ks.to(dt))
