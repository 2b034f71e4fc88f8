"""Appearance compensation (train/bilateral_grid.py, train/appearance.py) and the colour fit of
the cc metrics (train/metrics.py): identity at the start, the grid's slice against a direct
float64 trilinear evaluation, gradients by gradcheck, the total variation, the learning-rate
schedule, cc_psnr >= psnr, the config checks, and a resume bit for bit."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.features.appearance import FILE, AffineFeature, BilateralGridFeature, lr_factor
from tilesplat.train.features.appearance_settings import (
    auto_grid_shape,
    parse_grid_shape,
    rate_scale,
    warmup_steps,
)
from tilesplat.train.features.bilateral_grid import (
    LUMA,
    apply_affine,
    apply_grids,
    identity_affines,
    identity_grids,
    total_variation,
)
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.checkpoint import list_checkpoints, load_checkpoint
from tilesplat.train.step.metrics import color_correct, psnr


def _colors(c=2, h=5, w=7, dtype=torch.float64, seed=0):
    return torch.rand(c, h, w, 3, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_identity_transforms_leave_the_render_unchanged():
    colors = _colors(dtype=torch.float32)
    out = apply_grids(identity_grids(2, (16, 16, 8)), colors)
    assert (out - colors).abs().max() <= 1e-6
    assert torch.equal(apply_affine(identity_affines(2)[:, None, None], colors), colors)


def _direct_slice(grid: np.ndarray, rgb: np.ndarray, px: float, py: float) -> np.ndarray:
    """One pixel by hand: grid [12, W, Y, X], position in [0, 1]^2, rgb [3]; float64."""
    nw, ny, nx = grid.shape[1:]
    lum = float(np.dot(LUMA, rgb))
    pos = [min(max(v, 0.0), 1.0) * (n - 1) for v, n in ((px, nx), (py, ny), (lum, nw))]
    lo = [min(int(math.floor(p)), n - 2) if n > 1 else 0 for p, n in zip(pos, (nx, ny, nw),
                                                                        strict=True)]
    mat = np.zeros(12)
    for dx in (0, 1):
        for dy in (0, 1):
            for dz in (0, 1):
                idx = [min(lo[k] + d, n - 1) for k, (d, n) in enumerate(zip((dx, dy, dz),
                                                                        (nx, ny, nw),
                                                                        strict=True))]
                wgt = 1.0
                for k, d in enumerate((dx, dy, dz)):
                    f = pos[k] - lo[k]
                    wgt *= f if d else 1.0 - f
                mat += wgt * grid[:, idx[2], idx[1], idx[0]]
    m = mat.reshape(3, 4)
    return m[:, :3] @ rgb + m[:, 3]


def test_grid_slice_matches_a_direct_trilinear_evaluation():
    gen = torch.Generator().manual_seed(1)
    grids = torch.randn(2, 12, 3, 4, 5, generator=gen, dtype=torch.float64)
    colors = _colors(h=6, w=9, seed=2) * 1.2 - 0.1  # some beyond [0, 1]: the border holds
    out = apply_grids(grids, colors)
    c, h, w = colors.shape[:3]
    want = np.zeros((c, h, w, 3))
    for i in range(c):
        for y in range(h):
            for x in range(w):
                want[i, y, x] = _direct_slice(grids[i].numpy(), colors[i, y, x].numpy(),
                                              (x + 0.5) / w, (y + 0.5) / h)
    np.testing.assert_allclose(out.numpy(), want, rtol=0, atol=1e-12)


def test_grid_and_affine_gradients_by_gradcheck():
    gen = torch.Generator().manual_seed(3)
    grids = (identity_grids(2, (3, 2, 4)).double()
             + 0.1 * torch.randn(2, 12, 4, 2, 3, generator=gen, dtype=torch.float64))
    colors = _colors(h=3, w=4, seed=4)
    torch.autograd.gradcheck(apply_grids, (grids.requires_grad_(), colors.requires_grad_()))
    mats = torch.randn(2, 1, 1, 3, 4, generator=gen, dtype=torch.float64)
    torch.autograd.gradcheck(apply_affine, (mats.requires_grad_(), _colors(seed=5)
                                            .requires_grad_()))
    torch.autograd.gradcheck(total_variation, (grids,))


def test_total_variation():
    grids = identity_grids(3, (4, 5, 2)).double()
    assert total_variation(grids) == 0.0
    ramp = torch.arange(4, dtype=torch.float64) * 0.3  # along X: every neighbour differs by 0.3
    assert float(total_variation(grids + ramp)) == pytest.approx(0.3**2)
    one = torch.zeros(1, 12, 2, 1, 1, dtype=torch.float64)  # luminance axis only, 2 cells
    one[0, 0, 1] = 2.0
    # one of 12 channels differs by 2: 4 / 12, and the axes of one cell add nothing
    assert float(total_variation(one)) == pytest.approx(4.0 / 12.0)


def test_learning_rate_schedule():
    assert lr_factor(0, 100, 1000) == pytest.approx(0.01)
    assert lr_factor(50, 100, 1000) == pytest.approx((0.01 + 0.99 * 0.5) * 0.01**0.05)
    assert lr_factor(100, 100, 1000) == pytest.approx(0.01**0.1)
    assert lr_factor(1000, 100, 1000) == pytest.approx(0.01)
    assert lr_factor(0, 0, 1000) == 1.0


def test_the_rate_and_warm_up_follow_the_run_length():
    # gsplat's 30,000-step settings hold at 30,000 steps; a shorter run gets sqrt(30,000 /
    # steps) of the rate (at most 10x) and the warm-up's share of the run
    assert rate_scale(30_000, 30_000) == 1.0 and warmup_steps(1000, 30_000, 30_000) == 1000
    assert rate_scale(3_000, 30_000) == pytest.approx(math.sqrt(10.0))
    assert warmup_steps(1000, 3_000, 30_000) == 100
    assert rate_scale(300, 30_000) == pytest.approx(10.0) and warmup_steps(1000, 300, 30_000) == 10
    assert rate_scale(30, 30_000) == 10.0 and warmup_steps(1000, 12, 30_000) == 1
    assert rate_scale(60_000, 30_000) == pytest.approx(math.sqrt(0.5))
    assert rate_scale(300, 0) == 1.0 and warmup_steps(100, 300, 0) == 100  # 0: as given
    assert warmup_steps(0, 300, 30_000) == 0


def test_the_auto_grid_follows_the_image_size():
    # a cell per 40 pixels or more (the whole cells that fit), 1 to 16 across and down;
    # half as many in luminance, 4 to 8
    assert auto_grid_shape((80, 60)) == (2, 1, 4)
    assert auto_grid_shape((79, 79)) == (1, 1, 4)  # no cell of under 40 pixels
    assert auto_grid_shape((64, 48)) == (1, 1, 4)
    assert auto_grid_shape((128, 96)) == (3, 2, 4)
    assert auto_grid_shape((16, 16)) == (1, 1, 4)
    assert auto_grid_shape((400, 300)) == (10, 7, 5)
    assert auto_grid_shape((1600, 1000)) == (16, 16, 8)  # gsplat's from 640 pixels up
    assert parse_grid_shape("auto", (80, 60)) == (2, 1, 4)
    assert parse_grid_shape("4x3x2", (80, 60)) == (4, 3, 2)
    cfg = TrainConfig(post_processing="bilateral_grid").validate()
    assert cfg.bilateral_grid_shape == "auto"


def test_color_correction_never_lowers_psnr_and_leaves_a_match_alone():
    render = _colors(c=1, h=24, w=24, dtype=torch.float32, seed=6)[0]
    assert color_correct(render, render) is render  # already matching: unchanged
    # a colour change the fit can express is undone
    mix = torch.tensor([[0.8, 0.1, 0.0], [0.05, 0.7, 0.1], [0.0, 0.1, 0.9]])
    target = (render @ mix.T + torch.tensor([0.05, -0.02, 0.04])).clamp(0, 1)
    fixed = color_correct(render, target)
    assert psnr(render, target) < 25.0 and psnr(fixed, target) > 40.0
    # and on images it cannot map onto each other it never does worse
    for seed in range(5):
        other = _colors(c=1, h=24, w=24, dtype=torch.float32, seed=10 + seed)[0]
        noisy = (render + 0.3 * other).clamp(0, 1)
        assert psnr(color_correct(render, noisy), noisy) >= psnr(render, noisy)
        assert psnr(color_correct(render, other), other) >= psnr(render, other)
    with pytest.raises(ValueError, match="color_correct"):
        color_correct(render, render[:, :3])


SHAPE_ERROR = "bilateral_grid_shape must be 'auto' or three integers"


@pytest.mark.parametrize(
    "keys, message",
    [
        (dict(post_processing="grid"), "post_processing must be one of"),
        (dict(bilateral_grid_shape="4,4"), SHAPE_ERROR),
        (dict(bilateral_grid_shape="4,0,4"), SHAPE_ERROR),
        (dict(bilateral_grid_shape="a,b,c"), SHAPE_ERROR),
        (dict(bilateral_grid_shape="512,512,8"), "more than 65536"),
        (dict(bilateral_grid_lr=-1.0), "bilateral_grid_lr must be >= 0"),
        (dict(bilateral_grid_tv=-1.0), "bilateral_grid_tv must be >= 0"),
        (dict(affine_lr=-1.0), "affine_lr must be >= 0"),
        (dict(post_processing="affine", post_processing_warmup=-1),
         "post_processing_warmup must be >= 0"),
        (dict(post_processing="affine", parallel="model"),
         "post_processing = 'affine' is not supported with parallel = 'model'"),
    ],
)
def test_config_errors(keys, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**keys).validate()


def test_config_accepts_the_modes():
    for mode in ("none", "bilateral_grid", "affine"):
        TrainConfig(post_processing=mode, bilateral_grid_shape="8x8x4").validate()
    TrainConfig(parallel="model").validate()  # off: no objection
    TrainConfig(post_processing="bilateral_grid", parallel="data").validate()


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=1,
                                     size=16)
    return load_dataset(folder)


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=12, batch_size=2, init_points=100, sh_degree=1, refine_start=2,
                refine_every=3, refine_stop=10, checkpoint_every=6, keep_checkpoints=5,
                log_every=4, progress=False, lpips=False, backend="torch",
                bilateral_grid_shape="4,3,2", post_processing_warmup=4)
    base.update(kw)
    return TrainConfig(**base).validate()


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("mode, cls", [("bilateral_grid", BilateralGridFeature),
                                       ("affine", AffineFeature)])
def test_resume_is_bit_exact_and_the_transforms_are_written(mode, cls, tiny_scene, tmp_path):
    trainer = Trainer(_cfg(post_processing=mode), tiny_scene, tmp_path / "run",
                      log=lambda s: None)
    (feature,) = trainer.features
    assert isinstance(feature, cls)
    start = feature.values.detach().clone()
    trainer.train()
    assert not torch.equal(feature.values.detach(), start)  # it learned
    # the gauge fix: the transforms' mean over the images stays the identity
    mean = feature.values.detach().mean(dim=0)
    torch.testing.assert_close(mean, start[0], atol=1e-6, rtol=0)
    first = list_checkpoints(tmp_path / "run")[0]
    ckpt = load_checkpoint(first)  # weights_only=True
    assert int(ckpt["step"]) == 6 and set(ckpt["features"]) == {mode}
    state = ckpt["features"][mode]
    assert state["values"].device.type == "cpu" and state["adam"]["state"]
    resumed = Trainer(_cfg(post_processing=mode), tiny_scene, tmp_path / "resumed",
                      checkpoint=ckpt, log=lambda s: None)
    resumed.train()
    assert torch.equal(resumed.features[0].values, feature.values)
    a, b = resumed.features[0].opt.state_dict()["state"], feature.opt.state_dict()["state"]
    assert all(torch.equal(a[0][k], b[0][k]) for k in ("exp_avg", "exp_avg_sq"))
    for k in trainer.params:
        assert torch.equal(resumed.params[k], trainer.params[k]), k
    doc = json.loads((tmp_path / "run" / FILE).read_text())
    assert doc["post_processing"] == mode
    assert [v["name"] for v in doc["views"]] == [f.name for f in tiny_scene.train]
    np.testing.assert_allclose(np.array([v["transform"] for v in doc["views"]]),
                               feature.affines().detach().double().numpy(), atol=1e-12)
    # a checkpoint of the other mode is refused by name
    other = "affine" if mode == "bilateral_grid" else "bilateral_grid"
    with pytest.raises(ValueError, match=f"no state of the feature '{other}'"):
        Trainer(_cfg(post_processing=other), tiny_scene, tmp_path / "x", checkpoint=ckpt)


def test_a_fresh_feature_is_the_identity_on_the_render(tiny_scene):
    feature = BilateralGridFeature.from_config(_cfg(post_processing="bilateral_grid"),
                                               tiny_scene, torch.device("cpu"))
    assert feature is not None and feature.values.shape == (4, 12, 2, 3, 4)
    assert BilateralGridFeature.from_config(_cfg(), tiny_scene, torch.device("cpu")) is None

    class Batch:
        views = torch.tensor([3, 0])

    colors = _colors(h=16, w=16, dtype=torch.float32)
    out = feature.colors(colors, Batch(), 0)
    assert (out - colors).abs().max() <= 1e-6
    tv = feature.loss(None, Batch(), 0)
    assert tv is not None and float(tv.detach()) == 0.0


def _recording(trainer: Trainer) -> list[torch.Tensor]:
    """The gradients the transforms' Adam steps on, one per step."""
    feature, grads = trainer.features[0], []
    step = feature.opt.step

    def record(*args, **kw):
        grads.append(feature.values.grad.detach().clone())
        return step(*args, **kw)

    feature.opt.step = record
    return grads


