"""Reference: 2D Gaussian splatting (surfels, Huang et al. 2024), as gsplat 1.5.3 renders it —
the projection (``fully_fused_projection_2dgs``) and the rasterizer
(``rasterize_to_pixels_2dgs``). Plain PyTorch, differentiable by autograd.

A surfel has centre ``mean``, rotation ``R_q`` and two scales (the third is ignored). In
camera space its points are ``T [u, v, 1]`` with ``T = [R s_u e_1 | R s_v e_2 | mean_c]``; the
ray transform ``M = K T`` [3, 3] maps them to homogeneous pixels. The screen box is the
pixel-space ellipse of the surfel's unit circle (``means2d``, half extents ``e``), radii
``ceil(3.33 e)``. Culled (radii 0) when the depth is outside (near, far), the box test's
quadric is degenerate, both radii are <= ``radius_clip``, or the box misses the image.
The normal is the surfel's third axis in camera space, turned to face the camera.

For a pixel centre p and surfel M (rows M_u, M_v, M_w), the ray meets the surfel plane at
``s = (h_u × h_v)_xy / (h_u × h_v)_z`` with ``h_u = p_x M_w - M_u``, ``h_v = p_y M_w - M_v``;
``sigma = 0.5 min(|s|², 2 |mean2d - p|²)`` (the 2D term is gsplat's low-pass filter). Alpha,
the skips and the stop are the 3DGS contract's. Besides colours and alphas it composites
normals, the depth distortion ``sum_i 2 w_i (d_i (1 - T_i) - sum_{j<i} w_j d_j)`` and the
median depth (the depth of the last contributor reached while T > 0.5), the depth being the
last colour channel. ``densify`` [G, 2] translates each surfel on the screen (it moves the
pixel it is evaluated at by ``-densify``); it is zero, and its gradient is the screen-space
gradient 2DGS densifies by (gsplat's ``gradient_2dgs``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, RADIUS_SIGMAS, TRANSMITTANCE_STOP
from .rasterize import _buckets, _gather, _tile_lists

FILTER_INV_SQUARE = 2.0  # gsplat's weight of the 2D low-pass term
_BOX_TEST = (1.0, 1.0, -1.0)  # the quadric diag(1, 1, -1) of the unit circle


def _rotmat(quats: Tensor) -> Tensor:
    """[..., 4] (w, x, y, z), any norm -> [..., 3, 3]."""
    w, x, y, z = F.normalize(quats, dim=-1).unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    ], dim=-1).reshape(*quats.shape[:-1], 3, 3)  # fmt: skip


def fully_fused_projection_2dgs(
    means: Tensor,  # [B, N, 3]
    quats: Tensor,  # [B, N, 4]
    scales: Tensor,  # [B, N, 3]
    viewmats: Tensor,  # [B, C, 4, 4]
    Ks: Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """radii [B,C,N,2] int32, means2d [B,C,N,2], depths [B,C,N], ray_transforms
    [B,C,N,3,3] (rows M_u, M_v, M_w) and normals [B,C,N,3]; culled entries are zero."""
    R, t = viewmats[..., :3, :3], viewmats[..., :3, 3]  # [B,C,3,3], [B,C,3]
    means_c = torch.einsum("bcij,bnj->bcni", R, means) + t[:, :, None, :]  # [B,C,N,3]
    rot_c = torch.einsum("bcij,bnjk->bcnik", R, _rotmat(quats))  # [B,C,N,3,3]
    axes = rot_c[..., :2] * scales[:, None, :, None, :2]  # [B,C,N,3,2]
    T = torch.cat([axes, means_c[..., None]], dim=-1)  # [B,C,N,3,3]
    M = Ks[:, :, None] @ T  # [B,C,N,3,3]

    test = M.new_tensor(_BOX_TEST)
    dist = (test * M[..., 2, :] * M[..., 2, :]).sum(-1)  # [B,C,N]
    ok = dist != 0
    f = test / torch.where(ok, dist, torch.ones_like(dist))[..., None]  # [B,C,N,3]
    means2d = torch.stack([(f * M[..., 0, :] * M[..., 2, :]).sum(-1),
                           (f * M[..., 1, :] * M[..., 2, :]).sum(-1)], dim=-1)
    second = torch.stack([(f * M[..., 0, :] ** 2).sum(-1), (f * M[..., 1, :] ** 2).sum(-1)], -1)
    depths = means_c[..., 2]
    with torch.no_grad():
        half = (means2d * means2d - second).clamp_min(1e-4).sqrt()
        radius = torch.ceil(RADIUS_SIGMAS * half)  # [B,C,N,2]
        valid = ok & (depths > near_plane) & (depths < far_plane)
        valid &= ~((radius[..., 0] <= radius_clip) & (radius[..., 1] <= radius_clip))
        mx, my, rx, ry = means2d[..., 0], means2d[..., 1], radius[..., 0], radius[..., 1]
        valid &= (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height)
        radii = (radius * valid[..., None]).to(torch.int32)
    normals = rot_c[..., 2]
    facing = torch.where((-normals * means_c).sum(-1) > 0, 1.0, -1.0).to(normals.dtype)
    normals = normals * facing[..., None]
    keep = valid[..., None]
    zero = torch.zeros((), dtype=means2d.dtype, device=means2d.device)
    return (radii, torch.where(keep, means2d, zero), torch.where(valid, depths, zero),
            torch.where(keep[..., None], M, zero), torch.where(keep, normals, zero))


def surfel_sigma(
    M: Tensor,  # [..., 3, 3] ray transforms
    mean: Tensor,  # [..., 2]
    px: Tensor,  # [...] pixel centre x
    py: Tensor,  # [...] pixel centre y
) -> tuple[Tensor, Tensor]:
    """sigma [...] of surfels at pixel centres (shapes broadcast) and ``ok`` [...]: False where
    the ray is parallel to the surfel (gsplat skips those; sigma is 0 there)."""
    # h_u × h_v = p_x (M_v × M_w) + p_y (M_w × M_u) + M_u × M_v: three crosses per surfel,
    # then two multiply-adds per pixel and component
    M_u, M_v, M_w = M[..., 0, :], M[..., 1, :], M[..., 2, :]
    a = torch.linalg.cross(M_v, M_w, dim=-1)
    b = torch.linalg.cross(M_w, M_u, dim=-1)
    c = torch.linalg.cross(M_u, M_v, dim=-1)
    cross_x = px * a[..., 0] + py * b[..., 0] + c[..., 0]
    cross_y = px * a[..., 1] + py * b[..., 1] + c[..., 1]
    cross_z = px * a[..., 2] + py * b[..., 2] + c[..., 2]
    ok = cross_z != 0
    cz = torch.where(ok, cross_z, torch.ones_like(cross_z))
    s_u, s_v = cross_x / cz, cross_y / cz
    dx, dy = mean[..., 0] - px, mean[..., 1] - py
    g = torch.minimum(s_u * s_u + s_v * s_v, FILTER_INV_SQUARE * (dx * dx + dy * dy))
    return torch.where(ok, 0.5 * g, torch.zeros_like(g)), ok


def _composite_bucket(mean, M, color, opac, normal, shift, in_list, pixels):
    """One bucket of tiles: mean [t,K,2], M [t,K,3,3], color [t,K,D], opac [t,K],
    normal [t,K,3], shift [t,K,2] or [t,P,K,2] (densify), in_list [t,K], pixels [t,P,2].

    Returns colour [t,P,D], normal [t,P,3], T [t,P], distortion [t,P], median depth [t,P],
    contributing mask [t,P,K]."""
    if shift.dim() == 3:
        shift = shift[:, None]
    p = pixels.to(mean.dtype)[:, :, None, :] + PIXEL_CENTER - shift  # [t,P,K,2]
    sigma, ok = surfel_sigma(M[:, None], mean[:, None], p[..., 0], p[..., 1])  # [t,P,K]
    ok = ok & in_list[:, None, :]
    sigma = torch.where(ok, sigma, torch.zeros_like(sigma))
    alpha = torch.clamp_max(opac[:, None, :] * torch.exp(-sigma), ALPHA_CLAMP)
    active = ok & (sigma >= 0) & (alpha >= ALPHA_SKIP)
    alpha = torch.where(active, alpha, torch.zeros_like(alpha))
    one_minus = 1.0 - alpha
    t_incl = torch.cumprod(one_minus, dim=-1)
    t_excl = torch.cat([torch.ones_like(t_incl[..., :1]), t_incl[..., :-1]], dim=-1)
    contrib = active & (t_incl > TRANSMITTANCE_STOP)
    w = torch.where(contrib, alpha * t_excl, torch.zeros_like(alpha))  # [t,P,K]
    accum = torch.einsum("tpk,tkd->tpd", w, color)
    normals = torch.einsum("tpk,tkd->tpd", w, normal)
    trans = torch.prod(torch.where(contrib, one_minus, torch.ones_like(alpha)), -1)
    depth = color[..., -1][:, None, :].expand_as(w)  # [t,P,K]
    wd = w * depth
    before = torch.cumsum(wd, -1) - wd
    distort = (2.0 * (wd * (1.0 - t_excl) - w * before)).sum(-1)
    reached = contrib & (t_excl > 0.5)
    k = torch.arange(w.shape[-1], device=w.device)
    last = torch.where(reached, k, -1).max(dim=-1).values  # [t,P]
    median = torch.where(last >= 0, depth.gather(-1, last.clamp_min(0)[..., None])[..., 0],
                         torch.zeros_like(trans))
    return accum, normals, trans, distort, median, contrib


def _abs_sum_hook(into: Tensor, ids: Tensor, in_list: Tensor):
    """A hook on the per-pixel shifts [t,P,K,2]: adds sum_P |gradient| to ``into[ids]``."""

    def hook(grad: Tensor) -> None:
        into.index_add_(0, ids, grad.abs().sum(1)[in_list].to(into.dtype))

    return hook


def rasterize_to_pixels_2dgs(
    means2d: Tensor,  # [G, 2]
    ray_transforms: Tensor,  # [G, 3, 3]
    colors: Tensor,  # [G, D]
    opacities: Tensor,  # [G]
    normals: Tensor,  # [G, 3]
    densify: Tensor,  # [G, 2]
    backgrounds: Tensor | None,  # [I, D]
    masks: Tensor | None,  # [I, TH, TW]
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [I, TH, TW]
    flatten_ids: Tensor,  # [n_isects]
    absgrad_into: Tensor | None = None,  # [G, 2]
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """render_colors [I,H,W,D], render_alphas [I,H,W,1], render_normals [I,H,W,3],
    render_distort [I,H,W,1], render_median [I,H,W,1].

    With ``absgrad_into``, the backward pass adds to it the sum over pixels of the absolute
    per-pixel gradient of ``densify`` (which must require grad)."""
    I, TH, TW = isect_offsets.shape
    D = colors.shape[-1]
    dev, dt = means2d.device, means2d.dtype
    starts, counts = _tile_lists(isect_offsets, flatten_ids.shape[0], masks)
    geometry = (I, TH, TW, width, height, tile_size)
    n_pix = I * height * width
    out_c = torch.zeros((n_pix, D), dtype=dt, device=dev)
    out_n = torch.zeros((n_pix, 3), dtype=dt, device=dev)
    out_t = torch.ones((n_pix,), dtype=dt, device=dev)
    out_d = torch.zeros((n_pix,), dtype=dt, device=dev)
    out_m = torch.zeros((n_pix,), dtype=dt, device=dev)
    for tiles, K in _buckets(counts, tile_size * tile_size):
        gid, in_list, _, pixels, flat, _ = _gather(tiles, K, starts, counts, flatten_ids,
                                                   geometry)
        shift = densify[gid]  # [t, K, 2]
        if absgrad_into is not None:
            shift = shift[:, None].expand(-1, pixels.shape[1], -1, -1)  # [t, P, K, 2]
            shift.register_hook(_abs_sum_hook(absgrad_into, gid[in_list], in_list))
        c, n, t, dist, med, _ = _composite_bucket(
            means2d[gid], ray_transforms[gid], colors[gid], opacities[gid], normals[gid],
            shift, in_list, pixels)
        inside = flat >= 0
        idx = flat[inside]
        out_c = out_c.index_copy(0, idx, c[inside])
        out_n = out_n.index_copy(0, idx, n[inside])
        out_t = out_t.index_copy(0, idx, t[inside])
        out_d = out_d.index_copy(0, idx, dist[inside])
        out_m = out_m.index_copy(0, idx, med[inside])
    render_colors = out_c.reshape(I, height, width, D)
    trans = out_t.reshape(I, height, width, 1)
    if backgrounds is not None:
        render_colors = render_colors + trans * backgrounds[:, None, None, :]
    return (render_colors, 1.0 - trans, out_n.reshape(I, height, width, 3),
            out_d.reshape(I, height, width, 1), out_m.reshape(I, height, width, 1))


__all__ = ["fully_fused_projection_2dgs", "rasterize_to_pixels_2dgs", "surfel_sigma"]
