"""The averaged model (``ema_decay``): the moving average itself, its restarts, what the run
evaluates and exports, resume, and the checks of its key."""

from __future__ import annotations

import json

import pytest
import torch

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.io.ply import load_ply
from tilesplat.train.config import TrainConfig
from tilesplat.train.features.averaging import AverageSchedule, ParamAverage
from tilesplat.train.loop.run import load_run, train_run
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    open_checkpoint,
)
from tilesplat.train.rundir.evaluate import evaluate

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny_scene(tmp_path_factory):
    folder = write_synthetic_dataset(tmp_path_factory.mktemp("scene"), n_train=4, n_test=2, size=16)
    return folder, load_dataset(folder)


def _cfg(**kw) -> TrainConfig:
    base = dict(
        steps=24, init_points=80, sh_degree=1, sh_degree_interval=5, refine_start=2,
        refine_every=4, refine_stop=12, reset_every=10, ema_decay=0.8, checkpoint_every=12,
        keep_checkpoints=5, log_every=4, progress=False, lpips=False, backend="torch",
        save_renders=False,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base).validate()


def _params(n: int, seed: int) -> dict[str, torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.nn.Parameter(torch.randn(n, *shape, generator=g))
            for k, shape in {"means": (3,), "opacities": ()}.items()}  # fmt: skip


def test_the_average_is_an_exponential_moving_average():
    p = _params(5, 0)
    avg = ParamAverage(0.75)
    assert avg.served(p) is p and avg.state_dict() == {}  # nothing averaged yet
    avg.update(p)  # the first update starts from the parameters
    expected = {k: v.detach().clone() for k, v in p.items()}
    for seed in (1, 2, 3):
        with torch.no_grad():  # an optimiser step changes the values in place
            for k, v in _params(5, seed).items():
                p[k].copy_(v)
        avg.update(p)
        for k in p:
            expected[k] = 0.75 * expected[k] + 0.25 * p[k].detach()
    served = avg.served(p)
    for k in p:
        torch.testing.assert_close(served[k], expected[k], rtol=1e-6, atol=1e-6)
        assert not served[k].requires_grad
    assert avg.steps == 3


def test_an_edit_of_the_strategy_restarts_the_average():
    p = _params(4, 0)
    avg = ParamAverage(0.9)
    avg.update(p)
    with torch.no_grad():
        p["means"].add_(1.0)
    avg.update(p)
    assert not torch.equal(avg.served(p)["means"], p["means"].detach())
    # a densification builds new Parameters (more rows): the average restarts from them
    grown = dict(p, means=torch.nn.Parameter(torch.randn(6, 3)),
                 opacities=torch.nn.Parameter(torch.randn(6)))  # fmt: skip
    assert avg.served(grown) is grown  # until the next update it serves the parameters
    avg.update(grown)
    assert avg.steps == 0
    for k in grown:
        assert torch.equal(avg.served(grown)[k], grown[k].detach())
    # an edit that keeps the count (an opacity reset) builds a new Parameter too
    reset = dict(grown, opacities=torch.nn.Parameter(torch.zeros(6)))
    avg.update(reset)
    assert torch.equal(avg.served(reset)["opacities"], torch.zeros(6))


def test_a_skipped_step_leaves_the_average_as_it_is():
    p = _params(3, 0)
    avg = ParamAverage(0.5)
    avg.update(p)
    before = {k: v.clone() for k, v in avg.served(p).items()}
    with torch.no_grad():
        p["means"].add_(2.0)
    avg.update(p, skipped=torch.tensor(1.0))
    for k in p:
        assert torch.equal(avg.served(p)[k], before[k])
    avg.update(p, skipped=torch.tensor(0.0))
    torch.testing.assert_close(avg.served(p)["means"], 0.5 * before["means"] + 0.5 * p["means"])


def test_a_checkpoints_average_is_checked_when_loaded():
    p = _params(3, 0)
    avg = ParamAverage(0.5)
    avg.update(p)
    state = avg.state_dict()
    other = ParamAverage(0.5)
    other.load_state_dict(state, p)
    assert torch.equal(other.served(p)["means"], avg.served(p)["means"])
    shape = r"averaged means \(ema_decay\) is \(2, 3\), its parameter is \(3, 3\)"
    with pytest.raises(ValueError, match=shape):
        other.load_state_dict({"params": dict(state["params"], means=torch.zeros(2, 3))}, p)
    with pytest.raises(ValueError, match=r"averaged opacities \(ema_decay\) is not finite"):
        bad = dict(state["params"], opacities=torch.full((3,), float("nan")))
        other.load_state_dict({"params": bad}, p)
    names = r"averaged model \(ema_decay\) has \['means'\], its parameters are"
    with pytest.raises(ValueError, match=names):
        other.load_state_dict({"params": {"means": state["params"]["means"]}}, p)
    with pytest.raises(ValueError, match="malformed"):
        other.load_state_dict({"params": [1, 2]}, p)


