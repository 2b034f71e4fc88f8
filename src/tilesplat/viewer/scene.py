"""What the viewer shows, without viser: Gaussians, browser cameras and tilesplat's render.

The Gaussians are the trainer's parameters by gsplat's names, as :mod:`tilesplat.io.gaussians`
reads them (``means`` [N, 3], ``scales`` [N, 3] log, ``quats`` [N, 4] (w, x, y, z),
``opacities`` [N] logits, ``sh0`` [N, 1, 3], ``shN`` [N, K - 1, 3]). A browser camera is
viser's: ``wxyz`` and ``position`` of camera-to-world with OpenCV axes (x right, y down, z
forward, the frame of tilesplat's viewmats) and a vertical field of view in radians.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..io.gaussians import SPLAT_KEYS
from ..rendering import rasterization
from ..sh_rgb import sh0_to_rgb
from .lens import ViewLens

VIEW_MODES = ("RGB", "depth", "alpha")
Gaussians = dict[str, Tensor]


def gaussians_from_params(params: dict[str, Tensor]) -> Gaussians:
    """The trainer's parameters (``means``, ``scales``, ``quats``, ``opacities``, ``sh0``,
    ``shN``) as viewer Gaussians: detached float32 CPU copies."""
    with torch.no_grad():
        return {k: params[k].detach().to("cpu", torch.float32).clone() for k in SPLAT_KEYS}


def sh_degree_of(g: Gaussians) -> int:
    """The SH degree of ``shN`` [N, K - 1, 3]: sqrt(K) - 1."""
    return math.isqrt(int(g["shN"].shape[1]) + 1) - 1


@dataclass
class SplatBuffers:
    """What viser's ``add_gaussian_splats`` draws: colour is the degree-0 term only.

    Attributes:
        centers: [N, 3]; covariances: [N, 3, 3]; rgbs: [N, 3] in [0, 1]; opacities: [N, 1].
    """

    centers: np.ndarray
    covariances: np.ndarray
    rgbs: np.ndarray
    opacities: np.ndarray


def splat_buffers(g: Gaussians) -> SplatBuffers:
    """World covariances R diag(s^2) R^T and base colours of the Gaussians (float32)."""
    with torch.no_grad():
        q = torch.nn.functional.normalize(g["quats"].double(), dim=-1)
        w, x, y, z = q.unbind(-1)
        rot = torch.stack(
            [
                1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
                2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
                2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
            ],
            dim=-1,
        ).reshape(-1, 3, 3)  # fmt: skip
        m = rot * torch.exp(g["scales"].double())[:, None, :]
        cov = m @ m.transpose(1, 2)
        rgb = sh0_to_rgb(g["sh0"][:, 0, :]).clamp(0.0, 1.0)
        opacity = torch.sigmoid(g["opacities"])[:, None]
    return SplatBuffers(
        g["means"].numpy().astype(np.float32),
        cov.numpy().astype(np.float32),
        rgb.numpy().astype(np.float32),
        opacity.numpy().astype(np.float32),
    )


def viewmat_from_pose(wxyz: Sequence[float], position: Sequence[float]) -> np.ndarray:
    """World-to-camera [4, 4] of a camera-to-world pose (OpenCV axes), float64."""
    w, x, y, z = np.asarray(wxyz, np.float64) / np.linalg.norm(np.asarray(wxyz, np.float64))
    rot = np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )
    view = np.eye(4)
    view[:3, :3] = rot.T
    view[:3, 3] = -rot.T @ np.asarray(position, np.float64)
    return view


def intrinsics(fov_y: float, width: int, height: int) -> np.ndarray:
    """Pinhole K [3, 3] of a vertical field of view (radians) and an image size."""
    focal = 0.5 * height / math.tan(0.5 * fov_y)
    return np.array([[focal, 0.0, 0.5 * width], [0.0, focal, 0.5 * height], [0.0, 0.0, 1.0]])


def look_at_pose(eye: Sequence[float], target: Sequence[float], up: Sequence[float]) -> tuple:
    """(wxyz, position) of a camera at ``eye`` looking at ``target`` (OpenCV axes; ``up`` is
    the world direction that appears upward)."""
    eye_v, target_v = np.asarray(eye, np.float64), np.asarray(target, np.float64)
    fwd = target_v - eye_v
    fwd /= np.linalg.norm(fwd)
    right = np.cross(fwd, np.asarray(up, np.float64))
    right /= np.linalg.norm(right)
    down = np.cross(fwd, right)
    rot = np.stack([right, down, fwd], axis=1)  # columns: camera axes in the world
    return rotation_to_wxyz(rot), eye_v


def rotation_to_wxyz(rot: np.ndarray) -> np.ndarray:
    """Unit quaternion (w, x, y, z) of a rotation matrix [3, 3]."""
    m = np.asarray(rot, np.float64)
    tr = np.trace(m)
    if tr > 0:
        s = 2.0 * math.sqrt(tr + 1.0)
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(m)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(max(1.0 + m[i, i] - m[j, j] - m[k, k], 1e-12))
        q = [0.0, 0.0, 0.0, 0.0]
        q[0] = (m[k, j] - m[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (m[j, i] + m[i, j]) / s
        q[1 + k] = (m[k, i] + m[i, k]) / s
    out = np.asarray(q)
    return out / np.linalg.norm(out)


@torch.no_grad()
def render_view(
    g: Gaussians,
    viewmat: np.ndarray,  # [4, 4] world-to-camera
    K: np.ndarray,  # [3, 3]
    width: int,
    height: int,
    mode: str = "RGB",
    backend: str = "auto",
    background: Sequence[float] = (1.0, 1.0, 1.0),
    antialiased: bool = False,
    lens: ViewLens | None = None,
) -> np.ndarray:
    """tilesplat's render of one camera, view-dependent colour at the model's SH degree;
    through a capture's ``lens`` (3DGUT) when given, else a pinhole.

    ``mode`` RGB: the colour composited on ``background``; depth: expected depth, nearest
    white to farthest black (0.5th-99.5th percentile of covered pixels), background black;
    alpha: coverage as grey.

    Returns:
        [height, width, 3] uint8.
    """
    if mode not in VIEW_MODES:
        raise ValueError(f"mode must be one of {list(VIEW_MODES)}, got {mode!r}")
    render_mode = {"RGB": "RGB", "depth": "ED", "alpha": "ED"}[mode]
    bg = torch.tensor([list(background)], dtype=torch.float32) if mode == "RGB" else None
    out, alpha, _ = rasterization(
        means=g["means"],
        quats=g["quats"],
        scales=torch.exp(g["scales"]),
        opacities=torch.sigmoid(g["opacities"]),
        colors=torch.cat([g["sh0"], g["shN"]], dim=1),
        viewmats=torch.as_tensor(viewmat, dtype=torch.float32)[None],
        Ks=torch.as_tensor(K, dtype=torch.float32)[None],
        width=width,
        height=height,
        sh_degree=sh_degree_of(g),
        packed=False,
        backgrounds=bg,
        render_mode=render_mode,
        rasterize_mode="antialiased" if antialiased else "classic",
        backend=backend,
        **({} if lens is None else lens.render_kwargs()),
    )
    if mode == "RGB":
        image = out[0].clamp(0.0, 1.0)
    elif mode == "alpha":
        image = alpha[0].expand(height, width, 3)
    else:
        image = depth_image(out[0, :, :, 0], alpha[0, :, :, 0])
    return (image * 255.0 + 0.5).clamp(0, 255).to(torch.uint8).numpy()


def depth_image(depth: Tensor, alpha: Tensor) -> Tensor:
    """Depth [H, W] as grey [H, W, 3] in [0, 1]: near white, far black, uncovered black."""
    covered = alpha > 0.5
    if not bool(covered.any()):
        return torch.zeros(*depth.shape, 3)
    vals = depth[covered]
    lo, hi = torch.quantile(vals, 0.005), torch.quantile(vals, 0.995)
    grey = ((hi - depth) / (hi - lo).clamp_min(1e-9)).clamp(0.0, 1.0)
    grey = torch.where(covered, grey, torch.zeros_like(grey))
    return grey[:, :, None].expand(*depth.shape, 3)


def default_pose(g: Gaussians) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(wxyz, position, look-at) of a camera that sees the Gaussians' central 90 % from
    outside: at the median, 2.5x their spread away along -z (world), y down."""
    means = g["means"].double()
    lo = torch.quantile(means, 0.05, dim=0)
    hi = torch.quantile(means, 0.95, dim=0)
    centre = ((lo + hi) / 2).numpy()
    extent = float((hi - lo).max().clamp_min(1e-6))
    eye = centre - np.array([0.0, 0.0, 2.5 * extent])
    wxyz, pos = look_at_pose(eye, centre, up=(0.0, -1.0, 0.0))
    return wxyz, pos, centre
