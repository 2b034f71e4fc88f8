"""Parallel training on a device other than the CPU, without a GPU: two gloo ranks whose
tensors sit on a simulated device (``sim_device.py``: ``meta:RANK``, computing on the CPU
with a GPU's rules), and the selection logic of the NCCL path (backend, a GPU per local rank,
``--nproc`` against the GPU count) with ``torch.cuda``'s answers patched.

In the ranks, every function at a boundary of the parallel machinery is wrapped by a checker
that fails when a tensor entering or leaving it is not on the rank's device: the collectives
as each caller uses them (``parallel/data.py``, ``parallel/model.py``,
``rendering/sharding.py``), the gloo wire (``distributed._on_the_wire``), and the modes'
methods (gradient all-reduce, densification exchange, sync check, rebalance, the gathering
on rank 0, the shard taken from a whole model). The simulated device records every copy to
the host with the tilesplat frames that made it: inside the parallel machinery only the wire
may copy (gloo takes host tensors), and the whole model reaches the host only through the
checkpoint writer (``Trainer.state_dict``). Both modes also train as one process does on the
same device (the CPU equivalence tests are tests/test_distributed.py and
tests/test_model_parallel.py).

The NCCL collectives themselves need GPUs: scripts/gpu_multi.py runs them on the H200.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from sim_device import SimDevice
from test_distributed import _init, _spawn
from tilesplat import ranks

# what may copy a tensor to the host: the gloo wire inside the parallel machinery; the
# checkpoint writer and the step's NaN flag (one number) outside it
PARALLEL_FILES = ("train/parallel/", "distributed.py", "ranks.py", "rendering/sharding.py")
WIRE = "distributed.py:_on_the_wire"
OUTSIDE_OK = ("train/loop/trainer.py:state_dict", "ops/deferred_checks.py:start_read")


# --- the selection logic of the NCCL path ----------------------------------------------


def test_backend_choice():
    assert ranks.choose_backend("auto", "cuda") == "nccl"
    assert ranks.choose_backend("auto", "cpu") == "gloo"
    assert ranks.choose_backend("gloo", "cuda") == "gloo"
    assert ranks.choose_backend("nccl", "cuda") == "nccl"
    with pytest.raises(ValueError, match="dist_backend = 'nccl' takes CUDA tensors.*'cpu'"):
        ranks.choose_backend("nccl", "cpu")
    with pytest.raises(ValueError, match="dist_backend must be one of"):
        ranks.choose_backend("mpi", "cuda")


def test_a_gpu_per_local_rank():
    assert [ranks.rank_gpu(r, 4, "nccl") for r in range(4)] == [0, 1, 2, 3]
    # gloo ranks share the GPUs in turn (two ranks on one GPU: the H200's check)
    assert [ranks.rank_gpu(r, 1, "gloo") for r in range(3)] == [0, 0, 0]
    assert [ranks.rank_gpu(r, 2, "gloo") for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="local rank 2 has no GPU.*sees 2 GPU"):
        ranks.rank_gpu(2, 2, "nccl")
    with pytest.raises(ValueError, match="torch sees none"):
        ranks.rank_gpu(0, 0, "gloo")
    ranks.check_local_ranks(2, 2, "nccl")
    ranks.check_local_ranks(3, 1, "gloo")
    with pytest.raises(ValueError, match=r"--nproc 3 needs 3 GPUs with NCCL.*torch sees 2"):
        ranks.check_local_ranks(3, 2, "nccl")


@pytest.fixture
def two_gpus(monkeypatch):
    """torch claims 2 GPUs (selection logic only; nothing touches CUDA)."""
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_nproc_against_the_gpus(two_gpus, monkeypatch):
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.launch import job_plan

    cfg = TrainConfig(parallel="data").validate()
    assert job_plan(cfg, None) == (2, "nccl", True)  # --nproc alone: one rank per GPU
    assert job_plan(cfg, 2) == (2, "nccl", True)
    with pytest.raises(ValueError, match=r"--nproc 3 needs 3 GPUs.*torch sees 2"):
        job_plan(cfg, 3)
    gloo = TrainConfig(parallel="data", dist_backend="gloo").validate()
    assert job_plan(gloo, 3) == (3, "gloo", True)  # ranks share the GPUs
    cpu = TrainConfig(parallel="data", device="cpu").validate()
    assert job_plan(cpu, 2) == (2, "gloo", False)
    with pytest.raises(ValueError, match="--nproc without a number starts one rank per GPU"):
        job_plan(cpu, None)
    with pytest.raises(ValueError, match="device = 'cuda:1' with --nproc 2"):
        job_plan(TrainConfig(parallel="data", device="cuda:1").validate(), 2)
    assert job_plan(TrainConfig(parallel="data", device="cuda:1").validate(), 1)[0] == 1


def test_cli_refuses_more_ranks_than_gpus_before_any_work(two_gpus, tmp_path, capsys):
    from tilesplat.cli import main

    assert main(["train", "--nproc", "3", "--set", f"cache_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "--nproc 3 needs 3 GPUs with NCCL" in err and "torch sees 2" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # the built-in scene was not written
    assert main(["train", "--nproc", "x"]) == 2
    assert "--nproc must be an integer >= 1" in capsys.readouterr().err


def test_nproc_alone_needs_gpus(monkeypatch, tmp_path, capsys):
    from tilesplat.cli import main

    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert main(["train", "--nproc", "--set", f"cache_dir={tmp_path}"]) == 2
    assert "--nproc without a number starts one rank per GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_rank_trains_on_its_local_gpu(two_gpus, monkeypatch):
    import tilesplat.train.step.device as device
    from tilesplat.train.config import TrainConfig

    cfg = TrainConfig(parallel="data").validate()
    for backend, local, want in (("nccl", "1", "cuda:1"), ("gloo", "3", "cuda:1"),
                                 ("gloo", "0", "cuda:0")):
        monkeypatch.setattr(device, "_job_backend", lambda c, b=backend: b)
        monkeypatch.setenv("LOCAL_RANK", local)
        assert str(device.training_device(cfg)) == want
    monkeypatch.setattr(device, "_job_backend", lambda c: "nccl")
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ValueError, match="local rank 2 has no GPU"):
        device.training_device(cfg)
    with pytest.raises(ValueError, match="device = 'cuda:1' in a job of several ranks"):
        device.training_device(TrainConfig(parallel="data", device="cuda:1").validate())


def test_a_rank_binds_its_gpu_before_its_group(two_gpus, monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: calls.append((backend, kw.get("device_id"))))
    monkeypatch.setattr(dist, "barrier", lambda: None)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: None)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    seen = []
    ranks.join_torchrun(lambda lr, wr, ws, a: seen.append((lr, wr, ws)), None, "nccl")
    assert calls == [("set_device", 1), ("nccl", torch.device("cuda", 1))]
    assert seen == [(1, 1, 2)]
    calls.clear()
    ranks.join_torchrun(lambda *a: None, None, "gloo", gpus=True)  # gloo with CUDA tensors
    assert calls == [("set_device", 1), ("gloo", None)]
    calls.clear()
    ranks.join_torchrun(lambda *a: None, None, "gloo")  # CPU ranks bind nothing
    assert calls == [("gloo", None)]


# --- the simulated device ------------------------------------------------------------------


def test_the_simulated_device_has_a_gpus_rules():
    """The checks the ranks rely on can fail: mixing devices, numpy, host copies recorded."""
    with SimDevice(1) as sim:
        x = torch.arange(6.0, device=sim.device).reshape(2, 3)
        assert x.device == torch.device("meta", 1)
        assert (x * 2 + torch.tensor(1.0)).device == sim.device  # a CPU scalar is fine
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(2, 3)
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([x, torch.ones(1, 3)])
        with pytest.raises(RuntimeError, match="on the rank of meta:1"):
            torch.zeros(2, device="meta:0")
        with pytest.raises(TypeError, match="numpy"):
            x.numpy()
        assert x.new_tensor([4, 5]).device == sim.device
        assert torch.tensor([1.0, 2.0], device=sim.device).tolist() == [1.0, 2.0]
        host = x.cpu()
        assert type(host) is torch.Tensor and torch.equal(host, torch.arange(6.0).view(2, 3))
        assert float(x.sum()) == 15.0
    assert sum(sim.host_copies.values()) == 1 and sum(sim.host_reads.values()) == 2


def _tensors(obj, seen=None):
    """Every tensor in nested dicts, lists, tuples and optimisers."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)
    elif isinstance(obj, torch.optim.Optimizer):
        yield from _tensors(list(obj.state.values()))


