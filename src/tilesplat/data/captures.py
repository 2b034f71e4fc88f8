"""Captures of the textured room (:mod:`.room`) through any COLMAP lens, written as COLMAP
datasets: what the tests and benchmarks of the undistortion, the fisheye camera, the masks and
the nerfstudio reader train on, made by code and never splatted.

Every pixel averages 2x2 rays, each traced back through the lens with
:func:`.camera_models.ray_from_img` (COLMAP's inverse of the distortion), so a distorted
capture and its pinhole twin see the same scene from the same poses. A capture may carry a
:class:`Distractor` per view (a flat-coloured ball that moves between views, as a passer-by
would) and the masks that hide it (COLMAP's ``masks/<image name>.png``, black on every pixel
one of whose rays meets the ball). A capture may be weakly textured (``contrast`` < 1), and its
sparse points may carry their tracks (:func:`observations`: every view where a point is in the
image and not hidden), as the depth prior reads them; :func:`scene_depth` gives the true depth
of every pixel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..io.images import write_png
from . import camera_models as cm
from . import room
from .colmap_format import COLMAP_MODELS_BY_NAME, ColmapCamera, ColmapImage
from .colmap_write import rotmat_to_qvec, write_model
from .synthetic import _sphere
from .undistort import Camera

SUBPIXELS = ((0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75))


@dataclass(frozen=True)
class Distractor:
    """A ball of one colour at ``center`` [3] (world, m) with ``radius``."""

    center: tuple[float, float, float]
    radius: float
    color: tuple[float, float, float] = (0.95, 0.1, 0.85)


def pinhole_camera(width: int, height: int) -> Camera:
    """The room's pinhole camera (:func:`.room.intrinsics`) as a PINHOLE Camera."""
    K = room.intrinsics(width, height)
    return Camera("PINHOLE", width, height, (K[0, 0], K[1, 1], K[0, 2], K[1, 2]))


def orbit(n: int, degrees: float = 300.0, radius: float = 1.85) -> np.ndarray:
    """[n, 4, 4] world-to-camera matrices (OpenCV axes) of a smooth walk around the room's
    object, ``degrees`` of azimuth at ``radius``, bobbing in height, looking at its middle:
    the frames of a video."""
    out = np.zeros((n, 4, 4))
    for i in range(n):
        a = np.radians(degrees) * i / max(n - 1, 1)
        eye = np.array([radius * np.cos(a), radius * np.sin(a), 1.05 + 0.15 * np.sin(3 * a)])
        fwd = (room.TARGET - eye) / np.linalg.norm(room.TARGET - eye)
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        R = np.stack([right, np.cross(fwd, right), fwd])
        out[i, :3, :3], out[i, :3, 3], out[i, 3, 3] = R, -R @ eye, 1.0
    return out


