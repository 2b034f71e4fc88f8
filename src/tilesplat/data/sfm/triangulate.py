"""Points for a capture that has poses and no points: COLMAP's "triangulate with known poses"
in-process through pycolmap (``init = "triangulate"``, and ``auto``'s first choice where
pycolmap is installed).

1. The training views' images are staged as PNG, the longer side at most ``MAX_SIDE`` (the
   intrinsics scaled with them).
2. SIFT features on the CPU, one camera per view with its known intrinsics (so that the
   geometric verification of the matches uses them).
3. Matching: every pair up to ``EXHAUSTIVE_UP_TO`` views; beyond, each view with its
   ``PAIR_NEIGHBOURS`` nearest views by pose (:func:`..view_pairs.neighbours`).
4. The views' poses are held fixed and the matches' tracks triangulated (COLMAP's point
   triangulator: tracks of at least three views, reprojection error and angle bounds).

The result is kept beside the dataset, ``<dataset>/tilesplat_cache/triangulated-<key>.npz``
(no pickles), keyed by a hash of everything it depends on: the version, every view's name,
size, camera, intrinsics, pose and pixels. A dataset folder that cannot be written is
triangulated on every load. pycolmap is imported only inside :func:`triangulate_known_poses`.
"""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...io.atomic import atomic_write_bytes
from ..frames import Frame
from ..view_pairs import neighbours
from .pipeline import import_pycolmap

VERSION = 1
CACHE_FOLDER = "tilesplat_cache"
PREFIX = "triangulated-"
MAX_SIDE = 1600  # the longer side of the images SIFT runs on (COLMAP's prepare default)
EXHAUSTIVE_UP_TO = 50  # views matched pair by pair with every other one
PAIR_NEIGHBOURS = 12  # beyond: each view with its nearest views by pose

Log = Callable[[str], object]


@dataclass
class Triangulation:
    """Triangulated points: ``points`` [P, 3] and ``rgb`` [P, 3] in [0, 1] (float32 numpy),
    the views used, the mean reprojection error (pixels of the staged images), the seconds it
    took and whether it came from the cache."""

    points: np.ndarray
    rgb: np.ndarray
    n_views: int
    reprojection_error: float
    seconds: float
    cached: bool


def _uint8(frame: Frame) -> np.ndarray:
    return (frame.image.numpy() * 255.0 + 0.5).clip(0, 255).astype(np.uint8)


def cache_key(frames: Sequence[Frame]) -> str:
    """A hash of what the triangulation depends on (frame order included)."""
    h = hashlib.sha256(f"v{VERSION} {MAX_SIDE} {EXHAUSTIVE_UP_TO} {PAIR_NEIGHBOURS}".encode())
    for f in frames:
        h.update(json.dumps([f.name, f.width, f.height, f.camera_model,
                             f.K.double().tolist(), f.viewmat.double().tolist()]).encode())
        h.update(_uint8(f).tobytes())
    return h.hexdigest()[:24]


def _colmap_camera(pycolmap: Any, frame: Frame, scale: float, camera_id: int) -> Any:
    fx, fy = float(frame.K[0, 0]) * scale, float(frame.K[1, 1]) * scale
    cx, cy = float(frame.K[0, 2]) * scale, float(frame.K[1, 2]) * scale
    w, h = round(frame.width * scale), round(frame.height * scale)
    if frame.camera_model == "fisheye":  # equidistant: OPENCV_FISHEYE without distortion
        return pycolmap.Camera(model="OPENCV_FISHEYE", width=w, height=h, camera_id=camera_id,
                               params=[fx, fy, cx, cy, 0.0, 0.0, 0.0, 0.0])
    if frame.camera_model != "pinhole":
        raise ValueError(f"view '{frame.name}': triangulation reads pinhole and fisheye "
                         f"cameras, got camera_model {frame.camera_model!r}")
    return pycolmap.Camera(model="PINHOLE", width=w, height=h, camera_id=camera_id,
                           params=[fx, fy, cx, cy])


def _stage(frames: Sequence[Frame], folder: Path) -> tuple[list[str], list[float]]:
    """The views as PNG in ``folder`` (``NNNNNN.png``; never the dataset's own names), each
    reduced to at most MAX_SIDE: (file names, scale factors)."""
    from PIL import Image

    names, scales = [], []
    for i, f in enumerate(frames):
        scale = min(1.0, MAX_SIDE / max(f.width, f.height))
        im = Image.fromarray(_uint8(f))
        if scale < 1.0:
            im = im.resize((round(f.width * scale), round(f.height * scale)), Image.LANCZOS)
        name = f"{i:06d}.png"
        im.save(folder / name, compress_level=1)
        names.append(name)
        scales.append(scale)
    return names, scales


def _match(pycolmap: Any, database: Path, frames: Sequence[Frame], names: list[str],
           root: Path, threads: int) -> None:
    options = pycolmap.FeatureMatchingOptions()
    options.num_threads = threads
    if len(frames) <= EXHAUSTIVE_UP_TO:
        pycolmap.match_exhaustive(database, matching_options=options)
        return
    near = neighbours(torch.stack([f.viewmat for f in frames]).double(), PAIR_NEIGHBOURS)
    pairs = {tuple(sorted((i, int(j)))) for i in range(len(frames)) for j in near[i]}
    listing = root / "pairs.txt"
    listing.write_text("".join(f"{names[a]} {names[b]}\n" for a, b in sorted(pairs)))
    pairing = pycolmap.ImportedPairingOptions()
    pairing.match_list_path = str(listing)
    pycolmap.match_image_pairs(database, matching_options=options, pairing_options=pairing)


