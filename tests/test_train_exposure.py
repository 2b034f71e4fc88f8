"""The exposure scene (data/exposure.py) and what appearance compensation buys on it: trained
on photos of x0.6-1.5 gain and +-0.05 offsets, with ``post_processing`` the colour-corrected
test PSNR is at least 1.5 dB (bilateral_grid) or 1 dB (affine) above that of no compensation
(the issue's margins), at the defaults (the rate and warm-up scaled to the 600 steps, the
grid 1x1x4 from the 64-pixel images), in the mean over seeds 0-2: one seed's gain is not a
measure of it. On an AVX-512 host (2026-12-04) the grid gained +2.18, +1.47, +2.37, +1.61 dB
over seeds 0-3, affine +3.06, +2.26, +1.73, +1.99; after the rasterizer's exp took fused
multiply-adds (every render a rounding away) +1.25, +2.16, +2.19, +2.20 and +1.56, +2.39,
+0.73, +2.00: a single seed failed the margin before and after (docs/training.md). A 2x2x4
grid gained +0.82 to +2.50 over seeds 0-3."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tilesplat.data.dataset import detect_layout, load_dataset
from tilesplat.data.exposure import BACKGROUND, MARKER, write_exposure_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.run import train_run
from tilesplat.train.rundir.outputs import summary

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BILATERAL_MARGIN_DB = 1.5
AFFINE_MARGIN_DB = 1.0


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return write_exposure_dataset(tmp_path_factory.mktemp("exposure"), n_train=24, n_test=4,
                                  size=64)


def test_the_training_photos_are_exposed_and_the_test_views_are_not(scene):
    assert detect_layout(scene) == "exposure"
    ds = load_dataset(scene, white_background=True)  # the scene is on grey whatever it says
    assert ds.background == BACKGROUND
    marker = json.loads((scene / MARKER).read_text())
    gains, offsets = np.array(marker["gains"]), np.array(marker["offsets"])
    assert gains.min() >= 0.6 and gains.max() <= 1.5 and gains.max() / gains.min() > 1.8
    assert np.abs(offsets).max() <= 0.05
    for frame in ds.train:  # the corner is background: the grey, exposed
        i = int(frame.name.split("_")[-1])
        want = np.clip(0.5 * gains[i] + offsets[i], 0, 1)
        np.testing.assert_allclose(frame.image[0, 0].numpy(), want, atol=1 / 255)
        assert frame.alpha is None
    for frame in ds.test:
        assert torch.allclose(frame.image[0, 0], torch.tensor(BACKGROUND), atol=1 / 255)
    assert write_exposure_dataset(scene, n_train=24, n_test=4, size=64) == scene  # reused


SEEDS = (0, 1, 2)


def _train(scene, tmp_path, mode: str, seed: int = 0) -> dict:
    cfg = TrainConfig(
        # the random box the test was tuned with (auto reaches it too, after a frustum search
        # of 20,000 points whose depths are rarely distinct on this plain background)
        data=str(scene), run_dir=str(tmp_path / f"{mode}{seed}"), seed=seed, steps=600,
        init="random", init_points=2000,
        sh_degree=1, sh_degree_interval=100, refine_start=100, refine_every=50,
        refine_stop=300, reset_every=100_000, checkpoint_every=0, log_every=100,
        progress=False, lpips=False, save_renders=False, save_ply=False, backend="cpu",
        post_processing=mode,  # the defaults: the rate, warm-up and grid shape of this run
    )
    run_dir, metrics = train_run(cfg, log=lambda s: None)
    on_disk = json.loads((run_dir / "metrics.json").read_text())
    assert on_disk["cc_psnr"] == pytest.approx(metrics["cc_psnr"])
    assert f"cc_psnr {metrics['cc_psnr']:.2f} dB" in summary(run_dir, metrics)
    for view in on_disk["views"]:
        assert view["cc_psnr"] >= view["psnr"]
    assert (run_dir / "appearance.json").is_file() == (mode != "none")
    return metrics


def test_compensation_raises_the_colour_corrected_test_psnr(scene, tmp_path):
    cc = {mode: [_train(scene, tmp_path, mode, seed)["cc_psnr"] for seed in SEEDS]
          for mode in ("none", "bilateral_grid", "affine")}
    mean = {mode: float(np.mean(v)) for mode, v in cc.items()}
    assert mean["bilateral_grid"] >= mean["none"] + BILATERAL_MARGIN_DB, cc
    assert mean["affine"] >= mean["none"] + AFFINE_MARGIN_DB, cc
