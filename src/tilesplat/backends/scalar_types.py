"""The plain-Python meaning of the typed scalar helpers of the native math (``like``,
``as_int32``, ``pow2_neg``), importable without Numba.

A camera model (``backends/cameras/``) is one module holding its scalar math for the native
kernels and its torch twin for the reference; the scalar math calls these helpers, and the
reference must not import Numba to import a camera. ``shared/typed.py`` gives these same
function objects their compiled meaning (Numba overloads) before anything compiles them.
"""

from __future__ import annotations

import math


def like(x, c):
    """``c`` converted to the type of ``x`` (in compiled code; plain Python returns ``c``)."""
    return c


def as_int32(x):
    """``x`` truncated to a 32-bit integer (vectorises where a 64-bit conversion would not)."""
    return int(x)


def pow2_neg(x, n):
    """2**-n as the float type of ``x``, for integer 0 <= n <= 126 (compiled: the exponent
    field written directly, a subtraction and a shift; plain Python: ``ldexp``)."""
    return math.ldexp(1.0, -int(n))
