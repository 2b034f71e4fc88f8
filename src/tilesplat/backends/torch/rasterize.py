"""Reference: front-to-back alpha compositing of 2D Gaussians per tile
(``rasterize_to_pixels``) — the definition every native kernel is checked against.

For each pixel centre p = (x + 0.5, y + 0.5) and the tile's Gaussians in depth order:

    d = mean - p,  sigma = 0.5 (a dx² + c dy²) + b dx dy          (conic = (a, b, c))
    skip if sigma < 0;  alpha = min(0.999, opacity · exp(-sigma));  skip if alpha < 1/255
    T_next = T (1 - alpha);  stop (without this Gaussian) if T_next <= 1e-4
    color += alpha T c;  T = T_next;  last_id = this intersection

render_alphas = 1 - T, render_colors = color + T · background. Masked-out tiles are empty.

Vectorised: tiles are processed in buckets padded to the bucket's longest list; the
sequential stop rule becomes a mask because T only decreases along the list, so the
contributing Gaussians are exactly the active ones with inclusive T > 1e-4.
Both backward schemes are autograd's gradient of this function.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from ._vjp import leaf, vjp

BUCKET_ELEMENTS = 1 << 22  # tiles × pixels × Gaussians evaluated at once


def _tile_lists(isect_offsets: Tensor, n_isects: int, masks: Tensor | None):
    """Start and length of each tile's list, flattened over [I, TH, TW]."""
    starts = isect_offsets.reshape(-1).to(torch.int64)
    ends = torch.cat([starts[1:], starts.new_tensor([n_isects])])
    counts = (ends - starts).clamp_min(0)
    if masks is not None:
        counts = counts * masks.reshape(-1)
    return starts, counts


def _buckets(counts: Tensor, P: int):
    """Yields the busy tiles in buckets of similar list length whose padded size
    (tiles × P × longest list) stays within BUCKET_ELEMENTS (at least one tile each)."""
    order = torch.argsort(counts, stable=True)
    busy = order[counts[order] > 0]
    kmax = counts[busy]
    pos, nb = 0, busy.numel()
    while pos < nb:
        # Sorted ascending, so the padded size of "tiles pos..e" grows with e.
        sizes = torch.arange(1, nb - pos + 1, device=counts.device) * P * kmax[pos:]
        end = pos + max(1, int((sizes <= BUCKET_ELEMENTS).sum()))
        yield busy[pos:end], int(kmax[end - 1])
        pos = end


