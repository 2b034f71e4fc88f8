"""Public 2DGS ops of gsplat 1.5.3: ``fully_fused_projection_2dgs`` and
``rasterize_to_pixels_2dgs`` (surfels; the torch reference defines them, see
``backends/torch/twodgs.py``). Differentiable by autograd through the reference."""

from __future__ import annotations

import math

from torch import Tensor

from ..backends.registry import resolve
from .sparse_grad import SparseRows, check_sparse_grad, with_sparse_grad
from .validation import (
    Shapes,
    check_bool,
    check_finite,
    check_positive_int,
    check_projection_options,
    check_tensor,
    common_float,
)


def fully_fused_projection_2dgs(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    packed: bool = False,
    sparse_grad: bool = False,
    *,
    backend: str | None = None,
) -> tuple[Tensor, ...]:
    """Projects surfels (2D Gaussians) to the image: ray transforms, screen boxes, normals.

    Args (as gsplat):
        means, quats (w, x, y, z, any norm), scales (the third is ignored): [..., N, 3|4|3]
        viewmats: world-to-camera. [..., C, 4, 4]
        Ks: intrinsics. [..., C, 3, 3]
        eps2d: accepted for gsplat's signature; 2DGS has no 2D blur.
        packed: return only the visible (batch, camera, Gaussian) entries.
        sparse_grad: with ``packed`` and no batch dims, the gradients of means, quats and
            scales are sparse COO tensors over the visible Gaussians (``ops/sparse_grad.py``).
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (each has kernels for it).

    Returns:
        unpacked: radii [..., C, N, 2] int32, means2d [..., C, N, 2], depths [..., C, N],
        ray_transforms [..., C, N, 3, 3] (K·[s_u R e_1 | s_v R e_2 | mean_c]), normals
        [..., C, N, 3] (camera space, facing the camera); culled entries are zero.
        packed: batch_ids, camera_ids, gaussian_ids [nnz], then the same five for them.
    """
    named = {"means": means, "quats": quats, "scales": scales, "viewmats": viewmats, "Ks": Ks}
    for name, t in named.items():
        check_tensor(name, t)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    s.check("quats", quats, "..., N, 4")
    s.check("scales", scales, "..., N, 3")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    s.check("Ks", Ks, "..., C, 3, 3")
    width, height, _, near_plane, far_plane, radius_clip = check_projection_options(
        width, height, eps2d, near_plane, far_plane, radius_clip)
    check_bool("packed", packed)
    _, device = common_float(named)
    check_finite(named)
    batch, N, C = s["..."], s["N"], s["C"]
    B = math.prod(batch)
    rows = None
    if check_sparse_grad(sparse_grad, packed, batch, "fully_fused_projection_2dgs"):
        rows = SparseRows()
        means, quats, scales = with_sparse_grad(rows, means, quats, scales)
    _, impl = resolve("fully_fused_projection_2dgs", device, backend)
    radii, means2d, depths, M, normals = impl(
        means.reshape(B, N, 3), quats.reshape(B, N, 4), scales.reshape(B, N, 3),
        viewmats.reshape(B, C, 4, 4), Ks.reshape(B, C, 3, 3), width, height, near_plane,
        far_plane, radius_clip)
    if packed:
        sel = (radii > 0).all(dim=-1)  # [B, C, N]
        b, c, n = sel.nonzero(as_tuple=True)
        if rows is not None:
            rows.set(sel.any(dim=1)[0])
        return (b, c, n, radii[b, c, n], means2d[b, c, n], depths[b, c, n], M[b, c, n],
                normals[b, c, n])
    return (radii.reshape(*batch, C, N, 2), means2d.reshape(*batch, C, N, 2),
            depths.reshape(*batch, C, N), M.reshape(*batch, C, N, 3, 3),
            normals.reshape(*batch, C, N, 3))


