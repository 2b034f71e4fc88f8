"""Launchers of the CPU ``rasterize_to_pixels``: they allocate the outputs and what the forward
keeps for the backward (``rasterize_saved``), and run the kernels of ``rasterize_fwd`` and
``rasterize_bwd`` tile by tile over threads (``_common.parallel_for``).
"""

from __future__ import annotations

import numpy as np
import torch

from ._common import alloc, num_threads, parallel_for, view
from .cull import max_tile_len, splat_bounds
from .rasterize_bwd import (
    backward_kernel,
    reduce_backgrounds,
    sum_rows_kernel,
)
from .rasterize_bwd_tiles import N_FIXED
from .rasterize_fwd import forward_kernel
from .rasterize_saved import alloc_saved, float_shape, n_slices, unpack_saved


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
    """Returns render_colors [I, H, W, D], render_alphas [I, H, W, 1], last_ids [I, H, W] and
    what the backward of ``scheme`` needs from this pass (None when scheme is None), packed
    into one uint8 tensor by ``rasterize_saved``:

    - the hit flags [n, n_sub] of the (intersection, pixel slice) pairs that contribute;
    - per_pixel: trans [I, H, W], each pixel's final transmittance as the loop computed it
      (1 - render_alphas has lost its low bits when T is small, and the back-to-front walk
      scales every T it recovers by it);
    - per_splat, float32: colors_lo [I, H, W, D], what rounding the float64 sum of the colours
      to float32 lost (render_colors + colors_lo is that sum to ~48 bits; the backward
      subtracts contributions from it). Nothing for float64 data.
    """
    n_img = isect_offsets.shape[0]
    n_ch = colors.shape[1]
    n_isects = flatten_ids.shape[0]
    dt = means2d.dtype
    np_dt = view(means2d).dtype
    out_colors = alloc((n_img, height, width, n_ch), dt)
    out_alphas = alloc((n_img, height, width, 1), dt)
    out_last = alloc((n_img, height, width), torch.int32)
    saved = None
    flags = np.zeros((n_isects, 0), np.uint8)
    out_lo = np.zeros((0, 0, 0, n_ch), np_dt)
    out_trans = np.zeros((0, 0, 0), np_dt)
    if scheme is not None:
        shape = float_shape(scheme, dt, n_img, height, width, n_ch)
        saved, flags, floats = alloc_saved(n_isects, n_slices(tile_size), shape, np_dt)
        if scheme == "per_pixel":
            out_trans = floats
        elif floats is not None:
            out_lo = floats
    bg = view(backgrounds) if backgrounds is not None else np.zeros((0, n_ch), np_dt)
    mk = view(masks) if masks is not None else np.zeros((0, 0, 0), np.bool_)
    parallel_for(
        forward_kernel,
        n_img * isect_offsets.shape[1] * isect_offsets.shape[2],
        view(means2d),
        view(conics),
        view(colors),
        view(opacities),
        bg,
        mk,
        width,
        height,
        tile_size,
        view(isect_offsets),
        view(flatten_ids),
        splat_bounds(means2d, conics, opacities),
        max_tile_len(isect_offsets, n_isects),
        view(out_colors),
        view(out_alphas).reshape(n_img, height, width),
        view(out_last),
        out_lo,
        out_trans,
        flags,
    )
    return out_colors, out_alphas, out_last, saved


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
    extra: torch.Tensor | None,  # the forward's saved buffer (rasterize_saved), uint8
) -> tuple[torch.Tensor | None, ...]:
    """Returns v_means2d [G, 2], v_conics [G, 3], v_colors [G, D], v_opacities [G],
    v_backgrounds [I, D] or None, absgrad_means2d [G, 2] or None. extra: what
    the forward kept for this scheme (``rasterize_saved``: the hit flags, and
    per_pixel the final transmittances, per_splat in float32 the colours' rounding
    residual)."""
    if scheme not in ("per_pixel", "per_splat"):
        raise ValueError(f"scheme must be 'per_pixel' or 'per_splat', got {scheme!r}")
    if extra is None:
        raise ValueError("the backward needs what its forward kept (rasterize.forward "
                         f"with scheme={scheme!r})")
    n_img, th, tw = isect_offsets.shape
    n_gauss, n_ch = colors.shape
    n = flatten_ids.shape[0]
    dt = means2d.dtype
    np_dt = view(means2d).dtype
    flags, floats = unpack_saved(
        extra, n, n_slices(tile_size),
        float_shape(scheme, dt, n_img, height, width, n_ch), np_dt)
    # the flagged rows are written, and no other is read: uninitialised, large, pooled
    part = view(alloc((n, N_FIXED + n_ch), dt))
    bg_part = np.empty((n_img * th * tw, n_ch), np_dt)
    bg = view(backgrounds) if backgrounds is not None else np.zeros((0, n_ch), np_dt)
    mk = view(masks) if masks is not None else np.zeros((0, 0, 0), np.bool_)
    parallel_for(
        backward_kernel,
        n_img * th * tw,
        view(means2d),
        view(conics),
        view(colors),
        view(opacities),
        bg,
        mk,
        width,
        height,
        tile_size,
        view(isect_offsets),
        view(flatten_ids),
        np.zeros((0, 4), np.float64),  # no slice ranges: the forward's flags say more
        max_tile_len(isect_offsets, n),
        view(render_colors),
        floats if scheme == "per_splat" and floats is not None
        else np.zeros((0, 0, 0, n_ch), np_dt),
        floats if scheme == "per_pixel" else np.zeros((0, 0, 0), np_dt),
        flags,
        view(render_alphas).reshape(n_img, height, width),
        view(last_ids),
        view(v_render_colors),
        view(v_render_alphas).reshape(n_img, height, width),
        scheme == "per_splat",
        absgrad,
        part,
        bg_part,
    )
    v_means2d = alloc((n_gauss, 2), dt)
    v_conics = alloc((n_gauss, 3), dt)
    v_colors = alloc((n_gauss, n_ch), dt)
    v_opacities = alloc((n_gauss,), dt)
    v_abs = alloc((n_gauss, 2), dt) if absgrad else None
    parallel_for(
        sum_rows_kernel,
        num_threads(),
        view(flatten_ids),
        flags,
        part,
        view(v_means2d),
        view(v_conics),
        view(v_colors),
        view(v_opacities),
        view(v_abs) if v_abs is not None else np.zeros((0, 2), np_dt),
    )
    v_backgrounds = None
    if backgrounds is not None:
        v_backgrounds = alloc((n_img, n_ch), dt)
        reduce_backgrounds(bg_part, n_img, view(v_backgrounds))
    return v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, v_abs
