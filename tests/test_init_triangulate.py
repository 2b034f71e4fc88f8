"""``init = "triangulate"``: a capture with poses and no points starts from the features of its
training views matched and triangulated with the poses held fixed, through pycolmap
(data/sfm/triangulate.py); ``auto`` prefers it where pycolmap is installed and it finds enough
points. The room is the capture tests' room at 160 x 120 (at 80 x 60 SIFT finds a handful of
tracks). CI installs the ``sfm`` extra (pycolmap); nothing here is skipped without it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from tilesplat.data import room as room_scene
from tilesplat.data.captures import pinhole_camera, scene_depth, scene_points, write_capture
from tilesplat.data.dataset import load_dataset
from tilesplat.data.sfm import triangulate as tri
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.models.init import init_choice, initial_gaussians

pytestmark = pytest.mark.usefixtures("one_torch_thread")

W, H = 160, 120


@pytest.fixture(scope="module")
def room(tmp_path_factory: pytest.TempPathFactory):
    views = room_scene.camera_poses(24, seed=2)
    cam = pinhole_camera(W, H)
    folder = tmp_path_factory.mktemp("room160") / "capture"
    write_capture(folder, cam, views, points=scene_points(views, cam, stride=8))
    ds = load_dataset(folder, test_every=4)
    return ds, dataclasses.replace(ds, points=None, points_rgb=None), cam


def test_the_points_lie_on_the_surfaces_and_are_cached(room):
    _, bare, cam = room
    lines: list[str] = []
    first = tri.triangulate_known_poses(bare.train, bare.path, log=lines.append)
    assert not first.cached and lines and "18 views" in lines[0]
    pts = first.points.astype(np.float64)
    assert len(pts) >= 150 and first.reprojection_error < 1.0
    assert first.rgb.shape == pts.shape and (first.rgb >= 0).all() and (first.rgb <= 1).all()
    # each point against the ray-cast surface of the view that sees it best
    best = np.full(len(pts), np.inf)
    for f in bare.train:
        vm = f.viewmat.double().numpy()
        c = pts @ vm[:3, :3].T + vm[:3, 3]
        u = f.K[0, 0].item() * c[:, 0] / c[:, 2] + f.K[0, 2].item()
        v = f.K[1, 1].item() * c[:, 1] / c[:, 2] + f.K[1, 2].item()
        ok = (c[:, 2] > 0) & (u >= 0) & (u < W) & (v >= 0) & (v < H)
        depth = scene_depth(vm, cam)
        true = np.full(len(pts), np.nan)
        true[ok] = depth[v[ok].astype(int), u[ok].astype(int)]
        best = np.fmin(best, np.abs(c[:, 2] / true - 1.0))
    assert np.mean(best < 0.03) > 0.8, np.quantile(best, [0.5, 0.8, 0.9])
    # the second load reads the cache beside the data; a moved view asks for a new one
    again = tri.triangulate_known_poses(bare.train, bare.path)
    assert again.cached and np.array_equal(again.points, first.points)
    cached = list((bare.path / tri.CACHE_FOLDER).glob(f"{tri.PREFIX}*.npz"))
    assert len(cached) == 1
    moved = [dataclasses.replace(bare.train[0], viewmat=bare.train[0].viewmat.clone(),
                                 image=bare.train[0].image)] + list(bare.train[1:])
    moved[0].viewmat[0, 3] += 0.01
    assert tri.cache_key(moved) != tri.cache_key(bare.train)


def test_a_damaged_cache_is_recomputed_and_bad_input_is_refused(room, tmp_path):
    _, bare, _ = room
    first = tri.triangulate_known_poses(bare.train, bare.path)
    path = bare.path / tri.CACHE_FOLDER / f"{tri.PREFIX}{tri.cache_key(bare.train)}.npz"
    path.write_bytes(b"not an npz")
    again = tri.triangulate_known_poses(bare.train, bare.path)
    # recomputed (pycolmap's threads may order the matches otherwise: a point more or less)
    assert not again.cached and abs(len(again.points) - len(first.points)) <= 0.05 * len(
        first.points)
    with pytest.raises(ValueError, match="at least 2 views, got 1"):
        tri.triangulate_known_poses(bare.train[:1], None)
    fisheye = [dataclasses.replace(f, camera_model="ortho", image=f.image) for f in bare.train]
    with pytest.raises(ValueError, match="camera_model 'ortho'"):
        tri.triangulate_known_poses(fisheye, None)
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        lines: list[str] = []
        tri.triangulate_known_poses(bare.train[:6], ro, log=lines.append)
        assert any("not cached" in line for line in lines)


def test_auto_triangulates_and_the_frustum_makes_up_the_count(room):
    ds, bare, _ = room
    cfg = TrainConfig()
    assert init_choice(cfg, ds)[0] == "points"
    assert init_choice(cfg, bare)[0] == "triangulate"
    found = len(tri.triangulate_known_poses(bare.train, bare.path).points)  # cached from here
    lines: list[str] = []
    torch.manual_seed(0)
    params = initial_gaussians(apply_overrides(cfg, ["init_frustum_points=1000"]), bare,
                               log=lines.append)
    assert params["means"].shape == (1000, 3) and len(lines) == 2, lines
    assert lines[0].startswith(f"init: triangulate, {found} points") and "cache" in lines[0]
    assert lines[1].startswith(f"init: frustum, {1000 - found} points")
    assert "to make up init_frustum_points = 1,000" in lines[1]
    lines.clear()
    params = initial_gaussians(apply_overrides(cfg, ["init=triangulate",
                                                     "init_frustum_points=100"]), bare,
                               log=lines.append)  # enough triangulated: nothing is added
    assert params["means"].shape == (found, 3) and len(lines) == 1


def test_without_points_it_trains_near_the_capture_with_points(room, tmp_path):
    """The room without its points, with pycolmap (triangulated, made up by the frustum's)
    and without it (the frustum's alone), within 1.5 dB of the room with its points."""
    ds, bare, _ = room
    # measured (one thread): 400 steps, the capture's 7,200 points 27.81 dB, its ~300
    # triangulated points made up by the frustum's to 20,000: 28.23 dB, the frustum's 20,000
    # alone 28.15 dB (600 steps: 29.00 and 29.02; made up to the points' 7,200 only: 26.78
    # at 400, 27.65 at 600)
    steps = [
        "steps=400", "sh_degree=0", "log_every=400", "checkpoint_every=0", "progress=false",
        "lpips=false", "save_ply=false", "save_renders=false", "test_every=4", "backend=cpu",
    ]
    from tilesplat.train.loop.trainer import Trainer
    from tilesplat.train.rundir.evaluate import evaluate

    scores = {}
    for name, data, init in (("points", ds, "points"), ("triangulate", bare, "triangulate"),
                             ("frustum", bare, "frustum")):
        torch.manual_seed(0)
        cfg = apply_overrides(TrainConfig(), steps + [f"init={init}"])
        trainer = Trainer(cfg, data, Path(tmp_path / name), log=lambda _: None)
        trainer.train()
        scores[name] = evaluate(trainer.params, ds.test, cfg, (0.0, 0.0, 0.0))["psnr"]
    print("room, test PSNR by init:", {k: round(v, 2) for k, v in scores.items()})
    assert scores["triangulate"] > scores["points"] - 1.5, scores
    assert scores["frustum"] > scores["points"] - 1.5, scores
