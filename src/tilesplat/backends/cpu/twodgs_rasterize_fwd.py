"""CPU kernels: front-to-back compositing of surfels (2DGS) per tile, the forward of
``rasterize_to_pixels_2dgs``. The contract is the reference's (``backends/torch/twodgs.py``):
ray-surfel intersection through the ray transform M, gsplat's 2D low-pass term, the 3DGS
alpha / skip / stop rules, and besides colours and alphas the composited normals, the depth
distortion and the median depth (the depth is the last colour channel).

Work is split by tile over threads (``_common.parallel_for``); a tile's surfels are copied once
into contiguous rows with the three per-surfel cross products of the reference
(``h_u x h_v = p_x (M_v x M_w) + p_y (M_w x M_u) + M_u x M_v``), then each pixel walks the rows
front to back, a scalar loop (not vectorised yet) that carries the distortion's running sums.

The ray-plane intersection runs in float64 whatever the data's type: in float32 it is
ill-conditioned (h_u x h_v cancels for surfels seen near edge-on; one ulp of a cross moved
sigma by 1e-3 on a 3000-surfel scene, and the float32 reference is itself up to ~1e-4 off in
its outputs and ~1e-3 relative in its gradients there). sigma is then rounded to the data's
type and alpha, skip and stop are computed in it, as the reference does. Colour, normal and
depth sums run in float64; each result is rounded once.

For the backward, the forward keeps per pixel (``extra``): the final transmittance as the loop
computed it, the last contributing intersection, the median's intersection and the float64 sum
of weight x depth (the distortion's gradient needs the depth in front of each surfel, which the
back-to-front walk gets as this total minus what is behind).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from ..shared.typed import like
from ._common import alloc, parallel_for, tile_span, view
from .cull import max_tile_len

FILTER_INV_SQUARE = 2.0  # gsplat's weight of the 2D low-pass term (the reference's)
MEDIAN_T = 0.5  # the median depth is the last contributor's reached while T > MEDIAN_T
# columns of a tile row (``gather_surfels``); colours follow from R_COLOR
R_MX, R_MY, R_OP, R_A, R_B, R_C, R_NRM, R_DENS, R_BOX = 0, 1, 2, 3, 6, 9, 12, 15, 17
R_COLOR = 21
# The reach box (``reach_box``) is made conservative: the sigma threshold is inflated by
# TAU_SLACK (relative and absolute), the box by MARGIN_PX, and a surfel whose disc of reach
# comes within HORIZON_SLACK of the line its plane maps to infinity gets no box.
TAU_SLACK = 0.02
MARGIN_PX = 1.0
HORIZON_SLACK = 0.01

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def reach_box(rays, g, mx, my, op, box):
    """box [4]: x_min, x_max, y_min, y_max of the shifted pixel centres p where surfel g
    (mean mx, my; opacity op) can reach alpha >= ALPHA_SKIP, i.e. sigma <= tau =
    ln(op / ALPHA_SKIP): the union of the low-pass disc |mean - p|^2 <= tau and the image of
    the surfel's disc |s|^2 <= 2 tau under its ray transform M. That image is the box of a
    conic, as the projection's screen box of the unit circle (scaled by r^2 = 2 tau in
    M's first two columns); it is bounded only while the disc stays off the line M_w . (u, v,
    1) = 0, else the box is infinite. A pair outside the box cannot contribute."""
    inf = math.inf
    if op * (1.0 + TAU_SLACK) < ALPHA_SKIP:
        box[0], box[1], box[2], box[3] = inf, -inf, inf, -inf
        return
    tau = max(math.log(op / ALPHA_SKIP), 0.0) * (1.0 + TAU_SLACK) + TAU_SLACK
    r2 = 2.0 * tau
    w0 = np.float64(rays[g, 2, 0])
    w1 = np.float64(rays[g, 2, 1])
    w2 = np.float64(rays[g, 2, 2])
    dist = r2 * (w0 * w0 + w1 * w1) - w2 * w2
    if not dist < -HORIZON_SLACK * w2 * w2:
        box[0], box[1], box[2], box[3] = -inf, inf, -inf, inf
        return
    e = math.sqrt(tau) + MARGIN_PX
    box[0], box[1], box[2], box[3] = mx - e, mx + e, my - e, my + e
    for r in range(2):
        u0 = np.float64(rays[g, r, 0])
        u1 = np.float64(rays[g, r, 1])
        u2 = np.float64(rays[g, r, 2])
        centre = (r2 * (u0 * w0 + u1 * w1) - u2 * w2) / dist
        second = (r2 * (u0 * u0 + u1 * u1) - u2 * u2) / dist
        half = math.sqrt(max(centre * centre - second, 0.0)) + MARGIN_PX
        box[2 * r] = min(box[2 * r], centre - half)
        box[2 * r + 1] = max(box[2 * r + 1], centre + half)


@njit(cache=True, inline="always", error_model="numpy")
def outside(loc, j, x, y):
    """Whether pixel (x, y) is outside row j's reach box (the pair cannot contribute)."""
    px = (np.float64(x) + PIXEL_CENTER) - loc[j, R_DENS]
    py = (np.float64(y) + PIXEL_CENTER) - loc[j, R_DENS + 1]
    return ((px < loc[j, R_BOX]) | (px > loc[j, R_BOX + 1]) | (py < loc[j, R_BOX + 2])
            | (py > loc[j, R_BOX + 3]))


