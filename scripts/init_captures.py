"""The "captures without points" table of docs/training.md (the recipe's Initialisation): a
judging capture trained from its own points, from ``init = "triangulate"`` (pycolmap, made up
to ``init_frustum_points`` by the frustum's) and from the frustum's points alone; and, for
reference, from the exact surface points of the training views only (``train_points``: the
ray-cast points under every 8th pixel of the training views, where the capture's points are
those of all its views, the test views' included, as a COLMAP model of all the photos).

Writes the capture (``--captures``: the room at seed 2, the ring of cameras looking outward of
tests/pose_helpers.outward_poses; ``--size``, 24 views, 18 train / 6 test; at 80x60 the room
is the capture tests' own, capture_helpers.shared_captures) into ``--out`` once,
then trains each arm with the defaults (SH degree 0, default densification) for ``--steps``
and prints the test PSNR, the difference to the capture's points, the initial and final
numbers of Gaussians and the init log line. Each arm's row is cached beside the capture
(``init_<steps>.json``), so a rerun prints the table without training.

    PYTHONPATH=src:tests OMP_NUM_THREADS=1 NUMBA_NUM_THREADS=1 python scripts/init_captures.py \
        --captures outward --size 160x120 --steps 1000
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import time
from pathlib import Path

import torch

from capture_helpers import psnr_on, shared_captures
from pose_helpers import outward_poses
from tilesplat.data import room
from tilesplat.data.captures import pinhole_camera, scene_points, write_capture
from tilesplat.data.dataset import load_dataset
from tilesplat.train import TrainConfig, Trainer, apply_overrides

CAPTURES = ("room", "outward")
ARMS = ("points", "triangulate", "frustum", "train_points")
KEYS = ["sh_degree=0", "log_every=1000", "checkpoint_every=0", "progress=false", "lpips=false",
        "save_ply=false", "save_renders=false", "test_every=4"]


def write_captures(out: Path, width: int, height: int, names) -> dict[str, Path]:
    """The folders of the captures ``names`` under ``out`` (written when missing), with the
    ray-cast points of every 8th pixel as the capture's points (tests/test_init_triangulate)."""
    cam = pinhole_camera(width, height)
    folders = {}
    for name in names:
        if (width, height) == (80, 60) and name == "room":
            folders[name] = shared_captures(out / "lens")["pinhole_bin"]
            continue
        folders[name] = folder = out / name
        if (folder / "images").is_dir():
            continue
        views = outward_poses(24) if name == "outward" else room.camera_poses(24, seed=2)
        write_capture(folder, cam, views, points=scene_points(views, cam, stride=8))
    return folders


def run(folder: Path, arms, steps: int, run_dir: Path, extra: list[str]) -> dict[str, dict]:
    """``{arm: {"psnr", "start", "end", "init", "seconds"}}`` on the capture in ``folder``."""
    cache = folder / f"init_{steps}{'_' + '_'.join(extra) if extra else ''}.json"
    rows = json.loads(cache.read_text()) if cache.is_file() else {}
    ds = load_dataset(folder, test_every=4)
    bare = dataclasses.replace(ds, points=None, points_rgb=None)
    for arm in arms:
        if arm in rows:
            continue
        if arm == "triangulate" and importlib.util.find_spec("pycolmap") is None:
            raise SystemExit("init = triangulate needs pycolmap (pip install 'tilesplat[sfm]')")
        data = ds if arm == "points" else bare
        if arm == "train_points":
            width, height = ds.train[0].width, ds.train[0].height
            xyz, rgb = scene_points(torch.stack([f.viewmat for f in ds.train]).double().numpy(),
                                    pinhole_camera(width, height), stride=8)
            data = dataclasses.replace(ds, points=torch.from_numpy(xyz).float(),
                                       points_rgb=torch.from_numpy(rgb).float() / 255.0)
        init = "points" if arm == "train_points" else arm
        cfg = apply_overrides(TrainConfig(), [*KEYS, f"steps={steps}", f"init={init}", *extra])
        lines: list[str] = []
        t0 = time.perf_counter()
        trainer = Trainer(cfg, data, str(run_dir / arm), log=lines.append)
        start = int(trainer.params["means"].shape[0])
        trainer.train()
        rows[arm] = {"psnr": psnr_on(trainer, ds.test), "start": start,
                     "end": int(trainer.params["means"].shape[0]),
                     "init": [x for x in lines if x.startswith("init:")],
                     "seconds": time.perf_counter() - t0}
        print(f"  {folder.name} {arm}: {rows[arm]['psnr']:.2f} dB "
              f"({rows[arm]['seconds']:.0f} s) {rows[arm]['init']}", flush=True)
        cache.write_text(json.dumps(rows, indent=1))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--captures", nargs="+", default=["outward"], choices=CAPTURES)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--size", default="160x120")
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--set", nargs="*", default=[], help="config overrides (key=value), all arms")
    p.add_argument("--out", default="/tmp/init-captures")
    a = p.parse_args()
    torch.set_num_threads(1)
    width, height = (int(x) for x in a.size.split("x"))
    out = Path(a.out) / a.size
    folders = write_captures(out, width, height, a.captures)
    table = []
    for name in a.captures:
        rows = run(folders[name], a.arms, a.steps, out / "run", a.set)
        base = rows.get("points", {}).get("psnr")
        cells = []
        for arm in a.arms:
            r = rows[arm]
            gap = f" ({r['psnr'] - base:+.2f})" if base is not None and arm != "points" else ""
            cells.append(f"{r['psnr']:.2f} dB{gap} [{r['start']:,} -> {r['end']:,}]")
        table.append(f"| {name} | " + " | ".join(cells) + " |")
        for arm in a.arms:
            for line in rows[arm]["init"]:
                print(f"{name} {arm}: {line}")
    print(f"{a.size}, {a.steps} steps: capture | " + " | ".join(a.arms))
    print("\n".join(table))


if __name__ == "__main__":
    main()
