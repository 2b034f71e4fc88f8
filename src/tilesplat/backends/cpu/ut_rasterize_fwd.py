"""CPU kernels: the forward of ``rasterize_to_pixels_eval3d`` (3DGUT's rasterizer, Gaussians
evaluated in 3D along each pixel's ray). The contract is the reference's
(``backends/torch/ut.py``): in Gaussian g's frame ``M = S⁻¹ Rᵀ`` the ray ``o + t d`` of a pixel
is ``M (o - mean) + t M d``; its largest response along the line is ``exp(power)`` with
``power = -|n × M (o - mean)|² / 2``, ``n = M d / |M d|``; alpha = min(0.999, opacity ×
response) and the compositing is the 2D contract's (skip below 1/255, stop before T <= 1e-4,
backgrounds, masks).

The pixels' rays come in as an input, ``rays`` [I, H, W, 7] (origin, unit direction, valid as
1 or 0): the launcher (``ut.py``) computes them with the reference's own vectorised code
(``image_rays``: the lens inverted by Newton's method, the pose at the pixel's time on a
rolling shutter), which is exact by construction and costs a few passes over the pixels
against the rasterizer's one pass per pixel-Gaussian pair. So the kernels know no camera.

Work is split by tile over threads (``_common.parallel_for``); a tile's Gaussians are copied
once into contiguous float64 rows (mean, M, opacity, colour), then each pixel walks them front
to back (a scalar loop). The pair's power is computed in float64 and rounded to the data's
type; alpha, the skip and stop decisions and T are computed in the data's type, as the
reference computes them. Colour sums run in float64, each result rounded once.

For the backward the forward keeps ``extra`` [I, H, W, 8]: the rays and each pixel's final
transmittance (column T_FINAL).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, TRANSMITTANCE_STOP
from ..shared.typed import like
from ._common import sm, tile_span

# columns of a tile row (``gather_gaussians``): mean, M = S⁻¹ Rᵀ row-major, opacity, the
# Gaussian's row in [B * N] (as a float, exact below 2^53); colours follow from R_COLOR
R_MEAN, R_M, R_OP, R_ROW = 0, 3, 12, 13
R_COLOR = 14
# columns of ``extra`` (and of the rays the launcher computes): origin, direction, valid, T
X_ORIGIN, X_DIR, X_VALID, T_FINAL = 0, 3, 6, 7
EXTRA_COLS = 8

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def gather_gaussians(means, quats, scales, colors, opacities, flatten_ids, n_cams, n_gauss,
                     start, end, loc):
    """Copies the pairs of intersections start..end-1 into rows j = k - start of loc
    [>= n, R_COLOR + D] float64. means, quats, scales [B * N, 3 | 4 | 3]; colors [I * N, D],
    opacities [I * N]; pair p = flatten_ids[k] is Gaussian (p // (C N)) N + p % N."""
    for j in range(end - start):
        p = flatten_ids[start + j]
        g = (p // (n_cams * n_gauss)) * n_gauss + p % n_gauss
        r = sm.quat_to_rotmat(np.float64(quats[g, 0]), np.float64(quats[g, 1]),
                              np.float64(quats[g, 2]), np.float64(quats[g, 3]))
        for i in range(3):
            loc[j, R_MEAN + i] = means[g, i]
            inv_s = 1.0 / np.float64(scales[g, i])
            for k in range(3):
                loc[j, R_M + 3 * i + k] = r[3 * k + i] * inv_s  # M[i, k] = R[k, i] / s_i
        loc[j, R_OP] = opacities[p]
        loc[j, R_ROW] = g
        for d in range(colors.shape[1]):
            loc[j, R_COLOR + d] = colors[p, d]
    return end - start


@njit(cache=True, inline="always", error_model="numpy")
def pair_power(loc, j, o0, o1, o2, d0, d1, d2):
    """Row j against the ray o + t d, in float64: (power, gro [3], grd [3], n [3], c [3], L)
    with gro = M (o - mean), grd = M d, L = |grd|, n = grd / L (grd where L = 0, as gsplat's
    safe_normalize), c = n × gro, power = -|c|² / 2."""
    e0 = o0 - loc[j, R_MEAN]
    e1 = o1 - loc[j, R_MEAN + 1]
    e2 = o2 - loc[j, R_MEAN + 2]
    g0 = loc[j, R_M] * e0 + loc[j, R_M + 1] * e1 + loc[j, R_M + 2] * e2
    g1 = loc[j, R_M + 3] * e0 + loc[j, R_M + 4] * e1 + loc[j, R_M + 5] * e2
    g2 = loc[j, R_M + 6] * e0 + loc[j, R_M + 7] * e1 + loc[j, R_M + 8] * e2
    r0 = loc[j, R_M] * d0 + loc[j, R_M + 1] * d1 + loc[j, R_M + 2] * d2
    r1 = loc[j, R_M + 3] * d0 + loc[j, R_M + 4] * d1 + loc[j, R_M + 5] * d2
    r2 = loc[j, R_M + 6] * d0 + loc[j, R_M + 7] * d1 + loc[j, R_M + 8] * d2
    length2 = r0 * r0 + r1 * r1 + r2 * r2
    length = math.sqrt(length2)
    if length2 > 0.0:
        n0, n1, n2 = r0 / length, r1 / length, r2 / length
    else:
        n0, n1, n2 = r0, r1, r2
    c0 = n1 * g2 - n2 * g1
    c1 = n2 * g0 - n0 * g2
    c2 = n0 * g1 - n1 * g0
    power = -0.5 * (c0 * c0 + c1 * c1 + c2 * c2)
    return power, (g0, g1, g2), (r0, r1, r2), (n0, n1, n2), (c0, c1, c2), length


@njit(cache=True, inline="always", error_model="numpy")
def pair_alpha(loc, j, power, one):
    """(G = exp(power), opacity G, alpha) of row j in the data's type (that of ``one``): the
    power is rounded to it, so alpha and the decisions on it are the reference's."""
    ge = math.exp(like(one, power))
    ar = like(one, loc[j, R_OP]) * ge
    return ge, ar, min(like(one, ALPHA_CLAMP), ar)


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, means, quats, scales, colors, opacities, backgrounds, masks,
                   n_cams, n_gauss, width, height, tile_size, offsets, flatten_ids, max_len,
                   extra, out_colors, out_alphas, out_last):
    """Tiles first, first + step, ... . backgrounds [I, D] or [0, D]; masks [I, TH, TW] or
    [0, 0, 0]; extra [I, H, W, EXTRA_COLS] (the rays in, T_FINAL out); outputs [I, H, W, D],
    [I, H, W], [I, H, W] int32."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_ch = colors.shape[1]
    n_isects = flatten_ids.shape[0]
    has_bg = backgrounds.shape[0] > 0
    has_mask = masks.shape[0] > 0
    offs = offsets.reshape(n_tiles)
    loc = np.empty((max_len, R_COLOR + n_ch), np.float64)
    acc_c = np.empty(n_ch, np.float64)
    one = np.ones(1, colors.dtype)[0]
    for t in range(first, n_tiles, step):
        img, ty, tx, start, end = tile_span(t, th, tw, offs, n_isects)
        if has_mask and not masks[img, ty, tx]:
            end = start
        n_k = 0
        if end > start:
            n_k = gather_gaussians(means, quats, scales, colors, opacities, flatten_ids, n_cams,
                                   n_gauss, start, end, loc)
        for y in range(ty * tile_size, min(height, (ty + 1) * tile_size)):
            for x in range(tx * tile_size, min(width, (tx + 1) * tile_size)):
                ray = extra[img, y, x]
                o0 = np.float64(ray[X_ORIGIN])
                o1 = np.float64(ray[X_ORIGIN + 1])
                o2 = np.float64(ray[X_ORIGIN + 2])
                d0 = np.float64(ray[X_DIR])
                d1 = np.float64(ray[X_DIR + 1])
                d2 = np.float64(ray[X_DIR + 2])
                n_live = n_k if ray[X_VALID] != 0 else 0
                trans = one
                for d in range(n_ch):
                    acc_c[d] = 0.0
                last = -1
                for j in range(n_live):
                    power, _, _, _, _, _ = pair_power(loc, j, o0, o1, o2, d0, d1, d2)
                    _, _, alpha = pair_alpha(loc, j, power, one)
                    if alpha < like(one, ALPHA_SKIP):
                        continue
                    t_next = trans * (like(trans, 1.0) - alpha)
                    if t_next <= like(trans, TRANSMITTANCE_STOP):
                        break
                    w = np.float64(alpha * trans)
                    for d in range(n_ch):
                        acc_c[d] += w * loc[j, R_COLOR + d]
                    last = start + j
                    trans = t_next
                for d in range(n_ch):
                    v = acc_c[d]
                    if has_bg:
                        v += np.float64(trans) * np.float64(backgrounds[img, d])
                    out_colors[img, y, x, d] = v
                out_alphas[img, y, x] = like(trans, 1.0) - trans
                out_last[img, y, x] = last
                ray[T_FINAL] = trans
