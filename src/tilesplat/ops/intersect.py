"""Public ops ``isect_tiles`` and ``isect_offset_encode``: which Gaussians touch which tile;
and ``isect_tiles_tight``, tilesplat's own lists for ``rasterization()`` (issue 37).

gsplat's ``isect_tiles`` keeps its meaning behind its name and signature: every tile of each
Gaussian's square box. The tight lists are a separate op, not a keyword of that one: they need
what gsplat's signature lacks (conics, opacities, the image size), their meaning differs (a
caller of gsplat's op gets gsplat's lists, whatever it passes), and each backend registers the
two on their own, so the registry shows which backends implement which.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

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


def _grid(tile_size: int, tile_width: int, tile_height: int) -> tuple[int, int, int]:
    return (check_positive_int("tile_size", tile_size),
            check_positive_int("tile_width", tile_width),
            check_positive_int("tile_height", tile_height))


@dataclass
class _Gaussians:
    """Validated inputs of the intersection ops, flattened to [I, N, ...] (or [nnz, ...] packed)
    and contiguous: what the backends' launchers take."""

    means2d: Tensor  # [I, N, 2] or [nnz, 2]
    radii: Tensor  # [I, N, 2] or [nnz, 2] int32
    depths: Tensor  # [I, N] or [nnz]
    rows: dict[str, Tensor]  # further per-Gaussian tensors, [I, N, ...] or [nnz, ...]
    n_images: int
    image_ids: Tensor | None  # [nnz]
    gaussian_ids: Tensor | None  # [nnz]
    device: torch.device
    shape: torch.Size  # of tiles_per_gauss: the depths' shape as given


def _validated(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    radii: Tensor,  # [..., N, 2] or [nnz, 2]
    depths: Tensor,  # [..., N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    segmented: bool,
    packed: bool,
    n_images: int | None,
    image_ids: Tensor | None,  # [nnz]
    gaussian_ids: Tensor | None,  # [nnz]
    rows: dict[str, tuple[Tensor, str]],  # name -> (tensor, its trailing dims' pattern)
) -> _Gaussians:
    """The checks both intersection ops share (the grid's sizes are checked ints already);
    ``rows`` are further per-Gaussian tensors."""
    check_bool("sort", sort)
    check_bool("segmented", segmented)
    check_bool("packed", packed)
    check_tensor("means2d", means2d)
    check_tensor("radii", radii, "int")
    check_tensor("depths", depths)
    for name, (t, _) in rows.items():
        check_tensor(name, t)
    s = Shapes()
    if packed:
        if n_images is None or image_ids is None or gaussian_ids is None:
            raise ValueError("packed=True needs n_images, image_ids and gaussian_ids")
        n_images = check_int_at_least("n_images", n_images, 0)
        s.check("means2d", means2d, "nnz, 2")
        s.check("radii", radii, "nnz, 2")
        s.check("depths", depths, "nnz")
        for name, (t, tail) in rows.items():
            s.check(name, t, f"nnz, {tail}".rstrip(", "))
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
        for name, (t, tail) in rows.items():
            s.check(name, t, f"..., N, {tail}".rstrip(", "))
        n_images = math.prod(s["..."])
        image_ids = gaussian_ids = None
    floats = {"means2d": means2d, "depths": depths, **{k: t for k, (t, _) in rows.items()}}
    _, device = common_float({**floats, "radii": radii, "image_ids": image_ids,
                              "gaussian_ids": gaussian_ids})
    check_finite(floats)
    _check_key_bits(n_images, tile_width, tile_height)
    lead = (-1,) if packed else (n_images, s["N"])

    def flat(t: Tensor) -> Tensor:  # [*lead, its trailing dims]
        return t.reshape(*lead, *t.shape[depths.dim():]).contiguous()

    return _Gaussians(
        flat(means2d), flat(as_int32(radii)), flat(depths),
        {k: flat(t) for k, (t, _) in rows.items()}, n_images,
        None if image_ids is None else image_ids.contiguous(),
        None if gaussian_ids is None else gaussian_ids.contiguous(),
        device, depths.shape,
    )


