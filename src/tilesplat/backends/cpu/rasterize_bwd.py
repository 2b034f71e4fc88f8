"""CPU kernels: backward of ``rasterize_to_pixels``, two schemes, deterministic (the launcher
is in ``rasterize``).

``per_pixel``: each pixel walks its tile's list back to front from its ``last_id``, recovering T
before each Gaussian by dividing by (1 - alpha), with the colour behind it accumulated. The walk
starts from the T_final the forward computed, which the forward keeps for it:
``1 - render_alphas`` has lost the low bits of a small T in float32, and every recovered T (so
every gradient of the pixel) would inherit that error, up to ~1e-3 relative.
``per_splat``: the tile's Gaussians are replayed front to back with per-pixel state (running T
and the colour still to come, ``C_final - accumulated``), with the forward's own arithmetic
(``composite_step``), so T needs no division. C_final is the forward's float64 sum of the
exact products w * c (render_colors plus the rounding residual the forward keeps), and the
backward subtracts the same products from it in float64, so the colour still to come is exact
to float64 rounding even where it is a tiny difference of large sums (saturated pixels).

Work: tiles over threads (``_common.parallel_for``), pixels vectorised
(``rasterize_bwd_tiles``). The forward recorded which (group of GROUP_PIXELS pixels,
intersection) pairs contribute to a pixel (``rasterize_saved``); both schemes evaluate each
intersection only from its first flagged group to its last, and sum its gradient over the span
of its flagged slices.

Each intersection's gradient (summed over the tile's pixels in a fixed order) goes to a row of
a buffer indexed by intersection; a second pass sums the rows of each Gaussian in increasing
intersection order, each thread for its own range of Gaussians in one pass over the rows
(:func:`sum_rows_kernel`). Only the rows of the intersections the forward flagged are written
and summed (at 1 M Gaussians 0.98 M of 2.63 M: the rest lie behind stopped pixels); the others
are zero, and leaving a zero out of a sum changes none of its bits. No atomics: results are
bit-identical for any thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..shared.typed import like
from ._common import tile_span
from .cull import gather_tile
from .rasterize_bwd_tiles import (
    C_A,
    C_ABSX,
    C_ABSY,
    C_B,
    C_C,
    C_MX,
    C_MY,
    C_OP,
    N_BUF,
    N_FIXED,
    R_PX,
    R_PY,
    tile_rows,
)
from .rasterize_fwd import init_tile_pixels
from .rasterize_saved import SUB_PIXELS

# ---------------------------------------------------------------------------------------------
# kernels


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(
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
    render_colors,
    colors_lo,
    trans_final,
    flags,
    render_alphas,
    last_ids,
    v_colors_img,
    v_alphas_img,
    per_splat,
    absgrad,
    part,
    bg_part,
):
    """Tiles first, first + step, ...; writes part [n, 8 + D], the gradient rows of the
    intersections the forward flagged (row k: intersection k; the other rows are not
    written), and bg_part [n_tiles, D] (the tile's sum of v_render_colors * T_final). A
    tile's intersections are contiguous, part[start:end]. bounds [0, 4] (``cull.gather_tile``
    computes no row ranges: the forward's flags say more); max_len: the longest tile list;
    colors_lo [I, H, W, D] or [0, 0, 0, D]: the forward's rounding residual of render_colors
    (per_splat); trans_final [I, H, W] or [0, 0, 0]: the forward's final transmittances
    (per_pixel); flags [n, n_sub]: the forward's hit flags (``rasterize_saved``)."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_ch = colors.shape[1]
    n_pix = tile_size * tile_size
    n_isects = flatten_ids.shape[0]
    has_bg = backgrounds.shape[0] > 0
    has_mask = masks.shape[0] > 0
    has_lo = colors_lo.shape[0] > 0
    offs = offsets.reshape(n_tiles)
    dt = means2d.dtype
    loc = np.empty((max_len, 6 + n_ch), dt)
    r_first = np.empty(max_len, np.int32)
    r_last = np.empty(max_len, np.int32)
    n_sub = (n_pix + SUB_PIXELS - 1) // SUB_PIXELS
    n_pad = n_sub * SUB_PIXELS  # pixels padded to whole slices (padding: last_id -1)
    buf = np.zeros((N_BUF + n_ch, n_pad), dt)  # the tile's scratch (tile_rows)
    v_c64 = np.zeros((3, n_pad), np.float64)  # RGB: the tile's v_c in float64
    dot = np.empty(n_pad, np.float64)
    live = np.zeros(n_pad, np.int32)
    t_final = np.ones(n_pad, dt)
    trans = np.ones(n_pad, dt)  # running T of tile_rows
    v_a = np.zeros(n_pad, dt)
    last = np.full(n_pad, -1, np.int32)
    # the remaining colour projected on v_colors, float64: per_splat's is a difference of
    # nearly equal sums
    state = np.zeros(n_pad, np.float64)
    bg_dot = np.zeros(n_pad, dt)
    zero = like(buf[0, 0], 0.0)
    one = like(buf[0, 0], 1.0)
    for t in range(first, n_tiles, step):
        img, ty, tx, start, end = tile_span(t, th, tw, offs, n_isects)
        # the pixel centres go straight into tile_rows' scratch (its padding stays 0)
        init_tile_pixels(tx, ty, tile_size, width, height, buf[R_PX, :n_pix],
                         buf[R_PY, :n_pix], live[:n_pix])
        t_final[:] = one
        trans[:] = one
        buf[N_BUF:, :] = zero  # v_c
        v_a[:] = zero
        last[:] = -1
        state[:] = 0.0
        bg_dot[:] = zero
        for d in range(n_ch):
            bg_part[t, d] = zero
        for p in range(n_pix):
            if live[p] != 0:
                x = tx * tile_size + p % tile_size
                y = ty * tile_size + p // tile_size
                t_final[p] = one - render_alphas[img, y, x]
                if not per_splat:
                    # T_final as the forward computed it (1 - render_alphas loses its low bits
                    # in float32 when T is small, and every T the back-to-front walk recovers
                    # scales it)
                    trans[p] = trans_final[img, y, x]
                v_a[p] = v_alphas_img[img, y, x]
                last[p] = last_ids[img, y, x]
                for d in range(n_ch):
                    vcd = v_colors_img[img, y, x, d]
                    buf[N_BUF + d, p] = vcd
                    if n_ch == 3:
                        v_c64[d, p] = vcd
                    bg_part[t, d] += vcd * t_final[p]
                    if per_splat:
                        c_final = np.float64(render_colors[img, y, x, d])
                        if has_lo:
                            c_final += colors_lo[img, y, x, d]
                        state[p] += np.float64(vcd) * c_final
                    if has_bg:
                        bg_dot[p] += vcd * backgrounds[img, d]
        # the tile's gradient rows are part[start:end]; tile_rows writes those the forward
        # flagged up to the tile's last contributor, and the reduce reads no unflagged row
        # (``sum_rows_kernel``)
        k_tile = -1
        for p in range(n_pix):
            k_tile = max(k_tile, last[p])
        skipped = has_mask and not masks[img, ty, tx]
        k_end = start if skipped or k_tile < start else min(end, k_tile + 1)
        for k in range(k_end, end):  # a flag no pixel used (none from this forward): a zero
            if flagged(flags, k):
                for col in range(part.shape[1]):
                    part[k, col] = zero
        if k_end == start:
            continue
        n_k = gather_tile(means2d, conics, colors, opacities, flatten_ids, bounds, start,
                          k_end, tx, ty, tile_size, loc, r_first, r_last)
        for p in range(n_pix):
            # d loss / d alpha_k through render_alphas (and, per pixel, the background) is
            # this times T_final / (1 - alpha_k)
            if per_splat:
                v_a[p] = v_a[p] * t_final[p]
            else:
                v_a[p] = (v_a[p] - bg_dot[p]) * trans[p]
            state[p] -= np.float64(v_a[p])  # tile_rows' state is kept less v_a
        tile_rows(loc, flags, start, n_k, last, trans, v_c64, state, buf, dot, absgrad,
                  per_splat, part)


@njit(cache=True, inline="always", error_model="numpy")
def flagged(flags, k):
    """Whether the forward flagged intersection k (flags [n, n_sub]: any group of any slice)."""
    hit = False
    for sub in range(flags.shape[1]):
        hit |= flags[k, sub] != 0
    return hit


@njit(cache=True, error_model="numpy")
def group_by_gaussian(flatten_ids, n_gauss):
    """CSR of intersections per Gaussian in increasing intersection order (a stable counting
    sort): Gaussian g owns positions first[g]:first[g + 1]; intersection k is at pos[k]. int32
    (at most 2^31 - 1 intersections): the counts and cursors are indexed at random, and half
    the bytes are half the cache misses."""
    if flatten_ids.shape[0] > 2147483647:
        raise ValueError("the CPU backward takes at most 2^31 - 1 intersections per call")
    first = np.zeros(n_gauss + 1, np.int32)
    for k in range(flatten_ids.shape[0]):
        first[flatten_ids[k] + 1] += 1
    for g in range(n_gauss):
        first[g + 1] += first[g]
    cursor = first[:-1].copy()
    pos = np.empty(flatten_ids.shape[0], np.int32)
    for k in range(flatten_ids.shape[0]):
        g = flatten_ids[k]
        pos[k] = cursor[g]
        cursor[g] += 1
    return first, pos


@njit(cache=True, error_model="numpy")
def reduce_backgrounds(bg_part, n_img, v_backgrounds):
    """v_backgrounds [I, D]: the tiles' partial sums, image by image in tile order."""
    n_tiles = bg_part.shape[0] // n_img
    for i in range(n_img):
        for d in range(bg_part.shape[1]):
            s = bg_part[i * n_tiles, d]
            for t in range(1, n_tiles):
                s += bg_part[i * n_tiles + t, d]
            v_backgrounds[i, d] = s


@njit(nogil=True, cache=True, error_model="numpy")
def sum_rows_kernel(first, step, flatten_ids, flags, part, v_means2d, v_conics, v_colors,
                    v_opacities, v_abs):
    """The Gaussians of range ``first`` of ``step`` equal ranges: each one's gradients are the
    sums of the rows part[k] [8 + D] of its intersections the forward flagged
    (:func:`flagged`), in increasing k; v_abs [G, 2] or [0, 2]. Each range is one pass over
    the intersections (the rows are read in order, the sums are the Gaussians' own), so no
    thread waits for another and the sums do not depend on the thread count. An unflagged
    intersection contributes to no pixel and its row is not written: leaving it out changes
    no bit (a sum starts at +0, is never -0, and x + (+-0) is x)."""
    n_gauss = v_means2d.shape[0]
    lo = n_gauss * first // step
    hi = n_gauss * (first + 1) // step
    n_ch = v_colors.shape[1]
    keep_abs = v_abs.shape[0] > 0
    zero = v_means2d.dtype.type(0.0)
    for g in range(lo, hi):
        v_means2d[g, 0] = zero
        v_means2d[g, 1] = zero
        v_conics[g, 0] = zero
        v_conics[g, 1] = zero
        v_conics[g, 2] = zero
        v_opacities[g] = zero
        for d in range(n_ch):
            v_colors[g, d] = zero
        if keep_abs:
            v_abs[g, 0] = zero
            v_abs[g, 1] = zero
    for k in range(flatten_ids.shape[0]):
        g = flatten_ids[k]
        if g < lo or g >= hi or not flagged(flags, k):
            continue
        v_means2d[g, 0] += part[k, C_MX]
        v_means2d[g, 1] += part[k, C_MY]
        v_conics[g, 0] += part[k, C_A]
        v_conics[g, 1] += part[k, C_B]
        v_conics[g, 2] += part[k, C_C]
        v_opacities[g] += part[k, C_OP]
        for d in range(n_ch):
            v_colors[g, d] += part[k, N_FIXED + d]
        if keep_abs:
            v_abs[g, 0] += part[k, C_ABSX]
            v_abs[g, 1] += part[k, C_ABSY]
