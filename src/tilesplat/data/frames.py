"""The types every loader returns and the trainer consumes, with the helpers loaders share.

Every loader returns a :class:`SceneDataset` of :class:`Frame` objects in one convention:
world-to-camera matrices in OpenCV axes (x right, y down, z forward), pinhole intrinsics
already scaled to the loaded image size, float32 images in [0, 1].

This module is the bottom of the data floor: the loaders (``blender``, ``colmap``) import it,
and ``dataset`` imports the loaders, so no data module imports one that imports it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch


@dataclass
class Frame:
    """One posed image.

    Attributes:
        name: image file stem.
        viewmat: [4, 4] float32 world-to-camera, OpenCV axes (x right, y down, z forward).
        K: [3, 3] float32 pinhole intrinsics, scaled by the downscale factor.
        width, height: image size in pixels.
        image: [H, W, 3] float32 in [0, 1], already composited on the background for RGBA.
        alpha: [H, W, 1] float32 when the source had alpha, else None.
    """

    name: str
    viewmat: torch.Tensor
    K: torch.Tensor
    width: int
    height: int
    image: torch.Tensor
    alpha: torch.Tensor | None

    @property
    def camera_center(self) -> torch.Tensor:
        """[3] camera position in world coordinates."""
        R = self.viewmat[:3, :3].double()
        t = self.viewmat[:3, 3].double()
        return (-R.T @ t).float()


@dataclass
class SceneDataset:
    """Train and test frames of one scene.

    Attributes:
        train, test: posed frames.
        points: [P, 3] float32 initial points (COLMAP), None for Blender or an empty model.
        points_rgb: [P, 3] float32 in [0, 1], None when ``points`` is.
        scene_center: [3] float32. Blender: the point nearest to all optical axes (the look-at
            point); COLMAP: the mean of the camera centres (3DGS's convention).
        scene_radius: 1.1 x the largest distance from ``scene_center`` to a train camera (3DGS's
            ``cameras_extent``, which scales the means' learning rate and densification).
        background: compositing colour of RGBA images (Blender), else (0, 0, 0).
        kind: "blender" or "colmap".
        path: the dataset folder.
    """

    train: list[Frame]
    test: list[Frame]
    points: torch.Tensor | None
    points_rgb: torch.Tensor | None
    scene_center: torch.Tensor
    scene_radius: float
    background: tuple[float, float, float]
    kind: str = ""
    path: Path | None = None


def split_every(names: list[str], test_every: int) -> tuple[list[int], list[int]]:
    """Indices (train, test) of ``names`` sorted by name; test = every ``test_every``-th."""
    order = sorted(range(len(names)), key=lambda i: names[i])
    if test_every <= 0:
        return order, []
    train = [i for j, i in enumerate(order) if j % test_every != 0]
    test = [i for j, i in enumerate(order) if j % test_every == 0]
    return train, test


def cameras_extent(centers: np.ndarray, center: np.ndarray) -> float:
    """1.1 x the largest distance of ``centers`` [C, 3] from ``center`` [3] (3DGS)."""
    if len(centers) == 0:
        return 1.0
    radius = float(np.linalg.norm(centers - center[None], axis=1).max()) * 1.1
    return radius if radius > 0 else 1.0


def look_at_point(centers: np.ndarray, forwards: np.ndarray) -> np.ndarray:
    """Least-squares point nearest to the optical axes (rays ``centers`` [C,3] + t ``forwards``).

    Falls back to the mean of the centres when the axes are (nearly) parallel.
    """
    d = forwards / np.linalg.norm(forwards, axis=1, keepdims=True)
    proj = np.eye(3)[None] - d[:, :, None] * d[:, None, :]  # [C, 3, 3] onto the axis normal
    A = proj.sum(0)
    b = (proj @ centers[:, :, None]).sum(0)[:, 0]
    if len(centers) < 2 or np.linalg.cond(A) > 1e6:
        return centers.mean(0)
    return np.linalg.solve(A, b)


def image_to_tensors(
    rgba: np.ndarray, background: tuple[float, float, float]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split a float [H, W, 3|4] image into (rgb [H,W,3] composited, alpha [H,W,1] | None)."""
    if rgba.shape[2] == 4:
        alpha = rgba[:, :, 3:4]
        bg = np.asarray(background, dtype=np.float32)
        rgb = rgba[:, :, :3] * alpha + bg * (1.0 - alpha)
        return (
            torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(alpha, dtype=np.float32)),
        )
    return torch.from_numpy(np.ascontiguousarray(rgba[:, :, :3], dtype=np.float32)), None
