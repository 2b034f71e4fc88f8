"""Public ops of 3DGUT (gsplat 1.5.3): ``fully_fused_projection_with_ut``, the projection of 3D
Gaussians by the unscented transform through the exact camera (distortion, f-theta, rolling
shutter), and ``rasterize_to_pixels_eval3d``, the rasterizer that evaluates each Gaussian in 3D
along each pixel's ray. The definitions are the torch reference's (``backends/torch/ut.py``);
the camera's checks are ``lens.py``."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backends.registry import resolve
from .camera import (
    FThetaCameraDistortionParameters,
    RollingShutterType,
    UnscentedTransformParameters,
)
from .lens import check_camera, check_camera_values, tensors, ut_params_of
from .ut_packed import expand_packed
from .validation import (
    Shapes,
    as_int32,
    check_backgrounds_masks,
    check_bool,
    check_finite,
    check_positive_int,
    check_projection_options,
    check_tensor,
    check_tile_lists,
    common_float,
    values_trusted,
)


def fully_fused_projection_with_ut(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    opacities: Tensor | None,  # [..., N]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    calc_compensations: bool = False,
    camera_model: str = "pinhole",
    ut_params: UnscentedTransformParameters = UnscentedTransformParameters(),  # noqa: B008
    radial_coeffs: Tensor | None = None,  # [..., C, 6] or [..., C, 4]
    tangential_coeffs: Tensor | None = None,  # [..., C, 2]
    thin_prism_coeffs: Tensor | None = None,  # [..., C, 4]
    ftheta_coeffs: FThetaCameraDistortionParameters | None = None,
    rolling_shutter: RollingShutterType = RollingShutterType.GLOBAL,
    viewmats_rs: Tensor | None = None,  # [..., C, 4, 4]
    *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Projects Gaussians to 2D by the unscented transform (gsplat's 3DGUT projection).

    As ``fully_fused_projection``, but each Gaussian's seven sigma points go through the exact
    camera: ``pinhole`` (perfect, or OpenCV with ``radial_coeffs`` k1..k6,
    ``tangential_coeffs`` p1, p2, ``thin_prism_coeffs`` s1..s4), ``fisheye`` (OpenCV, radial
    k1..k4) or ``ftheta`` (``ftheta_coeffs``), at the pose of their pixel's time on a rolling
    shutter (``viewmats`` at the start of the exposure, ``viewmats_rs`` at its end).
    ``ut_params``: gsplat's sigma-point parameters. Not differentiable (as gsplat's): the
    outputs carry no gradient. ``backend``: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (the
    torch reference, the cpu and the cuda kernels implement it).

    Returns:
        radii [..., C, N, 2] int32, means2d [..., C, N, 2], depths [..., C, N] (at the middle
        of the exposure), conics [..., C, N, 3], compensations [..., C, N] or None. Culled
        entries have radii 0 and zero means2d, conics and compensations.
    """
    named = {"means": means, "quats": quats, "scales": scales, "viewmats": viewmats, "Ks": Ks}
    for name, t in named.items():
        check_tensor(name, t)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    s.check("quats", quats, "..., N, 4")
    s.check("scales", scales, "..., N, 3")
    if opacities is not None:
        check_tensor("opacities", opacities)
        s.check("opacities", opacities, "..., N")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    s.check("Ks", Ks, "..., C, 3, 3")
    width, height, eps2d, near_plane, far_plane, radius_clip = check_projection_options(
        width, height, eps2d, near_plane, far_plane, radius_clip)
    check_bool("calc_compensations", calc_compensations)
    ut = ut_params_of(ut_params)
    camera = check_camera(s, camera_model, Ks, width, height, radial_coeffs, tangential_coeffs,
                          thin_prism_coeffs, ftheta_coeffs, rolling_shutter, viewmats_rs)
    named.update(opacities=opacities, **tensors(camera))
    _, device = common_float(named)
    check_finite(named)
    check_camera_values(camera, Ks, width, height)

    batch = s["..."]
    B, N, C = math.prod(batch), s["N"], s["C"]

    def flat(t: Tensor | None, *tail: int) -> Tensor | None:
        return None if t is None else t.detach().reshape(B, *tail).contiguous()

    _, impl = resolve("fully_fused_projection_with_ut", device, backend)
    with torch.no_grad():
        radii, means2d, depths, conics, comps = impl(
            flat(means, N, 3), flat(quats, N, 4), flat(scales, N, 3), flat(opacities, N),
            flat(viewmats, C, 4, 4), flat(Ks, C, 3, 3), width, height, eps2d, near_plane,
            far_plane, radius_clip, calc_compensations, camera.reshaped(B, C), ut,
        )
    return (
        radii.reshape(*batch, C, N, 2),
        means2d.reshape(*batch, C, N, 2),
        depths.reshape(*batch, C, N),
        conics.reshape(*batch, C, N, 3),
        None if comps is None else comps.reshape(*batch, C, N),
    )