def _lists(op: str, g: _Gaussians, sort: bool, backend: str | None,
           call: Callable[..., tuple[Tensor, Tensor, Tensor]]) -> tuple[Tensor, Tensor, Tensor]:
    """Runs ``call(impl, **sized)`` with the implementation of ``op`` and the capacity of the
    enclosing ``intersection_capacity`` (``ops/intersect_capacity.py``), where the backend
    takes one; records the count there; reshapes tiles_per_gauss as the depths."""
    _, impl = resolve(op, g.device, backend)
    capacity = current_capacity()
    sized = {}
    if sort and getattr(impl, "takes_capacity", False):
        if counting():  # only the counts are wanted: the smallest lists
            sized = {"capacity": 1}
        elif capacity is not None:
            sized = {"capacity": capacity.size}
    tiles_per_gauss, isect_ids, flatten_ids = call(impl, **sized)
    if capacity is not None and sized and not counting():
        capacity.observe(tiles_per_gauss.sum(dtype=torch.int64))
    return tiles_per_gauss.reshape(g.shape), isect_ids, flatten_ids


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
    """Maps projected Gaussians to the tiles they overlap (gsplat's op): every tile of the
    square box of radius ``radii`` around each mean. (``rasterization()`` lists fewer tiles:
    :func:`isect_tiles_tight`.)

    ``segmented`` is accepted for gsplat compatibility and gives the same result.

    Inside ``ops.intersect_capacity.intersection_capacity`` (the trainer's step) a backend
    that can sizes the lists at the capacity, the unused entries first with key -1, and
    reads nothing back; the lists are exact otherwise.

    Returns:
        tiles_per_gauss: [..., N] or [nnz] int32,
        isect_ids: [n] int64, ``image_id << (32 + tile_bits) | tile_id << 32 | depth bits``,
        flatten_ids: [n] int32 index into the flattened [I*N] (or [nnz]) Gaussians.
    """
    tile_size, tile_width, tile_height = _grid(tile_size, tile_width, tile_height)
    g = _validated(means2d, radii, depths, tile_size, tile_width, tile_height, sort, segmented,
                   packed, n_images, image_ids, gaussian_ids, {})
    return _lists("isect_tiles", g, sort, backend, lambda impl, **sized: impl(
        g.means2d, g.radii, g.depths, tile_size, tile_width, tile_height, sort, g.n_images,
        g.image_ids, g.gaussian_ids, **sized))


@torch.no_grad()
def isect_tiles_tight(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    radii: Tensor,  # [..., N, 2] or [nnz, 2]
    depths: Tensor,  # [..., N] or [nnz]
    conics: Tensor,  # [..., N, 3] or [nnz, 3]
    opacities: Tensor,  # [..., N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    image_width: int,
    image_height: int,
    sort: bool = True,
    packed: bool = False,
    n_images: int | None = None,
    image_ids: Tensor | None = None,  # [nnz]
    gaussian_ids: Tensor | None = None,  # [nnz]
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The tile lists of ``rasterization()`` (tilesplat's op, issue 37): the intersections of
    :func:`isect_tiles` (same keys, same order) whose tile holds a pixel centre inside the
    image where the Gaussian can reach ``alpha >= 1/255``.

    That region is the ellipse ``0.5 (a dx² + c dy²) + b dx dy <= ln(255 * opacity)`` of the
    conic (a, b, c) around the mean; a pair is kept when the minimum of the form over the
    tile's rectangle of pixel centres (clipped to the image) is within it, judged with
    margins that cover the rasterizers' float32 rounding (``backends/shared/tiles.py``). A
    dropped pair is one that the rasterizer skips at every pixel of the tile, so renders and
    gradients do not change; a Gaussian with opacity below 1/255 enters no tile.

    Args (beyond :func:`isect_tiles`'s):
        conics: the rasterizer's conics. [..., N, 3] or [nnz, 3]
        opacities: the rasterizer's opacities (times the compensation in antialiased mode).
            [..., N] or [nnz]
        image_width, image_height: the image in pixels, at most the tile grid.

    Returns:
        tiles_per_gauss, isect_ids, flatten_ids as :func:`isect_tiles`.
    """
    tile_size, tile_width, tile_height = _grid(tile_size, tile_width, tile_height)
    image_width = check_positive_int("image_width", image_width)
    image_height = check_positive_int("image_height", image_height)
    if image_width > tile_width * tile_size or image_height > tile_height * tile_size:
        raise ValueError(
            f"a {image_width}x{image_height} image needs more than the {tile_width}x"
            f"{tile_height} tiles of {tile_size} px"
        )
    g = _validated(means2d, radii, depths, tile_size, tile_width, tile_height, sort, False,
                   packed, n_images, image_ids, gaussian_ids,
                   {"conics": (conics, "3"), "opacities": (opacities, "")})
    return _lists("isect_tiles_tight", g, sort, backend, lambda impl, **sized: impl(
        g.means2d, g.radii, g.depths, g.rows["conics"], g.rows["opacities"], tile_size,
        tile_width, tile_height, image_width, image_height, sort, g.n_images, g.image_ids,
        g.gaussian_ids, **sized))


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
