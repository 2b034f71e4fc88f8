"""CPU kernels: spherical harmonics of degree 3 in the trainer's layout (``sh0`` [N, 1, 3],
``shN`` [N, 15, 3], one evaluation row per coefficient row), unrolled.

``sh.py``'s kernels take any degree and layout: they keep the basis in a small array and loop
over the coefficients, and per row that costs more than the arithmetic (a step at 1 M
Gaussians spends ~40 ms of CPU in the forward and ~70 in the backward). Here the degree and
the layout are constants: the basis stays in registers, each colour is one unrolled chain of
sixteen products, and the backward's products and dot products are written out. Every value
is computed by the same operations in the same order as ``sh.py``'s (``tests/test_cpu_sh3.py``
compares the bits), so which kernel runs changes nothing.
"""

from __future__ import annotations

from numba import njit

from ..shared.typed import like
from ._common import BLOCK, sm
from .sh_common import rgb_grad, store_color, unit, visible

N_REST = 15  # shN's coefficients of degree 1-3


@njit(inline="always", error_model="numpy")
def chain(b, zero, c0, rest, m, ch):
    """sum_k b[k] coefficient k (channel ch) of row m, k = 0..15 in order: c0 [N, 1, 3] then
    rest [N, 15, 3] (``sh.sh_color``'s order, from zero)."""
    r = zero
    r += b[0] * c0[m, 0, ch]
    r += b[1] * rest[m, 0, ch]
    r += b[2] * rest[m, 1, ch]
    r += b[3] * rest[m, 2, ch]
    r += b[4] * rest[m, 3, ch]
    r += b[5] * rest[m, 4, ch]
    r += b[6] * rest[m, 5, ch]
    r += b[7] * rest[m, 6, ch]
    r += b[8] * rest[m, 7, ch]
    r += b[9] * rest[m, 8, ch]
    r += b[10] * rest[m, 9, ch]
    r += b[11] * rest[m, 10, ch]
    r += b[12] * rest[m, 11, ch]
    r += b[13] * rest[m, 12, ch]
    r += b[14] * rest[m, 13, ch]
    r += b[15] * rest[m, 14, ch]
    return r


@njit(inline="always", error_model="numpy")
def coeff_dot(c, m, j, vr, vg, vb):
    """c[m, j] . (vr, vg, vb), left to right (``sh.backward_kernel``'s gk)."""
    return c[m, j, 0] * vr + c[m, j, 1] * vg + c[m, j, 2] * vb


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, dirs, coeffs, rest, masks, rgb, colors):
    """colors [M, 3] of coefficients coeffs [M, 1, 3] then rest [M, 15, 3] at degree 3, of
    the rows ``sh.visible`` in masks (0 elsewhere); with ``rgb`` max(colour + 0.5, 0);
    blocks first, first + step, ... of rows."""
    n = dirs.shape[0]
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for m in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            zero = like(dirs[m, 0], 0.0)
            r = zero
            g = zero
            b = zero
            if visible(masks, m):
                x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
                bas = sm.sh_basis(3, x, y, z)
                r = chain(bas, zero, coeffs, rest, m, 0)
                g = chain(bas, zero, coeffs, rest, m, 1)
                b = chain(bas, zero, coeffs, rest, m, 2)
            store_color(colors, m, r, g, b, rgb, zero)


