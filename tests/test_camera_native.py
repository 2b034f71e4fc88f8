"""camera_mode = "native" (issue 38): distorted captures keep their own lens and full image,
and the trainer renders them through it with 3DGUT.

The lens map is checked by its meaning: COLMAP's formulas (data/camera_models.py) and gsplat's
(the torch reference's Lens, backends/torch/lens.py) put the same camera-space points on the
same pixels. The captures are the capture tests' (tests/capture_helpers.py)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import torch

from capture_helpers import LENSES, TEST_EVERY, H, W, colmap_to_nerfstudio, shared_captures
from tilesplat import rasterization
from tilesplat.backends.torch.lens import Lens as RefLens
from tilesplat.backends.ut_camera import UTCamera
from tilesplat.constants import SHUTTER_GLOBAL
from tilesplat.data import camera_models as cm
from tilesplat.data.dataset import load_dataset
from tilesplat.data.lens import Lens, lens_of
from tilesplat.data.native import native_plan, zero_lens
from tilesplat.data.undistort import Camera, plan
from tilesplat.data.undistort_cache import FOLDER
from tilesplat.io.images import write_png
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.models.splats import activated
from tilesplat.train.rundir.evaluate import render_view
from tilesplat.train.step.batch import make_batch


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    return shared_captures(base / "lens_captures")


F = LENSES["pinhole"].params[0]
CAMERAS = [
    Camera("SIMPLE_RADIAL", W, H, (F, 41.0, 29.0, -0.12)),
    Camera("RADIAL", W, H, (F, 41.0, 29.0, -0.1, 0.02)),
    LENSES["opencv"],
    Camera("FULL_OPENCV", W, H, (F, F * 1.01, 40.5, 30.2, -0.08, 0.01, 0.002, -0.001, 0.003,
                                  0.02, -0.004, 0.001)),
    LENSES["fisheye"],
    Camera("SIMPLE_RADIAL_FISHEYE", W, H, (32.0, 40.0, 30.0, 0.05)),
    Camera("RADIAL_FISHEYE", W, H, (32.0, 40.0, 30.0, 0.05, 0.01)),
    Camera("THIN_PRISM_FISHEYE", W, H, (32.0, 32.5, 40.0, 30.0, 0.06, 0.01, 0.0, 0.0, -0.004,
                                        0.001, 0.0, 0.0)),
]


@pytest.mark.parametrize("cam", CAMERAS, ids=lambda c: c.model)
def test_lens_puts_points_where_colmap_does(cam):
    lens = lens_of(cam.model, cam.params, W, H)
    assert lens is not None and lens.camera_model == cam.camera_model
    rng = np.random.default_rng(0)
    # camera-space points inside the image: COLMAP's rays through random pixels, at depths
    xy = rng.uniform([2.0, 2.0], [W - 2.0, H - 2.0], size=(200, 2))
    rays, ok = cm.ray_from_img(cam.model, cam.array, xy)
    assert ok.all()
    pts = rays * rng.uniform(0.5, 3.0, size=(200, 1))
    want, valid = cm.img_from_ray(cam.model, cam.array, pts)
    assert valid.all()
    coeffs = {k: v.double()[None] for k, v in lens.coeffs().items()}
    fx, fy, cx, cy = cm.intrinsics(cam.model, cam.array)
    K = torch.tensor([[[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]]], dtype=torch.float64)
    ut = UTCamera(lens.camera_model, coeffs.get("radial_coeffs"),
                  coeffs.get("tangential_coeffs"), coeffs.get("thin_prism_coeffs"), None,
                  SHUTTER_GLOBAL, None)
    got, got_ok = RefLens(ut, K, W, H, margin=1.0, point_dims=1).project(
        torch.from_numpy(pts)[None])
    assert bool(got_ok.all())
    np.testing.assert_allclose(got[0].numpy(), want, atol=1e-6)


def test_lenses_gsplat_cannot_hold_are_undistorted_and_say_why():
    prism = Camera("THIN_PRISM_FISHEYE", W, H, (32.0, 32.0, 40.0, 30.0, 0.06, 0.01, 0.004, 0.0,
                                                 0.0, 0.0, 0.003, 0.0))
    fov = Camera("FOV", W, H, (50.0, 50.0, 40.0, 30.0, 0.9))
    for cam in (prism, fov):
        assert lens_of(cam.model, cam.params, W, H) is None
        p = native_plan(cam)
        assert p.remap and "camera_mode = native" in p.note
        # rendered through 3DGUT like every camera of a native run, without distortion
        assert p.lens == zero_lens(p.target.camera_model)
    pin = native_plan(LENSES["pinhole"])
    assert not pin.remap and pin.lens == Lens("pinhole", (0.0,) * 6, (0.0, 0.0))
    assert plan(LENSES["pinhole"]).lens is None  # the default mode: the 2D rasterizer


def test_native_colmap_capture_keeps_full_size_lens_and_masks(captures, tmp_path):
    data = tmp_path / "opencv"
    shutil.copytree(captures["opencv_bin"], data, ignore=shutil.ignore_patterns(FOLDER))
    hide = np.full((H, W), 255, np.uint8)
    hide[10:20, 60:75] = 0  # near the corner that undistortion moves
    (data / "masks").mkdir()
    write_png(data / "masks" / "view_001.png.png", hide)
    und = load_dataset(data, test_every=TEST_EVERY)
    nat = load_dataset(data, test_every=TEST_EVERY, camera_mode="native")
    assert (und.train[0].width, und.train[0].height) == (81, 60)  # COLMAP's undistorter's
    cam = LENSES["opencv"]
    for f in nat.train + nat.test:
        assert (f.width, f.height, f.camera_model) == (W, H, "pinhole")
        assert f.lens.radial == (-0.10, 0.02, 0.0, 0.0, 0.0, 0.0)
        assert f.lens.tangential == (0.002, -0.001)
        np.testing.assert_allclose(f.K.numpy(), cam.K(), rtol=1e-6)
    (masked,) = [f for f in nat.train + nat.test if f.name == "view_001"]
    assert torch.equal(masked.mask, torch.from_numpy(hide > 0))
    assert masked.image.shape == (H, W, 3)
    # under downscale the intrinsics scale and the coefficients do not
    half = load_dataset(data, test_every=TEST_EVERY, camera_mode="native", downscale=2)
    f = half.train[0]
    assert (f.width, f.height) == (W // 2, H // 2) and f.lens == nat.train[0].lens
    np.testing.assert_allclose(f.K[:2].numpy(), nat.train[0].K[:2].numpy() / 2, rtol=1e-6)
    assert not (data / FOLDER / "undistorted-").exists()


def test_native_nerfstudio_fisheye_keeps_its_image_circle(captures, tmp_path):
    ns = colmap_to_nerfstudio(captures["fisheye_bin"], tmp_path / "ns_fish")
    und = load_dataset(ns, test_every=TEST_EVERY)
    nat = load_dataset(ns, test_every=TEST_EVERY, camera_mode="native")
    assert (und.train[0].width, und.train[0].height) == (70, 52)  # the undistorter's crop
    for f in nat.train + nat.test:
        assert (f.width, f.height, f.camera_model) == (W, H, "fisheye")
        assert f.lens.radial == (0.06, 0.01, -0.004, 0.0) and f.lens.tangential is None
        assert f.mask is None
    batch = make_batch(nat.train[:3], torch.zeros(3), False)
    assert batch.lens["radial_coeffs"].shape == (3, 4)
    assert set(batch.lens) == {"radial_coeffs"}


def _gaussians(n: int = 300) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "means": torch.randn(n, 3, generator=g) * 0.4 + torch.tensor([0.0, 0.0, 0.0]),
        "scales": torch.full((n, 3), -3.0) + 0.3 * torch.randn(n, 3, generator=g),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g) * 0.5,
        "shN": torch.zeros(n, 0, 3),
    }


@pytest.mark.parametrize("lens", ["opencv_bin", "fisheye_bin"])
def test_native_render_is_the_3dgut_rasterization_call(captures, lens):
    ds = load_dataset(captures[lens], test_every=TEST_EVERY, camera_mode="native")
    frame = ds.test[0]
    frame.viewmat = torch.eye(4)
    frame.viewmat[2, 3] = 2.0  # the Gaussians 2 m in front
    cfg = apply_overrides(TrainConfig(), ["camera_mode=native", "strategy=mcmc", "sh_degree=0",
                                          "backend=torch"])
    params = _gaussians()
    got = render_view(params, frame, cfg, (0.1, 0.2, 0.3)).colors[0]
    coeffs = {k: v[None] for k, v in frame.lens.coeffs().items()}
    want, _, _ = rasterization(
        **activated(params), viewmats=frame.viewmat[None], Ks=frame.K[None], width=W, height=H,
        sh_degree=0, packed=False, backgrounds=torch.tensor([[0.1, 0.2, 0.3]]),
        camera_model=frame.camera_model, with_ut=True, with_eval3d=True, backend="torch",
        **coeffs)
    assert got.shape == (H, W, 3)
    torch.testing.assert_close(got, want[0], atol=1e-6, rtol=1e-6)
    # and the lens matters: the same frame without it renders otherwise
    frame.lens = None
    plain = render_view(params, frame, cfg, (0.1, 0.2, 0.3)).colors[0]
    assert (plain - got).abs().max() > 0.05


def test_native_mode_refuses_what_3dgut_cannot_train():
    base = ["camera_mode=native"]
    with pytest.raises(ValueError, match="camera_mode = 'native' needs strategy = 'mcmc'"):
        apply_overrides(TrainConfig(), base).validate()
    with pytest.raises(ValueError, match="camera_mode must be 'undistort' with model = '2dgs'"):
        apply_overrides(TrainConfig(), [*base, "model=2dgs"]).validate()
    with pytest.raises(ValueError, match="camera_mode = 'native' needs packed = false"):
        apply_overrides(TrainConfig(), [*base, "strategy=mcmc", "packed=true"]).validate()
    apply_overrides(TrainConfig(), [*base, "strategy=mcmc"]).validate()
    with pytest.raises(ValueError, match=r"camera_mode must be one of \['undistort', 'native', "
                                         r"'pinhole'\]"):
        load_dataset(".", camera_mode="raw")
