"""The undistortion against COLMAP's own (pycolmap, installed in CI with the sfm extra), the
choice of what each camera trains as, and the cache beside the dataset.

Tolerances: the camera models' pixel <-> ray maps agree with pycolmap's to 1e-9 (px and
normalised units); the undistorted cameras are pycolmap's to 1e-9 (the same sizes exactly);
the undistorted images differ from pycolmap's by at most 1 of 255 on any channel, on at most
0.1 % of the values (both interpolate the same four pixels; the rounding of an exact .5 may
differ), and their blank pixels are the same.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pycolmap
import pytest
import torch

from tilesplat.data import camera_models as cm
from tilesplat.data import undistort as ud
from tilesplat.data.captures import pinhole_camera, render, write_capture
from tilesplat.data.dataset import load_dataset
from tilesplat.data.room import camera_poses
from tilesplat.data.undistort_cache import FOLDER
from tilesplat.io.images import write_png

W, H = 80, 60
CAMERAS = {
    "SIMPLE_RADIAL": [70, 40, 30, -0.2],
    "SIMPLE_RADIAL pincushion": [70, 40, 30, 0.15],
    "RADIAL": [70, 40.5, 29, -0.15, 0.05],
    "OPENCV": [70, 73, 41, 29, -0.2, 0.05, 0.001, -0.002],
    "FULL_OPENCV": [70, 73, 41, 29, -0.2, 0.05, 0.001, -0.002, 0.01, 0.02, 0.01, 0.001],
    "OPENCV_FISHEYE": [60, 62, 40, 30, 0.05, -0.01, 0.002, 0.0],
    "SIMPLE_RADIAL_FISHEYE": [50, 40, 30, 0.04],
    "RADIAL_FISHEYE": [50, 40, 30, 0.04, -0.01],
    "FOV": [70, 72, 40, 30, 0.9],
    "SIMPLE_FISHEYE": [40, 40, 30],
    "FISHEYE": [40, 41, 40, 30],
}
MAP_TOL = 1e-9
IMAGE_TOL_LEVELS = 1
IMAGE_TOL_SHARE = 1e-3


def _model(key: str) -> str:
    return key.split()[0]


@pytest.mark.parametrize("key", CAMERAS)
def test_pixel_ray_maps_match_pycolmap(key):
    model, params = _model(key), np.array(CAMERAS[key], float)
    cam = pycolmap.Camera(model=model, width=W, height=H, params=params)
    pts = np.random.default_rng(0).uniform([0, 0], [W, H], (300, 2))
    rays, ok = cm.ray_from_img(model, params, pts)
    assert ok.all()
    theirs = np.array([cam.cam_from_img(p) for p in pts])
    np.testing.assert_allclose(rays[:, :2] / rays[:, 2:], theirs, atol=MAP_TOL, rtol=0)
    back, valid = cm.img_from_ray(model, params, rays)
    assert valid.all()
    their_back = np.array([cam.img_from_cam(np.append(t, 1.0)) for t in theirs])
    np.testing.assert_allclose(back, their_back, atol=MAP_TOL * 100, rtol=0)
    np.testing.assert_allclose(back, pts, atol=1e-6, rtol=0)  # the inverse inverts


@pytest.mark.parametrize("key", [k for k in CAMERAS if _model(k) not in ("SIMPLE_FISHEYE",
                                                                           "FISHEYE")])
def test_undistorted_camera_and_image_match_pycolmap(key):
    model, params = _model(key), CAMERAS[key]
    ours = ud.undistorted_camera(ud.Camera(model, W, H, tuple(params)))
    pc = pycolmap.Camera(model=model, width=W, height=H, params=params)
    opts = pycolmap.UndistortCameraOptions()
    theirs = pycolmap.undistort_camera(opts, pc)
    assert (ours.width, ours.height) == (theirs.width, theirs.height)
    np.testing.assert_allclose(ours.params, theirs.params, atol=MAP_TOL, rtol=0)

    img = np.random.default_rng(1).integers(0, 256, (H, W, 3), dtype=np.uint8)
    their_img = pycolmap.undistort_image(opts, pycolmap.Bitmap.from_array(img), pc)[0].to_array()
    table = ud.Remap(ud.Camera(model, W, H, tuple(params)), ours)
    got = np.round(table.image(img.astype(np.float32) / 255) * 255).astype(int)
    diff = np.abs(got - their_img.astype(int))
    assert diff.max() <= IMAGE_TOL_LEVELS, diff.max()
    assert (diff > 0).mean() <= IMAGE_TOL_SHARE, (diff > 0).mean()
    blank = ~table.valid.numpy()
    assert (their_img[blank] == 0).all() and (got[blank] == 0).all()


def test_scale_below_a_half_warps_at_the_source_size_as_colmap():
    # A strong pincushion: COLMAP shrinks the image below half its size, warps at the source
    # size and then resizes (bilinear; ours is a box filter, so only the mean difference is
    # held to 3 of 255).
    cam = ud.Camera("SIMPLE_RADIAL", W, H, (40.0, 40.0, 30.0, 5.0))
    ours = ud.undistorted_camera(cam)
    pc = pycolmap.Camera(model="SIMPLE_RADIAL", width=W, height=H, params=list(cam.params))
    opts = pycolmap.UndistortCameraOptions()
    assert (ours.width, ours.height) == (pycolmap.undistort_camera(opts, pc).width,
                                         pycolmap.undistort_camera(opts, pc).height) == (33, 24)
    img, _ = render(camera_poses(1)[0], cam)
    img8 = np.round(img * 255).astype(np.uint8)
    table = ud.Remap(cam, ours)
    got = np.round(table.image(img8.astype(np.float32) / 255) * 255)
    theirs = pycolmap.undistort_image(opts, pycolmap.Bitmap.from_array(img8), pc)[0].to_array()
    assert table.resize and got.shape == theirs.shape
    assert np.abs(got - theirs).mean() <= 3.0


@pytest.mark.parametrize(
    "model, params, target, remap",
    [
        ("PINHOLE", (70, 71, 40, 30), "PINHOLE", False),
        ("SIMPLE_RADIAL", (70, 40, 30, 1e-4), "PINHOLE", False),  # 0.003 px: as it is
        ("SIMPLE_RADIAL", (70, 40, 30, -0.2), "PINHOLE", True),
        ("FOV", (70, 72, 40, 30, 1e-4), "PINHOLE", False),  # omega ~ 0 is a pinhole
        ("OPENCV_FISHEYE", (30, 30, 40, 30, 0, 0, 0, 0), "FISHEYE", False),  # native
        ("FISHEYE", (30, 30, 40, 30), "FISHEYE", False),
        ("OPENCV_FISHEYE", (30, 30, 40, 30, 0.05, 0.01, 0, 0), "FISHEYE", True),  # 80 deg
        ("OPENCV_FISHEYE", (90, 90, 40, 30, 0.05, 0.01, 0, 0), "PINHOLE", True),  # 32 deg
        ("FOV", (30, 30, 40, 30, 1.2), "FISHEYE", True),
    ],
)
def test_what_each_camera_trains_as(model, params, target, remap):
    p = ud.plan(ud.Camera(model, W, H, tuple(float(v) for v in params)))
    assert p.target.model == target and p.remap == remap, p.note
    assert p.target.camera_model == ("fisheye" if target == "FISHEYE" else "pinhole")
    assert ("undistorted" in p.note) == remap


def test_equidistant_target_leaves_an_equidistant_image():
    # Undistorting a fisheye to FISHEYE: every output pixel sees the ray the rasterizer's
    # fisheye camera puts there.
    cam = ud.Camera("OPENCV_FISHEYE", W, H, (30, 30, 40, 30, 0.05, 0.01, 0, 0))
    target = ud.plan(cam).target
    table = ud.Remap(cam, target)
    px = cm.pixel_grid(target.width, target.height).reshape(-1, 2)
    rays, _ = cm.ray_from_img("FISHEYE", target.array, px)
    fx, fy, cx, cy = target.params
    x, y, z = rays.T
    theta = np.arctan2(np.hypot(x, y), z)
    r = np.hypot(x, y)
    np.testing.assert_allclose(fx * theta * x / r + cx, px[:, 0], atol=1e-6)
    assert table.all_valid


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    cam = ud.Camera("SIMPLE_RADIAL", W, H, (pinhole_camera(W, H).params[0], 40, 30, -0.15))
    return write_capture(tmp_path_factory.mktemp("cap") / "sr", cam, camera_poses(6), fmt="txt")


def test_cache_is_written_once_reused_and_equals_a_fresh_undistortion(capture, tmp_path,
                                                                       monkeypatch):
    data = tmp_path / "sr"
    shutil.copytree(capture, data, ignore=shutil.ignore_patterns(FOLDER))
    lines = []
    first = load_dataset(data, log=lines.append)
    assert any("cached in" in ln for ln in lines), lines
    (folder,) = (data / FOLDER).iterdir()
    assert len(list(folder.glob("*.png"))) == 6

    def no_remap(*args, **kwargs):
        raise AssertionError("the cache was not used")

    monkeypatch.setattr(ud.Remap, "__init__", no_remap)
    second = load_dataset(data)
    shutil.copytree(data, tmp_path / "moved")  # a dataset moved elsewhere keeps its cache
    load_dataset(tmp_path / "moved")
    monkeypatch.undo()
    for a, b in zip(first.train + first.test, second.train + second.test, strict=True):
        assert torch.equal(a.image, b.image) and torch.equal(a.K, b.K)
        assert a.mask is None and b.mask is None

    # an image that changes gives a new key: undistorted again, the old folder removed
    img = data / "images" / "view_002.png"
    os.utime(img, ns=(img.stat().st_atime_ns, img.stat().st_mtime_ns + 10**9))
    load_dataset(data)
    (new,) = (data / FOLDER).iterdir()
    assert new != folder


def test_unwritable_cache_undistorts_in_memory(capture, tmp_path):
    data = tmp_path / "sr"
    shutil.copytree(capture, data, ignore=shutil.ignore_patterns(FOLDER))
    (data / FOLDER).write_text("a file where the cache folder would go")  # fails even as root
    lines = []
    ds = load_dataset(data, log=lines.append)
    assert any("undistorting in memory" in ln for ln in lines), lines
    assert (data / FOLDER).is_file() and ds.train[0].width != W
    fresh = load_dataset(capture)  # the same frames as through a cache
    assert torch.equal(ds.train[0].image, fresh.train[0].image)


def test_a_load_that_fails_half_way_leaves_no_cache(capture, tmp_path):
    data = tmp_path / "sr"
    shutil.copytree(capture, data, ignore=shutil.ignore_patterns(FOLDER))
    (data / "masks").mkdir()
    write_png(data / "masks" / "view_004.png.png", np.zeros((H - 1, W), np.uint8))
    before = sorted(data.rglob("*"))
    with pytest.raises(ValueError, match=r"mask .*view_004\.png\.png is 80x59 but its image "
                                         r".*view_004\.png is 80x60"):
        load_dataset(data)
    assert sorted(data.rglob("*")) == before and not (data / FOLDER).exists()


@pytest.mark.parametrize("model", ["RAD_TAN_THIN_PRISM_FISHEYE", "EQUIRECTANGULAR"])
def test_unknown_camera_models_are_refused_by_name(capture, tmp_path, model):
    data = tmp_path / "sr"
    shutil.copytree(capture, data, ignore=shutil.ignore_patterns(FOLDER))
    cams = data / "sparse" / "0" / "cameras.txt"
    lines = cams.read_text().splitlines()
    n = {"RAD_TAN_THIN_PRISM_FISHEYE": 16, "EQUIRECTANGULAR": 2}[model]
    lines[-1] = " ".join(["1", model, str(W), str(H)] + ["0.1"] * n)
    cams.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"cameras\.txt: camera 1: the camera model {model} is "
                                         r"not supported; supported: SIMPLE_PINHOLE"):
        load_dataset(data)
    assert not (data / FOLDER).exists()
