"""nerfstudio datasets: one ``transforms.json`` (``ns-process-data``, Polycam, Record3D,
Metashape, RealityCapture exports) and the images it names.

Fields read (https://docs.nerf.studio/quickstart/data_conventions.html):

- cameras: ``camera_model`` (``PINHOLE``, ``SIMPLE_PINHOLE``, ``SIMPLE_RADIAL``, ``RADIAL``,
  ``OPENCV``, ``OPENCV_FISHEYE``; ``EQUIRECTANGULAR`` and the stereo panoramas are refused),
  ``fl_x fl_y cx cy w h`` and ``k1 k2 k3 k4 p1 p2``, each from the top level when it is there
  (as nerfstudio reads them), else from the frame;
- per frame: ``file_path``, ``transform_matrix`` (camera-to-world, OpenGL axes: x right, y up,
  z backward), ``mask_path`` (black: ignored), ``depth_file_path`` (kept in
  ``SceneDataset.extras["depth_files"]`` for later);
- scene: ``applied_transform`` (the 3x4 rigid transform ``ns-process-data`` applied to the
  original world; it is undone, so the cameras and points are in the capture's own world, as
  the COLMAP model has them), ``ply_file_path`` (the initial points, in the transforms'
  world), and ``train_filenames`` / ``val_filenames`` / ``test_filenames``.

The split is nerfstudio's: its file lists when the file has them, else its default ``fraction``
mode (90 % train, spread evenly over the frames sorted by file name, the rest test);
``test_every`` >= 0 asks for every n-th frame instead. With ``downscale`` N the images come
from ``images_N/`` (masks from ``masks_N/``) when those exist, as nerfstudio's convention.
The lens of each frame becomes a COLMAP camera (``OPENCV``, ``FULL_OPENCV`` when ``k3`` is
set, or ``OPENCV_FISHEYE``) and is trained as :mod:`.undistort` says, like a COLMAP dataset's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io.json_file import read_json
from .blender import blender_c2w_to_viewmat
from .frames import SceneDataset, cameras_extent, mask_files, split_every
from .ply_points import read_ply_points
from .posed_images import Shot, load_shots
from .undistort import Camera

TRANSFORMS = "transforms.json"
PERSPECTIVE = ("PINHOLE", "SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV")
FISHEYE = ("OPENCV_FISHEYE",)
PANORAMAS = ("EQUIRECTANGULAR", "OMNIDIRECTIONALSTEREO_L", "OMNIDIRECTIONALSTEREO_R",
             "VR180_L", "VR180_R")
TRAIN_FRACTION = 0.9  # nerfstudio's train_split_fraction
LENS_KEYS = ("fl_x", "fl_y", "cx", "cy", "w", "h")
DISTORTION_KEYS = ("k1", "k2", "k3", "k4", "p1", "p2")


def _number(where: str, key: str, value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{where}: {key} must be finite, got {value!r}")
    return out


def _matrix(where: str, key: str, value: Any, rows: tuple[int, ...]) -> np.ndarray:
    try:
        m = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} must be a matrix of numbers") from None
    if m.ndim != 2 or m.shape[1] != 4 or m.shape[0] not in rows or not np.isfinite(m).all():
        raise ValueError(f"{where}: {key} must be a finite {' or '.join(f'{r}x4' for r in rows)} "
                         f"matrix, got shape {list(m.shape)}")
    if m.shape[0] == 3:
        m = np.vstack([m, [0.0, 0.0, 0.0, 1.0]])
    return m


def _camera(meta: dict, fr: dict, where: str) -> Camera:
    """The COLMAP camera of a frame: each key from the top level, else from the frame."""

    def get(key: str, default: Any = None) -> Any:
        if key in meta:
            return meta[key]
        if key in fr:
            return fr[key]
        if default is None:
            raise ValueError(f"{where}: no {key!r}, at the top level or in the frame")
        return default

    model = str(get("camera_model", "OPENCV"))
    if model in PANORAMAS:
        raise ValueError(
            f"{where}: camera_model {model} (a 360-degree panorama) is not supported: the "
            "rasterizer renders pinhole and fisheye cameras; export perspective or fisheye "
            "frames of the capture instead"
        )
    if model not in PERSPECTIVE + FISHEYE:
        raise ValueError(f"{where}: camera_model {model!r} is not supported; supported: "
                         + ", ".join(PERSPECTIVE + FISHEYE))
    fx = _number(where, "fl_x", get("fl_x"))
    fy = _number(where, "fl_y", get("fl_y", fx))  # one focal length: fl_x alone
    cx, cy = (_number(where, k, get(k)) for k in ("cx", "cy"))
    w, h = (_number(where, k, get(k)) for k in LENS_KEYS[4:])
    if w != int(w) or h != int(h) or w < 1 or h < 1:
        raise ValueError(f"{where}: w and h must be positive integers, got {w}, {h}")
    if fx <= 0 or fy <= 0:
        raise ValueError(f"{where}: fl_x and fl_y must be positive, got {fx}, {fy}")
    k1, k2, k3, k4, p1, p2 = (_number(where, k, get(k, 0.0)) for k in DISTORTION_KEYS)
    if model in FISHEYE:
        params = (fx, fy, cx, cy, k1, k2, k3, k4)
        return Camera("OPENCV_FISHEYE", int(w), int(h), params)
    if k4 != 0.0:
        raise ValueError(f"{where}: k4 = {k4} of a perspective camera (an r^8 term) has no "
                         "COLMAP model; only OPENCV_FISHEYE uses k4")
    if k3 != 0.0:
        return Camera("FULL_OPENCV", int(w), int(h),
                      (fx, fy, cx, cy, k1, k2, p1, p2, k3, 0.0, 0.0, 0.0))
    return Camera("OPENCV", int(w), int(h), (fx, fy, cx, cy, k1, k2, p1, p2))


def _poses(frames: list[dict], rel: list[str], tf: Path) -> np.ndarray:
    """[F, 4, 4] float64: the frames' ``transform_matrix`` (3x4 ones completed), each checked
    to be a finite 3x4 or 4x4 matrix (the first that is not named).

    One array for all frames when they have one shape (the common case: numbers only, and
    linear in the frames at NumPy's speed), else frame by frame."""
    try:
        mats = np.asarray([fr["transform_matrix"] for fr in frames], dtype=np.float64)
    except (TypeError, ValueError):  # ragged (3x4 and 4x4 mixed) or not numbers
        mats = None
    if (mats is None or mats.ndim != 3 or mats.shape[1:] not in ((3, 4), (4, 4))
            or not np.isfinite(mats).all()):
        return np.stack([
            _matrix(f"{tf}: frame {i} ({name})", "transform_matrix", fr["transform_matrix"],
                    (3, 4))
            for i, (fr, name) in enumerate(zip(frames, rel, strict=True))
        ])
    if mats.shape[1] == 3:
        mats = np.concatenate([mats, np.broadcast_to([0.0, 0.0, 0.0, 1.0], (len(mats), 1, 4))],
                              axis=1)
    return mats


def read_transforms_json(path: Path) -> dict[str, Any]:
    """The parsed file, checked to hold a non-empty ``frames`` list of objects (the file is
    untrusted: :func:`..io.json_file.read_json` bounds its size and nesting)."""
    meta = read_json(path, "nerfstudio transforms file")  # size and nesting bounded
    if not isinstance(meta, dict) or not isinstance(meta.get("frames"), list) or not meta["frames"]:
        raise ValueError(f"{path}: expected an object with a non-empty 'frames' list")
    for i, fr in enumerate(meta["frames"]):
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise ValueError(f"{path}: frame {i} needs 'file_path' and 'transform_matrix'")
    return meta


def _split(meta: dict, names: list[str], test_every: int, path: Path) -> tuple[list, list]:
    """(train, test) indices into ``names`` (the file paths, sorted)."""
    if test_every >= 0:
        return split_every(names, test_every)
    lists = {k: meta[k] for k in ("train_filenames", "val_filenames", "test_filenames")
             if k in meta}
    if lists:
        def norm(p: Any) -> str:
            return Path(str(p)).as_posix().removeprefix("./")

        index = {norm(n): i for i, n in enumerate(names)}
        out = []
        for key in ("train_filenames", "test_filenames" if "test_filenames" in lists
                    else "val_filenames"):
            got = [norm(n) for n in lists.get(key, [])]
            missing = [n for n in got if n not in index]
            if missing:
                raise ValueError(f"{path}: {key} names {missing[0]!r}, which no frame has")
            out.append(sorted(index[n] for n in got))
        return out[0], out[1]
    n = len(names)
    train = sorted(set(np.linspace(0, n - 1, math.ceil(n * TRAIN_FRACTION)).astype(int).tolist()))
    chosen = set(train)  # once: a set per frame made the split quadratic in the frames
    return train, [i for i in range(n) if i not in chosen]


def _user_masks(masks_dir: Path, rel: list[str], root: Path) -> dict[str, Path]:
    """File path -> its mask in ``masks_dir``, named from the images' common folder as COLMAP
    names them (the mask of ``images/a.png`` is ``<masks_dir>/a.png.png`` or ``a.png``)."""
    try:
        base = Path(os.path.commonpath([Path(n).parent.as_posix() for n in rel]))
    except ValueError:  # absolute and relative paths mixed
        base = Path()
    inner = [Path(n).relative_to(base).as_posix() for n in rel]
    found = mask_files(masks_dir, inner, root / base)
    return {n: found[i] for n, i in zip(rel, inner, strict=True) if i in found}


def load_nerfstudio(
    path: str | Path,
    *,
    downscale: int = 1,
    white_background: bool = True,
    test_every: int = -1,
    masks_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    camera_mode: str = "undistort",
) -> SceneDataset:
    """Load a nerfstudio dataset (see the module docstring); ``white_background`` is unused.

    ``masks_dir``, when given, replaces the frames' ``mask_path``: the mask of ``images/a.png``
    is ``<masks_dir>/a.png.png`` or ``<masks_dir>/a.png``. ``camera_mode``: ``undistort``
    or ``native`` (an OPENCV or OPENCV_FISHEYE lens kept, :mod:`.lens`).
    """
    root = Path(path)
    log = log or (lambda _: None)
    tf = root / TRANSFORMS
    meta = read_transforms_json(tf)
    frames = sorted(meta["frames"], key=lambda fr: str(fr["file_path"]))
    rel = [Path(str(fr["file_path"])).as_posix().removeprefix("./") for fr in frames]
    if len(set(rel)) != len(rel):
        raise ValueError(f"{tf}: two frames share a file_path")
    undo = np.eye(4)
    if "applied_transform" in meta:
        applied = _matrix(str(tf), "applied_transform", meta["applied_transform"], (3, 4))
        rot = applied[:3, :3]
        if np.abs(rot @ rot.T - np.eye(3)).max() > 1e-4:
            raise ValueError(f"{tf}: applied_transform must be rigid (a rotation and a shift)")
        undo = np.linalg.inv(applied)
    user_masks = _user_masks(Path(masks_dir), rel, root) if masks_dir else None
    c2w = undo @ _poses(frames, rel, tf)  # [F, 4, 4]
    singular = np.flatnonzero(np.abs(np.linalg.det(c2w[:, :3, :3])) < 1e-8)
    if len(singular):
        i = int(singular[0])
        raise ValueError(f"{tf}: frame {i} ({rel[i]}): transform_matrix is singular")
    viewmats = blender_c2w_to_viewmat(c2w)
    # a camera whose fields are all at the top level is every frame's: made once
    own_lens = [k for k in ("camera_model", *LENS_KEYS, *DISTORTION_KEYS) if k not in meta]
    shared: Camera | None = None
    images_n = root / f"images_{downscale}"
    shots, depth = [], {}
    for i, (fr, name) in enumerate(zip(frames, rel, strict=True)):
        where = f"{tf}: frame {i} ({name})"
        image_file = root / name
        if user_masks is not None:
            mask = user_masks.get(name)
        else:
            mask = root / str(fr["mask_path"]) if "mask_path" in fr else None
            if mask is not None and not mask.is_file():
                raise FileNotFoundError(f"{where}: mask_path {mask} not found")
        if "depth_file_path" in fr:
            depth[image_file.stem] = root / str(fr["depth_file_path"])
        if any(k in fr for k in own_lens):
            camera = _camera(meta, fr, where)
        else:
            camera = shared = _camera(meta, fr, where) if shared is None else shared
        downscaled = None  # images_N/ and masks_N/ serve a downscale > 1 only
        if downscale > 1:
            small_mask = root / f"masks_{downscale}" / mask.name if mask is not None else None
            downscaled = {downscale: (images_n / image_file.name, small_mask)}
        shots.append(Shot(
            name=image_file.stem,
            key=name,
            image_file=image_file,
            camera=camera,
            viewmat=viewmats[i],
            mask_file=mask,
            downscaled=downscaled,
        ))
    # everything that can fail before the images are read (and undistorted into the cache)
    tr, te = _split(meta, rel, test_every, tf)
    if not tr:
        raise ValueError(f"{root}: no train frames left after the test split")
    points = rgb = None
    if "ply_file_path" in meta:
        xyz, colours = read_ply_points(root / str(meta["ply_file_path"]))
        xyz = xyz @ undo[:3, :3].T + undo[:3, 3]
        if len(xyz):
            points = torch.from_numpy(xyz).float()
            rgb = (torch.from_numpy(colours.astype(np.float32) / 255.0) if colours is not None
                   else torch.full((len(xyz), 3), 0.5))
    loaded = load_shots(shots, root, downscale, log, camera_mode)
    train, test = [loaded[i] for i in tr], [loaded[i] for i in te]
    centers = np.stack([f.camera_center.double().numpy() for f in train])
    center = centers.mean(0)
    return SceneDataset(
        train=train,
        test=test,
        points=points,
        points_rgb=rgb,
        scene_center=torch.from_numpy(center).float(),
        scene_radius=cameras_extent(centers, center),
        background=(0.0, 0.0, 0.0),
        kind="nerfstudio",
        path=root,
        extras={"depth_files": depth} if depth else None,
    )
