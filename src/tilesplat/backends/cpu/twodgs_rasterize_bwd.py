"""CPU kernels: backward of ``rasterize_to_pixels_2dgs`` (surfels), deterministic.

Per tile (``_common.parallel_for``), each pixel walks its tile's list back to front from its
last contributor (``per_pixel`` scheme), starting from the final transmittance the forward
kept and recovering T before each surfel by dividing by (1 - alpha). With weights
w_i = alpha_i T_i, everything the pixel outputs is a function of the w_i and T_final, so
d loss / d alpha_k = T_k q_k - (sum_{i>k} w_i q_i + T_final (v_colors . background -
v_alphas)) / (1 - alpha_k), where q_i = d loss / d w_i: v_colors . c_i + v_normals . n_i +
v_distort * (2 (d_i S_i - A_i) + 2 (B_i - d_i R_i)) for the distortion
sum_{j<i} 2 w_i w_j (d_i - d_j), with S_i, A_i the sums of w and w d in front of i (from
1 - T_i and the forward's total of w d) and R_i, B_i those behind it (summed on the walk).
The pixel's sums run in float64.

Each intersection's gradient is summed over its tile's pixels in a fixed order into a
float64 row at its position in Gaussian order (``rasterize_bwd.group_by_gaussian``); a second
pass sums each Gaussian's rows in increasing intersection order and turns the gradient of
the three crosses ``M_v x M_w, M_w x M_u, M_u x M_v`` into the gradient of the ray transform.
No atomics: results are bit-identical for any thread count.
The autograd wiring that calls the launchers is in ``twodgs``.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP
from ..shared.typed import like
from ._common import BLOCK, alloc, parallel_for, tile_span, view
from .cull import max_tile_len
from .rasterize_bwd import group_by_gaussian, reduce_backgrounds
from .twodgs_rasterize_fwd import (
    FILTER_INV_SQUARE,
    R_A,
    R_B,
    R_COLOR,
    R_NRM,
    gather_surfels,
    outside,
    surfel_alpha,
)
from .twodgs_rasterize_fwd import surfel_pair as pair

# columns of the per-intersection gradient rows: mean, opacity, the gradients of the crosses
# a, b, c (sum of p_x v_cross, p_y v_cross, v_cross), normal, the shifted pixel (-densify),
# |pixel| (absgrad); colours follow from V_COLOR
V_MX, V_MY, V_OP, V_A, V_B, V_C, V_NRM, V_P, V_ABS = 0, 1, 2, 3, 6, 9, 12, 15, 17
V_COLOR = 19

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def pixel_backward(loc, k0, x, y, last, med, t_final, wd_total, tail, v_c, v_n, v_dist, v_med,
                   rows):
    """Adds pixel (x, y)'s gradient to rows[j] of each tile row j it composites (intersection
    k0 + j), back to front from its last intersection ``last``. med: its median's
    intersection; tail: T_final (v_colors . background - v_alphas); v_c [D], v_n [3]."""
    n_ch = v_c.shape[0]
    one = like(t_final, 1.0)
    trans = t_final
    behind = 0.0  # sum over the surfels behind of w q
    r_w = 0.0  # sum of w behind
    b_wd = 0.0  # sum of w d behind
    for j in range(last - k0, -1, -1):
        if outside(loc, j, x, y):
            continue
        ok, sigma, px, py, dx, dy, s_u, s_v, cz, pick = pair(loc, j, x, y)
        ge, ar, alpha = surfel_alpha(loc, j, sigma, one)
        if not ok or sigma < 0.0 or alpha < like(one, ALPHA_SKIP):
            continue
        t_k = trans / (one - alpha)
        w = np.float64(alpha * t_k)
        depth = np.float64(loc[j, R_COLOR + n_ch - 1])
        s_w = 1.0 - np.float64(t_k)
        a_wd = wd_total - b_wd - w * depth
        q = v_dist * (2.0 * (depth * s_w - a_wd) + 2.0 * (b_wd - depth * r_w))
        for d in range(n_ch):
            q += v_c[d] * np.float64(loc[j, R_COLOR + d])
            rows[j, V_COLOR + d] += w * v_c[d]
        for i in range(3):
            q += v_n[i] * np.float64(loc[j, R_NRM + i])
            rows[j, V_NRM + i] += w * v_n[i]
        v_depth = v_dist * 2.0 * w * (s_w - r_w)
        if k0 + j == med:
            v_depth += v_med
        rows[j, V_COLOR + n_ch - 1] += v_depth
        v_alpha = np.float64(t_k) * q - (behind + tail) / (1.0 - np.float64(alpha))
        if ar <= like(one, ALPHA_CLAMP):  # alpha = min(0.999, op G): no gradient where clamped
            rows[j, V_OP] += v_alpha * np.float64(ge)
            v_g = -0.5 * v_alpha * np.float64(ar)  # sigma = g / 2
            v_s2 = v_g * pick
            v_lp = v_g - v_s2
            v_dx = v_lp * FILTER_INV_SQUARE * 2.0 * dx
            v_dy = v_lp * FILTER_INV_SQUARE * 2.0 * dy
            v_su = v_s2 * 2.0 * s_u
            v_sv = v_s2 * 2.0 * s_v
            c64 = np.float64(cz)
            v_cr0 = v_su / c64
            v_cr1 = v_sv / c64
            v_cr2 = -(v_su * s_u + v_sv * s_v) / c64
            rows[j, V_MX] += v_dx
            rows[j, V_MY] += v_dy
            v_px = -v_dx
            v_py = -v_dy
            for i in range(3):
                v_cr = v_cr0 if i == 0 else (v_cr1 if i == 1 else v_cr2)
                rows[j, V_A + i] += px * v_cr
                rows[j, V_B + i] += py * v_cr
                rows[j, V_C + i] += v_cr
                v_px += loc[j, R_A + i] * v_cr
                v_py += loc[j, R_B + i] * v_cr
            rows[j, V_P] += v_px
            rows[j, V_P + 1] += v_py
            rows[j, V_ABS] += abs(v_px)
            rows[j, V_ABS + 1] += abs(v_py)
        behind += w * q
        r_w += w
        b_wd += w * depth
        trans = t_k


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, means2d, rays, colors, opacities, normals, densify, backgrounds,
                    masks, width, height, tile_size, offsets, flatten_ids, max_len, trans_final,
                    last_ids, median_ids, wd, v_colors, v_alphas, v_normals, v_distort, v_median,
                    pos, part, bg_part):
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
    v_n = np.empty(3, np.float64)
    for t in range(first, n_tiles, step):
        img, ty, tx, start, end = tile_span(t, th, tw, offs, n_isects)
        masked = has_mask and not masks[img, ty, tx]
        for k in range(start, end if masked else start):
            part[pos[k], :] = 0.0  # a masked-out tile gives no gradient
        n_k = 0
        if end > start and not masked:
            n_k = gather_surfels(means2d, rays, colors, opacities, normals, densify, flatten_ids,
                                 start, end, loc)
        rows[:n_k, :] = 0.0
        bg_part[t, :] = 0.0
        for y in range(ty * tile_size, min(height, (ty + 1) * tile_size)):
            for x in range(tx * tile_size, min(width, (tx + 1) * tile_size)):
                t_fin = np.float64(trans_final[img, y, x])
                bg_dot = 0.0
                for d in range(n_ch):
                    v_c[d] = v_colors[img, y, x, d]
                    bg_part[t, d] += v_c[d] * t_fin
                    if has_bg:
                        bg_dot += v_c[d] * np.float64(backgrounds[img, d])
                for i in range(3):
                    v_n[i] = v_normals[img, y, x, i]
                last = last_ids[img, y, x]
                if n_k == 0 or last < 0:
                    continue
                tail = t_fin * (bg_dot - np.float64(v_alphas[img, y, x]))
                pixel_backward(loc, start, x, y, last, median_ids[img, y, x],
                               trans_final[img, y, x], wd[img, y, x], tail, v_c, v_n,
                               np.float64(v_distort[img, y, x]), np.float64(v_median[img, y, x]),
                               rows)
        for j in range(n_k):
            part[pos[start + j], :] = rows[j, :]


@njit(cache=True, inline="always", error_model="numpy")
def cross_grad(u, v, g, out_u, out_v):
    """For c = u x v with gradient g: adds v x g to out_u and g x u to out_v ([3] each)."""
    for i in range(3):
        i1 = (i + 1) % 3
        i2 = (i + 2) % 3
        out_u[i] += v[i1] * g[i2] - v[i2] * g[i1]
        out_v[i] += g[i1] * u[i2] - g[i2] * u[i1]


@njit(nogil=True, cache=True, error_model="numpy")
def reduce_kernel(first, step, part, first_row, rays, v_means2d, v_rays, v_colors, v_opacities,
                  v_normals, v_densify, v_abs):
    """Blocks first, first + step, ... of Gaussians: sums each one's rows (contiguous, in
    increasing intersection order) and writes its gradients; v_abs [G, 2] or [0, 2]."""
    n_gauss = v_means2d.shape[0]
    n_cols = part.shape[1]
    acc = np.zeros(n_cols, np.float64)
    m = np.empty((3, 3), np.float64)
    v_m = np.empty((3, 3), np.float64)
    for blk in range(first, (n_gauss + BLOCK - 1) // BLOCK, step):
        for g in range(blk * BLOCK, min(n_gauss, (blk + 1) * BLOCK)):
            acc[:] = 0.0
            for r in range(first_row[g], first_row[g + 1]):
                for col in range(n_cols):
                    acc[col] += part[r, col]
            for r in range(3):
                for i in range(3):
                    m[r, i] = rays[g, r, i]
            v_m[:] = 0.0
            # a = M_v x M_w, b = M_w x M_u, c = M_u x M_v
            cross_grad(m[1], m[2], acc[V_A:V_A + 3], v_m[1], v_m[2])
            cross_grad(m[2], m[0], acc[V_B:V_B + 3], v_m[2], v_m[0])
            cross_grad(m[0], m[1], acc[V_C:V_C + 3], v_m[0], v_m[1])
            for r in range(3):
                for i in range(3):
                    v_rays[g, r, i] = v_m[r, i]
            v_means2d[g, 0] = acc[V_MX]
            v_means2d[g, 1] = acc[V_MY]
            v_opacities[g] = acc[V_OP]
            for i in range(3):
                v_normals[g, i] = acc[V_NRM + i]
            v_densify[g, 0] = -acc[V_P]
            v_densify[g, 1] = -acc[V_P + 1]
            for d in range(n_cols - V_COLOR):
                v_colors[g, d] = acc[V_COLOR + d]
            if v_abs.shape[0] > 0:
                v_abs[g, 0] = acc[V_ABS]
                v_abs[g, 1] = acc[V_ABS + 1]


# ---------------------------------------------------------------------------------------------
# launchers


def backward(
    inputs: tuple[torch.Tensor | None, ...],  # forward's: means2d .. masks (see forward)
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int
    flatten_ids: torch.Tensor,  # [n] int
    extra: tuple[torch.Tensor, ...],  # forward's: trans, last_ids, median_ids, wd [I, H, W]
    v_outs: tuple[torch.Tensor, ...],  # [I, H, W, D | 1 | 3 | 1 | 1]
    absgrad: bool,
) -> tuple[torch.Tensor | None, ...]:
    """Returns v_means2d [G, 2], v_ray_transforms [G, 3, 3], v_colors [G, D], v_opacities
    [G], v_normals [G, 3], v_densify [G, 2], v_backgrounds [I, D] or None, and absgrad
    [G, 2] (the sum over pixels of |d loss / d densify|) or None."""
    means2d, rays, colors, opacities, normals, densify, backgrounds, masks = inputs
    n_img, th, tw = isect_offsets.shape
    n_gauss, n_ch = colors.shape
    n = flatten_ids.shape[0]
    dt = means2d.dtype
    np_dt = view(means2d).dtype
    first, pos = group_by_gaussian(view(flatten_ids), n_gauss)
    part = np.empty((n, V_COLOR + n_ch), np.float64)
    bg_part = np.empty((n_img * th * tw, n_ch), np.float64)
    bg = view(backgrounds) if backgrounds is not None else np.zeros((0, n_ch), np_dt)
    mk = view(masks) if masks is not None else np.zeros((0, 0, 0), np.bool_)
    shape = (n_img, height, width)
    v_c, v_a, v_n, v_d, v_m = (v.contiguous() for v in v_outs)
    parallel_for(
        backward_kernel, n_img * th * tw, view(means2d), view(rays), view(colors),
        view(opacities), view(normals), view(densify), bg, mk, width, height, tile_size,
        view(isect_offsets), view(flatten_ids), max_tile_len(isect_offsets, n),
        *(view(e) for e in extra), view(v_c), view(v_a).reshape(shape), view(v_n),
        view(v_d).reshape(shape), view(v_m).reshape(shape), pos, part, bg_part)
    grads = (alloc((n_gauss, 2), dt), alloc((n_gauss, 3, 3), dt), alloc((n_gauss, n_ch), dt),
             alloc((n_gauss,), dt), alloc((n_gauss, 3), dt), alloc((n_gauss, 2), dt))
    v_abs = alloc((n_gauss, 2), dt) if absgrad else None
    parallel_for(
        reduce_kernel, (n_gauss + BLOCK - 1) // BLOCK, part, first, view(rays),
        *(view(g) for g in grads),
        view(v_abs) if v_abs is not None else np.zeros((0, 2), np_dt))
    v_backgrounds = None
    if backgrounds is not None:
        v_backgrounds = alloc((n_img, n_ch), dt)
        reduce_backgrounds(bg_part, n_img, view(v_backgrounds))
    return (*grads, v_backgrounds, v_abs)
