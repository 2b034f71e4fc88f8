"""COLMAP datasets: ``images/``, ``sparse/0/{cameras,images,points3D}.{bin,txt}``, and optional
``masks/`` (COLMAP's convention: the mask of ``images/a.jpg`` is ``masks/a.jpg.png``, black
where the pixel is to be ignored; ``masks/a.png`` is accepted too).

Every camera model of :mod:`.camera_models` loads: pinhole models as they are; distorted ones
(``SIMPLE_RADIAL``, ``RADIAL``, ``OPENCV``, ``FULL_OPENCV``) undistorted on load to PINHOLE
as COLMAP's ``image_undistorter`` would; fisheye ones (``OPENCV_FISHEYE``,
``SIMPLE_RADIAL_FISHEYE``, ``RADIAL_FISHEYE``, ``FOV``, ``SIMPLE_FISHEYE``, ``FISHEYE``)
trained with the rasterizer's fisheye camera, undistorted first when their distortion is
beyond it (:mod:`.undistort` says what each camera becomes; the undistorted images are cached
in ``tilesplat_cache/``); ``THIN_PRISM_FISHEYE`` as the other fisheyes. With ``camera_mode =
"native"`` a distorted camera keeps its own lens and full image instead (:mod:`.lens`).
Other models (division, EUCM, equirectangular, ...) are refused with their name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from . import camera_models as cm
from .colmap_format import ColmapCamera, qvec_to_rotmat, read_model_tracks
from .frames import SceneDataset, cameras_extent, mask_files, split_every
from .posed_images import Shot, load_shots
from .undistort import Camera

DEFAULT_TEST_EVERY = 8


def camera_of(cam: ColmapCamera, source: Path) -> Camera:
    """The :class:`.undistort.Camera` of a COLMAP camera record.

    Raises:
        ValueError: the model is not supported, or its focal length is not positive.
    """
    where = f"{source}: camera {cam.camera_id}"
    cm.check_model(cam.model, cam.params, where)
    bad = np.flatnonzero(~np.isfinite(cam.params))
    if len(bad):
        raise ValueError(f"{where} ({cam.model}): parameter {int(bad[0])} of "
                         f"{list(cam.params)} is not finite")
    fx, fy, _, _ = cm.intrinsics(cam.model, cam.params)
    if not (fx > 0 and fy > 0):
        raise ValueError(f"{where} has a non-positive focal length ({fx}, {fy})")
    if cam.width < 1 or cam.height < 1:
        raise ValueError(f"{where} has an empty image size {cam.width}x{cam.height}")
    return Camera(cam.model, cam.width, cam.height, tuple(float(v) for v in cam.params))


def _point_ids(rows: np.ndarray | None, n_points: int) -> torch.Tensor | None:
    """The points an image sees as a Frame's ``point_ids`` (None when it sees none; the rows
    of a track that name no point of the model are dropped)."""
    if rows is None or n_points == 0:
        return None
    rows = rows[(rows >= 0) & (rows < n_points)]
    return torch.from_numpy(rows.astype(np.int64)) if len(rows) else None


def _sparse_dir(root: Path) -> Path:
    for cand in (root / "sparse" / "0", root / "sparse"):
        if any((cand / f"cameras.{ext}").is_file() for ext in ("bin", "txt")):
            return cand
    raise FileNotFoundError(
        f"COLMAP model not found: expected {root / 'sparse' / '0'}/cameras.bin (or .txt), "
        "images.bin, points3D.bin"
    )


def load_colmap(
    path: str | Path,
    *,
    downscale: int = 1,
    white_background: bool = True,
    test_every: int = -1,
    masks_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    camera_mode: str = "undistort",
) -> SceneDataset:
    """Load a COLMAP dataset (see the module docstring); ``white_background`` is unused (the
    images are taken as they are).

    Images sorted by name; every ``test_every``-th (the first included) goes to test (-1:
    every 8th; 0: none). With ``downscale`` N, images come from ``images_N/`` when it exists,
    else are resized. Masks come from ``masks_dir`` when given, else from ``masks/`` when the
    dataset has one. ``log`` gets one line per camera saying how it is trained.
    ``camera_mode``: ``undistort`` (as above) or ``native`` (a distorted camera keeps its lens
    and full image, :mod:`.lens`).
    """
    root = Path(path)
    log = log or (lambda _: None)
    sparse = _sparse_dir(root)
    cams, images, xyz, rgb, tracks = read_model_tracks(sparse)
    if not images:
        raise ValueError(f"{sparse}: the COLMAP model has no registered images")
    cam_file, img_file = (next(sparse / f"{stem}.{e}" for e in ("bin", "txt")
                               if (sparse / f"{stem}.{e}").is_file())
                          for stem in ("cameras", "images"))
    ordered = sorted(images.values(), key=lambda im: im.name)
    for im in ordered:
        if im.camera_id not in cams:
            raise ValueError(f"{sparse}: image '{im.name}' refers to missing camera {im.camera_id}")
        if not np.isfinite(im.qvec).all() or np.linalg.norm(im.qvec) < 1e-8:
            raise ValueError(f"{img_file}: image '{im.name}' has an invalid rotation "
                             f"{im.qvec.tolist()}")
        if not np.isfinite(im.tvec).all():
            raise ValueError(f"{img_file}: image '{im.name}' has a non-finite translation "
                             f"{im.tvec.tolist()}")
    used = {im.camera_id for im in ordered}
    cameras = {cid: camera_of(cams[cid], cam_file) for cid in sorted(used)}
    images_dir = root / "images"
    mdir = Path(masks_dir) if masks_dir else root / "masks"
    masks = (mask_files(mdir, [im.name for im in ordered], images_dir)
             if masks_dir or mdir.is_dir() else {})
    shots = []
    for im in ordered:
        viewmat = np.eye(4)
        viewmat[:3, :3] = qvec_to_rotmat(im.qvec)
        viewmat[:3, 3] = im.tvec
        shots.append(Shot(
            name=Path(im.name).stem,
            key=im.name,
            image_file=images_dir / im.name,
            camera=cameras[im.camera_id],
            viewmat=viewmat,
            mask_file=masks.get(im.name),
            downscaled={downscale: (root / f"images_{downscale}" / im.name, None)},
        ))
    every = DEFAULT_TEST_EVERY if test_every < 0 else test_every
    # shots are already sorted by name, so split_every keeps this order
    tr, te = split_every([f"{i:09d}" for i in range(len(shots))], every)
    if not tr:
        raise ValueError(f"{root}: no train images left after the test split (test_every=1)")
    frames = load_shots(shots, root, downscale, log, camera_mode)
    seen = tracks.of_image()  # the sparse points each image sees (the depth prior's)
    frames = [dataclasses.replace(f, point_ids=_point_ids(seen.get(im.image_id), len(xyz)))
              for f, im in zip(frames, ordered, strict=True)]
    train, test = [frames[i] for i in tr], [frames[i] for i in te]
    centers = np.stack([f.camera_center.double().numpy() for f in train])
    center = centers.mean(0)
    has_points = len(xyz) > 0  # an empty model leaves the initialisation to the trainer
    return SceneDataset(
        train=train,
        test=test,
        points=torch.from_numpy(xyz).float() if has_points else None,
        points_rgb=torch.from_numpy(rgb.astype(np.float32) / 255.0) if has_points else None,
        scene_center=torch.from_numpy(center).float(),
        scene_radius=cameras_extent(centers, center),
        background=(0.0, 0.0, 0.0),
        kind="colmap",
        path=root,
    )
