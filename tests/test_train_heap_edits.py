"""The trainer returns the heap's free memory after each edit of the Gaussians on the CPU
(``train/step/runner.py``): the tensors an edit replaced fit none of the later steps' sizes."""

from __future__ import annotations

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.step import runner

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("strategy", ["default", "budget"])
def test_each_edit_of_the_count_returns_the_freed_heap(tmp_path, monkeypatch, strategy):
    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=2, size=16)
    cfg = TrainConfig(
        steps=24, init_points=80, sh_degree=1, refine_start=2, refine_every=4, refine_stop=16,
        reset_every=10, ema_decay=0.8, checkpoint_every=0, progress=False, lpips=False,
        backend="cpu", save_renders=False, strategy=strategy, cap_max=400,
    ).validate()  # fmt: skip
    trainer = Trainer(cfg, load_dataset(folder), tmp_path / "run", log=lambda _: None)
    edited: list[int] = []  # the steps whose edits changed the count
    trims: list[int] = []  # the steps whose end returned the heap
    current: list[int] = []
    finish = runner.StepRunner._finish

    def recorded(self, attempt):
        before = self.model.params["means"].shape[0]
        current.append(attempt.step)
        finish(self, attempt)
        if self.model.params["means"].shape[0] != before:
            edited.append(attempt.step)

    monkeypatch.setattr(runner.StepRunner, "_finish", recorded)
    monkeypatch.setattr(runner, "return_freed_heap", lambda: trims.append(current[-1]) or True)
    trainer.train()
    assert len(edited) >= 2, "the strategy changed the count at most once: nothing to see"
    assert trims == edited
    assert torch.isfinite(trainer.params["means"]).all()
