"""``rasterization()``: the one high-level call for 3D Gaussians, gsplat 1.5.3 compatible.

Projection → (SH colours) → tile intersection → rasterization, returning images, alphas and
the intermediate results in ``meta``; the steps it shares with ``rasterization_2dgs`` are in
``_pipeline.py``, the model-parallel exchange (``distributed=True``) in ``sharding.py``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backends.registry import current_backward_scheme
from ..constants import RASTERIZE_MODES, RENDER_MODES
from ..ops import fully_fused_projection, rasterize_to_pixels
from ..ops.camera import RollingShutterType
from ..ops.validation import (
    Shapes,
    check_bool,
    check_choice,
    check_finite,
    check_int_at_least,
    check_positive_int,
    check_tensor,
    internal_call,
)
from . import sharding, ut
from ._pipeline import (
    PackedIds,
    add_depth_channel,
    colors_per_pair,
    expected_depth,
    gather_rows,
    tile_lists,
)


def rasterization(
    means: Tensor,  # [..., N, 3]
    quats: Tensor | None,  # [..., N, 4]
    scales: Tensor | None,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor,  # [..., (C,) N, D] or [..., (C,) N, K, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    packed: bool = True,
    tile_size: int = 16,
    backgrounds: Tensor | None = None,  # [..., C, D]
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: str = "classic",
    channel_chunk: int = 32,
    distributed: bool = False,
    camera_model: str = "pinhole",
    segmented: bool = False,
    covars: Tensor | None = None,  # [..., N, 3, 3]
    with_ut: bool = False,
    with_eval3d: bool = False,
    radial_coeffs: Tensor | None = None,
    tangential_coeffs: Tensor | None = None,
    thin_prism_coeffs: Tensor | None = None,
    ftheta_coeffs: object | None = None,
    rolling_shutter: RollingShutterType = RollingShutterType.GLOBAL,
    viewmats_rs: Tensor | None = None,
    *,
    backward_scheme: str | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Rasterizes N 3D Gaussians into C images (gsplat 1.5.3 ``rasterization``).

    Args (as gsplat; see its documentation for the details):
        means: centres. [..., N, 3]
        quats: quaternions (w, x, y, z), not necessarily normalised. [..., N, 4]
        scales: scales. [..., N, 3]
        opacities: opacities in [0, 1]. [..., N]
        colors: post-activation colours [..., (C,) N, D], or SH coefficients
            [..., (C,) N, K, 3] when ``sh_degree`` is set (colour = SH + 0.5, clamped at 0).
        viewmats: world-to-camera matrices. [..., C, 4, 4]
        Ks: intrinsics. [..., C, 3, 3]
        width, height: image size in pixels.
        packed: compact the visible (camera, Gaussian) pairs (same images as unpacked).
        backgrounds: background colours. [..., C, D]
        render_mode: ``RGB``, ``D``, ``ED``, ``RGB+D`` or ``RGB+ED``.
        absgrad: put sum over pixels of |d loss / d means2d| on ``meta["means2d"].absgrad``.
        rasterize_mode: ``classic`` or ``antialiased`` (opacity × compensation).
        channel_chunk: rasterize at most this many channels at a time.
        camera_model: ``pinhole``, ``ortho`` or ``fisheye``; ``ftheta`` with ``with_ut``.
        covars: covariances [..., N, 3, 3] instead of quats and scales.
        with_ut, with_eval3d, radial_coeffs, tangential_coeffs, thin_prism_coeffs,
            ftheta_coeffs, rolling_shutter, viewmats_rs: 3DGUT (``rendering/ut.py``): the
            unscented-transform projection through the exact camera, the rasterizer that
            evaluates Gaussians in 3D along the pixels' rays; both need ``packed=False``.
        backward_scheme: ``per_pixel`` or ``per_splat`` (tilesplat extension).
        backend: ``auto``, ``torch``, ``cpu`` or ``cuda`` (tilesplat extension).
        segmented: accepted for compatibility (no effect).

    Returns:
        render_colors [..., C, H, W, X] (X = D, 1, or D+1 by render_mode), render_alphas
        [..., C, H, W, 1], and meta (radii, means2d, depths, conics, opacities, tile grid,
        isect_ids, flatten_ids, isect_offsets, last_ids, ...).
    """
    check_choice("render_mode", render_mode, RENDER_MODES)
    check_choice("rasterize_mode", rasterize_mode, RASTERIZE_MODES)
    tile_size = check_positive_int("tile_size", tile_size)
    channel_chunk = check_positive_int("channel_chunk", channel_chunk)
    width = check_positive_int("width", width)
    height = check_positive_int("height", height)
    check_bool("packed", packed)
    check_bool("absgrad", absgrad)
    check_bool("distributed", distributed)
    scheme = current_backward_scheme(backward_scheme)

    check_tensor("means", means)
    check_tensor("opacities", opacities)
    check_tensor("colors", colors)
    check_tensor("viewmats", viewmats)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    batch_dims = s["..."]
    nb = len(batch_dims)
    s.check("opacities", opacities, "..., N")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    B, N, C = math.prod(batch_dims), s["N"], s["C"]
    tri = None
    if covars is not None:
        check_tensor("covars", covars)
        s.check("covars", covars, "..., N, 3, 3")
        tri = covars[..., [0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]
        quats = scales = None
    elif quats is None or scales is None:
        raise ValueError("expected quats and scales, or covars; got neither")
    ut_render = ut.check_arguments(
        s, Ks, width, height, camera_model, with_ut, with_eval3d, radial_coeffs,
        tangential_coeffs, thin_prism_coeffs, ftheta_coeffs, rolling_shutter, viewmats_rs,
        covars, packed, sparse_grad, absgrad, distributed,
    )

    if sh_degree is None:
        per_view = colors.dim() == nb + 3
        pattern = "..., C, N, D" if per_view else "..., N, D"
    else:
        sh_degree = check_int_at_least("sh_degree", sh_degree, 0)
        per_view = colors.dim() == nb + 4
        pattern = "..., C, N, K, 3" if per_view else "..., N, K, 3"
    s.check("colors", colors, pattern)
    if backgrounds is not None:
        check_tensor("backgrounds", backgrounds)
        s.check("backgrounds", backgrounds, "..., C, D" if sh_degree is None else "..., C, 3")

    # what the caller gave, read once; the ops below take only what the kernels made of it
    given = {"means": means, "quats": quats, "scales": scales, "covars": tri,
             "opacities": opacities, "colors": colors, "viewmats": viewmats, "Ks": Ks,
             "backgrounds": backgrounds}
    check_finite({k: v for k, v in given.items() if isinstance(v, Tensor)})
    with internal_call():
        if distributed:
            # this rank's Gaussians into every rank's cameras; rasterize its own cameras
            if batch_dims:
                raise ValueError(f"rasterization(distributed=True) takes no batch dims, got means "
                                 f"{tuple(means.shape)}")
            if absgrad:
                raise ValueError("rasterization(distributed=True) does not support absgrad")
            if per_view:
                raise ValueError("rasterization(distributed=True) needs per-Gaussian colors "
                                 "[N, D] or [N, K, 3], not per-camera ones")
            rank, world_size = sharding.world()
            check_tensor("Ks", Ks)
            viewmats, Ks, n_cams, n_gauss = sharding.gather_cameras(world_size, viewmats, Ks, N)
            C = int(viewmats.shape[0])

        if ut_render is not None and ut_render.with_ut:
            proj = ut.project(ut_render, means, quats, scales, opacities, viewmats, Ks, width,
                              height, eps2d, near_plane, far_plane, radius_clip,
                              rasterize_mode == "antialiased", backend)
        else:
            proj = fully_fused_projection(
                means, tri, quats, scales, viewmats, Ks, width, height, eps2d=eps2d,
                near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip,
                packed=packed, calc_compensations=rasterize_mode == "antialiased",
                camera_model=camera_model, opacities=opacities, backend=backend,
            )
        if packed:
            batch_ids, camera_ids, gaussian_ids, radii, means2d, depths, conics, comps = proj
            opac = gather_rows(opacities.reshape(B * N), batch_ids * N + gaussian_ids)
            image_ids = batch_ids * C + camera_ids
        else:
            radii, means2d, depths, conics, comps = proj
            opac = torch.broadcast_to(opacities[..., None, :], (*batch_dims, C, N))
            batch_ids = camera_ids = gaussian_ids = image_ids = None
        if comps is not None:
            opac = opac * comps
        meta: dict = {
            "batch_ids": batch_ids, "camera_ids": camera_ids, "gaussian_ids": gaussian_ids,
            "radii": radii, "means2d": means2d, "depths": depths, "conics": conics,
            "opacities": opac,
        }

        colors = colors_per_pair(colors, sh_degree, per_view, means, viewmats, radii,
                                 PackedIds(batch_ids, camera_ids, gaussian_ids), packed, B, C, N,
                                 backend, viewmats_rs=viewmats_rs)

        if distributed:
            if packed:
                camera_ids, gaussian_ids, (radii, means2d, depths, conics, opac, colors) = (
                    sharding.exchange_packed(world_size, rank, n_cams, n_gauss, camera_ids,
                                             gaussian_ids,
                                             [radii, means2d, depths, conics, opac, colors]))
                image_ids = camera_ids
            else:
                radii, means2d, depths, conics, opac, colors = sharding.exchange_unpacked(
                    world_size, rank, n_cams, n_gauss,
                    [radii, means2d, depths, conics, opac, colors])
            C = n_cams[rank]
            meta.update({"n_cameras_per_rank": n_cams, "n_gaussians_per_rank": n_gauss})

        colors, backgrounds = add_depth_channel(render_mode, colors, depths, backgrounds)

        # what the rasterizer composites ([..., C, N, D] or [nnz, D]); its gradient is the
        # rasterizer's colour gradient (the bench's replay of a run compares it across backends)
        meta["colors"] = colors

        tiles = tile_lists(means2d, radii, depths, width, height, tile_size, batch_dims, B, C,
                           packed, image_ids, gaussian_ids, backend)
        isect_offsets, flatten_ids = tiles.isect_offsets, tiles.flatten_ids
        meta.update(tiles.meta())
        meta.update({
            "width": width, "height": height, "tile_size": tile_size, "n_batches": B,
            "n_cameras": C, "backward_scheme": scheme,
        })

        n_channels = colors.shape[-1]
        chunks_c, chunks_a = [], []
        last_ids = None
        for start in range(0, n_channels, channel_chunk):
            stop = min(start + channel_chunk, n_channels)
            chunk_bg = None if backgrounds is None else backgrounds[..., start:stop]
            if ut_render is not None and ut_render.with_eval3d:
                out_c, out_a, ids = ut.rasterize(
                    ut_render, means, quats, scales, colors[..., start:stop], opac, viewmats,
                    Ks, width, height, tile_size, isect_offsets, flatten_ids, chunk_bg, backend)
            else:
                out_c, out_a, ids = rasterize_to_pixels(
                    means2d, conics, colors[..., start:stop], opac, width, height, tile_size,
                    isect_offsets, flatten_ids, backgrounds=chunk_bg, packed=packed,
                    absgrad=absgrad, backward_scheme=scheme, return_last_ids=True,
                    backend=backend,
                )
            chunks_c.append(out_c)
            chunks_a.append(out_a)
            last_ids = ids if last_ids is None else last_ids
        render_colors = chunks_c[0] if len(chunks_c) == 1 else torch.cat(chunks_c, dim=-1)
        render_alphas = chunks_a[0]
        meta["last_ids"] = last_ids

        return expected_depth(render_mode, render_colors, render_alphas), render_alphas, meta
