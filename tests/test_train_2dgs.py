"""The trainer's 2DGS mode (``model = "2dgs"``): config checks, a short run of the built-in
scene through the CLI with its normal and depth renders, resume, and the PLY of surfels."""

import json
import math

import numpy as np
import pytest
import torch

from helpers import all_sh
from tilesplat import rasterization
from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.io.gaussians import load_gaussians
from tilesplat.io.images import read_image
from tilesplat.io.ply import load_ply
from tilesplat.train.config import TrainConfig, config_from_dict, load_config
from tilesplat.train.loop.run import load_run
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.models.surfel_pictures import OPAQUE, RENDER_FOLDERS
from tilesplat.train.models.surfels import FLAT_RATIO
from tilesplat.train.rundir.checkpoint import list_checkpoints, load_checkpoint
from tilesplat.train.rundir.evaluate import render_view
from tilesplat.train.step.metrics import psnr

STEPS = 200


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# --- config ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("strategy", "mcmc", ["strategy must be 'default'", "got 'mcmc'"]),
        ("parallel", "data", ["parallel must be 'none'", "got 'data'"]),
        ("backward_scheme", "per_splat", ["backward_scheme must be 'per_pixel'", "'per_splat'"]),
        ("antialiased", True, ["antialiased must be false", "got True"]),
    ],
)
def test_2dgs_rejects_what_it_does_not_support(key, value, words):
    with pytest.raises(ValueError) as err:
        config_from_dict({"model": "2dgs", key: value})
    msg = str(err.value)
    assert "model = '2dgs'" in msg and all(w in msg for w in words), msg
    config_from_dict({"model": "3dgs", key: value})  # the 3DGS mode takes it


def test_model_choices_and_2dgs_keys(tmp_path):
    with pytest.raises(ValueError, match=r"model must be one of \['3dgs', '2dgs'\], got '4dgs'"):
        config_from_dict({"model": "4dgs"})
    with pytest.raises(ValueError, match="normal_lambda must be >= 0, got -1"):
        config_from_dict({"model": "2dgs", "normal_lambda": -1.0})
    with pytest.raises(ValueError, match="dist_start must be >= 0"):
        config_from_dict({"dist_start": -5})
    with pytest.raises(ValueError, match="did you mean 'normal_lambda'"):
        config_from_dict({"normal_lambd": 0.1})
    d = TrainConfig()  # gsplat 1.5.3's simple_trainer_2dgs defaults
    assert (d.model, d.normal_lambda, d.normal_start, d.dist_lambda, d.dist_start) == (
        "3dgs", 5e-2, 7000, 1e-2, 3000)  # fmt: skip
    path = tmp_path / "c.toml"
    path.write_text('model = "2dgs"\nnormal_start = 10\n')
    cfg = load_config(path)
    assert cfg.model == "2dgs" and cfg.normal_start == 10


