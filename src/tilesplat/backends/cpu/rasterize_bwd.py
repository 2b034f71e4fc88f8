"""CPU kernels: backward of ``rasterize_to_pixels``, two schemes, deterministic.

``per_pixel``: each pixel walks its tile's list back to front from its ``last_id``, recovering T
before each Gaussian by dividing by (1 - alpha), with the colour behind it accumulated. The walk
starts from the T_final the forward computed, which the forward keeps for it:
``1 - render_alphas`` has lost the low bits of a small T in float32, and every recovered T (so
every gradient of the pixel) would inherit that error, up to ~1e-3 relative.
``per_splat``: the tile's Gaussians are replayed front to back with per-pixel state (running T,
live mask and the colour still to come, ``C_final - accumulated``), deciding skip / stop exactly
as the forward did (the same ``composite_step``); T needs no division, and ``last_ids`` only
end the replay early. C_final is the forward's float64 sum (render_colors plus the rounding
residual the forward keeps), and the backward subtracts the forward's own float32 products
from it, so the colour still to come is exact to float64 rounding even where it is a tiny
difference of large sums (saturated pixels).

Both skip the (pixel slice, Gaussian) pairs that ``cull`` proves cannot contribute.

Both run tile by tile over threads (``_common.parallel_for``), pixels vectorised in the inner
loops, and write each intersection's gradient (summed over the tile's pixels in a fixed order)
to a row of a buffer indexed by intersection. A second pass sums the rows of each Gaussian in
increasing intersection order. No atomics: results are bit-identical for any thread count.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP
from ..scalar_math import like
from ._common import BLOCK, alloc, parallel_for, sm, view
from .cull import gather_tile, max_tile_len, splat_bounds
from .rasterize_fwd import SUB_PIXELS, composite_step, init_tile_pixels

# Columns of the per-intersection gradient rows; colours follow from N_FIXED.
C_MX, C_MY, C_A, C_B, C_C, C_OP, C_ABSX, C_ABSY = range(8)
N_FIXED = 8

# ---------------------------------------------------------------------------------------------
# kernels


# Functions that only sum (no skip / stop decision depends on their rounding) may reassociate,
# which lets LLVM vectorise their reductions over the tile's pixels. The order of the sums is
# then fixed by the compiled code, never by the threads: results stay bit-identical.
SUMS = {"reassoc", "nsz"}


@njit(cache=True, fastmath=SUMS, error_model="numpy")
def pair_grads(j, mx, my, a, b, c, op, px, py, t_k, gauss, v_alpha, w, v_c, absgrad, rows):
    """Adds the gradient of the tile's row j from these pixels to rows[j]: means2d,
    conic, opacity and colour (w [P] * v_c [D, P]), summed over the pixels, and (absgrad)
    |d loss / d means2d|."""
    n_pix = px.shape[0]
    f = gauss[0]
    zero = like(f, 0.0)
    half = like(f, 0.5)
    clamp = like(f, ALPHA_CLAMP)
    s_mx = zero
    s_my = zero
    s_a = zero
    s_b = zero
    s_c = zero
    s_op = zero
    s_ax = zero
    s_ay = zero
    for p in range(n_pix):
        dx = mx - px[p]
        dy = my - py[p]
        ar = op * gauss[p]
        # alpha = min(0.999, op * G): no gradient where clamped
        va = v_alpha[p] if (t_k[p] > zero) & (ar <= clamp) else zero
        v_op = va * gauss[p]
        v_s = -va * ar
        gx = v_s * (a * dx + b * dy)
        gy = v_s * (b * dx + c * dy)
        s_mx += gx
        s_my += gy
        s_a += half * v_s * dx * dx
        s_b += v_s * dx * dy
        s_c += half * v_s * dy * dy
        s_op += v_op
        if absgrad:  # loop-invariant: compiled as two loops
            s_ax += abs(gx)
            s_ay += abs(gy)
    rows[j, C_MX] += s_mx
    rows[j, C_MY] += s_my
    rows[j, C_A] += s_a
    rows[j, C_B] += s_b
    rows[j, C_C] += s_c
    rows[j, C_OP] += s_op
    rows[j, C_ABSX] += s_ax
    rows[j, C_ABSY] += s_ay
    for d in range(v_c.shape[0]):
        s_col = zero
        for p in range(n_pix):
            s_col += w[p] * v_c[d, p]
        rows[j, N_FIXED + d] += s_col


@njit(cache=True, inline="always", error_model="numpy")
def alpha_grad(v_a, r, t, dot, state, sub, per_splat):
    """One pixel's d loss / d alpha and its new colour state (see :func:`color_step`).

    v_a * r: the render_alphas share; t * dot: this Gaussian's own colour (dot = v_c . c);
    state / (1 - alpha): the colour behind it (per_pixel: the state itself; per_splat: the
    state after subtracting sub = v_c . (w c), this Gaussian's contribution). The difference
    is taken in float64: the two colour terms nearly cancel where T is small.
    """
    ahead = state - sub if per_splat else state
    f64 = np.float64
    v = f64(v_a * r) + f64(t) * dot - ahead * f64(r)
    return like(r, v), (ahead if per_splat else state + sub)


# inlined into the tile loops (one call fewer per pair; it has no fast-math to keep apart)
@njit(cache=True, inline="always", error_model="numpy")
def color_step(j, op, loc, v_c, v_a, gauss, t_k, w, inv_1ma, state, dot, sub, v_alpha,
               per_splat):
    """Row j of the tile (opacity op): d loss / d alpha (v_alpha [P]), w = alpha T (w [P]),
    and the colour state.

    state [P] float64 is the pixel's remaining colour projected on its upstream gradient,
    sum_d v_c[d] * colour_d: per_pixel, of the Gaussians behind row j (summed back to front,
    updated after); per_splat, of the rows still to come: the forward's float64 colour minus
    the rows before, row j's contribution subtracted first. Each contribution is the
    forward's own float32 product w * c_d (w is computed exactly as the forward's weight), so
    per_splat's remainder is exact to float64 rounding even when it is a tiny difference of
    large sums. inv_1ma [P], dot [P] float64, sub [P] float64: scratch of the path for D != 3.
    No fast-math: per_splat needs the forward's products bit for bit.
    """
    clamp = like(gauss[0], ALPHA_CLAMP)
    one = like(gauss[0], 1.0)
    f64 = np.float64
    n_ch = v_c.shape[0]
    if n_ch == 3:  # RGB in one vectorised pass
        c0 = loc[j, 6]
        c1 = loc[j, 7]
        c2 = loc[j, 8]
        for p in range(gauss.shape[0]):
            alpha = min(clamp, op * gauss[p])
            r = one / (one - alpha)
            t = t_k[p]
            wp = alpha * t  # 0 where not hit (t_k = 0)
            v0 = f64(v_c[0, p])
            v1 = f64(v_c[1, p])
            v2 = f64(v_c[2, p])
            d_p = v0 * f64(c0) + v1 * f64(c1) + v2 * f64(c2)
            s_p = v0 * f64(wp * c0) + v1 * f64(wp * c1) + v2 * f64(wp * c2)
            v_alpha[p], state[p] = alpha_grad(v_a[p], r, t, d_p, state[p], s_p, per_splat)
            w[p] = wp
        return
    for p in range(gauss.shape[0]):
        alpha = min(clamp, op * gauss[p])
        inv_1ma[p] = one / (one - alpha)
        w[p] = alpha * t_k[p]
        dot[p] = 0.0
        sub[p] = 0.0
    for d in range(n_ch):
        cd = loc[j, 6 + d]
        for p in range(gauss.shape[0]):
            vd = f64(v_c[d, p])
            dot[p] += vd * f64(cd)
            sub[p] += vd * f64(w[p] * cd)
    for p in range(gauss.shape[0]):
        v_alpha[p], state[p] = alpha_grad(v_a[p], inv_1ma[p], t_k[p], dot[p], state[p], sub[p],
                                          per_splat)


@njit(cache=True, error_model="numpy")
def tile_per_pixel(loc, s_first, s_last, sub, k0, px, py, last, trans, v_c, v_a, behind, gauss,
                   t_k, w, inv_1ma, dot, sub64, v_alpha, absgrad, rows):
    """Back to front over a slice ``sub`` of P pixels of a tile, from its largest last_id down
    to row 0; adds to rows[j], the gradient row of the tile's row j (intersection k0 + j).

    last [P] int32 (-1: no contribution or outside); trans [P] T after the current Gaussian
    (starts at T_final); v_c [D, >= P] upstream colour gradients; v_a [P] (v_alpha -
    v_colors . background) * T_final; behind [P] float64 colour of the Gaussians behind,
    projected on v_c (starts 0); gauss, t_k, w, inv_1ma, dot, sub64, v_alpha [P] scratch.
    """
    n_pix = px.shape[0]
    f = trans[0]
    zero = like(f, 0.0)
    one = like(f, 1.0)
    skip = like(f, ALPHA_SKIP)
    clamp = like(f, ALPHA_CLAMP)
    k_max = -1
    for p in range(n_pix):
        k_max = max(k_max, last[p])
    for j in range(k_max - k0, -1, -1):
        if (sub < s_first[j]) | (sub > s_last[j]):
            continue
        mx = loc[j, 0]
        my = loc[j, 1]
        a = loc[j, 2]
        b = loc[j, 3]
        c = loc[j, 4]
        op = loc[j, 5]
        n_hit = np.int32(0)  # int32: an int64 sum would halve the vector width
        k = k0 + j
        k32 = np.int32(k)
        for p in range(n_pix):
            dx = mx - px[p]
            dy = my - py[p]
            s = sm.gaussian_sigma(a, b, c, dx, dy)
            ge = sm.exp_neg(s)
            alpha = min(clamp, op * ge)
            hit = (k32 <= last[p]) & (s >= zero) & (alpha >= skip)
            t = trans[p] / (one - alpha)
            trans[p] = t if hit else trans[p]
            t_k[p] = t if hit else zero  # t_k > 0 marks the pixels k contributes to
            gauss[p] = ge
            n_hit = np.int32(n_hit + (np.int32(1) if hit else np.int32(0)))
        if n_hit == 0:
            continue
        color_step(j, op, loc, v_c, v_a, gauss, t_k, w, inv_1ma, behind, dot, sub64, v_alpha,
                   False)
        pair_grads(j, mx, my, a, b, c, op, px, py, t_k, gauss, v_alpha, w, v_c, absgrad,
                       rows)


@njit(cache=True, error_model="numpy")
def tile_per_splat(loc, s_first, s_last, sub, k0, n_k, px, py, live, last, trans, v_c, v_a,
                   ahead, gauss, t_k, w, inv_1ma, dot, sub64, v_alpha, absgrad, rows):
    """Front to back over a slice ``sub`` of P pixels of a tile, replaying the forward's skip /
    stop decisions; adds to rows[j], the gradient row of the tile's row j (intersection
    k0 + j).

    live [P] int32; last [P] int32 the forward's last_ids (bound the replay only); trans [P]
    running T (starts 1); v_c [D, >= P] upstream colour gradients;
    v_a [P] v_alpha * T_final; ahead [P] float64 colour still to come, projected on v_c
    (starts at the forward's float64 colour, background included); gauss, t_k, w, inv_1ma,
    dot, sub64, v_alpha [P] scratch.
    """
    n_pix = px.shape[0]
    zero = like(trans[0], 0.0)
    # after the slice's last contribution (the largest last_id) nothing can hit: stop there
    k_max = -1
    for p in range(n_pix):
        k_max = max(k_max, last[p])
    j_end = min(n_k, k_max - k0 + 1)
    for j in range(j_end):
        if (sub < s_first[j]) | (sub > s_last[j]):
            continue
        mx = loc[j, 0]
        my = loc[j, 1]
        a = loc[j, 2]
        b = loc[j, 3]
        c = loc[j, 4]
        op = loc[j, 5]
        n_hit = np.int32(0)
        n_live = np.int32(0)  # int32 counters: an int64 sum would halve the vector width
        for p in range(n_pix):
            t = trans[p]
            ge, _, t_next, hit, stop = composite_step(a, b, c, op, mx - px[p], my - py[p], t,
                                                      live[p])
            trans[p] = t_next if hit else t
            live[p] = np.int32(0) if stop else live[p]
            t_k[p] = t if hit else zero  # t_k > 0 marks the pixels k contributes to
            gauss[p] = ge
            n_hit = np.int32(n_hit + (np.int32(1) if hit else np.int32(0)))
            n_live = np.int32(n_live + live[p])
        if n_hit > 0:
            color_step(j, op, loc, v_c, v_a, gauss, t_k, w, inv_1ma, ahead, dot, sub64, v_alpha,
                       True)
            pair_grads(j, mx, my, a, b, c, op, px, py, t_k, gauss, v_alpha, w, v_c, absgrad,
                       rows)
        if n_live == 0:
            break


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
    render_alphas,
    last_ids,
    v_colors_img,
    v_alphas_img,
    per_splat,
    absgrad,
    pos,
    part,
    bg_part,
):
    """Tiles first, first + step, ...; fills part [n, 8 + D], the gradient rows of the
    intersections, intersection k at row pos[k] (``group_by_gaussian``: each Gaussian's rows
    are then contiguous), and bg_part [n_tiles, D] (the tile's sum of v_render_colors *
    T_final). A tile sums its rows in a local buffer and writes each once. bounds [G, 4]:
    ``cull.splat_bounds``; max_len: the longest tile list; colors_lo [I, H, W, D] or [0, 0, 0,
    D]: the forward's rounding residual of render_colors (per_splat); trans_final [I, H, W] or
    [0, 0, 0]: the forward's final transmittances (per_pixel)."""
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
    s_first = np.empty(max_len, np.int32)
    s_last = np.empty(max_len, np.int32)
    n_sub = (n_pix + SUB_PIXELS - 1) // SUB_PIXELS
    gauss = np.empty(SUB_PIXELS, dt)
    t_k = np.empty(SUB_PIXELS, dt)
    w = np.empty(SUB_PIXELS, dt)
    inv_1ma = np.empty(SUB_PIXELS, dt)
    v_alpha = np.empty(SUB_PIXELS, dt)
    dot = np.empty(SUB_PIXELS, np.float64)
    sub64 = np.empty(SUB_PIXELS, np.float64)
    rows = np.zeros((max_len, part.shape[1]), dt)
    for t in range(first, n_tiles, step):
        img = t // (th * tw)
        rest = t - img * th * tw
        ty = rest // tw
        tx = rest - ty * tw
        start = offs[t]
        end = offs[t + 1] if t + 1 < n_tiles else n_isects
        px = np.empty(n_pix, dt)
        py = np.empty(n_pix, dt)
        live = np.empty(n_pix, np.int32)
        init_tile_pixels(tx, ty, tile_size, width, height, px, py, live)
        zero = like(px[0], 0.0)
        one = like(px[0], 1.0)
        t_final = np.ones(n_pix, dt)
        trans = np.ones(n_pix, dt)  # running T of the slice loops
        v_c = np.zeros((n_sub, n_ch, SUB_PIXELS), dt)
        v_a = np.zeros(n_pix, dt)
        last = np.full(n_pix, -1, np.int32)
        # the remaining colour projected on v_colors (color_step), float64: per_splat's is a
        # difference of nearly equal sums
        state = np.zeros(n_pix, np.float64)
        bg_dot = np.zeros(n_pix, dt)
        for d in range(n_ch):
            bg_part[t, d] = zero
        for p in range(n_pix):
            if live[p] != 0:
                x = tx * tile_size + p % tile_size
                y = ty * tile_size + p // tile_size
                sub, q = p // SUB_PIXELS, p % SUB_PIXELS
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
                    v_c[sub, d, q] = vcd
                    bg_part[t, d] += vcd * t_final[p]
                    if per_splat:
                        c_final = np.float64(render_colors[img, y, x, d])
                        if has_lo:
                            c_final += colors_lo[img, y, x, d]
                        state[p] += np.float64(vcd) * c_final
                    if has_bg:
                        bg_dot[p] += vcd * backgrounds[img, d]
        if (has_mask and not masks[img, ty, tx]) or end <= start:
            for k in range(start, end):
                part[pos[k], :] = zero
            continue
        n_k = gather_tile(means2d, conics, colors, opacities, flatten_ids, bounds, start, end,
                          tx, ty, tile_size, SUB_PIXELS, loc, s_first, s_last)
        for p in range(n_pix):
            # d loss / d alpha_k through render_alphas (and, per pixel, the background) is
            # this times T_final / (1 - alpha_k)
            if per_splat:
                v_a[p] = v_a[p] * t_final[p]
            else:
                v_a[p] = (v_a[p] - bg_dot[p]) * trans[p]
        rows[:n_k, :] = zero
        # slices of SUB_PIXELS pixels, each on its own; rows[j] sums them in slice order
        for sub in range(n_sub):
            lo = sub * SUB_PIXELS
            hi = min(n_pix, lo + SUB_PIXELS)
            m = hi - lo
            if live[lo:hi].sum() == 0:
                continue
            if per_splat:
                tile_per_splat(loc, s_first, s_last, sub, start, n_k, px[lo:hi], py[lo:hi],
                               live[lo:hi], last[lo:hi], trans[lo:hi], v_c[sub], v_a[lo:hi],
                               state[lo:hi],
                               gauss[:m], t_k[:m], w[:m], inv_1ma[:m], dot[:m], sub64[:m],
                               v_alpha[:m], absgrad,
                               rows)
            else:
                tile_per_pixel(loc, s_first, s_last, sub, start, px[lo:hi], py[lo:hi],
                               last[lo:hi], trans[lo:hi], v_c[sub], v_a[lo:hi], state[lo:hi],
                               gauss[:m], t_k[:m], w[:m], inv_1ma[:m], dot[:m], sub64[:m],
                               v_alpha[:m], absgrad,
                               rows)
        for j in range(n_k):
            part[pos[start + j], :] = rows[j, :]


@njit(cache=True, error_model="numpy")
def group_by_gaussian(flatten_ids, n_gauss):
    """CSR of intersections per Gaussian in increasing intersection order (a stable counting
    sort): Gaussian g owns positions first[g]:first[g + 1]; intersection k is at pos[k]."""
    first = np.zeros(n_gauss + 1, np.int64)
    for k in range(flatten_ids.shape[0]):
        first[flatten_ids[k] + 1] += 1
    for g in range(n_gauss):
        first[g + 1] += first[g]
    cursor = first[:-1].copy()
    pos = np.empty(flatten_ids.shape[0], np.int64)
    for k in range(flatten_ids.shape[0]):
        g = flatten_ids[k]
        pos[k] = cursor[g]
        cursor[g] += 1
    return first, pos


@njit(cache=True, error_model="numpy")
def reduce_one(part, first_row, v_means2d, v_conics, v_colors, v_opacities, v_abs, g, acc):
    """Sums Gaussian g's rows (contiguous, in increasing intersection order; acc: scratch
    [8 + D])."""
    n_cols = acc.shape[0]
    acc[:] = 0
    for j in range(first_row[g], first_row[g + 1]):
        for col in range(n_cols):
            acc[col] += part[j, col]
    v_means2d[g, 0] = acc[C_MX]
    v_means2d[g, 1] = acc[C_MY]
    v_conics[g, 0] = acc[C_A]
    v_conics[g, 1] = acc[C_B]
    v_conics[g, 2] = acc[C_C]
    v_opacities[g] = acc[C_OP]
    for d in range(n_cols - N_FIXED):
        v_colors[g, d] = acc[N_FIXED + d]
    if v_abs.shape[0] > 0:
        v_abs[g, 0] = acc[C_ABSX]
        v_abs[g, 1] = acc[C_ABSY]


@njit(nogil=True, cache=True, error_model="numpy")
def reduce_kernel(
    first, step, part, first_row, v_means2d, v_conics, v_colors, v_opacities, v_abs
):
    """Blocks first, first + step, ... of Gaussians; v_abs [G, 2] or [0, 2]."""
    n_gauss = v_means2d.shape[0]
    acc = np.zeros(part.shape[1], part.dtype)
    for blk in range(first, (n_gauss + BLOCK - 1) // BLOCK, step):
        for g in range(blk * BLOCK, min(n_gauss, (blk + 1) * BLOCK)):
            reduce_one(
                part, first_row, v_means2d, v_conics, v_colors, v_opacities, v_abs, g, acc
            )


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


# ---------------------------------------------------------------------------------------------
# launcher


def backward(
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
    render_colors: torch.Tensor,  # [I, H, W, D]
    render_alphas: torch.Tensor,  # [I, H, W, 1]
    last_ids: torch.Tensor,  # [I, H, W] int32
    v_render_colors: torch.Tensor,  # [I, H, W, D]
    v_render_alphas: torch.Tensor,  # [I, H, W, 1]
    absgrad: bool,
    scheme: str,
    extra: torch.Tensor | None,  # the forward's: [I, H, W] or [I, H, W, D]
) -> tuple[torch.Tensor | None, ...]:
    """Returns v_means2d [G, 2], v_conics [G, 3], v_colors [G, D], v_opacities [G],
    v_backgrounds [I, D] or None, absgrad_means2d [G, 2] or None. extra: what
    ``rasterize_fwd.forward`` kept for this scheme (per_pixel: the final transmittances;
    per_splat: the colours' rounding residual, None for float64 data)."""
    if scheme not in ("per_pixel", "per_splat"):
        raise ValueError(f"scheme must be 'per_pixel' or 'per_splat', got {scheme!r}")
    if scheme == "per_pixel" and extra is None:
        raise ValueError("the per_pixel backward needs the final transmittances its forward "
                         "kept (rasterize_fwd.forward with scheme='per_pixel')")
    n_img, th, tw = isect_offsets.shape
    n_gauss, n_ch = colors.shape
    n = flatten_ids.shape[0]
    dt = means2d.dtype
    np_dt = view(means2d).dtype
    first, pos = group_by_gaussian(view(flatten_ids), n_gauss)
    part = np.empty((n, N_FIXED + n_ch), np_dt)
    bg_part = np.empty((n_img * th * tw, n_ch), np_dt)
    bg = view(backgrounds) if backgrounds is not None else np.zeros((0, n_ch), np_dt)
    mk = view(masks) if masks is not None else np.zeros((0, 0, 0), np.bool_)
    parallel_for(
        backward_kernel,
        n_img * th * tw,
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
        splat_bounds(means2d, conics, opacities),
        max_tile_len(isect_offsets, n),
        view(render_colors),
        view(extra) if scheme == "per_splat" and extra is not None
        else np.zeros((0, 0, 0, n_ch), np_dt),
        view(extra) if scheme == "per_pixel" else np.zeros((0, 0, 0), np_dt),
        view(render_alphas).reshape(n_img, height, width),
        view(last_ids),
        view(v_render_colors),
        view(v_render_alphas).reshape(n_img, height, width),
        scheme == "per_splat",
        absgrad,
        pos,
        part,
        bg_part,
    )
    v_means2d = alloc((n_gauss, 2), dt)
    v_conics = alloc((n_gauss, 3), dt)
    v_colors = alloc((n_gauss, n_ch), dt)
    v_opacities = alloc((n_gauss,), dt)
    v_abs = alloc((n_gauss, 2), dt) if absgrad else None
    parallel_for(
        reduce_kernel,
        (n_gauss + BLOCK - 1) // BLOCK,
        part,
        first,
        view(v_means2d),
        view(v_conics),
        view(v_colors),
        view(v_opacities),
        view(v_abs) if v_abs is not None else np.zeros((0, 2), np_dt),
    )
    v_backgrounds = None
    if backgrounds is not None:
        v_backgrounds = alloc((n_img, n_ch), dt)
        reduce_backgrounds(bg_part, n_img, view(v_backgrounds))
    return v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, v_abs
