"""Blender / NeRF-synthetic datasets: ``transforms_{train,val,test}.json`` and RGBA PNGs.

Each JSON holds ``camera_angle_x`` (horizontal field of view, radians) and optionally
``fl_x, fl_y, cx, cy, w, h`` (top level or per frame), and ``frames`` with ``file_path``
(relative to the dataset folder, with or without ``.png``) and ``transform_matrix``: 4x4
camera-to-world in OpenGL / Blender axes (x right, y up, z backward). The val split is not
loaded: train and test are what 3DGS uses. With ``masks_dir``, the mask of ``train/r_0.png`` is
``<masks_dir>/train/r_0.png.png`` (or ``train/r_0.png``), black where a pixel is ignored.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..io.images import decode_image, image_size, resize_image
from ..io.json_file import read_json
from .composite import composite
from .frames import (
    Frame,
    SceneDataset,
    cameras_extent,
    look_at_point,
    mask_files,
    read_mask,
    split_every,
)
from .image_cache import CACHE, StoredImage, decode_all, new_key
from .pixels import LazyPixels, MaskBits

DEFAULT_TEST_EVERY = 8

# OpenGL camera axes (y up, z backward) -> OpenCV (y down, z forward): flip the y and z columns.
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])


def read_transforms(path: Path) -> dict[str, Any]:
    """Parse and check one ``transforms_*.json``.

    Raises:
        FileNotFoundError / ValueError naming the file.
    """
    meta = read_json(path, "Blender transforms file")  # size and nesting bounded
    if not isinstance(meta, dict):
        raise ValueError(f"{path}: expected a JSON object at the top level")
    frames = meta.get("frames")
    if not isinstance(frames, list) or not frames:
        raise ValueError(f"{path}: expected a non-empty list 'frames'")
    for i, fr in enumerate(frames):
        if not isinstance(fr, dict) or "file_path" not in fr or "transform_matrix" not in fr:
            raise ValueError(f"{path}: frame {i} needs 'file_path' and 'transform_matrix'")
        try:
            mat = np.asarray(fr["transform_matrix"], dtype=np.float64)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: frame {i} 'transform_matrix' is not numeric") from e
        if mat.shape != (4, 4) or not np.isfinite(mat).all():
            raise ValueError(
                f"{path}: frame {i} 'transform_matrix' must be a finite 4x4 matrix, "
                f"got shape {list(mat.shape)}"
            )
        if abs(np.linalg.det(mat[:3, :3])) < 1e-8:
            raise ValueError(f"{path}: frame {i} 'transform_matrix' is singular")
        if not any(k in fr or k in meta for k in ("camera_angle_x", "fl_x")):
            raise ValueError(f"{path}: frame {i} has no 'camera_angle_x' or 'fl_x'")
    return meta


def blender_c2w_to_viewmat(c2w: np.ndarray) -> np.ndarray:
    """[..., 4, 4] camera-to-world in OpenGL axes -> [..., 4, 4] world-to-camera in OpenCV axes."""
    return np.linalg.inv(c2w @ GL_TO_CV)


def _image_file(root: Path, file_path: str) -> Path:
    p = root / file_path
    if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".exr") and p.is_file():
        return p
    if (p.parent / (p.name + ".png")).is_file():
        return p.parent / (p.name + ".png")
    if p.is_file():
        return p
    raise FileNotFoundError(f"image of frame '{file_path}' not found: {p} (or {p}.png)")


def _size(value: Any, key: str, json_path: Path) -> int:
    """An image size the file gives (``w``, ``h``), a finite number >= 1, as an int."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number >= 1):
        raise ValueError(f"{json_path}: {key} must be a number of pixels, got {value!r}")
    return int(number)


