"""The CI subset of the training target: a tiny scene, a few hundred steps, through the CLI.

The loss must fall and the test PSNR must rise well above that of the initial Gaussians;
the run folder must hold every promised output, and eval / render / export / resume work on it.
"""

import json

import pytest
import torch

from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.io.images import read_image
from tilesplat.io.ply import load_ply
from tilesplat.train.config import load_config
from tilesplat.train.loop.trainer import Trainer

STEPS = 200


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_train_tiny_scene_end_to_end(tmp_path, capsys):
    data = write_synthetic_dataset(tmp_path / "scene", n_train=16, n_test=4, size=32)
    run = tmp_path / "run"
    settings = [
        f"steps={STEPS}",
        "init_points=300",
        "sh_degree=1",
        "sh_degree_interval=100",
        "refine_start=40",
        "refine_stop=150",
        "refine_every=20",
        "log_every=10",
        "checkpoint_every=100",
        f"run_dir={run}",
        "progress=false",
        "lpips=false",
    ]
    args = ["train", "--data", str(data)]
    for s in settings:
        args += ["--set", s]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "test PSNR" in out and str(run) in out

    metrics = json.loads((run / "metrics.json").read_text())
    history = json.loads((run / "history.json").read_text())
    cfg = load_config(run / "config.toml")
    initial = Trainer(cfg, load_dataset(data), tmp_path / "scratch").test_psnr()
    assert metrics["step"] == STEPS and metrics["n_views"] == 4
    assert metrics["peak_rss_mib"] > 50 and metrics["peak_device_mib"] is None  # no CUDA here
    assert metrics["psnr"] > initial + 8.0, (initial, metrics["psnr"])
    assert history["loss"][-1] < 0.4 * history["loss"][0]
    assert history["psnr"][-1] > history["psnr"][0] + 8.0
    assert history["step"][-1] == STEPS and len(history["gaussians"]) == STEPS // 10

    renders = sorted(p.name for p in (run / "renders" / "test").iterdir())
    assert renders == ["r_0.png", "r_1.png", "r_2.png", "r_3.png"]
    assert read_image(run / "renders" / "test" / "r_0.png").shape == (32, 32, 3)
    assert read_image(run / "curve.png").shape[2] == 3
    ply = load_ply(run / "point_cloud.ply")
    assert ply["means"].shape[0] == metrics["n_gaussians"] and ply["shN"].shape[1:] == (3, 3)

    # eval reproduces the metrics of the final checkpoint
    assert main(["eval", str(run)]) == 0
    again = json.loads((run / "metrics.json").read_text())
    assert again["psnr"] == pytest.approx(metrics["psnr"], abs=1e-6)
    assert main(["render", str(run), "--split", "train", "--out", str(tmp_path / "tr")]) == 0
    assert len(list((tmp_path / "tr").iterdir())) == 16
    assert main(["export", str(run), "--ply", str(tmp_path / "out.ply")]) == 0
    exported = load_ply(tmp_path / "out.ply")
    assert torch.equal(exported["means"], ply["means"])
    # resume with more steps continues from the last checkpoint
    assert main(["train", "--resume", str(run), "--set", f"steps={STEPS + 10}"]) == 0
    assert json.loads((run / "metrics.json").read_text())["step"] == STEPS + 10
    assert load_config(run / "config.toml").steps == STEPS + 10
    capsys.readouterr()
