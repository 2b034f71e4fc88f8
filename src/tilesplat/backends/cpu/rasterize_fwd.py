"""CPU kernels: front-to-back compositing of 2D Gaussians per tile (``rasterize_to_pixels``
forward; the launcher is in ``rasterize``). The contract is the reference's
(``backends/torch/rasterize.py``).

Work is split by tile over threads (``_common.parallel_for``); each tile runs
:func:`blend_tile`, a plain ``@njit`` function whose inner loop over the tile's pixels is
branch-free (a live-pixel mask replaces the per-pixel ``break``; the tile stops when no pixel is
live) and so vectorises (AVX2 / AVX-512, check with ``blend_tile.inspect_asm()``). ``exp`` is
the polynomial one of ``shared.compositing``: Numba from pip has no SVML, and a libm call per pair
would keep the loop scalar.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from ..shared.typed import fma, like
from ._common import sm, tile_span
from .cull import gather_tile
from .rasterize_saved import GROUP_PIXELS, SUB_PIXELS

# A tile is composited in slices of SUB_PIXELS pixels (4 rows of a 16 x 16 tile), each stopping
# on its own when its pixels are done: the lanes of finished pixels idle for less long. A slice
# skips the Gaussians whose alpha ellipse reaches none of its rows (``cull``). The result does
# not depend on either (every pixel still sees the same sequence of contributing pairs). The
# forward records which groups of GROUP_PIXELS pixels each intersection contributes to, for the
# backward (``rasterize_saved``).

GATHER_CHUNK = 256  # intersections gathered at a time (``forward_kernel``)

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


@njit(cache=True, inline="always", error_model="numpy")
def composite_step(a, b, c, op, dx, dy, t, live):
    """One pixel-Gaussian pair of the contract, front to back: (G = exp(-sigma), alpha, T after
    it, hit, stop). hit: the pair contributes (T stays above the stop); stop: the pixel ends
    here without it. The forward and the per_splat backward share it, so the backward replays
    the forward's decisions bit for bit. Inlined into the callers' vectorised pixel loops."""
    s = sm.gaussian_sigma(a, b, c, dx, dy)
    ge = sm.exp_neg(s)
    alpha = min(like(t, ALPHA_CLAMP), op * ge)
    t_next = t * (like(t, 1.0) - alpha)
    ok = (s >= like(t, 0.0)) & (alpha >= like(t, ALPHA_SKIP)) & (live != 0)
    t_stop = like(t, TRANSMITTANCE_STOP)
    return ge, alpha, t_next, ok & (t_next > t_stop), ok & (t_next <= t_stop)


@njit(cache=True, error_model="numpy")
def blend_tile(loc, r_first, r_last, sub, tile_size, k0, n_k, px, py, live, trans, last, weight,
               acc, flags, group_bit):
    """Composites a tile's Gaussians loc[0..n_k-1] (``cull.gather_tile`` rows; row j is
    intersection k0 + j) front to back into the state of its pixel slice ``sub`` (pixels
    sub * SUB_PIXELS + p of the tile, row-major, p < P), skipping those whose tile rows
    r_first[j]..r_last[j] miss the slice: its pixels cannot get alpha >= ALPHA_SKIP from them.
    flags [n, n_sub] uint8 (or [n, 0]: not kept): sets bit g of flags[k0 + j, sub] where row j
    contributes to a pixel of the slice's group g (pixels GROUP_PIXELS g ..; see
    ``rasterize_saved``; the caller zeroed the tile's rows). Returns whether a pixel of the
    slice is still live (False: the slice is done).

    px, py [P] pixel centres; live [P] int32 (0 = stopped or outside); trans [P] running T;
    last [P] int32 last contributing intersection; weight [P] scratch; acc [D, P] float64
    colour: the sum of the exact products weight * colour (each is exact in float64), which
    the per_splat backward subtracts from it again. group_bit [P] int32: 1 << (p //
    GROUP_PIXELS), the flag bit of each pixel (a table: computed from p in the loop, with
    64-bit lanes, it cost ~10 % of the forward at 1 M Gaussians; from the table, ~5 %).
    """
    n_pix = px.shape[0]
    n_ch = acc.shape[0]
    keep_flags = flags.shape[1] > 0
    lo = sub * SUB_PIXELS
    zero = like(trans[0], 0.0)
    # The loops run over the whole slice, not only the rows a Gaussian reaches (the others
    # get alpha < ALPHA_SKIP: no hit, no stop, a zero weight): with bounds that are the same
    # for every Gaussian, LLVM checks the pixel arrays for overlap once per slice instead of
    # once per Gaussian (at 1 M Gaussians 10 % more pairs, 2-5 % less time). Unsigned: a
    # signed start would keep LLVM from seeing contiguous accesses (NumPy's wrap-around of
    # negative indices: it gathered).
    p0 = np.uint64(0)
    p1 = np.uint64(n_pix)
    for j in range(n_k):
        first = max(r_first[j] * tile_size - lo, 0)
        end = min((r_last[j] + 1) * tile_size - lo, n_pix)
        if first >= end:
            continue
        mx = loc[j, 0]
        my = loc[j, 1]
        a = loc[j, 2]
        b = loc[j, 3]
        c = loc[j, 4]
        op = loc[j, 5]
        k32 = np.int32(k0 + j)
        n_live = np.int32(0)  # int32 counters: an int64 sum would halve the vector width
        n_hit = np.int32(0)
        for p in range(p0, p1):
            t = trans[p]
            _, alpha, t_next, hit, stop = composite_step(a, b, c, op, mx - px[p], my - py[p], t,
                                                         live[p])
            weight[p] = alpha * t if hit else zero
            trans[p] = t_next if hit else t
            last[p] = k32 if hit else last[p]
            live[p] = np.int32(0) if stop else live[p]
            n_live = np.int32(n_live + live[p])
            n_hit = np.int32(n_hit + (np.int32(1) if hit else np.int32(0)))
        if n_hit == 0:
            if n_live == 0:
                return False
            continue
        if keep_flags:
            groups = np.int32(0)
            for p in range(p0, p1):  # weight > 0 exactly where the pair contributes
                groups |= group_bit[p] if weight[p] > zero else np.int32(0)
            flags[k32, sub] = np.uint8(groups)
        # + 0 where nothing hit: exact (acc is never -0). RGB in one loop, one conversion of
        # the weight for three fused adds (exact products of float32 in float64: the same sums
        # as a multiply and an add; the forward ~8 % faster at 1 M Gaussians)
        if n_ch == 3:
            c0 = np.float64(loc[j, 6])
            c1 = np.float64(loc[j, 7])
            c2 = np.float64(loc[j, 8])
            for p in range(p0, p1):
                w = np.float64(weight[p])
                acc[0, p] = fma(w, c0, acc[0, p])
                acc[1, p] = fma(w, c1, acc[1, p])
                acc[2, p] = fma(w, c2, acc[2, p])
        else:
            for d in range(n_ch):
                cd = np.float64(loc[j, 6 + d])
                for p in range(p0, p1):
                    acc[d, p] += np.float64(weight[p]) * cd
        if n_live == 0:
            return False
    return True


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
    bounds,
    max_len,
    out_colors,
    out_alphas,
    out_last,
    out_lo,
    out_trans,
    out_flags,
):
    """Tiles first, first + step, ... . backgrounds [I, D] or [0, D]; masks [I, TH, TW] or
    [0, 0, 0]; out_colors [I, H, W, D], out_alphas [I, H, W], out_last [I, H, W]; out_lo
    [I, H, W, D] and out_trans [I, H, W] (or empty); out_flags [n, n_sub] uint8 (or [n, 0]):
    see :func:`forward`."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_ch = colors.shape[1]
    n_pix = tile_size * tile_size
    n_isects = flatten_ids.shape[0]
    has_bg = backgrounds.shape[0] > 0
    has_mask = masks.shape[0] > 0
    offs = offsets.reshape(n_tiles)
    dt = means2d.dtype
    loc = np.empty((min(max_len, GATHER_CHUNK), 6 + n_ch), dt)
    r_first = np.empty(loc.shape[0], np.int32)
    r_last = np.empty(loc.shape[0], np.int32)
    keep_lo = out_lo.shape[0] > 0
    keep_trans = out_trans.shape[0] > 0
    keep_flags = out_flags.shape[1] > 0
    n_sub = (n_pix + SUB_PIXELS - 1) // SUB_PIXELS
    alive = np.empty(n_sub, np.bool_)
    group_bit = np.empty(SUB_PIXELS, np.int32)
    for p in range(SUB_PIXELS):
        group_bit[p] = np.int32(1) << np.int32(p // GROUP_PIXELS)
    for t in range(first, n_tiles, step):
        img, ty, tx, start, end = tile_span(t, th, tw, offs, n_isects)
        if keep_flags:
            out_flags[start:end, :] = np.uint8(0)
        if has_mask and not masks[img, ty, tx]:
            end = start
        px = np.empty(n_pix, dt)
        py = np.empty(n_pix, dt)
        live = np.empty(n_pix, np.int32)
        init_tile_pixels(tx, ty, tile_size, width, height, px, py, live)
        trans = np.ones(n_pix, dt)
        last = np.full(n_pix, -1, np.int32)
        weight = np.empty(n_pix, dt)
        acc = np.zeros((n_sub, n_ch, SUB_PIXELS), np.float64)
        n_alive = 0
        for sub in range(n_sub):
            alive[sub] = live[sub * SUB_PIXELS:min(n_pix, (sub + 1) * SUB_PIXELS)].sum() > 0
            n_alive += alive[sub]
        # the list in chunks, each gathered when the slices still live reach it: about half of
        # a tile's intersections lie behind the pixels' stops (garden at 1 M) and are never
        # gathered; each slice still sees its Gaussians in order, so nothing else changes
        for k0 in range(start, end, GATHER_CHUNK):
            if n_alive == 0:
                break
            k1 = min(end, k0 + GATHER_CHUNK)
            n_k = gather_tile(means2d, conics, colors, opacities, flatten_ids, bounds, k0, k1,
                              tx, ty, tile_size, loc, r_first, r_last)
            for sub in range(n_sub):
                if not alive[sub]:
                    continue
                lo = sub * SUB_PIXELS
                hi = min(n_pix, lo + SUB_PIXELS)
                alive[sub] = blend_tile(loc, r_first, r_last, sub, tile_size, k0, n_k,
                                        px[lo:hi], py[lo:hi], live[lo:hi], trans[lo:hi],
                                        last[lo:hi], weight[lo:hi], acc[sub], out_flags,
                                        group_bit[:hi - lo])
                n_alive -= not alive[sub]
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
                    if keep_lo:  # what the rounding to out_colors' dtype lost
                        out_lo[img, y, x, d] = v - out_colors[img, y, x, d]
                out_alphas[img, y, x] = one - trans[p]
                if keep_trans:
                    out_trans[img, y, x] = trans[p]
                out_last[img, y, x] = last[p]
