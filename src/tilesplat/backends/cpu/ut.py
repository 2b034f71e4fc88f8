"""The CPU 3DGUT ops: launchers of the unscented-transform projection's kernel
(``ut_projection``) and of the eval3d rasterizer's kernels (``ut_rasterize_fwd``,
``ut_rasterize_bwd``).

The cameras' numbers are the reference's: the projection's launcher hands the kernel the
reference's ``Lens`` and ``Shutter`` (``torch/lens.py``) in float64, one row per camera
(``backends/ut_launch.py``, shared with the cuda launcher).

The rasterizer's pixel rays are computed by the reference's vectorised ``image_rays`` (every
camera model, the distortion inverted by Newton's method, the rolling shutter's pose at each
pixel's time), once per forward, and kept with each pixel's final transmittance for the
backward; the kernels only see rays.
"""

from __future__ import annotations

import numpy as np
import torch

from ..torch.ut import image_rays
from ..ut_camera import UTCamera, UTParams
from ..ut_launch import projection_args
from ._common import BLOCK, alloc, parallel_for, view
from .cull import max_tile_len
from .rasterize_bwd import group_by_gaussian, reduce_backgrounds
from .ut_projection import projection_kernel
from .ut_rasterize_bwd import (
    N_GEOM,
    V_COLOR,
    backward_kernel,
    gaussians_kernel,
    reduce_pairs_kernel,
)
from .ut_rasterize_fwd import EXTRA_COLS, forward_kernel

# ---------------------------------------------------------------------------------------------
# the projection