def _intrinsics(src: dict[str, Any], width: int, height: int, json_path: Path) -> np.ndarray:
    """[3, 3] pinhole K at the size (width, height) given in the file (or of the image)."""
    try:
        if "fl_x" in src:
            fx = float(src["fl_x"])
            fy = float(src.get("fl_y", fx))
        else:
            fx = 0.5 * width / math.tan(0.5 * float(src["camera_angle_x"]))
            fy = (
                0.5 * height / math.tan(0.5 * float(src["camera_angle_y"]))
                if "camera_angle_y" in src
                else fx
            )
        cx = float(src.get("cx", width / 2.0))
        cy = float(src.get("cy", height / 2.0))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{json_path}: intrinsics are not numbers ({e})") from e
    if not (fx > 0 and fy > 0 and math.isfinite(fx) and math.isfinite(fy)):
        raise ValueError(f"{json_path}: focal length must be positive, got fx={fx}, fy={fy}")
    if not (math.isfinite(cx) and math.isfinite(cy)):
        raise ValueError(f"{json_path}: the principal point must be finite, got cx={cx}, "
                         f"cy={cy}")
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def load_frame(
    root: Path,
    meta: dict[str, Any],
    fr: dict[str, Any],
    json_path: Path,
    downscale: int,
    background: tuple[float, float, float],
    size: tuple[int, int] | None = None,
    masks: dict[str, Path] | None = None,
) -> Frame:
    """Load one frame: image (composited and downscaled), pose, intrinsics and mask.

    ``size`` (width, height), when given, is the size the source image must have; ``masks``
    maps an image's path relative to ``root`` to its mask file.
    """
    return _frames([_shot(root, meta, fr, json_path, downscale, background, size, masks)])[0]


@dataclass
class _Shot:
    """A frame before its image is decoded: pose, intrinsics and how its pixels are made."""

    name: str
    viewmat: np.ndarray  # [4, 4]
    K: np.ndarray  # [3, 3]
    size: tuple[int, int]  # loaded (width, height)
    decode: Callable[[], StoredImage]
    mask: Callable[[], np.ndarray | None]


