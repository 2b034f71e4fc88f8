"""CPU kernels: the backward of ``rasterize_to_pixels_eval3d`` (3DGUT's rasterizer),
deterministic.

Per tile (``_common.parallel_for``), each pixel walks its tile's list back to front from its
last contributor (the ``per_pixel`` scheme), from the final transmittance the forward kept,
recovering T before each Gaussian by dividing by (1 - alpha):
d loss / d alpha_k = T_k q_k - (sum_{i>k} w_i q_i + T_final (v_colors . background -
v_alphas)) / (1 - alpha_k), with w_i = alpha_i T_i and q_i = v_colors . c_i. Through
alpha = opacity exp(power) (no gradient where clamped at 0.999) and the forward's
power = -(g - s² / q) / 2 (g = eᵀQe, s = dᵀQe, q = dᵀQd, e = o - mean, Q = R S⁻² Rᵀ), each
pair gives the gradient of the Gaussian's mean and of its precision Q; the pixel's sums run in
float64.

Each intersection's gradient (mean, Q, opacity, colour) is summed over its tile's pixels in a
fixed order into a float64 row at its position in pair order (``rasterize_bwd.
group_by_gaussian``); a second pass sums each pair's rows in increasing intersection order
and writes the pairs' colour and opacity gradients; the launcher then sums each Gaussian's
pairs over the cameras in camera order and a third pass turns the gradient of Q into those of
the quaternion and the scales. No atomics: results are bit-identical for any thread count.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP
from ..shared.typed import like
from ._common import BLOCK, sm, tile_span
from .ut_rasterize_fwd import (
    R_COLOR,
    R_MEAN,
    R_TAU,
    T_FINAL,
    X_DIR,
    X_ORIGIN,
    X_VALID,
    gather_gaussians,
    is_cached,
    pair_alpha,
    pair_power,
)

# columns of the per-intersection gradient rows: mean, Q's symmetric gradient (00, 01, 02,
# 11, 12, 22), opacity; colours follow
V_MEAN, V_Q, V_OP = 0, 3, 9
V_COLOR = 10
N_GEOM = 9  # the columns the Gaussians' reduction over cameras sums (mean and Q)

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def pixel_backward(loc, k0, last, o0, o1, o2, d0, d1, d2, t_final, tail, v_c, rows):
    """Adds the gradient of the pixel with ray o + t d to rows[j] of each tile row j it
    composites (intersection k0 + j), back to front from its last intersection ``last``;
    tail: T_final (v_colors . background - v_alphas); v_c [D] float64."""
    n_ch = v_c.shape[0]
    one = like(t_final, 1.0)
    trans = t_final
    behind = 0.0  # sum over the Gaussians behind of w q
    cached = is_cached(loc, o0, o1, o2)
    for j in range(last - k0, -1, -1):
        power, a, g, qd, s, q, ok = pair_power(loc, j, cached, o0, o1, o2, d0, d1, d2)
        if power < loc[j, R_TAU]:
            continue
        ge, ar, alpha = pair_alpha(loc, j, power, one)
        if alpha < like(one, ALPHA_SKIP):
            continue
        t_k = trans / (one - alpha)
        w = np.float64(alpha * t_k)
        vq = 0.0
        for d in range(n_ch):
            vq += v_c[d] * loc[j, R_COLOR + d]
            rows[j, V_COLOR + d] += w * v_c[d]
        v_alpha = np.float64(t_k) * vq - (behind + tail) / (1.0 - np.float64(alpha))
        if ar <= like(one, ALPHA_CLAMP):  # alpha = min(0.999, op G): no gradient where clamped
            rows[j, V_OP] += v_alpha * np.float64(ge)
            if ok:
                # power = -g / 2 + s² / (2 q): its gradients in g, s, q
                v_power = v_alpha * np.float64(ar)
                v_g = -0.5 * v_power
                v_s = v_power * s / q
                v_q = -0.5 * v_power * (s / q) * (s / q)
                e = (o0 - loc[j, R_MEAN], o1 - loc[j, R_MEAN + 1], o2 - loc[j, R_MEAN + 2])
                dd = (d0, d1, d2)
                col = V_Q
                for r in range(3):
                    for c in range(r, 3):  # g = eᵀQe, s = dᵀQe, q = dᵀQd, symmetrised
                        rows[j, col] += (v_g * e[r] * e[c]
                                         + 0.5 * v_s * (dd[r] * e[c] + e[r] * dd[c])
                                         + v_q * dd[r] * dd[c])
                        col += 1
                    # d/d mean = -d/d e = -(2 v_g Q e + v_s Q d)
                    rows[j, V_MEAN + r] -= 2.0 * v_g * a[r] + v_s * qd[r]
        behind += w * vq
        trans = t_k


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, means, quats, scales, colors, opacities, backgrounds, masks,
                    n_cams, n_gauss, width, height, tile_size, offsets, flatten_ids, max_len,
                    extra, last_ids, v_colors, v_alphas, pos, part, bg_part):
    """Tiles first, first + step, ...; fills part [n, V_COLOR + D] float64, the gradient rows
    of the intersections (intersection k at row pos[k]), and bg_part [n_tiles, D] float64 (the
    tile's sum of v_colors * T_final)."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_ch = colors.shape[1]
    n_isects = flatten_ids.shape[0]
    has_bg = backgrounds.shape[0] > 0
    has_mask = masks.shape[0] > 0
    offs = offsets.reshape(n_tiles)
    loc = np.empty((max_len, R_COLOR + n_ch), np.float64)
    rows = np.empty((max_len, part.shape[1]), np.float64)
    v_c = np.empty(n_ch, np.float64)
    n_cols = part.shape[1]
    for t in range(first, n_tiles, step):
        img, ty, tx, start, end = tile_span(t, th, tw, offs, n_isects)
        masked = has_mask and not masks[img, ty, tx]
        for k in range(start, end if masked else start):
            for col in range(n_cols):
                part[pos[k], col] = 0.0  # a masked-out tile gives no gradient
        n_k = 0
        if end > start and not masked:
            first_ray = extra[img, ty * tile_size, tx * tile_size]
            n_k = gather_gaussians(means, quats, scales, colors, opacities, flatten_ids, n_cams,
                                   n_gauss, start, end, np.float64(first_ray[X_ORIGIN]),
                                   np.float64(first_ray[X_ORIGIN + 1]),
                                   np.float64(first_ray[X_ORIGIN + 2]), loc)
        for j in range(n_k):
            for col in range(n_cols):
                rows[j, col] = 0.0
        for d in range(n_ch):
            bg_part[t, d] = 0.0
        for y in range(ty * tile_size, min(height, (ty + 1) * tile_size)):
            for x in range(tx * tile_size, min(width, (tx + 1) * tile_size)):
                ray = extra[img, y, x]
                t_fin = np.float64(ray[T_FINAL])
                bg_dot = 0.0
                for d in range(n_ch):
                    v_c[d] = v_colors[img, y, x, d]
                    bg_part[t, d] += v_c[d] * t_fin
                    if has_bg:
                        bg_dot += v_c[d] * np.float64(backgrounds[img, d])
                last = last_ids[img, y, x]
                if n_k == 0 or last < 0 or ray[X_VALID] == 0:
                    continue
                tail = t_fin * (bg_dot - np.float64(v_alphas[img, y, x]))
                pixel_backward(loc, start, last, np.float64(ray[X_ORIGIN]),
                               np.float64(ray[X_ORIGIN + 1]), np.float64(ray[X_ORIGIN + 2]),
                               np.float64(ray[X_DIR]), np.float64(ray[X_DIR + 1]),
                               np.float64(ray[X_DIR + 2]), ray[T_FINAL], tail, v_c, rows)
        for j in range(n_k):
            for col in range(n_cols):  # element by element: a row copy compiles seconds more
                part[pos[start + j], col] = rows[j, col]


@njit(nogil=True, cache=True, error_model="numpy")
def reduce_pairs_kernel(first, step, part, first_row, geom, v_colors, v_opacities):
    """Blocks first, first + step, ... of pairs: sums each one's rows (contiguous, in
    increasing intersection order) into geom [I * N, N_GEOM] float64 (mean and M), v_colors
    [I * N, D] and v_opacities [I * N]."""
    n_pairs = v_opacities.shape[0]
    n_cols = part.shape[1]
    acc = np.zeros(n_cols, np.float64)
    for blk in range(first, (n_pairs + BLOCK - 1) // BLOCK, step):
        for p in range(blk * BLOCK, min(n_pairs, (blk + 1) * BLOCK)):
            for col in range(n_cols):
                acc[col] = 0.0
            for r in range(first_row[p], first_row[p + 1]):
                for col in range(n_cols):
                    acc[col] += part[r, col]
            for col in range(N_GEOM):
                geom[p, col] = acc[col]
            v_opacities[p] = acc[V_OP]
            for d in range(n_cols - V_COLOR):
                v_colors[p, d] = acc[V_COLOR + d]


@njit(nogil=True, cache=True, error_model="numpy")
def gaussians_kernel(first, step, geom, quats, scales, v_means, v_quats, v_scales):
    """Blocks first, first + step, ... of the B * N Gaussians: geom [B * N, N_GEOM] (the
    gradients of mean and of the precision Q = R D Rᵀ, D = S⁻², summed over the cameras) →
    v_means, v_quats, v_scales. With G the symmetric gradient of Q: v_R = 2 G R D,
    v_D_k = (Rᵀ G R)_kk, v_s_k = -2 v_D_k / s_k³; R's gradient goes to the normalised
    quaternion and through the normalisation."""
    n = quats.shape[0]
    v_r = np.empty(9, np.float64)
    gs = np.empty(9, np.float64)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for g in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            w, x, y, z = (np.float64(quats[g, 0]), np.float64(quats[g, 1]),
                          np.float64(quats[g, 2]), np.float64(quats[g, 3]))
            r = sm.quat_to_rotmat(w, x, y, z)
            col = V_Q
            for a in range(3):
                for b in range(a, 3):
                    gs[3 * a + b] = geom[g, col]
                    gs[3 * b + a] = geom[g, col]
                    col += 1
            for k in range(3):
                s = np.float64(scales[g, k])
                inv_d = 1.0 / (s * s)
                v_d = 0.0
                for a in range(3):
                    gr = gs[3 * a] * r[k] + gs[3 * a + 1] * r[3 + k] + gs[3 * a + 2] * r[6 + k]
                    v_r[3 * a + k] = 2.0 * gr * inv_d  # (G R)[a, k]
                    v_d += r[3 * a + k] * gr
                v_scales[g, k] = -2.0 * v_d / (s * s * s)
                v_means[g, k] = geom[g, V_MEAN + k]
            inv = 1.0 / max(math.sqrt(w * w + x * x + y * y + z * z), 1e-12)
            gw, gx, gy, gz = sm.rotmat_vjp(w * inv, x * inv, y * inv, z * inv, v_r[0], v_r[1],
                                           v_r[2], v_r[3], v_r[4], v_r[5], v_r[6], v_r[7],
                                           v_r[8])
            qw, qx, qy, qz = sm.normalize4_vjp(w, x, y, z, gw, gx, gy, gz)
            v_quats[g, 0] = qw
            v_quats[g, 1] = qx
            v_quats[g, 2] = qy
            v_quats[g, 3] = qz
