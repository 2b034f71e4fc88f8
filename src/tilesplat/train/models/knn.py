"""Exact k nearest neighbours of a point cloud through a k-d tree (numba), for the initial
Gaussians' sizes (:func:`.init.knn_mean_distance`).

A distance matrix costs N² (a COLMAP model of 1 M points: ~1.5 hours on two cores); the tree
costs about N log N to build (each level sorts its ranges along their widest axis) and
log N plus the points near a query to search, and it is exact whatever the spread of the
points (far outliers only make a branch deeper). The tree is implicit: node ``i`` of the
heap layout (children ``2i + 1``, ``2i + 2``) owns the range ``order[lo:hi]`` that halving
the root range gives, and splits it at its middle along ``axes[i]`` at ``splits[i]``.
Distances are the squared differences summed in float64; a query never counts itself, and a
duplicate of it counts at distance 0. The tree is built on one thread; the queries run in
blocks over the CPU backend's threads (``_common.parallel_for``, not numba's
``parallel=True``), each alone, so the result does not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...backends.cpu._common import BLOCK, parallel_for

LEAF = 16  # at most this many points in a leaf: scanned one by one


@njit(cache=True)
def _depth(n: int) -> int:
    depth, size = 0, n
    while size > LEAF:
        size = (size + 1) // 2
        depth += 1
    return depth


@njit(cache=True)
def _widest_axis(points: np.ndarray, ids: np.ndarray) -> int:
    lo = points[ids[0]].copy()
    hi = points[ids[0]].copy()
    for t in range(1, ids.shape[0]):
        for a in range(3):
            v = points[ids[t], a]
            lo[a] = min(lo[a], v)
            hi[a] = max(hi[a], v)
    return int(np.argmax(hi - lo))


@njit(cache=True)
def build(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """points [N, 3] float64 -> (order [N] int64, axes [M] int64, splits [M] float64), M the
    nodes of the heap layout (axis -1 for a leaf)."""
    n = points.shape[0]
    m = (1 << (_depth(n) + 1)) - 1
    order = np.arange(n)
    axes = np.full(m, -1, dtype=np.int64)
    splits = np.zeros(m, dtype=np.float64)
    stack = [(0, 0, n)]
    while len(stack) > 0:
        node, lo, hi = stack.pop()
        if hi - lo <= LEAF:
            continue
        ids = order[lo:hi]
        axis = _widest_axis(points, ids)
        sorted_ids = ids[np.argsort(points[ids, axis], kind="mergesort")]
        order[lo:hi] = sorted_ids
        mid = (lo + hi) // 2
        axes[node] = axis
        splits[node] = points[order[mid], axis]
        stack.append((2 * node + 1, lo, mid))
        stack.append((2 * node + 2, mid, hi))
    return order, axes, splits


@njit(cache=True)
def _insert(best_d: np.ndarray, d: float) -> None:
    """Keeps best_d ascending: d enters where it belongs, the last one drops out."""
    k = best_d.shape[0]
    if d >= best_d[k - 1]:
        return
    p = k - 1
    while p > 0 and best_d[p - 1] > d:
        best_d[p] = best_d[p - 1]
        p -= 1
    best_d[p] = d


@njit(cache=True)
def _query(points, order, axes, splits, q: int, best_d: np.ndarray) -> None:
    """The k = len(best_d) nearest others of point q into best_d (squared, ascending)."""
    n = points.shape[0]
    best_d[:] = np.inf
    qx, qy, qz = points[q, 0], points[q, 1], points[q, 2]
    stack = [(0, 0, n, 0.0)]  # node, lo, hi, a lower bound of its squared distance
    while len(stack) > 0:
        node, lo, hi, bound = stack.pop()
        if bound >= best_d[best_d.shape[0] - 1]:
            continue
        if node >= axes.shape[0] or axes[node] < 0:
            for t in range(lo, hi):
                j = order[t]
                if j != q:
                    dx = points[j, 0] - qx
                    dy = points[j, 1] - qy
                    dz = points[j, 2] - qz
                    _insert(best_d, dx * dx + dy * dy + dz * dz)
            continue
        mid = (lo + hi) // 2
        diff = points[q, axes[node]] - splits[node]
        far = diff * diff
        if diff < 0.0:  # the near half first (pushed last)
            stack.append((2 * node + 2, mid, hi, max(bound, far)))
            stack.append((2 * node + 1, lo, mid, bound))
        else:
            stack.append((2 * node + 1, lo, mid, max(bound, far)))
            stack.append((2 * node + 2, mid, hi, bound))


@njit(nogil=True, cache=True)
def query_kernel(first, step, points, order, axes, splits, out) -> None:
    """The queries of blocks first, first + step, ... (``_common.parallel_for``): out [N, k]
    the squared distances of each point's k nearest others, ascending."""
    n, k = out.shape[0], out.shape[1]
    best_d = np.empty(k, dtype=np.float64)
    for blk in range(first, (n + BLOCK - 1) // BLOCK, step):
        for q in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            _query(points, order, axes, splits, q, best_d)
            out[q] = best_d


def nearest_squared(points: np.ndarray, k: int) -> np.ndarray:
    """points [N, 3] float64, 1 <= k < N -> [N, k] the squared distances of each point's k
    nearest others, ascending; the tree built on one thread, the queries over the CPU
    backend's threads (each query alone: the same result for any thread count)."""
    points = np.ascontiguousarray(points, dtype=np.float64)
    order, axes, splits = build(points)
    out = np.empty((points.shape[0], k), dtype=np.float64)
    parallel_for(query_kernel, (points.shape[0] + BLOCK - 1) // BLOCK, points, order, axes,
                 splits, out)
    return out