def _shot(
    root: Path,
    meta: dict[str, Any],
    fr: dict[str, Any],
    json_path: Path,
    downscale: int,
    background: tuple[float, float, float],
    size: tuple[int, int] | None,
    masks: dict[str, Path] | None,
) -> _Shot:
    """A frame's pose, intrinsics and sizes checked from its file's header (nothing decoded)."""
    src = {**meta, **fr}  # per-frame intrinsics override the top-level ones
    img_path = _image_file(root, str(fr["file_path"]))
    w, h = image_size(img_path)
    exp_w, exp_h = src.get("w"), src.get("h")
    if exp_w is not None and exp_h is not None and (_size(exp_w, "w", json_path),
                                                    _size(exp_h, "h", json_path)) != (w, h):
        raise ValueError(
            f"{img_path}: image is {w}x{h} but {json_path.name} says w={exp_w}, h={exp_h}"
        )
    if size is not None and (w, h) != size:
        raise ValueError(
            f"{img_path}: image is {w}x{h} but the first train image is {size[0]}x{size[1]}; "
            "all images of a Blender dataset must have one size"
        )
    K = _intrinsics(src, w, h, json_path)
    nw, nh = w, h
    if downscale > 1:
        nw, nh = max(1, w // downscale), max(1, h // downscale)
        K[0] *= nw / w
        K[1] *= nh / h
    viewmat = blender_c2w_to_viewmat(np.asarray(fr["transform_matrix"], dtype=np.float64))
    mask_file = (masks or {}).get(_relative(root, img_path))

    def mask() -> np.ndarray | None:
        return None if mask_file is None else read_mask(mask_file, img_path, (w, h), (nw, nh))

    return _Shot(img_path.stem, viewmat, K, (nw, nh),
                 functools.partial(_decode, img_path, (nw, nh), background), mask)


def _decode(img_path: Path, size: tuple[int, int], background: tuple[float, float, float]
            ) -> StoredImage:
    """A frame's image as the cache holds it: the file's values at its size; shrunk to
    ``size``, the RGBA composited first (resizing is linear, so this equals resizing
    premultiplied RGBA) and kept as float32."""
    img = decode_image(img_path)
    if (img.shape[1], img.shape[0]) == size:
        return StoredImage(img, background)
    if img.shape[2] == 4:
        small = resize_image(np.concatenate(composite(img, background), axis=2), *size)
        return StoredImage(small, None)
    return StoredImage(resize_image(img, *size), background)


def _frames(shots: list[_Shot], log: Callable[[str], None] | None = None) -> list[Frame]:
    """The frames of ``shots``, each image decoded once in the decoding threads (checking it
    and filling the image cache) and again whenever the cache has dropped it."""
    keys = [new_key() for _ in shots]

    def first(shot: _Shot, key: int) -> tuple[tuple[int, int], bool, np.ndarray | None]:
        stored = shot.decode()
        if stored.size != shot.size:  # the header and the pixels disagree
            raise ValueError(f"image of frame '{shot.name}' decodes to {stored.size}, its "
                             f"header says {shot.size}")
        CACHE.put(key, stored)
        return stored.size, stored.has_alpha, shot.mask()

    loaded = decode_all([functools.partial(first, s, k) for s, k in zip(shots, keys,
                                                                        strict=True)], log)
    return [
        Frame(
            name=shot.name,
            viewmat=torch.from_numpy(shot.viewmat).float(),
            K=torch.from_numpy(shot.K).float(),
            width=size[0],
            height=size[1],
            pixels=LazyPixels(shot.decode, size, has_alpha, key=key),
            mask_bits=MaskBits.of(keep),
        )
        for shot, key, (size, has_alpha, keep) in zip(shots, keys, loaded, strict=True)
    ]


def _relative(root: Path, path: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def load_blender(
    path: str | Path,
    *,
    downscale: int = 1,
    white_background: bool = True,
    test_every: int = -1,
    masks_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    camera_mode: str = "undistort",
) -> SceneDataset:
    """Load a Blender / NeRF-synthetic dataset (see the module docstring for the layout).

    Without ``transforms_test.json``, the train frames are split every ``test_every``-th
    (-1: every 8th). ``log`` gets the decoding's progress lines. ``camera_mode`` is unused
    (Blender's cameras are pinholes).
    """
    root = Path(path)
    background = (1.0, 1.0, 1.0) if white_background else (0.0, 0.0, 0.0)
    train_json = root / "transforms_train.json"
    test_json = root / "transforms_test.json"
    train_meta = read_transforms(train_json)
    test_meta = read_transforms(test_json) if test_json.exists() else None
    masks = None
    if masks_dir:
        names = [_relative(root, _image_file(root, str(fr["file_path"])))
                 for meta in (train_meta, test_meta) if meta is not None
                 for fr in meta["frames"]]
        masks = mask_files(Path(masks_dir), names, root)
    # every source image must have the size of the first train image
    size = image_size(_image_file(root, str(train_meta["frames"][0]["file_path"])))
    train = _frames([_shot(root, train_meta, fr, train_json, downscale, background, size, masks)
                     for fr in train_meta["frames"]], log)
    if test_meta is not None:
        test = _frames([_shot(root, test_meta, fr, test_json, downscale, background, size, masks)
                        for fr in test_meta["frames"]], log)
    else:
        every = DEFAULT_TEST_EVERY if test_every < 0 else test_every
        tr, te = split_every([f.name for f in train], every)
        train, test = [train[i] for i in tr], [train[i] for i in te]
    if not train:
        raise ValueError(f"{root}: no train frames left after the test split")
    centers = np.stack([f.camera_center.double().numpy() for f in train])
    forwards = np.stack([f.viewmat[2, :3].double().numpy() for f in train])  # camera +z, world
    center = look_at_point(centers, forwards)
    return SceneDataset(
        train=train,
        test=test,
        points=None,
        points_rgb=None,
        scene_center=torch.from_numpy(center).float(),
        scene_radius=cameras_extent(centers, center),
        background=background,
        kind="blender",
        path=root,
    )
