"""``quat_scale_to_covar_preci`` kernels: one thread per Gaussian, from ``shared.covariance``."""

from __future__ import annotations

from functools import cache

import torch
from numba import cuda

from .device_math import device_math
from .runtime import cdiv, empty, float_type, launch, launcher, optional

THREADS = 256


def make_covar_fwd(ft: type):
    """Kernel body: covars / precis as [M, 9] (full, row-major) or [M, 6] (upper triangle)."""
    sm = device_math()
    to_covar = sm.quat_scale_to_covar
    to_preci = sm.quat_scale_to_preci

    def covar_fwd(quats, scales, do_covar, do_preci, triu, covars, precis):
        # quats [M, 4], scales [M, 3] -> covars, precis [M, 9] or [M, 6]
        m = cuda.grid(1)
        if m >= quats.shape[0]:
            return
        w, x, y, z = quats[m, 0], quats[m, 1], quats[m, 2], quats[m, 3]
        sx, sy, sz = scales[m, 0], scales[m, 1], scales[m, 2]
        for which in range(2):
            if which == 0 and do_covar:
                s = to_covar(w, x, y, z, sx, sy, sz)
                out = covars
            elif which == 1 and do_preci:
                s = to_preci(w, x, y, z, sx, sy, sz)
                out = precis
            else:
                continue
            if triu:
                for k in range(6):
                    out[m, k] = s[k]
            else:  # (xx, xy, xz, yy, yz, zz) -> row-major 3x3
                out[m, 0] = s[0]
                out[m, 1] = s[1]
                out[m, 2] = s[2]
                out[m, 3] = s[1]
                out[m, 4] = s[3]
                out[m, 5] = s[4]
                out[m, 6] = s[2]
                out[m, 7] = s[4]
                out[m, 8] = s[5]

    return covar_fwd


def make_covar_bwd(ft: type):
    """Kernel body: (v_quats, v_scales) from the gradients of covars and/or precis."""
    sm = device_math()
    covar_vjp = sm.quat_scale_to_covar_vjp
    preci_vjp = sm.quat_scale_to_preci_vjp
    half = ft(0.5)

    def covar_bwd(quats, scales, v_covars, has_vc, v_precis, has_vp, triu, v_quats, v_scales):
        # v_covars / v_precis [M, 9] or [M, 6] -> v_quats [M, 4], v_scales [M, 3]
        m = cuda.grid(1)
        if m >= quats.shape[0]:
            return
        w, x, y, z = quats[m, 0], quats[m, 1], quats[m, 2], quats[m, 3]
        sx, sy, sz = scales[m, 0], scales[m, 1], scales[m, 2]
        for which in range(2):
            if which == 0 and has_vc:
                v = v_covars
            elif which == 1 and has_vp:
                v = v_precis
            else:
                continue
            if triu:  # to_triu averages the two off-diagonal copies
                g = (v[m, 0], half * v[m, 1], half * v[m, 2], half * v[m, 1], v[m, 3],
                     half * v[m, 4], half * v[m, 2], half * v[m, 4], v[m, 5])  # fmt: skip
            else:
                g = (v[m, 0], v[m, 1], v[m, 2], v[m, 3], v[m, 4], v[m, 5], v[m, 6], v[m, 7],
                     v[m, 8])  # fmt: skip
            if which == 0:
                r = covar_vjp(w, x, y, z, sx, sy, sz, g[0], g[1], g[2], g[3], g[4], g[5], g[6],
                              g[7], g[8])  # fmt: skip
            else:
                r = preci_vjp(w, x, y, z, sx, sy, sz, g[0], g[1], g[2], g[3], g[4], g[5], g[6],
                              g[7], g[8])  # fmt: skip
            for k in range(4):
                v_quats[m, k] += r[k]
            for k in range(3):
                v_scales[m, k] += r[4 + k]

    return covar_bwd


@cache
def _fwd_kernel(ft: type):
    return cuda.jit(make_covar_fwd(ft))


@cache
def _bwd_kernel(ft: type):
    return cuda.jit(make_covar_bwd(ft))


@launcher
def forward(
    quats: torch.Tensor,  # [M, 4]
    scales: torch.Tensor,  # [M, 3]
    compute_covar: bool,
    compute_preci: bool,
    triu: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Launcher: (covars [M,3,3] or [M,6] | None, precis [M,3,3] or [M,6] | None)."""
    M = quats.shape[0]
    width = 6 if triu else 9
    covars = empty((M, width), quats.dtype, quats.device) if compute_covar else None
    precis = empty((M, width), quats.dtype, quats.device) if compute_preci else None
    if M > 0 and (compute_covar or compute_preci):
        launch(
            _fwd_kernel(float_type(quats.dtype)), cdiv(M, THREADS), THREADS, quats.device,
            quats, scales, bool(compute_covar), bool(compute_preci), bool(triu),
            optional(covars, quats, 2), optional(precis, quats, 2),
        )  # fmt: skip
    shape = (M, 6) if triu else (M, 3, 3)
    return (
        None if covars is None else covars.reshape(shape),
        None if precis is None else precis.reshape(shape),
    )


@launcher
def backward(
    quats: torch.Tensor,  # [M, 4]
    scales: torch.Tensor,  # [M, 3]
    v_covars: torch.Tensor | None,  # [M, 3, 3] or [M, 6]
    v_precis: torch.Tensor | None,  # [M, 3, 3] or [M, 6]
    triu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher: (v_quats [M, 4], v_scales [M, 3])."""
    M = quats.shape[0]
    v_quats = torch.zeros_like(quats)
    v_scales = torch.zeros_like(scales)
    width = 6 if triu else 9

    def flat(v):
        return None if v is None else v.reshape(M, width).contiguous()

    if M > 0 and (v_covars is not None or v_precis is not None):
        launch(
            _bwd_kernel(float_type(quats.dtype)), cdiv(M, THREADS), THREADS, quats.device,
            quats, scales, optional(flat(v_covars), quats, 2),
            v_covars is not None, optional(flat(v_precis), quats, 2), v_precis is not None,
            bool(triu), v_quats, v_scales,
        )  # fmt: skip
    return v_quats, v_scales
