"""A multi-view growth score (after FastGS, Ren et al. 2025, which scores a Gaussian by the
high-error pixels it covers across several views): the number of views, among those that saw
a Gaussian since the last refinement, in which its screen-space gradient exceeded the growth
threshold.

The mean gradient that the 3DGS rule compares with the threshold can come from one view that
disagrees strongly; the count of views says how many views ask for the Gaussian to grow. A
strategy with a budget ranks its candidates by it (``budget_score = "views"``), the mean
gradient breaking ties. The count is kept on the gradients' device, by mask, with no host read.
"""

from __future__ import annotations

from typing import Any

import torch


@torch.no_grad()
def view_gradient_norms(info: dict[str, Any], key: str, absgrad: bool) -> torch.Tensor:
    """The step's screen-space gradient norm of each (view, Gaussian) pair the render holds,
    in the units of the 3DGS threshold (normalised device coordinates, the loss's mean over
    the cameras undone): [C, N] (or [nnz] for a packed render)."""
    means2d = info[key]
    grads = means2d.absgrad if absgrad else means2d.grad
    scale = torch.tensor([info["width"] / 2.0, info["height"] / 2.0], device=grads.device,
                         dtype=grads.dtype) * info["n_cameras"]
    return (grads * scale).norm(dim=-1).float()


@torch.no_grad()
def add_hot_views(hot: torch.Tensor, info: dict[str, Any], key: str, absgrad: bool,
                  threshold: float, packed: bool) -> None:
    """Add to ``hot`` [N] one for each view of the step in which a Gaussian was seen with a
    screen-space gradient above ``threshold``."""
    norms = view_gradient_norms(info, key, absgrad)
    if packed:
        ids = info["gaussian_ids"]  # [nnz]
        hot.index_add_(0, ids, (norms > threshold).float())
        return
    n = int(hot.shape[0])
    visible = (info["radii"] > 0).all(dim=-1).reshape(-1, n)  # [C, N]
    hot += (visible & (norms.reshape(-1, n) > threshold)).float().sum(dim=0)


def rank_by_views(hot: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """The candidates' order of growth [N]: the count of hot views ``hot`` [N], the mean
    gradient ``grads`` [N] breaking ties (its share of the largest, below one)."""
    top = grads.max().clamp_min(1e-30)
    return hot + 0.5 * (grads / top).clamp(0.0, 1.0)
