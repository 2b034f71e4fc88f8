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


def composite(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
              isect_offsets, flatten_ids, pair_deltas: list | None = None):
    """The definition. Shapes: means2d [G,2], conics [G,3], colors [G,D], opacities [G],
    backgrounds [I,D] or None, masks [I,TH,TW] or None, isect_offsets [I,TH,TW],
    flatten_ids [n].

    Returns render_colors [I,H,W,D], render_alphas [I,H,W,1], last_ids [I,H,W] int32.
    If ``pair_deltas`` is a list, (deltas [t,P,K,2], gaussian ids [t,K]) of every bucket are
    appended to it (used for absgrad).
    """
    I, TH, TW = isect_offsets.shape
    D = colors.shape[-1]
    P = tile_size * tile_size
    dev, dt = means2d.device, means2d.dtype
    starts, counts = _tile_lists(isect_offsets, flatten_ids.shape[0], masks)

    # Pixel (x, y) of every tile-local index, and its flat index in [I*H*W] (-1 outside).
    local = torch.arange(P, device=dev)
    lx, ly = local % tile_size, local // tile_size

    order = torch.argsort(counts, stable=True)
    counts_sorted = counts[order]
    busy = order[counts_sorted > 0]
    kmax_sorted = counts_sorted[counts_sorted > 0]

    acc_parts, trans_parts, last_parts, pix_parts = [], [], [], []
    pos, nb = 0, busy.numel()
    while pos < nb:
        # Lists are sorted ascending, so the padded size of "tiles pos..e" grows with e:
        # take the longest run that fits the budget (at least one tile).
        sizes = torch.arange(1, nb - pos + 1, device=dev) * P * kmax_sorted[pos:]
        end = pos + max(1, int((sizes <= BUCKET_ELEMENTS).sum()))
        K = int(kmax_sorted[end - 1])
        tiles = busy[pos:end]
        pos = end

        image = tiles // (TH * TW)
        ty, tx = (tiles % (TH * TW)) // TW, tiles % TW
        px = tx[:, None] * tile_size + lx[None, :]  # [t, P]
        py = ty[:, None] * tile_size + ly[None, :]
        centre = torch.stack([px, py], -1).to(dt) + PIXEL_CENTER  # [t, P, 2]

        k = torch.arange(K, device=dev)
        in_list = k[None, :] < counts[tiles][:, None]  # [t, K]
        isect = (starts[tiles][:, None] + k[None, :]).clamp(max=max(flatten_ids.numel() - 1, 0))
        gid = torch.where(in_list, flatten_ids[isect].to(torch.int64), 0)  # [t, K]

        delta = means2d[gid][:, None, :, :] - centre[:, :, None, :]  # [t, P, K, 2]
        if pair_deltas is not None:
            pair_deltas.append((delta, gid, in_list))
        a, b, c = conics[gid].unbind(-1)  # [t, K]
        dx, dy = delta[..., 0], delta[..., 1]
        sigma = 0.5 * (a[:, None] * dx * dx + c[:, None] * dy * dy) + b[:, None] * dx * dy
        ok = in_list[:, None, :] & (sigma >= 0)
        sigma = torch.where(ok, sigma, torch.zeros_like(sigma))
        alpha = torch.clamp_max(opacities[gid][:, None, :] * torch.exp(-sigma), ALPHA_CLAMP)
        active = ok & (alpha >= ALPHA_SKIP)
        alpha = torch.where(active, alpha, torch.zeros_like(alpha))  # [t, P, K]

        one_minus = 1.0 - alpha
        t_incl = torch.cumprod(one_minus, dim=-1)
        t_excl = torch.cat([torch.ones_like(t_incl[..., :1]), t_incl[..., :-1]], dim=-1)
        contrib = active & (t_incl > TRANSMITTANCE_STOP)
        weight = torch.where(contrib, alpha * t_excl, torch.zeros_like(alpha))
        acc_parts.append(torch.einsum("tpk,tkd->tpd", weight, colors[gid]))
        trans_parts.append(torch.prod(torch.where(contrib, one_minus, torch.ones_like(alpha)), -1))
        last = torch.where(contrib, isect[:, None, :], torch.full_like(isect[:, None, :], -1))
        last_parts.append(last.amax(dim=-1))

        inside = (px < width) & (py < height)
        flat = (image[:, None] * height + py) * width + px
        pix_parts.append(torch.where(inside, flat, torch.full_like(flat, -1)))

    n_pix = I * height * width
    accum = torch.zeros((n_pix, D), dtype=dt, device=dev)
    trans = torch.ones((n_pix,), dtype=dt, device=dev)
    last_ids = torch.full((n_pix,), -1, dtype=torch.int64, device=dev)
    if pix_parts:
        pix = torch.cat([p.reshape(-1) for p in pix_parts])
        keep = pix >= 0
        pix = pix[keep]
        accum = accum.index_put((pix,), torch.cat([x.reshape(-1, D) for x in acc_parts])[keep])
        trans = trans.index_put((pix,), torch.cat([x.reshape(-1) for x in trans_parts])[keep])
        last_ids = last_ids.index_put((pix,), torch.cat([x.reshape(-1) for x in last_parts])[keep])

    render_colors = accum.reshape(I, height, width, D)
    trans = trans.reshape(I, height, width, 1)
    if backgrounds is not None:
        render_colors = render_colors + trans * backgrounds[:, None, None, :]
    render_alphas = 1.0 - trans
    return render_colors, render_alphas, last_ids.reshape(I, height, width).to(torch.int32)


def forward(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
            isect_offsets, flatten_ids):
    return composite(means2d, conics, colors, opacities, backgrounds, masks, width, height,
                     tile_size, isect_offsets, flatten_ids)


def backward(means2d, conics, colors, opacities, backgrounds, masks, width, height, tile_size,
             isect_offsets, flatten_ids, render_colors, render_alphas, last_ids,
             v_render_colors, v_render_alphas, absgrad, scheme):
    """Both schemes are autograd's gradient of :func:`composite` (recomputed here)."""
    del render_colors, render_alphas, last_ids, scheme
    deltas: list | None = [] if absgrad else None
    with torch.enable_grad():
        leaves = [leaf(means2d), leaf(conics), leaf(colors), leaf(opacities), leaf(backgrounds)]
        out_c, out_a, _ = composite(*leaves, masks, width, height, tile_size, isect_offsets,
                                    flatten_ids, pair_deltas=deltas)
        grads = vjp([out_c, out_a], [v_render_colors, v_render_alphas],
                    leaves + [d for d, _, _ in (deltas or [])])
    v_means2d, v_conics, v_colors, v_opacities, v_backgrounds = grads[:5]
    abs_means2d = None
    if absgrad:
        abs_means2d = torch.zeros_like(means2d)
        for (_, gid, in_list), v_delta in zip(deltas, grads[5:], strict=True):
            per_pair = v_delta.abs().sum(dim=1)  # [t, K, 2]: summed over the tile's pixels
            sel = in_list.reshape(-1)
            abs_means2d.index_add_(0, gid.reshape(-1)[sel], per_pair.reshape(-1, 2)[sel])
    return v_means2d, v_conics, v_colors, v_opacities, v_backgrounds, abs_means2d
