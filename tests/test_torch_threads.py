"""``torch_threads``: torch's intra-op thread count during a run's steps on the CPU (one on a
machine of at most 2 cores unless the key or OMP_NUM_THREADS says otherwise), restored after
the loop, and none of it on a GPU."""

from __future__ import annotations

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop import torch_threads
from tilesplat.train.loop.trainer import Trainer

CPU, GPU = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def no_omp_setting(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.usefixtures("no_omp_setting")
@pytest.mark.parametrize(("key", "cores", "expected"), [
    (0, 1, 1), (0, 2, 1), (0, 3, None), (0, 64, None),  # auto: one on small machines only
    (3, 2, 3), (1, 64, 1),  # the key wins
])
def test_the_count_for_the_steps(key, cores, expected):
    cfg = TrainConfig(torch_threads=key).validate()
    assert torch_threads.step_thread_count(cfg, CPU, cores=cores) == expected


def test_a_user_setting_and_a_gpu_keep_torchs_count(monkeypatch):
    cfg = TrainConfig().validate()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert torch_threads.step_thread_count(cfg, CPU, cores=2) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert torch_threads.step_thread_count(cfg, GPU, cores=2) is None
    assert torch_threads.step_thread_count(TrainConfig(torch_threads=4).validate(), GPU) is None


def test_a_negative_count_is_refused():
    with pytest.raises(ValueError, match="torch_threads"):
        TrainConfig(torch_threads=-1).validate()


def test_the_callers_count_comes_back_also_after_an_error(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(torch_threads, "step_thread_count", lambda cfg, device: 2)
    torch.set_num_threads(1)
    try:
        with pytest.raises(RuntimeError, match="inside"):
            with torch_threads.step_threads(TrainConfig().validate(), CPU):
                assert torch.get_num_threads() == 2
                raise RuntimeError("inside")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_loop_trains_with_the_count_and_restores_it(tmp_path, monkeypatch):
    folder = write_synthetic_dataset(tmp_path / "scene", n_train=3, n_test=1, size=24)
    cfg = TrainConfig(steps=3, init_points=200, progress=False, lpips=False, backend="cpu",
                      checkpoint_every=0, torch_threads=2).validate()
    trainer = Trainer(cfg, load_dataset(folder), tmp_path / "run", log=lambda s: None)
    seen = []
    step = trainer.train_step

    def counting(i):
        seen.append(torch.get_num_threads())
        return step(i)

    monkeypatch.setattr(trainer, "train_step", counting)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train()
        assert seen == [2, 2, 2]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
