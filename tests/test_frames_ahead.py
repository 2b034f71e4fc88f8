"""``train/loop/frames_ahead.py``: the next step's frames, made in a decoding thread, are the
frames the step would make itself (images, alphas, masks, intrinsics at each factor of the
resolution schedule), only for the step and factor they were made for; an error of their
making is raised when they are taken; and a run trains the same bits with and without them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tilesplat.data.dataset import Frame, load_dataset
from tilesplat.data.image_cache import ImageCache, StoredImage
from tilesplat.data.pixels import HeldPixels, LazyPixels
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.features.resolution import CoarseFrames
from tilesplat.train.loop import frames_ahead
from tilesplat.train.loop.frames_ahead import FramesAhead
from tilesplat.train.loop.trainer import Trainer


def _frames(n: int = 3, width: int = 67, height: int = 45) -> list[Frame]:
    rng = np.random.default_rng(0)
    cache = ImageCache(1 << 24)
    frames = []
    for i in range(n):
        rgba = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
        pixels = LazyPixels(lambda d=rgba: StoredImage(d, (0.2, 0.5, 0.9)), (width, height),
                            has_alpha=True, cache=cache)
        mask = torch.from_numpy(rng.random((height, width)) > 0.2) if i == 1 else None
        K = torch.tensor([[50.0, 0, width / 2], [0, 50.0, height / 2], [0, 0, 1]])
        frames.append(Frame(f"f{i}", torch.eye(4), K, width, height, mask=mask, pixels=pixels))
    return frames


def _same(a: Frame, b: Frame) -> None:
    assert (a.width, a.height) == (b.width, b.height)
    assert torch.equal(a.K, b.K) and torch.equal(a.viewmat, b.viewmat)
    assert torch.equal(a.image, b.image)
    assert torch.equal(a.alpha, b.alpha)
    assert (a.mask is None) == (b.mask is None)
    if a.mask is not None:
        assert torch.equal(a.mask, b.mask)


@pytest.mark.parametrize("device", ["cpu", "meta"])  # made ahead; only decoded ahead
def test_frames_taken_are_the_frames_made_now(device):
    coarse = CoarseFrames(_frames())
    ahead = FramesAhead(coarse, torch.device(device))
    assert ahead.make_ahead == (device == "cpu")
    for factor in (1, 2, 4):
        ahead.submit(7, [2, 1, 0], factor)
        indices, frames = ahead.take(7, factor)
        assert indices == [2, 1, 0]
        for i, frame in zip(indices, frames, strict=True):
            assert isinstance(frame.pixels, HeldPixels)  # composited once, held
            _same(frame, coarse.frame(i, factor))
        assert ahead.take(7, factor) is None  # taken once


def test_frames_of_another_step_or_size_are_not_taken():
    ahead = FramesAhead(CoarseFrames(_frames()), torch.device("cpu"))
    assert ahead.take(0, 1) is None
    ahead.submit(3, [0], 2)
    assert ahead.take(4, 2) is None  # a step that did not follow (a resume, a redo)
    ahead.submit(3, [0], 2)
    assert ahead.take(3, 1) is None  # the schedule's size is not the one made


def test_an_error_in_the_making_is_raised_when_taken():
    frames = _frames(1)

    def broken() -> StoredImage:
        raise ValueError("image 'f0': not a PNG")

    frames[0].pixels = LazyPixels(broken, (67, 45), has_alpha=True,
                                  cache=ImageCache(1 << 20))
    ahead = FramesAhead(CoarseFrames(frames), torch.device("cpu"))
    ahead.submit(1, [0], 1)
    with pytest.raises(ValueError, match="not a PNG"):
        ahead.take(1, 1)


def test_a_run_trains_the_same_bits_with_frames_made_ahead(tmp_path, monkeypatch):
    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=32)
    scene = load_dataset(folder)
    cfg = TrainConfig(steps=9, init_points=500, sh_degree=1, resolution_start=4,
                      resolution_full_at=0.5, random_background=True, progress=False,
                      lpips=False, backend="cpu", checkpoint_every=0).validate()

    def trained(run_dir):
        torch.manual_seed(0)  # random_background draws from the global generator
        trainer = Trainer(cfg, scene, run_dir, log=lambda s: None)
        trainer.train()
        return trainer

    ahead = trained(tmp_path / "ahead")
    monkeypatch.setattr(frames_ahead.FramesAhead, "take", lambda self, step, factor: None)
    now = trained(tmp_path / "now")
    for name, a in ahead.params.items():
        assert torch.equal(a, now.params[name]), name
