"""CUDA kernel: the forward of ``rasterize_to_pixels_eval3d`` (3DGUT's rasterizer, Gaussians
evaluated in 3D along each pixel's ray). The contract is the reference's
(``backends/torch/ut.py``); the math is the CPU kernel's (``cpu/ut_rasterize_fwd.py``, which
derives it): with the precision ``Q = R S⁻² Rᵀ``, ``e = o - mean``, ``g = eᵀ Q e``,
``s = dᵀ Q e`` and ``q = dᵀ Q d``, the pair's power is ``-(g - s² / q) / 2`` (0 where q = 0,
as the reference's zero direction), alpha = min(0.999, opacity × exp(power)), and the
compositing is the 2D contract's (skip below 1/255, stop before T <= 1e-4, backgrounds,
masks).

One block per tile, one thread per pixel, as the 2D and 2DGS forwards (``rasterize_fwd``,
``twodgs_rasterize_fwd``): batches of the tile's Gaussians are loaded into shared memory, each
as its mean and precision Q (float64, from the quaternion and scales), and the block stops
once every pixel is saturated (``syncthreads_count``). The pixels' rays come in as the input
``rays`` [I, H, W, 8] (origin, unit direction, valid as 1 / 0), computed by the launcher with
the reference's ``image_rays`` on the device, so the kernel knows no camera; it writes each
pixel's final transmittance into column ``T_FINAL`` for the backward.

Precision follows the CPU kernel: the pair's power is float64 whatever the data's type (the
cross product cancels in float32 for pixels near a Gaussian's axis), rounded to the data's
type; alpha, skip and stop are computed in the data's type as the reference computes them; the
colour sums are float64.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, TRANSMITTANCE_STOP
from . import raster_limits
from .device_math import device_math
from .runtime import jit

# columns of a Gaussian's shared-memory row (float64): mean, the precision Q = R S⁻² Rᵀ
# (q00, q01, q02, q11, q12, q22), opacity
S_MEAN, S_Q, S_OP, S_ROW = 0, 3, 9, 10
# columns of ``rays`` (``ut.ray_table``): origin, direction, valid, the final transmittance
X_ORIGIN, X_DIR, X_VALID, T_FINAL = 0, 3, 6, 7
RAY_COLS = 8


def shared_bytes(tile_size: int) -> int:
    """Static shared memory of the eval3d forward and backward kernels: a batch of pair ids
    (int32) and rows (``S_ROW`` float64); the backward adds an int32 per warp."""
    return raster_limits.batch_size(tile_size) * (4 + 8 * S_ROW)


def gaussian_of(p, n_cams, n_gauss):
    """The row in the [B * N] Gaussians of pair p of the [I * N] (image-major) pairs."""
    return (p // (n_cams * n_gauss)) * n_gauss + p % n_gauss


def pair_power(s_geo, t, o0, o1, o2, d0, d1, d2):
    """Row t of the batch against the ray o + t d, in float64: (power, ok, e [3], a = Q e [3],
    Q d [3], s, q); ok False where q = 0 or the cancellation made the power positive (power
    0 there, no gradient)."""
    e0 = o0 - s_geo[t, S_MEAN]
    e1 = o1 - s_geo[t, S_MEAN + 1]
    e2 = o2 - s_geo[t, S_MEAN + 2]
    q00 = s_geo[t, S_Q]
    q01 = s_geo[t, S_Q + 1]
    q02 = s_geo[t, S_Q + 2]
    q11 = s_geo[t, S_Q + 3]
    q12 = s_geo[t, S_Q + 4]
    q22 = s_geo[t, S_Q + 5]
    a0 = q00 * e0 + q01 * e1 + q02 * e2
    a1 = q01 * e0 + q11 * e1 + q12 * e2
    a2 = q02 * e0 + q12 * e1 + q22 * e2
    b0 = q00 * d0 + q01 * d1 + q02 * d2
    b1 = q01 * d0 + q11 * d1 + q12 * d2
    b2 = q02 * d0 + q12 * d1 + q22 * d2
    g = e0 * a0 + e1 * a1 + e2 * a2
    q = d0 * b0 + d1 * b1 + d2 * b2
    s = d0 * a0 + d1 * a1 + d2 * a2
    power = 0.0
    ok = False
    if q > 0.0:
        power = -0.5 * (g - s * s / q)
        ok = power < 0.0
        if not ok:
            power = 0.0
    return power, ok, e0, e1, e2, a0, a1, a2, b0, b1, b2, s, q


device_gaussian_of = cuda.jit(device=True, inline=True)(gaussian_of)
device_pair_power = cuda.jit(device=True, inline=True)(pair_power)


@cache
def device_load_gaussian():
    """The device function that fills row r of the batch from pair p (its Gaussian's mean,
    precision Q from the normalised quaternion and scales, float64; the pair's opacity)."""
    quat_to_rotmat = device_math().quat_to_rotmat
    f64 = np.float64

    def load_gaussian(s_geo, r, p, means, quats, scales, opacities, n_cams, n_gauss):
        g = device_gaussian_of(p, n_cams, n_gauss)
        r00, r01, r02, r10, r11, r12, r20, r21, r22 = quat_to_rotmat(
            f64(quats[g, 0]), f64(quats[g, 1]), f64(quats[g, 2]), f64(quats[g, 3]))
        i0 = 1.0 / (f64(scales[g, 0]) * f64(scales[g, 0]))
        i1 = 1.0 / (f64(scales[g, 1]) * f64(scales[g, 1]))
        i2 = 1.0 / (f64(scales[g, 2]) * f64(scales[g, 2]))
        for k in range(3):
            s_geo[r, S_MEAN + k] = f64(means[g, k])
        # Q[a, b] = sum_i R[a, i] R[b, i] / s_i²
        s_geo[r, S_Q] = r00 * r00 * i0 + r01 * r01 * i1 + r02 * r02 * i2
        s_geo[r, S_Q + 1] = r00 * r10 * i0 + r01 * r11 * i1 + r02 * r12 * i2
        s_geo[r, S_Q + 2] = r00 * r20 * i0 + r01 * r21 * i1 + r02 * r22 * i2
        s_geo[r, S_Q + 3] = r10 * r10 * i0 + r11 * r11 * i1 + r12 * r12 * i2
        s_geo[r, S_Q + 4] = r10 * r20 * i0 + r11 * r21 * i1 + r12 * r22 * i2
        s_geo[r, S_Q + 5] = r20 * r20 * i0 + r21 * r21 * i1 + r22 * r22 * i2
        s_geo[r, S_OP] = f64(opacities[p])

    return cuda.jit(device=True, inline=True)(load_gaussian)


def make_ut_rasterize_fwd(ft: type, tile_size: int, channels: int):
    """The Python body of the eval3d forward kernel for float type ``ft`` and ``channels``."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    load_gaussian = device_load_gaussian()
    one = ft(1.0)
    clamp = ft(ALPHA_CLAMP)
    skip = ft(ALPHA_SKIP)
    stop = ft(TRANSMITTANCE_STOP)
    f64 = np.float64

    def ut_rasterize_fwd(
        means, quats, scales, colors, opacities,  # [B*N, 3], [B*N, 4], [B*N, 3], [I*N, D], [I*N]
        backgrounds, has_bg, masks, has_mask,  # [I, D], [I, TH, TW] bool (or placeholders)
        n_cams, n_gauss, width, height, offsets, flatten_ids, n_isects,  # [I*TH*TW], [n] i32
        image0, n_images,  # first image of this launch (blockIdx.z = image - image0), all
        rays,  # [I, H, W, RAY_COLS]: the rays in, T_FINAL out
        out_colors, out_alphas, out_last,  # [I, H, W, D], [I, H, W, 1], [I, H, W] int32
    ):  # fmt: skip
        s_id = cuda.shared.array(batch, np.int32)
        s_geo = cuda.shared.array((batch, S_ROW), np.float64)
        acc = cuda.local.array(channels, np.float64)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = image0 + cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        rank = cuda.threadIdx.y * tile_size + cuda.threadIdx.x
        px = tile_x * tile_size + cuda.threadIdx.x
        py = tile_y * tile_size + cuda.threadIdx.y
        inside = px < width and py < height
        pxc = min(px, width - 1)
        pyc = min(py, height - 1)

        for k in range(channels):
            acc[k] = 0.0
        T = one
        last = -1
        o0 = f64(rays[image, pyc, pxc, X_ORIGIN])
        o1 = f64(rays[image, pyc, pxc, X_ORIGIN + 1])
        o2 = f64(rays[image, pyc, pxc, X_ORIGIN + 2])
        d0 = f64(rays[image, pyc, pxc, X_DIR])
        d1 = f64(rays[image, pyc, pxc, X_DIR + 1])
        d2 = f64(rays[image, pyc, pxc, X_DIR + 2])
        if has_mask and not masks[image, tile_y, tile_x]:
            done = True  # uniform per block: no thread reaches a barrier below
            start = 0
            end = 0
        else:
            done = not inside or rays[image, pyc, pxc, X_VALID] == 0
            tile = (image * th + tile_y) * tw + tile_x
            start = offsets[tile]
            end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]
        n_batches = (end - start + batch - 1) // batch
        for b in range(n_batches):
            # also the barrier that protects the shared batch from the previous round
            if cuda.syncthreads_count(np.int32(1 if done else 0)) == block:
                break
            idx = start + b * batch + rank
            if rank < batch and idx < end:
                p = flatten_ids[idx]
                s_id[rank] = p
                load_gaussian(s_geo, rank, p, means, quats, scales, opacities, n_cams, n_gauss)
            cuda.syncthreads()
            size = min(batch, end - start - b * batch)
            for t in range(size):
                if done:
                    break
                power, _, _, _, _, _, _, _, _, _, _, _, _ = device_pair_power(
                    s_geo, t, o0, o1, o2, d0, d1, d2)
                alpha = min(clamp, ft(s_geo[t, S_OP]) * math.exp(ft(power)))
                if alpha < skip:
                    continue
                t_next = T * (one - alpha)
                if t_next <= stop:
                    done = True
                    break
                w = f64(alpha * T)
                p = s_id[t]
                for k in range(channels):
                    acc[k] += w * f64(colors[p, k])
                last = start + b * batch + t
                T = t_next

        if inside:
            for k in range(channels):
                v = acc[k]
                if has_bg:
                    v += f64(T) * f64(backgrounds[image, k])
                out_colors[image, py, px, k] = ft(v)
            out_alphas[image, py, px, 0] = one - T
            out_last[image, py, px] = last
            rays[image, py, px, T_FINAL] = T

    return ut_rasterize_fwd


@cache
def forward_kernel(ft: type, tile_size: int, channels: int):
    return jit(make_ut_rasterize_fwd(ft, tile_size, channels), tile_size * tile_size)
