"""Checkpoints: atomic, safe to load, and --resume continues bit for bit (also after Ctrl-C)."""

import signal

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.io.atomic import atomic_write_bytes
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.checkpoint import (
    checkpoint_path,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    open_checkpoint,
    save_checkpoint,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=1, size=16)
    return load_dataset(folder)


def _cfg(strategy: str) -> TrainConfig:
    return TrainConfig(
        steps=16,
        batch_size=2,
        init_points=100,
        sh_degree=1,
        sh_degree_interval=5,
        refine_start=2,
        refine_every=3,
        refine_stop=14,
        reset_every=9,
        strategy=strategy,
        cap_max=200,
        random_background=True,
        checkpoint_every=8,
        keep_checkpoints=5,
        log_every=4,
        progress=False,
        lpips=False,
        backend="torch",
    ).validate()


def _assert_same(a: Trainer, b: Trainer):
    assert a.step == b.step
    for k in a.params:
        assert torch.equal(a.params[k], b.params[k]), k
        sa = a.optimizers[k].state_dict()["state"][0]
        sb = b.optimizers[k].state_dict()["state"][0]
        for key in sa:
            assert torch.equal(sa[key], sb[key]), (k, key)
    for key in ("step", "loss", "psnr", "gaussians"):  # not the wall-clock times
        assert a.history[key] == b.history[key], key


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_resume_is_bit_exact(tiny_scene, tmp_path, strategy):
    cfg = _cfg(strategy)
    full = Trainer(cfg, tiny_scene, tmp_path / "full", log=lambda s: None)
    full.train()
    rng_after_full = torch.get_rng_state()
    saved = list_checkpoints(tmp_path / "full")
    assert [p.name for p in saved] == ["step_0000008.pt", "step_0000016.pt"]
    resumed = Trainer(cfg, tiny_scene, tmp_path / "resumed", checkpoint=load_checkpoint(saved[0]))
    assert resumed.step == 8
    resumed.train()
    _assert_same(full, resumed)
    assert torch.equal(torch.get_rng_state(), rng_after_full)
    assert len(full.params["means"]) != 100  # densification happened in both halves


def test_ctrl_c_saves_a_checkpoint_then_resume_matches(tiny_scene, tmp_path):
    cfg = _cfg("default")
    full = Trainer(cfg, tiny_scene, tmp_path / "full")
    full.train()
    run = tmp_path / "interrupted"
    trainer = Trainer(cfg, tiny_scene, run, log=lambda s: None)
    step_fn = trainer.train_step

    def step_then_ctrl_c(step):
        out = step_fn(step)
        if step == 4:
            signal.raise_signal(signal.SIGINT)  # arrives mid-step: the step still completes
        return out

    trainer.train_step = step_then_ctrl_c
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert latest_checkpoint(run).name == "step_0000005.pt"
    assert signal.getsignal(signal.SIGINT) is handler  # restored
    resumed = Trainer(cfg, tiny_scene, run, checkpoint=load_checkpoint(latest_checkpoint(run)))
    resumed.train()
    _assert_same(full, resumed)


def test_atomic_write_and_safe_load(tmp_path):
    path = checkpoint_path(tmp_path, 3)
    save_checkpoint(path, {"step": 3, "params": {"means": torch.ones(2, 3)}})
    assert load_checkpoint(path)["params"]["means"].shape == (2, 3)
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left
    atomic_write_bytes(path, b"not a checkpoint")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(path)
    # a pickle that would run code is refused by weights_only=True
    torch.save({"step": 1, "params": {}, "evil": TrainConfig()}, path)
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_checkpoint(path)
    torch.save({"something": 1}, path)  # loads; its fields are checked by open_checkpoint
    with pytest.raises(ValueError, match="not a tilesplat training checkpoint: format None"):
        open_checkpoint(path)
    torch.save([1, 2], path)
    with pytest.raises(ValueError, match=r"not a tilesplat training checkpoint \(a list"):
        load_checkpoint(path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        latest_checkpoint(
            tmp_path / "empty_run" if (tmp_path / "empty_run").mkdir() is None else tmp_path
        )
