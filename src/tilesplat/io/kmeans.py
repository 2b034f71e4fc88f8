"""CPU k-means for the palettes of SOG files (:mod:`.sog`): a 256-entry codebook of scalars
and a palette of SH vectors.

Both are Lloyd iterations from a deterministic start (quantiles of the sorted values in 1-D,
an evenly spaced sample of the rows in N-D), so the same Gaussians always give the same file.
The N-D assignment is the distance expansion ``|x|^2 - 2 x.c + |c|^2`` as one float32 matrix
product per block of rows (torch's GEMM on the CPU cores), blocks sized to keep the distance
matrix near 64 MB; the update sums each cluster's rows with ``index_add_``. An empty cluster
keeps its centroid. Large inputs are fitted on an evenly strided sample of ``SAMPLE_PER_K``
rows per centroid (at least ``MIN_SAMPLE``), then every row is assigned once: the garden
model's 136 K SH rows into 4096 entries took ~40 s fitted on all rows, ~half on the sample.
Iterations stop early once fewer than 0.1 % of the labels change.
"""

from __future__ import annotations

import numpy as np
import torch

_BLOCK_FLOATS = 1 << 24  # 64 MB of float32 distances per block of rows
SAMPLE_PER_K = 16
MIN_SAMPLE = 1 << 16


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
    flat = np.asarray(values, np.float64).ravel()
    uniq, counts = np.unique(flat, return_counts=True)
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


def _assign(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centroid [N] int64 of rows ``x`` [N, D] among ``c`` [K, D]."""
    c2 = (c * c).sum(1)
    rows = max(1, _BLOCK_FLOATS // max(len(c), 1))
    out = torch.empty(len(x), dtype=torch.int64)
    for s in range(0, len(x), rows):
        d = c2[None, :] - 2.0 * (x[s : s + rows] @ c.T)  # |x|^2 is the same for every centroid
        out[s : s + rows] = d.argmin(1)
    return out


def kmeans(rows: np.ndarray, k: int, iterations: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """A palette of ``min(k, N)`` centroids of ``rows`` [N, D] and each row's label.

    Returns:
        (centroids [k', D] float32, labels [N] int64).
    """
    everything = torch.from_numpy(np.ascontiguousarray(rows, np.float32))
    n = len(everything)
    k = max(1, min(k, n))
    m = min(n, max(SAMPLE_PER_K * k, MIN_SAMPLE))
    x = everything[torch.from_numpy(np.linspace(0, n - 1, m).round().astype(np.int64))]
    c = x[torch.from_numpy(np.linspace(0, m - 1, k).round().astype(np.int64))].clone()
    labels = _assign(x, c)
    for _ in range(iterations):
        sums = torch.zeros_like(c).index_add_(0, labels, x)
        counts = torch.bincount(labels, minlength=k).to(x.dtype)
        c = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], c)
        new = _assign(x, c)
        changed = int((new != labels).sum())
        labels = new
        if changed <= m // 1000:
            break
    if m < n:
        labels = _assign(everything, c)
    return c.numpy(), labels.numpy()
