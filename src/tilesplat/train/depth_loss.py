"""The depth prior (``depth_loss = true``): the sparse SfM points seen by each training image
pull the render's expected depth towards their depth, as gsplat's simple trainer does.

For each camera of the step, the points its image sees (``Frame.point_ids``: COLMAP's tracks;
for a source without tracks, a nerfstudio ``ply_file_path`` say, the points in front of the
camera, inside its image and nearest in their patch: :func:`visible_points`) are projected
with the batch's camera (the given pose, or the refined one of ``pose_opt``, detached; its
size, so that the resolution schedule's coarse steps fit too). The render's expected depth
(``RGB+ED``) is sampled bilinearly at their pixels, and the loss is gsplat's: the mean L1 of
the inverse depths, times the scene scale (so that it does not depend on the scene's unit),
times ``depth_lambda``, which decays exponentially to ``depth_lambda * depth_lambda_final``
by the last step (1: constant, as gsplat).

Where it runs: on the training device, per camera a projection of its points and a
``grid_sample`` of one [H, W] image. The points stay on the training device, [P_i, 3] per
training image: as many as the model's tracks hold, which the COLMAP reader bounds by the
file's size. The cameras must be pinhole (the only projection written here). In a
data-parallel job each rank takes the term of its cameras, averaged with the gradients; a
model-parallel job is refused (each rank renders every camera of the batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from .features import Feature, register_feature

if TYPE_CHECKING:
    from ..data.dataset import Frame, SceneDataset
    from .config import TrainConfig
    from .models.base import Cameras, Render

PATCH_PX = 4  # visible_points: the patch size of the nearest-point test, in pixels
SLACK = 0.05  # visible_points: how far behind the patch's nearest point a point still counts


def project(points: Tensor, viewmat: Tensor, K: Tensor) -> tuple[Tensor, Tensor]:
    """(pixels [P, 2], z-depths [P]) of world points [P, 3] seen by a pinhole camera
    (world-to-camera ``viewmat`` [4, 4], ``K`` [3, 3]); pixel (i, j) covers [i, i + 1)."""
    cam = points @ viewmat[:3, :3].T + viewmat[:3, 3]
    z = cam[:, 2]
    safe = torch.where(z.abs() > 1e-12, z, torch.ones_like(z))
    uv = torch.stack([K[0, 0] * cam[:, 0] / safe + K[0, 2],
                      K[1, 1] * cam[:, 1] / safe + K[1, 2]], dim=-1)
    return uv, z


def in_view(uv: Tensor, z: Tensor, width: int, height: int, near: float) -> Tensor:
    """[P] bool: in front of the near plane and inside the image."""
    return ((z > near) & (uv[:, 0] >= 0) & (uv[:, 0] < width) & (uv[:, 1] >= 0)
            & (uv[:, 1] < height))


def visible_points(points: Tensor, frame: Frame, near: float = 0.01) -> Tensor:
    """[M] int64 rows of ``points`` [P, 3] that ``frame`` plausibly sees, for a source
    without tracks: in front of it, inside its image, and within ``SLACK`` (relative) of the
    nearest such point in their ``PATCH_PX`` x ``PATCH_PX`` patch (a coarse z-buffer: a
    point behind a nearer surface is dropped)."""
    uv, z = project(points.float(), frame.viewmat.float(), frame.K.float())
    keep = in_view(uv, z, frame.width, frame.height, near)
    rows = torch.nonzero(keep)[:, 0]
    if len(rows) == 0:
        return rows
    cells_x = (frame.width + PATCH_PX - 1) // PATCH_PX
    cell = ((uv[rows, 1] // PATCH_PX).long() * cells_x + (uv[rows, 0] // PATCH_PX).long())
    n_cells = cells_x * ((frame.height + PATCH_PX - 1) // PATCH_PX)
    nearest = torch.full((n_cells,), float("inf")).scatter_reduce(0, cell, z[rows], "amin")
    return rows[z[rows] <= nearest[cell] * (1.0 + SLACK)]


@register_feature
class DepthPrior(Feature):
    """The depth prior of the sparse points (``depth_loss``), see the module docstring.

    Attributes:
        points: per training image, the world points [P_i, 3] it sees (on the device).
    """

    name = "depth_loss"
    needs_expected_depth: ClassVar[bool] = True

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        errors = []
        if cfg.depth_lambda < 0.0:
            errors.append(f"depth_lambda must be >= 0, got {cfg.depth_lambda}")
        if not 0.0 < cfg.depth_lambda_final <= 1.0:
            errors.append(f"depth_lambda_final must be in (0, 1], got {cfg.depth_lambda_final}")
        if cfg.depth_loss and cfg.parallel == "model":
            errors.append(
                "depth_loss is not supported with parallel = 'model' (every rank renders the "
                "whole batch, so the term would count once per rank); use parallel = 'data' "
                "or 'none'"
            )
        return errors

    @classmethod
    def from_config(cls, cfg: TrainConfig, dataset: SceneDataset, device: torch.device
                    ) -> DepthPrior | None:
        return cls(cfg, dataset, device) if cfg.depth_loss else None

    def __init__(self, cfg: TrainConfig, dataset: SceneDataset, device: torch.device) -> None:
        where = f"depth_loss: the dataset {dataset.path or ''}".rstrip()
        if dataset.points is None or len(dataset.points) == 0:
            raise ValueError(
                f"{where} has no sparse points (a COLMAP model's points3D, a transforms.json's "
                f"ply_file_path); depth_loss needs them"
            )
        other = [f.name for f in dataset.train if f.camera_model != "pinhole"]
        if other:
            raise ValueError(f"{where}: depth_loss supports pinhole cameras, {other[0]} is "
                             f"{dataset.train[0].camera_model}")
        points = dataset.points.float()
        self.points = []
        for f in dataset.train:
            ids = f.point_ids if f.point_ids is not None else visible_points(points, f,
                                                                             cfg.near_plane)
            self.points.append(points[ids.long()].to(device))
        if not any(len(p) for p in self.points):
            raise ValueError(f"{where}: no training image sees any of its sparse points")
        self.weight = cfg.depth_lambda
        self.decay = cfg.depth_lambda_final ** (1.0 / cfg.steps)
        self.scene_scale = float(dataset.scene_radius)
        self.near = cfg.near_plane

    def loss(self, out: Render, batch: Cameras, step: int) -> Tensor | None:
        """``depth_lambda(step)`` x scene scale x mean |1 / rendered depth - 1 / point depth|
        over the batch's points in view (None when none is)."""
        views = getattr(batch, "views", None)
        if views is None or out.depths is None or self.weight == 0.0:
            return None
        rendered, wanted = [], []
        for c, v in enumerate(views.tolist()):
            uv, z = project(self.points[v], batch.viewmats[c].detach(), batch.Ks[c])
            keep = in_view(uv, z, batch.width, batch.height, self.near)
            if not keep.any():
                continue
            uv, z = uv[keep], z[keep]
            # grid_sample, align_corners=True: -1 and 1 are the centres of the first and last
            # pixels, at 0.5 and size - 0.5
            grid = torch.stack([(uv[:, 0] - 0.5) / max(batch.width - 1, 1),
                                (uv[:, 1] - 0.5) / max(batch.height - 1, 1)], -1) * 2.0 - 1.0
            depth = out.depths[c].permute(2, 0, 1)[None]  # [1, 1, H, W]
            sampled = F.grid_sample(depth, grid[None, None], mode="bilinear",
                                    padding_mode="border", align_corners=True)[0, 0, 0]
            rendered.append(sampled)
            wanted.append(z)
        if not rendered:
            return None
        d = torch.cat(rendered)
        disparity = torch.where(d > 0.0, 1.0 / d.clamp_min(1e-10), torch.zeros_like(d))
        target = 1.0 / torch.cat(wanted)
        term = F.l1_loss(disparity, target) * self.scene_scale
        return self.weight * self.decay**step * term
