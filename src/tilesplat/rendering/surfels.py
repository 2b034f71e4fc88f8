"""``rasterization_2dgs()``: surfels (2D Gaussians, Huang et al. 2024) through the 2DGS ops,
gsplat 1.5.3 compatible; the steps it shares with ``rasterization`` are in ``_pipeline.py``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..backends import call_options
from ..backends.registry import resolve_name
from ..constants import RENDER_MODES, TILE_SIZE
from ..ops.twodgs import fully_fused_projection_2dgs, rasterize_to_pixels_2dgs
from ..ops.validation import (
    Shapes,
    check_choice,
    check_deterministic,
    check_int_at_least,
    check_positive_int,
    check_tensor,
)
from ._pipeline import (
    PackedIds,
    add_depth_channel,
    colors_per_pair,
    expected_depth,
    gather_rows,
    tile_lists,
)


def depth_to_normal(
    depths: Tensor,  # [..., H, W, 1] z-depth
    camtoworlds: Tensor,  # [..., 4, 4]
    Ks: Tensor,  # [..., 3, 3]
) -> Tensor:
    """World-space normals [..., H, W, 3] of a depth map: the normalised cross product of the
    central differences of its back-projected points (zero on the one-pixel border)."""
    H, W = depths.shape[-3:-1]
    y, x = torch.meshgrid(torch.arange(H, device=depths.device, dtype=depths.dtype),
                          torch.arange(W, device=depths.device, dtype=depths.dtype),
                          indexing="ij")
    fx, fy = Ks[..., 0, 0, None, None], Ks[..., 1, 1, None, None]
    cx, cy = Ks[..., 0, 2, None, None], Ks[..., 1, 2, None, None]
    dirs = torch.stack([(x + 0.5 - cx) / fx, (y + 0.5 - cy) / fy, torch.ones_like(fx * x)], -1)
    dirs = torch.einsum("...ij,...hwj->...hwi", camtoworlds[..., :3, :3], dirs)
    points = camtoworlds[..., None, None, :3, 3] + depths * dirs  # [..., H, W, 3]
    dv = points[..., 2:, 1:-1, :] - points[..., :-2, 1:-1, :]
    du = points[..., 1:-1, 2:, :] - points[..., 1:-1, :-2, :]
    normals = F.normalize(torch.linalg.cross(dv, du, dim=-1), dim=-1)
    return F.pad(normals, (0, 0, 1, 1, 1, 1))


def rasterization_2dgs(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
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
    packed: bool = False,
    tile_size: int = TILE_SIZE,
    backgrounds: Tensor | None = None,  # [..., C, D]
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    distloss: bool = False,
    depth_mode: str = "expected",
    *,
    deterministic: bool | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor, dict]:
    """Rasterizes N surfels (2D Gaussians, Huang et al. 2024) into C images (gsplat 1.5.3).

    Args as :func:`tilesplat.rasterization`, plus ``distloss`` (needs a depth render mode)
    and ``depth_mode`` (``expected`` or ``median``: the depth the depth normals come from).
    ``backend``: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (each has the 2DGS kernels).
    ``deterministic``: as :func:`tilesplat.rasterization` (tilesplat extension).

    Returns:
        render_colors [..., C, H, W, X], render_alphas [..., C, H, W, 1], render_normals
        (world space) [..., C, H, W, 3], render_normals_from_depth (world space, for RGB+D /
        RGB+ED; a leading dim of 1 squeezed as gsplat does; else None), render_distort
        [..., C, H, W, 1], render_median [..., C, H, W, 1], and meta (radii, means2d, depths,
        ray_transforms, opacities, normals, tile grid, ``gradient_2dgs``: the zero tensor whose
        ``.grad`` is each surfel's screen-space gradient, for ``DefaultStrategy(
        key_for_gradient="gradient_2dgs")``).
    """
    check_choice("render_mode", render_mode, RENDER_MODES)
    check_choice("depth_mode", depth_mode, ("expected", "median"))
    if distloss and render_mode not in ("D", "ED", "RGB+D", "RGB+ED"):
        raise ValueError(f"distloss=True needs a depth render mode, got {render_mode!r}")
    tile_size = check_positive_int("tile_size", tile_size)
    check_tensor("colors", colors)
    check_tensor("opacities", opacities)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    s.check("opacities", opacities, "..., N")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    batch = s["..."]
    nb, B, N, C = len(batch), math.prod(s["..."]), s["N"], s["C"]
    if sh_degree is None:
        per_view = colors.dim() == nb + 3
        s.check("colors", colors, "..., C, N, D" if per_view else "..., N, D")
    else:
        per_view = colors.dim() == nb + 4
        s.check("colors", colors, "..., C, N, K, 3" if per_view else "..., N, K, 3")
        if (check_int_at_least("sh_degree", sh_degree, 0) + 1) ** 2 > s["K"]:
            raise ValueError(f"sh_degree {sh_degree} needs {(sh_degree + 1) ** 2} "
                             f"coefficients, colors has {s['K']}")

    deterministic = check_deterministic(
        deterministic, means.device,
        resolve_name("rasterize_to_pixels_2dgs", means.device, backend) if deterministic else "")
    with call_options.scope(deterministic):  # the ops' backward keep it (call_options)
        proj = fully_fused_projection_2dgs(
            means, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
            radius_clip, packed, sparse_grad, backend=backend)
        if packed:
            batch_ids, camera_ids, gaussian_ids, radii, means2d, depths, rays, normals = proj
            opac = gather_rows(opacities.reshape(B * N), batch_ids * N + gaussian_ids)
            image_ids = batch_ids * C + camera_ids
        else:
            radii, means2d, depths, rays, normals = proj
            opac = torch.broadcast_to(opacities[..., None, :], (*batch, C, N))
            batch_ids = camera_ids = gaussian_ids = image_ids = None
        densify = torch.zeros_like(means2d, requires_grad=True)

        colors = colors_per_pair(colors, sh_degree, per_view, means, viewmats, radii,
                                 PackedIds(batch_ids, camera_ids, gaussian_ids), packed, B, C, N,
                                 backend)
        colors, backgrounds = add_depth_channel(render_mode, colors, depths, backgrounds)
        tiles = tile_lists(means2d, radii, depths, width, height, tile_size, batch, B, C, packed,
                           image_ids, gaussian_ids, backend)
        isect_offsets, flatten_ids = tiles.isect_offsets, tiles.flatten_ids
        render_colors, render_alphas, render_normals, render_distort, render_median = (
            rasterize_to_pixels_2dgs(
                means2d, rays, colors, opac, normals, densify, width, height, tile_size,
                isect_offsets, flatten_ids, backgrounds=backgrounds, packed=packed,
                absgrad=absgrad, distloss=distloss, backend=backend))
    render_colors = expected_depth(render_mode, render_colors, render_alphas)
    camtoworlds = torch.linalg.inv(viewmats)
    normals_from_depth = None
    if render_mode in ("RGB+D", "RGB+ED"):
        depth = render_colors[..., -1:] if depth_mode == "expected" else render_median
        normals_from_depth = depth_to_normal(depth, camtoworlds, Ks).squeeze(0)
    render_normals = torch.einsum("...ij,...hwj->...hwi", camtoworlds[..., :3, :3],
                                  render_normals)
    meta = {
        "batch_ids": batch_ids, "camera_ids": camera_ids, "gaussian_ids": gaussian_ids,
        "radii": radii, "means2d": means2d, "depths": depths, "ray_transforms": rays,
        "opacities": opac, "normals": normals, **tiles.meta(), "width": width,
        "height": height, "tile_size": tile_size, "n_batches": B,
        "n_cameras": C, "render_distort": render_distort, "gradient_2dgs": densify,
    }
    return (render_colors, render_alphas, render_normals, normals_from_depth, render_distort,
            render_median, meta)
