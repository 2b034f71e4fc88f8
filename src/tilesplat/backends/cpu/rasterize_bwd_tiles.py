"""CPU kernels: the backward of ``rasterize_to_pixels`` on one tile, both schemes
(``rasterize_bwd`` runs them tile by tile).

The tile walks its intersections in order (per_splat front to back, per_pixel back to front),
each in three vectorised loops: the pair and its hit test, T and 1 / (1 - alpha), and the colour
step (d loss / d alpha, in float64), over the pixels from the first group of GROUP_PIXELS the
forward flagged as contributing to the last (``rasterize_saved``); then :func:`pair_grads`
(sums over the pixels, the only place that may reassociate) over the span of whole slices
(SUB_PIXELS) from the first flagged slice to the last, with zeros where the pair loops did not
run. Skipping unflagged pixels is exact: their pairs change neither T nor any gradient. The
sums keep whole slices because their order is the compiled reduction's (lanes by position in
the span): a span cut to the groups would change their bits. Spans are whole slices, so the
sums have no remainder, and one span's sums take one horizontal reduction each (one per slice
took twice the time on garden).

A pixel-Gaussian pair contributes exactly when ``k <= last_id`` and it passes the skip tests
(sigma >= 0, alpha >= ALPHA_SKIP): before its last contribution a pixel is never stopped. So
per_splat replays the forward's transmittances bit for bit (``composite_step`` is the
forward's own arithmetic) without the forward's live mask.

d loss / d alpha_k of a pixel is T_k (v_c . c_k) + (v_a - S_k) / (1 - alpha_k), with S_k the
colour behind k projected on v_c and v_a the render_alphas / background share. The two colour
terms nearly cancel (a Gaussian as bright as what lies behind it), so the sum is formed in
float64 from float64 state. per_splat gets S_k as the forward's float64 colour (a sum of the
exact products w * c_d) minus w_j (v_c . c_j) for the rows j before k, in float64 (exact to
float64 rounding where it is a tiny difference of large sums); per_pixel sums S_k back to
front, each term as w_k (v_c . c_k).
The state is kept as S_k - v_a (v_a is constant per pixel), which saves two operations per pair.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...constants import ALPHA_CLAMP, ALPHA_SKIP
from ..shared.typed import like
from ._common import sm
from .rasterize_fwd import composite_step
from .rasterize_saved import GROUP_PIXELS, SUB_PIXELS

# Columns of the per-intersection gradient rows; colours follow from N_FIXED.
C_MX, C_MY, C_A, C_B, C_C, C_OP, C_ABSX, C_ABSY = range(8)
N_FIXED = 8

# Functions that only sum (no skip / stop decision depends on their rounding) may reassociate,
# which lets LLVM vectorise their reductions over the tile's pixels. The order of the sums is
# then fixed by the compiled code, never by the threads: results stay bit-identical.
SUMS = {"reassoc", "nsz"}

# ``forceinline``: :func:`pair_grads` and :func:`tile_rows` are inlined by LLVM (which, unlike
# Numba-IR inlining, keeps pair_grads' own fast-math flags) into the kernel, so the code that
# runs is the kernel's code, the same whether the kernel was just compiled or loaded from
# Numba's cache. As separate functions they were not: a process that compiled the kernel
# together with them did not run the code it wrote to the cache (whose copies of them were
# optimised again with the kernel), the reassociated sums came out in another order, and every
# first run after an install or upgrade gave colour gradients that differed from all later
# runs in the last bits (``tests/test_kernel_cache.py``). Inlined, the backward is also ~5 %
# faster.


# Rows of the tile's scratch buffer ``buf`` [N_BUF + D, P] (P pixels of the tile): the
# per-pair helpers get this one array and scalars. A compiled call increments and decrements
# the reference count of every array it passes (locked instructions on memory the threads
# share), once per call: per (slice, intersection) pair, that cost as much as the arithmetic.
R_PX, R_PY, R_GAUSS, R_VALPHA, R_W, R_TK, R_INV = range(7)
N_BUF = 7  # v_c [D, P] follows: rows N_BUF + d


@njit(cache=True, fastmath=SUMS, forceinline=True, error_model="numpy")
def pair_grads(j, p0, p1, mx, my, a, b, c, op, buf, v_c, absgrad, rows):
    """Writes the gradient of intersection j from pixels p0 <= p < p1 (uint64) to rows[j]:
    means2d, conic, opacity and colour (w * v_c), summed over the pixels, and (absgrad)
    |d loss / d means2d|. buf [N_BUF + D, P]: pixel centres, exp(-sigma), v_alpha (0 where the
    pair does not contribute or alpha is clamped), w = alpha T_k, and v_c [D, P] (the R_*
    rows)."""
    f = buf[0, 0]
    zero = like(f, 0.0)
    half = like(f, 0.5)
    # d loss / d means2d = sum of v_s (a dx + b dy, b dx + c dy) = (a X + b Y, b X + c Y) with
    # X, Y the sums of v_s dx, v_s dy: the conic leaves the pixel loop (absgrad needs it in)
    s_x = s_y = s_xx = s_xy = s_yy = s_op = s_ax = s_ay = zero
    for p in range(p0, p1):
        dx = mx - buf[R_PX, p]
        dy = my - buf[R_PY, p]
        vg = buf[R_VALPHA, p] * buf[R_GAUSS, p]
        v_s = -op * vg  # d loss / d sigma
        vx = v_s * dx
        vy = v_s * dy
        s_x += vx
        s_y += vy
        s_xx += vx * dx
        s_xy += vx * dy
        s_yy += vy * dy
        s_op += vg
        if absgrad:  # loop-invariant: compiled as two loops
            s_ax += abs(a * vx + b * vy)
            s_ay += abs(b * vx + c * vy)
    rows[j, C_MX] = a * s_x + b * s_y
    rows[j, C_MY] = b * s_x + c * s_y
    rows[j, C_A] = half * s_xx
    rows[j, C_B] = s_xy
    rows[j, C_C] = half * s_yy
    rows[j, C_OP] = s_op
    rows[j, C_ABSX] = s_ax
    rows[j, C_ABSY] = s_ay
    w = buf[R_W]
    for d in range(v_c.shape[0]):
        s_col = zero
        for p in range(p0, p1):
            s_col += w[p] * v_c[d, p]
        rows[j, N_FIXED + d] = s_col


# The colour step: no fast-math (per_splat replays the forward's weights bit for bit). Each
# scheme has its own loop: a scheme test inside one loop kept LLVM from vectorising it.
@njit(cache=True, inline="always", error_model="numpy")
def color_px(ar, t, r, v0, v1, v2, c0, c1, c2, st, per_splat):
    """One pixel of the RGB colour step (scalars only: inlined into the pixel loops).
    ar = opacity * exp(-sigma), t = T_k (0: no contribution), r = 1 / (1 - alpha), v0..v2 the
    pixel's float64 upstream colour gradient, c0..c2 the colour, st its colour state
    (``tile_rows``). Returns (w = alpha T_k, d loss / d alpha (0 where the pair does not
    contribute or alpha is clamped), the new state). per_splat: a literal."""
    clamp = like(t, ALPHA_CLAMP)
    zero = like(t, 0.0)
    f64 = np.float64
    wp = min(clamp, ar) * t  # the forward's weight; 0 where not hit (t_k = 0)
    dot = v0 * f64(c0) + v1 * f64(c1) + v2 * f64(c2)
    if per_splat:  # the forward summed the exact products w * c_d in float64
        behind = st - f64(wp) * dot
        st_new = behind
    else:
        behind = st
        st_new = behind + f64(wp) * dot
    v = like(t, f64(t) * dot - behind * f64(r))
    return wp, (v if (t > zero) & (ar <= clamp) else zero), st_new


@njit(cache=True, forceinline=True, error_model="numpy")
def tile_rows(loc, flags, k0, j_end, last, trans, v_c64, state, buf, dot, absgrad, per_splat,
              rows):
    """A tile's P pixels (whole slices of SUB_PIXELS): writes rows[k0 + j], the gradient of the
    tile's rows j < j_end (intersection k0 + j; rows: the kernel's ``part``) that the forward
    flagged (the others' rows are left as they are: ``rasterize_bwd.sum_rows_kernel`` leaves
    them out of the sums), each evaluated from the first to the last group of pixels the forward
    flagged for it and summed over the slices of those (unflagged pixels inside change
    nothing: none of their pairs contributes). per_pixel walks back to front from j_end - 1,
    per_splat front to back. One row's sums run over its whole span at once: one horizontal
    reduction per row and quantity, not one per slice.

    flags [n, n_sub] the forward's; last [P] int32 its last_ids (-1: none, or outside);
    trans [P]: per_pixel T after the current Gaussian (starts at the forward's T_final),
    per_splat running T (starts 1); v_c64 [3, P] float64 upstream colour gradients (RGB);
    state [P] float64, the colour state, less v_a (d loss / d alpha_k through render_alphas,
    and per_pixel the background, times 1 - alpha_k: constant per pixel): per_pixel the colour
    behind row j projected on v_c (starts at -v_a, updated after row j), per_splat the colour
    still to come (starts at the forward's float64 colour projected on v_c, less v_a; row j's
    contribution w (v_c . c_j) subtracted first, in float64). Then
    d loss / d alpha_j = T_j (v_c . c_j) - state / (1 - alpha_j) (per_splat: after the
    subtraction). buf [N_BUF + D, P]: the caller fills the pixel centres (R_PX, R_PY) and v_c
    (rows N_BUF + d), the rest is scratch; dot [P] float64 scratch (D != 3).
    """
    n_ch = buf.shape[0] - N_BUF
    px, py, gauss, v_alpha = buf[R_PX], buf[R_PY], buf[R_GAUSS], buf[R_VALPHA]
    w, t_k, inv_1ma = buf[R_W], buf[R_TK], buf[R_INV]
    v_c = buf[N_BUF:]
    f = trans[0]
    zero = like(f, 0.0)
    one = like(f, 1.0)
    skip = like(f, ALPHA_SKIP)
    clamp = like(f, ALPHA_CLAMP)
    live = np.int32(1)
    f64 = np.float64
    n_sub = flags.shape[1]
    for i in range(j_end):
        j = i if per_splat else j_end - 1 - i
        s_lo = -1
        s_hi = -1
        for sub in range(n_sub):
            if flags[k0 + j, sub] != 0:
                s_lo = sub if s_lo < 0 else s_lo
                s_hi = sub
        if s_lo < 0:
            continue
        # unsigned: NumPy's wrap-around of negative indices would keep LLVM from seeing
        # contiguous accesses (it gathered); spans are whole slices, so no loop remainder
        p0 = np.uint64(s_lo * SUB_PIXELS)
        p1 = np.uint64((s_hi + 1) * SUB_PIXELS)
        # the pixels from the first flagged group to the last: the pair pass and the colour
        # step run on those, the sums on the whole span (their order stays the span's)
        g_lo = np.int64(flags[k0 + j, s_lo])
        g_hi = np.int64(flags[k0 + j, s_hi])
        first = 0
        while (g_lo >> first) & 1 == 0:
            first += 1
        end = 8
        while (g_hi >> (end - 1)) & 1 == 0:
            end -= 1
        q0 = np.uint64(s_lo * SUB_PIXELS + first * GROUP_PIXELS)
        q1 = np.uint64(s_hi * SUB_PIXELS + end * GROUP_PIXELS)
        for p in range(p0, q0):  # no contribution: what the skipped loops would have written
            v_alpha[p] = zero
            w[p] = zero
        for p in range(q1, p1):
            v_alpha[p] = zero
            w[p] = zero
        mx, my, a, b, c, op = loc[j, 0], loc[j, 1], loc[j, 2], loc[j, 3], loc[j, 4], loc[j, 5]
        k32 = np.int32(k0 + j)
        if per_splat:
            for p in range(q0, q1):
                t = trans[p]
                ge, alpha, t_next, ok, _ = composite_step(a, b, c, op, mx - px[p], my - py[p],
                                                          t, live)
                hit = ok & (k32 <= last[p])
                trans[p] = t_next if hit else t
                t_k[p] = t if hit else zero  # t_k > 0 marks the pixels k contributes to
                inv_1ma[p] = one / (one - alpha)
                gauss[p] = ge
        else:
            for p in range(q0, q1):
                s = sm.gaussian_sigma(a, b, c, mx - px[p], my - py[p])
                ge = sm.exp_neg(s)
                alpha = min(clamp, op * ge)
                hit = (k32 <= last[p]) & (s >= zero) & (alpha >= skip)
                t = trans[p] / (one - alpha)
                trans[p] = t if hit else trans[p]
                t_k[p] = t if hit else zero
                inv_1ma[p] = one / (one - alpha)
                gauss[p] = ge
        if n_ch == 3:
            c0, c1, c2 = loc[j, 6], loc[j, 7], loc[j, 8]
            if per_splat:
                for p in range(q0, q1):
                    wp, vap, st = color_px(op * gauss[p], t_k[p], inv_1ma[p],
                                           v_c64[0, p], v_c64[1, p], v_c64[2, p], c0, c1, c2,
                                           state[p], True)
                    w[p], v_alpha[p], state[p] = wp, vap, st
            else:
                for p in range(q0, q1):
                    wp, vap, st = color_px(op * gauss[p], t_k[p], inv_1ma[p],
                                           v_c64[0, p], v_c64[1, p], v_c64[2, p], c0, c1, c2,
                                           state[p], False)
                    w[p], v_alpha[p], state[p] = wp, vap, st
        else:  # any channel count
            for p in range(q0, q1):
                w[p] = min(clamp, op * gauss[p]) * t_k[p]
                dot[p] = 0.0
            for d in range(n_ch):
                cd = loc[j, 6 + d]
                for p in range(q0, q1):
                    vd = f64(buf[N_BUF + d, p])
                    dot[p] += vd * f64(cd)
            for p in range(q0, q1):
                behind = state[p] - f64(w[p]) * dot[p] if per_splat else state[p]
                state[p] = behind if per_splat else state[p] + f64(w[p]) * dot[p]
                t = t_k[p]
                v = like(t, f64(t) * dot[p] - behind * f64(inv_1ma[p]))
                v_alpha[p] = v if (t > zero) & (op * gauss[p] <= clamp) else zero
        pair_grads(k32, p0, p1, mx, my, a, b, c, op, buf, v_c, absgrad, rows)
