"""The CUDA 3DGUT ops: the launcher of ``fully_fused_projection_with_ut``'s kernel
(``ut_projection``) and the eval3d rasterizer's launchers (``rasterize_to_pixels_eval3d``:
they check the launch limits, compute the pixels' rays, allocate and launch the kernels of
``ut_rasterize_fwd`` and ``ut_rasterize_bwd`` image chunk by chunk, then finish the gradients
with PyTorch ops on the device).

The projection's cameras are the cpu launcher's rows (``backends/ut_launch.py``: the
reference's ``Lens`` and ``Shutter`` in float64, a few numbers per camera, built on the host
and copied to the device).

The rays are the reference's own: ``image_rays`` (``backends/torch/ut.py``: every camera
model, the distortion inverted by Newton's method, the rolling shutter's pose at each pixel's
time) runs as PyTorch ops on the device, once per forward, into a table [I, H, W, 8] (origin,
unit direction, valid, and the final transmittance the forward kernel writes) that the
backward reuses; the kernels know no camera.

With the ``deterministic`` option (``runtime.get_options``) the backward stores a row per
(intersection, warp) and ``segment.segment_sum`` sums them in a fixed order, as the 2DGS
backward does; otherwise the rows are added with float64 atomics.
"""

from __future__ import annotations

import dataclasses

import torch

from ..torch.covariance import quat_to_rotmat
from ..torch.ut import image_rays
from ..ut_camera import UTCamera, UTParams
from ..ut_launch import projection_args
from . import raster_limits
from .runtime import cdiv, empty, float_type, get_options, launch, launcher, optional
from .segment import segment_sum
from .ut_projection import THREADS, projection_kernel
from .ut_rasterize_bwd import N_GEOM, V_COLOR, V_MEAN, V_OP, V_Q, backward_kernel, n_warps
from .ut_rasterize_fwd import RAY_COLS, T_FINAL, forward_kernel

# ---------------------------------------------------------------------------------------------
# the projection


