"""CPU kernels: the forward of ``rasterize_to_pixels_eval3d`` (3DGUT's rasterizer, Gaussians
evaluated in 3D along each pixel's ray). The contract is the reference's
(``backends/torch/ut.py``): in Gaussian g's frame ``M = S⁻¹ Rᵀ`` the ray ``o + t d`` of a pixel
is ``M (o - mean) + t M d``; its largest response along the line is ``exp(power)`` with
``power = -|n × M (o - mean)|² / 2``, ``n = M d / |M d|``, computed here as
``-(g - s² / q) / 2`` with the precision ``Q = Mᵀ M``, ``e = o - mean``, ``g = eᵀ Q e``,
``s = dᵀ Q e``, ``q = dᵀ Q d`` (no square root, one division; ``Q e`` and ``g`` are per
Gaussian for every pixel of a tile that shares the ray origin, the whole image on a global
shutter); alpha = min(0.999, opacity ×
response) and the compositing is the 2D contract's (skip below 1/255, stop before T <= 1e-4,
backgrounds, masks).

The pixels' rays come in as an input, ``rays`` [I, H, W, 7] (origin, unit direction, valid as
1 or 0): the launcher (``ut.py``) computes them with the reference's own vectorised code
(``image_rays``: the lens inverted by Newton's method, the pose at the pixel's time on a
rolling shutter), which is exact by construction and costs a few passes over the pixels
against the rasterizer's one pass per pixel-Gaussian pair. So the kernels know no camera.

Work is split by tile over threads (``_common.parallel_for``); a tile's Gaussians are copied
once into contiguous float64 rows (mean, Q, opacity, the origin's terms, colour), then each
pixel walks them front to back (a scalar loop; a pair whose power is surely below the skip
bound is skipped before its exp). The pair's power is computed in float64 and rounded to the data's
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

# columns of a tile row (``gather_gaussians``): mean, the precision Q = Mᵀ M = R S⁻² Rᵀ
# (q00, q01, q02, q11, q12, q22), opacity, the skip bound on the power (R_TAU), and for the
# tile's first ray origin o (R_ORIGIN): a = Q (o - mean) and g = (o - mean) · a; colours follow
R_MEAN, R_Q, R_OP, R_TAU, R_ORIGIN, R_A, R_G = 0, 3, 9, 10, 11, 14, 17
R_COLOR = 18
# A pair whose power is below ln(ALPHA_SKIP / opacity) - SKIP_MARGIN has alpha below
# ALPHA_SKIP whatever the rounding (float32's is ~1e-7 relative): skipped without its exp.
SKIP_MARGIN = 1e-3
# columns of ``extra`` (and of the rays the launcher computes): origin, direction, valid, T
X_ORIGIN, X_DIR, X_VALID, T_FINAL = 0, 3, 6, 7
EXTRA_COLS = 8

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def gather_gaussians(means, quats, scales, colors, opacities, flatten_ids, n_cams, n_gauss,
                     start, end, o0, o1, o2, loc):
    """Copies the pairs of intersections start..end-1 into rows j = k - start of loc
    [>= n, R_COLOR + D] float64, with the terms of the ray origin (o0, o1, o2). means, quats,
    scales [B * N, 3 | 4 | 3]; colors [I * N, D], opacities [I * N]; pair p = flatten_ids[k]
    is Gaussian (p // (C N)) N + p % N."""
    for j in range(end - start):
        p = flatten_ids[start + j]
        g = (p // (n_cams * n_gauss)) * n_gauss + p % n_gauss
        r = sm.quat_to_rotmat(np.float64(quats[g, 0]), np.float64(quats[g, 1]),
                              np.float64(quats[g, 2]), np.float64(quats[g, 3]))
        inv0 = 1.0 / (np.float64(scales[g, 0]) * np.float64(scales[g, 0]))
        inv1 = 1.0 / (np.float64(scales[g, 1]) * np.float64(scales[g, 1]))
        inv2 = 1.0 / (np.float64(scales[g, 2]) * np.float64(scales[g, 2]))
        col = 0
        for a in range(3):
            loc[j, R_MEAN + a] = means[g, a]
            for b in range(a, 3):  # Q[a, b] = sum_i R[a, i] R[b, i] / s_i²
                loc[j, R_Q + col] = (r[3 * a] * r[3 * b] * inv0 + r[3 * a + 1] * r[3 * b + 1]
                                     * inv1 + r[3 * a + 2] * r[3 * b + 2] * inv2)
                col += 1
        op = np.float64(opacities[p])
        loc[j, R_OP] = op
        loc[j, R_TAU] = math.log(ALPHA_SKIP / op) - SKIP_MARGIN
        loc[j, R_ORIGIN] = o0
        loc[j, R_ORIGIN + 1] = o1
        loc[j, R_ORIGIN + 2] = o2
        a0, a1, a2, gg = origin_terms(loc, j, o0 - loc[j, R_MEAN], o1 - loc[j, R_MEAN + 1],
                                      o2 - loc[j, R_MEAN + 2])
        loc[j, R_A] = a0
        loc[j, R_A + 1] = a1
        loc[j, R_A + 2] = a2
        loc[j, R_G] = gg
        for d in range(colors.shape[1]):
            loc[j, R_COLOR + d] = colors[p, d]
    return end - start


@njit(cache=True, inline="always", error_model="numpy")
def sym_apply(loc, j, x0, x1, x2):
    """Q x of row j's precision."""
    return (loc[j, R_Q] * x0 + loc[j, R_Q + 1] * x1 + loc[j, R_Q + 2] * x2,
            loc[j, R_Q + 1] * x0 + loc[j, R_Q + 3] * x1 + loc[j, R_Q + 4] * x2,
            loc[j, R_Q + 2] * x0 + loc[j, R_Q + 4] * x1 + loc[j, R_Q + 5] * x2)


@njit(cache=True, inline="always", error_model="numpy")
def origin_terms(loc, j, e0, e1, e2):
    """(a = Q e, g = e · a) of row j for e = o - mean."""
    a0, a1, a2 = sym_apply(loc, j, e0, e1, e2)
    return a0, a1, a2, e0 * a0 + e1 * a1 + e2 * a2


@njit(cache=True, inline="always", error_model="numpy")
def pair_power(loc, j, cached, o0, o1, o2, d0, d1, d2):
    """Row j against the ray o + t d, in float64: (power, a [3], g, Qd [3], s, q, ok) with
    e = o - mean, a = Q e, g = e · a (the tile's cached ones when ``cached``), s = d · a,
    q = d · Q d. |n × M e|² with n = M d / |M d| is g - s² / q, so power = -(g - s² / q) / 2
    (at most 0; 0 where q = 0, as the reference's zero direction; ok False there and where the
    cancellation made it positive: no gradient)."""
    if cached:
        a0, a1, a2, g = loc[j, R_A], loc[j, R_A + 1], loc[j, R_A + 2], loc[j, R_G]
    else:
        a0, a1, a2, g = origin_terms(loc, j, o0 - loc[j, R_MEAN], o1 - loc[j, R_MEAN + 1],
                                     o2 - loc[j, R_MEAN + 2])
    qd0, qd1, qd2 = sym_apply(loc, j, d0, d1, d2)
    q = d0 * qd0 + d1 * qd1 + d2 * qd2
    s = d0 * a0 + d1 * a1 + d2 * a2
    power = 0.0
    ok = False
    if q > 0.0:
        power = -0.5 * (g - s * s / q)
        ok = power < 0.0
        if not ok:
            power = 0.0
    return power, (a0, a1, a2), g, (qd0, qd1, qd2), s, q, ok


@njit(cache=True, inline="always", error_model="numpy")
def is_cached(loc, o0, o1, o2):
    """Whether the ray origin is the one the tile's rows hold the terms of."""
    return o0 == loc[0, R_ORIGIN] and o1 == loc[0, R_ORIGIN + 1] and o2 == loc[0, R_ORIGIN + 2]


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
            first_ray = extra[img, ty * tile_size, tx * tile_size]
            n_k = gather_gaussians(means, quats, scales, colors, opacities, flatten_ids, n_cams,
                                   n_gauss, start, end, np.float64(first_ray[X_ORIGIN]),
                                   np.float64(first_ray[X_ORIGIN + 1]),
                                   np.float64(first_ray[X_ORIGIN + 2]), loc)
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
                cached = n_live > 0 and is_cached(loc, o0, o1, o2)
                trans = one
                for d in range(n_ch):
                    acc_c[d] = 0.0
                last = -1
                for j in range(n_live):
                    power, _, _, _, _, _, _ = pair_power(loc, j, cached, o0, o1, o2, d0, d1, d2)
                    if power < loc[j, R_TAU]:
                        continue
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
