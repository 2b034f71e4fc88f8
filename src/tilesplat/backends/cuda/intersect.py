"""Tile intersection kernels: ``isect_tiles`` (count, prefix sum, fill, stable sort), its
tight variant ``isect_tiles_tight`` (the same kernels compiled with ``tight``: a tile is
listed only if the Gaussian's alpha-threshold ellipse reaches it, ``shared.tiles``, in
float64) and ``isect_offset_encode``.

The prefix sum and the sort run as PyTorch ops on the same stream (``torch.cumsum``,
``torch.sort(stable=True)``). Intersections are written by Gaussian, then tile row-major,
before the stable sort, so the order equals the reference's.

Two ways to size the lists:

- exact (the default, and what a caller of the public op gets): one host synchronisation
  reads the number of intersections and the lists hold exactly that many;
- at a ``capacity`` (the trainer's step, ``ops/intersect_capacity.py``): the lists hold
  ``capacity`` entries whatever the count, so nothing is read back and every step allocates
  the same shapes. The slots past the count keep the key -1, which the stable sort moves to
  the front (every real key is >= 0: image, tile and a positive float32 depth), and
  :func:`isect_offset_encode` starts tile 0 after them; so each tile's list is where it is
  in exact mode, and the last tile still ends at the lists' length. Intersections past the
  capacity are not written; the caller sees the count (the sum of ``tiles_per_gauss``) and
  redoes the render with a larger capacity.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import torch
from numba import cuda

from .device_math import device_math
from .runtime import INDEX_LIMIT, cdiv, empty, float_type, launch, launcher, optional

THREADS = 256


def make_isect_count(ft: type, tight: bool = False):
    """Kernel body: tiles_per_gauss[g] = number of tiles listed for the Gaussian: every tile
    of its box, or with ``tight`` those that its alpha-threshold ellipse reaches
    (``shared.tiles``, in float64); conics, opacities, width and height are read only then."""
    sm = device_math()

    def isect_count(means2d, radii, conics, opacities, width, height, tile_size, tile_width,
                    tile_height, counts):
        # means2d [G, 2], radii [G, 2] int32, conics [G, 3], opacities [G] -> counts [G] int32
        g = cuda.grid(1)
        if g >= counts.shape[0]:
            return
        if radii[g, 0] <= 0 or radii[g, 1] <= 0:
            counts[g] = 0
            return
        ts = ft(tile_size)
        mx = means2d[g, 0] / ts
        my = means2d[g, 1] / ts
        rx = ft(radii[g, 0]) / ts
        ry = ft(radii[g, 1]) / ts
        x0 = min(max(int(math.floor(mx - rx)), 0), tile_width)
        x1 = min(max(int(math.ceil(mx + rx)), 0), tile_width)
        y0 = min(max(int(math.floor(my - ry)), 0), tile_height)
        y1 = min(max(int(math.ceil(my + ry)), 0), tile_height)
        if not tight:
            counts[g] = (x1 - x0) * (y1 - y0)
            return
        a, b, c, level, x_half, y_half = sm.alpha_ellipse(
            np.float64(conics[g, 0]), np.float64(conics[g, 1]), np.float64(conics[g, 2]),
            np.float64(opacities[g]))
        px = np.float64(means2d[g, 0])
        py = np.float64(means2d[g, 1])
        kept = 0
        for ty in range(y0, y1):
            xl, xr = sm.row_span(a, b, c, level, x_half, y_half, py, ty, tile_size, height)
            for tx in range(x0, x1):
                if sm.tile_in_span(xl, xr, px, tx, tile_size, width):
                    kept += 1
        counts[g] = kept

    return isect_count


def make_isect_fill(ft: type, tight: bool = False):
    """Kernel body: writes each Gaussian's keys and ids from its first slot on, for the tiles
    the count kernel of the same ``tight`` counted."""
    sm = device_math()

    def isect_fill(
        means2d, radii, conics, opacities, width, height, depth_bits, image_ids, packed,
        n_per_image, tile_size, tile_width, tile_height, tile_bits, ends, isect_ids, flatten_ids,
    ):  # fmt: skip
        # means2d [G, 2], radii [G, 2], conics [G, 3], opacities [G], depth_bits [G] int64,
        # image_ids [G] (packed), ends [G] int64 inclusive prefix sum of the counts
        # -> isect_ids [n] int64, flatten_ids [n]
        g = cuda.grid(1)
        if g >= ends.shape[0]:
            return
        if radii[g, 0] <= 0 or radii[g, 1] <= 0:
            return
        ts = ft(tile_size)
        mx = means2d[g, 0] / ts
        my = means2d[g, 1] / ts
        rx = ft(radii[g, 0]) / ts
        ry = ft(radii[g, 1]) / ts
        x0 = min(max(int(math.floor(mx - rx)), 0), tile_width)
        x1 = min(max(int(math.ceil(mx + rx)), 0), tile_width)
        y0 = min(max(int(math.floor(my - ry)), 0), tile_height)
        y1 = min(max(int(math.ceil(my + ry)), 0), tile_height)
        slot = np.int64(0) if g == 0 else ends[g - 1]
        stop = isect_ids.shape[0]  # the capacity: an overflowing intersection is dropped
        image = np.int64(image_ids[g]) if packed else np.int64(g // n_per_image)
        high = image << (32 + tile_bits)
        a = b = c = level = x_half = y_half = np.float64(0.0)
        if tight:
            a, b, c, level, x_half, y_half = sm.alpha_ellipse(
                np.float64(conics[g, 0]), np.float64(conics[g, 1]), np.float64(conics[g, 2]),
                np.float64(opacities[g]))
        px = np.float64(means2d[g, 0])
        py = np.float64(means2d[g, 1])
        for ty in range(y0, y1):
            xl = xr = np.float64(0.0)
            if tight:
                xl, xr = sm.row_span(a, b, c, level, x_half, y_half, py, ty, tile_size, height)
            for tx in range(x0, x1):
                if tight and not sm.tile_in_span(xl, xr, px, tx, tile_size, width):
                    continue
                if slot >= stop:
                    return
                tile = np.int64(ty * tile_width + tx)
                isect_ids[slot] = high | (tile << 32) | depth_bits[g]
                flatten_ids[slot] = g
                slot += 1

    return isect_fill


def isect_offset_encode_kernel(isect_ids, tile_bits, n_tiles, offsets):
    """Kernel body: offsets[t] = first intersection of flat tile t (t over I * TH * TW).

    Keys < 0 are the unused slots of lists sized at a capacity (sorted to the front): they
    belong to no tile; when every key is one, every tile starts (and ends) at n."""
    i = cuda.grid(1)
    n = isect_ids.shape[0]
    if i >= n:
        return
    if isect_ids[i] < 0:
        if i == n - 1:
            for t in range(offsets.shape[0]):
                offsets[t] = n
        return
    high = isect_ids[i] >> 32
    flat = (high >> tile_bits) * n_tiles + (high & ((np.int64(1) << tile_bits) - 1))
    prev = np.int64(-1)
    if i > 0 and isect_ids[i - 1] >= 0:
        ph = isect_ids[i - 1] >> 32
        prev = (ph >> tile_bits) * n_tiles + (ph & ((np.int64(1) << tile_bits) - 1))
    for t in range(prev + 1, flat + 1):
        offsets[t] = i
    if i == n - 1:
        for t in range(flat + 1, offsets.shape[0]):
            offsets[t] = n


@cache
def _count_kernel(ft: type, tight: bool):
    return cuda.jit(make_isect_count(ft, tight))


@cache
def _fill_kernel(ft: type, tight: bool):
    return cuda.jit(make_isect_fill(ft, tight))


@cache
def _offset_kernel():
    return cuda.jit(isect_offset_encode_kernel)


def _depth_bits(depths: torch.Tensor) -> torch.Tensor:
    """The float32 bit pattern of each depth, zero-extended to int64."""
    bits = depths.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    return bits & 0xFFFFFFFF


def _isect(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    conics: torch.Tensor | None,  # [I, N, 3] or [nnz, 3]; None: every tile of the box
    opacities: torch.Tensor | None,  # [I, N] or [nnz]
    width: int,
    height: int,
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    image_ids: torch.Tensor | None,  # [nnz]
    capacity: int | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both ops' lists: tiles_per_gauss [I,N] or [nnz] int32, isect_ids [n] int64,
    flatten_ids [n] (n = ``capacity`` when given)."""
    lead = means2d.shape[:-1]
    device = means2d.device
    m = means2d.reshape(-1, 2).contiguous()
    r = radii.reshape(-1, 2).to(torch.int32).contiguous()
    n_rows = m.shape[0]
    counts = torch.zeros(n_rows, dtype=torch.int32, device=device)
    if capacity is not None and capacity < 1:
        raise ValueError(f"capacity must be a positive number of intersections, got {capacity}")
    if n_rows == 0:
        size = 0 if capacity is None else capacity
        keys = torch.full((size,), -1, dtype=torch.int64, device=device)
        return counts.reshape(lead), keys, torch.zeros(size, dtype=torch.int32, device=device)
    if n_rows > INDEX_LIMIT:
        raise ValueError(
            f"{n_rows} projected Gaussians exceed the int32 range of flatten_ids in the cuda "
            f"backend (at most {INDEX_LIMIT}); render fewer cameras per call"
        )
    ft = float_type(m.dtype)
    tight = conics is not None
    # the square kernels never read conics and opacities: placeholders
    con = optional(None if conics is None else conics.reshape(-1, 3).contiguous(), m, 2)
    opa = optional(None if opacities is None else opacities.reshape(-1).contiguous(), m, 1)
    blocks = cdiv(n_rows, THREADS)
    launch(_count_kernel(ft, tight), blocks, THREADS, device, m, r, con, opa, width, height,
           tile_size, tile_width, tile_height, counts)
    ends = torch.cumsum(counts, 0, dtype=torch.int64)
    if capacity is None:
        n = int(ends[-1])  # the one host synchronisation: the size of the lists
        size = max(n, 1)
    else:
        n = size = capacity
    if n > INDEX_LIMIT:
        raise ValueError(
            f"{n} tile intersections exceed the int32 index range of the cuda backend "
            f"(isect_offsets, flatten_ids and last_ids hold at most {INDEX_LIMIT}); render "
            "fewer cameras per call, fewer or smaller Gaussians, or use a larger tile_size"
        )
    if capacity is None:
        isect_ids = empty(size, torch.int64, device)
        flatten_ids = empty(size, torch.int32, device)
    else:  # the slots no intersection fills keep key -1 (sorted first) and Gaussian 0
        isect_ids = torch.full((size,), -1, dtype=torch.int64, device=device)
        flatten_ids = torch.zeros(size, dtype=torch.int32, device=device)
    packed = image_ids is not None
    n_per_image = 1 if packed else max(means2d.shape[-2], 1)
    bits = (tile_width * tile_height).bit_length()
    ids = None if image_ids is None else image_ids.to(torch.int32).contiguous()
    launch(
        _fill_kernel(ft, tight), blocks, THREADS, device,
        m, r, con, opa, width, height, _depth_bits(depths.reshape(-1)),
        optional(ids, counts, 1, torch.int32), packed, n_per_image, tile_size, tile_width,
        tile_height, bits, ends, isect_ids, flatten_ids,
    )  # fmt: skip
    isect_ids, flatten_ids = isect_ids[:n], flatten_ids[:n]
    if sort and n > 0:
        isect_ids, order = torch.sort(isect_ids, stable=True)
        flatten_ids = flatten_ids[order]
    return counts.reshape(lead), isect_ids, flatten_ids


