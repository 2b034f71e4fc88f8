"""CPU kernels: real spherical harmonics of degree 0-4 (``spherical_harmonics``).

Blocks of rows over threads (``_common.parallel_for``); the basis and its gradient are
``shared.sh``'s. Coefficients are read through the row map of ``backends/sh_rows.py`` (one
block of coefficients shared by ``reps`` blocks of evaluation rows, e.g. every camera); the
backward runs over coefficient rows and sums their evaluation rows in order, so it needs no
atomics and no [M, K, 3] buffer.
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
def unit(x, y, z):
    """(x, y, z) / max(|(x, y, z)|, 1e-12)."""
    inv = like(x, 1.0) / max(np.sqrt(x * x + y * y + z * z), like(x, 1e-12))
    return x * inv, y * inv, z * inv


@njit(cache=True, error_model="numpy")
def coeff_row(m, inner, reps):
    """The coefficient row of evaluation row m (``backends/sh_rows.py``)."""
    return (m // (reps * inner)) * inner + m % inner


# Arrays are only indexed in the kernels themselves: a compiled call that takes an array
# argument updates its reference count (an atomic) on every call, which cost more than the
# basis itself (``projection_fwd.forward_kernel``).


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, degree, dirs, coeffs, masks, inner, reps, colors):
    """colors [M, 3]; masks [M] or [0]; blocks first, first + step, ... of rows."""
    n = dirs.shape[0]
    n_basis = (degree + 1) * (degree + 1)
    has_mask = masks.shape[0] > 0
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for m in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            c = coeff_row(m, inner, reps)
            zero = like(dirs[m, 0], 0.0)
            r = zero
            g = zero
            b = zero
            if not has_mask or masks[m]:
                x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
                basis = sm.sh_basis(degree, x, y, z)
                for k in range(n_basis):
                    bk = basis[k]
                    r += bk * coeffs[c, k, 0]
                    g += bk * coeffs[c, k, 1]
                    b += bk * coeffs[c, k, 2]
            colors[m, 0] = r
            colors[m, 1] = g
            colors[m, 2] = b


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, degree, dirs, coeffs, masks, inner, reps, v_colors, v_dirs,
                    v_coeffs):
    """v_coeffs [Nb, K, 3]; v_dirs [M, 3] or [0, 3]; blocks first, first + step, ... of
    coefficient rows, each summing its evaluation rows in increasing order."""
    n = coeffs.shape[0]
    n_k = coeffs.shape[1]
    n_basis = (degree + 1) * (degree + 1)
    has_mask = masks.shape[0] > 0
    want_dirs = v_dirs.shape[0] > 0
    gk = np.zeros(25, dirs.dtype)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for c in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            m0 = (c // inner) * (reps * inner) + c % inner
            for i in range(reps):
                m = m0 + i * inner
                zero = like(dirs[m, 0], 0.0)
                on = not has_mask or masks[m]
                vr, vg, vb = v_colors[m, 0], v_colors[m, 1], v_colors[m, 2]
                if not on:  # a culled row: the same zero products, without the basis
                    for k in range(n_k):
                        if i > 0:
                            v_coeffs[c, k, 0] += zero * vr
                            v_coeffs[c, k, 1] += zero * vg
                            v_coeffs[c, k, 2] += zero * vb
                        else:
                            v_coeffs[c, k, 0] = zero * vr
                            v_coeffs[c, k, 1] = zero * vg
                            v_coeffs[c, k, 2] = zero * vb
                    if want_dirs:
                        v_dirs[m, 0] = zero
                        v_dirs[m, 1] = zero
                        v_dirs[m, 2] = zero
                    continue
                x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
                basis = sm.sh_basis(degree, x, y, z)
                for k in range(n_k):
                    bk = basis[k] if k < n_basis else zero
                    if i > 0:
                        v_coeffs[c, k, 0] += bk * vr
                        v_coeffs[c, k, 1] += bk * vg
                        v_coeffs[c, k, 2] += bk * vb
                    else:
                        v_coeffs[c, k, 0] = bk * vr
                        v_coeffs[c, k, 1] = bk * vg
                        v_coeffs[c, k, 2] = bk * vb
                if not want_dirs:
                    continue
                if degree > 0:
                    for k in range(25):
                        gk[k] = zero
                    for k in range(n_basis):
                        gk[k] = coeffs[c, k, 0] * vr + coeffs[c, k, 1] * vg + coeffs[c, k, 2] * vb
                    gx, gy, gz = sm.sh_basis_vjp(degree, x, y, z, gk)
                    vx, vy, vz = sm.normalize3_vjp(dirs[m, 0], dirs[m, 1], dirs[m, 2], gx, gy, gz)
                    v_dirs[m, 0] = vx
                    v_dirs[m, 1] = vy
                    v_dirs[m, 2] = vz
                else:
                    v_dirs[m, 0] = zero
                    v_dirs[m, 1] = zero
                    v_dirs[m, 2] = zero


# ---------------------------------------------------------------------------------------------
# launchers


def forward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K, 3]
    masks: torch.Tensor | None,  # [M] bool
    rows: tuple[int, int],
) -> torch.Tensor:
    """Returns colors [M, 3] (masked-out rows 0); coeffs read through ``rows``
    (``backends/sh_rows.py``)."""
    colors = alloc((dirs.shape[0], 3), dirs.dtype)
    mk = view(masks) if masks is not None else np.zeros((0,), np.bool_)
    n_blocks = (dirs.shape[0] + BLOCK - 1) // BLOCK
    parallel_for(forward_kernel, n_blocks, degree, view(dirs), view(coeffs), mk, rows[0],
                 rows[1], view(colors))
    return colors


def backward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K, 3]
    masks: torch.Tensor | None,  # [M] bool
    rows: tuple[int, int],
    v_colors: torch.Tensor,  # [M, 3]
    need_v_dirs: bool,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Returns v_dirs [M, 3] (or None), v_coeffs [Nb, K, 3]."""
    v_coeffs = alloc(tuple(coeffs.shape), coeffs.dtype)
    v_dirs = alloc((dirs.shape[0], 3), dirs.dtype) if need_v_dirs else None
    mk = view(masks) if masks is not None else np.zeros((0,), np.bool_)
    np_dt = view(dirs).dtype
    n_blocks = (coeffs.shape[0] + BLOCK - 1) // BLOCK
    parallel_for(
        backward_kernel,
        n_blocks,
        degree,
        view(dirs),
        view(coeffs),
        mk,
        rows[0],
        rows[1],
        view(v_colors.contiguous()),
        view(v_dirs) if v_dirs is not None else np.zeros((0, 3), np_dt),
        view(v_coeffs),
    )
    return v_dirs, v_coeffs