def _run(pycolmap: Any, frames: Sequence[Frame], root: Path, threads: int,
         seed: int) -> tuple[np.ndarray, np.ndarray, float]:
    images = root / "images"
    images.mkdir()
    names, scales = _stage(frames, images)
    database = root / "database.db"
    pycolmap.set_random_seed(seed)
    extraction = pycolmap.FeatureExtractionOptions()
    extraction.num_threads = threads
    pycolmap.extract_features(database, images, image_names=names,
                              camera_mode=pycolmap.CameraMode.PER_IMAGE,
                              extraction_options=extraction)
    rec = pycolmap.Reconstruction()
    with pycolmap.Database.open(database) as db:
        by_name = {im.name: im for im in db.read_all_images()}
        for i, f in enumerate(frames):
            entry = by_name[names[i]]
            camera = _colmap_camera(pycolmap, f, scales[i], entry.camera_id)
            camera.has_prior_focal_length = True
            db.update_camera(camera)
            rec.add_camera_with_trivial_rig(camera)
            pose = pycolmap.Rigid3d(f.viewmat.double().numpy()[:3, :4])
            rec.add_image_with_trivial_frame(
                pycolmap.Image(name=names[i], camera_id=entry.camera_id, image_id=entry.image_id),
                pose)
    _match(pycolmap, database, frames, names, root, threads)
    options = pycolmap.IncrementalPipelineOptions()
    options.num_threads = threads
    options.random_seed = seed
    out = root / "model"
    out.mkdir()
    result = pycolmap.triangulate_points(rec, database, images, out, options=options)
    points = [p for p in result.points3D.values()]
    xyz = np.array([p.xyz for p in points], dtype=np.float64).reshape(-1, 3)
    rgb = np.array([p.color for p in points], dtype=np.float64).reshape(-1, 3) / 255.0
    error = float(result.compute_mean_reprojection_error()) if points else 0.0
    return xyz.astype(np.float32), rgb.astype(np.float32), error


def _read_cached(path: Path) -> tuple[np.ndarray, np.ndarray, float] | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            xyz, rgb, error = z["points"], z["rgb"], float(z["error"])
    except (OSError, ValueError, KeyError):
        return None
    ok = (xyz.ndim == 2 and xyz.shape[1] == 3 and rgb.shape == xyz.shape
          and xyz.dtype == np.float32 and rgb.dtype == np.float32
          and np.isfinite(xyz).all() and np.isfinite(rgb).all())
    return (xyz, rgb, error) if ok else None


def triangulate_known_poses(
    frames: Sequence[Frame],
    dataset_dir: str | Path | None,
    *,
    threads: int = -1,
    seed: int = 0,
    log: Log | None = None,
) -> Triangulation:
    """Triangulate the matched features of ``frames`` with their poses held fixed.

    Args:
        frames: the training views (pinhole or equidistant fisheye, as loaded).
        dataset_dir: where the result is cached (``tilesplat_cache/``); None: not cached.
        threads: pycolmap's CPU threads (-1: all).
        seed: pycolmap's random seed.
        log: one-line messages.

    Raises:
        NotImplementedError: pycolmap is not installed (``pip install "tilesplat[sfm]"``).
        ValueError: fewer than two views, or a camera model it cannot triangulate.
    """
    say = log if log is not None else (lambda _line: None)
    if len(frames) < 2:
        raise ValueError(f"triangulation needs at least 2 views, got {len(frames)}")
    start = time.perf_counter()
    key = cache_key(frames)
    cache = (Path(dataset_dir) / CACHE_FOLDER / f"{PREFIX}{key}.npz"
             if dataset_dir is not None else None)
    if cache is not None and cache.is_file():
        found = _read_cached(cache)
        if found is not None:
            return Triangulation(found[0], found[1], len(frames), found[2],
                                 time.perf_counter() - start, cached=True)
    pycolmap = import_pycolmap()
    pairs = ("every pair" if len(frames) <= EXHAUSTIVE_UP_TO
             else f"each view with its {PAIR_NEIGHBOURS} nearest")
    say(f"triangulating {len(frames)} views with their poses fixed (pycolmap: SIFT, {pairs})")
    level = pycolmap.logging.minloglevel
    pycolmap.logging.minloglevel = 3
    try:
        with tempfile.TemporaryDirectory(prefix="tilesplat-triangulate-") as tmp:
            xyz, rgb, error = _run(pycolmap, frames, Path(tmp), threads, seed)
    finally:
        pycolmap.logging.minloglevel = level
    if cache is not None:
        buf = io.BytesIO()
        np.savez(buf, points=xyz, rgb=rgb, error=np.float64(error))
        try:
            atomic_write_bytes(cache, buf.getvalue())
        except OSError as e:
            say(f"triangulation not cached ({cache.parent} not writable: {e.strerror})")
    return Triangulation(xyz, rgb, len(frames), error, time.perf_counter() - start, cached=False)
