"""The CPU 2DGS ops, ``fully_fused_projection_2dgs`` and ``rasterize_to_pixels_2dgs``: each a
``torch.autograd.Function`` whose forward and backward only call the launchers of the kernel
modules (``twodgs_projection``, ``twodgs_rasterize_fwd``, ``twodgs_rasterize_bwd``).

Unlike the other ops, the public 2DGS ops (``ops/twodgs.py``) call their backend's
implementation as a differentiable function, as the reference is differentiable by autograd;
so each is registered as a plain op under its own name.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from . import twodgs_projection as projection
from . import twodgs_rasterize_bwd as rasterize_bwd
from . import twodgs_rasterize_fwd as rasterize_fwd


class _Project2DGS(torch.autograd.Function):
    """The CPU projection as one differentiable function; forward and backward only launch."""

    @staticmethod
    def forward(ctx, means, quats, scales, viewmats, Ks, width, height, near, far, clip):
        outs = projection.forward(means, quats, scales, viewmats, Ks, width, height, near, far,
                                  clip)
        ctx.save_for_backward(means, quats, scales, viewmats, Ks, outs[0])
        ctx.mark_non_differentiable(outs[0])
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, v_radii, *v_outs):
        *inputs, radii = ctx.saved_tensors
        grads = projection.backward(tuple(inputs), radii, v_outs)
        need = ctx.needs_input_grad
        return (*(g if need[i] else None for i, g in enumerate(grads)), None, None, None, None,
                None)


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
    """The reference's signature (``backends/torch/twodgs.fully_fused_projection_2dgs``),
    differentiable."""
    args = [t.contiguous() for t in (means, quats, scales, viewmats, Ks)]
    return _Project2DGS.apply(*args, width, height, near_plane, far_plane, radius_clip)


class _RasterizeToPixels2DGS(torch.autograd.Function):
    """The CPU op as one differentiable function; forward and backward only launch."""

    @staticmethod
    def forward(ctx, means2d, rays, colors, opacities, normals, densify, backgrounds, masks,
                width, height, tile_size, isect_offsets, flatten_ids, absgrad_into):
        outs, extra = rasterize_fwd.forward(means2d, rays, colors, opacities, normals, densify,
                                            backgrounds, masks, width, height, tile_size,
                                            isect_offsets, flatten_ids)
        ctx.save_for_backward(means2d, rays, colors, opacities, normals, densify, backgrounds,
                              masks, isect_offsets, flatten_ids, *extra)
        ctx.geometry = (width, height, tile_size)
        ctx.absgrad_into = absgrad_into
        return outs

    @staticmethod
    @once_differentiable
    def backward(ctx, *v_outs):
        saved = ctx.saved_tensors
        inputs, (isect_offsets, flatten_ids), extra = saved[:8], saved[8:10], saved[10:]
        absgrad_into = ctx.absgrad_into
        grads = rasterize_bwd.backward(inputs, *ctx.geometry, isect_offsets, flatten_ids, extra,
                                       v_outs, absgrad_into is not None)
        if absgrad_into is not None:
            absgrad_into += grads[7]
        need = ctx.needs_input_grad
        v_inputs = tuple(g if need[i] else None for i, g in enumerate(grads[:7]))
        return (*v_inputs, None, None, None, None, None, None, None)


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
    """The reference's signature (``backends/torch/twodgs.rasterize_to_pixels_2dgs``):
    render_colors [I, H, W, D], render_alphas [I, H, W, 1], render_normals [I, H, W, 3],
    render_distort [I, H, W, 1], render_median [I, H, W, 1], differentiable; the backward adds
    the absgrad of ``densify`` to ``absgrad_into``."""
    args = [t.contiguous() if t is not None else None
            for t in (means2d, ray_transforms, colors, opacities, normals, densify, backgrounds,
                      masks)]
    return _RasterizeToPixels2DGS.apply(*args, width, height, tile_size,
                                        isect_offsets.contiguous(), flatten_ids.contiguous(),
                                        absgrad_into)
