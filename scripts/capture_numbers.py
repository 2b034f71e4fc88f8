"""The numbers of docs/data.md for distorted, fisheye and nerfstudio captures (issue 23).

1. PSNR against the pinhole twin: the room (``tilesplat.data.captures``) ray cast through each
   lens of the capture tests (``tests/capture_helpers.py``: 80x60, 24 poses, every 4th a test
   view) is trained with the tests' tiny recipe (300 steps, SH 0, no densification, one torch
   thread) and scored on the pinhole twin's test views (the same poses through a pinhole: the
   sharp truth), beside its own test views. The nerfstudio captures are the COLMAP ones
   converted as ``ns-process-data`` writes them.
2. Load time of a 100-image capture: a SIMPLE_RADIAL capture (k = -0.12, the tests' lens) of
   ``--size`` images (default 640x480), undistorted to PINHOLE on load: the first load
   (undistorts and writes the cache), the loads that read the cache, and loads with the cache
   folder unwritable (undistorted in memory every time); the pinhole twin's load beside them.
   Ray casting a 640x480 view through the lens takes ~9 s, so ``--distinct`` (default 5) views
   are rendered and repeated over the 100 images (the load does not depend on the content).

    PYTHONPATH=src .venv/bin/python scripts/capture_numbers.py [--size 640x480] [--images 100]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from capture_helpers import (  # noqa: E402  (the tests' captures, so the numbers are theirs)
    LENSES,
    TEST_EVERY,
    colmap_to_nerfstudio,
    psnr_on,
    shared_captures,
    train,
    viewmats,
)
from tilesplat.data.captures import pinhole_camera, render, scene_points, write_capture  # noqa: E402
from tilesplat.data.colmap_format import ColmapCamera, ColmapImage  # noqa: E402
from tilesplat.data.colmap_write import rotmat_to_qvec, write_model  # noqa: E402
from tilesplat.data.dataset import load_dataset  # noqa: E402
from tilesplat.data.room import camera_poses  # noqa: E402
from tilesplat.data.undistort import Camera  # noqa: E402
from tilesplat.data.undistort_cache import FOLDER  # noqa: E402
from tilesplat.io.images import write_png  # noqa: E402


def psnr_table(work: Path) -> None:
    caps = shared_captures(work / "lens_captures")
    kinds = {
        "PINHOLE (txt)": caps["pinhole_txt"],
        "SIMPLE_RADIAL (txt)": caps["simple_radial_txt"],
        "SIMPLE_RADIAL (bin)": caps["simple_radial_bin"],
        "OPENCV (txt)": caps["opencv_txt"],
        "OPENCV (bin)": caps["opencv_bin"],
        "OPENCV_FISHEYE (bin)": caps["fisheye_bin"],
        "nerfstudio OPENCV": colmap_to_nerfstudio(caps["opencv_bin"], work / "ns_opencv"),
        "nerfstudio OPENCV_FISHEYE": colmap_to_nerfstudio(caps["fisheye_bin"], work / "ns_fish"),
    }
    twin = load_dataset(caps["pinhole_txt"], test_every=TEST_EVERY)
    print("| capture | trains as | PSNR on the pinhole twin's test views | on its own | "
          "minus the twin's |")
    print("| --- | --- | --- | --- | --- |")
    base = None
    for name, folder in kinds.items():
        lines: list[str] = []
        ds = load_dataset(folder, test_every=TEST_EVERY, log=lines.append)
        # nerfstudio: its own split would differ; the same every-4th split as the twin
        t0 = time.perf_counter()
        trainer, _ = train(ds, work / "runs" / name.replace(" ", "_"))
        secs = time.perf_counter() - t0
        got, own = psnr_on(trainer, twin.test), psnr_on(trainer, ds.test)
        base = got if base is None else base
        f = ds.train[0]
        how = f"{f.camera_model} {f.width}x{f.height}"
        print(f"| {name} | {how} | {got:.2f} dB | {own:.2f} dB | {got - base:+.2f} dB | "
              f"<!-- {secs:.0f} s; {lines[0] if lines else ''} -->", flush=True)


def fisheye_table(work: Path) -> None:
    """The fisheye against a pinhole twin of its own angular resolution: the same poses through
    a pinhole with the fisheye's focal length (80x60 at f = 32 px is 103 degrees wide, inside
    the fisheye's view), trained alike; both scored on that twin's test views."""
    caps = shared_captures(work / "lens_captures")
    fish = LENSES["fisheye"]
    f = fish.params[0]
    wide = Camera("PINHOLE", fish.width, fish.height, (f, f, fish.params[2], fish.params[3]))
    views = viewmats()
    pts = scene_points(views, wide, stride=4)
    twin_dir = write_capture(work / "wide_pinhole", wide, views, fmt="bin", points=pts)
    twin = load_dataset(twin_dir, test_every=TEST_EVERY)
    print(f"\n| capture (twin: PINHOLE f = {f:g} px, 80x60) | PSNR on the wide twin's test views |"
          " on its own | minus the twin's |")
    print("| --- | --- | --- | --- |")
    base = None
    for name, folder in (("wide PINHOLE twin", twin_dir),
                         ("OPENCV_FISHEYE (bin)", caps["fisheye_bin"]),
                         ("nerfstudio OPENCV_FISHEYE",
                          colmap_to_nerfstudio(caps["fisheye_bin"], work / "ns_fish2"))):
        ds = load_dataset(folder, test_every=TEST_EVERY)
        trainer, _ = train(ds, work / "runs" / ("wide_" + name.replace(" ", "_")))
        got, own = psnr_on(trainer, twin.test), psnr_on(trainer, ds.test)
        base = got if base is None else base
        print(f"| {name} | {got:.2f} dB | {own:.2f} dB | {got - base:+.2f} dB |", flush=True)


def write_big_capture(out: Path, cam: Camera, n: int, distinct: int) -> None:
    views = camera_poses(distinct, seed=5)
    (out / "images").mkdir(parents=True)
    for i, v in enumerate(views):
        write_png(out / "images" / f"view_{i:03d}.png", render(v, cam)[0].astype(np.float32))
    images = []
    for i in range(n):
        name = f"view_{i:03d}.png"
        if i >= distinct:
            shutil.copy(out / "images" / f"view_{i % distinct:03d}.png", out / "images" / name)
        v = views[i % distinct]
        images.append(ColmapImage(i + 1, rotmat_to_qvec(v[:3, :3]), v[:3, 3].copy(), 1, name))
    xyz, rgb = scene_points(views[:1], cam, stride=16)
    write_model(out / "sparse" / "0", [ColmapCamera(1, cam.model, cam.width, cam.height,
                                                    cam.array)], images, xyz, rgb, fmt="bin")


def timed_load(folder: Path) -> float:
    t0 = time.perf_counter()
    load_dataset(folder, test_every=0)
    return time.perf_counter() - t0


def load_times(work: Path, width: int, height: int, n: int, distinct: int) -> None:
    pin = pinhole_camera(width, height)
    lens = LENSES["simple_radial"]
    cam = Camera("SIMPLE_RADIAL", width, height,
                 (pin.params[0], width / 2, height / 2, lens.params[3]))
    t0 = time.perf_counter()
    folder = work / "big_sr"
    write_big_capture(folder, cam, n, distinct)
    twin = work / "big_pinhole"
    write_big_capture(twin, pin, n, distinct)
    print(f"\n{n} images of {width}x{height} ({distinct} distinct), written in "
          f"{time.perf_counter() - t0:.0f} s")
    lines: list[str] = []
    load_dataset(folder, test_every=0, log=lines.append)  # warm-up: imports, first allocations
    print(lines[0])
    shutil.rmtree(folder / FOLDER)
    first = timed_load(folder)
    cached = [timed_load(folder) for _ in range(3)]
    shutil.rmtree(folder / FOLDER)
    (folder / FOLDER).write_text("not a folder: the cache cannot be written")
    memory = [timed_load(folder) for _ in range(2)]
    pinhole = [timed_load(twin) for _ in range(3)]
    print("| load of the capture | seconds |")
    print("| --- | --- |")
    print(f"| first load: undistort, write the cache | {first:.2f} |")
    print(f"| later loads: read the cache (median of 3) | {statistics.median(cached):.2f} |")
    print(f"| no cache (unwritable): undistort in memory (median of 2) | "
          f"{statistics.median(memory):.2f} |")
    print(f"| its pinhole twin, nothing to undistort (median of 3) | "
          f"{statistics.median(pinhole):.2f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="640x480", help="WxH of the 100-image capture")
    ap.add_argument("--images", type=int, default=100)
    ap.add_argument("--distinct", type=int, default=5)
    ap.add_argument("--skip-psnr", action="store_true")
    ap.add_argument("--skip-load", action="store_true")
    ap.add_argument("--skip-fisheye", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    width, height = (int(v) for v in args.size.lower().split("x"))
    with tempfile.TemporaryDirectory(prefix="capture_numbers-") as tmp:
        work = Path(tmp)
        if not args.skip_psnr:
            psnr_table(work)
        if not args.skip_fisheye:
            fisheye_table(work)
        if not args.skip_load:
            load_times(work, width, height, args.images, args.distinct)


if __name__ == "__main__":
    main()
