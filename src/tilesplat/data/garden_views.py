"""The second built-in scene: the bundled garden Gaussians rendered along a smooth path near
their cameras, written once as a COLMAP dataset (``synthetic_scene = "garden"``).

The ray-cast scene (:mod:`.synthetic`) is clean and simple; this one has real textures and
floaters: the Mip-NeRF 360 garden points of ``assets/garden_points.npz`` as Gaussians
(:func:`.scenes.load_garden`), rendered by the CPU rasterizer from cameras on the arc through
the three real cameras' centres, all looking at the point nearest to their optical axes,
spread evenly over the arc (a tenth wider than the cameras' span on each side) and named in
that order, so that the COLMAP reader's ``test_every`` takes evenly spread test views. The
COLMAP model holds PINHOLE cameras and, as the initial points a structure-from-motion run
would give, an evenly spaced subset of the garden points with some noise.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from ..io.atomic import atomic_write_bytes
from ..io.images import write_png
from ..rendering import rasterization
from .frames import look_at_point
from .scenes import load_garden

FORMAT_VERSION = 1
MARKER = "tilesplat_garden_views.json"
SCALE = 0.5  # of the garden cameras' 648 x 420
SPAN_MARGIN = 0.1  # the arc extends this fraction of the cameras' span beyond them
SFM_POINTS = 10_000  # initial points: this many garden points
SFM_NOISE = 0.01  # with this much noise (scene units, the garden's extent is ~7)


def _circle(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(centre, unit u, unit v) of the circle through three points [3, 3], u towards the
    first: point(a) = centre + r (cos a u + sin a v)."""
    a, b, c = points
    n = np.cross(b - a, c - a)
    n /= np.linalg.norm(n)
    # circumcentre in the plane of the three points
    ab, ac = b - a, c - a
    m = np.stack([ab, ac, n])
    rhs = np.array([ab @ (a + b) / 2, ac @ (a + c) / 2, n @ a])
    centre = np.linalg.solve(m, rhs)
    u = (a - centre) / np.linalg.norm(a - centre)
    return centre, u, np.cross(n, u)


def camera_path(viewmats: np.ndarray, n: int) -> np.ndarray:
    """[n, 4, 4] world-to-camera (OpenCV axes), evenly spaced on the arc through the centres of
    the three cameras ``viewmats`` [3, 4, 4], looking at their look-at point."""
    R, t = viewmats[:, :3, :3], viewmats[:, :3, 3]
    centres = -np.einsum("cji,cj->ci", R, t)
    target = look_at_point(centres, R[:, 2, :])
    up = -R[:, 1, :].mean(0)  # OpenCV's y points down
    centre, u, v = _circle(centres)
    radius = float(np.linalg.norm(centres[0] - centre))
    angles = np.unwrap(np.arctan2((centres - centre) @ v, (centres - centre) @ u))
    lo, hi = angles.min(), angles.max()
    pad = SPAN_MARGIN * (hi - lo)
    out = np.zeros((n, 4, 4))
    for i in range(n):
        a = lo - pad + (hi - lo + 2 * pad) * i / max(n - 1, 1)
        eye = centre + radius * (math.cos(a) * u + math.sin(a) * v)
        fwd = (target - eye) / np.linalg.norm(target - eye)
        right = np.cross(fwd, up)
        right /= np.linalg.norm(right)
        down = np.cross(fwd, right)
        rot = np.stack([right, down, fwd])
        out[i, :3, :3] = rot
        out[i, :3, 3] = -rot @ eye
        out[i, 3, 3] = 1.0
    return out


def _qvec(rot: np.ndarray) -> np.ndarray:
    """(w, x, y, z) unit quaternion of a rotation matrix [3, 3] (COLMAP's convention)."""
    w = math.sqrt(max(0.0, 1.0 + rot[0, 0] + rot[1, 1] + rot[2, 2])) / 2
    x = math.copysign(math.sqrt(max(0.0, 1.0 + rot[0, 0] - rot[1, 1] - rot[2, 2])) / 2,
                      rot[2, 1] - rot[1, 2])
    y = math.copysign(math.sqrt(max(0.0, 1.0 - rot[0, 0] + rot[1, 1] - rot[2, 2])) / 2,
                      rot[0, 2] - rot[2, 0])
    z = math.copysign(math.sqrt(max(0.0, 1.0 - rot[0, 0] - rot[1, 1] + rot[2, 2])) / 2,
                      rot[1, 0] - rot[0, 1])
    q = np.array([w, x, y, z])
    return q / np.linalg.norm(q)


