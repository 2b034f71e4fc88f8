"""Forward rasterization kernel: one block per tile, one thread per pixel.

Each block walks its tile's intersections front to back in batches of
``min(tile_size**2, 256)`` splats: the first threads load one splat of the batch each into
shared memory, then every thread composites the whole batch for its pixel. The block stops
as soon as every pixel of the tile is saturated (``syncthreads_count``). Kernels are
specialised (and cached) per float type, tile size, channel count and what they keep for the
backward, which fixes the shared and local array sizes at compile time; launches are planned
by :mod:`.raster_limits` (tile size, image chunks).

What the forward keeps for the backward (``extra`` [I, H, W, E]):

- ``per_pixel``: ``E = 1``, the final transmittance, which ``1 - render_alphas`` holds only
  to ~6e-8 absolute (6e-4 relative near the 1e-4 stop);
- ``per_splat``: ``E = 1 + 2D``, the transmittance, then the colour sum before the
  background as an unevaluated pair ``hi + lo`` (``lo`` collects the rounding error of each
  addition, TwoSum: :func:`add_product`). The backward subtracts each splat's colour from
  it, so near saturation the colour still to come is a difference of nearly equal numbers;
  with one float32 its error would be ~1e-7 of the pixel's colour, i.e. ~1e-3 of what is
  left at T = 1e-4.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from . import raster_limits
from .runtime import jit

KEEP_NONE, KEEP_T, KEEP_SUM = 0, 1, 2
KEEP = {None: KEEP_NONE, "per_pixel": KEEP_T, "per_splat": KEEP_SUM}


def extra_width(keep: int, channels: int) -> int:
    """E, the last dim of the ``extra`` tensor the forward keeps."""
    return (0, 1, 1 + 2 * channels)[keep]


def add_product(hi, lo, c, w):
    """``(hi, lo) + c * w`` with the rounding error of the addition kept in ``lo`` (TwoSum).
    The forward adds each splat's colour with it and the ``per_splat`` backward subtracts the
    same colour with it (``w`` negated, which negates the product exactly): both kernels
    inline this one body, so they round (and contract to FMA) alike and the colour still to
    come is exact up to the splats that come after."""
    p = c * w
    s = hi + p
    bb = s - hi
    return s, lo + ((hi - (s - bb)) + (p - bb))


device_add_product = cuda.jit(device=True, inline=True)(add_product)


def make_rasterize_fwd(ft: type, tile_size: int, channels: int, keep: int = KEEP_NONE):
    """The Python body of the forward kernel for float type ``ft`` (np.float32/np.float64),
    ``channels`` colour channels and ``keep`` (``KEEP_*``)."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    lo_width = channels if keep == KEEP_SUM else 1
    zero = ft(0.0)
    one = ft(1.0)
    center = ft(PIXEL_CENTER)
    clamp = ft(ALPHA_CLAMP)
    skip = ft(ALPHA_SKIP)
    stop = ft(TRANSMITTANCE_STOP)
    half = ft(0.5)

    def rasterize_fwd(
        means2d,  # [G, 2]
        conics,  # [G, 3]
        colors,  # [G, D]
        opacities,  # [G]
        backgrounds,  # [I, D] (placeholder when has_bg is False)
        has_bg,
        masks,  # [I, TH, TW] bool (placeholder when has_mask is False)
        has_mask,
        width,
        height,
        offsets,  # [I * TH * TW] first intersection of each tile
        flatten_ids,  # [n] intersection -> splat row
        n_isects,
        image0,  # first image of this launch (blockIdx.z = image - image0)
        n_images,  # I, all images (the last tile's list ends at n_isects)
        out_colors,  # [I, H, W, D]
        out_alphas,  # [I, H, W, 1]
        out_last,  # [I, H, W] int32
        out_extra,  # [I, H, W, E] (placeholder when keep is KEEP_NONE)
    ):
        s_id = cuda.shared.array(batch, np.int32)
        s_xyo = cuda.shared.array((batch, 3), ft)
        s_conic = cuda.shared.array((batch, 3), ft)
        acc = cuda.local.array(channels, ft)
        lo = cuda.local.array(lo_width, ft)

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
            acc[k] = zero
        for k in range(lo_width):
            lo[k] = zero
        T = one
        last = -1
        if has_mask and not masks[image, tile_y, tile_x]:
            done = True  # uniform per block: no thread reaches a barrier below
            start = 0
            end = 0
        else:
            done = not inside
            tile = (image * th + tile_y) * tw + tile_x
            start = offsets[tile]
            end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]
        fx = ft(px) + center
        fy = ft(py) + center
        n_batches = (end - start + batch - 1) // batch
        for b in range(n_batches):
            # also the barrier that protects the shared batch from the previous round
            if cuda.syncthreads_count(np.int32(1 if done else 0)) == block:
                break
            idx = start + b * batch + rank
            if rank < batch and idx < end:
                g = flatten_ids[idx]
                s_id[rank] = g
                s_xyo[rank, 0] = means2d[g, 0]
                s_xyo[rank, 1] = means2d[g, 1]
                s_xyo[rank, 2] = opacities[g]
                s_conic[rank, 0] = conics[g, 0]
                s_conic[rank, 1] = conics[g, 1]
                s_conic[rank, 2] = conics[g, 2]
            cuda.syncthreads()
            size = min(batch, end - start - b * batch)
            for t in range(size):
                if done:
                    break
                dx = s_xyo[t, 0] - fx
                dy = s_xyo[t, 1] - fy
                sigma = half * (s_conic[t, 0] * dx * dx + s_conic[t, 2] * dy * dy) + (
                    s_conic[t, 1] * dx * dy
                )
                if sigma < zero:
                    continue
                alpha = min(clamp, s_xyo[t, 2] * math.exp(-sigma))
                if alpha < skip:
                    continue
                t_next = T * (one - alpha)
                if t_next <= stop:
                    done = True
                    break
                w = alpha * T
                g = s_id[t]
                for k in range(channels):
                    if keep == KEEP_SUM:
                        acc[k], lo[k] = device_add_product(acc[k], lo[k], colors[g, k], w)
                    else:
                        acc[k] += colors[g, k] * w
                last = start + b * batch + t
                T = t_next

        if inside:
            for k in range(channels):
                bg = backgrounds[image, k] if has_bg else zero
                out_colors[image, py, px, k] = acc[k] + T * bg
            out_alphas[image, py, px, 0] = one - T
            out_last[image, py, px] = last
            if keep != KEEP_NONE:
                out_extra[image, py, px, 0] = T
            if keep == KEEP_SUM:
                for k in range(channels):
                    out_extra[image, py, px, 1 + k] = acc[k]
                    out_extra[image, py, px, 1 + channels + k] = lo[k]

    return rasterize_fwd


@cache
def forward_kernel(ft: type, tile_size: int, channels: int, keep: int):
    body = make_rasterize_fwd(ft, tile_size, channels, keep)
    return jit(body, tile_size * tile_size)
