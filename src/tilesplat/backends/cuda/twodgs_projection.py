"""CUDA kernels: the 2DGS projection (``fully_fused_projection_2dgs``), forward and backward.
The contract is the reference's (``backends/torch/twodgs.py``): ray transforms
M = K [R s_u e_1 | R s_v e_2 | mean_c], the screen box of the unit circle, radii, culling,
normals facing the camera.

One thread per (batch, camera, surfel). As the CPU kernels (``cpu/twodgs_projection.py``)
each thread works in float64 and rounds its outputs once: the screen box divides by
``M_w . diag(1, 1, -1) M_w``, which float32 holds poorly for surfels seen near edge-on. The
projection is a small part of a frame (a few hundred flops per pair), so float64 costs little
even on GPUs whose float64 rate is low.

The backward uses no atomics: each thread writes the gradient of its (camera, surfel) pair
to its own float64 row ([B, C, N, ROW]: the surfel's means, quats and scales, then the
camera's viewmat rows 0..2 and K), and PyTorch sums the rows over the cameras (the surfels'
gradients) and over the surfels (the cameras'), fixed reductions on the device. So the
projection's gradients are reproducible with or without the ``deterministic`` option.
The autograd wiring that calls the launchers is in ``twodgs``.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch
from numba import cuda

from ...constants import RADIUS_SIGMAS
from .device_math import device_math
from .runtime import cdiv, empty, float_type, launch, launcher

THREADS = 256
RADIUS_FLOOR = 1e-4  # the reference's lower clamp of the squared half extent
# columns of a backward row: v_means (3), v_quats (4), v_scales (3), v_viewmats rows 0..2
# (12), v_Ks (9)
ROW_MEANS, ROW_QUATS, ROW_SCALES, ROW_VIEW, ROW_K, ROW = 0, 3, 7, 10, 22, 31


def make_projection_2dgs_fwd(ft: type):
    """Kernel body of the 2DGS forward projection (outputs in float type ``ft``)."""
    sm = device_math()
    quat_to_rotmat = sm.quat_to_rotmat
    f64 = np.float64
    sigmas = float(RADIUS_SIGMAS)
    zero = ft(0.0)

    def projection_2dgs_fwd(
        means, quats, scales,  # [B, N, 3], [B, N, 4], [B, N, 3]
        viewmats, Ks,  # [B, C, 4, 4], [B, C, 3, 3]
        width, height, near, far, radius_clip,  # float64
        radii, means2d, depths, rays, normals,  # [B,C,N,2] i32, [..,2], [..], [..,3,3], [..,3]
    ):  # fmt: skip
        idx = cuda.grid(1)
        n_cams = viewmats.shape[1]
        n_gauss = means.shape[1]
        if idx >= means.shape[0] * n_cams * n_gauss:
            return
        b = idx // (n_cams * n_gauss)
        c = (idx // n_gauss) % n_cams
        n = idx % n_gauss
        rq = quat_to_rotmat(f64(quats[b, n, 0]), f64(quats[b, n, 1]), f64(quats[b, n, 2]),
                            f64(quats[b, n, 3]))
        rot = cuda.local.array((3, 3), np.float64)  # R_view R(q)
        mc = cuda.local.array(3, np.float64)  # the mean in camera space
        T = cuda.local.array((3, 3), np.float64)
        M = cuda.local.array((3, 3), np.float64)
        for i in range(3):
            mc[i] = f64(viewmats[b, c, i, 3])
            for k in range(3):
                mc[i] += f64(viewmats[b, c, i, k]) * f64(means[b, n, k])
                s = 0.0
                for m in range(3):
                    s += f64(viewmats[b, c, i, m]) * rq[3 * m + k]
                rot[i, k] = s
        for i in range(3):
            T[i, 0] = rot[i, 0] * f64(scales[b, n, 0])
            T[i, 1] = rot[i, 1] * f64(scales[b, n, 1])
            T[i, 2] = mc[i]
        for i in range(3):
            for k in range(3):
                s = 0.0
                for m in range(3):
                    s += f64(Ks[b, c, i, m]) * T[m, k]
                M[i, k] = s
        dist = M[2, 0] * M[2, 0] + M[2, 1] * M[2, 1] - M[2, 2] * M[2, 2]
        ok = dist != 0.0
        d = dist if ok else 1.0
        mx = (M[0, 0] * M[2, 0] + M[0, 1] * M[2, 1] - M[0, 2] * M[2, 2]) / d
        my = (M[1, 0] * M[2, 0] + M[1, 1] * M[2, 1] - M[1, 2] * M[2, 2]) / d
        sx = (M[0, 0] * M[0, 0] + M[0, 1] * M[0, 1] - M[0, 2] * M[0, 2]) / d
        sy = (M[1, 0] * M[1, 0] + M[1, 1] * M[1, 1] - M[1, 2] * M[1, 2]) / d
        rx = math.ceil(sigmas * math.sqrt(max(mx * mx - sx, RADIUS_FLOOR)))
        ry = math.ceil(sigmas * math.sqrt(max(my * my - sy, RADIUS_FLOOR)))
        depth = mc[2]
        keep = ok and depth > near and depth < far
        keep = keep and not (rx <= radius_clip and ry <= radius_clip)
        keep = keep and mx + rx > 0.0 and mx - rx < width and my + ry > 0.0
        keep = keep and my - ry < height
        toward = -(rot[0, 2] * mc[0] + rot[1, 2] * mc[1] + rot[2, 2] * mc[2])
        facing = 1.0 if toward > 0.0 else -1.0
        if keep:
            radii[b, c, n, 0] = int(rx)
            radii[b, c, n, 1] = int(ry)
            means2d[b, c, n, 0] = ft(mx)
            means2d[b, c, n, 1] = ft(my)
            depths[b, c, n] = ft(depth)
        else:
            radii[b, c, n, 0] = 0
            radii[b, c, n, 1] = 0
            means2d[b, c, n, 0] = zero
            means2d[b, c, n, 1] = zero
            depths[b, c, n] = zero
        for i in range(3):
            normals[b, c, n, i] = ft(rot[i, 2] * facing) if keep else zero
            for k in range(3):
                rays[b, c, n, i, k] = ft(M[i, k]) if keep else zero

    return projection_2dgs_fwd


def make_projection_2dgs_bwd(ft: type):
    """Kernel body of the 2DGS backward projection: row [b, c, n, :ROW] (float64) of each
    (camera, surfel) pair, zeros where the pair is culled."""
    sm = device_math()
    quat_to_rotmat = sm.quat_to_rotmat
    rotmat_vjp = sm.rotmat_vjp
    normalize4_vjp = sm.normalize4_vjp
    f64 = np.float64
    del ft  # the rows are float64 whatever the data's type

    def projection_2dgs_bwd(
        means, quats, scales,  # [B, N, 3], [B, N, 4], [B, N, 3]
        viewmats, Ks,  # [B, C, 4, 4], [B, C, 3, 3]
        radii,  # [B, C, N, 2] int32
        v_means2d, v_depths, v_rays, v_normals,  # [B,C,N,2], [..], [..,3,3], [..,3]
        rows,  # output [B, C, N, ROW] float64
    ):  # fmt: skip
        idx = cuda.grid(1)
        n_cams = viewmats.shape[1]
        n_gauss = means.shape[1]
        if idx >= means.shape[0] * n_cams * n_gauss:
            return
        b = idx // (n_cams * n_gauss)
        c = (idx // n_gauss) % n_cams
        n = idx % n_gauss
        for k in range(ROW):
            rows[b, c, n, k] = 0.0
        if radii[b, c, n, 0] <= 0 and radii[b, c, n, 1] <= 0:
            return  # culled: the outputs are constant zeros
        w0 = f64(quats[b, n, 0])
        x0 = f64(quats[b, n, 1])
        y0 = f64(quats[b, n, 2])
        z0 = f64(quats[b, n, 3])
        rq = quat_to_rotmat(w0, x0, y0, z0)
        rot = cuda.local.array((3, 3), np.float64)
        mc = cuda.local.array(3, np.float64)
        T = cuda.local.array((3, 3), np.float64)
        M = cuda.local.array((3, 3), np.float64)
        vM = cuda.local.array((3, 3), np.float64)
        vT = cuda.local.array((3, 3), np.float64)
        v_rot = cuda.local.array((3, 3), np.float64)
        v_rq = cuda.local.array(9, np.float64)
        v_mc = cuda.local.array(3, np.float64)
        for i in range(3):
            mc[i] = f64(viewmats[b, c, i, 3])
            for k in range(3):
                mc[i] += f64(viewmats[b, c, i, k]) * f64(means[b, n, k])
                s = 0.0
                for m in range(3):
                    s += f64(viewmats[b, c, i, m]) * rq[3 * m + k]
                rot[i, k] = s
        for i in range(3):
            T[i, 0] = rot[i, 0] * f64(scales[b, n, 0])
            T[i, 1] = rot[i, 1] * f64(scales[b, n, 1])
            T[i, 2] = mc[i]
        for i in range(3):
            for k in range(3):
                s = 0.0
                for m in range(3):
                    s += f64(Ks[b, c, i, m]) * T[m, k]
                M[i, k] = s
        dist = M[2, 0] * M[2, 0] + M[2, 1] * M[2, 1] - M[2, 2] * M[2, 2]
        d = dist if dist != 0.0 else 1.0
        mx = (M[0, 0] * M[2, 0] + M[0, 1] * M[2, 1] - M[0, 2] * M[2, 2]) / d
        my = (M[1, 0] * M[2, 0] + M[1, 1] * M[2, 1] - M[1, 2] * M[2, 2]) / d
        for i in range(3):
            for k in range(3):
                vM[i, k] = f64(v_rays[b, c, n, i, k])
        gx = f64(v_means2d[b, c, n, 0]) / d
        gy = f64(v_means2d[b, c, n, 1]) / d
        for k in range(3):
            t = 1.0 if k < 2 else -1.0
            vM[0, k] += gx * t * M[2, k]
            vM[1, k] += gy * t * M[2, k]
            vM[2, k] += t * (gx * (M[0, k] - 2.0 * mx * M[2, k])
                             + gy * (M[1, k] - 2.0 * my * M[2, k]))
        # M = K T: v_K = vM T^T, v_T = K^T vM
        for i in range(3):
            for m in range(3):
                s = 0.0
                for k in range(3):
                    s += vM[i, k] * T[m, k]
                rows[b, c, n, ROW_K + 3 * i + m] = s
            for k in range(3):
                s = 0.0
                for m in range(3):
                    s += f64(Ks[b, c, m, i]) * vM[m, k]
                vT[i, k] = s
        toward = -(rot[0, 2] * mc[0] + rot[1, 2] * mc[1] + rot[2, 2] * mc[2])
        facing = 1.0 if toward > 0.0 else -1.0
        vs0 = 0.0
        vs1 = 0.0
        for i in range(3):
            v_mc[i] = vT[i, 2]
            v_rot[i, 0] = vT[i, 0] * f64(scales[b, n, 0])
            v_rot[i, 1] = vT[i, 1] * f64(scales[b, n, 1])
            v_rot[i, 2] = f64(v_normals[b, c, n, i]) * facing
            vs0 += vT[i, 0] * rot[i, 0]
            vs1 += vT[i, 1] * rot[i, 1]
        v_mc[2] += f64(v_depths[b, c, n])
        # rot = R_view R(q), mean_c = R_view mean + t
        for i in range(3):
            for k in range(3):
                s = 0.0
                for m in range(3):
                    s += f64(viewmats[b, c, m, i]) * v_rot[m, k]
                v_rq[3 * i + k] = s
            for m in range(3):
                s = v_mc[i] * f64(means[b, n, m])
                for k in range(3):
                    s += v_rot[i, k] * rq[3 * m + k]
                rows[b, c, n, ROW_VIEW + 4 * i + m] = s
            rows[b, c, n, ROW_VIEW + 4 * i + 3] = v_mc[i]
            s = 0.0
            for m in range(3):
                s += f64(viewmats[b, c, m, i]) * v_mc[m]
            rows[b, c, n, ROW_MEANS + i] = s
        inv = 1.0 / max(math.sqrt(w0 * w0 + x0 * x0 + y0 * y0 + z0 * z0), 1e-12)
        gq = rotmat_vjp(w0 * inv, x0 * inv, y0 * inv, z0 * inv, v_rq[0], v_rq[1], v_rq[2],
                        v_rq[3], v_rq[4], v_rq[5], v_rq[6], v_rq[7], v_rq[8])
        gq = normalize4_vjp(w0, x0, y0, z0, gq[0], gq[1], gq[2], gq[3])
        for i in range(4):
            rows[b, c, n, ROW_QUATS + i] = gq[i]
        rows[b, c, n, ROW_SCALES] = vs0
        rows[b, c, n, ROW_SCALES + 1] = vs1

    return projection_2dgs_bwd


@cache
def _fwd_kernel(ft: type):
    return cuda.jit(make_projection_2dgs_fwd(ft))


@cache
def _bwd_kernel(ft: type):
    return cuda.jit(make_projection_2dgs_bwd(ft))


@launcher
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
    B, N = means.shape[:2]
    C = viewmats.shape[1]
    dtype, device = means.dtype, means.device
    outs = (empty((B, C, N, 2), torch.int32, device), empty((B, C, N, 2), dtype, device),
            empty((B, C, N), dtype, device), empty((B, C, N, 3, 3), dtype, device),
            empty((B, C, N, 3), dtype, device))
    total = B * C * N
    if total:
        launch(_fwd_kernel(float_type(dtype)), cdiv(total, THREADS), THREADS, device,
               means, quats, scales, viewmats, Ks, float(width), float(height),
               float(near_plane), float(far_plane), float(radius_clip), *outs)
    return outs


@launcher
def backward(
    inputs: tuple[torch.Tensor, ...],  # means, quats, scales, viewmats, Ks
    radii: torch.Tensor,  # [B, C, N, 2] int32
    v_outs: tuple[torch.Tensor, ...],  # v_means2d, v_depths, v_ray_transforms, v_normals
) -> tuple[torch.Tensor, ...]:
    """v_means [B, N, 3], v_quats [B, N, 4], v_scales [B, N, 3], v_viewmats [B, C, 4, 4],
    v_Ks [B, C, 3, 3]."""
    means, quats, scales, viewmats, Ks = inputs
    B, N = means.shape[:2]
    C = viewmats.shape[1]
    dtype, device = means.dtype, means.device
    rows = empty((B, C, N, ROW), torch.float64, device)
    total = B * C * N
    if total:
        launch(_bwd_kernel(float_type(dtype)), cdiv(total, THREADS), THREADS, device,
               means, quats, scales, viewmats, Ks, radii,
               *(v.contiguous() for v in v_outs), rows)
    per_surfel = rows[..., :ROW_VIEW].sum(dim=1)  # [B, N, 10]: over the cameras
    per_camera = rows[..., ROW_VIEW:].sum(dim=2)  # [B, C, 21]: over the surfels
    v_viewmats = torch.zeros((B, C, 4, 4), dtype=torch.float64, device=device)
    v_viewmats[:, :, :3, :] = per_camera[..., :ROW_K - ROW_VIEW].reshape(B, C, 3, 4)
    v_Ks = per_camera[..., ROW_K - ROW_VIEW:].reshape(B, C, 3, 3)
    return (per_surfel[..., ROW_MEANS:ROW_QUATS].to(dtype).contiguous(),
            per_surfel[..., ROW_QUATS:ROW_SCALES].to(dtype).contiguous(),
            per_surfel[..., ROW_SCALES:ROW_VIEW].to(dtype).contiguous(),
            v_viewmats.to(dtype), v_Ks.to(dtype).contiguous())