@njit(inline="always", error_model="numpy")
def put(v, m, j, bk, vr, vg, vb):
    """v[m, j] = bk * (vr, vg, vb)."""
    v[m, j, 0] = bk * vr
    v[m, j, 1] = bk * vg
    v[m, j, 2] = bk * vb


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, dirs, coeffs, rest, masks, rgb, v_colors, v_dirs, v_coeffs,
                    v_rest):
    """v_coeffs [M, 1, 3], v_rest [M, 15, 3]; v_dirs [M, 3] or [0, 3]; blocks first,
    first + step, ... of rows. A row not visible gets the zero products (0 * v_colors, signs
    and all) and a zero v_dirs; with ``rgb`` the colour is made again to pass v_colors
    through max(colour + 0.5, 0)."""
    n = dirs.shape[0]
    want_dirs = v_dirs.shape[0] > 0
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for m in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            zero = like(dirs[m, 0], 0.0)
            vr, vg, vb = v_colors[m, 0], v_colors[m, 1], v_colors[m, 2]
            if not visible(masks, m):
                put(v_coeffs, m, 0, zero, vr, vg, vb)
                for j in range(N_REST):
                    put(v_rest, m, j, zero, vr, vg, vb)
                if want_dirs:
                    v_dirs[m, 0] = zero
                    v_dirs[m, 1] = zero
                    v_dirs[m, 2] = zero
                continue
            x, y, z = unit(dirs[m, 0], dirs[m, 1], dirs[m, 2])
            bas = sm.sh_basis(3, x, y, z)
            if rgb:
                vr = rgb_grad(chain(bas, zero, coeffs, rest, m, 0), vr, zero)
                vg = rgb_grad(chain(bas, zero, coeffs, rest, m, 1), vg, zero)
                vb = rgb_grad(chain(bas, zero, coeffs, rest, m, 2), vb, zero)
            put(v_coeffs, m, 0, bas[0], vr, vg, vb)
            put(v_rest, m, 0, bas[1], vr, vg, vb)
            put(v_rest, m, 1, bas[2], vr, vg, vb)
            put(v_rest, m, 2, bas[3], vr, vg, vb)
            put(v_rest, m, 3, bas[4], vr, vg, vb)
            put(v_rest, m, 4, bas[5], vr, vg, vb)
            put(v_rest, m, 5, bas[6], vr, vg, vb)
            put(v_rest, m, 6, bas[7], vr, vg, vb)
            put(v_rest, m, 7, bas[8], vr, vg, vb)
            put(v_rest, m, 8, bas[9], vr, vg, vb)
            put(v_rest, m, 9, bas[10], vr, vg, vb)
            put(v_rest, m, 10, bas[11], vr, vg, vb)
            put(v_rest, m, 11, bas[12], vr, vg, vb)
            put(v_rest, m, 12, bas[13], vr, vg, vb)
            put(v_rest, m, 13, bas[14], vr, vg, vb)
            put(v_rest, m, 14, bas[15], vr, vg, vb)
            if not want_dirs:
                continue
            # the dot products of the coefficients with v, as sh.py's gk (padded to 25)
            gk = (coeff_dot(coeffs, m, 0, vr, vg, vb), coeff_dot(rest, m, 0, vr, vg, vb),
                  coeff_dot(rest, m, 1, vr, vg, vb), coeff_dot(rest, m, 2, vr, vg, vb),
                  coeff_dot(rest, m, 3, vr, vg, vb), coeff_dot(rest, m, 4, vr, vg, vb),
                  coeff_dot(rest, m, 5, vr, vg, vb), coeff_dot(rest, m, 6, vr, vg, vb),
                  coeff_dot(rest, m, 7, vr, vg, vb), coeff_dot(rest, m, 8, vr, vg, vb),
                  coeff_dot(rest, m, 9, vr, vg, vb), coeff_dot(rest, m, 10, vr, vg, vb),
                  coeff_dot(rest, m, 11, vr, vg, vb), coeff_dot(rest, m, 12, vr, vg, vb),
                  coeff_dot(rest, m, 13, vr, vg, vb), coeff_dot(rest, m, 14, vr, vg, vb),
                  zero, zero, zero, zero, zero, zero, zero, zero, zero)
            gx, gy, gz = sm.sh_basis_vjp(3, x, y, z, gk)
            vx, vy, vz = sm.normalize3_vjp(dirs[m, 0], dirs[m, 1], dirs[m, 2], gx, gy, gz)
            v_dirs[m, 0] = vx
            v_dirs[m, 1] = vy
            v_dirs[m, 2] = vz