@njit(cache=True, error_model="numpy")
def gather_surfels(means2d, rays, colors, opacities, normals, densify, flatten_ids, start, end,
                   loc):
    """Copies the surfels of intersections start..end-1 into rows j = k - start of loc
    [>= n, R_COLOR + D] float64: mean, opacity, the crosses a = M_v x M_w, b = M_w x M_u,
    c = M_u x M_v (in float64), normal, densify, reach box, colour."""
    for j in range(end - start):
        g = flatten_ids[start + j]
        loc[j, R_MX] = means2d[g, 0]
        loc[j, R_MY] = means2d[g, 1]
        loc[j, R_OP] = opacities[g]
        for col in range(3):  # a: rows (1, 2), b: rows (2, 0), c: rows (0, 1)
            r0 = (col + 1) % 3
            r1 = (col + 2) % 3
            for i in range(3):
                u = np.float64(rays[g, r0, (i + 1) % 3]) * np.float64(rays[g, r1, (i + 2) % 3])
                v = np.float64(rays[g, r0, (i + 2) % 3]) * np.float64(rays[g, r1, (i + 1) % 3])
                loc[j, R_A + 3 * col + i] = u - v
        for i in range(3):
            loc[j, R_NRM + i] = normals[g, i]
        loc[j, R_DENS] = densify[g, 0]
        loc[j, R_DENS + 1] = densify[g, 1]
        for d in range(colors.shape[1]):
            loc[j, R_COLOR + d] = colors[g, d]
        reach_box(rays, g, loc[j, R_MX], loc[j, R_MY], loc[j, R_OP], loc[j, R_BOX:R_BOX + 4])
    return end - start


@njit(cache=True, inline="always", error_model="numpy")
def surfel_pair(loc, j, x, y):
    """Row j of a tile at pixel (x, y) (integers), in float64: (ok, sigma, px, py, dx, dy, s_u,
    s_v, c_z, pick) with p the shifted pixel centre, d = mean - p, s the ray-plane
    intersection; ok False where the ray is parallel to the surfel; pick the 3D term's share
    of the min (1, 0.5 on a tie as torch.minimum's gradient, 0)."""
    f = loc[j, R_MX]
    half = like(f, PIXEL_CENTER)
    px = (like(f, x) + half) - loc[j, R_DENS]
    py = (like(f, y) + half) - loc[j, R_DENS + 1]
    cx = px * loc[j, R_A] + py * loc[j, R_B] + loc[j, R_C]
    cy = px * loc[j, R_A + 1] + py * loc[j, R_B + 1] + loc[j, R_C + 1]
    cz = px * loc[j, R_A + 2] + py * loc[j, R_B + 2] + loc[j, R_C + 2]
    ok = cz != like(f, 0.0)
    czs = cz if ok else like(f, 1.0)
    s_u = cx / czs
    s_v = cy / czs
    dx = loc[j, R_MX] - px
    dy = loc[j, R_MY] - py
    s2 = s_u * s_u + s_v * s_v
    lp = like(f, FILTER_INV_SQUARE) * (dx * dx + dy * dy)
    g = min(s2, lp)
    pick = like(f, 1.0) if s2 < lp else (like(f, 0.5) if s2 == lp else like(f, 0.0))
    sigma = like(f, 0.5) * g if ok else like(f, 0.0)
    return ok, sigma, px, py, dx, dy, s_u, s_v, czs, pick


