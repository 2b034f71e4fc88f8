"""The per-pair math of compositing: the conic's quadratic form and a vectorisable exp.

``exp_neg`` is a polynomial, not ``math.exp``: Numba from pip has no SVML, and a libm call per
pixel-splat pair keeps the rasterizer's loops scalar (DESIGN.md, "Measured facts about Numba").
"""

from __future__ import annotations

from .typed import as_int32, fma, like, pow2_neg

FUNCTIONS = ("exp_neg", "gaussian_sigma")

_LN2_HI = 0.693145751953125  # ln 2 split so that n * _LN2_HI is exact for n < 2**9
_LN2_LO = 1.4286068203094173e-06
_EXP_MAX = 43.66  # exp(-s) is taken as exp(-min(s, _EXP_MAX)): 2**-63 there


def exp_neg(s):
    """exp(-s) for s >= 0 without a libm call, so that loops of it vectorise.

    s = n ln2 + r with |r| <= ln2 / 2; exp(-r) by its degree-7 Taylor polynomial in Horner
    form with fused multiply-adds (truncation below 1e-8 relative; one rounding per step,
    and half the vector instructions of a multiply and an add: the rasterizer's forward
    ~7 % and backward ~5 % faster at 1 M Gaussians); times 2**-n, exact, built in the
    exponent field (:func:`pow2_neg`). Relative error ~1e-7 in float32 (1 ulp), ~1e-8 in float64.
    s is clamped to [0, 43.66]: beyond it the result stays exp(-43.66) ~ 1e-19, far below any
    alpha threshold.
    """
    s = min(max(s, like(s, 0.0)), like(s, _EXP_MAX))
    n = as_int32(s * like(s, 1.4426950408889634) + like(s, 0.5))
    nf = like(s, n)
    r = nf * like(s, _LN2_HI) - s + nf * like(s, _LN2_LO)  # -s + n ln2, in [-ln2/2, ln2/2]
    p = like(s, 1.0 / 5040.0)
    p = fma(p, r, like(s, 1.0 / 720.0))
    p = fma(p, r, like(s, 1.0 / 120.0))
    p = fma(p, r, like(s, 1.0 / 24.0))
    p = fma(p, r, like(s, 1.0 / 6.0))
    p = fma(p, r, like(s, 0.5))
    p = fma(p, r, like(s, 1.0))
    p = fma(p, r, like(s, 1.0))
    return p * pow2_neg(s, n)  # exact: p in [0.7, 1.42] and n <= 63 keep it a normal number


def gaussian_sigma(a, b, c, dx, dy):
    """sigma = 0.5 (a dx^2 + c dy^2) + b dx dy for conic (a, b, c) and d = mean - pixel."""
    return like(a, 0.5) * (a * dx * dx + c * dy * dy) + b * dx * dy

