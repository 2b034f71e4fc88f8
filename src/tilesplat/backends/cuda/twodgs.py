"""The CUDA 2DGS ops, ``fully_fused_projection_2dgs`` and ``rasterize_to_pixels_2dgs``: the
rasterizer's launchers (they check the launch limits, allocate and launch the kernels of
``twodgs_rasterize_fwd`` and ``twodgs_rasterize_bwd`` image chunk by chunk, then finish the
gradients with PyTorch ops on the device), and the two differentiable ops made from them by
``backends/twodgs_autograd.py`` (the projection's launchers are in ``twodgs_projection``).

As on the CPU (``cpu/twodgs.py``), the public 2DGS ops (``ops/twodgs.py``) call their
backend's implementation as a differentiable function, so each is registered as a plain op.
With the ``deterministic`` option (``runtime.get_options``) the rasterizer's backward stores a
row per (intersection, warp) and ``segment.segment_sum`` sums them in a fixed order; the
projection's backward never uses atomics.
"""

from __future__ import annotations

import torch

from ..twodgs_autograd import differentiable_2dgs
from . import raster_limits
from . import twodgs_projection as projection
from .runtime import empty, float_type, get_options, launch, launcher, optional
from .segment import segment_sum
from .twodgs_rasterize_bwd import (
    V_A,
    V_ABS,
    V_B,
    V_C,
    V_COLOR,
    V_MX,
    V_NRM,
    V_OP,
    backward_kernel,
    n_warps,
)
from .twodgs_rasterize_fwd import forward_kernel

# ---------------------------------------------------------------------------------------------
# launchers of the rasterizer


def _common(means2d, rays, colors, opacities, normals, densify, backgrounds, masks, width,
            height, isect_offsets, flatten_ids):
    """The kernels' leading arguments (the absent backgrounds and masks as placeholders)."""
    n = flatten_ids.shape[0]
    ids = flatten_ids if n > 0 else optional(None, flatten_ids, 1, torch.int32)
    return (means2d, rays, colors, opacities, normals, densify,
            optional(backgrounds, means2d, 2), backgrounds is not None,
            optional(masks, means2d, 3, torch.bool), masks is not None,
            width, height, isect_offsets.reshape(-1), ids, n)


