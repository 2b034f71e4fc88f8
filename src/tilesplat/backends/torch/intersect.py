"""Reference: Gaussian–tile intersections (``isect_tiles``) and tile offsets
(``isect_offset_encode``).

Each Gaussian with both radii > 0 covers the tiles ``floor(m/ts - r/ts) .. ceil(m/ts + r/ts)``
(exclusive end) clamped to the grid. One intersection per (image, tile, Gaussian), keyed
``image_id << (32 + tile_bits) | tile_id << 32 | float32 bits of depth`` and sorted stably,
so ties keep the order "by Gaussian, then tile row-major".

With a ``capacity`` (``ops/intersect_capacity.py``) the lists hold ``capacity`` entries: the
first ``capacity`` intersections in that order, then unused slots with key -1 and id 0, which
the stable sort puts first; :func:`isect_offset_encode` starts tile 0 after them. This is the
contract the ``cuda`` backend's capacity mode follows, here to compare it with.
"""

from __future__ import annotations

import torch
from torch import Tensor


def tile_bits(tile_width: int, tile_height: int) -> int:
    return (tile_width * tile_height).bit_length()


def tile_ranges(means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int,
                tile_height: int) -> tuple[Tensor, Tensor]:
    """Tile bounds [G, 2] (x, y) of each Gaussian: min inclusive, max exclusive."""
    tm = means2d / tile_size
    tr = radii.to(means2d.dtype) / tile_size
    lo = torch.floor(tm - tr).to(torch.int64)
    hi = torch.ceil(tm + tr).to(torch.int64)
    limit = torch.tensor([tile_width, tile_height], device=means2d.device)
    lo = torch.minimum(torch.clamp(lo, min=0), limit)
    hi = torch.minimum(torch.clamp(hi, min=0), limit)
    return lo, hi


def depth_key(depths: Tensor) -> Tensor:
    """The float32 bit pattern of each depth, zero-extended to int64."""
    bits = depths.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return bits & 0xFFFFFFFF


@torch.no_grad()
def isect_tiles(means2d, radii, depths, tile_size, tile_width, tile_height, sort, n_images,
                image_ids, gaussian_ids, capacity=None):
    """See module docstring. Shapes: means2d [I,N,2] or [nnz,2], radii int [same], depths
    [I,N] or [nnz]; packed when ``image_ids`` is given.

    Returns tiles_per_gauss [I,N] or [nnz] int32, isect_ids [n] int64, flatten_ids [n] int32
    (n = ``capacity`` when given).
    """
    packed = image_ids is not None
    lead = means2d.shape[:-1]
    m = means2d.reshape(-1, 2)
    r = radii.reshape(-1, 2)
    d = depths.reshape(-1)
    G = m.shape[0]
    dev = m.device
    if packed:
        img = image_ids.to(torch.int64)
    else:
        N = means2d.shape[-2]
        img = torch.arange(G, device=dev, dtype=torch.int64) // max(N, 1)
    lo, hi = tile_ranges(m, r, tile_size, tile_width, tile_height)
    span = hi - lo
    counts = span[:, 0] * span[:, 1] * (r > 0).all(dim=-1)
    n = int(counts.sum())
    gid = torch.repeat_interleave(torch.arange(G, device=dev), counts)
    first = torch.cumsum(counts, 0) - counts
    j = torch.arange(n, device=dev) - first[gid]
    w = span[gid, 0].clamp_min(1)
    tx = lo[gid, 0] + j % w
    ty = lo[gid, 1] + j // w
    tile_id = ty * tile_width + tx
    bits = tile_bits(tile_width, tile_height)
    isect_ids = (img[gid] << (32 + bits)) | (tile_id << 32) | depth_key(d)[gid]
    flatten_ids = gid
    if capacity is not None:
        if capacity < 1:
            raise ValueError(f"capacity must be a positive number of intersections, got "
                             f"{capacity}")
        kept = min(n, capacity)
        unused = capacity - kept
        isect_ids = torch.cat([isect_ids[:kept], isect_ids.new_full((unused,), -1)])
        flatten_ids = torch.cat([flatten_ids[:kept], flatten_ids.new_zeros(unused)])
    if sort:
        isect_ids, order = torch.sort(isect_ids, stable=True)
        flatten_ids = flatten_ids[order]
    return counts.to(torch.int32).reshape(lead), isect_ids, flatten_ids.to(torch.int32)


isect_tiles.takes_capacity = True


@torch.no_grad()
def isect_offset_encode(isect_ids: Tensor, n_images: int, tile_width: int,
                        tile_height: int) -> Tensor:
    """offsets [I, TH, TW] int32: index of each tile's first intersection in the sorted list
    (for an empty tile: where its intersections would start)."""
    bits = tile_bits(tile_width, tile_height)
    n_tiles = tile_width * tile_height
    unused = int((isect_ids < 0).sum())  # a capacity's unused slots, sorted first
    isect_ids = isect_ids[unused:]
    hi = isect_ids >> 32
    flat = (hi >> bits) * n_tiles + (hi & ((1 << bits) - 1))
    counts = torch.bincount(flat, minlength=n_images * n_tiles)[: n_images * n_tiles]
    offsets = torch.cumsum(counts, 0) - counts + unused
    return offsets.to(torch.int32).reshape(n_images, tile_height, tile_width)
