"""CUDA kernel: backward of ``rasterize_to_pixels_2dgs`` (surfels), the ``per_pixel`` scheme.

One block per tile, one thread per pixel, as the 3DGS ``per_pixel`` backward
(``rasterize_bwd``): batches of the tile's surfels are loaded into shared memory back to
front; each pixel starts at its last contributor with the final transmittance the forward
kept and recovers T before each surfel by dividing by (1 - alpha). The math is the CPU
kernel's (``cpu/twodgs_rasterize_bwd.py``, whose docstring derives it): with weights
w_i = alpha_i T_i, d loss / d alpha_k = T_k q_k - (sum_{i>k} w_i q_i + T_final (v_colors .
background - v_alphas)) / (1 - alpha_k), q_i = d loss / d w_i including the distortion's
terms, whose sums in front of a surfel come from 1 - T and the forward's total of w d. The
pixel's sums and the gradient rows are float64.

Each pair's gradient is a row of ``V_COLOR + D`` float64 values: mean, opacity, the gradients
of the crosses a, b, c (sum of p_x v_cross, p_y v_cross, v_cross), normal, |d loss / d
pixel| (absgrad), colour. A full warp sums a surfel's rows by a transpose reduction (each
shuffle step halves the columns a lane holds, so lane l ends with column l: 31 shuffles for
32 columns instead of 5 per column; a partial warp, when tile_size**2 is not a multiple of 32,
sums by a tree to lane 0). Then each lane either adds its column to the surfel's row with a
float64 atomic (default) or, with the ``deterministic`` option, stores it in the row
``intersection * n_warps + warp`` of its own (one writer per element: plain stores, no
atomics), which ``segment.segment_sum`` reduces in a fixed order. The launcher turns the
crosses' gradients into the ray transforms' and the densify gradient (``twodgs``). A warp
skips a surfel none of its lanes needs and starts each batch at its largest last id.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER
from . import raster_limits
from .runtime import jit
from .twodgs_rasterize_fwd import (
    FILTER_INV_SQUARE,
    S_A,
    S_B,
    S_NRM,
    S_OP,
    S_ROW,
    device_load_surfel,
    device_surfel_pair,
)

# columns of a gradient row (float64); colours follow from V_COLOR. The gradient of the
# shifted pixel (-densify) is not a column: summed over pixels it is -v_mean + (a, b) . v_c,
# from the columns (the launcher's), as a and b are the surfel's own.
V_MX, V_MY, V_OP, V_A, V_B, V_C, V_NRM, V_ABS, V_COLOR = 0, 1, 2, 3, 6, 9, 12, 15, 17
WARP = 32


def n_warps(tile_size: int) -> int:
    """Warps of a block (rows per intersection of the deterministic variant)."""
    return (tile_size * tile_size + 31) // 32


def make_rasterize_2dgs_bwd(ft: type, tile_size: int, channels: int, det: bool = False):
    """The Python body of the 2DGS backward kernel; with ``det`` each warp's sum is stored in
    the row ``intersection * n_warps + warp`` of ``part`` ([n * n_warps, K]) instead of
    added to the surfel's row ([G, K])."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    warps = n_warps(tile_size)
    n_cols = V_COLOR + channels
    n_chunks = (n_cols + WARP - 1) // WARP  # the columns in chunks of one per lane
    n_padded = n_chunks * WARP
    one = ft(1.0)
    clamp = ft(ALPHA_CLAMP)
    skip = ft(ALPHA_SKIP)
    center = float(PIXEL_CENTER)
    f64 = np.float64

    def rasterize_2dgs_bwd(
        means2d, rays, colors, opacities, normals, densify,  # [G,2], [G,3,3], [G,D], [G], ..
        backgrounds, has_bg, masks, has_mask,  # [I, D], [I, TH, TW] bool (or placeholders)
        width, height, offsets, flatten_ids, n_isects,  # [I * TH * TW], [n] int32
        image0, n_images,  # first image of this launch, all images
        trans_final, last_ids, median_ids, wd,  # the forward's [I, H, W]: ft, i32, i32, f64
        v_colors, v_alphas, v_normals,  # [I, H, W, D], [I, H, W, 1], [I, H, W, 3]
        v_distort, v_median,  # [I, H, W, 1]
        part,  # output, zero-filled float64: [G, K], or [n * n_warps, K] with det
    ):  # fmt: skip
        s_id = cuda.shared.array(batch, np.int32)
        s_geo = cuda.shared.array((batch, S_ROW), np.float64)
        s_warp_bin = cuda.shared.array(warps, np.int32)
        vals = cuda.local.array(n_padded, np.float64)
        v_c = cuda.local.array(channels, np.float64)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = image0 + cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        if has_mask and not masks[image, tile_y, tile_x]:
            return  # uniform per block
        rank = cuda.threadIdx.y * tile_size + cuda.threadIdx.x
        lane = rank % 32
        lanes = min(32, block - (rank - lane))  # the last warp may be partial
        mask = np.uint32((np.uint64(1) << np.uint64(lanes)) - np.uint64(1))
        px = tile_x * tile_size + cuda.threadIdx.x
        py = tile_y * tile_size + cuda.threadIdx.y
        inside = px < width and py < height
        pxc = min(px, width - 1)
        pyc = min(py, height - 1)
        fx = f64(px) + center
        fy = f64(py) + center

        tile = (image * th + tile_y) * tw + tile_x
        start = offsets[tile]
        end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]

        t_fin = trans_final[image, pyc, pxc]
        T = t_fin
        bin_final = last_ids[image, pyc, pxc] if inside else -1
        med = median_ids[image, pyc, pxc]
        wd_total = wd[image, pyc, pxc]
        bg_dot = 0.0
        for k in range(channels):
            v_c[k] = f64(v_colors[image, pyc, pxc, k])
            if has_bg:
                bg_dot += v_c[k] * f64(backgrounds[image, k])
        vn0 = f64(v_normals[image, pyc, pxc, 0])
        vn1 = f64(v_normals[image, pyc, pxc, 1])
        vn2 = f64(v_normals[image, pyc, pxc, 2])
        tail = f64(t_fin) * (bg_dot - f64(v_alphas[image, pyc, pxc, 0]))
        v_dist = f64(v_distort[image, pyc, pxc, 0])
        v_med = f64(v_median[image, pyc, pxc, 0])
        behind = 0.0  # sum over the surfels behind of w q
        r_w = 0.0  # sum of w behind
        b_wd = 0.0  # sum of w d behind

        if lane == 0:
            s_warp_bin[rank // 32] = -1
        cuda.syncthreads()
        cuda.atomic.max(s_warp_bin, rank // 32, bin_final)
        cuda.syncthreads()
        warp_bin = s_warp_bin[rank // 32]

        n_batches = (end - start + batch - 1) // batch
        for b in range(n_batches):
            cuda.syncthreads()
            batch_end = end - 1 - batch * b
            size = min(batch, batch_end + 1 - start)
            idx = batch_end - rank
            if rank < batch and idx >= start:
                g = flatten_ids[idx]
                s_id[rank] = g
                device_load_surfel(s_geo, rank, g, means2d, rays, opacities, normals, densify)
            cuda.syncthreads()
            t0 = max(0, batch_end - warp_bin)
            for t in range(t0, size):
                isect = batch_end - t
                valid = inside and isect <= bin_final
                ok = False
                sigma = 0.0
                ge = one
                ar = one
                alpha = one
                sx = sy = dx = dy = s_u = s_v = pick = 0.0
                cz = 1.0
                if valid:
                    ok, sigma, sx, sy, dx, dy, s_u, s_v, cz, pick = device_surfel_pair(
                        s_geo, t, fx, fy)
                    ge = math.exp(-ft(sigma))
                    ar = ft(s_geo[t, S_OP]) * ge
                    alpha = min(clamp, ar)
                    if not ok or sigma < 0.0 or alpha < skip:
                        valid = False
                if not cuda.any_sync(mask, valid):
                    continue
                for k in range(n_padded):
                    vals[k] = 0.0
                g = s_id[t]
                if valid:
                    t_k = T / (one - alpha)
                    w = f64(alpha * t_k)
                    depth = f64(colors[g, channels - 1])
                    s_w = 1.0 - f64(t_k)
                    a_wd = wd_total - b_wd - w * depth
                    q = v_dist * (2.0 * (depth * s_w - a_wd) + 2.0 * (b_wd - depth * r_w))
                    for k in range(channels):
                        q += v_c[k] * f64(colors[g, k])
                        vals[V_COLOR + k] = w * v_c[k]
                    q += vn0 * s_geo[t, S_NRM] + vn1 * s_geo[t, S_NRM + 1] + (
                        vn2 * s_geo[t, S_NRM + 2])
                    vals[V_NRM] = w * vn0
                    vals[V_NRM + 1] = w * vn1
                    vals[V_NRM + 2] = w * vn2
                    v_depth = v_dist * 2.0 * w * (s_w - r_w)
                    if isect == med:
                        v_depth += v_med
                    vals[V_COLOR + channels - 1] += v_depth
                    v_alpha = f64(t_k) * q - (behind + tail) / (1.0 - f64(alpha))
                    if ar <= clamp:  # alpha = min(0.999, op G): no gradient where clamped
                        vals[V_OP] = v_alpha * f64(ge)
                        v_g = -0.5 * v_alpha * f64(ar)  # sigma = g / 2
                        v_s2 = v_g * pick
                        v_lp = v_g - v_s2
                        v_dx = v_lp * FILTER_INV_SQUARE * 2.0 * dx
                        v_dy = v_lp * FILTER_INV_SQUARE * 2.0 * dy
                        v_su = v_s2 * 2.0 * s_u
                        v_sv = v_s2 * 2.0 * s_v
                        vals[V_MX] = v_dx
                        vals[V_MY] = v_dy
                        v_px = -v_dx
                        v_py = -v_dy
                        for i in range(3):
                            if i == 0:
                                v_cr = v_su / cz
                            elif i == 1:
                                v_cr = v_sv / cz
                            else:
                                v_cr = -(v_su * s_u + v_sv * s_v) / cz
                            vals[V_A + i] = sx * v_cr
                            vals[V_B + i] = sy * v_cr
                            vals[V_C + i] = v_cr
                            v_px += s_geo[t, S_A + i] * v_cr
                            v_py += s_geo[t, S_B + i] * v_cr
                        vals[V_ABS] = abs(v_px)
                        vals[V_ABS + 1] = abs(v_py)
                    behind += w * q
                    r_w += w
                    b_wd += w * depth
                    T = t_k
                if lanes == WARP:
                    # transpose-reduce: each step halves the columns a lane holds, swapping
                    # the other half with its partner, so lane l ends with the warp's sum of
                    # column l of the chunk (31 shuffles for 32 columns, not 5 per column)
                    for ch in range(n_chunks):
                        base = ch * WARP
                        off = WARP // 2
                        while off > 0:
                            upper = (lane & off) != 0
                            for j in range(off):
                                low = vals[base + j]
                                high = vals[base + j + off]
                                send = low if upper else high
                                keep = high if upper else low
                                vals[base + j] = keep + cuda.shfl_xor_sync(mask, send, off)
                            off //= 2
                        col = base + lane
                        if col < n_cols:
                            if det:  # this warp's own row: one writer, a plain store
                                part[isect * warps + rank // WARP, col] = vals[base]
                            else:
                                cuda.atomic.add(part, (g, col), vals[base])
                else:  # a partial warp (tile_size**2 not a multiple of 32): a tree to lane 0
                    off = WARP // 2
                    while off > 0:
                        src_ok = lane + off < lanes  # a source past the warp's end adds 0
                        for k in range(n_cols):
                            o = cuda.shfl_down_sync(mask, vals[k], off)
                            vals[k] += o if src_ok else 0.0
                        off //= 2
                    if lane == 0:
                        for k in range(n_cols):
                            if det:
                                part[isect * warps + rank // WARP, k] = vals[k]
                            else:
                                cuda.atomic.add(part, (g, k), vals[k])

    return rasterize_2dgs_bwd


@cache
def backward_kernel(ft: type, tile_size: int, channels: int, det: bool):
    return jit(make_rasterize_2dgs_bwd(ft, tile_size, channels, det), tile_size * tile_size)
