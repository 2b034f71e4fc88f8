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
def forward_kernel(first, step, degree, dirs, coeffs, rest, masks, inner, reps, colors):
    """colors [M, 3] from coefficients ``coeffs`` [Nb, K0, 3] then ``rest`` [Nb, K1, 3];
    masks [M] or [0]; blocks first, first + step, ... of rows."""
    n = dirs.shape[0]
    n_basis = (degree + 1) * (degree + 1)
    k0 = coeffs.shape[1]
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
                for k in range(min(n_basis, k0)):
                    bk = basis[k]
                    r += bk * coeffs[c, k, 0]
                    g += bk * coeffs[c, k, 1]
                    b += bk * coeffs[c, k, 2]
                for k in range(k0, n_basis):  # the sum continues in the same order
                    bk = basis[k]
                    r += bk * rest[c, k - k0, 0]
                    g += bk * rest[c, k - k0, 1]
                    b += bk * rest[c, k - k0, 2]
            colors[m, 0] = r
            colors[m, 1] = g
            colors[m, 2] = b


@njit(inline="always", error_model="numpy")
def products(v, c, k_first, first, bas, nb, zero, vr, vg, vb):
    """Writes (``first``) or adds basis[k] * v_colour into v[c] [K, 3] (coefficient k_first +
    j in column j); coefficients at or past ``nb`` get the zero products, signs and all."""
    for j in range(v.shape[1]):
        k = k_first + j
        bk = bas[k] if k < nb else zero
        if first:
            v[c, j, 0] = bk * vr
            v[c, j, 1] = bk * vg
            v[c, j, 2] = bk * vb
        else:
            v[c, j, 0] += bk * vr
            v[c, j, 1] += bk * vg
            v[c, j, 2] += bk * vb


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, degree, dirs, coeffs, rest, masks, inner, reps, v_colors,
                    v_dirs, v_coeffs, v_rest):
    """v_coeffs [Nb, K0, 3], v_rest [Nb, K1, 3]; v_dirs [M, 3] or [0, 3]; blocks first,
    first + step, ... of coefficient rows, each summing its evaluation rows in increasing
    order. A culled row (mask false) contributes zero products: its basis is not made."""
    n = coeffs.shape[0]
    k0 = coeffs.shape[1]
    n_basis = (degree + 1) * (degree + 1)
    has_mask = masks.shape[0] > 0
    want_dirs = v_dirs.shape[0] > 0
    gk = np.zeros(25, dirs.dtype)
    bas = np.zeros(25, dirs.dtype)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for c in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            m0 = (c // inner) * (reps * inner) + c % inner
            for i in range(reps):
                m = m0 + i * inner
                zero = like(dirs[m, 0], 0.0)
                vr, vg, vb = v_colors[m, 0], v_colors[m, 1], v_colors[m, 2]
                x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
                nb = 0
                if not has_mask or masks[m]:
                    nb = n_basis
                    basis = sm.sh_basis(degree, x, y, z)
                    for k in range(n_basis):
                        bas[k] = basis[k]
                products(v_coeffs, c, 0, i == 0, bas, nb, zero, vr, vg, vb)
                products(v_rest, c, k0, i == 0, bas, nb, zero, vr, vg, vb)
                if not want_dirs:
                    continue
                if nb == 0 or degree == 0:
                    v_dirs[m, 0] = zero
                    v_dirs[m, 1] = zero
                    v_dirs[m, 2] = zero
                    continue
                for k in range(25):
                    gk[k] = zero
                for k in range(min(n_basis, k0)):
                    gk[k] = coeffs[c, k, 0] * vr + coeffs[c, k, 1] * vg + coeffs[c, k, 2] * vb
                for k in range(k0, n_basis):
                    gk[k] = (rest[c, k - k0, 0] * vr + rest[c, k - k0, 1] * vg
                             + rest[c, k - k0, 2] * vb)
                gx, gy, gz = sm.sh_basis_vjp(degree, x, y, z, gk)
                vx, vy, vz = sm.normalize3_vjp(dirs[m, 0], dirs[m, 1], dirs[m, 2], gx, gy, gz)
                v_dirs[m, 0] = vx
                v_dirs[m, 1] = vy
                v_dirs[m, 2] = vz


# ---------------------------------------------------------------------------------------------
# launchers


def forward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K0, 3]
    rest: torch.Tensor,  # [Nb, K1, 3]
    masks: torch.Tensor | None,  # [M] bool
    rows: tuple[int, int],
) -> torch.Tensor:
    """Returns colors [M, 3] (masked-out rows 0) of the coefficients ``coeffs`` then
    ``rest`` (``ops/sh.py``), read through ``rows`` (``backends/sh_rows.py``)."""
    colors = alloc((dirs.shape[0], 3), dirs.dtype)
    mk = view(masks) if masks is not None else np.zeros((0,), np.bool_)
    n_blocks = (dirs.shape[0] + BLOCK - 1) // BLOCK
    parallel_for(forward_kernel, n_blocks, degree, view(dirs), view(coeffs), view(rest), mk,
                 rows[0], rows[1], view(colors))
    return colors


def backward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K0, 3]
    rest: torch.Tensor,  # [Nb, K1, 3]
    masks: torch.Tensor | None,  # [M] bool
    rows: tuple[int, int],
    v_colors: torch.Tensor,  # [M, 3]
    need_v_dirs: bool,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Returns v_dirs [M, 3] (or None), v_coeffs [Nb, K0, 3], v_rest [Nb, K1, 3]."""
    v_coeffs = alloc(tuple(coeffs.shape), coeffs.dtype)
    v_rest = alloc(tuple(rest.shape), rest.dtype)
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
        view(rest),
        mk,
        rows[0],
        rows[1],
        view(v_colors.contiguous()),
        view(v_dirs) if v_dirs is not None else np.zeros((0, 3), np_dt),
        view(v_coeffs),
        view(v_rest),
    )
    return v_dirs, v_coeffs, v_rest
