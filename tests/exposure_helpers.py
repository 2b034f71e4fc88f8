"""The exposure criterion on the judging captures (issue 40): the textured room
(:mod:`tilesplat.data.room`, cameras around the object) and a ring of cameras looking out at
its walls, written by :func:`tilesplat.data.captures.write_capture`. The training photos get
the exposure scene's changes (a gain log-uniform in x0.6-1.5 and an offset per channel in
+-0.05, clipped: :func:`tilesplat.data.exposure.exposure_changes`); the test views stay clean.
A run is scored by its test views' cc PSNR; the clean twin is the same capture, unchanged,
without compensation.

``python tests/exposure_helpers.py W H STEPS [modes...] [--per-channel]``
(``PYTHONPATH=src:tests``) prints the table of docs/training.md (Appearance compensation) at
that size (with ``--per-channel``: a gain per channel).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import numpy as np
import torch

from pose_helpers import outward_poses
from tilesplat.data import room
from tilesplat.data.captures import pinhole_camera, scene_points, write_capture
from tilesplat.data.dataset import SceneDataset, load_dataset
from tilesplat.data.exposure import GAIN_RANGE, exposure_changes
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.evaluate import evaluate

N_VIEWS, TEST_EVERY = 24, 4  # 18 train and 6 test views
CAPTURES = ("room", "outward")
# the capture's ray-cast points as the initial Gaussians, no densification (the pose tests')
TRAIN = ["sh_degree=0", "refine_start=100000", "init_scale=0.5", "checkpoint_every=0",
         "progress=false", "lpips=false", "save_ply=false", "save_renders=false",
         f"test_every={TEST_EVERY}", "backend=cpu"]


def write_judging_capture(out: Path, kind: str, width: int, height: int) -> Path:
    """The ``kind`` capture ("room": room.camera_poses(24, seed=2), or "outward") at
    ``width`` x ``height`` with its ray-cast points (a point per 4 pixels at 80 across),
    written once."""
    if (out / "done").is_file():
        return out
    cam = pinhole_camera(width, height)
    views = room.camera_poses(N_VIEWS, seed=2) if kind == "room" else outward_poses(N_VIEWS)
    write_capture(out, cam, views, points=scene_points(views, cam, stride=max(4 * width // 80, 1)))
    (out / "done").write_text("ok")
    return out


def exposed(ds: SceneDataset, seed: int = 0, per_channel: bool = False) -> SceneDataset:
    """``ds`` with every training photo times its gain plus its offsets, clipped to [0, 1];
    with ``per_channel`` a gain per channel (white balance too), each log-uniform in the same
    range."""
    n = len(ds.train)
    gains, offsets = exposure_changes(n, seed)
    gains = np.repeat(gains[:, None], 3, axis=1)
    if per_channel:
        rng = np.random.default_rng([seed, 40])
        gains = np.exp(rng.uniform(math.log(GAIN_RANGE[0]), math.log(GAIN_RANGE[1]), (n, 3)))
    train = [dataclasses.replace(f, image=(f.image * torch.tensor(g, dtype=f.image.dtype)
                                           + torch.tensor(o, dtype=f.image.dtype)).clamp(0, 1))
             for f, g, o in zip(ds.train, gains, offsets, strict=True)]
    return dataclasses.replace(ds, train=train)


def cc_psnr_of(ds: SceneDataset, run: Path, steps: int, mode: str = "none") -> float:
    """The test views' cc PSNR after ``steps`` of training on ``ds`` with ``post_processing
    = mode`` (its defaults otherwise)."""
    cfg = apply_overrides(TrainConfig(), [*TRAIN, f"steps={steps}", f"post_processing={mode}"])
    trainer = Trainer(cfg, ds, run, log=lambda _: None)
    trainer.train()
    return evaluate(trainer.params, ds.test, trainer.cfg, (0.0, 0.0, 0.0))["cc_psnr"]


def judge(base: Path, kind: str, width: int, height: int, steps: int,
          modes: tuple[str, ...] = ("bilateral_grid",), per_channel: bool = False
          ) -> dict[str, float]:
    """{"clean", "none", *modes}: the cc PSNR of the clean twin, of the exposed capture
    (:func:`exposed`) without compensation and with each mode."""
    ds = load_dataset(write_judging_capture(base / f"{kind}_{width}x{height}", kind, width,
                                            height), test_every=TEST_EVERY)
    out = {"clean": cc_psnr_of(ds, base / f"{kind}_clean", steps)}
    dark = exposed(ds, per_channel=per_channel)
    for mode in ("none", *modes):
        out[mode] = cc_psnr_of(dark, base / f"{kind}_{mode}", steps, mode)
    return out


def share(result: dict[str, float], mode: str) -> float:
    """The part of the gap between none and the clean twin that ``mode`` recovers."""
    return (result[mode] - result["none"]) / (result["clean"] - result["none"])


if __name__ == "__main__":
    import tempfile

    torch.set_num_threads(1)
    args = [a for a in sys.argv[1:] if a != "--per-channel"]
    w, h, steps = (int(a) for a in args[:3])
    modes = tuple(args[3:]) or ("bilateral_grid", "affine")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in CAPTURES:
            r = judge(Path(tmp), kind, w, h, steps, modes, "--per-channel" in sys.argv)
            cells = " | ".join(f"{r[m]:.2f} dB ({share(r, m):.2f})" for m in modes)
            print(f"| {kind} | {w}x{h}, {steps} steps | {r['none']:.2f} dB | {cells} | "
                  f"{r['clean']:.2f} dB |", flush=True)
