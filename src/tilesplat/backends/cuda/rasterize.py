"""Launchers of ``rasterize_to_pixels``: they check the launch limits (``raster_limits``),
allocate the outputs and launch the kernels of ``rasterize_fwd`` and ``rasterize_bwd``
(specialised per float type, tile size and channel count, cached) image chunk by chunk.
"""

from __future__ import annotations

import numpy as np
import torch

from . import raster_limits
from .rasterize_bwd import per_pixel_kernel, per_splat_kernel, warps_per_intersection
from .rasterize_fwd import KEEP, KEEP_NONE, extra_width, forward_kernel
from .runtime import empty, float_type, get_options, launch, launcher, optional
from .segment import reduce_parts


@launcher
def forward(
    means2d: torch.Tensor,  # [G, 2]
    conics: torch.Tensor,  # [G, 3]
    colors: torch.Tensor,  # [G, D]
    opacities: torch.Tensor,  # [G]
    backgrounds: torch.Tensor | None,  # [I, D]
    masks: torch.Tensor | None,  # [I, TH, TW] bool
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int32
    flatten_ids: torch.Tensor,  # [n] int32
    scheme: str | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launcher: returns render_colors [I,H,W,D], render_alphas [I,H,W,1], last_ids [I,H,W]
    and what the backward of ``scheme`` needs (``extra`` [I,H,W,E], see ``rasterize_fwd``;
    None when no backward will run)."""
    raster_limits.check_tile_size(tile_size)
    n_images, th, tw = isect_offsets.shape
    channels = colors.shape[-1]
    n = flatten_ids.shape[0]
    raster_limits.check_grid(tw, th, n)
    keep = KEEP[scheme]
    dtype, device = means2d.dtype, means2d.device
    out_colors = empty((n_images, height, width, channels), dtype, device)
    out_alphas = empty((n_images, height, width, 1), dtype, device)
    out_last = empty((n_images, height, width), torch.int32, device)
    out_extra = None
    if keep != KEEP_NONE:
        out_extra = empty((n_images, height, width, extra_width(keep, channels)), dtype, device)
    if n_images == 0 or width == 0 or height == 0:
        return out_colors, out_alphas, out_last, out_extra
    ids = flatten_ids if n > 0 else optional(None, flatten_ids, 1, torch.int32)
    kernel = forward_kernel(float_type(dtype), tile_size, channels, keep)
    for image0, n_block in raster_limits.image_chunks(n_images):
        launch(
            kernel, (tw, th, n_block), (tile_size, tile_size), device,
            means2d, conics, colors, opacities,
            optional(backgrounds, means2d, 2), backgrounds is not None,
            optional(masks, means2d, 3, torch.bool), masks is not None,
            width, height, isect_offsets.reshape(-1), ids, n, image0, n_images,
            out_colors, out_alphas, out_last, optional(out_extra, means2d, 4),
        )  # fmt: skip
    return out_colors, out_alphas, out_last, out_extra


@launcher
def backward(
    means2d: torch.Tensor,  # [G, 2]
    conics: torch.Tensor,  # [G, 3]
    colors: torch.Tensor,  # [G, D]
    opacities: torch.Tensor,  # [G]
    backgrounds: torch.Tensor | None,  # [I, D]
    masks: torch.Tensor | None,  # [I, TH, TW] bool
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int32
    flatten_ids: torch.Tensor,  # [n] int32
    render_colors: torch.Tensor,  # [I, H, W, D]
    render_alphas: torch.Tensor,  # [I, H, W, 1]
    last_ids: torch.Tensor,  # [I, H, W] int32
    v_render_colors: torch.Tensor,  # [I, H, W, D]
    v_render_alphas: torch.Tensor,  # [I, H, W, 1]
    absgrad: bool,
    scheme: str,
    extra: torch.Tensor | None,  # [I, H, W, E] (the forward's, for ``scheme``)
) -> tuple:
    """Launcher: returns (v_means2d [G,2], v_conics [G,3], v_colors [G,D], v_opacities [G],
    v_backgrounds [I,D] | None, absgrad_means2d [G,2] | None)."""
    del render_colors
    raster_limits.check_tile_size(tile_size)
    n_images, th, tw = isect_offsets.shape
    n = flatten_ids.shape[0]
    raster_limits.check_grid(tw, th, n)
    channels = colors.shape[-1]
    v_means2d = torch.zeros_like(means2d)
    v_conics = torch.zeros_like(conics)
    v_colors = torch.zeros_like(colors)
    v_opacities = torch.zeros_like(opacities)
    v_abs = torch.zeros_like(means2d) if absgrad else None
    v_backgrounds = None
    if backgrounds is not None:
        # render = ... + T_final * background for every pixel, a masked tile included
        v_backgrounds = (v_render_colors * (1.0 - render_alphas)).sum(dim=(1, 2))
    if n == 0 or n_images == 0 or width == 0 or height == 0:
        return v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, v_abs
    v_render_colors = v_render_colors.contiguous()
    v_render_alphas = v_render_alphas.contiguous()
    ft = float_type(means2d.dtype)
    options = get_options()
    device = means2d.device
    common = (
        means2d, conics, colors, opacities,
        optional(backgrounds, means2d, 2), backgrounds is not None,
        optional(masks, means2d, 3, torch.bool), masks is not None,
        width, height, isect_offsets.reshape(-1), flatten_ids, n,
    )  # fmt: skip
    det = bool(options["deterministic"])
    if scheme not in ("per_pixel", "per_splat"):
        raise ValueError(f"scheme must be 'per_pixel' or 'per_splat', got {scheme!r}")
    grads = (v_means2d, v_conics, v_colors, v_opacities) + ((v_abs,) if absgrad else ())
    if det:  # a row per (intersection, warp), reduced in a fixed order below (.segment)
        rows = n * warps_per_intersection(scheme, tile_size)
        parts = tuple(torch.zeros((rows, *t.shape[1:]), dtype=t.dtype, device=device)
                      for t in grads)
        outputs = parts[:4] + (parts[4] if absgrad else optional(None, means2d, 2),)
    else:
        outputs = (v_means2d, v_conics, v_colors, v_opacities, optional(v_abs, means2d, 2))
    if scheme == "per_pixel":
        kernel = per_pixel_kernel(ft, tile_size, channels, det)
        has_t = options["exact_transmittance"] and extra is not None
        for image0, n_block in raster_limits.image_chunks(n_images):
            launch(
                kernel, (tw, th, n_block), (tile_size, tile_size), device,
                *common, image0, n_images, render_alphas,
                extra if has_t else optional(None, means2d, 4), has_t, last_ids,
                v_render_colors, v_render_alphas, options["warp_skip"], absgrad, *outputs,
            )  # fmt: skip
    elif scheme == "per_splat":
        if extra is None or extra.shape[-1] != 1 + 2 * channels:
            raise ValueError("the per_splat backward needs the forward's colour sum: run the "
                             "forward with backward_scheme='per_splat'")
        batch = options["splat_batch"]
        kernel = per_splat_kernel(ft, tile_size, channels, batch, det)
        if not raster_limits.colors_in_shared("per_splat", np.dtype(ft).itemsize, tile_size,
                                              channels):
            extra = extra.clone()  # the kernel keeps the colour still to come in it
        for image0, n_block in raster_limits.image_chunks(n_images):
            launch(
                kernel, (tw, th, n_block), batch, device,
                *common, image0, n_images, extra, v_render_colors, v_render_alphas, absgrad,
                *outputs,
            )  # fmt: skip
    if det:
        sums = reduce_parts(list(parts), warps_per_intersection(scheme, tile_size),
                            flatten_ids, means2d.shape[0])
        v_means2d, v_conics, v_colors, v_opacities = sums[:4]
        v_abs = sums[4] if absgrad else None
    return v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, v_abs
