"""The depth prior (train/depth_loss.py, ``depth_loss = true``) and the sparse points each
training image sees (COLMAP tracks, read by data/colmap_format.py).

The scene: the room capture (tilesplat.data.captures) with its textures at 15 % contrast (weakly
textured walls, floor and object), 18 train / 6 test views of 80x60, its ray-cast surface points
(every 4th pixel of every view) with their tracks (the views where each is in the image and
not hidden), as the initial Gaussians and as the depth prior's points. 300 steps on the cpu
backend (capture_helpers.TRAIN). The depth error is the mean over the test views' pixels of
|expected depth - ray-cast depth| / ray-cast depth.

Measured (this machine): without the prior 0.0544, with it (depth_lambda = 0.1) 0.0406 (-25 %);
test PSNR 31.23 dB without, 31.31 dB with. gsplat's depth_lambda = 1e-2 gives 0.0519 (-5 %) at
300 steps; 1.0 gives 0.0288 but costs 0.8 dB.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from capture_helpers import TEST_EVERY, TRAIN, colmap_to_nerfstudio, psnr_on
from tilesplat.data import room
from tilesplat.data.captures import (
    observations,
    pinhole_camera,
    scene_depth,
    scene_points,
    write_capture,
)
from tilesplat.data.colmap_format import read_model_tracks
from tilesplat.data.dataset import load_dataset
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.features.depth_loss import DepthPrior, visible_points
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.models import Cameras

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CAM = pinhole_camera(80, 60)
CONTRAST = 0.15
DEPTH_LAMBDA = "depth_lambda=0.1"
LESS = 0.85  # the prior's depth error must be below this fraction of the plain one's (0.75)


@pytest.fixture(scope="module")
def weak(tmp_path_factory):
    """The weakly textured room capture, binary model with tracks; (folder, viewmats, pts)."""
    views = room.camera_poses(24, seed=2)
    points = scene_points(views, CAM, stride=4)
    folder = write_capture(tmp_path_factory.mktemp("weak") / "capture", CAM, views,
                           points=points, contrast=CONTRAST, tracks=True)
    return folder, views, points


def _depth_error(trainer: Trainer, frames) -> float:
    errs = []
    for f in frames:
        cams = Cameras(viewmats=f.viewmat[None], Ks=f.K[None], width=f.width, height=f.height,
                       backgrounds=None)
        with torch.no_grad():
            out = trainer.model.render(trainer.params, cams, trainer.cfg, trainer.cfg.sh_degree,
                                       expected_depth=True)
        truth = scene_depth(f.viewmat.double().numpy(), CAM)
        errs.append(np.nanmean(np.abs(out.depths[0, ..., 0].numpy() - truth) / truth))
    return float(np.mean(errs))


def _train(ds, run, extra=()):
    cfg = apply_overrides(TrainConfig(), TRAIN + ["backend=cpu", *extra])
    trainer = Trainer(cfg, ds, run, log=lambda _: None)
    trainer.train()
    return trainer


def test_the_depth_prior_lowers_the_depth_error_on_a_weakly_textured_scene(weak, tmp_path):
    folder, _, _ = weak
    ds = load_dataset(folder, test_every=TEST_EVERY)
    plain = _train(ds, tmp_path / "plain")
    prior = _train(ds, tmp_path / "depth", ["depth_loss=true", DEPTH_LAMBDA])
    (feature,) = prior.features
    assert isinstance(feature, DepthPrior)
    e0, e1 = _depth_error(plain, ds.test), _depth_error(prior, ds.test)
    p0, p1 = psnr_on(plain, ds.test), psnr_on(prior, ds.test)
    print(f"weak texture: test depth error {e0:.4f} without, {e1:.4f} with depth_loss; "
          f"test PSNR {p0:.2f} / {p1:.2f} dB")
    assert e1 < LESS * e0, (e0, e1)
    assert p1 > p0 - 0.3, (p0, p1)  # no price in colour worth the name (measured +0.08 dB)


def test_the_tracks_are_read_from_binary_and_text_models(weak, tmp_path):
    folder, views, (xyz, _) = weak
    txt = write_capture(tmp_path / "txt", CAM, views, fmt="txt", points=weak[2],
                        contrast=CONTRAST, tracks=True)
    seen = observations(xyz, views, CAM)
    for where in (folder, txt):
        *_, tracks = read_model_tracks(where / "sparse" / "0")
        by_image = tracks.of_image()
        for i, (_, rows) in enumerate(seen):
            assert np.array_equal(by_image[i + 1], np.sort(rows)), (where, i)
    a = load_dataset(folder, test_every=0)
    b = load_dataset(txt, test_every=0)
    for fa, fb, (_, rows) in zip(a.train, b.train, seen, strict=True):
        assert torch.equal(fa.point_ids, fb.point_ids)
        assert np.array_equal(fa.point_ids.numpy(), np.sort(rows))
    # a model without tracks: no point_ids (the depth prior then finds the visible points)
    assert all(f.point_ids is None for f in load_dataset(
        write_capture(tmp_path / "none", CAM, views[:3], points=weak[2]), test_every=0).train)


def test_points_without_tracks_are_found_by_a_coarse_z_buffer(weak, tmp_path):
    """A nerfstudio dataset (ply_file_path, no tracks): the points the prior takes for each
    view are mostly those the view sees (precision and recall against the tracks)."""
    folder, _, _ = weak
    ns = load_dataset(colmap_to_nerfstudio(folder, tmp_path / "ns"))
    colmap = {f.name: f for f in load_dataset(folder, test_every=0).train}
    assert all(f.point_ids is None for f in ns.train)
    precision, recall = [], []
    for f in ns.train:
        got = set(visible_points(ns.points, f).tolist())
        want = set(colmap[f.name].point_ids.tolist())  # the same rows: the PLY keeps the order
        precision.append(len(got & want) / len(got))
        recall.append(len(got & want) / len(want))
    print(f"coarse z-buffer: precision {np.mean(precision):.3f}, recall {np.mean(recall):.3f}")
    assert np.mean(precision) > 0.9 and np.mean(recall) > 0.5, (precision, recall)
    cfg = apply_overrides(TrainConfig(), TRAIN + ["depth_loss=true", "steps=2", "backend=cpu"])
    feature = DepthPrior(cfg, ns, torch.device("cpu"))
    assert feature.valid.sum(1).tolist() == [len(visible_points(ns.points, f))
                                               for f in ns.train]


def test_the_prior_needs_sparse_points_and_checks_its_keys(tmp_path):
    from tilesplat.data.synthetic import write_synthetic_dataset

    blender = load_dataset(write_synthetic_dataset(tmp_path / "b", n_train=2, n_test=1, size=16))
    cfg = TrainConfig(depth_loss=True, steps=2, progress=False, lpips=False).validate()
    with pytest.raises(ValueError, match="has no sparse points"):
        Trainer(cfg, blender, tmp_path / "run", log=lambda _: None)
    with pytest.raises(ValueError, match="depth_lambda must be >= 0"):
        TrainConfig(depth_lambda=-1.0).validate()
    with pytest.raises(ValueError, match=r"depth_lambda_final must be in \(0, 1\]"):
        TrainConfig(depth_lambda_final=0.0).validate()
    with pytest.raises(ValueError, match="depth_loss is not supported with parallel = 'model'"):
        TrainConfig(depth_loss=True, parallel="model").validate()


def test_a_malformed_track_is_refused_with_its_line(tmp_path):
    from tilesplat.data.colmap_format import read_points3d_txt_tracks

    path = tmp_path / "points3D.txt"
    path.write_text("# a point seen by images 1 and 3\n1 0 0 1 10 20 30 0.5 1 0 3 7\n")
    xyz, _, tracks = read_points3d_txt_tracks(path)
    assert tracks.of_image().keys() == {1, 3} and len(xyz) == 1
    path.write_text("1 0 0 1 10 20 30 0.5 one 0\n")
    with pytest.raises(ValueError, match=r"points3D.txt:1: malformed track"):
        read_points3d_txt_tracks(path)


def test_an_image_with_many_points_keeps_a_seeded_subsample(weak, monkeypatch):
    from tilesplat.train.features import depth_loss

    monkeypatch.setattr(depth_loss, "MAX_POINTS", 100)
    ds = load_dataset(weak[0], test_every=TEST_EVERY)
    cfg = apply_overrides(TrainConfig(), TRAIN + ["depth_loss=true"])
    a, b = (DepthPrior(cfg, ds, torch.device("cpu")) for _ in range(2))
    assert a.points.shape == (len(ds.train), 100, 3) and a.valid.all()
    assert torch.equal(a.points, b.points)  # seeded
    for i, f in enumerate(ds.train):
        seen = ds.points[f.point_ids]
        near = torch.cdist(a.points[i], seen, compute_mode="donot_use_mm_for_euclid_dist")
        assert (near.min(1).values == 0).all()
