"""nerfstudio's transforms.json: the same capture as a COLMAP model and as ns-process-data
would write it gives the same cameras, images and points; its split, downscale folders,
per-frame fields, masks and depth paths; and bad files fail with one clear message."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from capture_helpers import colmap_to_nerfstudio, shared_captures
from tilesplat.cli import main
from tilesplat.data.captures import Distractor, pinhole_camera, write_capture
from tilesplat.data.dataset import detect_layout, load_dataset
from tilesplat.data.room import camera_poses
from tilesplat.io.images import read_image, write_png


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return shared_captures(base / "lens_captures")


def _same(a, b, atol=1e-5):
    assert [f.name for f in a] == [f.name for f in b]
    for fa, fb in zip(a, b, strict=True):
        np.testing.assert_allclose(fa.viewmat.numpy(), fb.viewmat.numpy(), atol=atol, rtol=0)
        assert torch.equal(fa.K, fb.K) and fa.camera_model == fb.camera_model
        assert (fa.width, fa.height) == (fb.width, fb.height)
        assert torch.equal(fa.image, fb.image)


@pytest.mark.parametrize("lens", ["pinhole_bin", "simple_radial_txt", "opencv_bin", "fisheye_bin"])
@pytest.mark.parametrize("per_frame", [False, True])
def test_same_scene_as_transforms_json_gives_the_colmap_cameras(captures, tmp_path, lens,
                                                                 per_frame):
    ns = colmap_to_nerfstudio(captures[lens], tmp_path / "ns", per_frame=per_frame)
    assert detect_layout(ns) == "nerfstudio"
    a = load_dataset(captures[lens], test_every=0)
    b = load_dataset(ns, test_every=0)
    assert b.kind == "nerfstudio"
    _same(a.train, b.train)
    np.testing.assert_allclose(b.points.numpy(), a.points.numpy(), atol=1e-5)
    np.testing.assert_allclose(b.points_rgb.numpy(), a.points_rgb.numpy(), atol=1e-6)


def test_split_images_n_depth_and_mask_paths(captures, tmp_path):
    ns = colmap_to_nerfstudio(captures["pinhole_txt"], tmp_path / "ns")
    meta = json.loads((ns / "transforms.json").read_text())
    n = len(meta["frames"])
    # nerfstudio's default: 90 % train spread evenly (first and last included), the rest test
    ds = load_dataset(ns)
    train_idx = sorted(set(np.linspace(0, n - 1, int(np.ceil(0.9 * n))).astype(int)))
    assert [f.name for f in ds.train] == [f"view_{i:03d}" for i in train_idx]
    assert len(ds.test) == n - len(train_idx) > 0
    # test_every when asked
    assert [f.name for f in load_dataset(ns, test_every=4).test] == [
        f"view_{i:03d}" for i in range(0, n, 4)]
    # the file's own lists win over the fraction
    meta["train_filenames"] = [fr["file_path"] for fr in meta["frames"][2:]]
    meta["test_filenames"] = [fr["file_path"] for fr in meta["frames"][:2]]
    meta["frames"][3]["depth_file_path"] = "depths/view_003.png"
    meta["frames"][1]["mask_path"] = "masks/view_001.png"
    (ns / "masks").mkdir()
    keep = np.full((60, 80), 255, np.uint8)
    keep[10:30, 20:50] = 0
    write_png(ns / "masks" / "view_001.png", keep)
    (ns / "transforms.json").write_text(json.dumps(meta))
    ds = load_dataset(ns)
    assert [f.name for f in ds.test] == ["view_000", "view_001"] and len(ds.train) == n - 2
    assert ds.extras == {"depth_files": {"view_003": ns / "depths/view_003.png"}}
    mask = ds.test[1].mask
    assert mask is not None and not mask[10:30, 20:50].any() and mask.sum() == 80 * 60 - 600
    # images_2 / masks_2 when they exist
    (ns / "images_2").mkdir()
    (ns / "masks_2").mkdir()
    for fr in meta["frames"]:
        name = fr["file_path"].split("/")[-1]
        write_png(ns / "images_2" / name, np.zeros((30, 40, 3), np.uint8))
    write_png(ns / "masks_2" / "view_001.png", keep[::2, ::2])
    small = load_dataset(ns, downscale=2)
    assert (small.train[0].width, small.train[0].height) == (40, 30)
    assert float(small.train[0].image.max()) == 0.0
    np.testing.assert_allclose(small.train[0].K.numpy()[:2], ds.train[0].K.numpy()[:2] / 2)
    assert small.test[1].mask.sum() == 40 * 30 - 150


def test_masks_of_a_nerfstudio_capture_and_masks_dir(tmp_path):
    views = camera_poses(4)
    balls = [Distractor((0.0, 0.0, 0.6), 0.3)] * 4
    col = write_capture(tmp_path / "col", pinhole_camera(80, 60), views, distractors=balls,
                        masks=True)
    ns = colmap_to_nerfstudio(col, tmp_path / "ns")
    a, b = load_dataset(col, test_every=0), load_dataset(ns, test_every=0)
    for fa, fb in zip(a.train, b.train, strict=True):
        assert fa.mask is not None and torch.equal(fa.mask, fb.mask)
    # --set masks_dir: the masks of another folder, COLMAP's naming
    other = tmp_path / "other_masks"
    shutil.copytree(col / "masks", other)
    c = load_dataset(ns, test_every=0, masks_dir=other)
    assert all(torch.equal(fa.mask, fc.mask) for fa, fc in zip(a.train, c.train, strict=True))


BAD = [
    (lambda m: m.update(camera_model="EQUIRECTANGULAR"),
     r"transforms\.json: frame 0 .*EQUIRECTANGULAR \(a 360-degree panorama\) is not supported"),
    (lambda m: m.pop("fl_x"), r"frame 0 \(images/view_000.png\): no 'fl_x'"),
    (lambda m: m.update(camera_model="KANNALA"), r"camera_model 'KANNALA' is not supported"),
    (lambda m: m["frames"][2].pop("transform_matrix"),
     r"frame 2 needs 'file_path' and 'transform_matrix'"),
    (lambda m: m["frames"][1].update(transform_matrix=[[1, 0], [0, 1]]),
     r"transform_matrix must be a finite 3x4 or 4x4 matrix"),
    (lambda m: m.update(k4=0.1), r"k4 = 0.1 of a perspective camera"),
    (lambda m: m.update(applied_transform=[[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]]),
     r"applied_transform must be rigid"),
    (lambda m: m.update(ply_file_path="missing.ply"), r"point cloud not found: .*missing\.ply"),
    (lambda m: m["frames"][0].update(mask_path="masks/none.png"), r"mask_path .*none\.png"),
    (lambda m: m.update(w=81), r"view_000\.png: image is 80x60 but its camera \(OPENCV\) is 81x60"),
    (lambda m: m.update(train_filenames=["images/nope.png"]), r"train_filenames names"),
    (lambda m: m.update(frames=[]), r"non-empty 'frames' list"),
]


@pytest.mark.parametrize("edit, message", BAD)
def test_bad_transforms_fail_with_one_clear_line(captures, tmp_path, capsys, edit, message):
    ns = colmap_to_nerfstudio(captures["simple_radial_txt"], tmp_path / "ns")
    meta = json.loads((ns / "transforms.json").read_text())
    edit(meta)
    (ns / "transforms.json").write_text(json.dumps(meta))
    before = sorted(p.name for p in ns.iterdir())
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        load_dataset(ns)
    assert sorted(p.name for p in ns.iterdir()) == before  # no undistortion cache either
    assert main(["train", "--data", str(ns), "--set", f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilesplat train: error:"), err
    assert sorted(p.name for p in ns.iterdir()) == before and not (tmp_path / "run").exists()


def test_bad_ply_and_a_mask_of_the_wrong_size(captures, tmp_path):
    ns = colmap_to_nerfstudio(captures["pinhole_txt"], tmp_path / "ns")
    ply = ns / "sparse_pc.ply"
    good = ply.read_text()
    ply.write_text(good.replace("element vertex", "element vertex 9999999 #"))
    with pytest.raises(ValueError, match="sparse_pc.ply"):
        load_dataset(ns)
    ply.write_text(good)
    meta = json.loads((ns / "transforms.json").read_text())
    meta["frames"][0]["mask_path"] = "m.png"
    (ns / "transforms.json").write_text(json.dumps(meta))
    write_png(ns / "m.png", np.zeros((59, 80), np.uint8))
    with pytest.raises(ValueError, match=r"mask .*m\.png is 80x59 but its image .*view_000\.png "
                                         r"is 80x60"):
        load_dataset(ns)
    assert read_image(ns / "m.png").shape[:2] == (59, 80)