def test_the_key_is_checked():
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match=r"ema_decay must be in \[0, 1\), got"):
            TrainConfig(ema_decay=bad).validate()
    with pytest.raises(ValueError, match="ema_decay must be finite, got nan"):
        TrainConfig(ema_decay=float("nan")).validate()
    with pytest.raises(ValueError, match="ema_decay = 0.9 is not supported with parallel = 'm"):
        TrainConfig(ema_decay=0.9, parallel="model").validate()
    TrainConfig(ema_decay=0.9, parallel="data").validate()


def test_the_trainer_averages_after_each_step_and_restarts_at_each_edit(tiny_scene):
    _, ds = tiny_scene
    cfg = _cfg()
    tr = Trainer(cfg, ds, "/nonexistent-run", log=lambda s: None)
    expected, follows, since, edits = None, None, 0, 0
    for step in range(cfg.steps):
        tr.train_step(step)
        tr.step = step + 1
        cur = {k: v.detach() for k, v in tr.params.items()}
        if follows is None or any(tr.params[k] is not follows[k] for k in cur):
            expected = {k: v.clone() for k, v in cur.items()}  # an edit, or the first step
            since, edits = 0, edits + 1
        else:
            for k in cur:
                expected[k] = expected[k] * 0.8 + cur[k] * 0.2
            since += 1
        follows = dict(tr.params)
    served = tr.served_params()
    assert edits > 2 and since > 5  # densified, resets, then the set stayed
    assert tr.average is not None and tr.average.steps == since
    for k in cur:
        torch.testing.assert_close(served[k], expected[k], rtol=1e-5, atol=1e-6)
        assert not torch.equal(served[k], cur[k]), k  # the average is not the last step
    # the test PSNR the run measures is the averaged model's
    want = evaluate(served, ds.test, cfg, ds.background)["psnr"]
    assert tr.test_psnr() == want


def test_the_run_evaluates_exports_and_resumes_the_average(tiny_scene, tmp_path):
    folder, ds = tiny_scene
    cfg = _cfg(data=str(folder), run_dir=str(tmp_path / "run"))
    run_dir, metrics = train_run(cfg, log=lambda s: None)
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    averaged = ckpt["averaged"]["params"]
    assert set(averaged) == set(ckpt["params"])
    assert not torch.equal(averaged["means"], ckpt["params"]["means"])
    # metrics.json and the PLY are those of the averaged model
    want = evaluate(averaged, ds.test, cfg, ds.background)["psnr"]
    assert metrics["psnr"] == pytest.approx(want, abs=1e-9)
    assert json.loads((run_dir / "metrics.json").read_text())["psnr"] == metrics["psnr"]
    ply = load_ply(run_dir / "point_cloud.ply")
    torch.testing.assert_close(ply["means"], averaged["means"])
    # what renders and exports read of the run is the average too
    _, served, _ = load_run(run_dir)
    assert torch.equal(served["means"], averaged["means"].float())
    assert open_checkpoint(run_dir).n_gaussians == len(averaged["means"])
    # resumed from the middle, the run averages as the uninterrupted one did
    first = list_checkpoints(run_dir)[0]
    resumed = Trainer(cfg, ds, tmp_path / "resumed", checkpoint=load_checkpoint(first),
                      log=lambda s: None)  # fmt: skip
    assert resumed.step == 12
    resumed.train()
    again = resumed.state_dict()["averaged"]["params"]
    for k in averaged:
        assert torch.equal(again[k], averaged[k]), k
    # a checkpoint whose average does not fit its parameters is refused, naming it
    bad = dict(ckpt, averaged={"params": dict(averaged, quats=averaged["quats"][:-1])})
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"bad.pt: the checkpoint's averaged quats \(ema_decay\)"):
        open_checkpoint(tmp_path / "bad.pt")


def test_a_run_without_it_keeps_no_average_and_trains_alike(tiny_scene, tmp_path):
    _, ds = tiny_scene
    trained = []
    for decay in (0.8, 0.0):  # one after the other: both draw from torch's generator
        tr = Trainer(_cfg(ema_decay=decay), ds, tmp_path / str(decay), log=lambda s: None)
        for step in range(16):
            tr.train_step(step)
        trained.append(tr)
    on, off = trained
    for k in on.params:  # the average feeds nothing back into the training
        assert torch.equal(on.params[k], off.params[k]), k
    assert off.average is None and "averaged" not in off.state_dict()
    assert off.served_params() is off.params


