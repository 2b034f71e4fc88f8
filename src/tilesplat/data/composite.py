"""An image with alpha composited on its background, in one pass.

A frame whose image has an alpha channel (Blender's and NeRF-synthetic captures) trains on
``rgb * alpha + background * (1 - alpha)``, made from the cached pixels at every access
(``image_cache``). NumPy forms it in six passes over strided views of the [H, W, 4] array,
with a temporary for each: 0.7 ms for a 200x200 image and 31 ms for 1297x840, 19 and 26
times the cost of the same image without alpha. :func:`composite` makes the same float32 values
(the same operations in the same order: ``x / 255`` for uint8, then ``x * a``, ``1 - a``,
``bg * (1 - a)`` and their sum, each rounded to float32, no fused multiply-add) in one
compiled pass. Compiled at its first call, not at import.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from ..backends.vector_width import prefer_wide_vectors

# before this module's first @njit: Numba makes its one target machine at the first compile,
# and a dataset with alpha is loaded before the CPU backend (which asks the same) is imported
prefer_wide_vectors()


@njit(nogil=True, cache=True)
def _composite_kernel(rgba, divide, bg, rgb, alpha):
    """rgb [H, W, 3] and alpha [H, W, 1] float32 from rgba [H, W, 4] (uint8 divided by 255
    where ``divide``, else float32 as it is) on the background bg [3] float32."""
    one = np.float32(1.0)
    d = np.float32(255.0)
    for i in range(rgba.shape[0]):
        for j in range(rgba.shape[1]):
            a = np.float32(rgba[i, j, 3])
            if divide:
                a = a / d
            alpha[i, j, 0] = a
            rest = one - a
            for c in range(3):
                x = np.float32(rgba[i, j, c])
                if divide:
                    x = x / d
                rgb[i, j, c] = x * a + bg[c] * rest


def composite(rgba: np.ndarray, background: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """(rgb [H, W, 3], alpha [H, W, 1]) float32, new arrays: ``rgba`` [H, W, 4] (uint8, taken
    as value / 255, or float32 in [0, 1]) composited on ``background`` (RGB), bit for bit
    ``rgb * alpha + bg * (1 - alpha)`` in float32 of the float image."""
    if rgba.ndim != 3 or rgba.shape[2] != 4:
        raise ValueError(f"expected an image [H, W, 4], got shape {tuple(rgba.shape)}")
    if rgba.dtype not in (np.uint8, np.float32):
        raise ValueError(f"expected a uint8 or float32 image, got {rgba.dtype}")
    bg = np.asarray(background, dtype=np.float32).reshape(3)
    h, w = rgba.shape[:2]
    rgb = np.empty((h, w, 3), np.float32)
    alpha = np.empty((h, w, 1), np.float32)
    _composite_kernel(rgba, rgba.dtype == np.uint8, bg, rgb, alpha)
    return rgb, alpha
