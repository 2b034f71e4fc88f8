"""The row map of ``spherical_harmonics`` coefficients shared by several evaluation rows.

``rasterization`` evaluates every Gaussian's SH coefficients once per camera. Instead of a
[C, N, K, 3] copy, the op hands a backend the [N, K, 3] coefficients and ``rows = (inner,
reps)``: evaluation row m (of M) reads coefficient row

    (m // (reps * inner)) * inner + m % inner

(``reps`` consecutive blocks of ``inner`` rows share one block of coefficients; ``(M, 1)`` is
the identity). Backends with a native kernel read through the map; the others use
:func:`expand_rows` and :func:`reduce_rows`.
"""

from __future__ import annotations

import torch


def expand_rows(coeffs: torch.Tensor, rows: tuple[int, int]) -> torch.Tensor:
    """coeffs [outer * inner, K, 3] -> [outer * reps * inner, K, 3] (a broadcast view)."""
    inner, reps = rows
    if reps == 1:
        return coeffs
    outer = coeffs.shape[0] // inner
    tail = coeffs.shape[1:]
    return coeffs.reshape(outer, 1, inner, *tail).expand(outer, reps, inner, *tail).reshape(
        outer * reps * inner, *tail)


def reduce_rows(v_full: torch.Tensor, rows: tuple[int, int]) -> torch.Tensor:
    """The gradient of :func:`expand_rows`: [outer * reps * inner, K, 3] -> [outer * inner, K,
    3], summed over the reps in a fixed order."""
    inner, reps = rows
    if reps == 1:
        return v_full
    tail = v_full.shape[1:]
    outer = v_full.shape[0] // (reps * inner)
    return v_full.reshape(outer, reps, inner, *tail).sum(1).reshape(outer * inner, *tail)
