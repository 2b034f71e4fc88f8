"""Evaluation at real size (issue 36): views scored in strips equal to the whole view's
numbers, renders in crops of the camera, the bounded count of views scored during training,
and the scale benchmark (scripts/scale_capture.py) end to end at a small size."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tilesplat.constants import SSIM_WINDOW
from tilesplat.data.frames import Frame
from tilesplat.train.config import TrainConfig
from tilesplat.train.models.init import init_params
from tilesplat.train.rundir.evaluate import evaluate, render_view, spaced_views, view_scores
from tilesplat.train.rundir.tiled_view import TILE, crops, render_in_crops, strip_scores

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[1]


def _load_script():
    spec = importlib.util.spec_from_file_location("scale_capture", ROOT / "scripts" /
                                                  "scale_capture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("size,budget", [((300, 200), 4096), ((300, 200), 60_000),
                                         ((5000, 40), 4096), ((97, 61), 1000)])
def test_the_crops_cover_the_view_once_on_the_tile_grid(size, budget):
    width, height = size
    cover = np.zeros((height, width), np.int64)
    for x0, y0, w, h in crops(width, height, budget):
        assert x0 % TILE == 0 and y0 % TILE == 0
        assert w * h <= max(budget, TILE * TILE)
        cover[y0:y0 + h, x0:x0 + w] += 1
    assert (cover == 1).all()


def _pair(height: int, width: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A render and a target that differ in colour (the fit helps) and in noise."""
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(height, width, 3, generator=g)
    mix = torch.tensor([[0.8, 0.1, 0.0], [0.05, 0.7, 0.1], [0.0, 0.2, 0.9]])
    noise = 0.05 * torch.randn(height, width, 3, generator=g)
    return (target @ mix + 0.05 + noise).clamp(0.0, 1.0), target


