"""CPU k-means for the palettes of SOG files (:mod:`.sog`): a 256-entry codebook of scalars
and a palette of SH vectors.

Both are Lloyd iterations from a deterministic start (quantiles of the sorted values in 1-D,
an evenly spaced sample of the rows in N-D), so the same Gaussians always give the same file.
The N-D assignment is the distance expansion ``|x|^2 - 2 x.c + |c|^2`` as one float32 matrix
product per block of rows (torch's GEMM on the CPU cores), blocks sized to keep the distance
matrix near 16 MB; the update sums each cluster's rows after sorting them by label. An empty cluster
keeps its centroid. Centroids are fitted on an evenly strided sample of ``SAMPLE_PER_K`` rows
per centroid (at least ``MIN_SAMPLE``), for at most ``iterations`` rounds (fewer once under
0.1 % of the labels change); then every row is assigned once, and each centroid moved to the
mean of the rows it holds.

A palette of more than ``FLAT_MAX`` entries (SOG's 65536 for 3 M Gaussians) is two levels
unless rows x entries is at most ``FLAT_WORK`` (SOG's 8192 entries for 8192 to 16383
Gaussians: with about one row per entry, a row's nearest entry must be searched among all
of them; within a cell, the 10 K-Gaussian SH error was 10 % larger):
~sqrt(k) coarse centroids split the rows, then each coarse cell gets its own k-means with a
share of the k entries proportional to its rows, fitted on ``FINE_SAMPLE_PER_K`` rows per
entry for at most ``FINE_ITERATIONS`` rounds. Then ``REFINE_PASSES`` Lloyd passes over
every row: a row is matched against the entries of its own cell and of the
``NEAR_CELLS - 1`` cells whose coarse centroids are nearest its cell's (a row near a cell's
border finds the entry across it), and each entry moves to the mean of all the rows it
holds (the sample fit alone leaves the entries where 16 sample rows each put them). A row's
distances are computed to ~NEAR_CELLS sqrt(k) centroids instead of k: for 3 M rows of 45
coefficients and k = 65536 that is ~0.2 TFLOP a pass instead of ~18. The rows are only
read (a view of the caller's array is fine); beyond the
palette and the [N] labels, memory is one cell's rows at a time.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_BLOCK_FLOATS = 1 << 22  # 16 MB of float32 distances per block of rows
SAMPLE_PER_K = 16
MIN_SAMPLE = 1 << 16
FLAT_MAX = 4096  # larger palettes are two-level, unless there are few rows:
FLAT_WORK = 1 << 27  # rows x entries up to which one level is cheap (16383 x 8192)
FINE_SAMPLE_PER_K = 16  # rows per centroid fitted inside a coarse cell (then a pass over all rows)
FINE_ITERATIONS = 4  # Lloyd rounds of a cell's fit: the full pass follows (10 rounds: -0.14 %
# SH error at 300 K x 6554 for 1.35x the CPU)
NEAR_CELLS = 3  # a row is matched against the entries of its cell and the 2 nearest cells
REFINE_PASSES = 1  # full-data Lloyd passes after the fit


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
        # the values are sorted: a cluster is a run of them, its weight and sum differences
        # of running totals at the run's ends (k binary searches a round, not one per value)
        cw = np.r_[0.0, np.cumsum(counts, dtype=np.float64)]
        cs = np.r_[0.0, np.cumsum(counts * uniq)]
        for _ in range(iterations):
            centres = np.unique(centres)
            ends = np.r_[0, np.searchsorted(uniq, (centres[1:] + centres[:-1]) / 2.0), len(uniq)]
            w, s = np.diff(cw[ends]), np.diff(cs[ends])
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


def _means(x: torch.Tensor, labels: torch.Tensor, c: torch.Tensor,
           weights: np.ndarray | None = None) -> torch.Tensor:
    """The mean [K, D] of the rows ``x`` [M, D] of each label [M], weighted by ``weights``
    [M] (> 0) when given (an empty cluster keeps its row of ``c`` [K, D]): rows sorted by
    label, each run summed (``index_add_`` with repeated indices is ~30x slower on the
    CPU)."""
    order = np.argsort(labels.numpy(), kind="stable")
    lab = labels.numpy()[order]
    counts = np.bincount(lab, minlength=len(c))
    starts = np.cumsum(counts) - counts
    full = counts > 0
    out = c.numpy().copy()
    xs = x.numpy()[order]
    if weights is None:
        out[full] = np.add.reduceat(xs, starts[full], axis=0) / counts[full, None]
    else:
        w = weights[order].astype(np.float64)
        sums = np.add.reduceat(xs * w[:, None], starts[full], axis=0)
        out[full] = sums / np.add.reduceat(w, starts[full])[:, None]
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


def _neighbours(coarse: torch.Tensor, m: int) -> torch.Tensor:
    """Each coarse centroid's ``m`` nearest coarse centroids, itself first [C, m] int64."""
    d = torch.cdist(coarse, coarse)
    d.fill_diagonal_(-1.0)
    return torch.topk(d, min(m, len(coarse)), dim=1, largest=False).indices


