"""A Gaussian's base colour and its degree-0 SH coefficient, one pair of functions for torch
tensors, NumPy arrays and floats alike.

``rgb = sh0 * SH_C0 + 0.5``: the rasterizer's SH colour of band 0 plus the offset the trainer
adds (gsplat's convention, and every splat file's ``f_dc`` / base colour). Each function is one
expression evaluated in its input's type (a Python float scalar takes the array's dtype), so a
float32 tensor stays float32, and a caller computes exactly what its inline formula did.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from .constants import SH_C0

if TYPE_CHECKING:
    import numpy as np
    from torch import Tensor

ArrayT = TypeVar("ArrayT", "Tensor", "np.ndarray", float)


def rgb_to_sh0(rgb: ArrayT) -> ArrayT:
    """The degree-0 SH coefficients [..., 3] whose base colour is ``rgb`` [..., 3]."""
    return (rgb - 0.5) / SH_C0


def sh0_to_rgb(sh0: ArrayT) -> ArrayT:
    """The base colour [..., 3] (not clamped) of degree-0 SH coefficients ``sh0`` [..., 3]."""
    return sh0 * SH_C0 + 0.5
