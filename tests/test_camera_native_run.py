"""A run trained with camera_mode = "native" on a distorted capture (issue 38): it learns the
full image through the lens, and ``tilesplat render`` / ``eval`` / the flythrough show it
through the capture's lens, or through the undistorted pinhole on request (``--pinhole``)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from capture_helpers import TEST_EVERY, TRAIN, H, W, shared_captures
from tilesplat.cli import main
from tilesplat.io.images import read_image
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.loop.flythrough import render_flythrough
from tilesplat.train.loop.lens_view import capture_frame
from tilesplat.train.loop.run import train_run


@pytest.fixture(scope="module")
def native_run(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    capture = shared_captures(base / "lens_captures")["opencv_bin"]
    out = tmp_path_factory.mktemp("runs")
    cfg = apply_overrides(TrainConfig(), [
        *TRAIN, "steps=60", "log_every=10", "camera_mode=native", "strategy=mcmc",
        f"data={capture}", f"run_dir={out / 'native'}", "save_renders=true",
        f"test_every={TEST_EVERY}",
    ])
    torch.manual_seed(0)
    run_dir, metrics = train_run(cfg, log=lambda _: None)
    return run_dir, metrics


def test_native_training_learns_the_whole_distorted_image(native_run):
    run_dir, metrics = native_run
    loss = json.loads((run_dir / "history.json").read_text())["loss"]
    assert loss[-1] < 0.6 * loss[0]
    # scored on the full 80x60 test images through the lens (an untrained model: ~10 dB)
    assert metrics["psnr"] > 20.0
    png = read_image(run_dir / "renders" / "test" / "view_000.png")
    assert png.shape[:2] == (H, W)


def test_render_and_eval_through_the_lens_or_a_pinhole(native_run, capsys):
    run_dir, metrics = native_run
    before = (run_dir / "metrics.json").read_bytes()
    assert main(["eval", str(run_dir), "--pinhole"]) == 0
    pin = json.loads((run_dir / "metrics_pinhole.json").read_text())
    assert (run_dir / "metrics.json").read_bytes() == before  # the run's own numbers kept
    assert pin["through"] == "pinhole" and pin["n_views"] == metrics["n_views"]
    # the same model on the undistorted images: close to, not equal to, the lens's score
    assert abs(pin["psnr"] - metrics["psnr"]) < 3.0 and pin["psnr"] != metrics["psnr"]
    assert "metrics_pinhole.json" in capsys.readouterr().out

    assert main(["render", str(run_dir), "--pinhole"]) == 0
    assert main(["render", str(run_dir), "--out", str(run_dir / "lens")]) == 0
    through_pin = read_image(run_dir / "renders" / "test_pinhole" / "view_000.png")
    through_lens = read_image(run_dir / "lens" / "view_000.png")
    assert through_pin.shape[:2] == (60, 81)  # COLMAP's undistorted camera
    assert through_lens.shape[:2] == (H, W)
    np.testing.assert_array_equal(through_lens,
                                  read_image(run_dir / "renders" / "test" / "view_000.png"))


def test_flythrough_through_the_lens_or_a_pinhole(native_run, tmp_path):
    run_dir, _ = native_run
    lens = render_flythrough(run_dir, path="interp", frames=2, png_dir=tmp_path / "lens",
                             batch=2, progress=False, log=lambda _: None)
    pin = render_flythrough(run_dir, path="interp", frames=2, png_dir=tmp_path / "pin",
                            batch=2, progress=False, log=lambda _: None, pinhole=True)
    assert (lens.width, lens.height) == (W, H) and (pin.width, pin.height) == (81, 60)
    torch.testing.assert_close(lens.viewmats, pin.viewmats)
    a = read_image(tmp_path / "lens" / "frame_00000.png")
    b = read_image(tmp_path / "pin" / "frame_00000.png")
    assert a.shape[:2] == (H, W) and b.shape[:2] == (60, 81)


def test_viewer_render_mode_through_the_capture_lens(native_run):
    from tilesplat.cli.view import capture_lens
    from tilesplat.train.loop.run import load_run
    from tilesplat.train.rundir.evaluate import render_frame
    from tilesplat.viewer.scene import render_view

    run_dir, _ = native_run
    lens = capture_lens(str(run_dir))
    assert lens is not None and lens.camera_model == "pinhole"
    assert set(lens.coeffs) == {"radial_coeffs", "tangential_coeffs"}
    assert capture_lens(str(run_dir / "metrics.json")) is None  # not a run
    cfg, params, _ = load_run(run_dir)
    frame = capture_frame(run_dir)
    K = lens.intrinsics(W, H)  # at the capture's own size: its own intrinsics
    np.testing.assert_allclose(K, frame.K.double().numpy(), rtol=1e-6)
    shown = render_view(params, frame.viewmat.double().numpy(), K, W, H,
                        background=(0.0, 0.0, 0.0), lens=lens)
    want = render_frame(params, frame, cfg, (0.0, 0.0, 0.0))
    diff = np.abs(shown.astype(int) - (want.numpy() * 255.0 + 0.5).astype(int))
    assert diff.max() <= 1
    # a wider canvas keeps square pixels and the capture's centre in the middle
    K2 = lens.intrinsics(2 * W, 3 * H)
    assert K2[0, 0] == pytest.approx(2 * K[0, 0]) and K2[1, 1] == pytest.approx(2 * K[1, 1])
    assert K2[1, 2] == pytest.approx(2 * K[1, 2] + 0.5 * (3 * H - 2 * H))


def test_a_native_run_seen_through_a_pinhole_is_rendered_by_3dgut(native_run):
    from tilesplat.data.native import zero_lens
    from tilesplat.train.features.camera_mode import pinhole_mode
    from tilesplat.train.loop.run import load_run
    from tilesplat.train.rundir.scene import load_scene

    run_dir, _ = native_run
    cfg, _, _ = load_run(run_dir)
    assert pinhole_mode(cfg) == "pinhole"
    assert pinhole_mode(cfg.replace(camera_mode="undistort", strategy="default")) == "undistort"
    ds = load_scene(cfg, lambda _: None, pinhole_mode(cfg))
    f = ds.test[0]
    assert (f.width, f.height) == (81, 60) and f.lens == zero_lens("pinhole")
