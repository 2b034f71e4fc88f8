"""COLMAP datasets: ``images/`` and ``sparse/0/{cameras,images,points3D}.{bin,txt}``.

Pinhole cameras only: PINHOLE and SIMPLE_PINHOLE, and the distortion models (SIMPLE_RADIAL,
RADIAL, OPENCV, FULL_OPENCV) when all their distortion coefficients are zero. Anything else
must first be undistorted with ``colmap image_undistorter``, which writes PINHOLE cameras.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..io.images import read_image, resize_image
from .colmap_format import ColmapCamera, qvec_to_rotmat, read_model
from .frames import Frame, SceneDataset, cameras_extent, image_to_tensors, split_every

# model -> index of the first distortion parameter (after focal lengths and principal point)
DISTORTED_MODELS = {"SIMPLE_RADIAL": 3, "RADIAL": 3, "OPENCV": 4, "FULL_OPENCV": 4}


def camera_intrinsics(cam: ColmapCamera, source: Path) -> np.ndarray:
    """[3, 3] pinhole K of a COLMAP camera at its calibrated size.

    Raises:
        ValueError: the model is not pinhole and has distortion (or is a fisheye model).
    """
    p = cam.params
    if cam.model in DISTORTED_MODELS and np.any(p[DISTORTED_MODELS[cam.model] :] != 0):
        raise ValueError(
            f"{source}: camera {cam.camera_id} uses {cam.model} with non-zero distortion "
            f"{p[DISTORTED_MODELS[cam.model] :].tolist()}; only pinhole cameras are supported. "
            "Undistort the images first: colmap image_undistorter --image_path images "
            "--input_path sparse/0 --output_path undistorted --output_type COLMAP"
        )
    if cam.model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "RADIAL"):
        fx = fy = p[0]
        cx, cy = p[1], p[2]
    elif cam.model in ("PINHOLE", "OPENCV", "FULL_OPENCV"):
        fx, fy, cx, cy = p[:4]
    else:
        raise ValueError(
            f"{source}: camera {cam.camera_id} uses the unsupported model {cam.model}; only "
            "PINHOLE / SIMPLE_PINHOLE (or undistorted SIMPLE_RADIAL / RADIAL / OPENCV) are "
            "supported. Undistort the images first with colmap image_undistorter."
        )
    if not (fx > 0 and fy > 0 and math.isfinite(fx) and math.isfinite(fy)):
        raise ValueError(f"{source}: camera {cam.camera_id} has non-positive focal length")
    return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


def _sparse_dir(root: Path) -> Path:
    for cand in (root / "sparse" / "0", root / "sparse"):
        if any((cand / f"cameras.{ext}").is_file() for ext in ("bin", "txt")):
            return cand
    raise FileNotFoundError(
        f"COLMAP model not found: expected {root / 'sparse' / '0'}/cameras.bin (or .txt), "
        "images.bin, points3D.bin"
    )


def _load_image(
    root: Path, name: str, cam: ColmapCamera, downscale: int
) -> tuple[np.ndarray, float, float, Path]:
    """(image [h, w, C], x scale, y scale relative to the calibrated size, file)."""
    full = root / "images" / name
    pre = root / f"images_{downscale}" / name
    if downscale > 1 and pre.is_file():
        img = read_image(pre)
        h, w = img.shape[:2]
        # images_N folders are made with rounding up or down depending on the tool.
        if abs(w - cam.width / downscale) > 1 or abs(h - cam.height / downscale) > 1:
            raise ValueError(
                f"{pre}: image is {w}x{h} but the camera is {cam.width}x{cam.height}, so "
                f"images_{downscale}/ should hold {cam.width // downscale}x"
                f"{cam.height // downscale} images"
            )
        return img, w / cam.width, h / cam.height, pre
    if not full.is_file():
        raise FileNotFoundError(f"image of COLMAP image '{name}' not found: {full}")
    img = read_image(full)
    h, w = img.shape[:2]
    if (w, h) != (cam.width, cam.height):
        raise ValueError(
            f"{full}: image is {w}x{h} but its COLMAP camera {cam.camera_id} is "
            f"{cam.width}x{cam.height}"
        )
    if downscale > 1:
        nw, nh = max(1, w // downscale), max(1, h // downscale)
        return resize_image(img, nw, nh), nw / w, nh / h, full
    return img, 1.0, 1.0, full


def load_colmap(
    path: str | Path, *, downscale: int = 1, white_background: bool = True, test_every: int = 8
) -> SceneDataset:
    """Load a COLMAP dataset (see the module docstring); ``white_background`` is unused (the
    images are taken as they are).

    Images sorted by name; every ``test_every``-th (the first included) goes to test.
    With ``downscale`` N, images come from ``images_N/`` when it exists, else are resized.
    """
    root = Path(path)
    sparse = _sparse_dir(root)
    cams, images, xyz, rgb = read_model(sparse)
    if not images:
        raise ValueError(f"{sparse}: the COLMAP model has no registered images")
    cam_file = next(
        sparse / f"cameras.{e}" for e in ("bin", "txt") if (sparse / f"cameras.{e}").is_file()
    )
    Ks = {cid: camera_intrinsics(c, cam_file) for cid, c in cams.items()}
    frames: list[Frame] = []
    for im in sorted(images.values(), key=lambda im: im.name):
        if im.camera_id not in cams:
            raise ValueError(f"{sparse}: image '{im.name}' refers to missing camera {im.camera_id}")
        if not np.isfinite(im.qvec).all() or np.linalg.norm(im.qvec) < 1e-8:
            raise ValueError(f"{sparse}: image '{im.name}' has an invalid rotation {im.qvec}")
        cam = cams[im.camera_id]
        img, sx, sy, file = _load_image(root, im.name, cam, downscale)
        K = Ks[im.camera_id].copy()
        K[0] *= sx
        K[1] *= sy
        viewmat = np.eye(4)
        viewmat[:3, :3] = qvec_to_rotmat(im.qvec)
        viewmat[:3, 3] = im.tvec
        rgb_t, alpha = image_to_tensors(img, (0.0, 0.0, 0.0))
        frames.append(
            Frame(
                name=Path(im.name).stem,
                viewmat=torch.from_numpy(viewmat).float(),
                K=torch.from_numpy(K).float(),
                width=img.shape[1],
                height=img.shape[0],
                image=rgb_t,
                alpha=alpha,
            )
        )
    # frames are already sorted by name, so split_every keeps this order
    tr, te = split_every([f"{i:09d}" for i in range(len(frames))], test_every)
    train, test = [frames[i] for i in tr], [frames[i] for i in te]
    if not train:
        raise ValueError(f"{root}: no train images left after the test split (test_every=1)")
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
