"""A test scene textured enough for SIFT: an object on a textured floor inside a textured room.

:func:`write_room_scene` ray casts the scene in NumPy (never splatted) from ``n_views`` known
poses and writes ``images/view_NNN.png`` plus ``poses.json`` (the truth: world-to-camera
matrices in OpenCV axes and the pinhole intrinsics). Structure-from-motion tests run
``tilesplat prepare`` on ``images/`` and compare what it recovers with ``poses.json``.

Why it looks the way it does: SIFT needs corners and blobs at many scales that do not repeat,
so every surface carries multi-octave value noise (hashed lattice, trilinear, smoothstep) mapped
through its own colour palette. A weakly textured object on a plain background registered only
11 of 40 views in issue 12's check. Shading is Lambertian (view-independent), so features look
alike from every camera and a splat model can fit it; every pixel averages 2x2 rays.

World frame: z up, floor at z = 0, walls at x, y = +-ROOM_HALF, ceiling at ROOM_HEIGHT. The
cameras circle the object at ~1.8 m, at varied heights, looking at TARGET with a small jitter.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..io.atomic import atomic_write_bytes
from ..io.images import write_png
from .synthetic import _box, _cylinder, _sphere

ROOM_HALF = 3.0  # m: walls at x, y = +-3
ROOM_HEIGHT = 2.6  # m: ceiling
TARGET = np.array([0.0, 0.0, 0.45])  # what the cameras look at (the object's middle)
CAMERA_RING = (1.7, 2.0)  # radius range of the camera positions about the z axis
CAMERA_HEIGHT = (0.7, 1.4)
FOV_X = math.radians(62.0)
# The CI variant: write_room_scene(out_dir, **TINY)
TINY = {"n_views": 32, "width": 240, "height": 180}

# material: 0 floor, 1 ceiling, 2-5 walls (+x, -x, +y, -y), 6-8 object parts
_PALETTES = (
    ((0.18, 0.12, 0.08), (0.92, 0.78, 0.55)),
    ((0.85, 0.85, 0.80), (0.35, 0.38, 0.45)),
    ((0.10, 0.25, 0.45), (0.95, 0.85, 0.60)),
    ((0.45, 0.10, 0.12), (0.90, 0.90, 0.75)),
    ((0.15, 0.40, 0.15), (0.95, 0.80, 0.85)),
    ((0.30, 0.20, 0.45), (0.85, 0.95, 0.70)),
    ((0.90, 0.55, 0.10), (0.10, 0.20, 0.55)),
    ((0.10, 0.55, 0.50), (0.95, 0.95, 0.90)),
    ((0.65, 0.10, 0.40), (0.95, 0.85, 0.20)),
)
_OBJECT = (  # (intersector, geometry args, material)
    (_box, ((0.0, 0.0, 0.2), (0.45, 0.35, 0.2), np.eye(3)), 6),
    (_sphere, ((0.05, 0.0, 0.72), 0.32), 7),
    (_cylinder, ((-0.3, 0.55), 0.18, 0.0, 0.7), 8),
)
_LIGHT = np.array([0.35, -0.25, 1.0]) / np.linalg.norm([0.35, -0.25, 1.0])
_AMBIENT = 0.45


def _hash(ix: np.ndarray, iy: np.ndarray, iz: np.ndarray, seed: int) -> np.ndarray:
    """Pseudo-random values in [0, 1) of integer lattice points (arrays of one shape)."""
    h = (ix * 73856093) ^ (iy * 19349663) ^ (iz * 83492791) ^ (seed * 2654435761)
    h = (h ^ (h >> 13)) * 1274126177
    h = h ^ (h >> 16)
    return (h & 0xFFFFFF).astype(np.float64) / float(0x1000000)


def value_noise(p: np.ndarray, freq: float, seed: int) -> np.ndarray:
    """Smooth value noise [M] in [0, 1] at points p [M, 3] with ``freq`` lattice cells per m."""
    q = p * freq
    base = np.floor(q).astype(np.int64)
    f = q - base
    w = f * f * (3.0 - 2.0 * f)  # smoothstep weights, [M, 3]
    out = np.zeros(len(p))
    for dx in (0, 1):
        for dy in (0, 1):
            for dz in (0, 1):
                v = _hash(base[:, 0] + dx, base[:, 1] + dy, base[:, 2] + dz, seed)
                wx = w[:, 0] if dx else 1.0 - w[:, 0]
                wy = w[:, 1] if dy else 1.0 - w[:, 1]
                wz = w[:, 2] if dz else 1.0 - w[:, 2]
                out += v * wx * wy * wz
    return out


def albedo(p: np.ndarray, material: np.ndarray, contrast: float = 1.0) -> np.ndarray:
    """Colours [M, 3] of surface points p [M, 3] of the given materials [M]; ``contrast``
    scales the texture about each palette's middle (0: one flat colour per surface)."""
    fbm = np.zeros(len(p))
    total = 0.0
    for octave, freq in enumerate((1.5, 3.5, 8.0, 16.0)):
        amp = freq**-0.5
        fbm += amp * value_noise(p, freq, seed=octave)
        total += amp
    fbm /= total
    # stretch the contrast: fbm concentrates around 0.5
    w = np.clip(0.5 + contrast * 2.2 * (fbm - 0.5), 0.0, 1.0)
    lo = np.array([_PALETTES[m][0] for m in range(len(_PALETTES))])[material]
    hi = np.array([_PALETTES[m][1] for m in range(len(_PALETTES))])[material]
    return lo * (1.0 - w[:, None]) + hi * w[:, None]