@njit(cache=True, inline="always", error_model="numpy")
def surfel_alpha(loc, j, sigma, one):
    """(G = exp(-sigma), opacity G, alpha) of row j in the data's type (that of ``one``):
    sigma is rounded to it, so alpha and the decisions on it are computed as the reference's."""
    ge = math.exp(-like(one, sigma))
    ar = like(one, loc[j, R_OP]) * ge
    return ge, ar, min(like(one, ALPHA_CLAMP), ar)


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, means2d, rays, colors, opacities, normals, densify, backgrounds,
                   masks, width, height, tile_size, offsets, flatten_ids, max_len, out_colors,
                   out_alphas, out_normals, out_distort, out_median, out_trans, out_last,
                   out_median_ids, out_wd):
    """Tiles first, first + step, ... . backgrounds [I, D] or [0, D]; masks [I, TH, TW] or
    [0, 0, 0]; outputs [I, H, W, k] (see :func:`forward`)."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_ch = colors.shape[1]
    n_isects = flatten_ids.shape[0]
    has_bg = backgrounds.shape[0] > 0
    has_mask = masks.shape[0] > 0
    offs = offsets.reshape(n_tiles)
    dt = means2d.dtype
    loc = np.empty((max_len, R_COLOR + n_ch), np.float64)
    acc_c = np.empty(n_ch, np.float64)
    acc_n = np.empty(3, np.float64)
    one = np.ones(1, dt)[0]
    for t in range(first, n_tiles, step):
        img, ty, tx, start, end = tile_span(t, th, tw, offs, n_isects)
        if has_mask and not masks[img, ty, tx]:
            end = start
        n_k = 0
        if end > start:
            n_k = gather_surfels(means2d, rays, colors, opacities, normals, densify, flatten_ids,
                                 start, end, loc)
        for y in range(ty * tile_size, min(height, (ty + 1) * tile_size)):
            for x in range(tx * tile_size, min(width, (tx + 1) * tile_size)):
                trans = one
                acc_c[:] = 0.0
                acc_n[:] = 0.0
                dist = 0.0
                wd_sum = 0.0
                median = 0.0
                last = -1
                med_id = -1
                for j in range(n_k):
                    if outside(loc, j, x, y):
                        continue
                    ok, sigma, _, _, _, _, _, _, _, _ = surfel_pair(loc, j, x, y)
                    _, _, alpha = surfel_alpha(loc, j, sigma, one)
                    if not ok or sigma < 0.0 or alpha < like(one, ALPHA_SKIP):
                        continue
                    t_next = trans * (like(trans, 1.0) - alpha)
                    if t_next <= like(trans, TRANSMITTANCE_STOP):
                        break
                    w = np.float64(alpha * trans)
                    for d in range(n_ch):
                        acc_c[d] += w * np.float64(loc[j, R_COLOR + d])
                    for i in range(3):
                        acc_n[i] += w * np.float64(loc[j, R_NRM + i])
                    depth = np.float64(loc[j, R_COLOR + n_ch - 1])
                    dist += 2.0 * (w * depth * (1.0 - np.float64(trans)) - w * wd_sum)
                    wd_sum += w * depth
                    if trans > like(trans, MEDIAN_T):
                        median = depth
                        med_id = start + j
                    last = start + j
                    trans = t_next
                for d in range(n_ch):
                    v = acc_c[d]
                    if has_bg:
                        v += np.float64(trans) * np.float64(backgrounds[img, d])
                    out_colors[img, y, x, d] = v
                for i in range(3):
                    out_normals[img, y, x, i] = acc_n[i]
                out_alphas[img, y, x] = like(trans, 1.0) - trans
                out_distort[img, y, x] = dist
                out_median[img, y, x] = median
                out_trans[img, y, x] = trans
                out_last[img, y, x] = last
                out_median_ids[img, y, x] = med_id
                out_wd[img, y, x] = wd_sum


# ---------------------------------------------------------------------------------------------
# launcher


def forward(
    means2d: torch.Tensor,  # [G, 2]
    ray_transforms: torch.Tensor,  # [G, 3, 3]
    colors: torch.Tensor,  # [G, D]
    opacities: torch.Tensor,  # [G]
    normals: torch.Tensor,  # [G, 3]
    densify: torch.Tensor,  # [G, 2]
    backgrounds: torch.Tensor | None,  # [I, D]
    masks: torch.Tensor | None,  # [I, TH, TW] bool
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int
    flatten_ids: torch.Tensor,  # [n] int
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Returns the outputs (render_colors [I, H, W, D], render_alphas [I, H, W, 1],
    render_normals [I, H, W, 3], render_distort [I, H, W, 1], render_median [I, H, W, 1]) and
    what the backward needs: (trans [I, H, W] each pixel's final T, last_ids [I, H, W] int32
    its last contributing intersection or -1, median_ids [I, H, W] int32 the intersection of
    its median depth or -1, wd [I, H, W] float64 its sum of weight x depth)."""
    n_img, th, tw = isect_offsets.shape
    n_ch = colors.shape[1]
    dt = means2d.dtype
    shape = (n_img, height, width)
    outs = (alloc((*shape, n_ch), dt), alloc((*shape, 1), dt), alloc((*shape, 3), dt),
            alloc((*shape, 1), dt), alloc((*shape, 1), dt))
    extra = (alloc(shape, dt), alloc(shape, torch.int32), alloc(shape, torch.int32),
             alloc(shape, torch.float64))
    np_dt = view(means2d).dtype
    bg = view(backgrounds) if backgrounds is not None else np.zeros((0, n_ch), np_dt)
    mk = view(masks) if masks is not None else np.zeros((0, 0, 0), np.bool_)
    parallel_for(
        forward_kernel, n_img * th * tw, view(means2d), view(ray_transforms), view(colors),
        view(opacities), view(normals), view(densify), bg, mk, width, height, tile_size,
        view(isect_offsets), view(flatten_ids), max_tile_len(isect_offsets, flatten_ids.shape[0]),
        view(outs[0]), view(outs[1]).reshape(shape), view(outs[2]), view(outs[3]).reshape(shape),
        view(outs[4]).reshape(shape), *(view(e) for e in extra))
    return outs, extra
