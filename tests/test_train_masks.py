"""Training masks: hidden pixels give no gradient (their targets poisoned with NaN), take no
part in the densification statistics, and are left out of the masked metrics; a capture with
a moving distractor trains better masked than not; bad masks fail naming both files."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from capture_helpers import TEST_EVERY, psnr_on, train, viewmats
from tilesplat.cli import main
from tilesplat.data import room
from tilesplat.data.captures import Distractor, pinhole_camera, scene_points, write_capture
from tilesplat.data.dataset import load_dataset
from tilesplat.io.images import write_png
from tilesplat.train.config import TrainConfig, apply_overrides
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.step import masks as mk
from tilesplat.train.step.batch import make_batch
from tilesplat.train.step.losses import photometric_loss
from tilesplat.train.step.optimization import training_loss

W, H = 80, 60
MARGIN_DB = 1.0  # masked must beat unmasked on the clean test views by at least this

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _distractors(views: np.ndarray) -> list:
    """A ball between the camera and the object in 15 of the 18 training views, moving from
    view to view; none in the test views (every TEST_EVERY-th)."""
    rng = np.random.default_rng(3)
    out = []
    for i, v in enumerate(views):
        if i % TEST_EVERY == 0 or i % 8 == 3:
            out.append(None)
            continue
        eye = -v[:3, :3].T @ v[:3, 3]
        c = eye + 0.45 * (room.TARGET - eye) + rng.uniform(-0.15, 0.15, 3)
        out.append(Distractor(tuple(c), 0.25))
    return out


@pytest.fixture(scope="module")
def distractor_capture(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / "distractor_capture"
    lock = base / "distractor_capture.lock"
    import fcntl

    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        if not (out / "done").is_file():
            shutil.rmtree(out, ignore_errors=True)
            views = viewmats()
            pin = pinhole_camera(W, H)
            write_capture(out, pin, views, fmt="bin", points=scene_points(views, pin, 4),
                          distractors=_distractors(views), masks=True)
            (out / "done").write_text("ok")
        fcntl.flock(f, fcntl.LOCK_UN)
    return out


def _trainer(ds, tmp_path, extra=()):
    cfg = apply_overrides(TrainConfig(), ["sh_degree=0", "progress=false", "lpips=false",
                                          "checkpoint_every=0", *extra])
    return Trainer(cfg, ds, tmp_path / "run", log=lambda _: None)


def test_hidden_pixels_get_no_gradient(distractor_capture, tmp_path):
    ds = load_dataset(distractor_capture, test_every=TEST_EVERY)
    frames = [f for f in ds.train if f.mask is not None][:2]
    trainer = _trainer(ds, tmp_path)
    grads = []
    for fill in (float("nan"), 0.0, 7.0):
        batch = make_batch(frames, trainer.background, False)
        batch.target = torch.where(batch.masks[..., None], batch.target, fill)  # poisoned
        params = {k: v.detach().clone().requires_grad_(True) for k, v in trainer.params.items()}
        out = trainer.model.render(params, batch, trainer.cfg, 0, step=1)
        out.colors.retain_grad()
        loss = training_loss(params, out.colors, batch.target, trainer.cfg, None, batch.masks)
        loss.backward()
        assert torch.isfinite(loss)
        hidden = ~batch.masks
        assert hidden.any() and (out.colors.grad[hidden] == 0).all()
        assert (out.colors.grad[batch.masks] != 0).any()
        for name, p in params.items():
            assert torch.isfinite(p.grad).all(), name
        grads.append({k: p.grad.clone() for k, p in params.items()})
    for other in grads[1:]:  # whatever the hidden targets hold, the gradients are the same
        for k in other:
            assert torch.equal(grads[0][k], other[k]), k


def test_an_all_true_mask_is_the_plain_loss():
    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(2, 24, 32, 3, generator=g), torch.rand(2, 24, 32, 3, generator=g)
    plain, _ = photometric_loss(a, b, 0.2)
    assert mk.photometric_loss(a, b, None, 0.2)[0] == plain
    ones = torch.ones(2, 24, 32, dtype=torch.bool)
    torch.testing.assert_close(mk.photometric_loss(a, b, ones, 0.2)[0], plain, rtol=1e-6,
                               atol=1e-7)
    # the L1 is the mean over the kept pixels
    half = ones.clone()
    half[:, :, 16:] = False
    l1 = mk.photometric_loss(a, b, half, 0.0)[0]
    torch.testing.assert_close(l1, (a - b)[:, :, :16].abs().mean())


def test_hidden_centres_are_not_counted_by_densification(distractor_capture, tmp_path):
    ds = load_dataset(distractor_capture, test_every=TEST_EVERY)
    frame = next(f for f in ds.train if f.mask is not None)
    i = ds.train.index(frame)
    trainer = _trainer(ds, tmp_path, ["batch_size=1"])
    trainer.batch_indices = lambda step: [i]
    means = trainer.params["means"].detach()
    R, t = frame.viewmat[:3, :3], frame.viewmat[:3, 3]
    cam = means @ R.T + t
    uv = cam[:, :2] / cam[:, 2:] * torch.stack([frame.K[0, 0], frame.K[1, 1]]) + frame.K[:2, 2]
    px, py = uv.floor().long().unbind(-1)
    on = (cam[:, 2] > 0.05) & (px >= 0) & (px < frame.width) & (py >= 0) & (py < frame.height)
    hidden = on.clone()
    hidden[on] = ~frame.mask[py[on], px[on]]
    visible = on & ~hidden
    trainer.train_step(0)
    count = trainer.strategy_state["count"]
    assert hidden.sum() > 20 and visible.sum() > 20
    assert (count[hidden] == 0).all()
    assert (count[visible] > 0).float().mean() > 0.9
    # packed rendering drops the same pairs
    packed = _trainer(ds, tmp_path / "p", ["packed=true"])
    packed.batch_indices = lambda step: [i]
    packed.train_step(0)
    assert torch.equal(packed.strategy_state["count"] > 0, count > 0)


def test_masked_metrics_count_only_kept_pixels():
    g = torch.Generator().manual_seed(1)
    image, target = torch.rand(30, 40, 3, generator=g), torch.rand(30, 40, 3, generator=g)
    mask = torch.ones(30, 40, dtype=torch.bool)
    mask[5:20, 10:30] = False
    target[~mask] = float("nan")
    got = mk.view_metrics(image, target, mask)
    mse = ((image.double() - target.double())[mask] ** 2).mean()
    assert got["masked_psnr"] == pytest.approx(float(-10 * torch.log10(mse)), abs=1e-9)
    assert 0.0 < got["masked_ssim"] < 1.0
    assert mk.view_metrics(image, target, None) == {}


def test_masked_capture_beats_unmasked_on_clean_views(distractor_capture, tmp_path, capsys):
    ds = load_dataset(distractor_capture, test_every=TEST_EVERY)
    assert sum(f.mask is not None for f in ds.train) == 15 and all(f.mask is None
                                                                  for f in ds.test)
    masked, _ = train(ds, tmp_path / "masked")
    got_masked = psnr_on(masked, ds.test)
    for f in ds.train:
        f.mask = None
    unmasked, _ = train(ds, tmp_path / "unmasked")
    got_unmasked = psnr_on(unmasked, ds.test)
    with capsys.disabled():
        print(f"\ndistractor: masked {got_masked:.2f} dB, unmasked {got_unmasked:.2f} dB "
              "on the clean test views")
    assert got_masked >= got_unmasked + MARGIN_DB, (got_masked, got_unmasked)


def test_cli_masks_dir_and_masked_eval(distractor_capture, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(distractor_capture, data, ignore=shutil.ignore_patterns("masks"))
    masks = tmp_path / "my_masks"
    shutil.copytree(distractor_capture / "masks", masks)
    keep = np.full((H, W), 255, np.uint8)
    keep[:20] = 0
    write_png(masks / "view_000.png.png", keep)  # a test view with a mask
    run = tmp_path / "run"
    args = ["train", "--data", str(data), "--set", f"masks_dir={masks}", "--set", "steps=5",
            "--set", f"run_dir={run}", "--set", "progress=false", "--set", "lpips=false",
            "--set", f"test_every={TEST_EVERY}"]
    assert main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert "masked PSNR" in capsys.readouterr().out
    view0 = next(v for v in metrics["views"] if v["name"] == "view_000")
    assert "masked_psnr" in view0 and metrics["masked_psnr"] == view0["masked_psnr"]
    assert all("masked_psnr" not in v for v in metrics["views"] if v["name"] != "view_000")


def test_bad_masks_name_both_files(distractor_capture, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(distractor_capture, data)
    write_png(data / "masks" / "view_001.png.png", np.zeros((H, W + 1), np.uint8))
    with pytest.raises(ValueError, match=r"mask .*masks/view_001\.png\.png is 81x60 but its "
                                         r"image .*images/view_001\.png is 80x60"):
        load_dataset(data)
    (data / "masks" / "view_001.png.png").unlink()
    write_png(data / "masks" / "veiw_005.png.png", np.zeros((H, W), np.uint8))
    with pytest.raises(ValueError, match=r"mask .*veiw_005\.png\.png belongs to no image.*"
                                         r"view_005\.png"):
        load_dataset(data)
    run = tmp_path / "run"
    assert main(["train", "--data", str(data), "--set", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "veiw_005" in err[0] and not run.exists()
    assert main(["train", "--data", str(data), "--set", f"masks_dir={tmp_path / 'none'}",
                 "--set", f"run_dir={run}"]) == 2
    assert "masks folder not found" in capsys.readouterr().err and not run.exists()
