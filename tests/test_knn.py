"""The k-d tree's nearest neighbours (train/models/knn.py) against brute force, to the bit:
duplicates, ties on a lattice, a dense cluster with far outliers, tiny clouds, and a cloud
too large for a distance matrix checked through a sample of its queries."""

from __future__ import annotations

import math

import pytest
import torch

from tilesplat.train.models.init import knn_mean_distance
from tilesplat.train.models.knn import LEAF, nearest_squared


def _brute(pts: torch.Tensor, k: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    rows = torch.arange(len(pts)) if rows is None else rows
    d = ((pts[rows][:, None] - pts[None]) ** 2).sum(-1)  # the tree's own formula
    d[torch.arange(len(rows)), rows] = math.inf  # a point is not its own neighbour
    return d.topk(k, largest=False).values


def _cloud(kind: str, n: int, g: torch.Generator) -> torch.Tensor:
    pts = torch.randn(n, 3, generator=g, dtype=torch.float64)
    if kind == "duplicates":
        pts = pts[: n // 2].repeat(2, 1)
    elif kind == "lattice":  # many equal distances
        pts = torch.stack(torch.meshgrid(*[torch.arange(9.0, dtype=torch.float64)] * 3,
                                         indexing="ij"), -1).reshape(-1, 3)[:n]
    elif kind == "outliers":
        pts = pts * 1e-3
        pts[:7] *= 1e7
    return pts


@pytest.mark.parametrize("kind", ["gaussian", "duplicates", "lattice", "outliers"])
@pytest.mark.parametrize("n", [2, 3, LEAF, LEAF + 1, 701])
def test_the_tree_finds_what_brute_force_finds(kind, n):
    pts = _cloud(kind, n, torch.Generator().manual_seed(n))
    for k in range(1, min(4, len(pts))):
        got = torch.from_numpy(nearest_squared(pts.numpy(), k))
        assert torch.equal(got, _brute(pts, k)), (kind, n, k)


def test_a_large_cloud_by_a_sample_of_its_points():
    g = torch.Generator().manual_seed(3)
    pts = torch.cat([torch.randn(60_000, 3, generator=g, dtype=torch.float64) * 0.05,
                     torch.rand(20_000, 3, generator=g, dtype=torch.float64) * 100.0])
    got = torch.from_numpy(nearest_squared(pts.numpy(), 3))
    rows = torch.randint(0, len(pts), (400,), generator=g)
    assert torch.equal(got[rows], _brute(pts, 3, rows))


def test_the_mean_distance_keeps_the_dtype_and_the_lone_point():
    pts = torch.tensor([[0.0, 0, 0], [3.0, 0, 0], [0.0, 4, 0]])
    got = knn_mean_distance(pts, k=2)
    assert got.dtype == torch.float32
    assert torch.allclose(got, torch.tensor([12.5, 17.0, 20.5]).sqrt())
    assert knn_mean_distance(pts[:1]).tolist() == [0.0]
    assert knn_mean_distance(pts[:2], k=3).tolist() == [3.0, 3.0]  # k capped at N - 1


def test_the_thread_count_changes_nothing():
    import numba

    pts = torch.rand(5_000, 3, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    before = numba.get_num_threads()
    try:
        many = nearest_squared(pts.numpy(), 3)
        numba.set_num_threads(1)
        one = nearest_squared(pts.numpy(), 3)
    finally:
        numba.set_num_threads(before)
    assert (many == one).all()