class _RasterizeToPixelsEval3D(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, means, quats, scales, colors, opacities, backgrounds, masks, viewmats,
                Ks, width, height, tile_size, isect_offsets, flatten_ids, camera):
        render_colors, render_alphas, last_ids, extra = impl.forward(
            means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
            height, tile_size, isect_offsets, flatten_ids, camera,
        )
        ctx.impl = impl
        ctx.params = (width, height, tile_size, camera)
        ctx.save_for_backward(means, quats, scales, colors, opacities, backgrounds, masks,
                              viewmats, Ks, isect_offsets, flatten_ids, render_colors,
                              render_alphas, last_ids, extra)
        ctx.mark_non_differentiable(last_ids)
        return render_colors, render_alphas, last_ids

    @staticmethod
    def backward(ctx, v_render_colors, v_render_alphas, _v_last_ids):
        if ctx.needs_input_grad[8]:
            raise ValueError(
                "rasterize_to_pixels_eval3d() gives no gradient for viewmats (gsplat 1.5.3 "
                "silently gives none); pass viewmats.detach(), or render with_eval3d=False")
        (means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks,
         isect_offsets, flatten_ids, render_colors, render_alphas, last_ids,
         extra) = ctx.saved_tensors
        width, height, tile_size, camera = ctx.params
        if v_render_colors is None:
            v_render_colors = torch.zeros_like(render_colors)
        if v_render_alphas is None:
            v_render_alphas = torch.zeros_like(render_alphas)
        v_means, v_quats, v_scales, v_colors, v_opacities, v_backgrounds = ctx.impl.backward(
            means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
            height, tile_size, isect_offsets, flatten_ids, camera, render_colors, render_alphas,
            last_ids, v_render_colors.contiguous(), v_render_alphas.contiguous(), extra,
        )
        return (None, v_means, v_quats, v_scales, v_colors, v_opacities,
                v_backgrounds if ctx.needs_input_grad[6] else None,
                None, None, None, None, None, None, None, None, None)


