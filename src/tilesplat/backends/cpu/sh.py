"""CPU kernels: real spherical harmonics of degree 0-4 (``spherical_harmonics``).

Blocks of rows over threads (``_common.parallel_for``); the basis and its gradient are
``shared.sh``'s. Coefficients are read through the row map of ``backends/sh_rows.py`` (one
block of coefficients shared by ``reps`` blocks of evaluation rows, e.g. every camera); the
backward runs over coefficient rows and sums their evaluation rows in order, so it needs no
atomics and no [M, K, 3] buffer. The coefficients come in two parts along K (``ops/sh.py``:
the trainer's ``sh0`` and ``shN``, read and differentiated in place); the rows evaluated are
a bool mask's or those whose two radii are > 0, and ``rgb`` gives ``rasterization``'s
``max(colour + 0.5, 0)``, so that none of these is a separate pass over [M, 3] in torch.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ..shared.typed import like
from . import sh3
from ._common import BLOCK, alloc, parallel_for, sm, view
from .sh_common import rgb_grad, store_color, unit, visible

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def coeff_row(m, inner, reps):
    """The coefficient row of evaluation row m (``backends/sh_rows.py``)."""
    return (m // (reps * inner)) * inner + m % inner


# Arrays are only indexed in the kernels themselves: a compiled call that takes an array
# argument updates its reference count (an atomic) on every call, which cost more than the
# basis itself (``projection_fwd.forward_kernel``).


@njit(inline="always", error_model="numpy")
def store_basis(bas, basis):
    """bas[0..24] = the 25-tuple basis, by constant indices: a tuple indexed by a loop
    variable compiles to a jump table per element (a third of the SH backward's time)."""
    bas[0], bas[1], bas[2], bas[3], bas[4] = basis[0], basis[1], basis[2], basis[3], basis[4]
    bas[5], bas[6], bas[7], bas[8], bas[9] = basis[5], basis[6], basis[7], basis[8], basis[9]
    bas[10], bas[11], bas[12] = basis[10], basis[11], basis[12]
    bas[13], bas[14], bas[15] = basis[13], basis[14], basis[15]
    bas[16], bas[17], bas[18] = basis[16], basis[17], basis[18]
    bas[19], bas[20], bas[21] = basis[19], basis[20], basis[21]
    bas[22], bas[23], bas[24] = basis[22], basis[23], basis[24]


@njit(inline="always", error_model="numpy")
def sh_color(basis, n_basis, coeffs, rest, c, zero):
    """sum_k basis[k] coefficient k of row c, k in order: ``coeffs`` [Nb, K0, 3] then ``rest``
    [Nb, K1, 3]; (r, g, b). basis [25]: an array (:func:`store_basis`)."""
    k0 = coeffs.shape[1]
    r = zero
    g = zero
    b = zero
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
    return r, g, b


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, degree, dirs, coeffs, rest, masks, inner, reps, rgb, colors):
    """colors [M, 3] from coefficients ``coeffs`` [Nb, K0, 3] then ``rest`` [Nb, K1, 3], of
    the rows :func:`visible` in masks (0 elsewhere); with ``rgb`` max(colour + 0.5, 0);
    blocks first, first + step, ... of rows."""
    n = dirs.shape[0]
    n_basis = (degree + 1) * (degree + 1)
    bas = np.zeros(25, dirs.dtype)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for m in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            zero = like(dirs[m, 0], 0.0)
            r = zero
            g = zero
            b = zero
            if visible(masks, m):
                # one evaluation row per coefficient row (the trainer's): no integer division
                c = m if reps == 1 else coeff_row(m, inner, reps)
                x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
                store_basis(bas, sm.sh_basis(degree, x, y, z))
                r, g, b = sh_color(bas, n_basis, coeffs, rest, c, zero)
            store_color(colors, m, r, g, b, rgb, zero)


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
def backward_kernel(first, step, degree, dirs, coeffs, rest, masks, inner, reps, rgb, v_colors,
                    v_dirs, v_coeffs, v_rest):
    """v_coeffs [Nb, K0, 3], v_rest [Nb, K1, 3]; v_dirs [M, 3] or [0, 3]; blocks first,
    first + step, ... of coefficient rows, each summing its evaluation rows in increasing
    order. A row not :func:`visible` contributes zero products: its basis is not made.
    With ``rgb`` the colour is made again to pass v_colors through max(colour + 0.5, 0)."""
    n = coeffs.shape[0]
    k0 = coeffs.shape[1]
    n_basis = (degree + 1) * (degree + 1)
    want_dirs = v_dirs.shape[0] > 0
    gk = np.zeros(25, dirs.dtype)
    bas = np.zeros(25, dirs.dtype)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for c in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            m0 = c if reps == 1 else (c // inner) * (reps * inner) + c % inner
            for i in range(reps):
                m = m0 + i * inner
                zero = like(dirs[m, 0], 0.0)
                vr, vg, vb = v_colors[m, 0], v_colors[m, 1], v_colors[m, 2]
                x = y = z = zero
                nb = 0
                cr = zero
                cg = zero
                cb = zero
                if visible(masks, m):
                    x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
                    nb = n_basis
                    store_basis(bas, sm.sh_basis(degree, x, y, z))
                    if rgb:
                        cr, cg, cb = sh_color(bas, n_basis, coeffs, rest, c, zero)
                if rgb:
                    vr, vg, vb = rgb_grad(cr, vr, zero), rgb_grad(cg, vg, zero), rgb_grad(
                        cb, vb, zero)
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


def _masks(masks: torch.Tensor | None) -> np.ndarray:
    """The kernels' visibility: [M, 1] bool, [M, 2] radii, or [0, 1] (every row)."""
    if masks is None:
        return np.zeros((0, 1), np.bool_)
    m = view(masks)
    return m.reshape(-1, 1) if m.ndim == 1 else m


def _unrolled(degree: int, dirs: torch.Tensor, coeffs: torch.Tensor, rest: torch.Tensor,
              rows: tuple[int, int]) -> bool:
    """Whether :mod:`.sh3`'s kernels apply: degree 3 in the trainer's layout (``sh0`` [M, 1,
    3] and ``shN`` [M, 15, 3]), one evaluation row per coefficient row. They compute the
    same bits as this module's."""
    return (degree == 3 and rows[1] == 1 and coeffs.shape[0] == dirs.shape[0]
            and coeffs.shape[1] == 1 and rest.shape[1] == sh3.N_REST)


def forward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K0, 3]
    rest: torch.Tensor,  # [Nb, K1, 3]
    masks: torch.Tensor | None,  # [M] bool or [M, 2] int32 radii
    rows: tuple[int, int],
    rgb: bool = False,
) -> torch.Tensor:
    """Returns colors [M, 3] (masked-out rows 0; with ``rgb`` max(colour + 0.5, 0)) of the
    coefficients ``coeffs`` then ``rest`` (``ops/sh.py``), read through ``rows``
    (``backends/sh_rows.py``)."""
    colors = alloc((dirs.shape[0], 3), dirs.dtype)
    n_blocks = (dirs.shape[0] + BLOCK - 1) // BLOCK
    if _unrolled(degree, dirs, coeffs, rest, rows):
        parallel_for(sh3.forward_kernel, n_blocks, view(dirs), view(coeffs), view(rest),
                     _masks(masks), bool(rgb), view(colors))
        return colors
    parallel_for(forward_kernel, n_blocks, degree, view(dirs), view(coeffs), view(rest),
                 _masks(masks), rows[0], rows[1], bool(rgb), view(colors))
    return colors


