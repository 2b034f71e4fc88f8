"""CUDA kernels: ``rasterize_to_indices_in_range_2dgs``, the (surfel, pixel, image) pairs that
contribute when each tile's list is cut into batches of ``tile_size**2`` and only batches
``[range_start, range_end)`` are composited onto given transmittances (the contract:
``backends/torch/indices.py``). Its 3DGS twin and the ``accumulate`` ops have no kernels
(their references are vectorised PyTorch, with no loop over tiles).

Two launches of one kernel body, one block per tile and one thread per pixel, with the
surfels in shared-memory batches as the 2DGS forward (``twodgs_rasterize_fwd``, whose
float64 ray-plane intersection it shares): the first counts each pixel's pairs, a
``torch.cumsum`` turns the counts into each pixel's first slot (one host read: the total),
the second writes the pairs there. Pixels are numbered by image then row-major, and each
pixel writes its pairs front to back, so the lists come out in the reference's order (image,
pixel, depth) without a sort.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from . import raster_limits
from .runtime import INDEX_LIMIT, empty, float_type, jit, launch, launcher, optional
from .twodgs_rasterize_fwd import S_OP, S_ROW, device_load_surfel, device_surfel_pair


def make_indices_2dgs(ft: type, tile_size: int, fill: bool):
    """Kernel body: with ``fill`` False, counts[pixel] = the pixel's pairs; with ``fill``,
    writes them from slot firsts[pixel] on."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    one = ft(1.0)
    clamp = ft(ALPHA_CLAMP)
    skip = ft(ALPHA_SKIP)
    stop = ft(TRANSMITTANCE_STOP)
    center = float(PIXEL_CENTER)
    f64 = np.float64

    def indices_2dgs(
        range_start, range_end,  # batches of tile_size**2 intersections, int64
        transmittances,  # [I, H, W]
        means2d, rays, opacities, normals, densify,  # [I*N, 2], [I*N, 3, 3], [I*N], ..
        width, height, n_gauss, offsets, flatten_ids, n_isects,  # [I * TH * TW], [n] int32
        image0, n_images,  # first image of this launch, all images
        counts,  # [I * H * W] int32 (written when not fill)
        firsts,  # [I * H * W] int64: each pixel's first slot (read when fill)
        gaussian_ids, pixel_ids, image_ids,  # [M] int64 (written when fill)
    ):  # fmt: skip
        s_id = cuda.shared.array(batch, np.int32)
        s_geo = cuda.shared.array((batch, S_ROW), np.float64)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = image0 + cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        rank = cuda.threadIdx.y * tile_size + cuda.threadIdx.x
        px = tile_x * tile_size + cuda.threadIdx.x
        py = tile_y * tile_size + cuda.threadIdx.y
        inside = px < width and py < height
        pixel = (image * height + py) * width + px

        tile = (image * th + tile_y) * tw + tile_x
        start = offsets[tile]
        end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]
        lo = min(end, start + range_start * block)
        hi = min(end, start + range_end * block)
        T = transmittances[image, py, px] if inside else one
        done = not inside
        slot = firsts[pixel] if fill and inside else 0
        found = 0
        fx = f64(px) + center
        fy = f64(py) + center
        n_batches = (hi - lo + batch - 1) // batch
        for b in range(n_batches):
            if cuda.syncthreads_count(np.int32(1 if done else 0)) == block:
                break
            idx = lo + b * batch + rank
            if rank < batch and idx < hi:
                g = flatten_ids[idx]
                s_id[rank] = g
                device_load_surfel(s_geo, rank, g, means2d, rays, opacities, normals, densify)
            cuda.syncthreads()
            size = min(batch, hi - lo - b * batch)
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
                if fill:
                    gaussian_ids[slot + found] = s_id[t] % n_gauss
                    pixel_ids[slot + found] = py * width + px
                    image_ids[slot + found] = image
                found += 1
                T = t_next
        if inside and not fill:
            counts[pixel] = found

    return indices_2dgs


@cache
def _kernel(ft: type, tile_size: int, fill: bool):
    return jit(make_indices_2dgs(ft, tile_size, fill), tile_size * tile_size)


@launcher
def rasterize_to_indices_in_range_2dgs(
    range_start: int,
    range_end: int,
    transmittances: torch.Tensor,  # [I, H, W]
    means2d: torch.Tensor,  # [I, N, 2]
    ray_transforms: torch.Tensor,  # [I, N, 3, 3]
    opacities: torch.Tensor,  # [I, N]
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW]
    flatten_ids: torch.Tensor,  # [n] into the flattened [I * N]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference's signature: gaussian_ids [M] (in [0, N)), pixel_ids [M] (row-major),
    image_ids [M], int64, ordered by image, pixel, then depth."""
    raster_limits.check_tile_size(tile_size)
    n_images, th, tw = isect_offsets.shape
    n = flatten_ids.shape[0]
    raster_limits.check_grid(tw, th, n)
    n_gauss = means2d.shape[1]
    dtype, device = means2d.dtype, means2d.device
    block = tile_size * tile_size
    # batches past the longest list add nothing; clamped so that the kernel's int64 holds
    range_end = max(0, min(int(range_end), n // block + 1))
    range_start = max(0, min(int(range_start), range_end))
    n_pixels = n_images * height * width
    counts = empty((n_pixels,), torch.int32, device)
    ids = flatten_ids.to(torch.int32).contiguous()
    flat = (means2d.reshape(-1, 2).contiguous(), ray_transforms.reshape(-1, 3, 3).contiguous(),
            opacities.reshape(-1).contiguous())
    zeros2 = torch.zeros_like(flat[0])  # normals and densify: loaded, never read
    args = (range_start, range_end, transmittances.to(dtype).contiguous(), *flat,
            torch.zeros((flat[0].shape[0], 3), dtype=dtype, device=device), zeros2, width,
            height, n_gauss, isect_offsets.to(torch.int32).reshape(-1).contiguous(),
            ids if n > 0 else optional(None, ids, 1, torch.int32), n)
    none64 = optional(None, counts, 1, torch.int64)
    ft = float_type(dtype)
    grid = raster_limits.image_chunks(n_images) if n_pixels else []
    for image0, n_block in grid:
        launch(_kernel(ft, tile_size, False), (tw, th, n_block), (tile_size, tile_size), device,
               *args, image0, n_images, counts, none64, none64, none64, none64)
    ends = torch.cumsum(counts.to(torch.int64), 0)
    total = int(ends[-1]) if n_pixels else 0  # the one host read
    if total > INDEX_LIMIT:
        raise ValueError(f"{total} pairs exceed the int32 range of the cuda backend's counts")
    outs = tuple(empty((total,), torch.int64, device) for _ in range(3))
    if total:
        firsts = (ends - counts).contiguous()
        for image0, n_block in grid:
            launch(_kernel(ft, tile_size, True), (tw, th, n_block), (tile_size, tile_size),
                   device, *args, image0, n_images, counts, firsts, *outs)
    return outs