def _gather(tiles, K, starts, counts, flatten_ids, geometry):
    """Gaussian ids [t, K] of each tile's list (padding: id 0, ``in_list`` False), the
    intersection indices [t, K], and the pixel centres [t, P, 2] and flat pixel ids [t, P]
    (-1 outside the image)."""
    I, TH, TW, width, height, tile_size = geometry
    dev = tiles.device
    k = torch.arange(K, device=dev)
    in_list = k[None, :] < counts[tiles][:, None]
    isect = (starts[tiles][:, None] + k[None, :]).clamp(max=max(flatten_ids.numel() - 1, 0))
    gid = torch.where(in_list, flatten_ids[isect].to(torch.int64), 0)
    local = torch.arange(tile_size * tile_size, device=dev)
    image = tiles // (TH * TW)
    ty, tx = (tiles % (TH * TW)) // TW, tiles % TW
    px = tx[:, None] * tile_size + (local % tile_size)[None, :]
    py = ty[:, None] * tile_size + (local // tile_size)[None, :]
    inside = (px < width) & (py < height)
    flat = torch.where(inside, (image[:, None] * height + py) * width + px, -1)
    return gid, in_list, isect, torch.stack([px, py], -1), flat, image


def _composite_bucket(mean, conic, color, opac, in_list, pixels):
    """The contract for one bucket of tiles. mean [t,K,2], conic [t,K,3], color [t,K,D],
    opac [t,K], in_list [t,K], pixels [t,P,2] (integer x, y).

    Returns accumulated colour [t,P,D], transmittance [t,P], contributing mask [t,P,K] and
    the pair deltas [t,P,K,2] (mean - pixel centre).
    """
    centre = pixels.to(mean.dtype) + PIXEL_CENTER
    delta = mean[:, None, :, :] - centre[:, :, None, :]
    a, b, c = conic.unbind(-1)
    dx, dy = delta[..., 0], delta[..., 1]
    sigma = 0.5 * (a[:, None] * dx * dx + c[:, None] * dy * dy) + b[:, None] * dx * dy
    ok = in_list[:, None, :] & (sigma >= 0)
    sigma = torch.where(ok, sigma, torch.zeros_like(sigma))
    alpha = torch.clamp_max(opac[:, None, :] * torch.exp(-sigma), ALPHA_CLAMP)
    accum, trans, contrib = _blend(alpha, ok, color)
    return accum, trans, contrib, delta


def _blend(alpha, ok, color):
    """Front to back over each pixel's list: alpha [t,P,K] (clamped at ALPHA_CLAMP), ok [t,P,K]
    (the pairs that may contribute), color [t,K,D]. Pairs below ALPHA_SKIP are skipped, and a
    pixel stops before the pair that would take its T to TRANSMITTANCE_STOP or below.

    Returns accumulated colour [t,P,D], transmittance [t,P] and contributing mask [t,P,K].
    """
    active = ok & (alpha >= ALPHA_SKIP)
    alpha = torch.where(active, alpha, torch.zeros_like(alpha))
    one_minus = 1.0 - alpha
    t_incl = torch.cumprod(one_minus, dim=-1)
    t_excl = torch.cat([torch.ones_like(t_incl[..., :1]), t_incl[..., :-1]], dim=-1)
    contrib = active & (t_incl > TRANSMITTANCE_STOP)
    weight = torch.where(contrib, alpha * t_excl, torch.zeros_like(alpha))
    accum = torch.einsum("tpk,tkd->tpd", weight, color)
    trans = torch.prod(torch.where(contrib, one_minus, torch.ones_like(alpha)), -1)
    return accum, trans, contrib


class Canvas:
    """The I images of a render as rows of pixels, written bucket by bucket of tiles: the
    accumulated colour [I*H*W, D], the transmittance [I*H*W] and the last contributing
    intersection [I*H*W] (-1: none). Both rasterizers of the reference fill one."""

    def __init__(self, n_images: int, height: int, width: int, channels: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        n_pix = n_images * height * width
        self.shape = (n_images, height, width)
        self.accum = torch.zeros((n_pix, channels), dtype=dtype, device=device)
        self.trans = torch.ones((n_pix,), dtype=dtype, device=device)
        self.last_ids = torch.full((n_pix,), -1, dtype=torch.int64, device=device)

    def put(self, flat: Tensor, acc_b: Tensor, trans_b: Tensor, contrib: Tensor,
            isect: Tensor) -> None:
        """Write a bucket's pixels: flat [t,P] pixel rows (-1 outside the image), acc_b
        [t,P,D], trans_b [t,P], contrib [t,P,K] and isect [t,K] (the lists' indices)."""
        last = torch.where(contrib, isect[:, None, :], -1).amax(dim=-1)
        keep = flat >= 0
        pix = flat[keep]
        self.accum = self.accum.index_put((pix,), acc_b[keep])
        self.trans = self.trans.index_put((pix,), trans_b[keep])
        self.last_ids[pix] = last[keep]

    def finish(self, backgrounds: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """render_colors [I,H,W,D] (on ``backgrounds`` [I,D]), render_alphas [I,H,W,1],
        last_ids [I,H,W] int32."""
        render_colors = self.accum.reshape(*self.shape, -1)
        trans = self.trans.reshape(*self.shape, 1)
        if backgrounds is not None:
            render_colors = render_colors + trans * backgrounds[:, None, None, :]
        return render_colors, 1.0 - trans, self.last_ids.reshape(self.shape).to(torch.int32)


def composite(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
              isect_offsets, flatten_ids):
    """The definition. Shapes: means2d [G,2], conics [G,3], colors [G,D], opacities [G],
    backgrounds [I,D] or None, masks [I,TH,TW] or None, isect_offsets [I,TH,TW],
    flatten_ids [n].

    Returns render_colors [I,H,W,D], render_alphas [I,H,W,1], last_ids [I,H,W] int32.
    """
    I, TH, TW = isect_offsets.shape
    D = colors.shape[-1]
    dev, dt = means2d.device, means2d.dtype
    starts, counts = _tile_lists(isect_offsets, flatten_ids.shape[0], masks)
    geometry = (I, TH, TW, width, height, tile_size)
    canvas = Canvas(I, height, width, D, dt, dev)
    for tiles, K in _buckets(counts, tile_size * tile_size):
        gid, in_list, isect, pixels, flat, _ = _gather(tiles, K, starts, counts, flatten_ids,
                                                       geometry)
        acc_b, trans_b, contrib, _ = _composite_bucket(
            means2d[gid], conics[gid], colors[gid], opacities[gid], in_list, pixels)
        canvas.put(flat, acc_b, trans_b, contrib, isect)
    return canvas.finish(backgrounds)


def forward(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
            isect_offsets, flatten_ids, scheme):
    """render_colors, render_alphas, last_ids and no extra tensor for the backward (which
    recomputes)."""
    del scheme
    with torch.no_grad():
        return *composite(means2d, conics, colors, opacities, backgrounds, masks, width, height,
                          tile_size, isect_offsets, flatten_ids), None


def backward(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
             isect_offsets, flatten_ids, render_colors, render_alphas, last_ids,
             v_render_colors, v_render_alphas, absgrad, scheme, extra):
    """Both schemes are autograd's gradient of :func:`composite`, taken bucket by bucket
    (buckets own disjoint pixels, so their vector-Jacobian products simply add up), which
    keeps memory at one bucket's graph."""
    del render_colors, render_alphas, last_ids, scheme, extra
    I, TH, TW = isect_offsets.shape
    D = colors.shape[-1]
    starts, counts = _tile_lists(isect_offsets, flatten_ids.shape[0], masks)
    geometry = (I, TH, TW, width, height, tile_size)
    v_col = v_render_colors.reshape(-1, D)
    v_alpha = v_render_alphas.reshape(-1)
    v_means2d, v_conics = torch.zeros_like(means2d), torch.zeros_like(conics)
    v_colors, v_opacities = torch.zeros_like(colors), torch.zeros_like(opacities)
    abs_means2d = torch.zeros_like(means2d) if absgrad else None
    # With a background, d color / d background = T per pixel; T = 1 where no tile list ran.
    if backgrounds is not None:
        trans_all = torch.ones(I * height * width, dtype=means2d.dtype, device=means2d.device)
    for tiles, K in _buckets(counts, tile_size * tile_size):
        gid, in_list, _, pixels, flat, image = _gather(tiles, K, starts, counts, flatten_ids,
                                                       geometry)
        keep = flat >= 0
        safe = flat.clamp_min(0)
        g_col = torch.where(keep[..., None], v_col[safe], 0.0)  # [t, P, D]
        g_alpha = torch.where(keep, v_alpha[safe], 0.0)  # [t, P]
        with torch.enable_grad():
            leaves = [leaf(x[gid]) for x in (means2d, conics, colors, opacities)]
            acc_b, trans_b, _, delta = _composite_bucket(*leaves, in_list, pixels)
            g_trans = -g_alpha
            if backgrounds is not None:
                g_trans = g_trans + (g_col * backgrounds[image][:, None, :]).sum(-1)
            wanted = leaves + ([delta] if absgrad else [])
            grads = vjp([acc_b, trans_b], [g_col, g_trans], wanted)
        sel = in_list.reshape(-1)
        ids = gid.reshape(-1)[sel]
        for full, g in zip((v_means2d, v_conics, v_colors, v_opacities), grads[:4], strict=True):
            full.index_add_(0, ids, g.reshape(-1, *full.shape[1:])[sel])
        if absgrad:
            per_pair = grads[4].abs().sum(dim=1)  # [t, K, 2] summed over the tile's pixels
            abs_means2d.index_add_(0, ids, per_pair.reshape(-1, 2)[sel])
        if backgrounds is not None:
            trans_all[flat[keep]] = trans_b.detach()[keep]
    v_backgrounds = None
    if backgrounds is not None:
        per_pixel = v_col * trans_all[:, None]
        v_backgrounds = per_pixel.reshape(I, -1, D).sum(dim=1)
    return v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, abs_means2d