@launcher
def rasterize_forward(
    means2d: torch.Tensor,  # [G, 2]
    rays: torch.Tensor,  # [G, 3, 3]
    colors: torch.Tensor,  # [G, D]
    opacities: torch.Tensor,  # [G]
    normals: torch.Tensor,  # [G, 3]
    densify: torch.Tensor,  # [G, 2]
    backgrounds: torch.Tensor | None,  # [I, D]
    masks: torch.Tensor | None,  # [I, TH, TW] bool
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int32
    flatten_ids: torch.Tensor,  # [n] int32
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The outputs (render_colors [I, H, W, D], render_alphas, render_normals [.., 3],
    render_distort, render_median [.., 1]) and what the backward needs: (trans [I, H, W]
    each pixel's final T, last_ids and median_ids [I, H, W] int32 (-1: none), wd [I, H, W]
    float64 its sum of weight x depth)."""
    raster_limits.check_tile_size(tile_size)
    n_images, th, tw = isect_offsets.shape
    raster_limits.check_grid(tw, th, flatten_ids.shape[0])
    channels = colors.shape[1]
    dtype, device = means2d.dtype, means2d.device
    shape = (n_images, height, width)
    outs = (empty((*shape, channels), dtype, device), empty((*shape, 1), dtype, device),
            empty((*shape, 3), dtype, device), empty((*shape, 1), dtype, device),
            empty((*shape, 1), dtype, device))
    extra = (empty(shape, dtype, device), empty(shape, torch.int32, device),
             empty(shape, torch.int32, device), empty(shape, torch.float64, device))
    if n_images == 0:
        return outs, extra
    kernel = forward_kernel(float_type(dtype), tile_size, channels)
    common = _common(means2d, rays, colors, opacities, normals, densify, backgrounds, masks,
                     width, height, isect_offsets, flatten_ids)
    for image0, n_block in raster_limits.image_chunks(n_images):
        launch(kernel, (tw, th, n_block), (tile_size, tile_size), device, *common, image0,
               n_images, *outs, *extra)
    return outs, extra


def _cross(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.linalg.cross(a, b, dim=-1)


@launcher
def rasterize_backward(
    inputs: tuple[torch.Tensor | None, ...],  # the forward's: means2d .. masks
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int32
    flatten_ids: torch.Tensor,  # [n] int32
    extra: tuple[torch.Tensor, ...],  # the forward's: trans, last_ids, median_ids, wd
    v_outs: tuple[torch.Tensor, ...],  # [I, H, W, D | 1 | 3 | 1 | 1]
    absgrad: bool,
) -> tuple[torch.Tensor | None, ...]:
    """v_means2d [G, 2], v_ray_transforms [G, 3, 3], v_colors [G, D], v_opacities [G],
    v_normals [G, 3], v_densify [G, 2], v_backgrounds [I, D] or None, and absgrad [G, 2]
    (the sum over pixels of |d loss / d densify|) or None."""
    means2d, rays, colors, opacities, normals, densify, backgrounds, masks = inputs
    n_images, th, tw = isect_offsets.shape
    n = flatten_ids.shape[0]
    n_gauss, channels = colors.shape
    dtype, device = means2d.dtype, means2d.device
    v_c, v_a, v_n, v_d, v_m = (v.contiguous() for v in v_outs)
    det = bool(get_options()["deterministic"])
    n_cols = V_COLOR + channels
    warps = n_warps(tile_size)
    rows = n * warps if det else n_gauss
    part = torch.zeros((rows, n_cols), dtype=torch.float64, device=device)
    if n > 0 and n_images > 0:
        kernel = backward_kernel(float_type(dtype), tile_size, channels, det)
        common = _common(means2d, rays, colors, opacities, normals, densify, backgrounds,
                         masks, width, height, isect_offsets, flatten_ids)
        for image0, n_block in raster_limits.image_chunks(n_images):
            launch(kernel, (tw, th, n_block), (tile_size, tile_size), device, *common, image0,
                   n_images, *extra, v_c, v_a, v_n, v_d, v_m, part)
    if det:  # the warps of each intersection (a fixed tree), then its Gaussian's, in order
        part = segment_sum(part.reshape(n, warps, n_cols).sum(dim=1), flatten_ids, n_gauss)
    m = rays.to(torch.float64)
    m_u, m_v, m_w = m[:, 0], m[:, 1], m[:, 2]
    g_a, g_b, g_c = part[:, V_A:V_A + 3], part[:, V_B:V_B + 3], part[:, V_C:V_C + 3]
    # a = M_v x M_w, b = M_w x M_u, c = M_u x M_v; for x = u x v: v_u = v x g, v_v = g x u
    v_rays = torch.stack([_cross(g_b, m_w) + _cross(m_v, g_c),
                          _cross(m_w, g_a) + _cross(g_c, m_u),
                          _cross(m_u, g_b) + _cross(g_a, m_v)], dim=1)
    v_backgrounds = None
    if backgrounds is not None:  # render = ... + T_final * background, masked tiles too
        trans = extra[0].to(torch.float64)[..., None]
        v_backgrounds = (v_c.to(torch.float64) * trans).sum(dim=(1, 2)).to(dtype)
    # the pixel p = centre - densify enters as the mean's opposite and through p_x a + p_y b
    v_mean = part[:, V_MX:V_MX + 2]
    v_densify = v_mean - torch.stack([(_cross(m_v, m_w) * g_c).sum(-1),
                                      (_cross(m_w, m_u) * g_c).sum(-1)], dim=-1)
    grads = (v_mean, v_rays, part[:, V_COLOR:], part[:, V_OP], part[:, V_NRM:V_NRM + 3],
             v_densify)
    v_abs = part[:, V_ABS:V_ABS + 2].to(dtype) if absgrad else None
    return (*(g.to(dtype).contiguous() for g in grads), v_backgrounds, v_abs)


# the rasterizer's launchers are looked up at each call (tests/test_cuda_2dgs.py counts them)
fully_fused_projection_2dgs, rasterize_to_pixels_2dgs = differentiable_2dgs(
    projection.forward, projection.backward,
    lambda *args: rasterize_forward(*args), lambda *args: rasterize_backward(*args), "cuda")
