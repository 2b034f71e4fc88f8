"""Public ops ``isect_tiles`` and ``isect_offset_encode``: which Gaussians touch which tile."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backends.registry import resolve
from .intersect_capacity import counting, current_capacity
from .validation import (
    Shapes,
    as_int32,
    check_bool,
    check_finite,
    check_int_at_least,
    check_positive_int,
    check_tensor,
    common_float,
    values_trusted,
)


def _check_key_bits(n_images: int, tile_width: int, tile_height: int) -> None:
    bits = n_images.bit_length() + (tile_width * tile_height).bit_length() + 32
    if bits > 63:
        raise ValueError(
            f"too many images × tiles for 64-bit intersection ids: {n_images} images of "
            f"{tile_width}×{tile_height} tiles need {bits} bits"
        )


@torch.no_grad()
def isect_tiles(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    radii: Tensor,  # [..., N, 2] or [nnz, 2]
    depths: Tensor,  # [..., N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool = True,
    segmented: bool = False,
    packed: bool = False,
    n_images: int | None = None,
    image_ids: Tensor | None = None,  # [nnz]
    gaussian_ids: Tensor | None = None,  # [nnz]
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Maps projected Gaussians to the tiles they overlap.

    ``segmented`` is accepted for gsplat compatibility and gives the same result.

    Inside ``ops.intersect_capacity.intersection_capacity`` (the trainer's step) a backend
    that can sizes the lists at the capacity, the unused entries first with key -1, and
    reads nothing back; the lists are exact otherwise.

    Returns:
        tiles_per_gauss: [..., N] or [nnz] int32,
        isect_ids: [n] int64, ``image_id << (32 + tile_bits) | tile_id << 32 | depth bits``,
        flatten_ids: [n] int32 index into the flattened [I*N] (or [nnz]) Gaussians.
    """
    tile_size = check_positive_int("tile_size", tile_size)
    tile_width = check_positive_int("tile_width", tile_width)
    tile_height = check_positive_int("tile_height", tile_height)
    check_bool("sort", sort)
    check_bool("segmented", segmented)
    check_bool("packed", packed)
    check_tensor("means2d", means2d)
    check_tensor("radii", radii, "int")
    check_tensor("depths", depths)
    s = Shapes()
    if packed:
        if n_images is None or image_ids is None or gaussian_ids is None:
            raise ValueError("packed=True needs n_images, image_ids and gaussian_ids")
        n_images = check_int_at_least("n_images", n_images, 0)
        s.check("means2d", means2d, "nnz, 2")
        s.check("radii", radii, "nnz, 2")
        s.check("depths", depths, "nnz")
        check_tensor("image_ids", image_ids, "int")
        check_tensor("gaussian_ids", gaussian_ids, "int")
        s.check("image_ids", image_ids, "nnz")
        s.check("gaussian_ids", gaussian_ids, "nnz")
        if image_ids.numel() and (int(image_ids.min()) < 0 or int(image_ids.max()) >= n_images):
            raise ValueError(f"expected image_ids in [0, {n_images}), got values outside")
    else:
        s.check("means2d", means2d, "..., N, 2")
        s.check("radii", radii, "..., N, 2")
        s.check("depths", depths, "..., N")
        n_images = math.prod(s["..."])
        image_ids = gaussian_ids = None
    _, device = common_float({"means2d": means2d, "radii": radii, "depths": depths,
                              "image_ids": image_ids, "gaussian_ids": gaussian_ids})
    check_finite({"means2d": means2d, "depths": depths})
    _check_key_bits(n_images, tile_width, tile_height)
    _, impl = resolve("isect_tiles", device, backend)
    if packed:
        m, r, d = means2d.contiguous(), as_int32(radii).contiguous(), depths.contiguous()
    else:
        N = s["N"]
        m = means2d.reshape(n_images, N, 2).contiguous()
        r = as_int32(radii).reshape(n_images, N, 2).contiguous()
        d = depths.reshape(n_images, N).contiguous()
    capacity = current_capacity()
    sized = {}
    if sort and getattr(impl, "takes_capacity", False):
        if counting():  # only the counts are wanted: the smallest lists
            sized = {"capacity": 1}
        elif capacity is not None:
            sized = {"capacity": capacity.size}
    tiles_per_gauss, isect_ids, flatten_ids = impl(
        m, r, d, tile_size, tile_width, tile_height, sort, n_images,
        None if image_ids is None else image_ids.contiguous(),
        None if gaussian_ids is None else gaussian_ids.contiguous(),
        **sized,
    )
    if capacity is not None and sized and not counting():
        capacity.observe(tiles_per_gauss.sum(dtype=torch.int64))
    return tiles_per_gauss.reshape(depths.shape), isect_ids, flatten_ids


@torch.no_grad()
def isect_offset_encode(
    isect_ids: Tensor,  # [n]
    n_images: int,
    tile_width: int,
    tile_height: int,
    *,
    backend: str | None = None,
) -> Tensor:
    """Offsets [n_images, tile_height, tile_width] int32 of each tile's first intersection
    in the sorted ``isect_ids`` (empty tiles: where their intersections would start)."""
    check_tensor("isect_ids", isect_ids, "int")
    if isect_ids.dtype != torch.int64:
        raise TypeError(f"expected isect_ids of dtype int64, got {isect_ids.dtype}")
    Shapes().check("isect_ids", isect_ids, "n")
    n_images = check_int_at_least("n_images", n_images, 0)
    tile_width = check_positive_int("tile_width", tile_width)
    tile_height = check_positive_int("tile_height", tile_height)
    _check_key_bits(n_images, tile_width, tile_height)
    if isect_ids.numel() and not values_trusted():  # isect_tiles' output: not read again
        if bool((isect_ids[1:] < isect_ids[:-1]).any()):
            raise ValueError("expected isect_ids sorted ascending (isect_tiles(sort=True))")
        # keys -1 are the unused slots of lists at a capacity (sorted first): no tile's
        unused = int((isect_ids == -1).sum())
        if int((isect_ids < 0).sum()) != unused:
            raise ValueError("isect_ids hold negative keys other than -1 (an unused slot)")
        keys = isect_ids[unused:]
        if keys.numel():
            bits = (tile_width * tile_height).bit_length()
            # sorted: the first and last keys bound the images
            first_img, last_img = (int(keys[i]) >> 32 >> bits for i in (0, -1))
            if first_img < 0 or last_img >= n_images:
                raise ValueError(f"isect_ids name images outside [0, {n_images})")
            tile = (keys >> 32) & ((1 << bits) - 1)
            if int(tile.max()) >= tile_width * tile_height:
                raise ValueError(
                    f"isect_ids name tiles outside the {tile_width}×{tile_height} grid"
                )
    _, impl = resolve("isect_offset_encode", isect_ids.device, backend)
    return impl(isect_ids.contiguous(), n_images, tile_width, tile_height)
