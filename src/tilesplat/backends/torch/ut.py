"""Reference: 3DGUT as gsplat 1.5.3 defines it — the projection of 3D Gaussians by the
unscented transform through the exact camera (``fully_fused_projection_with_ut``), and the
rasterizer that evaluates each Gaussian in 3D along each pixel's ray
(``rasterize_to_pixels_eval3d``). The cameras (distortion, f-theta, rolling shutter) are
``lens.py``.

Projection (no gradient, as gsplat's): the seven sigma points of each Gaussian,
``mean`` and ``mean ± sqrt(3 + lambda) s_i r_i`` (r_i the i-th column of its rotation,
``lambda = alpha² (3 + kappa) - 3``), go through the camera (at the shutter's time of their
pixel); their weighted mean (weights ``lambda / (3 + lambda)`` and ``1 / (2 (3 + lambda))``) is
``means2d``, their weighted scatter (the first weight plus ``1 - alpha² + beta``) the 2D
covariance. Culled (radii 0) when the depth at the middle of the exposure is below
``near_plane`` or above ``far_plane``, when the sigma points are not valid (all of them, or any
with ``require_all_sigma_points_valid=False``), when det of the covariance + ``eps2d`` is <= 0,
when ``opacity * compensation < 1/255`` (gsplat applies the compensation to this test even
without ``calc_compensations``), when both radii are <= ``radius_clip`` or the box misses the
image. Radii: ``ceil(min(extend sqrt(cov_ii), extend sqrt(v1)))``, v1 the larger eigenvalue
bound ``b + sqrt(max(0.01, b² - det))``, b the mean of the diagonal, ``extend =
min(3.33, sqrt(2 ln(255 opacity compensation)))`` with opacities.

Rasterizer: the ray ``o + t d`` of pixel centre (x + 0.5, y + 0.5) through the camera (the
distortion inverted, the pose at the pixel's time); in each Gaussian's frame ``M = S⁻¹ Rᵀ``
the ray is ``M (o - mean) + t M d``, and its largest response along the whole line is
``exp(-|n × M (o - mean)|² / 2)`` with ``n = M d / |M d|``. Alpha = min(0.999, opacity ×
response) and the compositing is the 2D contract's (``rasterize.py``: skip below 1/255, stop
before T <= 1e-4, backgrounds, masks). A pixel whose ray is invalid gets the background and
alpha 0. The backward is autograd's gradient of that definition, bucket by bucket.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, RADIUS_SIGMAS
from ..ut_camera import UTCamera, UTParams
from ._vjp import leaf, vjp
from .covariance import quat_to_rotmat
from .lens import Lens, Shutter, pixel_rays, transform, world_to_image
from .rasterize import Canvas, _blend, _buckets, _gather, _tile_lists

# the eigenvalue bound of the radii: b + sqrt(max(EIGEN_GAP_MIN, b² - det)) (gsplat's 0.01)
EIGEN_GAP_MIN = 0.01

# ---------------------------------------------------------------------------------------------
# the unscented transform


def sigma_points(means: Tensor, quats: Tensor, scales: Tensor,
                 ut: UTParams) -> tuple[Tensor, list[float], list[float]]:
    """The sigma points [..., 7, 3] of Gaussians (means [..., 3], quats [..., 4], scales
    [..., 3]): the mean, then mean + and - the three scaled axes; and their weights for the
    mean and for the covariance (7 each)."""
    lam = ut.alpha**2 * (3.0 + ut.kappa) - 3.0
    axes = math.sqrt(3.0 + lam) * quat_to_rotmat(quats) * scales[..., None, :]  # columns
    axes = axes.transpose(-1, -2)  # [..., 3 axes, 3]
    points = torch.cat([means[..., None, :], means[..., None, :] + axes,
                        means[..., None, :] - axes], dim=-2)
    w_mean = [lam / (3.0 + lam)] + [1.0 / (2.0 * (3.0 + lam))] * 6
    w_cov = [w_mean[0] + 1.0 - ut.alpha**2 + ut.beta] + w_mean[1:]
    return points, w_mean, w_cov


def project_with_ut(
    means: Tensor,  # [B, N, 3]
    quats: Tensor,  # [B, N, 4]
    scales: Tensor,  # [B, N, 3]
    opacities: Tensor | None,  # [B, N]
    viewmats: Tensor,  # [B, C, 4, 4]
    Ks: Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    calc_compensations: bool,
    camera: UTCamera,  # tensors [B, C, ...]
    ut: UTParams,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The definition. Returns radii [B,C,N,2] int32, means2d [B,C,N,2], depths [B,C,N],
    conics [B,C,N,3], compensations [B,C,N] or None; culled entries have zero radii, means2d,
    conics and compensations, and their depth."""
    with torch.no_grad():
        # the depth (and the near/far test) at the middle of the exposure
        mid = Shutter(viewmats, camera.viewmats_rs, camera.shutter, width, height, 1)
        R, t = mid.pose(0.5)
        depths = transform(R, t, means[:, None])[..., 2]  # [B, C, N]
        valid = (depths >= near_plane) & (depths <= far_plane)

        points, w_mean, w_cov = sigma_points(means, quats, scales, ut)  # [B, N, 7, 3]
        lens = Lens(camera, Ks, width, height, ut.in_image_margin_factor, 2)
        shutter = Shutter(viewmats, camera.viewmats_rs, camera.shutter, width, height, 2)
        image, ok = world_to_image(lens, shutter, points[:, None])  # [B, C, N, 7, 2]
        valid &= ok.all(-1) if ut.require_all_sigma_points_valid else ok.any(-1)
        w_mean = image.new_tensor(w_mean)[:, None]
        w_cov = image.new_tensor(w_cov)
        means2d = (w_mean * image).sum(-2)
        d = image - means2d[..., None, :]
        cov = torch.einsum("s,...si,...sj->...ij", w_cov, d, d)

        det_orig = cov[..., 0, 0] * cov[..., 1, 1] - cov[..., 0, 1] * cov[..., 1, 0]
        a, b, c = cov[..., 0, 0] + eps2d, cov[..., 0, 1], cov[..., 1, 1] + eps2d
        det = a * c - b * b
        valid &= det > 0
        safe_det = torch.where(valid, det, torch.ones_like(det))
        conics = torch.stack([c / safe_det, -b / safe_det, a / safe_det], dim=-1)
        compensations = torch.sqrt((det_orig / safe_det).clamp_min(0.0))

        extend = torch.full_like(depths, RADIUS_SIGMAS)
        if opacities is not None:
            opac = opacities[:, None, :] * compensations
            valid &= opac >= ALPHA_SKIP
            extend = torch.minimum(
                extend, torch.sqrt(2.0 * torch.log((opac / ALPHA_SKIP).clamp_min(1.0))))
        half_trace = 0.5 * (a + c)
        v1 = half_trace + torch.sqrt((half_trace * half_trace - det).clamp_min(EIGEN_GAP_MIN))
        r1 = extend * torch.sqrt(v1.clamp_min(0.0))
        rx = torch.ceil(torch.minimum(extend * torch.sqrt(a.clamp_min(0.0)), r1))
        ry = torch.ceil(torch.minimum(extend * torch.sqrt(c.clamp_min(0.0)), r1))
        valid &= ~((rx <= radius_clip) & (ry <= radius_clip))
        mx, my = means2d[..., 0], means2d[..., 1]
        valid &= (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height)

        keep = valid[..., None]
        radii = torch.where(keep, torch.stack([rx, ry], dim=-1), 0.0).to(torch.int32)
        means2d = torch.where(keep, means2d, 0.0)
        conics = torch.where(keep, conics, 0.0)
        compensations = (torch.where(valid, compensations, 0.0) if calc_compensations
                         else None)
        return radii, means2d, depths, conics, compensations


