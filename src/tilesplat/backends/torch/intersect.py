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

from ...constants import ALPHA_SKIP, PIXEL_CENTER, TILE_CONIC_SLACK, TILE_SIGMA_SLACK


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


def _box_pairs(means2d: Tensor, radii: Tensor, tile_size: int, tile_width: int,
               tile_height: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every (Gaussian, tile) pair of the boxes of means2d [G, 2] and radii [G, 2], by Gaussian
    then tile row-major: (gid [n], tile column tx [n], tile row ty [n]), int64."""
    lo, hi = tile_ranges(means2d, radii, tile_size, tile_width, tile_height)
    span = hi - lo
    counts = span[:, 0] * span[:, 1] * (radii > 0).all(dim=-1)
    n = int(counts.sum())
    dev = means2d.device
    gid = torch.repeat_interleave(torch.arange(means2d.shape[0], device=dev), counts)
    first = torch.cumsum(counts, 0) - counts
    j = torch.arange(n, device=dev) - first[gid]
    w = span[gid, 0].clamp_min(1)
    return gid, lo[gid, 0] + j % w, lo[gid, 1] + j // w


def _lists(gid: Tensor, tx: Tensor, ty: Tensor, depths: Tensor, image_ids: Tensor | None,
           n_per_image: int, tile_width: int, tile_height: int, sort: bool,
           capacity: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """The intersections of the pairs (gid, tx, ty) [n] listed in that order, of Gaussians
    with depths [G] (image_ids [G] packed, else the image of row g is g // n_per_image):
    (tiles_per_gauss [G] int32, isect_ids [n] int64, flatten_ids [n] int32), keyed, cut or
    padded to ``capacity`` and sorted as the module docstring says."""
    G = depths.shape[0]
    dev = depths.device
    if image_ids is not None:
        img = image_ids.to(torch.int64)
    else:
        img = torch.arange(G, device=dev, dtype=torch.int64) // max(n_per_image, 1)
    counts = torch.bincount(gid, minlength=G)
    tile_id = ty * tile_width + tx
    bits = tile_bits(tile_width, tile_height)
    isect_ids = (img[gid] << (32 + bits)) | (tile_id << 32) | depth_key(depths)[gid]
    flatten_ids = gid
    if capacity is not None:
        if capacity < 1:
            raise ValueError(f"capacity must be a positive number of intersections, got "
                             f"{capacity}")
        kept = min(gid.shape[0], capacity)
        unused = capacity - kept
        isect_ids = torch.cat([isect_ids[:kept], isect_ids.new_full((unused,), -1)])
        flatten_ids = torch.cat([flatten_ids[:kept], flatten_ids.new_zeros(unused)])
    if sort:
        isect_ids, order = torch.sort(isect_ids, stable=True)
        flatten_ids = flatten_ids[order]
    return counts.to(torch.int32), isect_ids, flatten_ids.to(torch.int32)


@torch.no_grad()
def isect_tiles(means2d, radii, depths, tile_size, tile_width, tile_height, sort, n_images,
                image_ids, gaussian_ids, capacity=None):
    """gsplat's ``isect_tiles``: every tile of each Gaussian's box (module docstring).

    Shapes: means2d [I,N,2] or [nnz,2], radii int [same], depths [I,N] or [nnz]; packed when
    ``image_ids`` is given. Returns tiles_per_gauss [I,N] or [nnz] int32, isect_ids [n] int64,
    flatten_ids [n] int32 (n = ``capacity`` when given).
    """
    lead = means2d.shape[:-1]
    m = means2d.reshape(-1, 2)
    gid, tx, ty = _box_pairs(m, radii.reshape(-1, 2), tile_size, tile_width, tile_height)
    counts, isect_ids, flatten_ids = _lists(
        gid, tx, ty, depths.reshape(-1), image_ids, means2d.shape[-2], tile_width, tile_height,
        sort, capacity)
    return counts.reshape(lead), isect_ids, flatten_ids


isect_tiles.takes_capacity = True


def alpha_ellipse(conics: Tensor, opacities: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The bound of ``backends/shared/tiles.py`` ``alpha_ellipse``, in float64: the conics
    [G, 3] with the diagonal shrunk by TILE_CONIC_SLACK, the level [G] the form stays under
    wherever alpha can reach ALPHA_SKIP (-1: nowhere, below it; inf: no bound, the shrunk form
    is not positive definite) and the ellipse's half-extents [G, 2] in x and y."""
    a, b, c = conics.to(torch.float64).unbind(-1)
    op = opacities.to(torch.float64)
    a_low = a - TILE_CONIC_SLACK * (a + b.abs())
    c_low = c - TILE_CONIC_SLACK * (c + b.abs())
    det = a_low * c_low - b * b
    tau = torch.log(op / ALPHA_SKIP).clamp_min(0.0)
    level = tau + TILE_SIGMA_SLACK * (1.0 + tau)
    half = torch.stack([torch.sqrt(2.0 * level * c_low / det),
                        torch.sqrt(2.0 * level * a_low / det)], -1)
    bounded = (a_low > 0) & (c_low > 0) & (det > 0)
    level = torch.where(bounded, level, torch.inf)
    half = torch.where(bounded[:, None], half, torch.inf)
    visible = op >= ALPHA_SKIP
    level = torch.where(visible, level, -1.0)
    half = torch.where(visible[:, None], half, 0.0)
    return torch.stack([a_low, b, c_low], -1), level, half


def row_span(form: Tensor, level: Tensor, half: Tensor, my: Tensor, ty: Tensor,
             tile_size: int, height: int) -> tuple[Tensor, Tensor]:
    """(xl, xr) [n] of ``shared/tiles.py`` ``row_span``: the offsets dx = mx - x at which the
    ellipse (form [n, 3], level [n], half [n, 2] of :func:`alpha_ellipse`) around means at
    heights my [n] holds a point of tile row ty [n] inside the image; xl > xr: none.

    The ellipse's right end over the band of the row's pixel centres is largest at the band's
    point nearest the dy of its rightmost point (-b x_half / c), its left end smallest at the
    one nearest +b x_half / c."""
    a, b, c = form.unbind(-1)
    top = ty.to(torch.float64) * tile_size
    y_lo = top + PIXEL_CENTER
    y_hi = torch.clamp_max(top + tile_size, float(height)) - PIXEL_CENTER
    lo = torch.maximum(my - y_hi, -half[:, 1])
    hi = torch.minimum(my - y_lo, half[:, 1])
    det = a * c - b * b
    two_a_level = 2.0 * a * level

    def end(dy_extreme, sign):  # the ellipse's end in x at the band's dy nearest dy_extreme
        dy = torch.minimum(torch.maximum(dy_extreme, lo), hi)
        return (-b * dy + sign * torch.sqrt(torch.clamp_min(two_a_level - det * dy * dy, 0.0))) / a

    xr = end(-b * half[:, 0] / c, 1.0)
    xl = end(b * half[:, 0] / c, -1.0)
    none = (level < 0) | (y_hi < y_lo) | ((level != torch.inf) & (lo > hi))
    xl = torch.where(level == torch.inf, -torch.inf, xl)
    xr = torch.where(level == torch.inf, torch.inf, xr)
    return torch.where(none, torch.inf, xl), torch.where(none, -torch.inf, xr)


def tiles_reached(means2d: Tensor, conics: Tensor, opacities: Tensor, gid: Tensor, tx: Tensor,
                  ty: Tensor, tile_size: int, width: int, height: int) -> Tensor:
    """bool [n]: whether Gaussian gid's alpha-threshold ellipse (:func:`alpha_ellipse`) meets
    the rectangle of pixel centres of tile (tx, ty) inside the width x height image; means2d
    [G, 2], conics [G, 3], opacities [G], gid / tx / ty [n]."""
    form, level, half = alpha_ellipse(conics, opacities)
    m = means2d.to(torch.float64)[gid]
    xl, xr = row_span(form[gid], level[gid], half[gid], m[:, 1], ty, tile_size, height)
    left = tx.to(torch.float64) * tile_size
    x_lo = left + PIXEL_CENTER
    x_hi = torch.clamp_max(left + tile_size, float(width)) - PIXEL_CENTER
    return (x_lo <= x_hi) & (m[:, 0] - x_hi <= xr) & (m[:, 0] - x_lo >= xl)


@torch.no_grad()
def isect_tiles_tight(means2d, radii, depths, conics, opacities, tile_size, tile_width,
                      tile_height, width, height, sort, n_images, image_ids, gaussian_ids,
                      capacity=None):
    """``rasterization()``'s tile lists: the pairs of :func:`isect_tiles` whose tile the
    Gaussian's alpha-threshold ellipse reaches (:func:`tiles_reached`), in the same order.

    Shapes as :func:`isect_tiles`, plus conics [I,N,3] or [nnz,3] and opacities [I,N] or
    [nnz] (the ones the rasterizer gets: compensation included); width, height: the image.
    """
    lead = means2d.shape[:-1]
    m = means2d.reshape(-1, 2)
    gid, tx, ty = _box_pairs(m, radii.reshape(-1, 2), tile_size, tile_width, tile_height)
    keep = tiles_reached(m, conics.reshape(-1, 3), opacities.reshape(-1), gid, tx, ty,
                         tile_size, width, height)
    counts, isect_ids, flatten_ids = _lists(
        gid[keep], tx[keep], ty[keep], depths.reshape(-1), image_ids, means2d.shape[-2],
        tile_width, tile_height, sort, capacity)
    return counts.reshape(lead), isect_ids, flatten_ids


isect_tiles_tight.takes_capacity = True


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
