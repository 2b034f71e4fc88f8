"""CPU kernels: Gaussian–tile intersections (``isect_tiles``) and tile offsets
(``isect_offset_encode``), giving exactly the reference's order.

The reference lists intersections by Gaussian then tile row-major and sorts them stably by
``image << (32 + tile_bits) | tile << 32 | depth bits``. Here the same order comes from a
stable counting sort by (image, tile) — a count pass, a prefix sum and a fill pass in listing
order — then a stable sort of each tile's segment by the depth bits (tiles spread over a pool
of threads).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..scalar_math import like
from ._common import BLOCK, alloc, parallel_for, view

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def _tile_range(means2d, radii, g, tile_size, tile_width, tile_height):
    """[x0, x1) x [y0, y1) tile bounds of Gaussian g (as the reference, in its dtype)."""
    mx = means2d[g, 0]
    my = means2d[g, 1]
    rx = like(mx, radii[g, 0])
    ry = like(mx, radii[g, 1])
    ts = like(mx, tile_size)
    tmx = mx / ts
    tmy = my / ts
    trx = rx / ts
    try_ = ry / ts
    x0 = min(max(np.int64(math.floor(tmx - trx)), 0), tile_width)
    x1 = min(max(np.int64(math.ceil(tmx + trx)), 0), tile_width)
    y0 = min(max(np.int64(math.floor(tmy - try_)), 0), tile_height)
    y1 = min(max(np.int64(math.ceil(tmy + try_)), 0), tile_height)
    return x0, x1, y0, y1


@njit(nogil=True, cache=True, error_model="numpy")
def count_kernel(first, step, means2d, radii, tile_size, tile_width, tile_height, counts):
    """counts [G] int64: tiles covered by each Gaussian (0 unless both radii > 0)."""
    n = means2d.shape[0]
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        count_block(
            means2d,
            radii,
            tile_size,
            tile_width,
            tile_height,
            counts,
            blk * BLOCK,
            min(n, (blk + 1) * BLOCK),
        )


@njit(cache=True, error_model="numpy")
def count_block(means2d, radii, tile_size, tile_width, tile_height, counts, lo, hi):
    for g in range(lo, hi):
        rx = radii[g, 0]
        ry = radii[g, 1]
        if rx > 0 and ry > 0:
            x0, x1, y0, y1 = _tile_range(means2d, radii, g, tile_size, tile_width, tile_height)
            counts[g] = (x1 - x0) * (y1 - y0)
        else:
            counts[g] = 0


@njit(cache=True, error_model="numpy")
def fill_kernel(
    means2d,
    radii,
    image_of,
    depth_bits,
    counts,
    tile_size,
    tile_width,
    tile_height,
    n_images,
    tile_first,
    flatten_ids,
    keys,
):
    """Counting sort by (image, tile): tile_first [I*T + 1] segment starts; flatten_ids [n]
    and keys [n] (depth bits, unsigned) in listing order within each segment."""
    n_tiles = tile_width * tile_height
    tile_first[:] = 0
    for g in range(means2d.shape[0]):
        if counts[g] == 0:
            continue
        x0, x1, y0, y1 = _tile_range(means2d, radii, g, tile_size, tile_width, tile_height)
        base = image_of[g] * n_tiles
        for ty in range(y0, y1):
            for tx in range(x0, x1):
                tile_first[base + ty * tile_width + tx + 1] += 1
    for t in range(n_images * n_tiles):
        tile_first[t + 1] += tile_first[t]
    cursor = tile_first[:-1].copy()
    for g in range(means2d.shape[0]):
        if counts[g] == 0:
            continue
        x0, x1, y0, y1 = _tile_range(means2d, radii, g, tile_size, tile_width, tile_height)
        base = image_of[g] * n_tiles
        key = np.int64(depth_bits[g]) & np.int64(0xFFFFFFFF)
        for ty in range(y0, y1):
            for tx in range(x0, x1):
                t = base + ty * tile_width + tx
                j = cursor[t]
                cursor[t] = j + 1
                flatten_ids[j] = g
                keys[j] = key


@njit(nogil=True, cache=True, error_model="numpy")
def sort_segments_kernel(first, step, tile_first, flatten_ids, keys, tile_bits, n_tiles, isect_ids):
    """Stable sort of every tile's segment by depth bits; writes the full 64-bit keys."""
    n_seg = tile_first.shape[0] - 1
    for t in range(first, n_seg, step):
        lo = tile_first[t]
        hi = tile_first[t + 1]
        if hi - lo > 1:
            order = np.argsort(keys[lo:hi], kind="mergesort")
            seg_ids = flatten_ids[lo:hi].copy()
            seg_keys = keys[lo:hi].copy()
            for j in range(hi - lo):
                flatten_ids[lo + j] = seg_ids[order[j]]
                keys[lo + j] = seg_keys[order[j]]
        img = np.int64(t // n_tiles)
        tile = np.int64(t - img * n_tiles)
        high = (img << (32 + tile_bits)) | (tile << 32)
        for j in range(lo, hi):
            isect_ids[j] = high | keys[j]


@njit(nogil=True, cache=True, error_model="numpy")
def unsorted_kernel(
    means2d,
    radii,
    image_of,
    depth_bits,
    counts,
    first,
    tile_size,
    tile_width,
    tile_height,
    tile_bits,
    flatten_ids,
    isect_ids,
):
    """Listing order (by Gaussian, then tile row-major) for sort=False."""
    for g in range(means2d.shape[0]):
        if counts[g] == 0:
            continue
        x0, x1, y0, y1 = _tile_range(means2d, radii, g, tile_size, tile_width, tile_height)
        key = np.int64(depth_bits[g]) & np.int64(0xFFFFFFFF)
        high = np.int64(image_of[g]) << (32 + tile_bits)
        j = first[g]
        for ty in range(y0, y1):
            for tx in range(x0, x1):
                flatten_ids[j] = g
                isect_ids[j] = high | (np.int64(ty * tile_width + tx) << 32) | key
                j += 1


@njit(cache=True, error_model="numpy")
def offset_kernel(isect_ids, tile_bits, n_tiles, offsets):
    """offsets [I*T]: exclusive prefix sum of the per-tile counts of the sorted keys."""
    offsets[:] = 0
    mask = (np.int64(1) << tile_bits) - 1
    n_all = offsets.shape[0]
    counts = np.zeros(n_all + 1, np.int64)
    for j in range(isect_ids.shape[0]):
        high = isect_ids[j] >> 32
        flat = (high >> tile_bits) * n_tiles + (high & mask)
        if flat < n_all:
            counts[flat] += 1
    run = np.int64(0)
    for t in range(n_all):
        offsets[t] = run
        run += counts[t]


# ---------------------------------------------------------------------------------------------
# launchers


def isect_tiles(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    n_images: int,
    image_ids: torch.Tensor | None,  # [nnz] (packed)
    gaussian_ids: torch.Tensor | None,  # [nnz] (packed; unused: flatten_ids are rows)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns tiles_per_gauss [I, N] or [nnz] int32, isect_ids [n] int64, flatten_ids [n]."""
    del gaussian_ids
    lead = means2d.shape[:-1]
    m = view(means2d.reshape(-1, 2))
    r = view(radii.reshape(-1, 2))
    n_gauss = m.shape[0]
    if image_ids is not None:
        image_of = view(image_ids.to(torch.int64))
    else:
        per_image = means2d.shape[-2] if means2d.dim() == 3 else n_gauss
        image_of = np.arange(n_gauss, dtype=np.int64) // max(per_image, 1)
    bits = view(depths.reshape(-1).to(torch.float32).contiguous().view(torch.int32))
    counts = np.empty(n_gauss, np.int64)
    parallel_for(
        count_kernel,
        (n_gauss + BLOCK - 1) // BLOCK,
        m,
        r,
        tile_size,
        tile_width,
        tile_height,
        counts,
    )
    n = int(counts.sum())
    n_tiles = tile_width * tile_height
    t_bits = n_tiles.bit_length()
    flatten_ids = alloc((n,), torch.int32)
    isect_ids = alloc((n,), torch.int64)
    if sort:
        tile_first = np.empty(n_images * n_tiles + 1, np.int64)
        keys = np.empty(n, np.int64)
        fill_kernel(
            m,
            r,
            image_of,
            bits,
            counts,
            tile_size,
            tile_width,
            tile_height,
            n_images,
            tile_first,
            view(flatten_ids),
            keys,
        )
        parallel_for(
            sort_segments_kernel,
            n_images * n_tiles,
            tile_first,
            view(flatten_ids),
            keys,
            t_bits,
            n_tiles,
            view(isect_ids),
        )
    else:
        first = np.cumsum(counts) - counts
        unsorted_kernel(
            m,
            r,
            image_of,
            bits,
            counts,
            first,
            tile_size,
            tile_width,
            tile_height,
            t_bits,
            view(flatten_ids),
            view(isect_ids),
        )
    tiles_per_gauss = torch.from_numpy(counts.astype(np.int32)).reshape(lead)
    return tiles_per_gauss, isect_ids, flatten_ids


def isect_offset_encode(
    isect_ids: torch.Tensor,  # [n] int64, sorted
    n_images: int,
    tile_width: int,
    tile_height: int,
) -> torch.Tensor:
    """Returns offsets [I, TH, TW] int32: each tile's first intersection."""
    n_tiles = tile_width * tile_height
    offsets = alloc((n_images, tile_height, tile_width), torch.int32)
    offset_kernel(view(isect_ids), n_tiles.bit_length(), n_tiles, view(offsets).reshape(-1))
    return offsets
