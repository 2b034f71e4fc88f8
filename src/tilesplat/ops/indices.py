"""Public ops ``rasterize_to_indices_in_range`` and ``accumulate`` and their 2DGS twins
(gsplat 1.5.3): the rasterizer as explicit (Gaussian, pixel) pairs, and compositing of such
pairs in PyTorch."""

from __future__ import annotations

import math

from torch import Tensor

from ..backends.registry import resolve
from .validation import (
    Shapes,
    check_finite,
    check_int_at_least,
    check_positive_int,
    check_tensor,
    common_float,
)


def _check_indices_args(range_start, range_end, transmittances, means2d, conics, opacities,
                        image_width, image_height, tile_size, isect_offsets, flatten_ids):
    """The checks of both pair listings; returns the normalised ints, I, N, the tile grid
    and the device."""
    range_start = check_int_at_least("range_start", range_start, 0)
    if isinstance(range_end, float) and range_end >= 2**62:
        range_end = 2**62
    range_end = check_int_at_least("range_end", int(range_end), 0)
    width = check_positive_int("image_width", image_width)
    height = check_positive_int("image_height", image_height)
    tile_size = check_positive_int("tile_size", tile_size)
    named = {"transmittances": transmittances, "means2d": means2d, "conics": conics,
             "opacities": opacities}
    for name, t in named.items():
        check_tensor(name, t)
    check_tensor("isect_offsets", isect_offsets, "int")
    check_tensor("flatten_ids", flatten_ids, "int")
    s = Shapes(H=height, W=width)
    s.check("means2d", means2d, "..., N, 2")
    s.check("transmittances", transmittances, "..., H, W")
    s.check("conics", conics, "..., N, 3")
    s.check("opacities", opacities, "..., N")
    s.check("isect_offsets", isect_offsets, "..., TH, TW")
    s.check("flatten_ids", flatten_ids, "n_isects")
    if s["TH"] * tile_size < height or s["TW"] * tile_size < width:
        raise ValueError(
            f"isect_offsets covers {s['TW']}x{s['TH']} tiles of {tile_size} px, "
            f"less than the {width}x{height} image"
        )
    _, device = common_float({**named, "isect_offsets": isect_offsets,
                              "flatten_ids": flatten_ids})
    check_finite(named)
    return (range_start, range_end, math.prod(s["..."]), s["N"], width, height, tile_size,
            s["TH"], s["TW"], device)


def _check_accumulate_args(means2d, conics, opacities, colors, gaussian_ids, pixel_ids,
                           image_ids, image_width, image_height):
    """The checks of both compositing functions; returns width, height, channels, device."""
    width = check_positive_int("image_width", image_width)
    height = check_positive_int("image_height", image_height)
    named = {"means2d": means2d, "conics": conics, "opacities": opacities, "colors": colors}
    for name, t in named.items():
        check_tensor(name, t)
    ids = {"gaussian_ids": gaussian_ids, "pixel_ids": pixel_ids, "image_ids": image_ids}
    for name, t in ids.items():
        check_tensor(name, t, "int")
    s = Shapes()
    s.check("means2d", means2d, "..., N, 2")
    s.check("conics", conics, "..., N, 3")
    s.check("opacities", opacities, "..., N")
    s.check("colors", colors, "..., N, D")
    for name, t in ids.items():
        s.check(name, t, "M")
    _, device = common_float({**named, **ids})
    check_finite(named)
    batch, N, D = s["..."], s["N"], s["D"]
    I = math.prod(batch)
    if s["M"]:
        for name, t, limit in (("gaussian_ids", gaussian_ids, N),
                               ("pixel_ids", pixel_ids, width * height),
                               ("image_ids", image_ids, I)):
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= limit:
                raise ValueError(f"{name} must lie in [0, {limit}), got [{lo}, {hi}]")
    return width, height, D, device