def rasterize_to_pixels_eval3d(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    colors: Tensor,  # [..., C, N, D] or [nnz, D]
    opacities: Tensor,  # [..., C, N] or [nnz]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., C, TH, TW]
    flatten_ids: Tensor,  # [n]
    backgrounds: Tensor | None = None,  # [..., C, D]
    masks: Tensor | None = None,  # [..., C, TH, TW] bool
    camera_model: str = "pinhole",
    ut_params: UnscentedTransformParameters = UnscentedTransformParameters(),  # noqa: B008
    radial_coeffs: Tensor | None = None,  # [..., C, 6] or [..., C, 4]
    tangential_coeffs: Tensor | None = None,  # [..., C, 2]
    thin_prism_coeffs: Tensor | None = None,  # [..., C, 4]
    ftheta_coeffs: FThetaCameraDistortionParameters | None = None,
    rolling_shutter: RollingShutterType = RollingShutterType.GLOBAL,
    viewmats_rs: Tensor | None = None,  # [..., C, 4, 4]
    *,
    gaussian_ids: Tensor | None = None,  # [nnz]
    return_last_ids: bool = False,
    backend: str | None = None,
) -> tuple[Tensor, ...]:
    """Rasterizes Gaussians with their response evaluated in 3D along each pixel's ray
    (gsplat's eval3d), front to back per tile with the 2D contract's alpha rules.

    Each pixel centre's ray goes through the camera (``camera_model`` and its coefficients as
    in :func:`fully_fused_projection_with_ut`, the distortion inverted by Newton's method, the
    pose at the pixel's time on a rolling shutter); a Gaussian's alpha is its opacity times
    its largest response along the ray. ``isect_offsets``, ``flatten_ids`` index the
    [..., C, N] pairs as ``rasterize_to_pixels``'s do, or the [nnz] rows of packed colours.
    ``ut_params`` is accepted for gsplat's signature (the rays do not use it).
    Differentiable in means, quats, scales, colors, opacities and backgrounds; a ``viewmats``
    that requires grad makes the backward raise ``ValueError`` (gsplat silently gives none).
    Extra keywords: ``gaussian_ids`` (with packed colours, the Gaussian of each row),
    ``return_last_ids`` (also return last_ids [..., C, H, W] int32, -1 where nothing
    contributed), ``backend`` (``auto`` | ``torch`` | ``cpu`` | ``cuda``; the torch
    reference, the cpu and the cuda kernels implement it).

    Packed colours (gsplat 1.5.3 declares them and raises ``NotImplementedError``): colors
    [nnz, D] and opacities [nnz] are the visible (camera, Gaussian) pairs of a packed
    projection, any batch dims included, with ``gaussian_ids`` [nnz] (tilesplat's keyword: the
    3D evaluation needs each row's Gaussian, which gsplat's signature cannot say); the tile
    lists are packed ones (``flatten_ids`` index the nnz rows); a row's image is the image
    of the lists that read it. The rows are expanded to the [..., C, N] pairs the kernels
    take (``ops/ut_packed.py``): memory as the unpacked call's, I·N·(D + 1) floats for
    I = batch × C images, plus nnz + n int64 indices; the images and gradients are those of
    the unpacked call.

    Returns:
        render_colors [..., C, H, W, D] (background included), render_alphas
        [..., C, H, W, 1] (and last_ids when asked).
    """
    width = check_positive_int("image_width", image_width)
    height = check_positive_int("image_height", image_height)
    tile_size = check_positive_int("tile_size", tile_size)
    check_bool("return_last_ids", return_last_ids)
    named = {"means": means, "quats": quats, "scales": scales, "colors": colors,
             "opacities": opacities, "viewmats": viewmats, "Ks": Ks}
    for name, t in named.items():
        check_tensor(name, t)
    check_tensor("isect_offsets", isect_offsets, "int")
    check_tensor("flatten_ids", flatten_ids, "int")
    s = Shapes()
    s.check("means", means, "..., N, 3")
    s.check("quats", quats, "..., N, 4")
    s.check("scales", scales, "..., N, 3")
    packed = colors.dim() == 2
    if packed:
        s.check("colors", colors, "nnz, D")
        s.check("opacities", opacities, "nnz")
        if gaussian_ids is None:
            raise ValueError("rasterize_to_pixels_eval3d() with packed colors [nnz, D] needs "
                             "gaussian_ids [nnz], the Gaussian of each row")
        check_tensor("gaussian_ids", gaussian_ids, "int")
        s.check("gaussian_ids", gaussian_ids, "nnz")
    else:
        if gaussian_ids is not None:
            raise ValueError("rasterize_to_pixels_eval3d(gaussian_ids=...) is for packed colors "
                             f"[nnz, D]; got colors {tuple(colors.shape)}")
        s.check("colors", colors, "..., C, N, D")
        s.check("opacities", opacities, "..., C, N")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    s.check("Ks", Ks, "..., C, 3, 3")
    s.check("isect_offsets", isect_offsets, "..., C, TH, TW")
    s.check("flatten_ids", flatten_ids, "n")
    check_backgrounds_masks(s, backgrounds, masks, "..., C")
    ut_params_of(ut_params)
    camera = check_camera(s, camera_model, Ks, width, height, radial_coeffs, tangential_coeffs,
                          thin_prism_coeffs, ftheta_coeffs, rolling_shutter, viewmats_rs)
    named.update(backgrounds=backgrounds, masks=masks, isect_offsets=isect_offsets,
                 flatten_ids=flatten_ids, **tensors(camera))
    _, device = common_float(named)
    check_finite(named)
    check_camera_values(camera, Ks, width, height)
    batch, C, N, D, TH, TW = s["..."], s["C"], s["N"], s["D"], s["TH"], s["TW"]
    B = math.prod(batch)
    I = B * C
    isect_offsets = as_int32(isect_offsets).reshape(I, TH, TW).contiguous()
    flatten_ids = as_int32(flatten_ids).contiguous()
    if packed:
        check_tile_lists(isect_offsets, flatten_ids, s["nnz"], "nnz", width, height, tile_size)
        if not values_trusted() and gaussian_ids.numel() and (
                int(gaussian_ids.min()) < 0 or int(gaussian_ids.max()) >= N):
            raise ValueError(f"expected gaussian_ids in [0, {N}) (N Gaussians)")
        colors, opacities, flatten_ids = expand_packed(colors, opacities, gaussian_ids,
                                                       isect_offsets, flatten_ids, N)
    else:
        check_tile_lists(isect_offsets, flatten_ids, I * N, "I*N", width, height, tile_size)

    def flat(t: Tensor | None, *shape: int) -> Tensor | None:
        return None if t is None else t.reshape(*shape).contiguous()

    _, impl = resolve("rasterize_to_pixels_eval3d", device, backend)
    render_colors, render_alphas, last_ids = _RasterizeToPixelsEval3D.apply(
        impl, flat(means, B, N, 3), flat(quats, B, N, 4), flat(scales, B, N, 3),
        flat(colors, I * N, D), flat(opacities, I * N), flat(backgrounds, I, D),
        flat(masks, I, TH, TW), flat(viewmats, I, 4, 4), flat(Ks, I, 3, 3).detach(), width,
        height, tile_size, isect_offsets, flatten_ids, camera.reshaped(I),
    )
    out = (render_colors.reshape(*batch, C, height, width, D),
           render_alphas.reshape(*batch, C, height, width, 1))
    if return_last_ids:
        out = out + (last_ids.reshape(*batch, C, height, width),)
    return out
