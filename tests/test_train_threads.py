"""A training run's bits do not depend on torch's thread count: the same parameters and Adam
moments after a run with one torch thread and with two (the cpu backend's kernels are
thread-count invariant by their fixed work items; the torch ops around them must be too,
ops/elementwise.py)."""

from __future__ import annotations

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def small_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=1,
                                     size=24)
    return load_dataset(folder)


def _trained(scene, run_dir, threads: int, strategy: str) -> Trainer:
    # 33,000 random Gaussians: each torch thread's share of an opacity or scale tensor ends
    # in a scalar loop; densification and pruning change the count from step to step
    cfg = TrainConfig(
        steps=12, init_points=33_001, sh_degree=1, sh_degree_interval=4, refine_start=3,
        refine_every=3, refine_stop=11, strategy=strategy, cap_max=40_000,
        revised_opacity=True, progress=False, lpips=False, backend="cpu", checkpoint_every=0,
        torch_threads=threads,  # the loop's count (its default is one on a 2-core machine)
    ).validate()  # fmt: skip
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        trainer = Trainer(cfg, scene, run_dir, log=lambda s: None)
        trainer.train()
    finally:
        torch.set_num_threads(before)
    return trainer


@pytest.mark.parametrize("strategy", ["default", "mcmc"])
def test_one_and_two_torch_threads_train_the_same_bits(small_scene, tmp_path, strategy):
    one = _trained(small_scene, tmp_path / "one", 1, strategy)
    two = _trained(small_scene, tmp_path / "two", 2, strategy)
    assert len(one.params["means"]) > 32_768
    for name in one.params:
        a, b = one.params[name], two.params[name]
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} against {tuple(b.shape)}"
        assert torch.equal(a, b), f"{name}: {int((a != b).sum())} values differ"
        for key, m in one.optimizers[name].state_dict()["state"][0].items():
            other = two.optimizers[name].state_dict()["state"][0][key]
            assert torch.equal(m, other), f"{name}'s Adam {key} differs"
