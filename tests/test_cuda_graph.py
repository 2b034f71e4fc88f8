"""The trainer's step as a CUDA graph (issue 21): what can be checked without a GPU.

A real capture needs a GPU. What is checked here is the bookkeeping around it, with a graph
maker whose "replay" runs the captured function again on the graph's static batch: the batch
is copied into the static inputs before each replay, the learning rates are filled into
their tensors, a new key (densification, capacity) is warmed up eagerly and captured again,
and the run equals the eager one bit for bit (on the torch reference, with the intersection
capacity of ``train/capacity.py``). The fallback's log line is checked in numba's CUDA
simulator (``test_train_host_reads.py``) and here by its reason.
"""

from __future__ import annotations

import pytest
import torch

from tilesplat.train.step.cuda_graph import WARMUP, graph_unavailable, plain_rates, use_rate_tensors


class Replayer:
    """A graph maker whose replay calls the captured function again."""

    def __init__(self) -> None:
        self.captured = 0

    def capture(self, fn):
        self.captured += 1
        return fn


def _trainer(tmp_path, name: str, graphed: bool):
    from tilesplat.data.dataset import load_dataset
    from tilesplat.data.synthetic import write_synthetic_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.trainer import Trainer
    from tilesplat.train.step.capacity import StepCapacity

    folder = tmp_path / "scene"
    if not folder.exists():
        write_synthetic_dataset(folder, n_train=3, n_test=1, size=16)
    cfg = TrainConfig(steps=14, batch_size=2, init_points=60, sh_degree=1, sh_degree_interval=6,
                      refine_start=3, refine_every=5, refine_stop=11, reset_every=100,
                      log_every=1000, progress=False, lpips=False, backend="torch",
                      checkpoint_every=0, eval_every=0, seed=5, random_background=True)
    trainer = Trainer(cfg, load_dataset(folder), tmp_path / name, log=lambda s: None)
    trainer.steps.capacity = StepCapacity(trainer.count_views, cfg.batch_size, trainer.device)
    if graphed:
        trainer.steps.use_graph(Replayer())
    else:  # the rates as the graph holds them (float32 tensors), for a bitwise comparison
        use_rate_tensors(trainer.optimizers, trainer.device)
    return trainer


@pytest.mark.usefixtures("one_torch_thread")
def test_a_graphed_run_equals_the_eager_one(tmp_path):
    runs = []
    for name, graphed in (("eager", False), ("graph", True)):  # one after the other: the
        trainer = _trainer(tmp_path, name, graphed)  # random backgrounds share an RNG
        losses = [trainer.train_step(step)[0] for step in range(14)]
        trainer.steps.settle()
        runs.append((trainer, losses))
    (eager, losses_e), (graph, losses_g) = runs
    assert len(graph.params["means"]) != 60  # densified: the graph was captured again
    for k, p in eager.params.items():
        assert torch.equal(p, graph.params[k]), k
    for a, b in zip(losses_e, losses_g, strict=True):
        assert torch.equal(a, b)
    assert len({id(t) for t in losses_g}) == len(losses_g)  # each step's own loss, not the graph's
    g = graph.steps.graph
    # keys: SH degree 0 -> 1 at step 6, densification at steps 5 and 10
    assert g.captures >= 3 and g.replays >= 14 - (WARMUP + 1) * g.captures, (g.captures,
                                                                             g.replays)
    assert g.maker.captured == g.captures
    # the rates live in tensors while graphed; a checkpoint stores plain floats
    group = graph.optimizers["means"].param_groups[0]
    assert isinstance(group["lr"], torch.Tensor) and group["capturable"]
    state = graph.state_dict()
    for opt_state in state["optimizers"].values():
        for group in opt_state["param_groups"]:
            assert isinstance(group["lr"], float) and group["capturable"] is False


def test_plain_rates_leaves_the_live_optimiser_alone():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = torch.optim.Adam([{"params": [p], "lr": torch.tensor(0.5)}], capturable=False)
    opt.param_groups[0]["capturable"] = True
    plain = plain_rates(opt.state_dict())
    assert plain["param_groups"][0]["lr"] == 0.5
    assert plain["param_groups"][0]["capturable"] is False
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    assert opt.param_groups[0]["capturable"] is True


def test_why_a_graph_cannot_be_captured(monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    assert "not a GPU" in graph_unavailable(torch.device("cpu"), True)
    assert "isect_capacity = 'exact'" in graph_unavailable(torch.device("cuda"), False)
    assert graph_unavailable(torch.device("cuda"), True) is None
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    assert "simulator" in graph_unavailable(torch.device("cuda"), True)