def _room(o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t [M], inward normal [M, 3], material [M]) where rays from inside leave the room."""
    lo = np.array([-ROOM_HALF, -ROOM_HALF, 0.0])
    hi = np.array([ROOM_HALF, ROOM_HALF, ROOM_HEIGHT])
    with np.errstate(divide="ignore", invalid="ignore"):
        t_axes = np.where(d > 0, (hi - o) / d, np.where(d < 0, (lo - o) / d, np.inf))
    axis = np.argmin(t_axes, axis=1)
    m = np.arange(len(d))
    t = t_axes[m, axis]
    positive = d[m, axis] > 0
    normal = np.zeros((len(d), 3))
    normal[m, axis] = np.where(positive, -1.0, 1.0)
    # z: floor 0 / ceiling 1; x: +x wall 2 / -x wall 3; y: +y wall 4 / -y wall 5
    material = np.select(
        [axis == 2, axis == 0, axis == 1],
        [np.where(positive, 1, 0), np.where(positive, 2, 3), np.where(positive, 4, 5)],
    )
    return t, normal, material


def trace(o: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t [M], normal [M, 3], material [M]) of the nearest surface along rays o [3] + t d
    [M, 3] (|d| = 1) started inside the room."""
    t, normal, material = _room(o, d)
    for intersector, args, mat in _OBJECT:
        tp, n_p = intersector(o, d, *args)
        closer = tp < t
        t = np.where(closer, tp, t)
        normal[closer] = n_p[closer]
        material[closer] = mat
    return t, normal, material


def shade(o: np.ndarray, d: np.ndarray, contrast: float = 1.0) -> np.ndarray:
    """RGB [M, 3] in [0, 1] of rays o [3] + t d [M, 3] (|d| = 1) started inside the room
    (``contrast``: the textures', :func:`albedo`)."""
    t, normal, material = trace(o, d)
    p = o + t[:, None] * d
    diffuse = _AMBIENT + (1.0 - _AMBIENT) * np.clip(normal @ _LIGHT, 0.0, None)
    # walls facing away from the light still get a soft bounce, not a flat ambient
    diffuse = np.maximum(diffuse, 0.55 + 0.1 * normal[:, 2])
    return np.clip(albedo(p, material, contrast) * diffuse[:, None], 0.0, 1.0)