def _world_rays(viewmat: np.ndarray, cam: Camera, xy: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(eye [3], unit world directions [M, 3], traced [M]) through pixel points xy [M, 2]."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    rays, ok = cm.ray_from_img(cam.model, cam.array, xy)
    d = rays @ R  # camera -> world: R^T applied to each row
    d = d / np.linalg.norm(d, axis=1, keepdims=True)
    return -R.T @ t, np.where(ok[:, None], d, np.array([0.0, 0.0, 1.0])), ok


def render(viewmat: np.ndarray, cam: Camera, distractor: Distractor | None = None,
           contrast: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(rgb [H, W, 3] float in [0, 1], hidden [H, W] bool: where a ray met the distractor) of
    the room seen through ``cam`` from world-to-camera ``viewmat`` [4, 4] (OpenCV axes), its
    textures at ``contrast`` (:func:`.room.albedo`)."""
    grid = cm.pixel_grid(cam.width, cam.height).reshape(-1, 2) - 0.5
    acc = np.zeros((len(grid), 3))
    hidden = np.zeros(len(grid), dtype=bool)
    for ox, oy in SUBPIXELS:
        eye, d, ok = _world_rays(viewmat, cam, grid + np.array([ox, oy]))
        rgb = room.shade(eye, d, contrast)
        if distractor is not None:
            t_scene = room.trace(eye, d)[0]
            t_ball, _ = _sphere(eye, d, distractor.center, distractor.radius)
            hit = t_ball < t_scene
            rgb[hit] = distractor.color
            hidden |= hit
        acc += np.where(ok[:, None], rgb, 0.0)
    shape = (cam.height, cam.width)
    return (acc / len(SUBPIXELS)).reshape(*shape, 3), hidden.reshape(shape)


def scene_depth(viewmat: np.ndarray, cam: Camera) -> np.ndarray:
    """[H, W] the z-depth (along the camera's axis) of the surface at each pixel centre."""
    grid = cm.pixel_grid(cam.width, cam.height).reshape(-1, 2)
    eye, d, ok = _world_rays(viewmat, cam, grid)
    z = room.trace(eye, d)[0] * (d @ viewmat[2, :3])  # t along a unit ray -> camera z
    return np.where(ok, z, np.nan).reshape(cam.height, cam.width)


def observations(xyz: np.ndarray, viewmats: np.ndarray, cam: Camera
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per view, (pixel positions [M, 2], rows of ``xyz`` [M]) of the points it sees: in its
    image and the first surface along the ray from its eye (what a track would hold)."""
    out = []
    for viewmat in viewmats:
        R, t = viewmat[:3, :3], viewmat[:3, 3]
        xy, ok = cm.img_from_ray(cam.model, cam.array, xyz @ R.T + t)
        ok &= (xy[:, 0] >= 0) & (xy[:, 0] < cam.width) & (xy[:, 1] >= 0) & (xy[:, 1] < cam.height)
        eye = -R.T @ t
        rows = np.nonzero(ok)[0]
        ray = xyz[rows] - eye
        dist = np.linalg.norm(ray, axis=1)
        hit = room.trace(eye, ray / dist[:, None])[0]
        keep = hit > dist * (1.0 - 1e-6) - 1e-5  # nothing in front of the point
        out.append((xy[rows[keep]], rows[keep]))
    return out


def scene_points(viewmats: np.ndarray, cam: Camera, stride: int = 6
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(xyz [P, 3], rgb [P, 3] uint8): the surface points under every ``stride``-th pixel of
    each view, with their colours (a COLMAP model's sparse points, without the noise)."""
    xyz, rgb = [], []
    grid = cm.pixel_grid(cam.width, cam.height)[stride // 2::stride, stride // 2::stride]
    for viewmat in viewmats:
        eye, d, ok = _world_rays(viewmat, cam, grid.reshape(-1, 2))
        t = room.trace(eye, d)[0]
        xyz.append((eye + t[:, None] * d)[ok])
        rgb.append(room.shade(eye, d)[ok])
    colours = np.round(np.concatenate(rgb) * 255.0).astype(np.uint8)
    return np.concatenate(xyz), colours


def write_capture(
    out: str | Path,
    cam: Camera,
    viewmats: np.ndarray,
    *,
    fmt: str = "bin",
    points: tuple[np.ndarray, np.ndarray] | None = None,
    distractors: Sequence[Distractor | None] | None = None,
    masks: bool = False,
    contrast: float = 1.0,
    tracks: bool = False,
) -> Path:
    """Write a COLMAP dataset of the room: ``images/view_NNN.png`` rendered through ``cam``
    from each of ``viewmats`` [N, 4, 4] with textures at ``contrast``, ``sparse/0/`` in
    ``fmt`` (``bin`` or ``txt``) with one camera, the poses and ``points`` (default:
    :func:`scene_points` of the views; with ``tracks`` their :func:`observations` as the
    images' 2D points and the points' tracks), and with ``masks`` the masks that hide
    ``distractors`` (one per view, or None).

    Returns ``out`` as a Path.
    """
    if cam.model not in COLMAP_MODELS_BY_NAME:
        raise ValueError(f"unknown COLMAP camera model {cam.model!r}")
    out = Path(out)
    (out / "images").mkdir(parents=True, exist_ok=True)
    if masks:
        (out / "masks").mkdir(exist_ok=True)
    images = []
    for i, viewmat in enumerate(viewmats):
        name = f"view_{i:03d}.png"
        ball = distractors[i] if distractors is not None else None
        rgb, hidden = render(viewmat, cam, ball, contrast)
        write_png(out / "images" / name, rgb.astype(np.float32))
        if masks and hidden.any():
            write_png(out / "masks" / f"{name}.png", np.where(hidden, 0, 255).astype(np.uint8))
        images.append(ColmapImage(i + 1, rotmat_to_qvec(viewmat[:3, :3]), viewmat[:3, 3].copy(),
                                  1, name))
    xyz, rgb = points if points is not None else scene_points(viewmats, cam)
    camera = ColmapCamera(1, cam.model, cam.width, cam.height, cam.array)
    seen = observations(xyz, viewmats, cam) if tracks else None
    write_model(out / "sparse" / "0", [camera], images, xyz, rgb, fmt=fmt, observations=seen)
    return out
