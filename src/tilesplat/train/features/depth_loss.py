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

Where it runs: on the training device, a projection of the batch's points and one
``grid_sample``, with no host sync. The points stay on the training device, a padded [N, P, 3]
table of the N training images' points: as many as the tracks hold (which the COLMAP reader
bounds by the file's size), at most ``MAX_POINTS`` per image (a seeded subsample beyond).
The cameras must be pinhole (the only projection written here). In a data-parallel job
each rank takes the term of its cameras, averaged with the gradients; a model-parallel job is
refused (each rank renders every camera of the batch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ...keys import Key
from .base import Feature, register_feature

if TYPE_CHECKING:
    from ...data.dataset import Frame, SceneDataset
    from ..config import TrainConfig
    from ..models.base import Cameras, Render

PATCH_PX = 4  # visible_points: the patch size of the nearest-point test, in pixels
SLACK = 0.05  # visible_points: how far behind the patch's nearest point a point still counts
MAX_POINTS = 1 << 15  # the most points of one image the prior keeps (a seeded subsample)


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
        points: [N, P, 3] per training image the world points it sees, padded to the most
            any image sees (at most ``MAX_POINTS``), on the device; valid: [N, P] bool, the
            real ones.
    """

    name = "depth_loss"
    needs_expected_depth: ClassVar[bool] = True

    SWITCH = "depth_loss"
    WHOLE_MODEL = "every rank renders the whole batch, so the term would count once per rank"
    KEYS: ClassVar[tuple[Key, ...]] = (
        Key("depth_loss", False, "pull the expected depth towards the sparse points each "
            "training image sees (COLMAP's tracks, a transforms.json's ply_file_path): "
            "inverse-depth L1, gsplat's depth_loss"),
        Key("depth_lambda", 1e-2, "depth_loss: weight of the term, gsplat's default", ge=0.0),
        Key("depth_lambda_final", 1.0, "depth_loss: factor the weight decays to by the last step "
            "(exponentially; 1: constant, as gsplat)", gt=0.0, le=1.0),
    )

    def __init__(self, cfg: TrainConfig, dataset: SceneDataset, device: torch.device) -> None:
        where = f"depth_loss: the dataset {dataset.path or ''}".rstrip()
        if dataset.points is None or len(dataset.points) == 0:
            raise ValueError(
                f"{where} has no sparse points (a COLMAP model's points3D, a transforms.json's "
                f"ply_file_path); depth_loss needs them"
            )
        other = [f for f in dataset.train if f.camera_model != "pinhole"]
        if other:
            raise ValueError(f"{where}: depth_loss supports pinhole cameras, {other[0].name} "
                             f"is {other[0].camera_model}")
        points = dataset.points.float()
        rows = []
        for i, f in enumerate(dataset.train):
            ids = f.point_ids if f.point_ids is not None else visible_points(points, f,
                                                                             cfg.near_plane)
            ids = ids.long()
            if len(ids) > MAX_POINTS:  # a seeded subsample bounds the padded table
                gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + i)
                ids = ids[torch.randperm(len(ids), generator=gen)[:MAX_POINTS]]
            rows.append(ids)
        if not any(len(r) for r in rows):
            raise ValueError(f"{where}: no training image sees any of its sparse points")
        # [N, P, 3] the points of each training image, padded; [N, P] which are real
        width = max(len(r) for r in rows)
        self.points = torch.zeros((len(rows), width, 3))
        self.valid = torch.zeros((len(rows), width), dtype=torch.bool)
        for i, r in enumerate(rows):
            self.points[i, :len(r)] = points[r]
            self.valid[i, :len(r)] = True
        self.points, self.valid = self.points.to(device), self.valid.to(device)
        self.weight = cfg.depth_lambda
        self.decay = cfg.depth_lambda_final ** (1.0 / cfg.steps)
        self.scene_scale = float(dataset.scene_radius)
        self.near = cfg.near_plane

    def loss(self, out: Render, batch: Cameras, step: int) -> Tensor | None:
        """``depth_lambda(step)`` x scene scale x mean |1 / rendered depth - 1 / point depth|
        over the batch's points in view (zero when none is). All on the device, no host
        sync."""
        views = getattr(batch, "views", None)
        if views is None or out.depths is None or self.weight == 0.0:
            return None
        pts = self.points[views]  # [C, P, 3]
        vm = batch.viewmats.detach()
        cam = pts @ vm[:, :3, :3].transpose(1, 2) + vm[:, None, :3, 3]  # [C, P, 3]
        z = cam[..., 2]
        safe = torch.where(z.abs() > 1e-12, z, torch.ones_like(z))
        K = batch.Ks
        u = K[:, None, 0, 0] * cam[..., 0] / safe + K[:, None, 0, 2]
        v = K[:, None, 1, 1] * cam[..., 1] / safe + K[:, None, 1, 2]
        keep = (self.valid[views] & (z > self.near) & (u >= 0) & (u < batch.width) & (v >= 0)
                & (v < batch.height))
        # grid_sample, align_corners=True: -1 and 1 are the centres of the first and last
        # pixels, at 0.5 and size - 0.5
        grid = torch.stack([(u - 0.5) / max(batch.width - 1, 1),
                            (v - 0.5) / max(batch.height - 1, 1)], -1) * 2.0 - 1.0
        sampled = F.grid_sample(out.depths.permute(0, 3, 1, 2), grid[:, None], mode="bilinear",
                                padding_mode="border", align_corners=True)[:, 0, 0]  # [C, P]
        disparity = torch.where(sampled > 0.0, 1.0 / sampled.clamp_min(1e-10),
                                torch.zeros_like(sampled))
        target = 1.0 / torch.where(keep, z, torch.ones_like(z))
        err = torch.where(keep, (disparity - target).abs(), torch.zeros_like(z))
        term = err.sum() / keep.sum().clamp_min(1) * self.scene_scale
        return self.weight * self.decay**step * term