def rasterize_to_pixels_2dgs(
    means2d: Tensor,  # [..., N, 2] or [nnz, 2]
    ray_transforms: Tensor,  # [..., N, 3, 3] or [nnz, 3, 3]
    colors: Tensor,  # [..., N, channels] or [nnz, channels]
    opacities: Tensor,  # [..., N] or [nnz]
    normals: Tensor,  # [..., N, 3] or [nnz, 3]
    densify: Tensor,  # [..., N, 2] or [nnz, 2]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., tile_height, tile_width]
    flatten_ids: Tensor,  # [n_isects]
    backgrounds: Tensor | None = None,  # [..., channels]
    masks: Tensor | None = None,  # [..., tile_height, tile_width]
    packed: bool = False,
    absgrad: bool = False,
    distloss: bool = False,
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Composites surfels front to back per pixel (gsplat's 2DGS rasterizer).

    The depth of the distortion and median outputs is the last colour channel (render
    ``RGB+D`` colours to get them). ``densify`` is a zero tensor whose gradient becomes the
    screen-space gradient of each surfel (gsplat's ``gradient_2dgs``).

    Args:
        absgrad: after backward, ``densify.absgrad`` [..., N, 2] holds the sum over pixels
            of the absolute per-pixel gradient of ``densify`` (AbsGS for 2DGS).
        distloss: accepted (gsplat switches the distortion's gradient with it; autograd
            always has it).
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (each has kernels for it).

    Returns:
        render_colors [..., H, W, channels], render_alphas [..., H, W, 1], render_normals
        [..., H, W, 3] (camera space), render_distort [..., H, W, 1], render_median
        [..., H, W, 1].
    """
    width = check_positive_int("image_width", image_width)
    height = check_positive_int("image_height", image_height)
    tile_size = check_positive_int("tile_size", tile_size)
    check_bool("packed", packed)
    check_bool("absgrad", absgrad)
    check_bool("distloss", distloss)
    if absgrad and not densify.requires_grad:
        raise ValueError("absgrad=True needs densify with requires_grad=True (its .absgrad "
                         "is filled by the backward pass)")
    named = {"means2d": means2d, "ray_transforms": ray_transforms, "colors": colors,
             "opacities": opacities, "normals": normals, "densify": densify,
             "backgrounds": backgrounds}
    for name, t in named.items():
        if t is not None:
            check_tensor(name, t)
    check_tensor("isect_offsets", isect_offsets, "int")
    check_tensor("flatten_ids", flatten_ids, "int")
    s = Shapes()
    lead = "nnz" if packed else "..., N"
    s.check("means2d", means2d, f"{lead}, 2")
    s.check("ray_transforms", ray_transforms, f"{lead}, 3, 3")
    s.check("colors", colors, f"{lead}, D")
    s.check("opacities", opacities, lead)
    s.check("normals", normals, f"{lead}, 3")
    s.check("densify", densify, f"{lead}, 2")
    s.check("isect_offsets", isect_offsets, "..., TH, TW")
    s.check("flatten_ids", flatten_ids, "n")
    if backgrounds is not None:
        s.check("backgrounds", backgrounds, "..., D")
    if masks is not None:
        check_tensor("masks", masks, "bool")
        s.check("masks", masks, "..., TH, TW")
    TH, TW = s["TH"], s["TW"]
    if TH * tile_size < height or TW * tile_size < width:
        raise ValueError(f"isect_offsets covers {TW}x{TH} tiles of {tile_size} px, less than "
                         f"the {width}x{height} image")
    _, device = common_float({**named, "isect_offsets": isect_offsets,
                              "flatten_ids": flatten_ids, "masks": masks})
    check_finite(named)
    image_dims = s["..."]
    I, D = math.prod(image_dims), s["D"]
    G = means2d.shape[0] if packed else I * s["N"]
    if flatten_ids.numel() and (int(flatten_ids.min()) < 0 or int(flatten_ids.max()) >= G):
        raise ValueError(f"expected flatten_ids in [0, {G}), got "
                         f"[{int(flatten_ids.min())}, {int(flatten_ids.max())}]")
    absgrad_into = None
    if absgrad:
        absgrad_into = densify.new_zeros((G, 2))
        densify.absgrad = absgrad_into.view(densify.shape)  # filled by the backward pass
    _, impl = resolve("rasterize_to_pixels_2dgs", device, backend)
    outs = impl(
        means2d.reshape(G, 2), ray_transforms.reshape(G, 3, 3), colors.reshape(G, D),
        opacities.reshape(G), normals.reshape(G, 3), densify.reshape(G, 2),
        None if backgrounds is None else backgrounds.reshape(I, D),
        None if masks is None else masks.reshape(I, TH, TW), width, height, tile_size,
        isect_offsets.reshape(I, TH, TW), flatten_ids.long(), absgrad_into=absgrad_into)
    tails = (D, 1, 3, 1, 1)
    return tuple(o.reshape(*image_dims, height, width, k) for o, k in zip(outs, tails,
                                                                         strict=True))
