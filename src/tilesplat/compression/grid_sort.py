"""A self-organising sort of splats onto a square grid, for :class:`.PngCompression`.

Each attribute of the splats becomes an image with one splat per pixel; PNG's filters and
deflate shrink an image whose neighbouring pixels are alike. gsplat 1.5.3 places the splats
with PLAS (parallel linear assignment sorting, Morgenstern et al., "Compact 3D Scene
Representation via Self-Organizing Gaussian Grids"), a CUDA package not on PyPI. This is a
simpler method of the same idea, written here, vectorised torch on any device:

1. Start from locality: the splats in the Morton order of their positions, laid along the
   2D Morton curve of the grid's cells, so that splats close in space land close on the
   grid.
2. Improve by swaps towards a smoothed grid (PLAS's target): for a radius r, the target is
   the grid blurred by a (2r+1)² box (cumulative sums: the cost does not grow with r).
   Cells are paired at a distance d along rows, then along columns (disjoint pairs, the
   pairing shifted between sweeps), and a pair swaps when that brings both closer to the
   target: with features a, b and targets ta, tb, the swap gains
   ``|a-ta|² + |b-tb|² - |a-tb|² - |b-ta|² = 2 (a-b)·(tb-ta) > 0``. Distances d run over the
   powers of two up to r, so a splat can travel far while the radius is large; the radius
   shrinks geometrically to 1.

The features are the caller's columns scaled to [0, 1] each (what the 8- and 16-bit images
quantise), then weighted by how coherent the start made them (:func:`_coherence`): a column
no order can smooth (random rotations, say) would otherwise pull the swaps away from the
columns that can be smoothed. Measured on the garden model (docs/formats.md): the swaps
shrink the colour and scale images but loosen the blocks of equal high bytes the Morton
start gives the centres, so the whole directory ends about where the start alone is.

The result is deterministic, bounded in work (``SWEEPS`` sweeps per radius, about
``2 log2(side)`` radii, each sweep ``O(side² · D · log2 r)``), and a permutation whatever
happens: only swaps of whole cells.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

SWEEPS = 3  # sweeps (blur + pairs along both axes at every distance) per radius
FIRST_RADIUS_FRACTION = 1 / 8  # the first radius, of the grid's side
RADIUS_SHRINK = 0.6


def _spread_bits(v: Tensor, n_dims: int, bits: int) -> Tensor:
    """Bits of ``v`` [N] (int64) spread ``n_dims`` apart (bit i goes to bit i * n_dims)."""
    out = torch.zeros_like(v)
    for i in range(bits):
        out |= ((v >> i) & 1) << (i * n_dims)
    return out


def morton_order(points: Tensor) -> Tensor:
    """Indices [N] int64 that sort ``points`` [N, K] (K = 2 or 3) along the Morton curve of
    their bounding box (``64 // K - 1`` bits per axis, at most 20)."""
    n_dims = points.shape[1]
    bits = min(20, 63 // n_dims)
    p = points.double()
    lo = p.min(dim=0).values
    span = p.max(dim=0).values - lo
    span = torch.where(span > 0, span, torch.ones_like(span))
    cells = ((p - lo) / span * ((1 << bits) - 1)).round().long()
    code = torch.zeros(len(p), dtype=torch.int64, device=p.device)
    for k in range(n_dims):
        code |= _spread_bits(cells[:, k], n_dims, bits) << k
    return torch.argsort(code, stable=True)


def _box_blur(grid: Tensor, r: int) -> Tensor:
    """Mean over the (2r+1)² box around each cell, clipped at the edges. [S, S, D]"""
    out = grid
    for dim in (0, 1):
        s = out.shape[dim]
        c = torch.cumsum(out, dim=dim)
        c = torch.cat([torch.zeros_like(c.narrow(dim, 0, 1)), c], dim=dim)  # [s + 1]
        idx = torch.arange(s, device=grid.device)
        hi = (idx + r + 1).clamp(max=s)
        lo = (idx - r).clamp(min=0)
        shape = [1, 1, 1]
        shape[dim] = s
        count = (hi - lo).to(grid.dtype).reshape(shape)
        out = (c.index_select(dim, hi) - c.index_select(dim, lo)) / count
    return out


def _coherence(grid: Tensor) -> Tensor:
    """Weights [D] in [0, 1] of the columns of ``grid`` [S, S, D]: 1 - (mean difference of
    grid neighbours) / (mean difference of cells half the grid apart, ~unrelated ones). A
    column that the start order made smooth weighs ~1; one no order can make smooth (random
    rotations, say) weighs ~0, so that it does not pull the swaps away from the others."""
    near = (grid[1:] - grid[:-1]).abs().mean(dim=(0, 1)) + (
        grid[:, 1:] - grid[:, :-1]).abs().mean(dim=(0, 1))
    half = grid.shape[0] // 2
    if half == 0:
        return torch.ones(grid.shape[-1], dtype=grid.dtype, device=grid.device)
    far = (grid[half:] - grid[:-half]).abs().mean(dim=(0, 1)) + (
        grid[:, half:] - grid[:, :-half]).abs().mean(dim=(0, 1))
    return (1 - near / far.clamp(min=1e-12)).clamp(0, 1)


def _swap_pass(grid: Tensor, ids: Tensor, target: Tensor, d: int, offset: int) -> int:
    """Pairs (cell j, cell j + d) along the columns of ``grid`` [S, S, D] (a view: the rows
    are the caller's other axis), disjoint; swaps the pairs (and their ``ids`` [S, S]) that
    move both nearer to ``target``. Returns the number of swaps."""
    s = grid.shape[1]
    j = torch.arange(s, device=grid.device)
    shifted = j - offset
    first = (shifted >= 0) & ((shifted // d) % 2 == 0) & (j + d < s)
    a = j[first]
    if a.numel() == 0:
        return 0
    b = a + d
    ga, gb = grid[:, a], grid[:, b]
    gain = ((ga - gb) * (target[:, b] - target[:, a])).sum(-1)  # [S, pairs]
    swap = gain > 0
    n = int(swap.sum())
    if n:
        m = swap[..., None]
        grid[:, a], grid[:, b] = torch.where(m, gb, ga), torch.where(m, ga, gb)
        ia, ib = ids[:, a], ids[:, b]
        ids[:, a], ids[:, b] = torch.where(swap, ib, ia), torch.where(swap, ia, ib)
    return n


def grid_sort(features: Tensor, positions: Tensor | None = None,
              sweeps: int | None = None) -> Tensor:
    """The order [S²] int64 that lays the splats out on an S × S grid, row by row.

    Args:
        features: what neighbouring cells should share, [S², D] (any float; each column is
            scaled to [0, 1] here).
        positions: what the start order follows, [S², 3] (default: the first three features).
        sweeps: swap sweeps per radius (0: the Morton start only; default ``SWEEPS``).

    Returns:
        order with ``features[order].reshape(S, S, D)`` the sorted grid.
    """
    n = features.shape[0]
    side = math.isqrt(n)
    if side * side != n:
        raise ValueError(f"grid_sort needs a square number of splats, got {n}")
    x = features.detach().reshape(n, -1).float()
    lo = x.min(dim=0).values
    span = x.max(dim=0).values - lo
    x = (x - lo) / torch.where(span > 0, span, torch.ones_like(span))
    start = morton_order(x[:, :3] if positions is None else positions.detach())
    r_idx, c_idx = torch.meshgrid(torch.arange(side, device=x.device),
                                  torch.arange(side, device=x.device), indexing="ij")
    cells = morton_order(torch.stack([r_idx.reshape(-1), c_idx.reshape(-1)], dim=1))
    ids = torch.empty(n, dtype=torch.int64, device=x.device)
    ids[cells] = start  # the i-th splat along the 3D curve in the i-th cell along the 2D one
    ids = ids.reshape(side, side)
    grid = x[ids]  # [S, S, D]
    grid = grid * _coherence(grid)
    sweeps = SWEEPS if sweeps is None else sweeps
    radius = max(1, int(side * FIRST_RADIUS_FRACTION))
    sweep = 0
    while sweeps > 0:
        distances = [1 << k for k in range(int(math.log2(radius)) + 1)]
        for _ in range(sweeps):
            target = _box_blur(grid, radius)
            for d in reversed(distances):
                offset = (sweep % 2) * max(1, d // 2)
                _swap_pass(grid, ids, target, d, offset)
                _swap_pass(grid.transpose(0, 1), ids.transpose(0, 1),
                           target.transpose(0, 1), d, offset)
            sweep += 1
        if radius == 1:
            break
        radius = max(1, int(radius * RADIUS_SHRINK))
    return ids.reshape(-1)
