"""Reference: rasterization as explicit (Gaussian, pixel) pairs (``rasterize_to_indices_in_range``)
and compositing of such pairs in PyTorch (``accumulate``).

Together they are the rasterizer written out: for one pixel, the pairs that
``rasterize_to_indices_in_range(0, big, T=1, ...)`` lists, composited by ``accumulate``, give
the colour ``rasterize_to_pixels`` renders. ``accumulate`` is differentiable by autograd.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from .twodgs import surfel_sigma


def _alpha(means2d: Tensor, conics: Tensor, opacities: Tensor, px: Tensor, py: Tensor):
    """sigma and alpha of Gaussians [..., G] at pixel centres [..., P] -> [..., P, G]."""
    dx = means2d[..., None, :, 0] - px[..., :, None]
    dy = means2d[..., None, :, 1] - py[..., :, None]
    a, b, c = conics[..., None, :, 0], conics[..., None, :, 1], conics[..., None, :, 2]
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    alpha = torch.clamp_max(opacities[..., None, :] * torch.exp(-sigma), ALPHA_CLAMP)
    return sigma, alpha


@torch.no_grad()
def _pairs(
    range_start: int,
    range_end: int,
    transmittances: Tensor,  # [I, H, W]
    N: int,
    alpha_at,  # (g [G], px [P], py [P]) -> (valid [P, G], alpha [P, G])
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [I, TH, TW]
    flatten_ids: Tensor,  # [n_isects], into the flattened [I * N]
) -> tuple[Tensor, Tensor, Tensor]:
    """The walk of both pair listings; ``alpha_at`` gives the Gaussians' alphas at pixels."""
    I, TH, TW = isect_offsets.shape
    device = transmittances.device
    block = tile_size * tile_size
    n_isects = flatten_ids.numel()
    offsets = torch.cat([isect_offsets.reshape(-1).long(),
                         torch.tensor([n_isects], device=device)]).tolist()
    keys, gids = [], []
    ys, xs = torch.meshgrid(torch.arange(tile_size, device=device),
                            torch.arange(tile_size, device=device), indexing="ij")
    for tile in range(I * TH * TW):
        start, end = offsets[tile], offsets[tile + 1]
        n_batches = (end - start + block - 1) // block
        if range_start >= n_batches:
            continue
        lo = start + range_start * block
        hi = min(end, start + min(range_end, n_batches) * block)
        image, rest = divmod(tile, TH * TW)
        ty, tx = divmod(rest, TW)
        py, px = (ys + ty * tile_size).reshape(-1), (xs + tx * tile_size).reshape(-1)
        inside = (py < image_height) & (px < image_width)
        py, px = py[inside], px[inside]
        g = flatten_ids[lo:hi].long()  # [G]
        valid, alpha = alpha_at(g, px.to(transmittances.dtype) + PIXEL_CENTER,
                                py.to(transmittances.dtype) + PIXEL_CENTER)  # [P, G]
        factor = torch.where(valid, 1.0 - alpha, torch.ones_like(alpha))
        t0 = transmittances[image, py, px]  # [P]
        # T after each pair; the first pair that takes T to the stop ends the pixel, and
        # every later valid pair is then below the stop too, so this one mask is exact
        t_next = t0[:, None] * torch.cumprod(factor, dim=1)
        emit = valid & (t_next > TRANSMITTANCE_STOP)
        p_idx, g_idx = torch.nonzero(emit, as_tuple=True)
        pix = py[p_idx] * image_width + px[p_idx]
        keys.append(image * image_height * image_width + pix)
        gids.append(g[g_idx])
    if not keys:
        empty = torch.zeros(0, dtype=torch.int64, device=device)
        return empty, empty.clone(), empty.clone()
    key, gid = torch.cat(keys), torch.cat(gids)
    order = torch.sort(key, stable=True).indices  # one tile per pixel: depth order kept
    key, gid = key[order], gid[order]
    hw = image_height * image_width
    return gid % N, key % hw, key // hw


def rasterize_to_indices_in_range(
    range_start: int,
    range_end: int,
    transmittances: Tensor,  # [I, H, W]
    means2d: Tensor,  # [I, N, 2]
    conics: Tensor,  # [I, N, 3]
    opacities: Tensor,  # [I, N]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [I, TH, TW]
    flatten_ids: Tensor,  # [n_isects], into the flattened [I * N]
) -> tuple[Tensor, Tensor, Tensor]:
    """The (Gaussian, pixel, image) pairs that contribute, front to back, when each tile's
    list is cut into batches of ``tile_size²`` and only batches ``[range_start, range_end)``
    are composited onto ``transmittances``. Pairs are ordered by image, pixel, then depth.

    Returns gaussian_ids [M] (in [0, N)), pixel_ids [M] (row-major), image_ids [M], int64.
    """
    flat_m, flat_c = means2d.reshape(-1, 2), conics.reshape(-1, 3)
    flat_o = opacities.reshape(-1)

    def alpha_at(g, px, py):
        sigma, alpha = _alpha(flat_m[g], flat_c[g], flat_o[g], px, py)
        return (sigma >= 0) & (alpha >= ALPHA_SKIP), alpha

    return _pairs(range_start, range_end, transmittances, means2d.shape[1], alpha_at,
                  image_width, image_height, tile_size, isect_offsets, flatten_ids)


