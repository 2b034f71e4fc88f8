"""CPU kernels: front-to-back compositing of 2D Gaussians per tile (``rasterize_to_pixels``
forward). The contract is the reference's (``backends/torch/rasterize.py``).

Work is split by tile over threads (``_common.parallel_for``); each tile runs
:func:`blend_tile`, a plain ``@njit`` function whose inner loop over the tile's pixels is
branch-free (a live-pixel mask replaces the per-pixel ``break``; the tile stops when no pixel is
live) and so vectorises (AVX2 / AVX-512, check with ``blend_tile.inspect_asm()``). ``exp`` is
the polynomial one of ``scalar_math``: Numba from pip has no SVML, and a libm call per pair
would keep the loop scalar.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from ..scalar_math import like
from ._common import alloc, parallel_for, sm, view

# A tile is composited in slices of SUB_PIXELS pixels (4 rows of a 16 x 16 tile), each stopping
# on its own when its pixels are done: the lanes of finished pixels idle for less long. The
# result does not depend on it (every pixel still sees the same sequence).
SUB_PIXELS = 64

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def init_tile_pixels(tx, ty, tile_size, width, height, px, py, live):
    """Pixel centres px, py [P] of tile (tx, ty) and live [P] (1 inside the image, else 0)."""
    half = like(px[0], PIXEL_CENTER)
    for p in range(px.shape[0]):
        x = tx * tile_size + p % tile_size
        y = ty * tile_size + p // tile_size
        px[p] = like(half, x) + half
        py[p] = like(half, y) + half
        live[p] = np.int32(1) if (x < width and y < height) else np.int32(0)


@njit(cache=True, error_model="numpy")
def blend_tile(
    means2d,
    conics,
    colors,
    opacities,
    flatten_ids,
    start,
    end,
    px,
    py,
    live,
    trans,
    last,
    weight,
    acc,
):
    """Composites intersections start..end-1 front to back into one tile's pixel state.

    px, py [P] pixel centres; live [P] int32 (0 = stopped or outside); trans [P] running T;
    last [P] int32 last contributing intersection; weight [P] scratch; acc [D, P] colour.
    """
    n_pix = px.shape[0]
    n_ch = colors.shape[1]
    f = trans[0]
    clamp = like(f, ALPHA_CLAMP)
    skip = like(f, ALPHA_SKIP)
    t_stop = like(f, TRANSMITTANCE_STOP)
    zero = like(f, 0.0)
    one = like(f, 1.0)
    for k in range(start, end):
        g = flatten_ids[k]
        mx = means2d[g, 0]
        my = means2d[g, 1]
        a = conics[g, 0]
        b = conics[g, 1]
        c = conics[g, 2]
        op = opacities[g]
        k32 = np.int32(k)
        n_live = 0
        n_hit = 0
        for p in range(n_pix):
            dx = mx - px[p]
            dy = my - py[p]
            s = sm.gaussian_sigma(a, b, c, dx, dy)
            alpha = min(clamp, op * sm.exp_neg(s))
            t = trans[p]
            t_next = t * (one - alpha)
            ok = (s >= zero) & (alpha >= skip) & (live[p] != 0)
            hit = ok & (t_next > t_stop)
            stop = ok & (t_next <= t_stop)
            weight[p] = alpha * t if hit else zero
            trans[p] = t_next if hit else t
            last[p] = k32 if hit else last[p]
            live[p] = np.int32(0) if stop else live[p]
            n_live += live[p]
            n_hit += np.int32(1) if hit else np.int32(0)
        if n_hit > 0:
            for d in range(n_ch):
                cd = colors[g, d]
                for p in range(n_pix):
                    acc[d, p] += weight[p] * cd
        if n_live == 0:
            break


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(
    first,
    step,
    means2d,
    conics,
    colors,
    opacities,
    backgrounds,
    masks,
    width,
    height,
    tile_size,
    offsets,
    flatten_ids,
    out_colors,
    out_alphas,
    out_last,
):
    """Tiles first, first + step, ... . backgrounds [I, D] or [0, D]; masks [I, TH, TW] or
    [0, 0, 0]; out_colors [I, H, W, D], out_alphas [I, H, W], out_last [I, H, W]."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_ch = colors.shape[1]
    n_pix = tile_size * tile_size
    n_isects = flatten_ids.shape[0]
    has_bg = backgrounds.shape[0] > 0
    has_mask = masks.shape[0] > 0
    offs = offsets.reshape(n_tiles)
    dt = means2d.dtype
    for t in range(first, n_tiles, step):
        img = t // (th * tw)
        rest = t - img * th * tw
        ty = rest // tw
        tx = rest - ty * tw
        start = offs[t]
        end = offs[t + 1] if t + 1 < n_tiles else n_isects
        if has_mask and not masks[img, ty, tx]:
            end = start
        px = np.empty(n_pix, dt)
        py = np.empty(n_pix, dt)
        live = np.empty(n_pix, np.int32)
        init_tile_pixels(tx, ty, tile_size, width, height, px, py, live)
        trans = np.ones(n_pix, dt)
        last = np.full(n_pix, -1, np.int32)
        weight = np.empty(n_pix, dt)
        n_sub = (n_pix + SUB_PIXELS - 1) // SUB_PIXELS
        acc = np.zeros((n_sub, n_ch, SUB_PIXELS), dt)
        for sub in range(n_sub if end > start else 0):
            lo = sub * SUB_PIXELS
            hi = min(n_pix, lo + SUB_PIXELS)
            if live[lo:hi].sum() > 0:
                blend_tile(
                    means2d,
                    conics,
                    colors,
                    opacities,
                    flatten_ids,
                    start,
                    end,
                    px[lo:hi],
                    py[lo:hi],
                    live[lo:hi],
                    trans[lo:hi],
                    last[lo:hi],
                    weight[lo:hi],
                    acc[sub],
                )
        one = like(trans[0], 1.0)
        for p in range(n_pix):
            x = tx * tile_size + p % tile_size
            y = ty * tile_size + p // tile_size
            if x < width and y < height:
                for d in range(n_ch):
                    v = acc[p // SUB_PIXELS, d, p % SUB_PIXELS]
                    if has_bg:
                        v += trans[p] * backgrounds[img, d]
                    out_colors[img, y, x, d] = v
                out_alphas[img, y, x] = one - trans[p]
                out_last[img, y, x] = last[p]


# ---------------------------------------------------------------------------------------------
# launcher


def forward(
    means2d: torch.Tensor,  # [G, 2]
    conics: torch.Tensor,  # [G, 3]
    colors: torch.Tensor,  # [G, D]
    opacities: torch.Tensor,  # [G]
    backgrounds: torch.Tensor | None,  # [I, D]
    masks: torch.Tensor | None,  # [I, TH, TW] bool
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int32
    flatten_ids: torch.Tensor,  # [n] int32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns render_colors [I, H, W, D], render_alphas [I, H, W, 1], last_ids [I, H, W]."""
    n_img = isect_offsets.shape[0]
    n_ch = colors.shape[1]
    dt = means2d.dtype
    out_colors = alloc((n_img, height, width, n_ch), dt)
    out_alphas = alloc((n_img, height, width, 1), dt)
    out_last = alloc((n_img, height, width), torch.int32)
    np_dt = view(means2d).dtype
    bg = view(backgrounds) if backgrounds is not None else np.zeros((0, n_ch), np_dt)
    mk = view(masks) if masks is not None else np.zeros((0, 0, 0), np.bool_)
    parallel_for(
        forward_kernel,
        n_img * isect_offsets.shape[1] * isect_offsets.shape[2],
        view(means2d),
        view(conics),
        view(colors),
        view(opacities),
        bg,
        mk,
        width,
        height,
        tile_size,
        view(isect_offsets),
        view(flatten_ids),
        view(out_colors),
        view(out_alphas).reshape(n_img, height, width),
        view(out_last),
    )
    return out_colors, out_alphas, out_last
