"""How many pixel-splat pairs a rasterization evaluates, counted exactly from its tile lists.

Three counts, all over every image of a batch:

- ``bound``: the sum over tiles of (pixels of the tile inside the image) × (intersections of
  the tile): what a rasterizer without early stopping evaluates.
- ``forward``: exact, per the compositing contract: each pixel evaluates its tile's list front
  to front up to and including the pair whose transmittance would fall to
  ``TRANSMITTANCE_STOP`` (or to the end of the list).
- ``backward``: exact: each pixel needs the pairs from the start of its tile's list up to and
  including its last contributing one (``last_ids``), none when nothing contributed.

The counter replays the forward with the polynomial exp of the native backends, so a pair within
~1e-6 of a skip or stop threshold may be classified differently than by a given backend; that
changes the counts by a negligible fraction.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange
from torch import Tensor

from ..constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from .ceiling import exp_neg, gaussian_sigma

_F = np.float32


@njit(cache=True)
def _count_tile(px, py, ids, means2d, conics, opacities, start, live, trans, fwd, last):
    """Replays one tile; px, py: [P] centres; live/trans/fwd/last: [P] pixel state (in/out)."""
    n_pix = px.shape[0]
    n_live = 0
    for i in range(n_pix):
        n_live += live[i]
    for j in range(ids.shape[0]):
        if n_live == 0:
            break
        g = ids[j]
        mx = means2d[g, 0]
        my = means2d[g, 1]
        a = conics[g, 0]
        b = conics[g, 1]
        c = conics[g, 2]
        op = opacities[g]
        stops = 0
        for i in range(n_pix):
            dx = mx - px[i]
            dy = my - py[i]
            sigma = gaussian_sigma(a, b, c, dx, dy)
            alpha = min(_F(ALPHA_CLAMP), op * exp_neg(sigma))
            t = trans[i]
            t_next = t * (_F(1.0) - alpha)
            is_live = live[i] > 0
            ok = (sigma >= _F(0.0)) & (alpha >= _F(ALPHA_SKIP)) & is_live
            stop = ok & (t_next <= _F(TRANSMITTANCE_STOP))
            contrib = ok & ~stop
            fwd[i] += 1 if is_live else 0
            trans[i] = t_next if contrib else t
            last[i] = start + j if contrib else last[i]
            live[i] = 0 if stop else live[i]
            stops += 1 if stop else 0
        n_live -= stops


@njit(parallel=True, cache=True)
def _count(means2d, conics, opacities, offsets, flatten_ids, width, height, tile_size, out):
    """out: [n_tiles_total, 3] int64 per tile: bound, forward, backward."""
    n_img, th, tw = offsets.shape
    n_tiles = n_img * th * tw
    n_isect = flatten_ids.shape[0]
    n_pix = tile_size * tile_size
    flat = offsets.reshape(-1)
    for t in prange(n_tiles):
        ty = (t // tw) % th
        tx = t % tw
        start = flat[t]
        end = flat[t + 1] if t + 1 < n_tiles else n_isect
        px = np.empty(n_pix, _F)
        py = np.empty(n_pix, _F)
        live = np.zeros(n_pix, np.int32)
        trans = np.ones(n_pix, _F)
        fwd = np.zeros(n_pix, np.int64)
        last = np.full(n_pix, -1, np.int64)
        inside = 0
        for i in range(n_pix):
            x = tx * tile_size + i % tile_size
            y = ty * tile_size + i // tile_size
            px[i] = _F(x + PIXEL_CENTER)
            py[i] = _F(y + PIXEL_CENTER)
            if x < width and y < height:
                live[i] = 1
                inside += 1
        _count_tile(px, py, flatten_ids[start:end], means2d, conics, opacities, start,
                    live, trans, fwd, last)
        bwd = 0
        for i in range(n_pix):
            if last[i] >= 0:
                bwd += last[i] - start + 1
        out[t, 0] = inside * (end - start)
        out[t, 1] = fwd.sum()
        out[t, 2] = bwd


def count_pairs(
    means2d: Tensor,  # [..., N, 2] or [G, 2]
    conics: Tensor,  # [..., N, 3] or [G, 3]
    opacities: Tensor,  # [..., N] or [G]
    isect_offsets: Tensor,  # [..., TH, TW] int32
    flatten_ids: Tensor,  # [n] int32
    width: int,
    height: int,
    tile_size: int,
) -> dict[str, int]:
    """Pair counts of one rasterization (see the module docstring).

    Returns:
        dict with int ``bound``, ``forward``, ``backward`` and ``intersections``.
    """

    def arr(t: Tensor, cols: int | None, dtype) -> np.ndarray:
        t = t.detach().to("cpu")
        t = t.reshape(-1, cols) if cols else t.reshape(-1)
        return np.ascontiguousarray(t.numpy(), dtype=dtype)

    th, tw = isect_offsets.shape[-2:]
    offsets = arr(isect_offsets, None, np.int64).reshape(-1, th, tw)
    ids = arr(flatten_ids, None, np.int64)
    out = np.zeros((offsets.size, 3), np.int64)
    with torch.no_grad():
        _count(arr(means2d, 2, _F), arr(conics, 3, _F), arr(opacities, None, _F), offsets, ids,
               int(width), int(height), int(tile_size), out)
    total = out.sum(axis=0)
    return {
        "bound": int(total[0]),
        "forward": int(total[1]),
        "backward": int(total[2]),
        "intersections": int(ids.shape[0]),
    }