# --- a short run of the built-in scene -------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2DGS run of the built-in scene (32 px) through ``tilesplat train --config``, with both
    regularisers switched on early; (data folder, run folder, initial test PSNR)."""
    root = tmp_path_factory.mktemp("twodgs")
    data = write_synthetic_dataset(root / "scene", n_train=16, n_test=4, size=32)
    run = root / "run"
    config = root / "twodgs.toml"
    config.write_text(
        "\n".join([
            'model = "2dgs"', f"steps = {STEPS}", "init_points = 300", "sh_degree = 1",
            "sh_degree_interval = 100", "refine_start = 40", "refine_stop = 150",
            "refine_every = 20", "normal_start = 100", "dist_start = 50", "log_every = 10",
            "checkpoint_every = 100", "keep_checkpoints = 3", f'run_dir = "{run}"',
            "progress = false", "lpips = false",
        ]) + "\n"
    )  # fmt: skip
    initial = Trainer(load_config(config), load_dataset(data), root / "scratch").test_psnr()
    assert main(["train", "--data", str(data), "--config", str(config)]) == 0
    return data, run, initial


def test_2dgs_run_learns_the_scene(trained):
    _, run, initial = trained
    metrics = json.loads((run / "metrics.json").read_text())
    history = json.loads((run / "history.json").read_text())
    assert load_config(run / "config.toml").model == "2dgs"
    assert metrics["step"] == STEPS and metrics["n_views"] == 4
    assert metrics["psnr"] > initial + 5.0, (initial, metrics["psnr"])
    assert history["loss"][-1] < 0.5 * history["loss"][0]
    assert max(history["gaussians"]) > 300  # densified on gradient_2dgs
    _, params, _ = load_run(run)
    # the third scale stays thin: the 2DGS projection gives it no gradient (it moves only
    # with splits, while Adam moves the in-plane scales)
    thin = torch.minimum(params["scales"][:, 0], params["scales"][:, 1]) + math.log(0.05)
    assert (params["scales"][:, 2] < thin).all()


def _zlib_level_class(path):
    """The FLEVEL field of a PNG's first IDAT zlib header: 0 for zlib levels 0-1, 1 for 2-5, 2
    for 6 (Pillow's default), 3 for 7-9."""
    data = path.read_bytes()
    pos = 8  # after the signature: chunks of length, type, data, CRC
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos:pos + 4], "big")
        if data[pos + 4:pos + 8] == b"IDAT":
            return data[pos + 9] >> 6  # the byte after CMF
        pos += 12 + length
    raise AssertionError(f"{path}: no IDAT chunk")


def test_2dgs_writes_normal_and_depth_renders(trained):
    data, run, _ = trained
    test = run / "renders" / "test"
    names = ["r_0.png", "r_1.png", "r_2.png", "r_3.png"]
    assert sorted(p.name for p in test.glob("*.png")) == names
    for sub in RENDER_FOLDERS:
        assert sorted(p.name for p in (test / sub).iterdir()) == names, sub
        for name in names:
            img = read_image(test / sub / name)
            assert img.shape == (32, 32, 3) and np.isfinite(img).all(), (sub, name)
    # the pictures go out at the colour renders' zlib level (1: the fastest class)
    levels = {p.relative_to(test): _zlib_level_class(p) for p in test.rglob("*.png")}
    assert len(levels) == 4 * (1 + len(RENDER_FOLDERS))
    assert set(levels.values()) == {0}, levels

    # the tensors behind the pictures
    cfg, params, _ = load_run(run)
    frame = load_dataset(data).test[0]
    out = render_view(params, frame, cfg, (1.0, 1.0, 1.0))
    for name in ("colors", "alphas", "depths", "normals", "normals_from_depth", "median"):
        t = getattr(out, name)
        assert t.shape[:3] == (1, 32, 32) and torch.isfinite(t).all(), name
    alpha = out.alphas[0, ..., 0]
    opaque = alpha > 0.95
    assert opaque.sum() > 20
    # rendered normals: an alpha-weighted sum of unit normals, near unit where opaque
    length = out.normals[0].norm(dim=-1)
    assert (length <= alpha + 1e-4).all()
    assert length[opaque].mean() > 0.5, length[opaque].mean()
    inner = torch.zeros_like(opaque)
    inner[1:-1, 1:-1] = True
    from_depth = out.normals_from_depth[0].norm(dim=-1)[opaque & inner]
    assert torch.allclose(from_depth, torch.ones_like(from_depth), atol=1e-4)
    assert out.depths[0, ..., 0][opaque].min() > 0.0

    # the PNG holds 0.5 + 0.5 n with unit n where opaque, grey elsewhere
    png = torch.from_numpy(read_image(test / "normal" / "r_0.png"))
    shown = alpha >= OPAQUE
    decoded = (2.0 * png - 1.0).norm(dim=-1)
    assert torch.allclose(decoded[shown], torch.ones_like(decoded[shown]), atol=0.02)
    assert torch.allclose(png[~shown], torch.full_like(png[~shown], 128 / 255), atol=1e-6)
    depth_png = torch.from_numpy(read_image(test / "depth" / "r_0.png"))
    assert (depth_png[~shown] == 0).all() and (depth_png[shown].sum(-1) > 0).all()


