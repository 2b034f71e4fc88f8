"""Structure-from-motion on the textured room (tilesplat.data.room): ``prepare`` recovers the
poses, training on them matches training on the true poses, ``train --images`` runs both steps,
and pycolmap's model writer round-trips through tilesplat's own COLMAP reader.

CI installs the ``sfm`` extra (pycolmap); nothing here is skipped without it. The room and its
reconstruction are made once per session and shared by the xdist workers (sfm_helpers).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from sfm_helpers import pose_errors, shared_room, write_colmap_text
from tilesplat.cli import main
from tilesplat.data.colmap_format import qvec_to_rotmat, read_model
from tilesplat.data.room import TINY
from tilesplat.data.sfm import REPORT_FILE

STAGES = ["photos", "features", "matching", "mapping", "undistortion"]
# The tiny training of the comparison: 60x45 images, the SfM points, no densification.
TRAIN = [
    "steps=200",
    "downscale=4",
    "sh_degree=0",
    "refine_start=100000",
    "log_every=50",
    "checkpoint_every=200",
    "progress=false",
    "lpips=false",
    "save_ply=false",
    "save_renders=false",
]
CONTROL_DEG = 8.0  # the negative control's pose error: it must cost more than 1 dB


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this session
    return shared_room(base / "sfm_room")


def test_prepare_recovers_the_poses(room):
    report = json.loads((room.dataset / REPORT_FILE).read_text())
    n = TINY["n_views"]
    assert report["n_images"] == n and report["n_registered"] == n and report["left_out"] == []
    assert report["n_points"] > 500 and 0 < report["mean_reprojection_error"] < 1.0
    assert list(report["seconds"]) == list(report["cpu_seconds"]) == STAGES
    assert [c["model"] for c in report["cameras"]] == ["PINHOLE"]  # one camera, undistorted
    assert [ln.split(":")[0] for ln in room.log if ln.startswith("[")] == [
        f"[{i}/5] {s}" for i, s in enumerate(STAGES, 1)
    ]
    assert sorted(p.name for p in (room.dataset / "images").iterdir()) == room.truth["names"]
    assert {"cameras.bin", "images.bin", "points3D.bin"} <= {
        p.name for p in (room.dataset / "sparse" / "0").iterdir()
    }
    err = pose_errors(room.truth, room.dataset / "sparse" / "0")
    print(
        f"\nstages {report['seconds']} (cpu {report['cpu_seconds']}); "
        f"rotation error max {err['rot_deg'].max():.3f} deg "
        f"(mean {err['rot_deg'].mean():.3f}); position error max "
        f"{100 * err['pos_frac'].max():.3f}% of the scene size "
        f"(mean {100 * err['pos_frac'].mean():.3f}%)"
    )
    assert err["rot_deg"].max() < 1.0
    assert err["pos_frac"].max() < 0.01


def _true_pose_dataset(room, out: Path, perturb_deg: float = 0.0) -> Path:
    """The room's images with their true poses (each rotated about its centre by
    ``perturb_deg`` about a random axis) and the SfM points mapped into the true frame."""
    err = pose_errors(room.truth, room.dataset / "sparse" / "0")
    s, rot, t = err["similarity"]
    _, _, xyz, rgb = read_model(room.dataset / "sparse" / "0")
    rng = np.random.default_rng(0)
    poses = {}
    for name in err["names"]:
        m = np.array(room.truth["viewmats"][room.truth["names"].index(name)])
        if perturb_deg:
            q = np.concatenate([[np.cos(np.radians(perturb_deg) / 2)], rng.normal(size=3)])
            q[1:] *= np.sin(np.radians(perturb_deg) / 2) / np.linalg.norm(q[1:])
            m[:3] = qvec_to_rotmat(q) @ m[:3]
        poses[name] = m
    K = np.array(room.truth["K"])
    write_colmap_text(
        out, K, room.truth["width"], room.truth["height"], poses, s * xyz @ rot.T + t, rgb
    )
    (out / "images").mkdir()
    for name in err["names"]:
        shutil.copyfile(room.scene / "images" / name, out / "images" / name)
    return out


def _train_psnr(data: Path, run: Path) -> float:
    args = ["train", "--data", str(data), "--set", f"run_dir={run}"]
    for kv in TRAIN:
        args += ["--set", kv]
    assert main(args) == 0
    return json.loads((run / "metrics.json").read_text())["psnr"]


def test_training_on_recovered_poses_is_within_1db_of_true_poses(room, tmp_path, capsys):
    true_data = _true_pose_dataset(room, tmp_path / "true")
    psnr_true = _train_psnr(true_data, tmp_path / "run_true")
    psnr_rec = _train_psnr(room.dataset, tmp_path / "run_recovered")
    # Negative control: the comparison must see a pose error of a few degrees.
    bad = _true_pose_dataset(room, tmp_path / "bad", perturb_deg=CONTROL_DEG)
    psnr_bad = _train_psnr(bad, tmp_path / "run_bad")
    with capsys.disabled():
        print(
            f"\ntest PSNR: true poses {psnr_true:.2f} dB, recovered {psnr_rec:.2f} dB, "
            f"true rotated by {CONTROL_DEG} deg {psnr_bad:.2f} dB"
        )
    assert abs(psnr_rec - psnr_true) < 1.0
    assert psnr_bad < psnr_true - 1.0


def test_train_images_prepares_into_the_run_folder_then_trains(room, tmp_path, capsys):
    photos = tmp_path / "photos" / "images"
    shutil.copytree(room.scene / "images", photos)
    run = tmp_path / "run"
    args = ["train", "--images", str(photos), "--set", f"run_dir={run}", "--set", "steps=10"]
    for kv in TRAIN[1:]:
        args += ["--set", kv]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[5/5] undistortion" in out and "test PSNR" in out
    assert (run / "data" / "sparse" / "0" / "images.bin").is_file()
    assert json.loads((run / "metrics.json").read_text())["step"] == 10
    assert f"data = {json.dumps(str(run / 'data'))}" in (run / "config.toml").read_text()
    # --resume works on it, and a second --images run with the same run_dir reuses the poses
    assert main(["train", "--resume", str(run), "--set", "steps=12"]) == 0
    assert main(["train", "--images", str(photos), "--data", str(run / "data")]) == 2
    assert "not both" in capsys.readouterr().err


def _pycolmap_model(pycolmap):
    """A pycolmap reconstruction with several camera models, in memory."""
    options = pycolmap.SyntheticDatasetOptions()
    options.num_rigs = 3
    options.num_frames_per_rig = 4
    options.num_points3D = 60
    return pycolmap.synthesize_dataset(options)


@pytest.mark.parametrize("fmt", ["binary", "text"])
def test_round_trip_pycolmap_writer_to_tilesplat_reader(tmp_path, fmt):
    import pycolmap

    rec = _pycolmap_model(pycolmap)
    # several models, so that the parameter counts differ; colours, so that they are checked
    for cam, model in zip(
        rec.cameras.values(), ["SIMPLE_PINHOLE", "OPENCV", "PINHOLE"], strict=True
    ):
        cam.model = getattr(pycolmap.CameraModelId, model)
        cam.params = 100.0 + np.arange(len(cam.params_info.split(",")))
    for k, point in enumerate(rec.points3D.values()):
        point.color = np.array([k, 255 - k, (7 * k) % 256], dtype=np.uint8)
    getattr(rec, f"write_{fmt}")(str(tmp_path))
    cams, images, xyz, rgb = read_model(tmp_path)
    assert set(cams) == set(rec.cameras)
    for cid, cam in rec.cameras.items():
        ours = cams[cid]
        assert (ours.model, ours.width, ours.height) == (cam.model.name, cam.width, cam.height)
        np.testing.assert_allclose(ours.params, cam.params, rtol=1e-12)
    assert {i.name for i in images.values()} == {rec.image(i).name for i in rec.reg_image_ids()}
    for iid, im in images.items():
        theirs = rec.image(iid)
        assert im.name == theirs.name and im.camera_id == theirs.camera_id
        m = theirs.cam_from_world().matrix()
        np.testing.assert_allclose(qvec_to_rotmat(im.qvec), m[:, :3], atol=1e-9)
        np.testing.assert_allclose(im.tvec, m[:, 3], atol=1e-9)
    # tilesplat keeps the points in the file's order, without ids: compare them sorted
    theirs = [(*p.xyz, *p.color) for p in rec.points3D.values()]
    ours = [(*p, *c) for p, c in zip(xyz.tolist(), rgb.tolist(), strict=True)]
    assert len(ours) == len(theirs) == 60
    np.testing.assert_allclose(sorted(ours), sorted(theirs), atol=1e-9)


def test_prepared_dataset_reads_the_same_in_pycolmap_and_tilesplat(room):
    import pycolmap

    sparse = room.dataset / "sparse" / "0"
    rec = pycolmap.Reconstruction(str(sparse))
    cams, images, xyz, _ = read_model(sparse)
    assert len(images) == rec.num_reg_images() and len(xyz) == rec.num_points3D()
    for iid, im in images.items():
        m = rec.image(iid).cam_from_world().matrix()
        np.testing.assert_allclose(qvec_to_rotmat(im.qvec), m[:, :3], atol=1e-9)
    assert [c.model for c in cams.values()] == ["PINHOLE"]


def test_sequential_matcher_and_a_pinhole_model(room, tmp_path, capsys):
    """The other paths of the options: neighbours in name order (the room's views circle the
    object in name order) and a camera model without distortion."""
    out = tmp_path / "seq"
    args = ["prepare", str(room.scene / "images"), str(out), "--matcher", "sequential"]
    assert main([*args, "--camera-model", "SIMPLE_PINHOLE", "--threads", "1"]) == 0
    assert "[3/5] matching: sequential" in capsys.readouterr().out
    report = json.loads((out / REPORT_FILE).read_text())
    assert report["n_registered"] == TINY["n_views"]
    assert report["options"]["camera_model"] == "SIMPLE_PINHOLE"
    err = pose_errors(room.truth, out / "sparse" / "0")
    assert err["rot_deg"].max() < 1.0 and err["pos_frac"].max() < 0.01