# ---------------------------------------------------------------------------------------------
# eval3d: the rasterizer of Gaussians evaluated along the pixels' rays


def image_rays(viewmats: Tensor, Ks: Tensor, camera: UTCamera, width: int,
               height: int) -> tuple[Tensor, Tensor, Tensor]:
    """World rays of every pixel centre of I images (viewmats [I,4,4], Ks [I,3,3], camera
    tensors [I, ...]): origins [I*H*W, 3], unit directions [I*H*W, 3], valid [I*H*W]."""
    dt, dev = viewmats.dtype, viewmats.device
    ys, xs = torch.meshgrid(torch.arange(height, dtype=dt, device=dev),
                            torch.arange(width, dtype=dt, device=dev), indexing="ij")
    pixels = torch.stack([xs, ys], dim=-1)[None] + PIXEL_CENTER  # [1, H, W, 2]
    lens = Lens(camera, Ks, width, height, 0.0, 2)  # the margin is the projection's only
    shutter = Shutter(viewmats, camera.viewmats_rs, camera.shutter, width, height, 2)
    origin, direction, valid = pixel_rays(lens, shutter, pixels)
    I = viewmats.shape[0]
    return (origin.expand(I, height, width, 3).reshape(-1, 3),
            direction.expand(I, height, width, 3).reshape(-1, 3),
            valid.expand(I, height, width).reshape(-1))


