"""CUDA kernel: the backward of ``rasterize_to_pixels_eval3d`` (3DGUT's rasterizer), the
``per_pixel`` scheme.

One block per tile, one thread per pixel, as the 2DGS backward (``twodgs_rasterize_bwd``):
batches of the tile's Gaussians are loaded into shared memory back to front; each pixel starts
at its last contributor with the final transmittance the forward kept (``rays[..., T_FINAL]``)
and recovers T before each Gaussian by dividing by (1 - alpha). The math is the CPU kernel's
(``cpu/ut_rasterize_bwd.py``, whose docstring derives it): d loss / d alpha_k = T_k q_k -
(sum_{i>k} w_i q_i + T_final (v_colors . background - v_alphas)) / (1 - alpha_k), then through
alpha = min(0.999, opacity exp(power)) and power = -(g - s² / q) / 2 to the Gaussian's mean
and its precision Q. The pixel's sums and the gradient rows are float64.

Each pair's gradient is a row of ``V_COLOR + D`` float64 values: mean, Q's symmetric gradient
(00, 01, 02, 11, 12, 22), opacity, colour. A warp sums its lanes' rows as the 2DGS backward
does (a transpose reduction on full warps, a tree on a partial one), then each lane either adds
its column to the pair's row (image-major pair id, ``[I * N, K]``) with a float64 atomic
(default) or, with the ``deterministic`` option, stores it in the row ``intersection * n_warps
+ warp`` of its own, which ``segment.segment_sum`` reduces in a fixed order. The launcher
(``ut``) sums the pairs over the cameras and turns Q's gradient into the quaternions' and the
scales' with PyTorch ops on the device. A warp skips a Gaussian none of its lanes needs and
starts each batch at its largest last id.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP
from . import raster_limits
from .runtime import jit
from .ut_rasterize_fwd import (
    S_OP,
    S_ROW,
    T_FINAL,
    X_DIR,
    X_ORIGIN,
    device_load_gaussian,
    device_pair_power,
)

# columns of a gradient row (float64): mean, Q's symmetric gradient, opacity; colours follow
V_MEAN, V_Q, V_OP, V_COLOR = 0, 3, 9, 10
N_GEOM = 9  # the columns the launcher sums over the cameras (mean and Q)
WARP = 32


def n_warps(tile_size: int) -> int:
    """Warps of a block (rows per intersection of the deterministic variant)."""
    return (tile_size * tile_size + 31) // 32


def make_ut_rasterize_bwd(ft: type, tile_size: int, channels: int, det: bool = False):
    """The Python body of the eval3d backward kernel; with ``det`` each warp's sum is stored
    in the row ``intersection * n_warps + warp`` of ``part`` ([n * n_warps, K]) instead of
    added to the pair's row ([I * N, K])."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    warps = n_warps(tile_size)
    load_gaussian = device_load_gaussian()
    n_cols = V_COLOR + channels
    n_chunks = (n_cols + WARP - 1) // WARP  # the columns in chunks of one per lane
    n_padded = n_chunks * WARP
    one = ft(1.0)
    clamp = ft(ALPHA_CLAMP)
    skip = ft(ALPHA_SKIP)
    f64 = np.float64

    def ut_rasterize_bwd(
        means, quats, scales, colors, opacities,  # [B*N, 3], [B*N, 4], [B*N, 3], [I*N, D], [I*N]
        backgrounds, has_bg, masks, has_mask,  # [I, D], [I, TH, TW] bool (or placeholders)
        n_cams, n_gauss, width, height, offsets, flatten_ids, n_isects,  # [I*TH*TW], [n] i32
        image0, n_images,  # first image of this launch, all images
        rays, last_ids,  # the forward's [I, H, W, RAY_COLS] (T_FINAL filled), [I, H, W] i32
        v_colors, v_alphas,  # [I, H, W, D], [I, H, W, 1]
        part,  # output, zero-filled float64: [I * N, K], or [n * n_warps, K] with det
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

        tile = (image * th + tile_y) * tw + tile_x
        start = offsets[tile]
        end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]

        o0 = f64(rays[image, pyc, pxc, X_ORIGIN])
        o1 = f64(rays[image, pyc, pxc, X_ORIGIN + 1])
        o2 = f64(rays[image, pyc, pxc, X_ORIGIN + 2])
        d0 = f64(rays[image, pyc, pxc, X_DIR])
        d1 = f64(rays[image, pyc, pxc, X_DIR + 1])
        d2 = f64(rays[image, pyc, pxc, X_DIR + 2])
        t_fin = rays[image, pyc, pxc, T_FINAL]
        T = t_fin
        bin_final = last_ids[image, pyc, pxc] if inside else -1
        bg_dot = 0.0
        for k in range(channels):
            v_c[k] = f64(v_colors[image, pyc, pxc, k])
            if has_bg:
                bg_dot += v_c[k] * f64(backgrounds[image, k])
        tail = f64(t_fin) * (bg_dot - f64(v_alphas[image, pyc, pxc, 0]))
        behind = 0.0  # sum over the Gaussians behind of w q

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
                p = flatten_ids[idx]
                s_id[rank] = p
                load_gaussian(s_geo, rank, p, means, quats, scales, opacities, n_cams, n_gauss)
            cuda.syncthreads()
            t0 = max(0, batch_end - warp_bin)
            for t in range(t0, size):
                isect = batch_end - t
                valid = inside and isect <= bin_final
                ok = False
                power = e0 = e1 = e2 = a0 = a1 = a2 = b0 = b1 = b2 = s = 0.0
                q = 1.0
                ge = one
                ar = one
                alpha = one
                if valid:
                    power, ok, e0, e1, e2, a0, a1, a2, b0, b1, b2, s, q = device_pair_power(
                        s_geo, t, o0, o1, o2, d0, d1, d2)
                    ge = math.exp(ft(power))
                    ar = ft(s_geo[t, S_OP]) * ge
                    alpha = min(clamp, ar)
                    if alpha < skip:
                        valid = False
                if not cuda.any_sync(mask, valid):
                    continue
                for k in range(n_padded):
                    vals[k] = 0.0
                p = s_id[t]
                if valid:
                    t_k = T / (one - alpha)
                    w = f64(alpha * t_k)
                    vq = 0.0
                    for k in range(channels):
                        vq += v_c[k] * f64(colors[p, k])
                        vals[V_COLOR + k] = w * v_c[k]
                    v_alpha = f64(t_k) * vq - (behind + tail) / (1.0 - f64(alpha))
                    if ar <= clamp:  # alpha = min(0.999, op G): no gradient where clamped
                        vals[V_OP] = v_alpha * f64(ge)
                        if ok:
                            # power = -g / 2 + s² / (2 q): its gradients in g, s, q
                            v_power = v_alpha * f64(ar)
                            v_g = -0.5 * v_power
                            v_s = v_power * s / q
                            v_q = -0.5 * v_power * (s / q) * (s / q)
                            # g = eᵀQe, s = dᵀQe, q = dᵀQd, symmetrised
                            vals[V_Q] = v_g * e0 * e0 + v_s * d0 * e0 + v_q * d0 * d0
                            vals[V_Q + 1] = (v_g * e0 * e1 + 0.5 * v_s * (d0 * e1 + e0 * d1)
                                             + v_q * d0 * d1)
                            vals[V_Q + 2] = (v_g * e0 * e2 + 0.5 * v_s * (d0 * e2 + e0 * d2)
                                             + v_q * d0 * d2)
                            vals[V_Q + 3] = v_g * e1 * e1 + v_s * d1 * e1 + v_q * d1 * d1
                            vals[V_Q + 4] = (v_g * e1 * e2 + 0.5 * v_s * (d1 * e2 + e1 * d2)
                                             + v_q * d1 * d2)
                            vals[V_Q + 5] = v_g * e2 * e2 + v_s * d2 * e2 + v_q * d2 * d2
                            # d/d mean = -d/d e = -(2 v_g Q e + v_s Q d)
                            vals[V_MEAN] = -(2.0 * v_g * a0 + v_s * b0)
                            vals[V_MEAN + 1] = -(2.0 * v_g * a1 + v_s * b1)
                            vals[V_MEAN + 2] = -(2.0 * v_g * a2 + v_s * b2)
                    behind += w * vq
                    T = t_k
                if lanes == WARP:
                    # transpose-reduce (``twodgs_rasterize_bwd``): lane l ends with the warp's
                    # sum of column l of the chunk
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
                                cuda.atomic.add(part, (p, col), vals[base])
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
                                cuda.atomic.add(part, (p, k), vals[k])

    return ut_rasterize_bwd


@cache
def backward_kernel(ft: type, tile_size: int, channels: int, det: bool):
    return jit(make_ut_rasterize_bwd(ft, tile_size, channels, det), tile_size * tile_size)
