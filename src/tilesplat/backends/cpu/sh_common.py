"""Per-row helpers of the CPU spherical-harmonics kernels (``sh``, ``sh3``): the direction's
normalisation, which rows are evaluated, and ``rasterization``'s max(colour + 0.5, 0)."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..shared.typed import like


@njit(cache=True, error_model="numpy")
def unit(x, y, z):
    """(x, y, z) / max(|(x, y, z)|, 1e-12)."""
    inv = like(x, 1.0) / max(np.sqrt(x * x + y * y + z * z), like(x, 1e-12))
    return x * inv, y * inv, z * inv


@njit(inline="always", error_model="numpy")
def visible(masks, m):
    """Row m is evaluated: masks [M, 1] bool, or [M, 2] radii (both > 0), or [0, 1] (all)."""
    if masks.shape[0] == 0:
        return True
    for j in range(masks.shape[1]):
        if not masks[m, j] > 0:
            return False
    return True


@njit(inline="always", error_model="numpy")
def rgb_of(x, zero):
    """max(x + 0.5, 0) as torch.clamp_min(x + 0.5, 0) (NaN stays NaN)."""
    y = x + like(x, 0.5)
    return zero if y < zero else y


@njit(inline="always", error_model="numpy")
def rgb_grad(x, v, zero):
    """The gradient through :func:`rgb_of` at x: v where x + 0.5 >= 0, else +0 (torch's)."""
    return v if x + like(x, 0.5) >= zero else zero


@njit(inline="always", error_model="numpy")
def store_color(colors, m, r, g, b, rgb, zero):
    """colors[m] = (r, g, b), through :func:`rgb_of` where ``rgb``."""
    if rgb:
        r, g, b = rgb_of(r, zero), rgb_of(g, zero), rgb_of(b, zero)
    colors[m, 0] = r
    colors[m, 1] = g
    colors[m, 2] = b
