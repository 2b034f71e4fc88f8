"""Public op ``rasterize_to_pixels``: alpha-composite 2D Gaussians into images."""

from __future__ import annotations

import math
import weakref

import torch
from torch import Tensor

from ..backends import call_options
from ..backends.registry import current_backward_scheme, resolve
from .validation import (
    Shapes,
    as_int32,
    check_backgrounds_masks,
    check_bool,
    check_finite,
    check_positive_int,
    check_tensor,
    check_tile_lists,
    common_float,
)


class _RasterizeToPixels(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, means2d, conics, colors, opacities, backgrounds, masks, width, height,
                tile_size, isect_offsets, flatten_ids, absgrad, scheme, absgrad_target):
        # scheme None: no backward will run, so the backend keeps nothing for it
        will_backward = any(ctx.needs_input_grad)
        render_colors, render_alphas, last_ids, extra = impl.forward(
            means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
            isect_offsets, flatten_ids, scheme if will_backward else None,
        )
        ctx.impl = impl
        ctx.params = (width, height, tile_size, absgrad, scheme)
        ctx.deterministic = call_options.deterministic()
        ctx.absgrad_target = absgrad_target
        ctx.save_for_backward(means2d, conics, colors, opacities, backgrounds, masks,
                              isect_offsets, flatten_ids, render_colors, render_alphas, last_ids,
                              extra)
        ctx.mark_non_differentiable(last_ids)
        return render_colors, render_alphas, last_ids

    @staticmethod
    def backward(ctx, v_render_colors, v_render_alphas, _v_last_ids):
        (means2d, conics, colors, opacities, backgrounds, masks, isect_offsets, flatten_ids,
         render_colors, render_alphas, last_ids, extra) = ctx.saved_tensors
        width, height, tile_size, absgrad, scheme = ctx.params
        if v_render_colors is None:
            v_render_colors = torch.zeros_like(render_colors)
        if v_render_alphas is None:
            v_render_alphas = torch.zeros_like(render_alphas)
        with call_options.scope(ctx.deterministic):
            v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, abs_means2d = (
                ctx.impl.backward(
                    means2d, conics, colors, opacities, backgrounds, masks, width, height,
                    tile_size, isect_offsets, flatten_ids, render_colors, render_alphas,
                    last_ids, v_render_colors.contiguous(), v_render_alphas.contiguous(),
                    absgrad, scheme, extra,
                )
            )
        if absgrad:
            target = ctx.absgrad_target()
            if target is not None:
                value = abs_means2d.reshape(target.shape)
                prev = getattr(target, "absgrad", None)
                target.absgrad = value if prev is None else prev + value
        return (None, v_means2d, v_conics, v_colors, v_opacities,
                v_backgrounds if ctx.needs_input_grad[5] else None,
                None, None, None, None, None, None, None, None, None)


def rasterize_to_pixels(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    conics: Tensor,  # [..., N, 3] or [nnz, 3]
    colors: Tensor,  # [..., N, D] or [nnz, D]
    opacities: Tensor,  # [..., N] or [nnz]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., TH, TW]
    flatten_ids: Tensor,  # [n]
    backgrounds: Tensor | None = None,  # [..., D]
    masks: Tensor | None = None,  # [..., TH, TW] bool
    packed: bool = False,
    absgrad: bool = False,
    *,
    backward_scheme: str | None = None,
    return_last_ids: bool = False,
    backend: str | None = None,
) -> tuple[Tensor, ...]:
    """Rasterizes 2D Gaussians into images, front to back per tile (DESIGN.md contract).

    Args follow gsplat 1.5.3. Extra keywords:
        backward_scheme: ``per_pixel`` or ``per_splat`` (default: set_backward_scheme(),
            ``TILESPLAT_BACKWARD_SCHEME``, else ``per_pixel``).
        return_last_ids: also return last_ids [..., H, W] int32, the index into
            ``flatten_ids`` of the last Gaussian that contributed to each pixel (-1: none).
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda``.

    Returns:
        render_colors [..., H, W, D] (background included), render_alphas [..., H, W, 1]
        (and last_ids [..., H, W] when asked). With ``absgrad=True`` the backward pass adds
        the sum over pixels of |d loss / d means2d| to ``means2d.absgrad``.
    """
    width = check_positive_int("image_width", image_width)
    height = check_positive_int("image_height", image_height)
    tile_size = check_positive_int("tile_size", tile_size)
    check_bool("packed", packed)
    check_bool("absgrad", absgrad)
    check_bool("return_last_ids", return_last_ids)
    scheme = current_backward_scheme(backward_scheme)
    for name, t in (("means2d", means2d), ("conics", conics), ("colors", colors),
                    ("opacities", opacities)):
        check_tensor(name, t)
    check_tensor("isect_offsets", isect_offsets, "int")
    check_tensor("flatten_ids", flatten_ids, "int")
    s = Shapes()
    if packed:
        s.check("means2d", means2d, "nnz, 2")
        s.check("conics", conics, "nnz, 3")
        s.check("colors", colors, "nnz, D")
        s.check("opacities", opacities, "nnz")
        s.check("isect_offsets", isect_offsets, "..., TH, TW")
    else:
        s.check("means2d", means2d, "..., N, 2")
        s.check("conics", conics, "..., N, 3")
        s.check("colors", colors, "..., N, D")
        s.check("opacities", opacities, "..., N")
        s.check("isect_offsets", isect_offsets, "..., TH, TW")
    s.check("flatten_ids", flatten_ids, "n")
    check_backgrounds_masks(s, backgrounds, masks)
    named = {"means2d": means2d, "conics": conics, "colors": colors, "opacities": opacities,
             "backgrounds": backgrounds, "isect_offsets": isect_offsets,
             "flatten_ids": flatten_ids, "masks": masks}
    _, device = common_float(named)
    check_finite(named)
    D, TH, TW = s["D"], s["TH"], s["TW"]
    image_dims = s["..."]
    I = math.prod(image_dims)
    G = means2d.shape[0] if packed else I * s["N"]
    check_tile_lists(isect_offsets, flatten_ids, G, "nnz" if packed else "I*N", width, height,
                     tile_size)

    _, impl = resolve("rasterize_to_pixels", device, backend)
    render_colors, render_alphas, last_ids = _RasterizeToPixels.apply(
        impl,
        means2d.reshape(G, 2).contiguous(),
        conics.reshape(G, 3).contiguous(),
        colors.reshape(G, D).contiguous(),
        opacities.reshape(G).contiguous(),
        None if backgrounds is None else backgrounds.reshape(I, D).contiguous(),
        None if masks is None else masks.reshape(I, TH, TW).contiguous(),
        width, height, tile_size,
        as_int32(isect_offsets).reshape(I, TH, TW).contiguous(),
        as_int32(flatten_ids).contiguous(),
        absgrad, scheme, weakref.ref(means2d),
    )
    out = (render_colors.reshape(*image_dims, height, width, D),
           render_alphas.reshape(*image_dims, height, width, 1))
    if return_last_ids:
        out = out + (last_ids.reshape(*image_dims, height, width),)
    return out
