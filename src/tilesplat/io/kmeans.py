"""CPU k-means for the palettes of SOG files (:mod:`.sog`): a 256-entry codebook of scalars
and a palette of SH vectors.

Both are Lloyd iterations from a deterministic start (quantiles of the sorted values in 1-D,
an evenly spaced sample of the rows in N-D), so the same Gaussians always give the same file.
The N-D assignment is the distance expansion ``|x|^2 - 2 x.c + |c|^2`` as one float32 matrix
product per block of rows (torch's GEMM on the CPU cores), blocks sized to keep the distance
matrix near 16 MB; the update sums each cluster's rows after sorting them by label. An empty cluster
keeps its centroid. Centroids are fitted on an evenly strided sample of ``SAMPLE_PER_K`` rows
per centroid (at least ``MIN_SAMPLE``), for at most ``iterations`` rounds (fewer once under
0.1 % of the labels change); then every row is assigned once.

A palette of more than ``FLAT_MAX`` entries (SOG's 65536 for 3 M Gaussians) is two levels:
~sqrt(k) coarse centroids split the rows, then each coarse cell gets its own k-means with a
share of the k entries proportional to its rows, fitted on ``FINE_SAMPLE_PER_K`` rows per
entry. A row's distances are then computed to
~2 sqrt(k) centroids instead of k: for 3 M rows of 45 coefficients and k = 65536 that is
~0.1 TFLOP a pass instead of ~18, with each row still matched inside its own neighbourhood.
The rows are only read (a view of the caller's array is fine); labels are the one [N] array.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_BLOCK_FLOATS = 1 << 22  # 16 MB of float32 distances per block of rows
SAMPLE_PER_K = 16
MIN_SAMPLE = 1 << 16
FLAT_MAX = 4096  # larger palettes are two-level
FINE_SAMPLE_PER_K = 8  # rows per centroid fitted inside a coarse cell (all rows are assigned)


def kmeans_1d(
    values: np.ndarray, k: int = 256, iterations: int = 16
) -> tuple[np.ndarray, np.ndarray]:
    """A codebook of at most ``k`` scalars and each value's index.

    Args:
        values: any shape, finite.

    Returns:
        (codebook [k'] float32 ascending, k' <= k; labels of ``values``' shape, uint8 when
        k <= 256 else int64).
    """
    flat = np.asarray(values).ravel()
    uniq, counts = np.unique(flat, return_counts=True)
    uniq = uniq.astype(np.float64)
    if len(uniq) <= k:
        centres = uniq
    else:
        cum = np.cumsum(counts) - counts / 2.0
        centres = np.interp((np.arange(k) + 0.5) / k * counts.sum(), cum, uniq)
        for _ in range(iterations):
            centres = np.unique(centres)
            edges = (centres[1:] + centres[:-1]) / 2.0
            lab = np.searchsorted(edges, uniq)
            w = np.bincount(lab, weights=counts, minlength=len(centres))
            s = np.bincount(lab, weights=counts * uniq, minlength=len(centres))
            new = np.where(w > 0, s / np.maximum(w, 1e-300), centres)
            if np.array_equal(new, centres):
                break
            centres = new
        centres = np.unique(centres)
    edges = (centres[1:] + centres[:-1]) / 2.0
    labels = np.searchsorted(edges, flat).reshape(np.shape(values))
    return centres.astype(np.float32), labels.astype(np.uint8 if k <= 256 else np.int64)


def _assign(x: torch.Tensor, c: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Index of the nearest centroid [N] int64 of rows ``x`` [N, D] among ``c`` [K, D]."""
    c2 = (c * c).sum(1)
    rows = max(1, _BLOCK_FLOATS // max(len(c), 1))
    out = torch.empty(len(x), dtype=torch.int64) if out is None else out
    for s in range(0, len(x), rows):
        d = torch.addmm(c2[None, :], x[s : s + rows], c.T, alpha=-2.0)  # |x|^2: same for all c
        torch.argmin(d, 1, out=out[s : s + rows])
    return out


def _strided(n: int, m: int) -> torch.Tensor:
    """``m`` evenly spaced indices of ``range(n)`` [m] int64."""
    return torch.from_numpy(np.linspace(0, n - 1, m).round().astype(np.int64))


def _means(x: torch.Tensor, labels: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The mean [K, D] of the rows ``x`` [M, D] of each label [M] (an empty cluster keeps
    its row of ``c`` [K, D]): rows sorted by label, each run summed (``index_add_`` with
    repeated indices is ~30x slower on the CPU)."""
    order = np.argsort(labels.numpy(), kind="stable")
    lab = labels.numpy()[order]
    counts = np.bincount(lab, minlength=len(c))
    starts = np.cumsum(counts) - counts
    full = counts > 0
    out = c.numpy().copy()
    out[full] = np.add.reduceat(x.numpy()[order], starts[full], axis=0) / counts[full, None]
    return torch.from_numpy(out)


def _lloyd(x: torch.Tensor, k: int, iterations: int) -> torch.Tensor:
    """Centroids [k, D] of ``x`` [M, D] (k <= M): Lloyd from evenly spaced rows."""
    c = x[_strided(len(x), k)].clone()
    labels = _assign(x, c)
    for _ in range(iterations):
        c = _means(x, labels, c)
        new = _assign(x, c)
        changed = int((new != labels).sum())
        labels = new
        if changed <= len(x) // 1000:
            break
    return c


def _fit(x: torch.Tensor, k: int, iterations: int, least: int = MIN_SAMPLE,
         per_k: int = SAMPLE_PER_K) -> torch.Tensor:
    """Centroids [k, D] fitted on an evenly strided sample of rows ``x`` [N, D]: at least
    ``least`` rows, or ``per_k`` per centroid."""
    m = min(len(x), max(per_k * k, least))
    sample = x if m == len(x) else x[_strided(len(x), m)]
    return _lloyd(sample, k, iterations)


def _shares(sizes: np.ndarray, k: int) -> np.ndarray:
    """Entries per coarse cell [C] int64: proportional to ``sizes`` [C], at least 1 for a
    non-empty cell, at most its size, summing to ``min(k, sizes.sum())``."""
    k = min(k, int(sizes.sum()))
    want = sizes * (k / sizes.sum())
    share = np.minimum(np.maximum(np.floor(want), sizes > 0), sizes).astype(np.int64)
    order = np.argsort(share - want, kind="stable")  # most short-changed first
    while share.sum() != k:
        step = 1 if share.sum() < k else -1
        for i in order if step > 0 else order[::-1]:
            if share.sum() == k:
                break
            if (step > 0 and share[i] < sizes[i]) or (step < 0 and share[i] > 1):
                share[i] += step
    return share


def kmeans(rows: np.ndarray, k: int, iterations: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """A palette of ``min(k, N)`` centroids of ``rows`` [N, D] and each row's label.

    Returns:
        (centroids [k', D] float32, labels [N] int64).
    """
    x = torch.from_numpy(np.ascontiguousarray(rows, np.float32))
    n = len(x)
    k = max(1, min(k, n))
    if k <= FLAT_MAX:
        c = _fit(x, k, iterations)
        return c.numpy(), _assign(x, c).numpy()
    coarse = _fit(x, max(2, math.isqrt(k)), iterations)
    cell = _assign(x, coarse)
    order = torch.argsort(cell, stable=True)
    sizes = torch.bincount(cell, minlength=len(coarse)).numpy()
    share = _shares(sizes, k)
    labels = cell  # overwritten cell by cell with the fine labels
    palette, start, base = [], 0, 0
    for size, kj in zip(sizes.tolist(), share.tolist(), strict=True):
        if size:
            idx = order[start : start + size]
            xj = x[idx]
            c = _fit(xj, kj, iterations, least=0, per_k=FINE_SAMPLE_PER_K)
            labels[idx] = _assign(xj, c) + base
            palette.append(c)
            start, base = start + size, base + kj
    return torch.cat(palette).numpy(), labels.numpy()