def _checked(fn, where: str, device: torch.device, calls: dict):
    """``fn`` failing when a tensor in its arguments or its result is not on ``device``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def check(obj, what):
            for t in _tensors(obj):
                if t.device != device:
                    raise AssertionError(f"{where}: {what} holds a tensor on {t.device} "
                                         f"(shape {tuple(t.shape)}), the rank's device is "
                                         f"{device}")
        check([args, kwargs], "an argument")
        out = fn(*args, **kwargs)
        check([args, kwargs, out], "the result")
        calls[where] = calls.get(where, 0) + 1
        return out

    return wrapper


def _install_checkers(device: torch.device) -> dict:
    import tilesplat.distributed as tdist
    import tilesplat.rendering.sharding as sharding
    import tilesplat.train.parallel.data as data
    import tilesplat.train.parallel.model as model
    from tilesplat.train.parallel import DataParallel, ModelParallel

    calls: dict = {}
    for module, names in ((tdist, ["_on_the_wire"]),
                          (data, ["all_gather_equal", "all_gather_tensor_list", "all_reduce"]),
                          (model, ["all_gather_int32", "all_to_all_tensor_list"]),
                          (sharding, ["all_gather_int32", "all_gather_tensor_list",
                                      "all_to_all_tensor_list"])):
        for name in names:
            where = f"{module.__name__.split('tilesplat.')[-1]}.{name}"
            setattr(module, name, _checked(getattr(module, name), where, device, calls))
    for cls, names in ((DataParallel, ["reduce_gradients", "gather_info", "check_in_sync"]),
                       (ModelParallel, ["rebalance", "gather_to_rank0", "gather_model",
                                        "take_shard"])):
        for name in names:
            setattr(cls, name, _checked(cls.__dict__[name], f"{cls.__name__}.{name}", device,
                                        calls))
    return calls


def _check_host_copies(sim: SimDevice, rank: int) -> None:
    wire = writer = 0
    for site, n in sim.host_copies.items():
        if not site:  # the test's own
            continue
        inside = [f for f in site if f.startswith(PARALLEL_FILES)]
        if inside:
            assert WIRE in site, f"a host copy in the parallel machinery: {site} ({n}x)"
            wire += n
        else:
            assert any(f in OUTSIDE_OK for f in site), f"a host copy outside the writer: {site}"
            writer += n if "train/loop/trainer.py:state_dict" in site else 0
    assert wire > 0, "the gloo ranks should have staged their collectives"
    assert (writer > 0) == (rank == 0), (rank, writer)  # rank 0 writes the gathered model


def _common() -> dict:
    # spatial_order off: the one-process reference and the shards then keep their rows in the
    # same order after each densification, so that a clone and its original (at one depth)
    # are composited in the same order in both (the sort in model mode is covered by
    # test_model_parallel.py and test_train_spatial_order.py)
    return dict(steps=12, batch_size=4, init_points=100, sh_degree=1, sh_degree_interval=5,
                refine_start=2, refine_every=3, refine_stop=11, reset_every=100,
                grow_grad2d=1e-5, grow_scale3d=100.0, random_background=False,
                checkpoint_every=0, progress=False, lpips=False, backend="torch",
                spatial_order=False)


def _both_modes(rank: int, port: int, folder: str) -> None:
    """Data and model mode on the simulated device: trained as one process on it, every
    boundary's tensors on the rank's device, host copies only on the wire and at the
    writer."""
    import tilesplat.train.loop.trainer as trainer_module
    from tilesplat.data.dataset import load_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.parallel import ModelParallel

    _init(rank, port)
    sim = SimDevice(rank)
    trainer_module.training_device = lambda cfg: sim.device  # what cuda:LOCAL_RANK is here
    torch.cuda.get_device_properties = lambda d: SimpleNamespace(total_memory=1 << 34)
    calls = _install_checkers(sim.device)
    try:
        dataset = load_dataset(folder)
        quiet = dict(log=lambda m: None)
        aniso = torch.randn((100, 3), generator=torch.Generator().manual_seed(1)) * 0.5
        with sim:
            single = None
            if rank == 0:  # the reference: one process on the same device, rank 0 alone
                single = trainer_module.Trainer(TrainConfig(**_common()).validate(), dataset,
                                                f"{folder}/one", **quiet)
                assert single.params["means"].device == sim.device
                with torch.no_grad():
                    single.params["scales"].add_(aniso.to(sim.device))
                for step in range(12):
                    single.train_step(step)
                assert len(single.params["means"]) > 100, "the run should densify"

            data = trainer_module.Trainer(TrainConfig(parallel="data", **_common()).validate(),
                                          dataset, f"{folder}/data", **quiet)
            with torch.no_grad():
                data.params["scales"].add_(aniso.to(sim.device))
            for step in range(12):
                data.train_step(step)  # checks after every step that the ranks agree
            if single is not None:
                assert len(data.params["means"]) == len(single.params["means"])
                for k in single.params:
                    torch.testing.assert_close(data.params[k].cpu(), single.params[k].cpu(),
                                               atol=1e-4, rtol=1e-4, msg=f"data: {k}")

            model = trainer_module.Trainer(
                TrainConfig(parallel="model", **_common()).validate(), dataset,
                f"{folder}/model", **quiet)
            assert isinstance(model.parallel, ModelParallel)
            with torch.no_grad():
                model.params["scales"].add_(aniso[50 * rank:50 * rank + 50].to(sim.device))
            model.parallel.rebalance(model.params, model.optimizers, model.strategy_state,
                                     target=[30, 70])  # the first step must rebalance
            for step in range(12):
                model.train_step(step)
            assert model.parallel.rebalances
            n = model.n_gaussians
            whole = model.state_dict()  # the writer: gathered on the device, then the host
            if single is not None:
                assert n == len(single.params["means"])
                rows = torch.cat([p.detach().cpu().reshape(n, -1)
                                  for p in single.params.values()], dim=1)
        if rank == 0:
            assert all(type(t) is torch.Tensor and t.device.type == "cpu"
                       for t in _tensors(whole["params"])), "the checkpoint is on the host"
            a = torch.cat([p.reshape(n, -1) for p in whole["params"].values()], dim=1)
            nearest = torch.cdist(a.double(), rows.double()).min(dim=1)
            assert float(nearest.values.max()) < 1e-4 * (1 + float(rows.abs().max()))
            assert len(set(nearest.indices.tolist())) == n  # rows match one to one
        else:
            assert whole is None
        for where in ("distributed._on_the_wire", "DataParallel.reduce_gradients",
                      "DataParallel.gather_info", "DataParallel.check_in_sync",
                      "ModelParallel.rebalance", "ModelParallel.gather_to_rank0",
                      "ModelParallel.take_shard", "rendering.sharding.all_to_all_tensor_list",
                      "rendering.sharding.all_gather_tensor_list"):
            assert calls.get(where, 0) > 0, f"{where} was never called: {sorted(calls)}"
        _check_host_copies(sim, rank)
    finally:
        dist.destroy_process_group()


def test_both_modes_keep_every_tensor_on_the_ranks_device(tmp_path):
    from tilesplat.data.synthetic import write_synthetic_dataset

    folder = write_synthetic_dataset(tmp_path / "scene", n_train=4, n_test=1, size=16)
    _spawn(_both_modes, str(folder))