def _params(n_views: int, max_points: int | None) -> dict:
    return {"version": FORMAT_VERSION, "n_views": n_views, "max_points": max_points,
            "scale": SCALE}


def _is_complete(out: Path, params: dict, n: int) -> bool:
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker == {**params, "complete": True} and all(
        (out / "images" / f"view_{i:04d}.png").is_file() for i in range(n)
    ) and (out / "sparse" / "0" / "points3D.txt").is_file()


def write_garden_views_dataset(
    out_dir: str | Path, *, n_views: int = 120, max_points: int | None = None
) -> Path:
    """Write (or reuse) the garden-views scene as a COLMAP dataset in ``out_dir``: ``n_views``
    images ``images/view_NNNN.png`` in path order (the reader's ``test_every`` splits them).

    ``max_points`` renders an evenly spaced subset of the garden (the tests' small variant).
    An existing complete dataset written with the same arguments is reused; a folder holding
    anything else is refused.
    """
    if n_views < 2:
        raise ValueError(f"need n_views >= 2, got {n_views}")
    out = Path(out_dir)
    params = _params(n_views, max_points)
    views = n_views
    if _is_complete(out, params, views):
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ValueError(f"{out} exists and is not a tilesplat garden-views dataset; choose "
                         "another folder")
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / MARKER, json.dumps({**params, "complete": False}).encode())
    garden = load_garden(max_points=max_points)
    width, height = round(garden.width * SCALE), round(garden.height * SCALE)
    K = garden.Ks[0].double().numpy().copy()
    K[:2] *= SCALE
    viewmats = camera_path(garden.viewmats.double().numpy(), views)
    images = []
    for i in range(views):
        vm = torch.as_tensor(viewmats[i], dtype=torch.float32)[None]
        with torch.no_grad():
            rgb, _, _ = rasterization(
                garden.means, garden.quats, garden.scales, garden.opacities, garden.colors,
                vm, torch.as_tensor(K, dtype=torch.float32)[None], width, height,
                packed=False, backend="cpu",
            )
        name = f"view_{i:04d}.png"
        write_png(out / "images" / name, rgb[0].clamp(0.0, 1.0).numpy())
        q, t = _qvec(viewmats[i, :3, :3]), viewmats[i, :3, 3]
        images.append(f"{i + 1} {' '.join(f'{x:.12g}' for x in (*q, *t))} 1 {name}\n\n")
    fx, fy, cx, cy = K[0, 0], K[1, 1], K[0, 2], K[1, 2]
    sparse = out / "sparse" / "0"
    atomic_write_bytes(sparse / "cameras.txt",
                       f"1 PINHOLE {width} {height} {fx:.12g} {fy:.12g} {cx:.12g} {cy:.12g}\n"
                       .encode())
    atomic_write_bytes(sparse / "images.txt", "".join(images).encode())
    pts = garden.means.double().numpy()
    rgb8 = np.round(garden.colors.double().numpy() * 255).astype(np.int64)
    idx = np.linspace(0, len(pts) - 1, min(SFM_POINTS, len(pts))).round().astype(np.int64)
    noisy = pts[idx] + np.random.default_rng(0).normal(0.0, SFM_NOISE, size=(len(idx), 3))
    lines = [f"{j + 1} {p[0]:.9g} {p[1]:.9g} {p[2]:.9g} {c[0]} {c[1]} {c[2]} 0\n"
             for j, (p, c) in enumerate(zip(noisy, rgb8[idx], strict=True))]
    atomic_write_bytes(sparse / "points3D.txt", "".join(lines).encode())
    atomic_write_bytes(out / MARKER, json.dumps({**params, "complete": True}).encode())
    return out