def rasterize_to_indices_in_range_2dgs(
    range_start: int,
    range_end: int,
    transmittances: Tensor,  # [I, H, W]
    means2d: Tensor,  # [I, N, 2]
    ray_transforms: Tensor,  # [I, N, 3, 3]
    opacities: Tensor,  # [I, N]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [I, TH, TW]
    flatten_ids: Tensor,  # [n_isects]
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`rasterize_to_indices_in_range` of surfels (sigma of ``twodgs.surfel_sigma``)."""
    flat_m, flat_r = means2d.reshape(-1, 2), ray_transforms.reshape(-1, 3, 3)
    flat_o = opacities.reshape(-1)

    def alpha_at(g, px, py):
        sigma, ok = surfel_sigma(flat_r[g][None], flat_m[g][None], px[:, None], py[:, None])
        alpha = torch.clamp_max(flat_o[g][None] * torch.exp(-sigma), ALPHA_CLAMP)
        return ok & (sigma >= 0) & (alpha >= ALPHA_SKIP), alpha

    return _pairs(range_start, range_end, transmittances, means2d.shape[1], alpha_at,
                  image_width, image_height, tile_size, isect_offsets, flatten_ids)


def _composite_pairs(
    alpha: Tensor,  # [M]
    rays: Tensor,  # [M] image * H * W + pixel
    values: list[Tensor],  # each [M, k]
    n_rays: int,
) -> tuple[Tensor, list[Tensor]]:
    """Front-to-back weights of the pairs, in list order within each ray: alphas [n_rays, 1]
    (sum of weights) and the weighted sums [n_rays, k] of ``values``."""
    order = torch.sort(rays, stable=True).indices
    rays_s, alpha_s = rays[order], alpha[order]
    log_t = torch.log1p(-alpha_s).double()  # alpha <= ALPHA_CLAMP < 1: finite
    before = torch.cumsum(log_t, 0) - log_t  # exclusive, across rays
    first = torch.ones_like(rays_s, dtype=torch.bool)
    first[1:] = rays_s[1:] != rays_s[:-1]
    pos = torch.arange(len(rays_s), device=rays.device)
    seg_start = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
    weights = alpha_s * torch.exp(before - before[seg_start]).to(alpha.dtype)  # [M]
    alphas = torch.zeros(n_rays, 1, dtype=weights.dtype, device=weights.device)
    alphas = alphas.index_add(0, rays_s, weights[:, None])
    sums = []
    for v in values:
        out = torch.zeros(n_rays, v.shape[-1], dtype=v.dtype, device=v.device)
        sums.append(out.index_add(0, rays_s, weights[:, None] * v[order]))
    return alphas, sums


def accumulate(
    means2d: Tensor,  # [I, N, 2]
    conics: Tensor,  # [I, N, 3]
    opacities: Tensor,  # [I, N]
    colors: Tensor,  # [I, N, D]
    gaussian_ids: Tensor,  # [M]
    pixel_ids: Tensor,  # [M]
    image_ids: Tensor,  # [M]
    image_width: int,
    image_height: int,
) -> tuple[Tensor, Tensor]:
    """Front-to-back compositing of the listed pairs, in list order within each pixel:
    ``w = alpha · prod(1 - alpha of the earlier pairs of that pixel)``.

    Returns renders [I, H, W, D] = sum w · colour and alphas [I, H, W, 1] = sum w.
    """
    I, _, D = colors.shape
    gaussian_ids, pixel_ids, image_ids = gaussian_ids.long(), pixel_ids.long(), image_ids.long()
    px = (pixel_ids % image_width).to(means2d.dtype) + PIXEL_CENTER
    py = (pixel_ids // image_width).to(means2d.dtype) + PIXEL_CENTER
    m = means2d[image_ids, gaussian_ids]  # [M, 2]
    c = conics[image_ids, gaussian_ids]  # [M, 3]
    dx, dy = m[:, 0] - px, m[:, 1] - py
    sigma = 0.5 * (c[:, 0] * dx * dx + c[:, 2] * dy * dy) + c[:, 1] * dx * dy
    alpha = torch.clamp_max(opacities[image_ids, gaussian_ids] * torch.exp(-sigma), ALPHA_CLAMP)

    rays = image_ids * (image_height * image_width) + pixel_ids  # [M]
    alphas, (renders,) = _composite_pairs(alpha, rays, [colors[image_ids, gaussian_ids]],
                                          I * image_height * image_width)
    return (renders.reshape(I, image_height, image_width, D),
            alphas.reshape(I, image_height, image_width, 1))


def accumulate_2dgs(
    means2d: Tensor,  # [I, N, 2]
    ray_transforms: Tensor,  # [I, N, 3, 3]
    opacities: Tensor,  # [I, N]
    colors: Tensor,  # [I, N, D]
    normals: Tensor,  # [I, N, 3]
    gaussian_ids: Tensor,  # [M]
    pixel_ids: Tensor,  # [M]
    image_ids: Tensor,  # [M]
    image_width: int,
    image_height: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`accumulate` of surfels: renders [I,H,W,D], alphas [I,H,W,1], normals [I,H,W,3]."""
    I, _, D = colors.shape
    gaussian_ids, pixel_ids, image_ids = gaussian_ids.long(), pixel_ids.long(), image_ids.long()
    px = (pixel_ids % image_width).to(means2d.dtype) + PIXEL_CENTER
    py = (pixel_ids // image_width).to(means2d.dtype) + PIXEL_CENTER
    sigma, _ = surfel_sigma(ray_transforms[image_ids, gaussian_ids],
                            means2d[image_ids, gaussian_ids], px, py)
    alpha = torch.clamp_max(opacities[image_ids, gaussian_ids] * torch.exp(-sigma), ALPHA_CLAMP)
    rays = image_ids * (image_height * image_width) + pixel_ids
    alphas, (renders, rnormals) = _composite_pairs(
        alpha, rays, [colors[image_ids, gaussian_ids], normals[image_ids, gaussian_ids]],
        I * image_height * image_width)
    shape = (I, image_height, image_width)
    return (renders.reshape(*shape, D), alphas.reshape(*shape, 1), rnormals.reshape(*shape, 3))
