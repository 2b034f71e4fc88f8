"""Which tiles a Gaussian reaches: the tight tile lists of ``rasterization()`` (issue 37).

A Gaussian contributes to the pixel at offset d = mean - pixel only where
``alpha = opacity * exp(-sigma(d)) >= ALPHA_SKIP``, sigma(d) = 0.5 (a dx² + c dy²) + b dx dy
for its conic (a, b, c): inside the ellipse sigma <= tau = ln(opacity / ALPHA_SKIP). A tile
whose pixel centres all lie outside that ellipse receives nothing from it, so the lists keep a
(Gaussian, tile) pair only when the ellipse meets the tile's rectangle of pixel centres
(clipped to the image), i.e. when the minimum of sigma over that rectangle is at most tau.
The rasterizers evaluate sigma and exp in float32, so the test uses a form and a level that
bound theirs from the safe side (a dropped pair must be one that every backend's rasterizer
skips at every pixel):

- the form: float32 sigma errs by at most ~8 ulp (5e-7) of the terms 0.5 a dx², 0.5 c dy² and
  |b dx dy| <= 0.5 |b| (dx² + dy²). So it is at least 0.5 (a' dx² + c' dy²) + b dx dy with
  a' = a - s (a + |b|), c' = c - s (c + |b|), s = ``TILE_CONIC_SLACK`` (20 times that). This
  slack scales with the terms, which is what an elongated Gaussian needs: along its long axis
  the terms are large and cancel. When the shrunk form is no longer positive definite (a
  needle ~300 times longer than wide) there is no bound, and every tile of the box is kept.
- the level: tau + ``TILE_SIGMA_SLACK`` (1 + tau) covers exp's and alpha's rounding (~3e-7).
- opacity < ALPHA_SKIP: alpha <= opacity < ALPHA_SKIP at every pixel (exp(-sigma) <= 1 where
  sigma >= 0, and a pixel with sigma < 0 is skipped): no tile at all.

The ellipse meets a rectangle exactly when the rectangle's columns meet the ellipse's extent in
x over the rectangle's rows, an interval because the ellipse is convex. So a row of tiles costs
two square roots (:func:`row_span`: the ellipse's x-extent over the band of the row's pixel
centres, at the band's points nearest the ellipse's leftmost and rightmost points) and each
tile of it two comparisons (:func:`tile_in_span`). The callers pass float64 values (the
rasterizer's float32 ones converted exactly) and every backend evaluates the same
expressions, so all take the same decision for every pair. ``backends/torch/intersect.py``
holds the vectorised twin.
"""

from __future__ import annotations

import math

from ...constants import ALPHA_SKIP, PIXEL_CENTER, TILE_CONIC_SLACK, TILE_SIGMA_SLACK
from .typed import like

FUNCTIONS = ("alpha_ellipse", "row_span", "tile_in_span")


def alpha_ellipse(a, b, c, opacity):
    """The bound of a Gaussian with conic (a, b, c) and the opacity the rasterizer sees:
    (a', b, c', level, x_half, y_half) such that a pixel at offset d can get alpha >=
    ALPHA_SKIP only where 0.5 (a' dx² + c' dy²) + b dx dy <= level; that ellipse spans
    |dx| <= x_half, |dy| <= y_half. level < 0: no pixel can; level = inf: no bound (the shrunk
    form is not positive definite), every pixel may."""
    zero = like(a, 0.0)
    if not opacity >= like(a, ALPHA_SKIP):
        return a, b, c, like(a, -1.0), zero, zero
    slack = like(a, TILE_CONIC_SLACK)
    b_abs = abs(b)
    a_low = a - slack * (a + b_abs)
    c_low = c - slack * (c + b_abs)
    det = a_low * c_low - b * b
    if not (a_low > zero and c_low > zero and det > zero):
        inf = like(a, math.inf)
        return a_low, b, c_low, inf, inf, inf
    tau = max(math.log(opacity / like(a, ALPHA_SKIP)), zero)
    level = tau + like(a, TILE_SIGMA_SLACK) * (like(a, 1.0) + tau)
    two = like(a, 2.0)
    return (a_low, b, c_low, level, math.sqrt(two * level * c_low / det),
            math.sqrt(two * level * a_low / det))


def row_span(a, b, c, level, x_half, y_half, my, ty, tile_size, height):
    """(xl, xr): the offsets dx at which the ellipse of :func:`alpha_ellipse` around a mean at
    height my holds a point of tile row ty, i.e. a dy = my - y with y a pixel centre row of
    the tile inside the image (xl > xr: none; (-inf, inf): no bound).

    Over the band y0 <= dy <= y1 the ellipse's right end -b dy / a + sqrt(2 a level - det dy²)
    / a is concave in dy: largest at the band's point nearest the dy of the ellipse's
    rightmost point, -b x_half / c; its left end likewise at +b x_half / c."""
    inf = like(level, math.inf)
    if level < like(level, 0.0):
        return inf, -inf
    ts = like(my, tile_size)
    half = like(my, PIXEL_CENTER)
    top = like(my, ty) * ts
    y_lo = top + half
    y_hi = min(top + ts, like(my, height)) - half
    if y_hi < y_lo:
        return inf, -inf  # a row of the grid past the image's edge: no pixel
    if level == inf:
        return -inf, inf
    lo = max(my - y_hi, -y_half)
    hi = min(my - y_lo, y_half)
    if lo > hi:
        return inf, -inf
    det = a * c - b * b
    two_a_level = like(a, 2.0) * a * level
    zero = like(a, 0.0)
    dy = min(max(-b * x_half / c, lo), hi)
    xr = (-b * dy + math.sqrt(max(two_a_level - det * dy * dy, zero))) / a
    dy = min(max(b * x_half / c, lo), hi)
    xl = (-b * dy - math.sqrt(max(two_a_level - det * dy * dy, zero))) / a
    return xl, xr


def tile_in_span(xl, xr, mx, tx, tile_size, width):
    """Whether the columns of pixel centres of tile tx inside the image (offsets dx = mx - x)
    meet the span [xl, xr] of :func:`row_span`."""
    ts = like(mx, tile_size)
    half = like(mx, PIXEL_CENTER)
    left = like(mx, tx) * ts
    x_lo = left + half
    x_hi = min(left + ts, like(mx, width)) - half
    return x_lo <= x_hi and mx - x_hi <= xr and mx - x_lo >= xl