def _response_bucket(mean, quat, scale, color, opac, in_list, origin, direction, ray_ok):
    """Compositing of one bucket of tiles: mean [t,K,3], quat [t,K,4], scale [t,K,3],
    color [t,K,D], opac [t,K], in_list [t,K]; the pixels' rays origin [t,P,3], direction
    [t,P,3], ray_ok [t,P]. Returns accumulated colour [t,P,D], transmittance [t,P] and the
    contributing mask [t,P,K]."""
    M = quat_to_rotmat(quat).transpose(-1, -2) / scale[..., :, None]  # S⁻¹ Rᵀ [t, K, 3, 3]
    gro = torch.einsum("tkij,tpkj->tpki", M, origin[:, :, None, :] - mean[:, None, :, :])
    grd = torch.einsum("tkij,tpj->tpki", M, direction)
    length2 = (grd * grd).sum(-1, keepdim=True)
    # gsplat's safe_normalize: a zero vector stays zero
    tiny = torch.finfo(grd.dtype).tiny
    grd_n = torch.where(length2 > 0, grd * torch.rsqrt(length2.clamp_min(tiny)), grd)
    n_x_gro = torch.linalg.cross(grd_n, gro, dim=-1)
    power = -0.5 * (n_x_gro * n_x_gro).sum(-1)  # [t, P, K], <= 0
    ok = in_list[:, None, :] & ray_ok[:, :, None]
    power = torch.where(ok, power, torch.zeros_like(power))
    alpha = torch.clamp_max(opac[:, None, :] * torch.exp(power), ALPHA_CLAMP)
    return _blend(alpha, ok, color)


