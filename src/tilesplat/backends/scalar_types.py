"""The plain-Python meaning of the typed scalar helpers of the native math (``like``,
``as_int32``, ``pow2_neg``, ``fma``), importable without Numba.

A camera model (``backends/cameras/``) is one module holding its scalar math for the native
kernels and its torch twin for the reference; the scalar math calls these helpers, and the
reference must not import Numba to import a camera. ``shared/typed.py`` gives these same
function objects their compiled meaning (Numba overloads) before anything compiles them.
"""

from __future__ import annotations

import math
from fractions import Fraction


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


def fma(a, b, c):
    """``a * b + c`` rounded once: IEEE's fused multiply-add (compiled: the ``llvm.fma``
    intrinsic, one instruction on every x86-64 CPU since 2013 and on every Arm64 one, and the
    same bits on each; plain Python: the exact value rounded to a Python float)."""
    a, b, c = float(a), float(b), float(c)
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return a * b + c  # inf and nan propagate as the instruction's do
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c  # the sign of a zero: an exact zero sum is a representable one
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf
