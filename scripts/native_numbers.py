"""The numbers of docs/data.md, "When each mode pays" (issue 38): camera_mode = native against
undistort on two distorted captures of the room (``tilesplat.data.captures``, ray cast through
the lens), trained alike: the same steps, strategy = mcmc (3DGUT's), SH degree 0, the capture's
ray-cast points, one torch thread, the cpu backend.

- ``opencv``: OPENCV 128x96, the room's pinhole focal length, k1 = -0.25, k2 = 0.06,
  p1 = 0.002, p2 = -0.001 (strong barrel distortion: corners moved by ~12 px);
- ``fisheye``: OPENCV_FISHEYE 128x96, f = 42 px, k1..k4 = 0.05, 0.01, -0.003, 0.0005
  (its corners ~93 degrees off axis, its sides ~78);
- ``pinhole``: the pinhole twin (no distortion), which native mode renders through 3DGUT with a
  zero lens: what 3DGUT itself gives against the 2D rasterizer, without a lens.

32 poses (``room.camera_poses``), every 4th a test view. Each run is scored on its own test
views, full image (native: the whole distorted image; undistort: the undistorted image it
trained on), and each model also on the same pixels: the undistorted cameras' test views
(native through ``--pinhole``'s cameras, rendered through 3DGUT as it was trained), against
the undistorted test images (resampled from the distorted ones, what the undistort arm trained
on) and against the truth of those cameras
(the room ray cast through them, sharp). Wall time: the training loop alone
(``Trainer.train``), the arms interleaved per capture.

    PYTHONPATH=src .venv/bin/python scripts/native_numbers.py [--steps 300] [--work DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from tilesplat.data import room
from tilesplat.data.captures import pinhole_camera, render, scene_points, write_capture
from tilesplat.data.dataset import load_dataset
from tilesplat.data.undistort import Camera, plan
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.evaluate import evaluate

W, H, VIEWS, TEST_EVERY = 128, 96, 32, 4
F = pinhole_camera(W, H).params[0]
LENSES = {
    "pinhole": pinhole_camera(W, H),
    "opencv": Camera("OPENCV", W, H, (F, F, W / 2, H / 2, -0.25, 0.06, 0.002, -0.001)),
    "fisheye": Camera("OPENCV_FISHEYE", W, H, (42.0, 42.0, W / 2, H / 2, 0.05, 0.01, -0.003,
                                               0.0005)),
}


def config(mode: str, steps: int) -> TrainConfig:
    return apply_overrides(TrainConfig(), [
        f"steps={steps}", "sh_degree=0", "strategy=mcmc", f"camera_mode={mode}",
        "init_scale=0.5", "log_every=50", "checkpoint_every=0", "progress=false",
        "lpips=false", "save_ply=false", "save_renders=false", f"test_every={TEST_EVERY}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--lenses", nargs="+", default=["opencv", "fisheye"],
                        choices=list(LENSES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    work = args.work or Path(tempfile.mkdtemp(prefix="native-"))
    views = room.camera_poses(VIEWS, seed=2)
    print(f"| capture | mode | trains as | test PSNR, own images (full) | undistorted cameras: "
          f"undistorted images | undistorted cameras: ray-cast truth | train wall time "
          f"({args.steps} steps) | Gaussians |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.lenses:
        cam = LENSES[name]
        folder = work / name
        if not (folder / "sparse").is_dir():
            write_capture(folder, cam, views, fmt="bin", points=scene_points(views, cam, 6))
        target = plan(cam).target  # the undistorted camera
        sharp_images = None
        for mode in ("native", "undistort"):
            lines: list[str] = []
            ds = load_dataset(folder, test_every=TEST_EVERY, camera_mode=mode, log=lines.append)
            cfg = config(mode, args.steps)
            torch.manual_seed(0)
            trainer = Trainer(cfg, ds, work / "runs" / f"{name}-{mode}", log=lambda _: None)
            t0 = time.perf_counter()
            trainer.train()
            secs = time.perf_counter() - t0
            own = evaluate(trainer.params, ds.test, cfg, ds.background)["psnr"]
            # the same pixels: the undistorted cameras, as --pinhole renders the run
            und = load_dataset(folder, test_every=TEST_EVERY,
                               camera_mode="pinhole" if mode == "native" else "undistort")
            if sharp_images is None:
                sharp_images = [torch.from_numpy(render(f.viewmat.double().numpy(), target)[0])
                                .float() for f in und.test]
            truth = [dataclasses.replace(f, image=im)
                     for f, im in zip(und.test, sharp_images, strict=True)]
            same = evaluate(trainer.params, und.test, cfg, und.background)["psnr"]
            sharp = evaluate(trainer.params, truth, cfg, und.background)["psnr"]
            f = ds.train[0]
            how = f"{f.camera_model}{' + 3DGUT' if f.lens else ''} {f.width}x{f.height}"
            print(f"| {cam.model} {W}x{H} | {mode} | {how} | {own:.2f} dB | {same:.2f} dB | "
                  f"{sharp:.2f} dB | {secs:.0f} s | {len(trainer.params['means'])} | "
                  f"<!-- {lines[0]} -->", flush=True)


if __name__ == "__main__":
    main()