def project_with_ut(
    means: torch.Tensor,  # [B, N, 3]
    quats: torch.Tensor,  # [B, N, 4]
    scales: torch.Tensor,  # [B, N, 3]
    opacities: torch.Tensor | None,  # [B, N]
    viewmats: torch.Tensor,  # [B, C, 4, 4]
    Ks: torch.Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    calc_compensations: bool,
    camera: UTCamera,  # tensors [B, C, ...]
    ut: UTParams,
) -> tuple[torch.Tensor, ...]:
    """radii [B, C, N, 2] int32, means2d [B, C, N, 2], depths [B, C, N], conics [B, C, N, 3],
    compensations [B, C, N] or None (culled entries: zero radii, means2d, conics and
    compensations, and their depth)."""
    n_batch, n_gauss = means.shape[:2]
    n_cams = viewmats.shape[1]
    dt = means.dtype
    rows, ft, (model, *scalars) = projection_args(viewmats, Ks, camera, width, height, dt,
                                                  eps2d, near_plane, far_plane, radius_clip, ut)
    radii = alloc((n_batch, n_cams, n_gauss, 2), torch.int32)
    means2d = alloc((n_batch, n_cams, n_gauss, 2), dt)
    depths = alloc((n_batch, n_cams, n_gauss), dt)
    conics = alloc((n_batch, n_cams, n_gauss, 3), dt)
    comps = alloc((n_batch, n_cams, n_gauss), dt)
    np_dt = view(means).dtype
    opac = view(opacities) if opacities is not None else np.zeros((0, 0), np_dt)
    parallel_for(
        projection_kernel, n_batch * ((n_gauss + BLOCK - 1) // BLOCK), view(means),
        view(quats), view(scales), opac, rows, model, ft, *scalars, view(radii),
        view(means2d), view(depths), view(conics), view(comps))
    return radii, means2d, depths, conics, comps if calc_compensations else None


# ---------------------------------------------------------------------------------------------
# the eval3d rasterizer


def _ray_table(viewmats: torch.Tensor, Ks: torch.Tensor, camera: UTCamera, width: int,
               height: int) -> torch.Tensor:
    """[I, H, W, EXTRA_COLS] in the data's type: each pixel's ray (origin, unit direction,
    valid as 1 / 0) from the reference's ``image_rays``; column T_FINAL is the forward's."""
    n_img = viewmats.shape[0]
    origin, direction, valid = image_rays(viewmats.detach(), Ks.detach(), camera, width, height)
    table = alloc((n_img * height * width, EXTRA_COLS), viewmats.dtype)
    table[:, 0:3] = origin
    table[:, 3:6] = direction
    table[:, 6] = valid.to(table.dtype)
    return table.reshape(n_img, height, width, EXTRA_COLS)


def _optional(t: torch.Tensor | None, empty: tuple[int, ...], dtype) -> np.ndarray:
    return view(t) if t is not None else np.zeros(empty, dtype)


def forward(
    means: torch.Tensor,  # [B, N, 3]
    quats: torch.Tensor,  # [B, N, 4]
    scales: torch.Tensor,  # [B, N, 3]
    colors: torch.Tensor,  # [I * N, D]
    opacities: torch.Tensor,  # [I * N]
    backgrounds: torch.Tensor | None,  # [I, D]
    masks: torch.Tensor | None,  # [I, TH, TW] bool
    viewmats: torch.Tensor,  # [I, 4, 4]
    Ks: torch.Tensor,  # [I, 3, 3]
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: torch.Tensor,  # [I, TH, TW] int32
    flatten_ids: torch.Tensor,  # [n] int32
    camera: UTCamera,  # tensors [I, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """render_colors [I, H, W, D], render_alphas [I, H, W, 1], last_ids [I, H, W] int32 and
    extra [I, H, W, EXTRA_COLS] (the rays and final transmittances, for the backward)."""
    n_img, th, tw = isect_offsets.shape
    n_batch, n_gauss = means.shape[:2]
    n_ch = colors.shape[1]
    dt = colors.dtype
    np_dt = view(colors).dtype
    shape = (n_img, height, width)
    extra = _ray_table(viewmats, Ks, camera, width, height)
    out_colors = alloc((*shape, n_ch), dt)
    out_alphas = alloc((*shape, 1), dt)
    out_last = alloc(shape, torch.int32)
    parallel_for(
        forward_kernel, n_img * th * tw, view(means.reshape(-1, 3)), view(quats.reshape(-1, 4)),
        view(scales.reshape(-1, 3)), view(colors), view(opacities),
        _optional(backgrounds, (0, n_ch), np_dt), _optional(masks, (0, 0, 0), np.bool_),
        n_img // n_batch, n_gauss, width, height, tile_size, view(isect_offsets),
        view(flatten_ids), max_tile_len(isect_offsets, flatten_ids.shape[0]), view(extra),
        view(out_colors), view(out_alphas).reshape(shape), view(out_last))
    return out_colors, out_alphas, out_last, extra


def backward(means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
             height, tile_size, isect_offsets, flatten_ids, camera, render_colors,
             render_alphas, last_ids, v_render_colors, v_render_alphas, extra):
    """The forward's arguments, its outputs and extra, and the outputs' gradients
    (v_render_colors [I, H, W, D], v_render_alphas [I, H, W, 1]). Returns v_means [B, N, 3],
    v_quats [B, N, 4], v_scales [B, N, 3], v_colors [I * N, D], v_opacities [I * N],
    v_backgrounds [I, D] or None."""
    del viewmats, Ks, camera, render_colors, render_alphas
    n_img, th, tw = isect_offsets.shape
    n_batch, n_gauss = means.shape[:2]
    n_cams = n_img // n_batch
    n_pairs, n_ch = colors.shape
    n = flatten_ids.shape[0]
    dt = colors.dtype
    np_dt = view(colors).dtype
    shape = (n_img, height, width)
    first, pos = group_by_gaussian(view(flatten_ids), n_pairs)
    part = np.empty((n, V_COLOR + n_ch), np.float64)
    bg_part = np.empty((n_img * th * tw, n_ch), np.float64)
    flat_means, flat_quats, flat_scales = (view(t.reshape(-1, t.shape[-1]))
                                           for t in (means, quats, scales))
    parallel_for(
        backward_kernel, n_img * th * tw, flat_means, flat_quats, flat_scales, view(colors),
        view(opacities), _optional(backgrounds, (0, n_ch), np_dt),
        _optional(masks, (0, 0, 0), np.bool_), n_cams, n_gauss, width, height, tile_size,
        view(isect_offsets), view(flatten_ids), max_tile_len(isect_offsets, n), view(extra),
        view(last_ids), view(v_render_colors), view(v_render_alphas).reshape(shape), pos, part,
        bg_part)
    geom = np.empty((n_pairs, N_GEOM), np.float64)
    v_colors = alloc((n_pairs, n_ch), dt)
    v_opacities = alloc((n_pairs,), dt)
    parallel_for(reduce_pairs_kernel, (n_pairs + BLOCK - 1) // BLOCK, part, first, geom,
                 view(v_colors), view(v_opacities))
    # each Gaussian's pairs summed over the cameras, in camera order
    geom = geom.reshape(n_batch, n_cams, n_gauss, N_GEOM)
    summed = geom[:, 0].copy()
    for c in range(1, n_cams):
        summed += geom[:, c]
    v_means = alloc((n_batch, n_gauss, 3), dt)
    v_quats = alloc((n_batch, n_gauss, 4), dt)
    v_scales = alloc((n_batch, n_gauss, 3), dt)
    n_rows = n_batch * n_gauss
    parallel_for(gaussians_kernel, (n_rows + BLOCK - 1) // BLOCK,
                 summed.reshape(n_rows, N_GEOM), flat_quats, flat_scales,
                 view(v_means.reshape(n_rows, 3)), view(v_quats.reshape(n_rows, 4)),
                 view(v_scales.reshape(n_rows, 3)))
    v_backgrounds = None
    if backgrounds is not None:
        v_backgrounds = alloc((n_img, n_ch), dt)
        reduce_backgrounds(bg_part, n_img, view(v_backgrounds))
    return v_means, v_quats, v_scales, v_colors, v_opacities, v_backgrounds


__all__ = ["backward", "forward", "project_with_ut"]