def _refine(x: torch.Tensor, cell: torch.Tensor, palette: torch.Tensor, bases: np.ndarray,
            shares: np.ndarray, near: torch.Tensor, passes: int,
            weights: np.ndarray | None) -> torch.Tensor:
    """Labels [N] of rows ``x`` [N, D] in ``palette`` [K, D] (updated in place): each cell's
    rows against the entries of its ``near`` cells, then every entry moved to the mean of
    the rows it holds, weighted by ``weights`` [N] when given (an entry that holds none keeps
    its place); ``passes`` times."""
    order = torch.argsort(cell, stable=True)
    sizes = torch.bincount(cell, minlength=len(near)).numpy()
    starts = np.cumsum(sizes) - sizes
    cand = [torch.cat([torch.arange(int(bases[c]), int(bases[c] + shares[c]))
                       for c in near[j].tolist()]) for j in range(len(near))]  # fmt: skip
    labels = torch.empty(len(x), dtype=torch.int64)
    for _ in range(passes):
        sums = np.zeros(palette.shape, np.float64)
        counts = np.zeros(len(palette), np.float64)  # the weight each entry holds
        for j in np.flatnonzero(sizes).tolist():
            idx = order[starts[j] : starts[j] + sizes[j]]
            xj = x[idx]
            lab = cand[j][_assign(xj, palette[cand[j]])]
            labels[idx] = lab
            by = torch.argsort(lab).numpy()
            lab_sorted = lab.numpy()[by]
            first = np.flatnonzero(np.r_[True, lab_sorted[1:] != lab_sorted[:-1]])
            uniq = lab_sorted[first]
            if weights is None:
                wj = np.ones(len(by))
            else:
                wj = weights[idx.numpy()[by]].astype(np.float64)
            sums[uniq] += np.add.reduceat(xj.numpy()[by] * wj[:, None], first, axis=0)
            counts[uniq] += np.add.reduceat(wj, first)
        full = counts > 0
        palette[torch.from_numpy(full)] = torch.from_numpy(
            (sums[full] / counts[full, None]).astype(np.float32))
    return labels


def kmeans(
    rows: np.ndarray, k: int, iterations: int = 10, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """A palette of ``min(k, N)`` centroids of ``rows`` [N, D] and each row's label.

    ``weights`` [N] (> 0), when given, weight each row in the last update of the entries
    (each entry the weighted mean of its rows; SOG passes the Gaussians' opacities: an
    opaque Gaussian's colour shows more).

    Returns:
        (centroids [k', D] float32, labels [N] int64).
    """
    threads = torch.get_num_threads()
    # one thread: thousands of small GEMMs, each an OpenMP region whose idle workers spin
    # (300 K rows x 6554 entries on a loaded 2-core machine: 2.2 CPU s against 14); SOG's
    # WebP encoding has the other core meanwhile
    torch.set_num_threads(1)
    try:
        return _kmeans(rows, k, iterations, weights)
    finally:
        torch.set_num_threads(threads)


def _kmeans(rows: np.ndarray, k: int, iterations: int,
            weights: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    x = torch.from_numpy(np.ascontiguousarray(rows, np.float32))
    n = len(x)
    k = max(1, min(k, n))
    if k <= FLAT_MAX or n * k <= FLAT_WORK:
        c = _fit(x, k, iterations)
        labels = _assign(x, c)
        return _means(x, labels, c, weights).numpy(), labels.numpy()  # of all rows held
    coarse = _fit(x, max(2, math.isqrt(k)), iterations)
    cell = _assign(x, coarse)
    order = torch.argsort(cell, stable=True)
    sizes = torch.bincount(cell, minlength=len(coarse)).numpy()
    share = _shares(sizes, k)
    palette, start = [], 0
    for size, kj in zip(sizes.tolist(), share.tolist(), strict=True):
        if size:
            xj = x[order[start : start + size]]
            palette.append(_fit(xj, kj, min(iterations, FINE_ITERATIONS), least=0,
                                per_k=FINE_SAMPLE_PER_K))  # fmt: skip
            start += size
    del order
    palette = torch.cat(palette)
    bases = np.cumsum(share) - share
    labels = _refine(x, cell, palette, bases, share, _neighbours(coarse, NEAR_CELLS),
                     REFINE_PASSES, weights)
    return palette.numpy(), labels.numpy()