def _close(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if value is None or math.isinf(value):
            assert got[key] == value, key
        else:
            assert got[key] == pytest.approx(value, rel=1e-10, abs=1e-12), key


@pytest.mark.parametrize("budget", [4096, SSIM_WINDOW * 97, 120 * 90 - 1])
def test_strip_scores_equal_the_whole_views(budget):
    image, target = _pair(90, 120, 0)
    want = view_scores(image, target, None)
    assert want["cc_psnr"] > want["psnr"] + 0.5  # the colour fit's branch runs
    _close(strip_scores(image, target, None, budget), want)


def test_strip_scores_with_a_mask_equal_the_whole_views():
    image, target = _pair(67, 97, 1)
    mask = torch.ones(67, 97, dtype=torch.bool)
    mask[10:30, 40:70] = False
    _close(strip_scores(image, target, mask, 1500), view_scores(image, target, mask))
    hidden = torch.zeros(67, 97, dtype=torch.bool)  # no pixel counted: None
    _close(strip_scores(image, target, hidden, 1500), view_scores(image, target, hidden))


def test_a_render_equal_to_its_image_scores_alike_in_strips():
    image, _ = _pair(40, 50, 2)
    want = view_scores(image, image.clone(), None)
    assert want["psnr"] == math.inf and want["cc_psnr"] == math.inf
    _close(strip_scores(image, image.clone(), None, 4096 // 8), want)


def _small_gaussians(width: int, height: int, n: int = 400) -> tuple[dict, Frame]:
    """Gaussians of ~1.5 px in front of a pinhole camera, and its frame."""
    g = torch.Generator().manual_seed(3)
    f = 0.8 * width
    depth = 3.0 + torch.rand(n, generator=g)
    px = torch.rand(n, 2, generator=g) * torch.tensor([width, height])
    xy = (px - torch.tensor([width / 2, height / 2])) / f * depth[:, None]
    means = torch.cat([xy, depth[:, None]], dim=1)
    params = init_params(means, torch.rand(n, 3, generator=g), 1, init_opacity=0.6)
    params["scales"] = torch.full((n, 3), math.log(1.5 * 3.0 / f))
    K = torch.tensor([[f, 0.0, width / 2], [0.0, f, height / 2], [0.0, 0.0, 1.0]])
    frame = Frame("v", torch.eye(4), K, width, height, image=torch.zeros(height, width, 3))
    return params, frame


def test_a_render_in_crops_equals_the_whole_render():
    cfg = TrainConfig(sh_degree=1, backend="torch", lpips=False).validate()
    params, frame = _small_gaussians(160, 96)
    whole = render_view(params, frame, cfg, (0.1, 0.2, 0.3)).colors[0]
    parts = render_in_crops(lambda f: render_view(params, f, cfg, (0.1, 0.2, 0.3)).colors[0],
                            frame, 160 * 32)
    assert len(crops(160, 96, 160 * 32)) == 3
    torch.testing.assert_close(parts, whole, atol=2e-6, rtol=1e-5)


def test_the_tiled_evaluation_equals_the_whole_one(tmp_path):
    cfg = TrainConfig(sh_degree=1, backend="torch", lpips=False).validate()
    params, frame = _small_gaussians(160, 96)
    g = torch.Generator().manual_seed(4)
    frames = [Frame(f"v{i}", frame.viewmat, frame.K, 160, 96,
                    image=torch.rand(96, 160, 3, generator=g)) for i in range(2)]
    whole = evaluate(params, frames, cfg, (0.0, 0.0, 0.0), out_dir=tmp_path / "whole")
    tiled = evaluate(params, frames, cfg.replace(eval_tile_pixels=4096, eval_crop_pixels=5120),
                     (0.0, 0.0, 0.0), out_dir=tmp_path / "tiled")
    assert tiled["n_views"] == whole["n_views"] == 2
    for w, t in zip(whole["views"], tiled["views"], strict=True):
        for key in ("psnr", "ssim", "cc_psnr", "cc_ssim"):
            assert t[key] == pytest.approx(w[key], rel=1e-6), key
    for name in ("v0.png", "v1.png"):
        a = np.asarray(Image.open(tmp_path / "whole" / name))
        b = np.asarray(Image.open(tmp_path / "tiled" / name))
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_an_evaluation_of_the_psnr_alone_gives_the_same_psnr():
    """What the trainer measures during training (``psnr_only``): the PSNR of the full
    evaluation, to the bit, and no other score; a view scored in strips keeps them all."""
    cfg = TrainConfig(sh_degree=1, backend="torch", lpips=False).validate()
    params, frame = _small_gaussians(48, 32)
    g = torch.Generator().manual_seed(5)
    frames = [Frame(f"v{i}", frame.viewmat, frame.K, 48, 32,
                    image=torch.rand(32, 48, 3, generator=g)) for i in range(3)]
    full = evaluate(params, frames, cfg, (0.0, 0.0, 0.0))
    alone = evaluate(params, frames, cfg, (0.0, 0.0, 0.0), psnr_only=True)
    assert alone["psnr"] == full["psnr"]
    assert [v["psnr"] for v in alone["views"]] == [v["psnr"] for v in full["views"]]
    assert "ssim" not in alone and "cc_psnr" not in alone and alone["n_views"] == 3
    assert all(set(v) == {"name", "psnr"} for v in alone["views"])
    strips = evaluate(params, frames, cfg.replace(eval_tile_pixels=512), (0.0, 0.0, 0.0),
                      psnr_only=True)
    assert strips["psnr"] == pytest.approx(full["psnr"], rel=1e-6) and "cc_psnr" in strips


def test_an_evaluation_lets_go_of_the_pooled_buffers():
    """The training step's pooled buffers are not kept through an evaluation (at 3000x2000
    ~0.3 GiB that the evaluation does not use)."""
    from tilesplat.backends.cpu import buffer_pool

    buffer_pool.clear()
    pooled = buffer_pool.take((buffer_pool.MIN_BYTES,), torch.uint8)
    assert pooled is not None and buffer_pool.held_bytes() >= buffer_pool.MIN_BYTES
    del pooled  # idle in the pool, as a step's buffers are between steps
    cfg = TrainConfig(sh_degree=1, backend="cpu", lpips=False).validate()
    params, frame = _small_gaussians(48, 32)
    frames = [Frame("v0", frame.viewmat, frame.K, 48, 32, image=torch.rand(32, 48, 3))]
    assert evaluate(params, frames, cfg, (0.0, 0.0, 0.0))["n_views"] == 1
    assert buffer_pool.held_bytes() == 0


def test_spaced_views_are_evenly_spaced_and_the_same_each_time():
    frames = list(range(10))
    assert spaced_views(frames, 0) == frames
    assert spaced_views(frames, 12) == frames
    assert spaced_views(frames, 3) == [0, 3, 6]
    assert spaced_views(frames, 4) == [0, 2, 5, 7]
    assert spaced_views(frames, 1) == [0]


def test_the_scale_benchmark_runs_end_to_end_at_a_small_size(tmp_path):
    script = _load_script()
    report = script.main(["--views", "10", "--width", "120", "--height", "80",
                          "--cast-factor", "1", "--points", "300", "--steps", "4",
                          "--eval-every", "2", "--eval-max-views", "1",
                          "--eval-tile-pixels", "4096", "--out", str(tmp_path)])
    assert report["train_views"] == 8 and report["test_views"] == 2
    assert report["size"] == [120, 80]
    # during training: one of the two test views at steps 2 and 4; at the end: both
    assert report["eval_views_during_training"] == [1, 1]
    assert len(report["history_test_psnr"]) == 2
    assert report["evaluated"] == ["view_0000", "view_0008"]
    assert report["renders"] == ["view_0000.png", "view_0008.png"]
    assert all(math.isfinite(v) for v in report["metrics"].values())
    assert set(report["stages"]) == {"load", "init", "first_step", "steps", "evaluation",
                                     "export"}
    assert report["gaussians"] == 300
    assert report["train_uint8_bytes"] == 8 * 120 * 80 * 3