def _on_host(camera: UTCamera) -> UTCamera:
    def host(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().cpu()

    return dataclasses.replace(camera, radial=host(camera.radial),
                               tangential=host(camera.tangential),
                               thin_prism=host(camera.thin_prism),
                               viewmats_rs=host(camera.viewmats_rs))


@launcher
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
    dtype, device = means.dtype, means.device
    # the cameras' rows are a few numbers each, built on the host (one small copy back)
    rows, ft, (model, *scalars) = projection_args(
        viewmats.cpu(), Ks.cpu(), _on_host(camera), width, height, dtype, eps2d, near_plane,
        far_plane, radius_clip, ut)
    shape = (n_batch, n_cams, n_gauss)
    radii = empty((*shape, 2), torch.int32, device)
    means2d = empty((*shape, 2), dtype, device)
    depths = empty(shape, dtype, device)
    conics = empty((*shape, 3), dtype, device)
    comps = empty(shape, dtype, device)
    total = n_batch * n_cams * n_gauss
    if total > 0:
        launch(projection_kernel(float_type(dtype)), cdiv(total, THREADS), THREADS, device,
               means.contiguous(), quats.contiguous(), scales.contiguous(),
               optional(opacities, means, 2), opacities is not None,
               torch.from_numpy(rows).to(device), model, torch.from_numpy(ft).to(device),
               *scalars, radii, means2d, depths, conics, comps)
    return radii, means2d, depths, conics, comps if calc_compensations else None


# ---------------------------------------------------------------------------------------------
# launchers of the eval3d rasterizer


def ray_table(viewmats: torch.Tensor, Ks: torch.Tensor, camera: UTCamera, width: int,
              height: int) -> torch.Tensor:
    """[I, H, W, RAY_COLS] in the data's type on its device: each pixel's ray (origin, unit
    direction, valid as 1 / 0) from the reference's ``image_rays``; column T_FINAL (1 here) is
    the forward kernel's."""
    n_img = viewmats.shape[0]
    origin, direction, valid = image_rays(viewmats.detach(), Ks.detach(), camera, width, height)
    valid = valid.to(origin.dtype)[:, None]
    table = torch.cat([origin, direction, valid, torch.ones_like(valid)], dim=1)
    return table.reshape(n_img, height, width, RAY_COLS).contiguous()


def _common(means, quats, scales, colors, opacities, backgrounds, masks, width, height,
            isect_offsets, flatten_ids):
    """The kernels' leading arguments (the absent backgrounds and masks as placeholders)."""
    n_batch, n_gauss = means.shape[:2]
    n_img = isect_offsets.shape[0]
    n = flatten_ids.shape[0]
    ids = flatten_ids if n > 0 else optional(None, flatten_ids, 1, torch.int32)
    return (means.reshape(-1, 3), quats.reshape(-1, 4), scales.reshape(-1, 3), colors,
            opacities, optional(backgrounds, colors, 2), backgrounds is not None,
            optional(masks, colors, 3, torch.bool), masks is not None, n_img // n_batch,
            n_gauss, width, height, isect_offsets.reshape(-1), ids, n)


@launcher
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
    extra [I, H, W, RAY_COLS] (the rays and final transmittances, for the backward)."""
    raster_limits.check_tile_size(tile_size)
    n_img, th, tw = isect_offsets.shape
    raster_limits.check_grid(tw, th, flatten_ids.shape[0])
    channels = colors.shape[1]
    dtype, device = colors.dtype, colors.device
    shape = (n_img, height, width)
    rays = ray_table(viewmats, Ks, camera, width, height).to(dtype)
    out_colors = empty((*shape, channels), dtype, device)
    out_alphas = empty((*shape, 1), dtype, device)
    out_last = empty(shape, torch.int32, device)
    if n_img == 0:
        return out_colors, out_alphas, out_last, rays
    kernel = forward_kernel(float_type(dtype), tile_size, channels)
    common = _common(means, quats, scales, colors, opacities, backgrounds, masks, width, height,
                     isect_offsets, flatten_ids)
    for image0, n_block in raster_limits.image_chunks(n_img):
        launch(kernel, (tw, th, n_block), (tile_size, tile_size), device, *common, image0,
               n_img, rays, out_colors, out_alphas, out_last)
    return out_colors, out_alphas, out_last, rays


def _precision_vjp(quats: torch.Tensor, scales: torch.Tensor,
                   v_q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of quats [G, 4] and scales [G, 3] from v_q [G, 6] (float64), the
    symmetric gradient (00, 01, 02, 11, 12, 22) of each precision Q = R S⁻² Rᵀ, R the
    normalised quaternion's rotation: autograd of the reference's ``quat_to_rotmat`` in
    float64."""
    with torch.enable_grad():
        q = quats.detach().double().requires_grad_()
        s = scales.detach().double().requires_grad_()
        R = quat_to_rotmat(q)
        prec = (R / (s * s)[:, None, :]) @ R.transpose(-1, -2)
        iu = torch.triu_indices(3, 3, device=v_q.device)
        grad = v_q.new_zeros((v_q.shape[0], 3, 3))
        grad[:, iu[0], iu[1]] = v_q
        grad[:, iu[1], iu[0]] = v_q
        v_quats, v_scales = torch.autograd.grad(prec, (q, s), grad)
    return v_quats, v_scales


@launcher
def backward(means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
             height, tile_size, isect_offsets, flatten_ids, camera, render_colors,
             render_alphas, last_ids, v_render_colors, v_render_alphas, extra):
    """The forward's arguments, its outputs and extra (the rays with the final
    transmittances), and the outputs' gradients (v_render_colors [I, H, W, D],
    v_render_alphas [I, H, W, 1]). Returns v_means [B, N, 3], v_quats [B, N, 4], v_scales
    [B, N, 3], v_colors [I * N, D], v_opacities [I * N], v_backgrounds [I, D] or None."""
    del viewmats, Ks, camera, render_colors, render_alphas
    n_img, th, tw = isect_offsets.shape
    n_batch, n_gauss = means.shape[:2]
    n_cams = n_img // n_batch if n_batch > 0 else 0
    n_pairs, channels = colors.shape
    n = flatten_ids.shape[0]
    dtype, device = colors.dtype, colors.device
    v_c, v_a = v_render_colors.contiguous(), v_render_alphas.contiguous()
    det = bool(get_options()["deterministic"])
    n_cols = V_COLOR + channels
    warps = n_warps(tile_size)
    part = torch.zeros((n * warps if det else n_pairs, n_cols), dtype=torch.float64,
                       device=device)
    if n > 0 and n_img > 0:
        kernel = backward_kernel(float_type(dtype), tile_size, channels, det)
        common = _common(means, quats, scales, colors, opacities, backgrounds, masks, width,
                         height, isect_offsets, flatten_ids)
        for image0, n_block in raster_limits.image_chunks(n_img):
            launch(kernel, (tw, th, n_block), (tile_size, tile_size), device, *common, image0,
                   n_img, extra, last_ids, v_c, v_a, part)
    if det:  # the warps of each intersection (a fixed tree), then its pair's, in order
        part = segment_sum(part.reshape(n, warps, n_cols).sum(dim=1), flatten_ids, n_pairs)
    # each Gaussian's pairs summed over the cameras
    geom = part[:, :N_GEOM].reshape(n_batch, n_cams, n_gauss, N_GEOM).sum(dim=1)
    geom = geom.reshape(n_batch * n_gauss, N_GEOM)
    v_quats, v_scales = _precision_vjp(quats.reshape(-1, 4), scales.reshape(-1, 3),
                                       geom[:, V_Q:V_Q + 6])
    v_means = geom[:, V_MEAN:V_MEAN + 3]
    v_backgrounds = None
    if backgrounds is not None:  # render = ... + T_final * background, masked tiles too
        trans = extra[..., T_FINAL:T_FINAL + 1].to(torch.float64)
        v_backgrounds = (v_c.to(torch.float64) * trans).sum(dim=(1, 2)).to(dtype)
    return (v_means.reshape(means.shape).to(dtype), v_quats.reshape(quats.shape).to(dtype),
            v_scales.reshape(scales.shape).to(dtype), part[:, V_COLOR:].to(dtype).contiguous(),
            part[:, V_OP].to(dtype).contiguous(), v_backgrounds)


__all__ = ["backward", "forward", "project_with_ut", "ray_table"]