def backward(
    degree: int,
    dirs: torch.Tensor,  # [M, 3]
    coeffs: torch.Tensor,  # [Nb, K0, 3]
    rest: torch.Tensor,  # [Nb, K1, 3]
    masks: torch.Tensor | None,  # [M] bool or [M, 2] int32 radii
    rows: tuple[int, int],
    v_colors: torch.Tensor,  # [M, 3]
    need_v_dirs: bool,
    rgb: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Returns v_dirs [M, 3] (or None), v_coeffs [Nb, K0, 3], v_rest [Nb, K1, 3]."""
    v_coeffs = alloc(tuple(coeffs.shape), coeffs.dtype)
    v_rest = alloc(tuple(rest.shape), rest.dtype)
    v_dirs = alloc((dirs.shape[0], 3), dirs.dtype) if need_v_dirs else None
    np_dt = view(dirs).dtype
    n_blocks = (coeffs.shape[0] + BLOCK - 1) // BLOCK
    if _unrolled(degree, dirs, coeffs, rest, rows):
        parallel_for(sh3.backward_kernel, n_blocks, view(dirs), view(coeffs), view(rest),
                     _masks(masks), bool(rgb), view(v_colors.contiguous()),
                     view(v_dirs) if v_dirs is not None else np.zeros((0, 3), np_dt),
                     view(v_coeffs), view(v_rest))
        return v_dirs, v_coeffs, v_rest
    parallel_for(
        backward_kernel,
        n_blocks,
        degree,
        view(dirs),
        view(coeffs),
        view(rest),
        _masks(masks),
        rows[0],
        rows[1],
        bool(rgb),
        view(v_colors.contiguous()),
        view(v_dirs) if v_dirs is not None else np.zeros((0, 3), np_dt),
        view(v_coeffs),
        view(v_rest),
    )
    return v_dirs, v_coeffs, v_rest
