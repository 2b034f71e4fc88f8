"""Which views see the same part of a scene, from their poses alone: each view's nearest
views by the angle between their optical axes and the distance between their centres. Used to
choose the views a plane sweep compares (``train/models/init_frustum.py``) and the image pairs
matched for a triangulation with known poses (``sfm/triangulate.py``)."""

from __future__ import annotations

import torch
from torch import Tensor


def neighbours(viewmats: Tensor, k: int) -> Tensor:
    """[C, k'] for each view the ``k`` other views (k' = min(k, C - 1)) whose optical axes
    are nearest in angle and whose centres are nearest, ranked by the sum of both (distance
    in units of the median camera spacing)."""
    c = viewmats.shape[0]
    k = min(k, c - 1)
    R, t = viewmats[:, :3, :3], viewmats[:, :3, 3]
    centres = -(R.transpose(1, 2) @ t[..., None])[..., 0]
    axes = R[:, 2, :]  # the camera's z axis in the world
    angle = torch.acos((axes @ axes.T).clamp(-1.0, 1.0))
    dist = torch.cdist(centres, centres)
    spacing = dist.masked_fill(torch.eye(c, dtype=torch.bool), float("inf")).min(1).values
    unit = spacing.median().clamp_min(1e-6)
    score = angle + dist / unit * 0.1
    score.fill_diagonal_(float("inf"))
    return score.topk(k, dim=1, largest=False).indices
