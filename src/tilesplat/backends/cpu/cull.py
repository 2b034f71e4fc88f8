"""CPU kernels: per-Gaussian pixel bounds, so the rasterizer skips the slices of a tile that a
Gaussian's visible ellipse cannot reach.

A tile's list holds every Gaussian whose ellipse meets the tile, but most rows of that tile are
out of a small Gaussian's reach: every pair there fails the ``alpha >= ALPHA_SKIP`` test.
:func:`gather_tile` turns each Gaussian's bounds into the range of the tile's rows it can
reach, and the forward skips the Gaussian in every slice of the tile whose rows that range
misses (``rasterize_fwd``; it evaluates the slices it reaches whole: loops of one length for
every Gaussian vectorise with less overhead than the 10 % of pairs it would save). Skipping
changes no result: the skipped pairs are exactly pairs that would not contribute.

The bounds are conservative by construction. alpha = min(ALPHA_CLAMP, op * exp(-sigma)) >=
ALPHA_SKIP needs sigma <= tau = ln(op / ALPHA_SKIP); the pixels with sigma <= tau form an
ellipse whose box is mean ± sqrt(2 tau c / det), sqrt(2 tau a / det) for conic (a, b, c) and
det = a c - b^2. The kernels evaluate sigma in float32, whose rounding error grows with the
ellipse's elongation, so tau is inflated by TAU_SLACK, the box by one pixel, and a conic that is
not safely positive definite (det < MIN_DET_RATIO * a * c) gets no bounds at all.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ...constants import ALPHA_SKIP, PIXEL_CENTER
from ._common import BLOCK, parallel_for, prefetch, view

TAU_SLACK = 0.02  # relative (and absolute) slack on the sigma threshold
MARGIN_PX = 1.0  # added to each side of the box
# det / (a c) below this (an axis ratio beyond ~20:1): the float32 sigma may cancel too much
# for the error analysis above, and the Gaussian is never skipped.
MIN_DET_RATIO = 1e-2


@njit(nogil=True, cache=True, error_model="numpy")
def bounds_kernel(first, step, means2d, conics, opacities, out):
    """Blocks first, first + step, ... of Gaussians; out [G, 4]: x_min, x_max, y_min, y_max of
    the pixel centres Gaussian g can reach with alpha >= ALPHA_SKIP (x_min > x_max: none;
    infinite: no bound)."""
    n = means2d.shape[0]
    inf = math.inf
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for g in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            a = np.float64(conics[g, 0])
            b = np.float64(conics[g, 1])
            c = np.float64(conics[g, 2])
            op = np.float64(opacities[g])
            det = a * c - b * b
            lo_x, hi_x, lo_y, hi_y = -inf, inf, -inf, inf
            if op * (1.0 + TAU_SLACK) < ALPHA_SKIP:
                lo_x, hi_x, lo_y, hi_y = inf, -inf, inf, -inf  # never visible
            elif a > 0.0 and c > 0.0 and det >= MIN_DET_RATIO * a * c:
                tau = max(math.log(op / ALPHA_SKIP), 0.0) * (1.0 + TAU_SLACK) + TAU_SLACK
                ex = math.sqrt(2.0 * tau * c / det) + MARGIN_PX
                ey = math.sqrt(2.0 * tau * a / det) + MARGIN_PX
                mx = np.float64(means2d[g, 0])
                my = np.float64(means2d[g, 1])
                lo_x, hi_x, lo_y, hi_y = mx - ex, mx + ex, my - ey, my + ey
            out[g, 0] = lo_x
            out[g, 1] = hi_x
            out[g, 2] = lo_y
            out[g, 3] = hi_y


GATHER_AHEAD = 16


@njit(cache=True, error_model="numpy")
def gather_tile(means2d, conics, colors, opacities, flatten_ids, bounds, start, end, tx, ty,
                tile_size, loc, r_first, r_last):
    """Copies the Gaussians of intersections start..end-1 of tile (tx, ty) into rows j =
    k - start of loc [>= n, 6 + D] (mx, my, a, b, c, opacity, colour), and the rows of the
    tile's pixels each can reach into r_first, r_last [>= n] (r_first > r_last: none).
    Contiguous rows keep the per-pair loops off scattered memory. NaN or infinite bounds give
    every row; bounds [0, 4] leaves r_first and r_last unwritten (the backward, which follows
    the forward's hit flags instead)."""
    x0 = np.float64(tx * tile_size) + PIXEL_CENTER
    y0 = np.float64(ty * tile_size) + PIXEL_CENTER
    top = tile_size - 1
    n_ch = colors.shape[1]
    f_means = means2d.reshape(means2d.size)
    f_conics = conics.reshape(conics.size)
    f_colors = colors.reshape(colors.size)
    f_bounds = bounds.reshape(bounds.size)
    ranges = bounds.shape[0] > 0  # no bounds: the caller needs no row ranges
    for j in range(end - start):
        if start + j + GATHER_AHEAD < end:
            h = flatten_ids[start + j + GATHER_AHEAD]
            prefetch(f_means, 2 * h)
            prefetch(f_conics, 3 * h)
            prefetch(f_colors, n_ch * h)
            prefetch(opacities, h)
            if ranges:
                prefetch(f_bounds, 4 * h)
        g = flatten_ids[start + j]
        loc[j, 0] = means2d[g, 0]
        loc[j, 1] = means2d[g, 1]
        loc[j, 2] = conics[g, 0]
        loc[j, 3] = conics[g, 1]
        loc[j, 4] = conics[g, 2]
        loc[j, 5] = opacities[g]
        for d in range(n_ch):
            loc[j, 6 + d] = colors[g, d]
        if not ranges:
            continue
        r_lo = bounds[g, 2] - y0
        r_hi = bounds[g, 3] - y0
        if (bounds[g, 1] < x0) | (bounds[g, 0] > x0 + top) | (r_hi < 0.0) | (r_lo > top):
            r_first[j] = 1
            r_last[j] = 0
        else:
            r_first[j] = int(math.ceil(r_lo)) if r_lo > 0.0 else 0
            r_last[j] = int(math.floor(r_hi)) if r_hi < top else top
    return end - start


def max_tile_len(isect_offsets: torch.Tensor, n_isects: int) -> int:
    """The longest tile list of isect_offsets [I, TH, TW] over n_isects intersections."""
    offs = view(isect_offsets).reshape(-1).astype(np.int64)
    if offs.size == 0:
        return 0
    return int(np.diff(np.append(offs, n_isects)).max())


def splat_bounds(means2d: torch.Tensor, conics: torch.Tensor,
                 opacities: torch.Tensor) -> np.ndarray:
    """[G, 4] float64 bounds (see :func:`bounds_kernel`) of Gaussians means2d [G, 2], conics
    [G, 3], opacities [G]."""
    n = means2d.shape[0]
    out = np.empty((n, 4), np.float64)
    if n:
        parallel_for(bounds_kernel, (n + BLOCK - 1) // BLOCK, view(means2d), view(conics),
                     view(opacities), out)
    return out
