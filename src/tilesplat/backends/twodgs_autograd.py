"""The 2DGS ops of a native backend as differentiable functions, from its launchers.

The public 2DGS ops (``ops/twodgs.py``) call their backend's implementation as a
differentiable function (the reference is differentiable by autograd), so each native backend
(``cpu/twodgs.py``, ``cuda/twodgs.py``) registers ``fully_fused_projection_2dgs`` and
``rasterize_to_pixels_2dgs`` as plain ops. :func:`differentiable_2dgs` makes the two from a
backend's four launchers: one ``torch.autograd.Function`` per op whose forward and backward
only call them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.autograd.function import once_differentiable

from . import call_options


def differentiable_2dgs(
    project_forward: Callable[..., tuple],
    project_backward: Callable[..., tuple],
    raster_forward: Callable[..., tuple],
    raster_backward: Callable[..., tuple],
    where: str,
) -> tuple[Callable[..., tuple], Callable[..., tuple]]:
    """``(fully_fused_projection_2dgs, rasterize_to_pixels_2dgs)`` of a backend (``where``
    names it in the docstrings) from its launchers:

    - ``project_forward(means, quats, scales, viewmats, Ks, width, height, near, far, clip)``
      -> (radii, ...) and ``project_backward(inputs, radii, v_outs)`` -> the five inputs'
      gradients;
    - ``raster_forward(means2d, rays, colors, opacities, normals, densify, backgrounds,
      masks, width, height, tile_size, isect_offsets, flatten_ids)`` -> (outputs, extra) and
      ``raster_backward(inputs, width, height, tile_size, isect_offsets, flatten_ids, extra,
      v_outs, absgrad)`` -> the seven inputs' gradients and the absgrad of ``densify``.
    """

    class Project2DGS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, means, quats, scales, viewmats, Ks, width, height, near, far, clip):
            outs = project_forward(means, quats, scales, viewmats, Ks, width, height, near,
                                   far, clip)
            ctx.save_for_backward(means, quats, scales, viewmats, Ks, outs[0])
            ctx.deterministic = call_options.deterministic()
            ctx.mark_non_differentiable(outs[0])
            return outs

        @staticmethod
        @once_differentiable
        def backward(ctx, v_radii, *v_outs):
            *inputs, radii = ctx.saved_tensors
            with call_options.scope(ctx.deterministic):
                grads = project_backward(tuple(inputs), radii, v_outs)
            need = ctx.needs_input_grad
            return (*(g if need[i] else None for i, g in enumerate(grads)), None, None, None,
                    None, None)

    class RasterizeToPixels2DGS(torch.autograd.Function):
        @staticmethod
        def forward(ctx, means2d, rays, colors, opacities, normals, densify, backgrounds,
                    masks, width, height, tile_size, isect_offsets, flatten_ids, absgrad_into):
            outs, extra = raster_forward(means2d, rays, colors, opacities, normals, densify,
                                         backgrounds, masks, width, height, tile_size,
                                         isect_offsets, flatten_ids)
            ctx.save_for_backward(means2d, rays, colors, opacities, normals, densify,
                                  backgrounds, masks, isect_offsets, flatten_ids, *extra)
            ctx.geometry = (width, height, tile_size)
            ctx.absgrad_into = absgrad_into
            ctx.deterministic = call_options.deterministic()
            return outs

        @staticmethod
        @once_differentiable
        def backward(ctx, *v_outs):
            saved = ctx.saved_tensors
            inputs, (isect_offsets, flatten_ids), extra = saved[:8], saved[8:10], saved[10:]
            absgrad_into = ctx.absgrad_into
            with call_options.scope(ctx.deterministic):
                grads = raster_backward(inputs, *ctx.geometry, isect_offsets, flatten_ids,
                                        extra, v_outs, absgrad_into is not None)
            if absgrad_into is not None:
                absgrad_into += grads[7]
            need = ctx.needs_input_grad
            v_inputs = tuple(g if need[i] else None for i, g in enumerate(grads[:7]))
            return (*v_inputs, None, None, None, None, None, None, None)

    def fully_fused_projection_2dgs(
        means: torch.Tensor,  # [B, N, 3]
        quats: torch.Tensor,  # [B, N, 4]
        scales: torch.Tensor,  # [B, N, 3]
        viewmats: torch.Tensor,  # [B, C, 4, 4]
        Ks: torch.Tensor,  # [B, C, 3, 3]
        width: int,
        height: int,
        near_plane: float,
        far_plane: float,
        radius_clip: float,
    ) -> tuple[torch.Tensor, ...]:
        args = [t.contiguous() for t in (means, quats, scales, viewmats, Ks)]
        return Project2DGS.apply(*args, width, height, near_plane, far_plane, radius_clip)

    def rasterize_to_pixels_2dgs(
        means2d: torch.Tensor,  # [G, 2]
        ray_transforms: torch.Tensor,  # [G, 3, 3]
        colors: torch.Tensor,  # [G, D]
        opacities: torch.Tensor,  # [G]
        normals: torch.Tensor,  # [G, 3]
        densify: torch.Tensor,  # [G, 2]
        backgrounds: torch.Tensor | None,  # [I, D]
        masks: torch.Tensor | None,  # [I, TH, TW] bool
        width: int,
        height: int,
        tile_size: int,
        isect_offsets: torch.Tensor,  # [I, TH, TW] int
        flatten_ids: torch.Tensor,  # [n] int
        absgrad_into: torch.Tensor | None = None,  # [G, 2]
    ) -> tuple[torch.Tensor, ...]:
        args: list[Any] = [t.contiguous() if t is not None else None
                           for t in (means2d, ray_transforms, colors, opacities, normals,
                                     densify, backgrounds, masks)]
        return RasterizeToPixels2DGS.apply(
            *args, width, height, tile_size, isect_offsets.to(torch.int32).contiguous(),
            flatten_ids.to(torch.int32).contiguous(), absgrad_into)

    fully_fused_projection_2dgs.__doc__ = (
        f"The {where} backend's projection with the reference's signature "
        "(``backends/torch/twodgs.fully_fused_projection_2dgs``), differentiable.")
    rasterize_to_pixels_2dgs.__doc__ = (
        f"The {where} backend's rasterizer with the reference's signature "
        "(``backends/torch/twodgs.rasterize_to_pixels_2dgs``): render_colors [I, H, W, D], "
        "render_alphas [I, H, W, 1], render_normals [I, H, W, 3], render_distort [I, H, W, 1], "
        "render_median [I, H, W, 1], differentiable; the backward adds the absgrad of "
        "``densify`` to ``absgrad_into``.")
    return fully_fused_projection_2dgs, rasterize_to_pixels_2dgs
