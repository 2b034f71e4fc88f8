"""The training CLI's edges, the built-in scene default, initialisation and the curve plot."""

import json
import math

import numpy as np
import pytest
import torch

from tilesplat.cli import main
from tilesplat.train.models.init import (
    init_params,
    knn_mean_distance,
    rgb_to_sh0,
    visible_half_width,
)
from tilesplat.train.rundir.plots import curve_image

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_train_without_data_uses_the_builtin_scene(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["train"]
    for s in (
        "synthetic_size=16",
        "synthetic_train=3",
        "synthetic_test=1",
        "steps=3",
        "init_points=50",
        "progress=false",
        "lpips=false",
        f"cache_dir={tmp_path / 'c'}",
    ):
        args += ["--set", s]
    assert main(args) == 0
    assert (tmp_path / "c" / "synthetic-16px-3-1" / "transforms_train.json").is_file()
    assert (tmp_path / "runs" / "synthetic" / "metrics.json").is_file()
    assert "test PSNR" in capsys.readouterr().out
    assert main(args) == 0  # a second run gets a fresh numbered folder, the cache is reused
    assert json.loads((tmp_path / "runs" / "synthetic-2" / "metrics.json").read_text())["step"] == 3
    # an explicit run_dir that holds a run is refused
    assert main([*args, "--set", "run_dir=runs/synthetic"]) == 2
    assert "already holds a run" in capsys.readouterr().err


def test_cli_errors_are_one_line(tmp_path, capsys):
    assert main(["train", "--data", str(tmp_path / "missing"), "--set", "steps=1"]) == 2
    assert "dataset folder not found" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "norun")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path), "--data", "x"]) == 2
    assert "--resume takes the run's own config" in capsys.readouterr().err
    assert main(["train", "--set", "stesp=3"]) == 2
    assert "did you mean 'steps'" in capsys.readouterr().err
    assert main(["train", "--list-keys"]) == 0
    assert "grow_grad2d (float, >= 0; default 0.0002)" in capsys.readouterr().out


def test_knn_distance_matches_brute_force():
    g = torch.Generator().manual_seed(0)
    pts = torch.randn(300, 3, generator=g)
    got = knn_mean_distance(pts, k=3)
    d2 = torch.cdist(pts.double(), pts.double()).square()
    d2.fill_diagonal_(math.inf)
    want = d2.topk(3, largest=False).values.mean(1).sqrt()
    assert torch.allclose(got.double(), want, rtol=1e-6)
    assert knn_mean_distance(pts[:1]).tolist() == [0.0]


def test_init_params_layout_and_scales():
    pts = torch.tensor([[0.0, 0, 0], [1.0, 0, 0], [0.0, 2, 0], [0.0, 0, 3]])
    rgb = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0]])
    p = init_params(pts, rgb, sh_degree=2, init_opacity=0.1, init_scale=2.0)
    assert p["sh0"].shape == (4, 1, 3) and p["shN"].shape == (4, 8, 3) and not p["shN"].any()
    assert torch.allclose(p["sh0"][:, 0], rgb_to_sh0(rgb))
    assert torch.allclose(torch.sigmoid(p["opacities"]), torch.full((4,), 0.1))
    want0 = 2.0 * math.sqrt((1 + 4 + 9) / 3)  # point 0's three neighbours
    assert p["scales"][0].exp().tolist() == pytest.approx([want0] * 3, rel=1e-6)
    with pytest.raises(ValueError, match="zero points"):
        init_params(pts[:0], rgb[:0], sh_degree=0)


def test_visible_half_width_of_a_nerf_synthetic_camera():
    # camera 4 units from the origin looking at it, 800 px wide, 40 degrees of view
    fx = 400 / math.tan(math.radians(20))
    view = torch.eye(4)
    view[2, 3] = 4.0
    K = torch.tensor([[fx, 0, 400], [0, fx, 400], [0, 0, 1.0]])
    half = visible_half_width(view[None], K[None], torch.tensor([800]), torch.zeros(3))
    assert half == pytest.approx(4 * math.tan(math.radians(20)), rel=1e-6)


def test_curve_image_draws_every_panel():
    hist = {
        "step": [10, 20, 30],
        "loss": [0.4, 0.2, 0.1],
        "psnr": [10.0, 15.0, 20.0],
        "gaussians": [100, 200, 150],
        "test_step": [30],
        "test_psnr": [19.0],
    }
    img = curve_image(hist)
    assert img.shape == (270, 1080, 3) and img.dtype == np.uint8
    blue = (img[:, :, 2] > 150) & (img[:, :, 0] < 80)
    red = (img[:, :, 0] > 180) & (img[:, :, 1] < 80)
    for panel in range(3):  # a line in each third
        assert blue[:, panel * 360 : (panel + 1) * 360].sum() > 50
    assert red.sum() > 5  # the test-PSNR sample
    empty = curve_image({})
    assert empty.shape == img.shape


def test_recomposite_onto_a_new_background():
    from tilesplat.train.step.batch import recomposite

    g = torch.Generator().manual_seed(0)
    rgb, alpha = torch.rand(2, 4, 5, 3, generator=g), torch.rand(2, 4, 5, 1, generator=g)
    white, new = torch.ones(3), torch.rand(2, 3, generator=g)
    on_white = rgb * alpha + white * (1 - alpha)
    want = rgb * alpha + new[:, None, None, :] * (1 - alpha)
    assert torch.allclose(recomposite(on_white, alpha, white, new), want, atol=1e-6)


@pytest.mark.parametrize(
    "options",
    [
        {"packed": True, "absgrad": True},
        {"antialiased": True, "backward_scheme": "per_splat", "batch_size": 2},
        {"strategy": "mcmc", "cap_max": 120, "opacity_reg": 0.01, "scale_reg": 0.01},
    ],
)
def test_training_options_run_and_densify(tmp_path, options):
    from tilesplat.data.dataset import load_dataset
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.trainer import Trainer

    data = load_dataset(write_synthetic_dataset(tmp_path / "d", n_train=3, n_test=1, size=16))
    cfg = TrainConfig(
        steps=6,
        init_points=100,
        refine_start=2,
        refine_every=2,
        grow_grad2d=1e-6,
        progress=False,
        lpips=False,
        **options,
    )
    trainer = Trainer(cfg, data, tmp_path / "run")
    trainer.train()
    assert len(trainer.params["means"]) != 100  # densification changed the set
    for p in trainer.params.values():
        assert torch.isfinite(p).all()