def camera_poses(n: int, seed: int = 0) -> np.ndarray:
    """[n, 4, 4] world-to-camera matrices (OpenCV axes) circling the object, deterministic."""
    rng = np.random.default_rng(seed)
    viewmats = np.zeros((n, 4, 4))
    for i in range(n):
        az = 2.0 * math.pi * i / n + rng.uniform(-0.05, 0.05)
        r = rng.uniform(*CAMERA_RING)
        eye = np.array([r * math.cos(az), r * math.sin(az), rng.uniform(*CAMERA_HEIGHT)])
        target = TARGET + rng.uniform(-0.15, 0.15, 3)
        fwd = (target - eye) / np.linalg.norm(target - eye)
        right = np.cross(fwd, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        down = np.cross(fwd, right)
        R = np.stack([right, down, fwd])  # rows: camera axes in world coordinates
        viewmats[i, :3, :3] = R
        viewmats[i, :3, 3] = -R @ eye
        viewmats[i, 3, 3] = 1.0
    return viewmats


def intrinsics(width: int, height: int) -> np.ndarray:
    """[3, 3] pinhole K: horizontal field of view FOV_X, square pixels, centred."""
    f = 0.5 * width / math.tan(0.5 * FOV_X)
    return np.array([[f, 0.0, 0.5 * width], [0.0, f, 0.5 * height], [0.0, 0.0, 1.0]])


def render_view(viewmat: np.ndarray, K: np.ndarray, width: int, height: int) -> np.ndarray:
    """One view [height, width, 3] float in [0, 1]: the mean of 2x2 rays per pixel."""
    R, t = viewmat[:3, :3], viewmat[:3, 3]
    eye = -R.T @ t
    ys, xs = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    acc = np.zeros((height * width, 3))
    for ox, oy in ((0.25, 0.25), (0.75, 0.25), (0.25, 0.75), (0.75, 0.75)):
        u = xs.ravel() + ox
        v = ys.ravel() + oy
        cam = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)], 1)
        d = cam @ R  # camera -> world: R^T applied to each row
        acc += shade(eye, d / np.linalg.norm(d, axis=1, keepdims=True))
    return (acc / 4.0).reshape(height, width, 3)


def scene_size(viewmats: np.ndarray) -> float:
    """The largest distance between two camera centres of viewmats [C, 4, 4]."""
    centers = np.einsum("cji,cj->ci", viewmats[:, :3, :3], -viewmats[:, :3, 3])
    return float(np.linalg.norm(centers[:, None] - centers[None], axis=2).max())


def write_room_scene(
    out_dir: str | Path, *, n_views: int = 36, width: int = 320, height: int = 240, seed: int = 0
) -> Path:
    """Ray cast the room from ``n_views`` poses into ``out_dir``: ``images/view_NNN.png`` and
    ``poses.json`` (``names``, ``viewmats`` [C, 4, 4] world-to-camera OpenCV, ``K`` [3, 3],
    ``width``, ``height``, ``scene_size``). Returns ``out_dir`` as a Path."""
    if n_views < 2 or width < 16 or height < 16:
        raise ValueError(f"need n_views >= 2 and a size >= 16; got {n_views}, {width}x{height}")
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    viewmats = camera_poses(n_views, seed)
    K = intrinsics(width, height)
    names = [f"view_{i:03d}.png" for i in range(n_views)]
    for name, viewmat in zip(names, viewmats, strict=True):
        write_png(out / "images" / name, render_view(viewmat, K, width, height).astype(np.float32))
    truth = {
        "names": names,
        "viewmats": viewmats.tolist(),
        "K": K.tolist(),
        "width": width,
        "height": height,
        "scene_size": scene_size(viewmats),
    }
    atomic_write_bytes(out / "poses.json", json.dumps(truth, indent=1).encode("utf-8"))
    return out