def _pairs(means, viewmats, Ks, camera, width, height, tile_size, isect_offsets, flatten_ids,
           masks):
    """Yields each bucket of tiles: the pairs' ids into the [I*N] colours (gid [t,K]) and into
    the [B*N] Gaussians (rows [t,K]), in_list [t,K], the intersection indices [t,K], the flat
    pixel ids [t,P] (-1 outside), the image of each tile [t], and the pixels' rays."""
    I, TH, TW = isect_offsets.shape
    B, N = means.shape[:2]
    C = I // B
    origin, direction, valid = image_rays(viewmats, Ks, camera, width, height)
    starts, counts = _tile_lists(isect_offsets, flatten_ids.shape[0], masks)
    geometry = (I, TH, TW, width, height, tile_size)
    for tiles, K in _buckets(counts, tile_size * tile_size):
        gid, in_list, isect, _, flat, image = _gather(tiles, K, starts, counts, flatten_ids,
                                                      geometry)
        rows = (gid // (C * N)) * N + gid % N  # batch * N + gaussian
        inside = flat >= 0
        pix = flat.clamp_min(0)
        yield (gid, rows, in_list, isect, flat, image, origin[pix], direction[pix],
               valid[pix] & inside)


def composite(means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
              height, tile_size, isect_offsets, flatten_ids, camera):
    """The definition. Shapes: means [B,N,3], quats [B,N,4], scales [B,N,3], colors [I*N,D],
    opacities [I*N], backgrounds [I,D] or None, masks [I,TH,TW] or None, viewmats [I,4,4],
    Ks [I,3,3], isect_offsets [I,TH,TW], flatten_ids [n] (into the I*N pairs); ``camera``'s
    tensors [I, ...]. Returns render_colors [I,H,W,D], render_alphas [I,H,W,1], last_ids
    [I,H,W] int32 (-1: no contribution)."""
    I = isect_offsets.shape[0]
    D = colors.shape[-1]
    flat_means, flat_quats, flat_scales = (x.reshape(-1, x.shape[-1])
                                           for x in (means, quats, scales))
    canvas = Canvas(I, height, width, D, colors.dtype, colors.device)
    for gid, rows, in_list, isect, flat, _, o, d, ray_ok in _pairs(
            means, viewmats, Ks, camera, width, height, tile_size, isect_offsets, flatten_ids,
            masks):
        acc_b, trans_b, contrib = _response_bucket(
            flat_means[rows], flat_quats[rows], flat_scales[rows], colors[gid], opacities[gid],
            in_list, o, d, ray_ok)
        canvas.put(flat, acc_b, trans_b, contrib, isect)
    return canvas.finish(backgrounds)


def forward(means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
            height, tile_size, isect_offsets, flatten_ids, camera):
    """render_colors, render_alphas, last_ids and no extra tensor (the backward recomputes)."""
    with torch.no_grad():
        return *composite(means, quats, scales, colors, opacities, backgrounds, masks,
                          viewmats, Ks, width, height, tile_size, isect_offsets, flatten_ids,
                          camera), None


def backward(means, quats, scales, colors, opacities, backgrounds, masks, viewmats, Ks, width,
             height, tile_size, isect_offsets, flatten_ids, camera, render_colors,
             render_alphas, last_ids, v_render_colors, v_render_alphas, extra):
    """Autograd's gradient of :func:`composite`, bucket by bucket (buckets own disjoint
    pixels, so their vector-Jacobian products add up). Returns v_means [B,N,3], v_quats,
    v_scales, v_colors [I*N,D], v_opacities [I*N], v_backgrounds [I,D] or None."""
    del render_colors, render_alphas, last_ids, extra
    I = isect_offsets.shape[0]
    D = colors.shape[-1]
    flat = [x.reshape(-1, x.shape[-1]) for x in (means, quats, scales)]
    grads_gauss = [torch.zeros_like(x) for x in flat]
    v_colors, v_opacities = torch.zeros_like(colors), torch.zeros_like(opacities)
    v_col = v_render_colors.reshape(-1, D)
    v_alpha = v_render_alphas.reshape(-1)
    # d colour / d background = T; T = 1 where no list ran (masked tiles, empty lists)
    trans_all = colors.new_ones(I * height * width) if backgrounds is not None else None
    for gid, rows, in_list, _, pix, image, o, d, ray_ok in _pairs(
            means, viewmats, Ks, camera, width, height, tile_size, isect_offsets, flatten_ids,
            masks):
        keep = pix >= 0
        safe = pix.clamp_min(0)
        g_col = torch.where(keep[..., None], v_col[safe], 0.0)  # [t, P, D]
        g_trans = -torch.where(keep, v_alpha[safe], 0.0)  # [t, P]
        if backgrounds is not None:
            g_trans = g_trans + (g_col * backgrounds[image][:, None, :]).sum(-1)
        with torch.enable_grad():
            leaves = [leaf(x[rows]) for x in flat] + [leaf(colors[gid]), leaf(opacities[gid])]
            acc_b, trans_b, _ = _response_bucket(*leaves, in_list, o, d, ray_ok)
            grads = vjp([acc_b, trans_b], [g_col, g_trans], leaves)
        sel = in_list.reshape(-1)
        row_ids, pair_ids = rows.reshape(-1)[sel], gid.reshape(-1)[sel]
        for full, g in zip(grads_gauss, grads[:3], strict=True):
            full.index_add_(0, row_ids, g.reshape(-1, full.shape[-1])[sel])
        v_colors.index_add_(0, pair_ids, grads[3].reshape(-1, D)[sel])
        v_opacities.index_add_(0, pair_ids, grads[4].reshape(-1)[sel])
        if trans_all is not None:
            trans_all[pix[keep]] = trans_b.detach()[keep]
    v_backgrounds = None
    if backgrounds is not None:
        v_backgrounds = (v_col * trans_all[:, None]).reshape(I, -1, D).sum(dim=1)
    v_means, v_quats, v_scales = (g.reshape(x.shape) for g, x in
                                  zip(grads_gauss, (means, quats, scales), strict=True))
    return v_means, v_quats, v_scales, v_colors, v_opacities, v_backgrounds


__all__ = ["backward", "composite", "forward", "project_with_ut", "sigma_points"]
