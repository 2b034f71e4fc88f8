"""CUDA kernel: front-to-back compositing of surfels (2DGS), the forward of
``rasterize_to_pixels_2dgs``. The contract is the reference's (``backends/torch/twodgs.py``):
ray-surfel intersection through the ray transform M, gsplat's 2D low-pass term, the 3DGS
alpha / skip / stop rules, and besides colours and alphas the composited normals, the depth
distortion and the median depth (the depth is the last colour channel).

One block per tile, one thread per pixel, as the 3DGS forward (``rasterize_fwd``): batches of
the tile's surfels are loaded into shared memory, each with the three cross products of the
reference (``h_u x h_v = p_x (M_v x M_w) + p_y (M_w x M_u) + M_u x M_v``), and the block stops
once every pixel is saturated (``syncthreads_count``).

Precision follows the CPU kernels (``cpu/twodgs_rasterize_fwd.py``, which says why): the
crosses and the ray-plane intersection are float64 whatever the data's type (in float32 they
cancel for surfels seen near edge-on); sigma is rounded to the data's type and alpha, skip and
stop are computed in it as the reference does; the colour, normal and depth sums are float64.
On GPUs with a low float64 rate (consumer cards) this costs time; the H200's float64 rate is
half its float32 one.

For the backward the forward keeps per pixel (``extra``): the final transmittance as the loop
computed it, the last contributing intersection, the median's intersection and the float64
sum of weight x depth.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from . import raster_limits
from .runtime import jit

FILTER_INV_SQUARE = 2.0  # gsplat's weight of the 2D low-pass term (the reference's)
MEDIAN_T = 0.5  # the median depth is the last contributor's reached while T > MEDIAN_T
# columns of a surfel's shared-memory row (float64): mean, opacity, crosses a = M_v x M_w,
# b = M_w x M_u, c = M_u x M_v, normal, densify
S_MX, S_MY, S_OP, S_A, S_B, S_C, S_NRM, S_DENS, S_ROW = 0, 1, 2, 3, 6, 9, 12, 15, 17


def shared_bytes(tile_size: int) -> int:
    """Static shared memory of the 2DGS forward and backward kernels: a batch of surfel ids
    (int32) and rows (``S_ROW`` float64); the backward adds an int32 per warp."""
    return raster_limits.batch_size(tile_size) * (4 + 8 * S_ROW)


def load_surfel(s_geo, r, g, means2d, rays, opacities, normals, densify):
    """Row r of the batch from surfel g: its mean, opacity, crosses (float64), normal, shift."""
    s_geo[r, S_MX] = np.float64(means2d[g, 0])
    s_geo[r, S_MY] = np.float64(means2d[g, 1])
    s_geo[r, S_OP] = np.float64(opacities[g])
    for col in range(3):  # a: rows (1, 2), b: rows (2, 0), c: rows (0, 1)
        r0 = (col + 1) % 3
        r1 = (col + 2) % 3
        for i in range(3):
            u = np.float64(rays[g, r0, (i + 1) % 3]) * np.float64(rays[g, r1, (i + 2) % 3])
            v = np.float64(rays[g, r0, (i + 2) % 3]) * np.float64(rays[g, r1, (i + 1) % 3])
            s_geo[r, S_A + 3 * col + i] = u - v
    for i in range(3):
        s_geo[r, S_NRM + i] = np.float64(normals[g, i])
    s_geo[r, S_DENS] = np.float64(densify[g, 0])
    s_geo[r, S_DENS + 1] = np.float64(densify[g, 1])


def surfel_pair(s_geo, t, fx, fy):
    """Row t of the batch at pixel centre (fx, fy) (float64): (ok, sigma, px, py, dx, dy, s_u,
    s_v, c_z, pick) with p the shifted pixel centre, d = mean - p, s the ray-plane
    intersection; ok False where the ray is parallel to the surfel; pick the 3D term's share
    of the min (1, 0.5 on a tie as torch.minimum's gradient, 0)."""
    px = fx - s_geo[t, S_DENS]
    py = fy - s_geo[t, S_DENS + 1]
    cx = px * s_geo[t, S_A] + py * s_geo[t, S_B] + s_geo[t, S_C]
    cy = px * s_geo[t, S_A + 1] + py * s_geo[t, S_B + 1] + s_geo[t, S_C + 1]
    cz = px * s_geo[t, S_A + 2] + py * s_geo[t, S_B + 2] + s_geo[t, S_C + 2]
    ok = cz != 0.0
    czs = cz if ok else 1.0
    s_u = cx / czs
    s_v = cy / czs
    dx = s_geo[t, S_MX] - px
    dy = s_geo[t, S_MY] - py
    s2 = s_u * s_u + s_v * s_v
    lp = FILTER_INV_SQUARE * (dx * dx + dy * dy)
    g = min(s2, lp)
    pick = 1.0 if s2 < lp else (0.5 if s2 == lp else 0.0)
    sigma = 0.5 * g if ok else 0.0
    return ok, sigma, px, py, dx, dy, s_u, s_v, czs, pick


device_load_surfel = cuda.jit(device=True, inline=True)(load_surfel)
device_surfel_pair = cuda.jit(device=True, inline=True)(surfel_pair)


def make_rasterize_2dgs_fwd(ft: type, tile_size: int, channels: int):
    """The Python body of the 2DGS forward kernel for float type ``ft`` and ``channels``."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    one = ft(1.0)
    clamp = ft(ALPHA_CLAMP)
    skip = ft(ALPHA_SKIP)
    stop = ft(TRANSMITTANCE_STOP)
    median_t = ft(MEDIAN_T)
    center = float(PIXEL_CENTER)
    f64 = np.float64

    def rasterize_2dgs_fwd(
        means2d, rays, colors, opacities, normals, densify,  # [G,2], [G,3,3], [G,D], [G], ..
        backgrounds, has_bg, masks, has_mask,  # [I, D], [I, TH, TW] bool (or placeholders)
        width, height, offsets, flatten_ids, n_isects,  # [I * TH * TW], [n] int32
        image0, n_images,  # first image of this launch (blockIdx.z = image - image0), all
        out_colors, out_alphas, out_normals,  # [I, H, W, D], [I, H, W, 1], [I, H, W, 3]
        out_distort, out_median,  # [I, H, W, 1]
        out_trans, out_last, out_median_ids, out_wd,  # [I, H, W]: ft, i32, i32, f64
    ):  # fmt: skip
        s_id = cuda.shared.array(batch, np.int32)
        s_geo = cuda.shared.array((batch, S_ROW), np.float64)
        acc = cuda.local.array(channels, np.float64)
        acc_n = cuda.local.array(3, np.float64)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = image0 + cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        rank = cuda.threadIdx.y * tile_size + cuda.threadIdx.x
        px = tile_x * tile_size + cuda.threadIdx.x
        py = tile_y * tile_size + cuda.threadIdx.y
        inside = px < width and py < height

        for k in range(channels):
            acc[k] = 0.0
        for k in range(3):
            acc_n[k] = 0.0
        T = one
        dist = 0.0
        wd_sum = 0.0
        median = 0.0
        last = -1
        med_id = -1
        if has_mask and not masks[image, tile_y, tile_x]:
            done = True  # uniform per block: no thread reaches a barrier below
            start = 0
            end = 0
        else:
            done = not inside
            tile = (image * th + tile_y) * tw + tile_x
            start = offsets[tile]
            end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]
        fx = f64(px) + center
        fy = f64(py) + center
        n_batches = (end - start + batch - 1) // batch
        for b in range(n_batches):
            # also the barrier that protects the shared batch from the previous round
            if cuda.syncthreads_count(np.int32(1 if done else 0)) == block:
                break
            idx = start + b * batch + rank
            if rank < batch and idx < end:
                g = flatten_ids[idx]
                s_id[rank] = g
                device_load_surfel(s_geo, rank, g, means2d, rays, opacities, normals, densify)
            cuda.syncthreads()
            size = min(batch, end - start - b * batch)
            for t in range(size):
                if done:
                    break
                ok, sigma, _, _, _, _, _, _, _, _ = device_surfel_pair(s_geo, t, fx, fy)
                alpha = min(clamp, ft(s_geo[t, S_OP]) * math.exp(-ft(sigma)))
                if not ok or sigma < 0.0 or alpha < skip:
                    continue
                t_next = T * (one - alpha)
                if t_next <= stop:
                    done = True
                    break
                w = f64(alpha * T)
                g = s_id[t]
                for k in range(channels):
                    acc[k] += w * f64(colors[g, k])
                for k in range(3):
                    acc_n[k] += w * s_geo[t, S_NRM + k]
                depth = f64(colors[g, channels - 1])
                dist += 2.0 * (w * depth * (1.0 - f64(T)) - w * wd_sum)
                wd_sum += w * depth
                if T > median_t:
                    median = depth
                    med_id = start + b * batch + t
                last = start + b * batch + t
                T = t_next

        if inside:
            for k in range(channels):
                v = acc[k]
                if has_bg:
                    v += f64(T) * f64(backgrounds[image, k])
                out_colors[image, py, px, k] = ft(v)
            for k in range(3):
                out_normals[image, py, px, k] = ft(acc_n[k])
            out_alphas[image, py, px, 0] = one - T
            out_distort[image, py, px, 0] = ft(dist)
            out_median[image, py, px, 0] = ft(median)
            out_trans[image, py, px] = T
            out_last[image, py, px] = last
            out_median_ids[image, py, px] = med_id
            out_wd[image, py, px] = wd_sum

    return rasterize_2dgs_fwd


@cache
def forward_kernel(ft: type, tile_size: int, channels: int):
    return jit(make_rasterize_2dgs_fwd(ft, tile_size, channels), tile_size * tile_size)
