"""Shared by the pose-refinement tests: training poses with a known error, and the error of a
set of poses against the truth once the gauge (the whole scene's rigid motion) is removed."""

from __future__ import annotations

import dataclasses
import math

import torch

from tilesplat.data.dataset import Frame
from tilesplat.train.features.pose_opt import axis_angle_to_matrix


def perturb_poses(frames: list[Frame], degrees: tuple[float, float] = (0.5, 1.0),
                  shift: float = 0.01, distance: float = 1.0, seed: int = 0) -> list[Frame]:
    """``frames`` at wrong poses: each camera turned by an angle drawn uniformly in
    ``degrees`` about a random axis and moved by ``shift`` x ``distance`` in a random
    direction (in its own frame: ``viewmat' = [R | t] @ viewmat``), seeded."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for f in frames:
        axis = torch.nn.functional.normalize(torch.randn(3, generator=gen, dtype=torch.float64),
                                             dim=0)
        angle = math.radians(degrees[0] + (degrees[1] - degrees[0])
                             * float(torch.rand(1, generator=gen, dtype=torch.float64)))
        move = torch.nn.functional.normalize(torch.randn(3, generator=gen, dtype=torch.float64),
                                             dim=0) * shift * distance
        wrong = torch.eye(4, dtype=torch.float64)
        wrong[:3, :3] = axis_angle_to_matrix((axis * angle)[None])[0]
        wrong[:3, 3] = move
        out.append(dataclasses.replace(f, viewmat=(wrong @ f.viewmat.double()).float()))
    return out


def centres(viewmats: torch.Tensor) -> torch.Tensor:
    """[N, 3] camera centres of world-to-camera matrices [N, 4, 4]."""
    R, t = viewmats[:, :3, :3], viewmats[:, :3, 3]
    return -(R.transpose(1, 2) @ t[..., None])[..., 0]


def pose_errors(est: torch.Tensor, truth: torch.Tensor) -> tuple[float, float]:
    """(mean rotation error in degrees, mean centre error) of world-to-camera matrices
    ``est`` [N, 4, 4] against ``truth`` (:func:`camera_errors`)."""
    rot, centre = camera_errors(est, truth)
    return float(rot.mean()), float(centre.mean())


def camera_errors(est: torch.Tensor, truth: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([N] rotation errors in degrees, [N] centre errors) of world-to-camera matrices ``est``
    [N, 4, 4] against ``truth``, after moving ``est`` by the rigid motion that best fits its
    centres to the truth's (Kabsch): the whole scene may drift in a refinement, which changes
    no image and is no error."""
    est, truth = est.double(), truth.double()
    ce, ct = centres(est), centres(truth)
    me, mt = ce.mean(0), ct.mean(0)
    u, _, vt = torch.linalg.svd((ce - me).T @ (ct - mt))
    d = torch.sign(torch.det(vt.T @ u.T))
    align = vt.T @ torch.diag(torch.tensor([1.0, 1.0, float(d)], dtype=torch.float64)) @ u.T
    centre_err = ((ce - me) @ align.T + mt - ct).norm(dim=1)
    # camera-to-world rotations: truth R_t^T against the aligned align @ R_e^T
    rel = truth[:, :3, :3] @ align @ est[:, :3, :3].transpose(1, 2)
    cos = ((rel.diagonal(dim1=1, dim2=2).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos)), centre_err
