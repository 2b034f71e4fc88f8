"""CPU kernels: the structural similarity index (``ssim``), fused, with an analytic backward.

The reference (``backends/torch/ssim.py``) blurs five moments (x, y, x², y², xy) with a
separable Gaussian window and combines them per pixel; autograd then runs the convolutions
backwards. Here one work item is a block of ``ROWS`` output rows of one image plane (image ×
channel): the item loads its input rows channel by channel into contiguous rows, filters
them horizontally into a small buffer, vertically into the five moment rows, and forms the
SSIM and, when a gradient is wanted, its partial derivatives with respect to the moments
(kept per pixel, [P, 3 or 4, Ho, Wo]). The backward is the transposed filter of those maps:
with the window w, the mean SSIM S̄ over M pixels and the partials g of a pixel p,

    d S̄ / d x_q = (1/M) Σ_p w(p − q) (g_μx(p) + 2 x'_q g_xx(p) + y'_q g_xy(p)),

one transposed (zero-padded) separable filter per map, over blocks of input rows (the
moments are of the shifted images x' = x − SHIFT, y' = y − SHIFT; see SHIFT).

Every inner loop runs over a contiguous row, so it vectorises (no reassociation needed): the
taps outside it, or, for the usual window of 11, unrolled inside it in the same order (each
output then stays in a register: 1.4x faster at 1,297x840). Every output element is written
by one item in a fixed order and the per-item sums of the SSIM are added in item order, so the
result does not depend on the thread count. Sums use the images' dtype, as the reference's
convolutions do; the mean accumulates in float64.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit

from ...constants import SSIM_C1, SSIM_C2
from ..shared.typed import like
from ..torch.ssim import gaussian_window
from ._common import alloc, parallel_for, view

ROWS = 32  # output rows per work item: the item refilters ROWS + k - 1 input rows
# The moments are taken of x - SHIFT and y - SHIFT (SSIM's variances and covariance do not
# change; the means get SHIFT back in float64): for images in [0, 1] the float32 sums of
# squares then cancel far less in var = E[x'^2] - E[x']^2 (on three renders of the built-in
# scene the reference's float32 SSIM was 0.02-3.5e-6 off its float64 value, this kernel's
# 0.3-1.4e-6; without the shift 3.9-7.7e-6)
SHIFT = 0.5

# partial-derivative maps kept by the forward: d S / d (mu_x, e_xx (= e_yy), e_xy, mu_y)
MAP_MU_X, MAP_VAR, MAP_COV, MAP_MU_Y = 0, 1, 2, 3

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def _filter_row(src, w, dst):
    """dst[j] = Σ_t w[t] src[j + t] (a 'valid' correlation; dst [n], src [n + k - 1]), the
    taps in order: :func:`_filter_row11` for 11 of them, else :func:`_filter_row_any`."""
    if w.shape[0] == 11:
        _filter_row11(src, w, dst)
    else:
        _filter_row_any(src, w, dst)


@njit(cache=True, error_model="numpy")
def _filter_column(rows, w, dst):
    """dst[j] = Σ_t w[t] rows[t, j] (the vertical half; rows [k, n], dst [n]), the taps in
    order: :func:`_filter_column11` for 11 of them, else :func:`_filter_column_any`."""
    if w.shape[0] == 11:
        _filter_column11(rows, w, dst)
    else:
        _filter_column_any(rows, w, dst)


@njit(cache=True, error_model="numpy")
def _filter_row_any(src, w, dst):
    """:func:`_filter_row` for any number of taps (the taps outside the loop)."""
    n = dst.shape[0]
    for j in range(n):
        dst[j] = 0.0
    for t in range(w.shape[0]):
        wt = w[t]
        for j in range(n):
            dst[j] += wt * src[j + t]


@njit(cache=True, error_model="numpy")
def _filter_column_any(rows, w, dst):
    """:func:`_filter_column` for any number of taps (the taps outside the loop)."""
    n = dst.shape[0]
    for j in range(n):
        dst[j] = 0.0
    for t in range(w.shape[0]):
        wt = w[t]
        row = rows[t]
        for j in range(n):
            dst[j] += wt * row[j]


@njit(cache=True, error_model="numpy")
def _filter_row11(src, w, dst):
    """:func:`_filter_row` for a window of 11 taps, in the same order: the taps are unrolled,
    so each output stays in a register (not re-read and re-written once per tap)."""
    w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10 = (w[0], w[1], w[2], w[3], w[4], w[5], w[6],
                                                   w[7], w[8], w[9], w[10])
    zero = like(w0, 0.0)
    for j in range(dst.shape[0]):
        acc = zero + w0 * src[j]
        acc += w1 * src[j + 1]
        acc += w2 * src[j + 2]
        acc += w3 * src[j + 3]
        acc += w4 * src[j + 4]
        acc += w5 * src[j + 5]
        acc += w6 * src[j + 6]
        acc += w7 * src[j + 7]
        acc += w8 * src[j + 8]
        acc += w9 * src[j + 9]
        acc += w10 * src[j + 10]
        dst[j] = acc


@njit(cache=True, error_model="numpy")
def _filter_column11(rows, w, dst):
    """:func:`_filter_column` for a window of 11 taps, in the same order (unrolled)."""
    w0, w1, w2, w3, w4, w5, w6, w7, w8, w9, w10 = (w[0], w[1], w[2], w[3], w[4], w[5], w[6],
                                                   w[7], w[8], w[9], w[10])
    r0, r1, r2, r3, r4, r5 = rows[0], rows[1], rows[2], rows[3], rows[4], rows[5]
    r6, r7, r8, r9, r10 = rows[6], rows[7], rows[8], rows[9], rows[10]
    zero = like(w0, 0.0)
    for j in range(dst.shape[0]):
        acc = zero + w0 * r0[j]
        acc += w1 * r1[j]
        acc += w2 * r2[j]
        acc += w3 * r3[j]
        acc += w4 * r4[j]
        acc += w5 * r5[j]
        acc += w6 * r6[j]
        acc += w7 * r7[j]
        acc += w8 * r8[j]
        acc += w9 * r9[j]
        acc += w10 * r10[j]
        dst[j] = acc


@njit(cache=True, error_model="numpy")
def _moments(mom, j):
    """(mu_x, mu_y, var_x, var_y, cov, mu_x', mu_y') in float64 at column j of the moment
    rows mom [5, Wo] of the shifted images (x' = x - SHIFT)."""
    sx = np.float64(mom[0, j])
    sy = np.float64(mom[1, j])
    var_x = np.float64(mom[2, j]) - sx * sx
    var_y = np.float64(mom[3, j]) - sy * sy
    cov = np.float64(mom[4, j]) - sx * sy
    return sx + SHIFT, sy + SHIFT, var_x, var_y, cov, sx, sy


@njit(cache=True, error_model="numpy")
def _ssim_row(mom, srow, maps, p, o, n_maps):
    """SSIM of one output row from its moments mom [5, Wo] (of x', y', x'², y'², x'y') into
    srow [Wo] (float64), and the partials with respect to those moments into maps[p, :, o]
    when n_maps > 0.

    The per-pixel formula runs in float64 (the moments are the images' dtype); the loops
    carry no reduction and no branch, so they vectorise."""
    if n_maps == 0:
        for j in range(mom.shape[1]):
            mx, my, var_x, var_y, cov, _, _ = _moments(mom, j)
            a = 2.0 * mx * my + SSIM_C1
            b = 2.0 * cov + SSIM_C2
            c = mx * mx + my * my + SSIM_C1
            d = var_x + var_y + SSIM_C2
            srow[j] = a * b / (c * d)
        return
    for j in range(mom.shape[1]):
        mx, my, var_x, var_y, cov, sx, sy = _moments(mom, j)
        a = 2.0 * mx * my + SSIM_C1
        b = 2.0 * cov + SSIM_C2
        c = mx * mx + my * my + SSIM_C1
        d = var_x + var_y + SSIM_C2
        den = c * d
        s = a * b / den
        srow[j] = s
        inv = 1.0 / den
        d_a = b * inv
        d_b = a * inv
        d_c = -(s * d) * inv
        d_d = -(s * c) * inv
        # d/d mu_x' of A, C (through mu_x = mu_x' + SHIFT) and of cov, var_x (through mu_x')
        maps[p, MAP_MU_X, o, j] = 2.0 * (my * d_a - sy * d_b + mx * d_c - sx * d_d)
        maps[p, MAP_VAR, o, j] = d_d
        maps[p, MAP_COV, o, j] = 2.0 * d_b
    if n_maps > 3:
        for j in range(mom.shape[1]):
            mx, my, var_x, var_y, cov, sx, sy = _moments(mom, j)
            a = 2.0 * mx * my + SSIM_C1
            b = 2.0 * cov + SSIM_C2
            c = mx * mx + my * my + SSIM_C1
            d = var_x + var_y + SSIM_C2
            den = c * d
            s = srow[j]
            maps[p, MAP_MU_Y, o, j] = 2.0 * (mx * b / den - sx * a / den - my * s / c
                                             + sy * s / d)


@njit(cache=True, error_model="numpy")
def _row_sum(srow):
    """Σ srow in a fixed order: four interleaved partial sums, then added in order."""
    s0 = 0.0
    s1 = 0.0
    s2 = 0.0
    s3 = 0.0
    n = srow.shape[0]
    n4 = n - n % 4
    for j in range(0, n4, 4):
        s0 += srow[j]
        s1 += srow[j + 1]
        s2 += srow[j + 2]
        s3 += srow[j + 3]
    for j in range(n4, n):
        s0 += srow[j]
    return (s0 + s1) + (s2 + s3)


@njit(nogil=True, cache=True, error_model="numpy")
def forward_kernel(first, step, x, y, w, n_blocks, n_maps, maps, sums):
    """Items first, first + step, ... of (plane, block of ROWS output rows).

    x, y [B, H, W, C]; w [k]; maps [P, n_maps, Ho, Wo] (unused when n_maps is 0);
    sums [items] float64: the SSIM summed over each item's pixels.
    """
    _, h, wd, nc = x.shape
    k = w.shape[0]
    ho = h - k + 1
    wo = wd - k + 1
    shift = like(x[0, 0, 0, 0], SHIFT)
    src = np.empty((5, wd), x.dtype)
    hbuf = np.empty((5, ROWS + k - 1, wo), x.dtype)
    mom = np.empty((5, wo), x.dtype)
    srow = np.empty(wo, np.float64)
    for item in range(first, sums.shape[0], step):
        p = item // n_blocks
        o0 = (item - p * n_blocks) * ROWS
        o1 = min(ho, o0 + ROWS)
        b = p // nc
        ch = p - b * nc
        for i in range(o1 - o0 + k - 1):
            r = o0 + i
            for j in range(wd):
                xv = x[b, r, j, ch] - shift
                yv = y[b, r, j, ch] - shift
                src[0, j] = xv
                src[1, j] = yv
                src[2, j] = xv * xv
                src[3, j] = yv * yv
                src[4, j] = xv * yv
            for m in range(5):
                _filter_row(src[m], w, hbuf[m, i])
        acc = 0.0
        for o in range(o0, o1):
            for m in range(5):
                _filter_column(hbuf[m, o - o0:o - o0 + k], w, mom[m])
            _ssim_row(mom, srow, maps, p, o, n_maps)
            acc += _row_sum(srow)
        sums[item] = acc


@njit(nogil=True, cache=True, error_model="numpy")
def backward_kernel(first, step, x, y, w, maps, n_blocks, scale, want_x, want_y, v_x, v_y):
    """Items first, first + step, ... of (plane, block of ROWS input rows): v_x, v_y
    [B, H, W, C] (each written when wanted) = scale × the transposed filter of the maps."""
    n_planes = maps.shape[0]
    _, h, wd, nc = x.shape
    k = w.shape[0]
    ho = h - k + 1
    wo = wd - k + 1
    n_maps = maps.shape[1]
    two = like(scale, 2.0)
    shift = like(scale, SHIFT)
    # vertical pass of each map into the middle of a zero-padded row, then the horizontal
    pad = np.zeros((n_maps, wo + 2 * (k - 1)), x.dtype)
    g = np.empty((n_maps, wd), x.dtype)
    wr = w[::-1].copy()  # g[j] = Σ_t w[t] pad[j - t + k - 1] = Σ_u wr[u] pad[j + u]
    for item in range(first, n_planes * n_blocks, step):
        p = item // n_blocks
        q0 = (item - p * n_blocks) * ROWS
        q1 = min(h, q0 + ROWS)
        b = p // nc
        ch = p - b * nc
        for q in range(q0, q1):
            # the output rows o = q - t that input row q fed: t in [t_lo, t_hi]
            t_lo = max(0, q - ho + 1)
            t_hi = min(k - 1, q)
            for m in range(n_maps):
                mid = pad[m, k - 1:k - 1 + wo]
                if t_lo == 0 and t_hi == k - 1:
                    # rows q - k + 1 .. q with the reversed window: t = k - 1 .. 0, the same
                    # order (and the unrolled filter for 11 taps)
                    _filter_column(maps[p, m, q - k + 1:q + 1], wr, mid)
                else:
                    _transposed_column(maps, p, m, q, t_lo, t_hi, w, mid)
                _filter_row(pad[m], wr, g[m])
            for j in range(wd):
                xv = x[b, q, j, ch] - shift
                yv = y[b, q, j, ch] - shift
                if want_x:
                    v_x[b, q, j, ch] = scale * (g[MAP_MU_X, j] + two * xv * g[MAP_VAR, j]
                                                + yv * g[MAP_COV, j])
                if want_y:
                    v_y[b, q, j, ch] = scale * (g[MAP_MU_Y, j] + two * yv * g[MAP_VAR, j]
                                                + xv * g[MAP_COV, j])


@njit(cache=True, error_model="numpy")
def _transposed_column(maps, p, m, q, t_lo, t_hi, w, dst):
    """dst[j] = Σ_{t = t_hi .. t_lo} w[t] maps[p, m, q - t, j] (output rows in increasing
    order), the vertical half of the transposed filter for input row q."""
    n = dst.shape[0]
    for j in range(n):
        dst[j] = 0.0
    for t in range(t_hi, t_lo - 1, -1):
        wt = w[t]
        row = maps[p, m, q - t]
        for j in range(n):
            dst[j] += wt * row[j]


# ---------------------------------------------------------------------------------------------
# launchers


def _window(img: torch.Tensor, window_size: int, sigma: float) -> np.ndarray:
    """The reference's 1D window [window_size] in img's dtype, made once per size, sigma and
    dtype (a training step asks for it twice); the kernels only read it."""
    return _windows(window_size, sigma, img.dtype)


@functools.lru_cache(maxsize=8)
def _windows(window_size: int, sigma: float, dtype: torch.dtype) -> np.ndarray:
    return view(gaussian_window(window_size, sigma, dtype, torch.device("cpu")))


def forward(
    img1: torch.Tensor,  # [B, H, W, C]
    img2: torch.Tensor,  # [B, H, W, C]
    window_size: int,
    sigma: float,
    needs_grad: tuple[bool, bool],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns the mean SSIM [] and, when a gradient is wanted, the partial-derivative maps
    [B*C, 3 or 4, Ho, Wo] the backward filters (4 when img2's gradient is wanted)."""
    B, H, W, C = img1.shape
    ho, wo = H - window_size + 1, W - window_size + 1
    n_blocks = (ho + ROWS - 1) // ROWS
    n_items = B * C * n_blocks
    n_maps = 0 if not any(needs_grad) else (4 if needs_grad[1] else 3)
    maps = alloc((B * C, n_maps, ho, wo), img1.dtype)
    sums = np.empty(n_items, np.float64)
    parallel_for(forward_kernel, n_items, view(img1), view(img2), _window(img1, window_size, sigma),
                 n_blocks, n_maps, view(maps), sums)
    total = 0.0
    for s in sums:  # item order: independent of the thread count
        total += float(s)
    mean = torch.tensor(total / (B * C * ho * wo), dtype=img1.dtype)
    return mean, (maps if n_maps else None)


def backward(
    img1: torch.Tensor,  # [B, H, W, C]
    img2: torch.Tensor,  # [B, H, W, C]
    maps: torch.Tensor,  # [B*C, 3 or 4, Ho, Wo] from forward
    window_size: int,
    sigma: float,
    v_ssim: torch.Tensor,  # []
    needs_grad: tuple[bool, bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Returns (v_img1, v_img2) [B, H, W, C], None where not wanted."""
    B, H, W, C = img1.shape
    _, _, ho, wo = maps.shape
    want_x, want_y = needs_grad
    want_y = want_y and maps.shape[1] > MAP_MU_Y
    v1 = alloc(tuple(img1.shape), img1.dtype) if want_x else None
    v2 = alloc(tuple(img1.shape), img1.dtype) if want_y else None
    empty = np.zeros((0, 0, 0, 0), view(img1).dtype)
    n_blocks = (H + ROWS - 1) // ROWS
    scale = view(img1).dtype.type(float(v_ssim) / (B * C * ho * wo))
    parallel_for(backward_kernel, B * C * n_blocks, view(img1), view(img2),
                 _window(img1, window_size, sigma), view(maps), n_blocks, scale, want_x, want_y,
                 view(v1) if v1 is not None else empty, view(v2) if v2 is not None else empty)
    return v1, v2