def _data_parallel(rank: int, port: int, folder: str) -> None:
    """2 ranks x 2 cameras per step give the transforms the gradient of 1 process x 4
    cameras, and the ranks' transforms stay equal."""
    from test_distributed import _init

    _init(rank, port)
    try:
        dataset = load_dataset(folder)
        common = dict(steps=8, batch_size=4, refine_start=100, checkpoint_every=0,
                      post_processing="bilateral_grid", post_processing_warmup=0,
                      bilateral_grid_lr=0.05)
        single = Trainer(_cfg(**common), dataset, f"{folder}/single{rank}", log=lambda m: None)
        want = _recording(single)
        for step in range(8):
            single.train_step(step)
        ranks = Trainer(_cfg(parallel="data", **common), dataset, f"{folder}/ranks",
                        log=lambda m: None)
        got = _recording(ranks)
        for step in range(8):
            ranks.train_step(step)
        # the first step starts from the same model: the same gradient, up to rounding (later
        # ones drift apart with the Gaussians, whose sums run in another order)
        assert want[0].abs().max() > 0
        torch.testing.assert_close(got[0], want[0], atol=1e-7, rtol=1e-4)
        mine = ranks.features[0].values.detach()
        both = [torch.empty_like(mine) for _ in range(2)]
        torch.distributed.all_gather(both, mine)
        assert torch.equal(both[0], both[1]), "the ranks' transforms differ"
        start = identity_grids(4, (4, 3, 2))
        assert (single.features[0].values - start).abs().max() > 0.05  # it learned
        torch.testing.assert_close(mine, single.features[0].values.detach(), atol=2e-2,
                                   rtol=0)
    finally:
        torch.distributed.destroy_process_group()


def test_data_parallel_learns_the_transforms_of_one_process(tmp_path):
    from test_distributed import _spawn

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    _spawn(_data_parallel, str(folder))
