"""CPU kernels: the backward of ``rasterize_to_pixels_eval3d`` (3DGUT's rasterizer),
deterministic.

Per tile (``_common.parallel_for``), each pixel walks its tile's list back to front from its
last contributor (the ``per_pixel`` scheme), from the final transmittance the forward kept,
recovering T before each Gaussian by dividing by (1 - alpha):
d loss / d alpha_k = T_k q_k - (sum_{i>k} w_i q_i + T_final (v_colors . background -
v_alphas)) / (1 - alpha_k), with w_i = alpha_i T_i and q_i = v_colors . c_i. Through
alpha = opacity exp(power) (no gradient where clamped at 0.999) and power = -|c|² / 2,
c = n × gro, n = grd / |grd|, gro = M (o - mean), grd = M d, each pair gives the gradient of
the Gaussian's mean and of its M = S⁻¹ Rᵀ; the pixel's sums run in float64.

Each intersection's gradient (mean, M, opacity, colour) is summed over its tile's pixels in a
fixed order into a float64 row at its position in pair order (``rasterize_bwd.
group_by_gaussian``); a second pass sums each pair's rows in increasing intersection order
and writes the pairs' colour and opacity gradients; the launcher then sums each Gaussian's
pairs over the cameras in camera order and a third pass turns the gradient of M into those of
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
    R_M,
    R_MEAN,
    T_FINAL,
    X_DIR,
    X_ORIGIN,
    X_VALID,
    gather_gaussians,
    pair_alpha,
    pair_power,
)

# columns of the per-intersection gradient rows: mean, M (row-major), opacity; colours follow
V_MEAN, V_M, V_OP = 0, 3, 12
V_COLOR = 13
N_GEOM = 12  # the columns the Gaussians' reduction over cameras sums (mean and M)

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
    for j in range(last - k0, -1, -1):
        power, gro, grd, nrm, c, length = pair_power(loc, j, o0, o1, o2, d0, d1, d2)
        ge, ar, alpha = pair_alpha(loc, j, power, one)
        if alpha < like(one, ALPHA_SKIP):
            continue
        t_k = trans / (one - alpha)
        w = np.float64(alpha * t_k)
        q = 0.0
        for d in range(n_ch):
            q += v_c[d] * loc[j, R_COLOR + d]
            rows[j, V_COLOR + d] += w * v_c[d]
        v_alpha = np.float64(t_k) * q - (behind + tail) / (1.0 - np.float64(alpha))
        if ar <= like(one, ALPHA_CLAMP):  # alpha = min(0.999, op G): no gradient where clamped
            rows[j, V_OP] += v_alpha * np.float64(ge)
            v_power = v_alpha * np.float64(ar)
            # power = -|c|² / 2, c = n × gro
            vc0, vc1, vc2 = -v_power * c[0], -v_power * c[1], -v_power * c[2]
            vn0 = gro[1] * vc2 - gro[2] * vc1  # gro × v_c
            vn1 = gro[2] * vc0 - gro[0] * vc2
            vn2 = gro[0] * vc1 - gro[1] * vc0
            vg0 = vc1 * nrm[2] - vc2 * nrm[1]  # v_c × n
            vg1 = vc2 * nrm[0] - vc0 * nrm[2]
            vg2 = vc0 * nrm[1] - vc1 * nrm[0]
            if length > 0.0:  # n = grd / |grd|
                dot = nrm[0] * vn0 + nrm[1] * vn1 + nrm[2] * vn2
                vr0 = (vn0 - nrm[0] * dot) / length
                vr1 = (vn1 - nrm[1] * dot) / length
                vr2 = (vn2 - nrm[2] * dot) / length
            else:
                vr0, vr1, vr2 = vn0, vn1, vn2
            e0 = o0 - loc[j, R_MEAN]
            e1 = o1 - loc[j, R_MEAN + 1]
            e2 = o2 - loc[j, R_MEAN + 2]
            vg = (vg0, vg1, vg2)
            vr = (vr0, vr1, vr2)
            for i in range(3):
                b = V_M + 3 * i
                rows[j, b] += vg[i] * e0 + vr[i] * d0
                rows[j, b + 1] += vg[i] * e1 + vr[i] * d1
                rows[j, b + 2] += vg[i] * e2 + vr[i] * d2
            for k in range(3):  # gro = M (o - mean): v_mean = -Mᵀ v_gro
                rows[j, V_MEAN + k] -= (loc[j, R_M + k] * vg0 + loc[j, R_M + 3 + k] * vg1
                                        + loc[j, R_M + 6 + k] * vg2)
        behind += w * q
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
            n_k = gather_gaussians(means, quats, scales, colors, opacities, flatten_ids, n_cams,
                                   n_gauss, start, end, loc)
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
    gradients of mean and M summed over the cameras) → v_means, v_quats, v_scales. With
    M[i, k] = R[k, i] / s_i: v_R[k, i] = v_M[i, k] / s_i, v_s_i = -sum_k v_M[i, k] M[i, k] / s_i,
    then R's gradient goes to the normalised quaternion and through the normalisation."""
    n = quats.shape[0]
    v_r = np.empty(9, np.float64)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for g in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            w, x, y, z = (np.float64(quats[g, 0]), np.float64(quats[g, 1]),
                          np.float64(quats[g, 2]), np.float64(quats[g, 3]))
            r = sm.quat_to_rotmat(w, x, y, z)
            for i in range(3):
                s = np.float64(scales[g, i])
                acc = 0.0
                for k in range(3):
                    vm = geom[g, V_M + 3 * i + k]
                    v_r[3 * k + i] = vm / s
                    acc += vm * r[3 * k + i] / s
                v_scales[g, i] = -acc / s
                v_means[g, i] = geom[g, V_MEAN + i]
            inv = 1.0 / max(math.sqrt(w * w + x * x + y * y + z * z), 1e-12)
            gw, gx, gy, gz = sm.rotmat_vjp(w * inv, x * inv, y * inv, z * inv, v_r[0], v_r[1],
                                           v_r[2], v_r[3], v_r[4], v_r[5], v_r[6], v_r[7],
                                           v_r[8])
            qw, qx, qy, qz = sm.normalize4_vjp(w, x, y, z, gw, gx, gy, gz)
            v_quats[g, 0] = qw
            v_quats[g, 1] = qx
            v_quats[g, 2] = qy
            v_quats[g, 3] = qz