def rasterize_to_indices_in_range(
    range_start: int,
    range_end: int,
    transmittances: Tensor,  # [..., image_height, image_width]
    means2d: Tensor,  # [..., N, 2]
    conics: Tensor,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., tile_height, tile_width]
    flatten_ids: Tensor,  # [n_isects]
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The pairs of Gaussians and pixels that contribute, batch range by batch range.

    Each tile's depth-sorted list is cut into batches of ``tile_size²`` Gaussians; only
    batches ``[range_start, range_end)`` are walked, starting from each pixel's
    ``transmittances``, with the compositing rules of the rasterizer (skip sigma < 0 or
    alpha < 1/255, stop before T falls to 1e-4). ``range_end`` of 1e10 walks everything.

    Args:
        transmittances: transmittance so far of each pixel. [..., H, W]
        means2d, conics, opacities: the projected Gaussians of each image. [..., N, 2],
            [..., N, 3], [..., N] (unpacked layout).
        isect_offsets, flatten_ids: from ``isect_offset_encode`` / ``isect_tiles``.
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (the torch reference serves all).

    Returns:
        gaussian_ids [M] in [0, N), pixel_ids [M] (row-major), image_ids [M], ordered by
        image, pixel and depth.
    """
    args = _check_indices_args(range_start, range_end, transmittances, means2d, conics,
                               opacities, image_width, image_height, tile_size,
                               isect_offsets, flatten_ids)
    (range_start, range_end, I, N, width, height, tile_size, TH, TW, device) = args
    _, impl = resolve("rasterize_to_indices_in_range", device, backend)
    return impl(range_start, range_end, transmittances.reshape(I, height, width),
                means2d.reshape(I, N, 2), conics.reshape(I, N, 3), opacities.reshape(I, N),
                width, height, tile_size, isect_offsets.reshape(I, TH, TW), flatten_ids)


def accumulate(
    means2d: Tensor,  # [..., N, 2]
    conics: Tensor,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor,  # [..., N, channels]
    gaussian_ids: Tensor,  # [M]
    pixel_ids: Tensor,  # [M]
    image_ids: Tensor,  # [M]
    image_width: int,
    image_height: int,
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Alpha compositing of listed (Gaussian, pixel, image) pairs, differentiable by autograd.

    Within a pixel the pairs composite in list order (front to back), with
    ``alpha = min(0.999, opacity · exp(-sigma))`` and no skipping: the list (e.g. from
    :func:`rasterize_to_indices_in_range`) decides what contributes. gsplat's version needs
    the ``nerfacc`` package; this one is plain PyTorch.

    Args:
        means2d, conics, opacities, colors: per image. [..., N, 2], [..., N, 3], [..., N],
            [..., N, channels]
        gaussian_ids, pixel_ids (row-major), image_ids: the pairs. [M] each
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (the torch reference serves all).

    Returns:
        renders [..., H, W, channels] and alphas [..., H, W, 1].
    """
    width, height, D, device = _check_accumulate_args(
        means2d, conics, opacities, colors, gaussian_ids, pixel_ids, image_ids, image_width,
        image_height)
    s = Shapes()
    s.check("means2d", means2d, "..., N, 2")
    batch, N = s["..."], s["N"]
    I = math.prod(batch)
    _, impl = resolve("accumulate", device, backend)
    renders, alphas = impl(means2d.reshape(I, N, 2), conics.reshape(I, N, 3),
                           opacities.reshape(I, N), colors.reshape(I, N, D),
                           gaussian_ids, pixel_ids, image_ids, width, height)
    return renders.reshape(*batch, height, width, D), alphas.reshape(*batch, height, width, 1)


def rasterize_to_indices_in_range_2dgs(
    range_start: int,
    range_end: int,
    transmittances: Tensor,  # [..., image_height, image_width]
    means2d: Tensor,  # [..., N, 2]
    ray_transforms: Tensor,  # [..., N, 3, 3]
    opacities: Tensor,  # [..., N]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., tile_height, tile_width]
    flatten_ids: Tensor,  # [n_isects]
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`rasterize_to_indices_in_range` of surfels (2DGS): ``ray_transforms``
    [..., N, 3, 3] from ``fully_fused_projection_2dgs`` take the place of the conics.

    Returns gaussian_ids [M], pixel_ids [M] (row-major), image_ids [M].
    """
    check_tensor("ray_transforms", ray_transforms)
    s = Shapes()
    s.check("means2d", means2d, "..., N, 2")
    s.check("ray_transforms", ray_transforms, "..., N, 3, 3")
    conics_like = ray_transforms[..., 0, :]  # [..., N, 3]: lets the 3DGS checks run
    args = _check_indices_args(range_start, range_end, transmittances, means2d, conics_like,
                               opacities, image_width, image_height, tile_size,
                               isect_offsets, flatten_ids)
    (range_start, range_end, I, N, width, height, tile_size, TH, TW, device) = args
    check_finite({"ray_transforms": ray_transforms})
    _, impl = resolve("rasterize_to_indices_in_range_2dgs", device, backend)
    return impl(range_start, range_end, transmittances.reshape(I, height, width),
                means2d.reshape(I, N, 2), ray_transforms.reshape(I, N, 3, 3),
                opacities.reshape(I, N), width, height, tile_size,
                isect_offsets.reshape(I, TH, TW), flatten_ids)


def accumulate_2dgs(
    means2d: Tensor,  # [..., N, 2]
    ray_transforms: Tensor,  # [..., N, 3, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor,  # [..., N, channels]
    normals: Tensor,  # [..., N, 3]
    gaussian_ids: Tensor,  # [M]
    pixel_ids: Tensor,  # [M]
    image_ids: Tensor,  # [M]
    image_width: int,
    image_height: int,
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`accumulate` of surfels (2DGS), plain PyTorch (gsplat's needs ``nerfacc``).

    Returns renders [..., H, W, channels], alphas [..., H, W, 1], normals [..., H, W, 3].
    """
    check_tensor("ray_transforms", ray_transforms)
    check_tensor("normals", normals)
    s = Shapes()
    s.check("means2d", means2d, "..., N, 2")
    s.check("ray_transforms", ray_transforms, "..., N, 3, 3")
    s.check("normals", normals, "..., N, 3")
    batch, N = s["..."], s["N"]
    I = math.prod(batch)
    width, height, D, device = _check_accumulate_args(
        means2d, ray_transforms[..., 0, :], opacities, colors, gaussian_ids, pixel_ids,
        image_ids, image_width, image_height)
    check_finite({"ray_transforms": ray_transforms, "normals": normals})
    _, impl = resolve("accumulate_2dgs", device, backend)
    renders, alphas, rnormals = impl(
        means2d.reshape(I, N, 2), ray_transforms.reshape(I, N, 3, 3), opacities.reshape(I, N),
        colors.reshape(I, N, D), normals.reshape(I, N, 3), gaussian_ids, pixel_ids, image_ids,
        width, height)
    return (renders.reshape(*batch, height, width, D), alphas.reshape(*batch, height, width, 1),
            rnormals.reshape(*batch, height, width, 3))