def test_the_schedule_drops_exactly_the_updates_an_edit_throws_away():
    edits = set(range(150, 700, 50)) | {900}  # the fast recipe's, and a reset
    asked = []

    def acts_at(step: int) -> bool:
        asked.append(step)
        return step in edits

    for reads in ((200, 1000), (0, 0), (7, 0)):
        asked.clear()
        sched = AverageSchedule(acts_at, 1200, reads)
        got = [sched.wasted(s) for s in range(1200)]
        for s in range(1200):
            done = s + 1  # the first read at or after `done` finished steps, or the last step
            read = min([1200, *(d for d in range(done, 1200) if any(n and d % n == 0
                                                                    for n in reads))])
            want = any(s < e <= read - 1 for e in edits)
            assert got[s] == want, (reads, s)
        assert sorted(asked) == sorted(set(asked))  # each step asked once
    # asked out of order (a step redone after the next), it still answers right
    sched = AverageSchedule(acts_at, 1200, (200, 1000))
    for s in (149, 150, 149, 148, 151, 700, 3, 1199, 899):
        want = min([e for e in edits if e > s] + [1200])
        assert sched.next_edit(s) == want, s
    # the fast recipe (no reset): 150-199, 350-399, 550-599 and 650-1199 are read
    sched = AverageSchedule(lambda s: s in edits and s < 700, 1200, (200, 1000))
    assert sum(not sched.wasted(s) for s in range(1200)) == 700


def test_dropping_the_thrown_away_updates_changes_no_read(tiny_scene, tmp_path, monkeypatch):
    folder, _ = tiny_scene
    runs = []
    for drop in (True, False):
        if not drop:
            monkeypatch.setattr(AverageSchedule, "wasted", lambda self, step: False)
        cfg = _cfg(data=str(folder), run_dir=str(tmp_path / str(drop)), eval_every=6)
        run_dir, metrics = train_run(cfg, log=lambda s: None)
        runs.append((json.loads((run_dir / "history.json").read_text()), metrics,
                     load_checkpoint(latest_checkpoint(run_dir))["averaged"]["params"]))
    (h_on, m_on, a_on), (h_off, m_off, a_off) = runs
    assert len(h_on["test_psnr"]) == 4 and h_on["test_psnr"] == h_off["test_psnr"]
    assert m_on["psnr"] == m_off["psnr"]
    for k in a_on:
        assert torch.equal(a_on[k], a_off[k]), k


@pytest.mark.parametrize("ema_decay", [0.0, 0.8])
def test_the_training_state_is_freed_before_the_evaluation(tiny_scene, tmp_path, monkeypatch,
                                                           ema_decay):
    """The gradients, Adam's moments and (with an average) the trained parameters are gone
    when the run's outputs are written, by the run and by a resumed run; the outputs are
    those of the served model."""
    import weakref

    import tilesplat.train.loop.run as run_module

    folder, _ = tiny_scene
    held: list[weakref.ref] = []

    class Watched(Trainer):
        def train(self):
            super().train()
            held.clear()
            held.append(weakref.ref(self))
            for p in self.params.values():
                held.append(weakref.ref(p))
                if p.grad is not None:
                    held.append(weakref.ref(p.grad))
            for opt in self.optimizers.values():
                for state in opt.state.values():
                    held.extend(weakref.ref(v) for v in state.values() if torch.is_tensor(v))

    seen = []
    write = run_module.write_outputs

    def checked(run_dir, cfg, dataset, params, *a, **kw):
        alive = [r for r in held if r() is not None]
        # without an average the served tensors are the trained ones (detached): their
        # storage stays, the Parameter objects, gradients and moments go
        seen.append((len(held), len(alive), params["means"].requires_grad))
        return write(run_dir, cfg, dataset, params, *a, **kw)

    monkeypatch.setattr(run_module, "Trainer", Watched)
    monkeypatch.setattr(run_module, "write_outputs", checked)
    cfg = _cfg(data=str(folder), run_dir=str(tmp_path / "run"), ema_decay=ema_decay)
    run_dir, metrics = train_run(cfg, log=lambda s: None)
    _, resumed = run_module.resume_run(run_dir, ["steps=30"], log=lambda s: None)
    assert len(seen) == 2
    for n_held, n_alive, grads in seen:  # the trainer, 6 parameters, 12 moments at least
        assert n_held >= 1 + 6 + 12 and n_alive == 0 and not grads
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    assert ckpt["step"] == 30
    served = ckpt["averaged"]["params"] if ema_decay else ckpt["params"]
    ds = load_dataset(folder)
    assert resumed["psnr"] == pytest.approx(evaluate(served, ds.test, cfg, ds.background)["psnr"],
                                            abs=1e-9)
    assert resumed["n_gaussians"] == len(served["means"])
