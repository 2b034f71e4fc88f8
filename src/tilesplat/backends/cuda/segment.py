"""The fixed-order reduction of the deterministic backward (the ``deterministic`` option).

With the option on, the rasterization backward writes each part of a splat's gradient to a
row of its own instead of adding it to the Gaussian's row with a float atomic: one row per
(intersection, warp) for ``per_pixel``, one per intersection for ``per_splat`` (no two
threads write one row, so the kernels' adds are plain stores into zeros). This module sums
those rows into the Gaussians' gradients in an order that depends on the inputs only:

1. the W warp rows of each intersection, by :func:`torch.sum` (a fixed reduction tree);
2. the intersections of each Gaussian, in the order of their index (the tile, then the
   depth), by :func:`segment_sum_kernel`: one thread per (Gaussian, component) walks its
   segment of the intersections stably sorted by Gaussian.

The sort (``torch.sort(stable=True)``) and the counts (``torch.bincount``, integer atomics)
are deterministic. The sums differ in their rounding from the atomic ones (another order),
not in value.
"""

from __future__ import annotations

from functools import cache

import torch
from numba import cuda

from .runtime import cdiv, empty, float_type, launch

THREADS = 256


def make_segment_sum(ft: type):
    """Kernel body: out[g, k] = sum of rows[r, k] for r in starts[g] .. starts[g + 1] - 1, in
    order (rows [n, K] sorted by Gaussian, starts [G + 1] int64, out [G, K])."""
    zero = ft(0.0)

    def segment_sum_kernel(rows, starts, out):
        i = cuda.grid(1)
        n_k = out.shape[1]
        if i >= out.shape[0] * n_k:
            return
        g = i // n_k
        k = i % n_k
        acc = zero
        for r in range(starts[g], starts[g + 1]):
            acc += rows[r, k]
        out[g, k] = acc

    return segment_sum_kernel


@cache
def _segment_kernel(ft: type):
    return cuda.jit(make_segment_sum(ft))


def segment_sum(rows: torch.Tensor, ids: torch.Tensor, n_rows: int) -> torch.Tensor:
    """The sum of the ``rows`` [n, K] of each id, in the rows' order: [n_rows, K].

    ``ids`` [n] int: the output row of each input row (in ``0 .. n_rows - 1``).
    """
    n, k = rows.shape
    device = rows.device
    out = empty((n_rows, k), rows.dtype, device)
    if n_rows * k == 0:
        return out
    ids = ids.to(torch.int64)
    _, order = torch.sort(ids, stable=True)
    starts = torch.zeros(n_rows + 1, dtype=torch.int64, device=device)
    if n > 0:
        starts[1:] = torch.cumsum(torch.bincount(ids, minlength=n_rows), 0)
    ordered = rows[order].contiguous() if n > 0 else rows.new_zeros((1, k))
    launch(_segment_kernel(float_type(rows.dtype)), cdiv(n_rows * k, THREADS), THREADS,
           device, ordered, starts, out)
    return out


def reduce_parts(
    parts: list[torch.Tensor], warps: int, flatten_ids: torch.Tensor, n_gaussians: int
) -> list[torch.Tensor]:
    """The Gaussians' gradients from the backward's part rows.

    Args:
        parts: tensors [n * warps, k_i] (or [n * warps]): the rows of intersection ``i``
            are ``i * warps .. i * warps + warps - 1``.
        warps: W, the rows per intersection.
        flatten_ids: [n] the Gaussian of each intersection.
        n_gaussians: G.

    Returns:
        one tensor [G, k_i] (or [G]) per part, in order.
    """
    n = flatten_ids.shape[0]
    widths = [1 if p.dim() == 1 else p.shape[1] for p in parts]
    cols = [p.reshape(n, warps, w) for p, w in zip(parts, widths, strict=True)]
    rows = torch.cat(cols, dim=2).sum(dim=1)  # [n, K]: the warps in a fixed tree
    total = segment_sum(rows, flatten_ids, n_gaussians)
    out, at = [], 0
    for p, w in zip(parts, widths, strict=True):
        piece = total[:, at:at + w]
        out.append(piece.reshape(n_gaussians) if p.dim() == 1 else piece.contiguous())
        at += w
    return out
