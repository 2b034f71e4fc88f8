"""CPU kernel: the float64 sum of squared differences of two images, over the pixels a mask
keeps (the training PSNR of every step, and the evaluation's).

torch forms it in five passes (two float64 copies, their difference, its square, the sum):
~160 us of a training step of a 200x200 image, 1-2 % of the step. Here one pass: each work
item sums ``BLOCK_PIXELS`` pixels in float64, in pixel and channel order, and the items' sums
are added in item order, so the result does not depend on the thread count. Each difference
is that of the two values in float64 (exact for float32 images), as torch's are; the sum
differs from torch's in its last bits (another order of the same float64 additions).
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit

from ._common import parallel_for, view

BLOCK_PIXELS = 1 << 16  # pixels of one work item


@njit(nogil=True, cache=True, error_model="numpy")
def sum_kernel(first, step, render, target, keep, sums):  # pragma: no cover - compiled
    """sums[item] = the float64 sum over the pixels of item (``BLOCK_PIXELS`` of them) of
    (render - target)² over every channel, for the pixels ``keep`` keeps (every pixel when
    keep is empty). render, target: [P, C]; keep: [P] or [0] bool; sums: [items]."""
    n, c = render.shape
    masked = keep.shape[0] > 0
    for item in range(first, sums.shape[0], step):
        lo = item * BLOCK_PIXELS
        hi = min(lo + BLOCK_PIXELS, n)
        s = 0.0
        for i in range(lo, hi):
            if masked and not keep[i]:
                continue  # skipped, not multiplied: a NaN under a hidden pixel stays out
            for k in range(c):
                d = np.float64(render[i, k]) - np.float64(target[i, k])
                s += d * d
        sums[item] = s


def squared_error_sum(render: torch.Tensor, target: torch.Tensor,
                      keep: torch.Tensor | None) -> float:
    """The float64 sum of (render - target)² over the pixels ``keep`` keeps (all for None).

    Args:
        render, target: [P, C] float32 or float64 CPU tensors of one dtype.
        keep: [P] bool, or None.
    """
    n = render.shape[0]
    items = max(1, -(-n // BLOCK_PIXELS))
    sums = np.zeros(items, np.float64)
    no_mask = np.zeros(0, np.bool_)
    parallel_for(sum_kernel, items, view(render.contiguous()), view(target.contiguous()),
                 no_mask if keep is None else view(keep.contiguous()), sums)
    total = 0.0
    for s in sums:  # in item order
        total += float(s)
    return total
