"""Shared by the capture tests: the room seen through each lens (tilesplat.data.captures),
written once per test session even across xdist workers, the tiny training they share, and
a COLMAP-to-nerfstudio converter that follows ``ns-process-data``'s conventions."""

from __future__ import annotations

import fcntl
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tilesplat.data import room
from tilesplat.data.captures import pinhole_camera, scene_points, write_capture
from tilesplat.data.colmap_format import qvec_to_rotmat, read_model
from tilesplat.data.dataset import SceneDataset, load_dataset
from tilesplat.data.undistort import Camera
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.evaluate import evaluate

W, H, N_VIEWS, POSE_SEED = 80, 60, 24, 2
TEST_EVERY = 4  # 18 train and 6 test views
_PIN = pinhole_camera(W, H)
_F = _PIN.params[0]
# The lenses: each is the pinhole twin's focal length and centre plus a distortion that
# moves pixels by a few pixels at the corners (the fisheye is wider: 79 degrees off axis).
LENSES = {
    "pinhole": _PIN,
    "simple_radial": Camera("SIMPLE_RADIAL", W, H, (_F, W / 2, H / 2, -0.12)),
    "opencv": Camera("OPENCV", W, H, (_F, _F * 1.02, W / 2 + 0.7, H / 2 - 0.4,
                                      -0.10, 0.02, 0.002, -0.001)),
    "fisheye": Camera("OPENCV_FISHEYE", W, H, (32.0, 32.0, W / 2, H / 2, 0.06, 0.01, -0.004, 0.0)),
}
# The tiny training: 300 steps, the capture's ray-cast points, no densification.
TRAIN = [
    "steps=300",
    "sh_degree=0",
    "refine_start=100000",
    "init_scale=0.5",
    "log_every=50",
    "checkpoint_every=0",
    "progress=false",
    "lpips=false",
    "save_ply=false",
    "save_renders=false",
    f"test_every={TEST_EVERY}",
]


def viewmats() -> np.ndarray:
    return room.camera_poses(N_VIEWS, seed=POSE_SEED)


def shared_captures(base: Path) -> dict[str, Path]:
    """``{"<lens>_<fmt>": folder}`` for every lens in text and binary (the fisheye in binary),
    written by the first worker that asks; the others wait on the lock."""
    base.mkdir(parents=True, exist_ok=True)
    views = viewmats()
    out = {f"{lens}_{fmt}": base / f"{lens}_{fmt}" for lens in LENSES for fmt in ("txt", "bin")
           if not (lens == "fisheye" and fmt == "txt")}
    with open(base / "captures.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "done").is_file():
            pin = scene_points(views, _PIN, stride=4)
            wide = scene_points(views, LENSES["fisheye"], stride=4)
            both = (np.concatenate([pin[0], wide[0]]), np.concatenate([pin[1], wide[1]]))
            for name, folder in out.items():
                lens, fmt = name.rsplit("_", 1)
                if folder.exists():
                    shutil.rmtree(folder)
                points = both if lens == "fisheye" else pin
                write_capture(folder, LENSES[lens], views, fmt=fmt, points=points)
            (base / "done").write_text("ok")
        fcntl.flock(lock, fcntl.LOCK_UN)
    return out


def train(data: Path | SceneDataset, run: Path, extra: list[str] | None = None,
          before: Callable[[Trainer], object] | None = None) -> tuple[Trainer, SceneDataset]:
    """The tiny training of TRAIN on a dataset folder (or a loaded dataset); ``before`` is
    called with the trainer before its first step."""
    cfg = apply_overrides(TrainConfig(), TRAIN + (extra or []))
    ds = data if isinstance(data, SceneDataset) else load_dataset(data, test_every=TEST_EVERY)
    trainer = Trainer(cfg, ds, run, log=lambda _: None)
    if before is not None:
        before(trainer)
    trainer.train()
    return trainer, ds


def psnr_on(trainer: Trainer, frames) -> float:
    return evaluate(trainer.params, frames, trainer.cfg, (0.0, 0.0, 0.0))["psnr"]


# --- ns-process-data's conventions ------------------------------------------------------------

# ns-process-data's applied_transform: x, z, -y of the COLMAP world
APPLIED = np.eye(4)[[0, 2, 1, 3]] * np.array([1.0, 1.0, -1.0, 1.0])[:, None]


def _lens_fields(model: str, p: np.ndarray) -> dict:
    if model == "PINHOLE":
        return {"camera_model": "PINHOLE", "fl_x": p[0], "fl_y": p[1], "cx": p[2], "cy": p[3]}
    if model == "SIMPLE_RADIAL":
        return {"camera_model": "OPENCV", "fl_x": p[0], "fl_y": p[0], "cx": p[1], "cy": p[2],
                "k1": p[3], "k2": 0.0, "p1": 0.0, "p2": 0.0}
    if model == "OPENCV":
        return {"camera_model": "OPENCV", "fl_x": p[0], "fl_y": p[1], "cx": p[2], "cy": p[3],
                "k1": p[4], "k2": p[5], "p1": p[6], "p2": p[7]}
    if model == "OPENCV_FISHEYE":
        return {"camera_model": "OPENCV_FISHEYE", "fl_x": p[0], "fl_y": p[1], "cx": p[2],
                "cy": p[3], "k1": p[4], "k2": p[5], "k3": p[6], "k4": p[7]}
    raise ValueError(model)


def colmap_to_nerfstudio(colmap: Path, out: Path, per_frame: bool = False) -> Path:
    """The COLMAP capture ``colmap`` as a nerfstudio dataset in ``out``, as ns-process-data
    writes one: camera fields at the top level (or in every frame), camera-to-world in OpenGL
    axes with the applied_transform, ``sparse_pc.ply`` in the transformed world, masks as
    ``mask_path``."""
    cams, images, xyz, rgb = read_model(colmap / "sparse" / "0")
    (cam,) = cams.values()
    shutil.copytree(colmap / "images", out / "images")
    lens = {**_lens_fields(cam.model, cam.params), "w": cam.width, "h": cam.height}
    frames = []
    for im in sorted(images.values(), key=lambda im: im.name):
        w2c = np.eye(4)
        w2c[:3, :3], w2c[:3, 3] = qvec_to_rotmat(im.qvec), im.tvec
        c2w = np.linalg.inv(w2c)
        c2w[0:3, 1:3] *= -1  # OpenCV -> OpenGL camera axes
        fr = {"file_path": f"images/{im.name}", "transform_matrix": (APPLIED @ c2w).tolist()}
        if (colmap / "masks" / f"{im.name}.png").is_file():
            (out / "masks").mkdir(exist_ok=True)
            shutil.copy(colmap / "masks" / f"{im.name}.png", out / "masks" / im.name)
            fr["mask_path"] = f"masks/{im.name}"
        frames.append({**fr, **(lens if per_frame else {})})
    pts = xyz @ APPLIED[:3, :3].T
    ply = ["ply", "format ascii 1.0", f"element vertex {len(pts)}", "property float x",
           "property float y", "property float z", "property uint8 red", "property uint8 green",
           "property uint8 blue", "end_header"]
    ply += [f"{p[0]:.8f} {p[1]:.8f} {p[2]:.8f} {c[0]} {c[1]} {c[2]}" for p, c in zip(pts, rgb,
                                                                                    strict=True)]
    (out / "sparse_pc.ply").write_text("\n".join(ply) + "\n")
    meta = {**({} if per_frame else lens), "frames": frames,
            "applied_transform": APPLIED[:3].tolist(), "ply_file_path": "sparse_pc.ply"}
    (out / "transforms.json").write_text(json.dumps(meta, indent=1))
    return out