@launcher
@torch.no_grad()
def isect_tiles(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    n_images: int,
    image_ids: torch.Tensor | None,  # [nnz]
    gaussian_ids: torch.Tensor | None,  # [nnz] (not needed: flatten_ids are rows)
    capacity: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launcher of gsplat's lists (every tile of the box): tiles_per_gauss [I,N] or [nnz]
    int32, isect_ids [n] int64, flatten_ids [n]; with ``capacity`` the lists hold
    ``capacity`` entries, the unused ones first, with key -1 and id 0, and nothing is read
    back (see the module docstring)."""
    del n_images, gaussian_ids  # the image of a row comes from image_ids or its index
    return _isect(means2d, radii, depths, None, None, 0, 0, tile_size, tile_width, tile_height,
                  sort, image_ids, capacity)


isect_tiles.takes_capacity = True  # type: ignore[attr-defined]


@launcher
@torch.no_grad()
def isect_tiles_tight(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    conics: torch.Tensor,  # [I, N, 3] or [nnz, 3]
    opacities: torch.Tensor,  # [I, N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    width: int,
    height: int,
    sort: bool,
    n_images: int,
    image_ids: torch.Tensor | None,  # [nnz]
    gaussian_ids: torch.Tensor | None,  # [nnz] (not needed)
    capacity: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launcher of rasterization()'s lists (the tiles of :func:`isect_tiles` that the
    alpha-threshold ellipse reaches, in the same order); outputs and ``capacity`` as there."""
    del n_images, gaussian_ids
    return _isect(means2d, radii, depths, conics, opacities, width, height, tile_size,
                  tile_width, tile_height, sort, image_ids, capacity)


isect_tiles_tight.takes_capacity = True  # type: ignore[attr-defined]


@launcher
@torch.no_grad()
def isect_offset_encode(
    isect_ids: torch.Tensor,  # [n] int64, sorted
    n_images: int,
    tile_width: int,
    tile_height: int,
) -> torch.Tensor:
    """Launcher: offsets [I, TH, TW] int32, the first intersection of each tile."""
    n_tiles = tile_width * tile_height
    device = isect_ids.device
    n = isect_ids.shape[0]
    if n == 0 or n_images * n_tiles == 0:
        return torch.zeros((n_images, tile_height, tile_width), dtype=torch.int32, device=device)
    offsets = empty(n_images * n_tiles, torch.int32, device)
    bits = (tile_width * tile_height).bit_length()
    launch(_offset_kernel(), cdiv(n, THREADS), THREADS, device, isect_ids.contiguous(), bits,
           n_tiles, offsets)
    return offsets.reshape(n_images, tile_height, tile_width)