def test_2dgs_eval_render_and_export(trained, tmp_path):
    _, run, _ = trained
    before = json.loads((run / "metrics.json").read_text())
    assert main(["eval", str(run)]) == 0
    assert json.loads((run / "metrics.json").read_text())["psnr"] == pytest.approx(
        before["psnr"], abs=1e-6
    )
    out = tmp_path / "train_renders"
    assert main(["render", str(run), "--split", "train", "--out", str(out)]) == 0
    assert len(list(out.glob("*.png"))) == 16
    assert all(len(list((out / sub).glob("*.png"))) == 16 for sub in RENDER_FOLDERS)


def test_2dgs_ply_round_trip(trained, tmp_path):
    """The PLY of a 2DGS run is a 3DGS PLY of thin discs: it loads back in our reader, equals
    the checkpoint apart from the flattened third scale, and renders (as 3DGS) close to the
    surfels' own render."""
    data, run, _ = trained
    cfg, params, _ = load_run(run)
    ply = load_ply(run / "point_cloud.ply")
    assert torch.equal(ply["means"], params["means"])
    assert torch.equal(ply["scales"][:, :2], params["scales"][:, :2])
    assert torch.equal(ply["opacities"], params["opacities"])
    thin = ply["scales"][:, 2] - ply["scales"][:, :2].min(dim=1).values
    assert torch.allclose(thin, torch.full_like(thin, math.log(FLAT_RATIO)), atol=1e-5)
    assert main(["export", str(run), "--ply", str(tmp_path / "again.ply")]) == 0
    again = load_gaussians(tmp_path / "again.ply")
    assert all(torch.equal(again[k], ply[k]) for k in ply)

    frame = load_dataset(data).test[0]
    surfels = render_view(params, frame, cfg, (1.0, 1.0, 1.0)).colors[0].clamp(0, 1)
    as_3dgs, _, _ = rasterization(
        ply["means"], ply["quats"], ply["scales"].exp(), torch.sigmoid(ply["opacities"]),
        all_sh(ply), frame.viewmat[None].float(), frame.K[None].float(), frame.width, frame.height,
        sh_degree=1, backgrounds=torch.ones(1, 3),
    )  # fmt: skip
    assert psnr(as_3dgs[0].clamp(0, 1), surfels) > 20.0


def test_2dgs_resume_is_bit_exact(tmp_path):
    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    scene = load_dataset(folder)
    cfg = TrainConfig(
        model="2dgs", steps=12, batch_size=2, init_points=100, sh_degree=1, sh_degree_interval=5,
        refine_start=2, refine_every=3, refine_stop=10, normal_start=3, dist_start=5,
        random_background=True, checkpoint_every=6, keep_checkpoints=5, log_every=3,
        progress=False, lpips=False,
    ).validate()  # fmt: skip
    full = Trainer(cfg, scene, tmp_path / "full", log=lambda s: None)
    full.train()
    saved = list_checkpoints(tmp_path / "full")
    assert [p.name for p in saved] == ["step_0000006.pt", "step_0000012.pt"]
    resumed = Trainer(cfg, scene, tmp_path / "resumed", checkpoint=load_checkpoint(saved[0]))
    assert resumed.cfg.model == "2dgs" and resumed.step == 6
    resumed.train()
    for k in full.params:
        assert torch.equal(full.params[k], resumed.params[k]), k
    assert full.history["loss"] == resumed.history["loss"]
    assert len(full.params["means"]) != 100  # densified


def test_bench_replay_refuses_a_2dgs_run(trained):
    from tilesplat.bench.replay import open_run

    _, run, _ = trained
    with pytest.raises(ValueError, match="replays 3DGS runs; this run has model = '2dgs'"):
        open_run(f"run:{run}")
