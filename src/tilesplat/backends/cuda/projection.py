"""Fused projection kernels (``fully_fused_projection``): one thread per (batch, camera,
Gaussian), forward and backward, from ``shared`` (the camera model is ``shared.cameras``'
dispatch on its code, its index in ``backends/cameras.CAMERA_MODELS``).

The backward adds the gradients of the world-space parameters with atomics (a Gaussian seen
by several cameras), and writes the per-(camera, Gaussian) gradient of each viewmat to a
buffer that PyTorch sums over the Gaussians (deterministic, no contention on 16 floats).
With the ``deterministic`` option it writes the world-space gradients per camera too (rows
``b * C + c``), and PyTorch sums them over the cameras in a fixed order.
"""

from __future__ import annotations

import math
from functools import cache

import torch
from numba import cuda

from ...constants import ALPHA_SKIP, RADIUS_SIGMAS
from ..cameras import camera_code
from .device_math import device_math
from .runtime import cdiv, empty, float_type, get_options, launch, launcher, optional

THREADS = 256


def make_projection_fwd(ft: type):
    """Kernel body of the forward projection for float type ``ft``."""
    sm = device_math()
    quat_scale_to_covar = sm.quat_scale_to_covar
    transform_covar = sm.transform_covar
    project_covar = sm.project_covar
    project = sm.project
    add_blur = sm.add_blur
    conic_from_covar2d = sm.conic_from_covar2d
    zero = ft(0.0)
    one = ft(1.0)
    two = ft(2.0)
    skip = ft(ALPHA_SKIP)
    sigmas = ft(RADIUS_SIGMAS)

    def projection_fwd(
        means, covars, quats, scales, has_covars,  # [B,N,3], [B,N,6], [B,N,4], [B,N,3]
        opacities, has_opac,  # [B, N]
        viewmats, Ks,  # [B, C, 4, 4], [B, C, 3, 3]
        width, height, eps2d, near, far, radius_clip, calc_comp, model,
        radii, means2d, depths, conics, comps,  # outputs [B,C,N,2] i32, [..2], [..], [..3], [..]
    ):  # fmt: skip
        idx = cuda.grid(1)
        n_cams = viewmats.shape[1]
        n_gauss = means.shape[1]
        if idx >= means.shape[0] * n_cams * n_gauss:
            return
        b = idx // (n_cams * n_gauss)
        c = (idx // n_gauss) % n_cams
        n = idx % n_gauss
        V = viewmats
        mx = means[b, n, 0]
        my = means[b, n, 1]
        mz = means[b, n, 2]
        tx = V[b, c, 0, 0] * mx + V[b, c, 0, 1] * my + V[b, c, 0, 2] * mz + V[b, c, 0, 3]
        ty = V[b, c, 1, 0] * mx + V[b, c, 1, 1] * my + V[b, c, 1, 2] * mz + V[b, c, 1, 3]
        tz = V[b, c, 2, 0] * mx + V[b, c, 2, 1] * my + V[b, c, 2, 2] * mz + V[b, c, 2, 3]
        depths[b, c, n] = tz
        w = ft(width)
        h = ft(height)
        radii[b, c, n, 0] = 0
        radii[b, c, n, 1] = 0
        means2d[b, c, n, 0] = zero
        means2d[b, c, n, 1] = zero
        conics[b, c, n, 0] = zero
        conics[b, c, n, 1] = zero
        conics[b, c, n, 2] = zero
        if calc_comp:
            comps[b, c, n] = zero
        if not (tz > ft(near) and tz < ft(far)):
            return
        if has_covars:
            s = (covars[b, n, 0], covars[b, n, 1], covars[b, n, 2], covars[b, n, 3],
                 covars[b, n, 4], covars[b, n, 5])  # fmt: skip
        else:
            s = quat_scale_to_covar(
                quats[b, n, 0], quats[b, n, 1], quats[b, n, 2], quats[b, n, 3],
                scales[b, n, 0], scales[b, n, 1], scales[b, n, 2],
            )  # fmt: skip
        sc = transform_covar(
            V[b, c, 0, 0], V[b, c, 0, 1], V[b, c, 0, 2], V[b, c, 1, 0], V[b, c, 1, 1],
            V[b, c, 1, 2], V[b, c, 2, 0], V[b, c, 2, 1], V[b, c, 2, 2],
            s[0], s[1], s[2], s[3], s[4], s[5],
        )  # fmt: skip
        fx = Ks[b, c, 0, 0]
        fy = Ks[b, c, 1, 1]
        cx = Ks[b, c, 0, 2]
        cy = Ks[b, c, 1, 2]
        u, v, J = project(model, tx, ty, tz, fx, fy, cx, cy, width, height)
        c00, c01, c11 = project_covar(
            J[0], J[1], J[2], J[3], J[4], J[5], sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
        )
        e00, e11, det_orig, det = add_blur(c00, c01, c11, eps2d)
        if not (e00 * e11 - c01 * c01 > zero):
            return
        ca, cb, cc = conic_from_covar2d(e00, c01, e11, det)
        comp = zero
        if calc_comp:
            comp = math.sqrt(max(det_orig / det, zero))
        extend = sigmas
        if has_opac:
            opac = opacities[b, n]
            if calc_comp:
                opac = opac * comp
            if not (opac >= skip):
                return
            extend = min(extend, math.sqrt(two * math.log(max(opac / skip, one))))
        rx = ft(math.ceil(extend * math.sqrt(max(e00, zero))))
        ry = ft(math.ceil(extend * math.sqrt(max(e11, zero))))
        clip = ft(radius_clip)
        if rx <= clip and ry <= clip:
            return
        if not (u + rx > zero and u - rx < w and v + ry > zero and v - ry < h):
            return
        radii[b, c, n, 0] = int(rx)
        radii[b, c, n, 1] = int(ry)
        means2d[b, c, n, 0] = u
        means2d[b, c, n, 1] = v
        conics[b, c, n, 0] = ca
        conics[b, c, n, 1] = cb
        conics[b, c, n, 2] = cc
        if calc_comp:
            comps[b, c, n] = comp

    return projection_fwd


def make_projection_bwd(ft: type, det: bool = False):
    """Kernel body of the backward projection for float type ``ft``; with ``det`` the
    world-space gradients go to the row ``b * C + c`` of [B * C, N, ...] outputs (one writer
    per element) instead of ``b``."""
    sm = device_math()
    quat_scale_to_covar = sm.quat_scale_to_covar
    quat_scale_to_covar_vjp = sm.quat_scale_to_covar_vjp
    transform_covar = sm.transform_covar
    project_covar = sm.project_covar
    project_covar_vjp = sm.project_covar_vjp
    project = sm.project
    project_vjp = sm.project_vjp
    conic_vjp = sm.conic_vjp
    zero = ft(0.0)
    two = ft(2.0)

    def projection_bwd(
        means, covars, quats, scales, has_covars,  # [B,N,3], [B,N,6], [B,N,4], [B,N,3]
        viewmats, Ks, width, height, eps2d, model,  # [B,C,4,4], [B,C,3,3]
        radii, v_means2d, v_depths, v_conics,  # [B,C,N,2] i32, [..,2], [..], [..,3]
        v_comps, calc_comp,  # [B, C, N] (placeholder when calc_comp is False)
        need_viewmats,
        v_means, v_covars, v_quats, v_scales,  # outputs [B,N,3], [B,N,6], [B,N,4], [B,N,3]
        v_view,  # output [B, C, N, 12]: d/d viewmat rows 0..2 of this (camera, Gaussian)
    ):  # fmt: skip
        idx = cuda.grid(1)
        n_cams = viewmats.shape[1]
        n_gauss = means.shape[1]
        if idx >= means.shape[0] * n_cams * n_gauss:
            return
        b = idx // (n_cams * n_gauss)
        c = (idx // n_gauss) % n_cams
        n = idx % n_gauss
        if radii[b, c, n, 0] <= 0 or radii[b, c, n, 1] <= 0:
            return
        V = viewmats
        r00 = V[b, c, 0, 0]
        r01 = V[b, c, 0, 1]
        r02 = V[b, c, 0, 2]
        r10 = V[b, c, 1, 0]
        r11 = V[b, c, 1, 1]
        r12 = V[b, c, 1, 2]
        r20 = V[b, c, 2, 0]
        r21 = V[b, c, 2, 1]
        r22 = V[b, c, 2, 2]
        mx = means[b, n, 0]
        my = means[b, n, 1]
        mz = means[b, n, 2]
        tx = r00 * mx + r01 * my + r02 * mz + V[b, c, 0, 3]
        ty = r10 * mx + r11 * my + r12 * mz + V[b, c, 1, 3]
        tz = r20 * mx + r21 * my + r22 * mz + V[b, c, 2, 3]
        if has_covars:
            s = (covars[b, n, 0], covars[b, n, 1], covars[b, n, 2], covars[b, n, 3],
                 covars[b, n, 4], covars[b, n, 5])  # fmt: skip
        else:
            s = quat_scale_to_covar(
                quats[b, n, 0], quats[b, n, 1], quats[b, n, 2], quats[b, n, 3],
                scales[b, n, 0], scales[b, n, 1], scales[b, n, 2],
            )  # fmt: skip
        sc = transform_covar(
            r00, r01, r02, r10, r11, r12, r20, r21, r22, s[0], s[1], s[2], s[3], s[4], s[5]
        )
        fx = Ks[b, c, 0, 0]
        fy = Ks[b, c, 1, 1]
        cx = Ks[b, c, 0, 2]
        cy = Ks[b, c, 1, 2]
        _, _, J = project(model, tx, ty, tz, fx, fy, cx, cy, width, height)
        c00, c01, c11 = project_covar(
            J[0], J[1], J[2], J[3], J[4], J[5], sc[0], sc[1], sc[2], sc[3], sc[4], sc[5]
        )
        v_comp = v_comps[b, c, n] if calc_comp else zero
        g00, g01, g11 = conic_vjp(
            c00, c01, c11, eps2d, v_conics[b, c, n, 0], v_conics[b, c, n, 1],
            v_conics[b, c, n, 2], v_comp, calc_comp,
        )  # fmt: skip
        vJ, vS = project_covar_vjp(
            J[0], J[1], J[2], J[3], J[4], J[5], sc[0], sc[1], sc[2], sc[3], sc[4], sc[5],
            g00, g01, g11,
        )  # fmt: skip
        vu = v_means2d[b, c, n, 0]
        vv = v_means2d[b, c, n, 1]
        vtx, vty, vtz = project_vjp(model, tx, ty, tz, fx, fy, cx, cy, width, height, vu, vv, vJ)
        vtz += v_depths[b, c, n]
        o = b * n_cams + c if det else b  # the output row: the camera's own when det
        # means_c = R m + t
        cuda.atomic.add(v_means, (o, n, 0), r00 * vtx + r10 * vty + r20 * vtz)
        cuda.atomic.add(v_means, (o, n, 1), r01 * vtx + r11 * vty + r21 * vtz)
        cuda.atomic.add(v_means, (o, n, 2), r02 * vtx + r12 * vty + r22 * vtz)
        # covar_c = R S R^T: v_S = R^T G R with G the (symmetric) gradient of covar_c
        vs = transform_covar(
            r00, r10, r20, r01, r11, r21, r02, r12, r22, vS[0], vS[1], vS[2], vS[3], vS[4], vS[5]
        )
        if has_covars:
            cuda.atomic.add(v_covars, (o, n, 0), vs[0])
            cuda.atomic.add(v_covars, (o, n, 1), two * vs[1])
            cuda.atomic.add(v_covars, (o, n, 2), two * vs[2])
            cuda.atomic.add(v_covars, (o, n, 3), vs[3])
            cuda.atomic.add(v_covars, (o, n, 4), two * vs[4])
            cuda.atomic.add(v_covars, (o, n, 5), vs[5])
        else:
            g = quat_scale_to_covar_vjp(
                quats[b, n, 0], quats[b, n, 1], quats[b, n, 2], quats[b, n, 3],
                scales[b, n, 0], scales[b, n, 1], scales[b, n, 2],
                vs[0], vs[1], vs[2], vs[1], vs[3], vs[4], vs[2], vs[4], vs[5],
            )  # fmt: skip
            for k in range(4):
                cuda.atomic.add(v_quats, (o, n, k), g[k])
            for k in range(3):
                cuda.atomic.add(v_scales, (o, n, k), g[4 + k])
        if need_viewmats:
            # v_R = v_t m^T + 2 G R S, v_t = v_means_c
            a00 = r00 * s[0] + r01 * s[1] + r02 * s[2]  # rows of R S
            a01 = r00 * s[1] + r01 * s[3] + r02 * s[4]
            a02 = r00 * s[2] + r01 * s[4] + r02 * s[5]
            a10 = r10 * s[0] + r11 * s[1] + r12 * s[2]
            a11 = r10 * s[1] + r11 * s[3] + r12 * s[4]
            a12 = r10 * s[2] + r11 * s[4] + r12 * s[5]
            a20 = r20 * s[0] + r21 * s[1] + r22 * s[2]
            a21 = r20 * s[1] + r21 * s[3] + r22 * s[4]
            a22 = r20 * s[2] + r21 * s[4] + r22 * s[5]
            G0 = (vS[0], vS[1], vS[2])
            G1 = (vS[1], vS[3], vS[4])
            G2 = (vS[2], vS[4], vS[5])
            vt = (vtx, vty, vtz)
            for i in range(3):
                Gi = G0 if i == 0 else (G1 if i == 1 else G2)
                v_view[b, c, n, 4 * i + 0] = vt[i] * mx + two * (
                    Gi[0] * a00 + Gi[1] * a10 + Gi[2] * a20
                )
                v_view[b, c, n, 4 * i + 1] = vt[i] * my + two * (
                    Gi[0] * a01 + Gi[1] * a11 + Gi[2] * a21
                )
                v_view[b, c, n, 4 * i + 2] = vt[i] * mz + two * (
                    Gi[0] * a02 + Gi[1] * a12 + Gi[2] * a22
                )
                v_view[b, c, n, 4 * i + 3] = vt[i]

    return projection_bwd


@cache
def _fwd_kernel(ft: type):
    return cuda.jit(make_projection_fwd(ft))


@cache
def _bwd_kernel(ft: type, det: bool = False):
    return cuda.jit(make_projection_bwd(ft, det))


@launcher
def forward(
    means: torch.Tensor,  # [B, N, 3]
    covars: torch.Tensor | None,  # [B, N, 6]
    quats: torch.Tensor | None,  # [B, N, 4]
    scales: torch.Tensor | None,  # [B, N, 3]
    opacities: torch.Tensor | None,  # [B, N]
    viewmats: torch.Tensor,  # [B, C, 4, 4]
    Ks: torch.Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    calc_compensations: bool,
    camera_model: str,
) -> tuple:
    """Launcher: (radii [B,C,N,2] int32, means2d [B,C,N,2], depths [B,C,N],
    conics [B,C,N,3], compensations [B,C,N] | None)."""
    B, N = means.shape[:2]
    C = viewmats.shape[1]
    dtype, device = means.dtype, means.device
    radii = empty((B, C, N, 2), torch.int32, device)
    means2d = empty((B, C, N, 2), dtype, device)
    depths = empty((B, C, N), dtype, device)
    conics = empty((B, C, N, 3), dtype, device)
    comps = empty((B, C, N), dtype, device) if calc_compensations else None
    total = B * C * N
    if total == 0:
        return radii, means2d, depths, conics, comps
    launch(
        _fwd_kernel(float_type(dtype)), cdiv(total, THREADS), THREADS, device,
        means, optional(covars, means, 3), optional(quats, means, 3),
        optional(scales, means, 3), covars is not None, optional(opacities, means, 2),
        opacities is not None, viewmats, Ks, width, height, float(eps2d),
        float(near_plane), float(far_plane), float(radius_clip), bool(calc_compensations),
        camera_code(camera_model), radii, means2d, depths, conics, optional(comps, means, 3),
    )  # fmt: skip
    return radii, means2d, depths, conics, comps


@launcher
def backward(
    means: torch.Tensor,  # [B, N, 3]
    covars: torch.Tensor | None,  # [B, N, 6]
    quats: torch.Tensor | None,  # [B, N, 4]
    scales: torch.Tensor | None,  # [B, N, 3]
    opacities: torch.Tensor | None,  # [B, N] (the radius only: no gradient)
    viewmats: torch.Tensor,  # [B, C, 4, 4]
    Ks: torch.Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    eps2d: float,
    camera_model: str,
    radii: torch.Tensor,  # [B, C, N, 2] int32
    conics: torch.Tensor,  # [B, C, N, 3]
    compensations: torch.Tensor | None,  # [B, C, N]
    v_means2d: torch.Tensor,  # [B, C, N, 2]
    v_depths: torch.Tensor,  # [B, C, N]
    v_conics: torch.Tensor,  # [B, C, N, 3]
    v_compensations: torch.Tensor | None,  # [B, C, N]
    need_v_viewmats: bool,
) -> tuple:
    """Launcher: (v_means [B,N,3], v_covars [B,N,6] | None, v_quats [B,N,4] | None,
    v_scales [B,N,3] | None, v_viewmats [B,C,4,4] | None)."""
    del opacities, conics
    B, N = means.shape[:2]
    C = viewmats.shape[1]
    device = means.device
    det = bool(get_options()["deterministic"]) and C > 1
    rows = B * C if det else B  # det: one row per camera, summed over the cameras below

    def grad_of(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else torch.zeros((rows, *t.shape[1:]), dtype=t.dtype,
                                                  device=device)

    v_means = grad_of(means)
    v_covars = grad_of(covars)
    v_quats = grad_of(quats) if covars is None else None
    v_scales = grad_of(scales) if covars is None else None
    v_view = torch.zeros((B, C, N, 12) if need_v_viewmats else (1, 1, 1, 12),
                         dtype=means.dtype, device=device)  # fmt: skip
    calc_comp = compensations is not None and v_compensations is not None
    total = B * C * N
    if total > 0:
        launch(
            _bwd_kernel(float_type(means.dtype), det), cdiv(total, THREADS), THREADS, device,
            means, optional(covars, means, 3), optional(quats, means, 3),
            optional(scales, means, 3), covars is not None, viewmats, Ks,
            width, height, float(eps2d), camera_code(camera_model), radii.contiguous(),
            v_means2d.contiguous(), v_depths.contiguous(), v_conics.contiguous(),
            optional(v_compensations.contiguous() if calc_comp else None, means, 3),
            calc_comp, bool(need_v_viewmats), v_means, optional(v_covars, means, 3),
            optional(v_quats, means, 3), optional(v_scales, means, 3), v_view,
        )  # fmt: skip
    if det:
        def over_cameras(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.reshape(B, C, *t.shape[1:]).sum(dim=1)

        v_means, v_covars, v_quats, v_scales = (
            over_cameras(t) for t in (v_means, v_covars, v_quats, v_scales)
        )
    v_viewmats = None
    if need_v_viewmats:
        v_viewmats = torch.zeros_like(viewmats)
        v_viewmats[:, :, :3, :] = v_view.sum(dim=2).reshape(B, C, 3, 4)
    return v_means, v_covars, v_quats, v_scales, v_viewmats
