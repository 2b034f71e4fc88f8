"""Ready-made Gaussian scenes for rendering, tests and benchmarks.

- ``garden``: the real Mip-NeRF 360 garden point cloud and its 3 cameras (648×420), made into
  Gaussians (see ``assets/NOTICE.md`` for its licence).
- ``synthetic:N:WxH``: N random Gaussians in the unit ball seen by one camera.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from importlib import resources

import numpy as np
import torch
from torch import Tensor

from ..sh_rgb import rgb_to_sh0


@dataclass
class Scene:
    """Gaussians and cameras, all tensors on one device and dtype.

    Attributes:
        means: [N, 3] centres, world frame.
        quats: [N, 4] unit quaternions (w, x, y, z).
        scales: [N, 3] standard deviations along the principal axes.
        opacities: [N] in (0, 1).
        colors: [N, 3] RGB in [0, 1].
        viewmats: [C, 4, 4] world-to-camera (OpenCV: x right, y down, z forward).
        Ks: [C, 3, 3] pinhole intrinsics.
        width, height: image size in pixels.
    """

    name: str
    means: Tensor
    quats: Tensor
    scales: Tensor
    opacities: Tensor
    colors: Tensor
    viewmats: Tensor
    Ks: Tensor
    width: int
    height: int

    @property
    def num_gaussians(self) -> int:
        return int(self.means.shape[0])

    def sh_coeffs(self, degree: int, seed: int = 0, rest_scale: float = 0.02) -> Tensor:
        """SH coefficients [N, (degree+1)^2, 3] whose DC band reproduces ``colors``.

        Higher bands are small deterministic random values, so that every SH gradient is
        exercised.
        """
        n = self.num_gaussians
        k = (degree + 1) ** 2
        g = torch.Generator().manual_seed(seed)
        rest = torch.randn((n, k, 3), generator=g, dtype=torch.float64) * rest_scale
        coeffs = rest.to(device=self.means.device, dtype=self.means.dtype)
        coeffs[:, 0, :] = rgb_to_sh0(self.colors)
        return coeffs

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        """A copy with float tensors moved to ``device`` / ``dtype``."""

        def conv(t: Tensor) -> Tensor:
            return t.to(device=device, dtype=dtype if t.is_floating_point() else None)

        fields = ("means", "quats", "scales", "opacities", "colors", "viewmats", "Ks")
        return replace(self, **{f: conv(getattr(self, f)) for f in fields})


def _random_quats(n: int, rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def _density_scales(points: np.ndarray, cell: float) -> np.ndarray:
    """Per-point length scale from the number of points sharing a voxel of size ``cell``.

    A cheap, deterministic stand-in for the mean distance to the nearest neighbours: k points
    in a cell are about ``cell / k^(1/3)`` apart.
    """
    keys = np.floor(points / cell).astype(np.int64)
    _, inverse, counts = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    per_point = counts[inverse.reshape(-1)].astype(np.float64)
    return cell / np.cbrt(per_point)


def load_garden(
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    crop: float = 3.5,
    max_points: int | None = None,
    seed: int = 0,
) -> Scene:
    """The garden scene as Gaussians (deterministic for a given ``seed``).

    Args:
        crop: keep points with every coordinate within ``[-crop, crop]``.
        max_points: keep an evenly spaced subset of at most this many points.
    """
    with resources.files("tilesplat.assets").joinpath("garden_points.npz").open("rb") as f:
        data = np.load(f, allow_pickle=False)
        points = data["means3d"].astype(np.float64)
        rgb = data["colors"].astype(np.float64) / 255.0
        viewmats, Ks = data["viewmats"], data["Ks"]
        width, height = int(data["width"]), int(data["height"])
    keep = np.all(np.abs(points) <= crop, axis=1)
    points, rgb = points[keep], rgb[keep]
    if max_points is not None and len(points) > max_points:
        idx = np.linspace(0, len(points) - 1, max_points).round().astype(np.int64)
        points, rgb = points[idx], rgb[idx]
    rng = np.random.default_rng(seed)
    n = len(points)
    scale = np.clip(0.7 * _density_scales(points, cell=0.05), 0.002, 0.02)
    scales = scale[:, None] * rng.uniform(0.6, 1.2, size=(n, 3))
    return _scene(
        "garden", points, _random_quats(n, rng), scales, rng.uniform(0.5, 0.9, size=n), rgb,
        viewmats, Ks, width, height, device, dtype,
    )


def synthetic_scene(
    n: int,
    width: int,
    height: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    fov_degrees: float = 60.0,
) -> Scene:
    """N random Gaussians uniform in the unit ball, one camera at distance 3 looking at it."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=(n, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    points = direction * np.cbrt(rng.uniform(size=(n, 1)))
    spacing = (4.0 / 3.0 * math.pi / max(n, 1)) ** (1.0 / 3.0)
    scales = spacing * rng.uniform(0.3, 1.0, size=(n, 3))
    f = 0.5 * max(width, height) / math.tan(math.radians(fov_degrees) / 2)
    K = np.array([[f, 0, width / 2], [0, f, height / 2], [0, 0, 1]], dtype=np.float64)
    viewmat = np.eye(4)
    viewmat[2, 3] = 3.0  # camera at z = -3 looking along +z
    return _scene(
        f"synthetic:{n}:{width}x{height}", points, _random_quats(n, rng), scales,
        rng.uniform(0.3, 0.9, size=n), rng.uniform(0.0, 1.0, size=(n, 3)),
        viewmat[None], K[None], width, height, device, dtype,
    )


def _scene(name, means, quats, scales, opacities, colors, viewmats, Ks, width, height,
           device, dtype) -> Scene:
    def t(a) -> Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=device)

    return Scene(name, t(means), t(quats), t(scales), t(opacities), t(colors), t(viewmats),
                 t(Ks), int(width), int(height))


_SYNTHETIC = re.compile(r"^synthetic:(\d+):(\d+)x(\d+)$")


def load_scene(spec: str, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32) -> Scene:
    """A scene by name: ``garden`` or ``synthetic:N:WxH`` (e.g. ``synthetic:1000:64x48``)."""
    if spec == "garden":
        return load_garden(device=device, dtype=dtype)
    m = _SYNTHETIC.match(spec)
    if m is None:
        raise ValueError(f"scene must be 'garden' or 'synthetic:N:WxH', got {spec!r}")
    n, w, h = (int(x) for x in m.groups())
    if w <= 0 or h <= 0:
        raise ValueError(f"scene size must be positive, got {w}x{h}")
    return synthetic_scene(n, w, h, device=device, dtype=dtype)
