"""CPU kernels: quaternion + scale -> 3D covariance and precision (``quat_scale_to_covar_preci``).

Blocks of Gaussians over threads (``_common.parallel_for``); the math is ``shared.covariance``'s.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ..shared.typed import like
from ._common import BLOCK, alloc, parallel_for, sm, view

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def store_sym(out, m, vals, triu):
    """Writes a symmetric 6-tuple to out[m] as [6] (triu) or [3, 3]."""
    xx, xy, xz, yy, yz, zz = vals
    if triu:
        out[m, 0] = xx
        out[m, 1] = xy
        out[m, 2] = xz
        out[m, 3] = yy
        out[m, 4] = yz
        out[m, 5] = zz
    else:
        out[m, 0] = xx
        out[m, 1] = xy
        out[m, 2] = xz
        out[m, 3] = xy
        out[m, 4] = yy
        out[m, 5] = yz
        out[m, 6] = xz
        out[m, 7] = yz
        out[m, 8] = zz


@njit(cache=True, error_model="numpy")
def load_grad(v, m, triu):
    """The full-matrix gradient (9-tuple) from v[m] given as [6] (triu) or [3, 3] (as [9])."""
    if triu:
        half = like(v[m, 0], 0.5)
        return (
            v[m, 0],
            half * v[m, 1],
            half * v[m, 2],
            half * v[m, 1],
            v[m, 3],
            half * v[m, 4],
            half * v[m, 2],
            half * v[m, 4],
            v[m, 5],
        )
    return (v[m, 0], v[m, 1], v[m, 2], v[m, 3], v[m, 4], v[m, 5], v[m, 6], v[m, 7], v[m, 8])


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, quats, scales, covars, precis, triu):
    """covars / precis [M, 6 or 9] (or [0, k] when not wanted); blocks first, first + step..."""
    n = quats.shape[0]
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for m in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            forward_row(quats, scales, covars, precis, triu, m)


@njit(cache=True, error_model="numpy")
def forward_row(quats, scales, covars, precis, triu, m):
    want_c = covars.shape[0] > 0
    want_p = precis.shape[0] > 0
    w, x, y, z = quats[m, 0], quats[m, 1], quats[m, 2], quats[m, 3]
    sx, sy, sz = scales[m, 0], scales[m, 1], scales[m, 2]
    if want_c:
        store_sym(covars, m, sm.quat_scale_to_covar(w, x, y, z, sx, sy, sz), triu)
    if want_p:
        store_sym(precis, m, sm.quat_scale_to_preci(w, x, y, z, sx, sy, sz), triu)


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, quats, scales, v_covars, v_precis, triu, v_quats, v_scales):
    """v_covars / v_precis [M, 6 or 9] (or [0, k]); v_quats [M, 4], v_scales [M, 3]."""
    n = quats.shape[0]
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for m in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            backward_row(quats, scales, v_covars, v_precis, triu, v_quats, v_scales, m)


@njit(cache=True, error_model="numpy")
def _add7(a, b):
    """Elementwise sum of two 7-tuples (the quaternion and scale gradients)."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5],
            a[6] + b[6])


@njit(cache=True, error_model="numpy")
def backward_row(quats, scales, v_covars, v_precis, triu, v_quats, v_scales, m):
    want_c = v_covars.shape[0] > 0
    want_p = v_precis.shape[0] > 0
    w, x, y, z = quats[m, 0], quats[m, 1], quats[m, 2], quats[m, 3]
    sx, sy, sz = scales[m, 0], scales[m, 1], scales[m, 2]
    zero = like(w, 0.0)
    acc = (zero, zero, zero, zero, zero, zero, zero)
    if want_c:
        g = load_grad(v_covars, m, triu)
        r = sm.quat_scale_to_covar_vjp(
            w, x, y, z, sx, sy, sz, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]
        )
        acc = _add7(acc, r)
    if want_p:
        g = load_grad(v_precis, m, triu)
        r = sm.quat_scale_to_preci_vjp(
            w, x, y, z, sx, sy, sz, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8]
        )
        acc = _add7(acc, r)
    for i in range(4):
        v_quats[m, i] = acc[i]
    for i in range(3):
        v_scales[m, i] = acc[4 + i]


# ---------------------------------------------------------------------------------------------
# launchers


def _flat_or_empty(t: torch.Tensor | None, width: int, np_dt: np.dtype) -> np.ndarray:
    if t is None:
        return np.zeros((0, width), np_dt)
    return view(t).reshape(t.shape[0], -1)


def forward(
    quats: torch.Tensor,  # [M, 4]
    scales: torch.Tensor,  # [M, 3]
    compute_covar: bool,
    compute_preci: bool,
    triu: bool,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Returns covars and precis, each [M, 6] (triu) or [M, 3, 3], or None when not asked."""
    n = quats.shape[0]
    shape = (n, 6) if triu else (n, 3, 3)
    covars = alloc(shape, quats.dtype) if compute_covar else None
    precis = alloc(shape, quats.dtype) if compute_preci else None
    np_dt = view(quats).dtype
    k = 6 if triu else 9
    parallel_for(
        forward_kernel,
        (n + BLOCK - 1) // BLOCK,
        view(quats),
        view(scales),
        _flat_or_empty(covars, k, np_dt),
        _flat_or_empty(precis, k, np_dt),
        triu,
    )
    return covars, precis


def backward(
    quats: torch.Tensor,  # [M, 4]
    scales: torch.Tensor,  # [M, 3]
    v_covars: torch.Tensor | None,  # [M, 6] or [M, 3, 3]
    v_precis: torch.Tensor | None,  # [M, 6] or [M, 3, 3]
    triu: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns v_quats [M, 4], v_scales [M, 3]."""
    n = quats.shape[0]
    v_quats = alloc((n, 4), quats.dtype)
    v_scales = alloc((n, 3), quats.dtype)
    np_dt = view(quats).dtype
    k = 6 if triu else 9
    vc = None if v_covars is None else v_covars.contiguous()
    vp = None if v_precis is None else v_precis.contiguous()
    parallel_for(
        backward_kernel,
        (n + BLOCK - 1) // BLOCK,
        view(quats),
        view(scales),
        _flat_or_empty(vc, k, np_dt),
        _flat_or_empty(vp, k, np_dt),
        triu,
        view(v_quats),
        view(v_scales),
    )
    return v_quats, v_scales
