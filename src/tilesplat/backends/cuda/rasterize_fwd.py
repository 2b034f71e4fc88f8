"""Forward rasterization kernel: one block per tile, one thread per pixel.

Each block walks its tile's intersections front to back in batches of ``tile_size**2``
splats: every thread loads one splat of the batch into shared memory, then every thread
composites the whole batch for its pixel. The block stops as soon as every pixel of the tile
is saturated (``syncthreads_count``). Kernels are specialised (and cached) per float type,
tile size and channel count, which fixes the shared and local array sizes at compile time.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from .runtime import empty, float_type, optional, stream, view


def make_rasterize_fwd(ft: type, tile_size: int, channels: int):
    """The Python body of the forward kernel for float type ``ft`` (np.float32/np.float64)."""
    block = tile_size * tile_size
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
        out_colors,  # [I, H, W, D]
        out_alphas,  # [I, H, W, 1]
        out_last,  # [I, H, W] int32
    ):
        s_id = cuda.shared.array(block, np.int32)
        s_xyo = cuda.shared.array((block, 3), ft)
        s_conic = cuda.shared.array((block, 3), ft)
        acc = cuda.local.array(channels, ft)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        rank = cuda.threadIdx.y * tile_size + cuda.threadIdx.x
        px = tile_x * tile_size + cuda.threadIdx.x
        py = tile_y * tile_size + cuda.threadIdx.y
        inside = px < width and py < height

        for k in range(channels):
            acc[k] = zero
        if has_mask and not masks[image, tile_y, tile_x]:
            if inside:  # uniform per block: no thread reaches a barrier below
                for k in range(channels):
                    out_colors[image, py, px, k] = backgrounds[image, k] if has_bg else zero
                out_alphas[image, py, px, 0] = zero
                out_last[image, py, px] = -1
            return

        tile = (image * th + tile_y) * tw + tile_x
        start = offsets[tile]
        end = n_isects if tile == cuda.gridDim.z * th * tw - 1 else offsets[tile + 1]
        fx = ft(px) + center
        fy = ft(py) + center
        T = one
        last = -1
        done = not inside
        n_batches = (end - start + block - 1) // block
        for b in range(n_batches):
            # also the barrier that protects the shared batch from the previous round
            if cuda.syncthreads_count(np.int32(1 if done else 0)) == block:
                break
            idx = start + b * block + rank
            if idx < end:
                g = flatten_ids[idx]
                s_id[rank] = g
                s_xyo[rank, 0] = means2d[g, 0]
                s_xyo[rank, 1] = means2d[g, 1]
                s_xyo[rank, 2] = opacities[g]
                s_conic[rank, 0] = conics[g, 0]
                s_conic[rank, 1] = conics[g, 1]
                s_conic[rank, 2] = conics[g, 2]
            cuda.syncthreads()
            size = min(block, end - start - b * block)
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
                    acc[k] += colors[g, k] * w
                last = start + b * block + t
                T = t_next

        if inside:
            for k in range(channels):
                bg = backgrounds[image, k] if has_bg else zero
                out_colors[image, py, px, k] = acc[k] + T * bg
            out_alphas[image, py, px, 0] = one - T
            out_last[image, py, px] = last

    return rasterize_fwd


@cache
def _kernel(ft: type, tile_size: int, channels: int):
    return cuda.jit(make_rasterize_fwd(ft, tile_size, channels))


def rasterize_to_pixels_fwd(
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
    scheme: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    """Launcher: returns render_colors [I,H,W,D], render_alphas [I,H,W,1], last_ids [I,H,W]
    and no extra tensor for the backward (whose per_splat scheme starts from render_colors)."""
    del scheme
    n_images, th, tw = isect_offsets.shape
    channels = colors.shape[-1]
    dtype, device = means2d.dtype, means2d.device
    out_colors = empty((n_images, height, width, channels), dtype, device)
    out_alphas = empty((n_images, height, width, 1), dtype, device)
    out_last = empty((n_images, height, width), torch.int32, device)
    if n_images == 0 or width == 0 or height == 0:
        return out_colors, out_alphas, out_last, None
    n = flatten_ids.shape[0]
    ids = flatten_ids if n > 0 else torch.zeros(1, dtype=torch.int32, device=device)
    kernel = _kernel(float_type(dtype), tile_size, channels)
    kernel[(tw, th, n_images), (tile_size, tile_size), stream(device)](
        view(means2d), view(conics), view(colors), view(opacities),
        optional(backgrounds, means2d, 2), backgrounds is not None,
        optional(masks, means2d, 3, torch.bool), masks is not None,
        width, height, view(isect_offsets.reshape(-1)), view(ids), n,
        view(out_colors), view(out_alphas), view(out_last),
    )  # fmt: skip
    return out_colors, out_alphas, out_last, None
