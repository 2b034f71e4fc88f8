"""Shared by the pose-refinement tests: training poses with a known error, and the error of a
set of poses against the truth once the gauge (the whole scene's rigid motion) is removed."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
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


def rotation_aligned_errors(est: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[N] rotation errors in degrees of world-to-camera matrices ``est`` [N, 4, 4] against
    ``truth`` after the one rotation of the world that best fits the estimated camera
    orientations to the true ones (the chordal L2 mean of the relative rotations): the
    gauge fixed by the rotations instead of the centres."""
    est, truth = est.double(), truth.double()
    rel = truth[:, :3, :3].transpose(1, 2) @ est[:, :3, :3]  # R_t^T R_e: world rotation per camera
    u, _, vt = torch.linalg.svd(rel.sum(0))
    d = torch.sign(torch.det(u @ vt))
    mean = u @ torch.diag(torch.tensor([1.0, 1.0, float(d)], dtype=torch.float64)) @ vt
    rel = truth[:, :3, :3] @ mean @ est[:, :3, :3].transpose(1, 2)
    cos = ((rel.diagonal(dim1=1, dim2=2).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos))


def unaligned_rotation_errors(est: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[N] rotation errors in degrees of world-to-camera matrices ``est`` [N, 4, 4] against
    ``truth`` as they are, with no alignment: the gauge is the one the initial points fix."""
    rel = truth[:, :3, :3].double() @ est[:, :3, :3].double().transpose(1, 2)
    cos = ((rel.diagonal(dim1=1, dim2=2).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos))


def relative_rotation_errors(est: torch.Tensor, truth: torch.Tensor) -> torch.Tensor:
    """[N - 1] rotation errors in degrees of the relative rotations of consecutive cameras
    (RPE's rotation part, Sturm et al. 2012; no alignment: the whole scene's motion cancels)
    of world-to-camera matrices ``est`` [N, 4, 4] against ``truth``."""
    est, truth = est[:, :3, :3].double(), truth[:, :3, :3].double()
    rel_e = est[1:] @ est[:-1].transpose(1, 2)
    rel_t = truth[1:] @ truth[:-1].transpose(1, 2)
    diff = rel_t @ rel_e.transpose(1, 2)
    cos = ((diff.diagonal(dim1=1, dim2=2).sum(-1) - 1.0) / 2.0).clamp(-1.0, 1.0)
    return torch.rad2deg(torch.acos(cos))


def outward_poses(n: int = 24, seed: int = 3) -> np.ndarray:
    """[n, 4, 4] world-to-camera (OpenCV axes) of the outward-looking capture: a ring of
    cameras 1.1-1.4 m from the room's centre (tilesplat.data.room), 0.9-1.3 m high, each
    looking out at the walls (1.6-2.5 m away) and slightly down, seeded."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, 4, 4))
    for i in range(n):
        a = 2 * np.pi * i / n + rng.uniform(-0.05, 0.05)
        r = rng.uniform(1.1, 1.4)
        eye = np.array([r * np.cos(a), r * np.sin(a), rng.uniform(0.9, 1.3)])
        j = a + rng.uniform(-0.15, 0.15)
        fwd = np.array([np.cos(j), np.sin(j), rng.uniform(-0.35, -0.1)])
        fwd /= np.linalg.norm(fwd)
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        R = np.stack([right, np.cross(fwd, right), fwd])
        out[i, :3, :3], out[i, :3, 3], out[i, 3, 3] = R, -R @ eye, 1.0
    return out
