"""The feature seam (train/features.py): a feature registered in a test acts at its four points
of the step, learns per-image state, is checkpointed, resumed bit for bit and written into the
run folder; a checkpoint without its state is refused by name; and its config check joins
TrainConfig.validate()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.features import base as features_mod
from tilesplat.train.features.base import Feature, register_feature
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CALLS: list[str] = []


class Gains(Feature):
    """A learned gain per training image on the rendered colours (switched on by
    ``seed == 7``, so that no config key is needed), plus a loss term pulling the gains to
    1 and a camera hook that records the views it saw."""

    name = "test_gains"

    @classmethod
    def config_errors(cls, cfg):
        return ["test_gains: refuses sh_degree 2"] if cfg.sh_degree == 2 else []

    @classmethod
    def from_config(cls, cfg, dataset, device):
        return cls(len(dataset.train), device) if cfg.seed == 7 else None

    def __init__(self, n, device):
        self.gains = torch.full((n,), 1.5, device=device, requires_grad=True)
        self.opt = torch.optim.Adam([self.gains], lr=0.05)
        self.seen: list[list[int]] = []

    def cameras(self, batch, step):
        CALLS.append("cameras")
        self.seen.append(batch.views.tolist())
        return batch

    def colors(self, colors, batch, step):
        CALLS.append("colors")
        return colors * self.gains[batch.views][:, None, None, None]

    def loss(self, out, batch, step):
        CALLS.append("loss")
        return 1e-3 * ((self.gains - 1.0) ** 2).sum()

    def optimizer_step(self, step):
        CALLS.append("optimizer_step")
        assert self.gains.grad is not None and self.gains.grad.abs().sum() > 0
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def state_dict(self):
        return {"gains": self.gains.detach().cpu().clone(), "adam": self.opt.state_dict()}

    def load_state_dict(self, state):
        if state["gains"].shape != self.gains.shape:
            raise ValueError("test_gains: wrong count")
        with torch.no_grad():
            self.gains.copy_(state["gains"])
        self.opt.load_state_dict(state["adam"])

    def write(self, run_dir: Path):
        (run_dir / "gains.json").write_text(json.dumps(self.gains.tolist()))


@pytest.fixture
def gains_feature(monkeypatch):
    monkeypatch.setattr(features_mod, "_FEATURES", list(features_mod._FEATURES))
    from tilesplat.train import seams

    monkeypatch.setattr(seams, "_GROUPS", list(seams._GROUPS))
    monkeypatch.setattr(seams, "_KEYS", dict(seams._KEYS))
    register_feature(Gains)
    CALLS.clear()
    yield Gains


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=1,
                                     size=16)
    return load_dataset(folder)


def _cfg(**kw) -> TrainConfig:
    base = dict(steps=12, batch_size=2, init_points=100, sh_degree=1, refine_start=2,
                refine_every=3, refine_stop=10, checkpoint_every=6, keep_checkpoints=5,
                log_every=4, progress=False, lpips=False, backend="torch", seed=7)
    base.update(kw)
    return TrainConfig(**base).validate()


def test_a_feature_acts_at_its_four_points_and_is_checkpointed(gains_feature, tiny_scene,
                                                               tmp_path):
    trainer = Trainer(_cfg(), tiny_scene, tmp_path / "run", log=lambda s: None)
    (feature,) = trainer.features
    trainer.train()
    assert CALLS[:4] == ["cameras", "colors", "loss", "optimizer_step"]
    assert len(CALLS) == 4 * 12
    # the views are the batch's training images, as the trainer's camera order gives them
    assert feature.seen == [trainer.batch_indices(s) for s in range(12)]
    assert not torch.allclose(feature.gains.detach(), torch.full((4,), 1.5))  # it learned
    written = json.loads((tmp_path / "run" / "gains.json").read_text())
    assert written == pytest.approx(feature.gains.tolist())
    # resume from the middle: the feature's state comes back, and the end is bit for bit
    first = list_checkpoints(tmp_path / "run")[0]
    ckpt = load_checkpoint(first)
    assert set(ckpt["features"]) == {"test_gains"}
    resumed = Trainer(_cfg(), tiny_scene, tmp_path / "resumed", checkpoint=ckpt)
    resumed.train()
    assert torch.equal(resumed.features[0].gains, feature.gains)
    for k in trainer.params:
        assert torch.equal(resumed.params[k], trainer.params[k]), k


def test_without_the_feature_nothing_changes_and_its_state_is_required(gains_feature,
                                                                      tiny_scene, tmp_path):
    plain = Trainer(_cfg(seed=3), tiny_scene, tmp_path / "plain", log=lambda s: None)
    assert plain.features == []
    plain.train()
    assert CALLS == []
    ckpt = load_checkpoint(latest_checkpoint(tmp_path / "plain"))
    assert ckpt["features"] == {}
    ckpt["config"]["seed"] = 7  # the feature on, but its state is not in the checkpoint
    with pytest.raises(ValueError, match="no state of the feature 'test_gains'"):
        Trainer(_cfg(), tiny_scene, tmp_path / "other", checkpoint=ckpt)


def test_a_features_config_check_joins_validate(gains_feature):
    with pytest.raises(ValueError, match="test_gains: refuses sh_degree 2"):
        TrainConfig(sh_degree=2).validate()
    TrainConfig(sh_degree=1).validate()
