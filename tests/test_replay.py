"""``tilesplat bench --scene run:RUN_DIR``: the trainer's own step on a run's checkpoint, and
parity / self-noise through it. The run is tiny (32 px, 4 views, 12 steps)."""

import json

import pytest
import torch

import tilesplat.bench.replay as replay_mod
from tilesplat.bench import parse_arm, run_parity, run_self_noise
from tilesplat.bench.replay import ReplayStep, open_run
from tilesplat.bench.timing import NullTimer
from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished default-strategy run whose densification stopped before its last step."""
    root = tmp_path_factory.mktemp("replay")
    data = write_synthetic_dataset(root / "scene", n_train=4, n_test=1, size=32)
    cfg = TrainConfig(data=str(data), steps=12, init_points=150, sh_degree=1,
                      sh_degree_interval=4, refine_start=2, refine_every=4, refine_stop=8,
                      checkpoint_every=0, progress=False, lpips=False,
                      backend="torch").validate()
    torch.set_num_threads(1)
    Trainer(cfg, load_dataset(data), root / "run", log=lambda s: None).train()
    return root / "run"


def test_the_replay_step_is_the_trainers_step(run_dir, monkeypatch):
    calls = []
    real = replay_mod.optimization_step
    monkeypatch.setattr(replay_mod, "optimization_step",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    replay = open_run(f"run:{run_dir}")
    step = ReplayStep(replay, parse_arm("torch"))
    step(NullTimer())
    assert calls == [1]  # the replay calls the trainer's function, it has no copy of it
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    trainer = Trainer(replay.cfg, replay.dataset, run_dir / "scratch", checkpoint=ckpt,
                      log=lambda s: None)
    trainer.train_step(trainer.step)  # densification has stopped: the same work
    for name, p in trainer.params.items():
        assert torch.equal(p, step.params[name]), name


def test_run_parity_passes_and_a_perturbed_arm_fails(run_dir):
    res = run_parity(f"run:{run_dir}", "torch", "cpu:per_splat")
    rows = {r["name"]: r for r in res["tensors"]}
    assert res["passed"], [r for r in res["tensors"] if not r["passed"]]
    for name in ("loss", "isect_offsets", "v_means", "v_scales", "v_quats", "v_opacities",
                 "v_sh0", "v_shN", "v_raster_means2d", "v_raster_conics", "v_raster_colors",
                 "v_raster_opacities"):
        assert name in rows and rows[name]["numel_a"] > 0, name
    assert rows["intersection order (flatten_ids)"]["gated"] is False

    def perturb(spec, result):
        if spec == "cpu:per_splat":
            result["grads"]["v_scales"][0, 0] += 1.0

    bad = run_parity(f"run:{run_dir}", "torch", "cpu:per_splat", hook=perturb)
    assert not bad["passed"]
    assert [r["name"] for r in bad["tensors"] if not r["passed"]] == ["v_scales"]


def test_run_self_noise_sees_a_changed_pass(run_dir):
    res = run_self_noise(f"run:{run_dir}", ["cpu:per_pixel"], k=2)
    assert res["arms"][0]["bitwise_identical"] and "loss" in res["arms"][0]["grads"]
    seen = []

    def jitter(spec, result):
        seen.append(spec)
        if len(seen) == 2:
            result["grads"]["v_sh0"] += 1e-3

    noisy = run_self_noise(f"run:{run_dir}", ["cpu:per_pixel"], k=2, hook=jitter)
    assert not noisy["arms"][0]["bitwise_identical"]
    assert noisy["arms"][0]["grads"]["v_sh0"]["max_abs"] == pytest.approx(1e-3, rel=1e-3)


def test_cli_bench_replays_a_run(run_dir, tmp_path, capsys):
    out = tmp_path / "replay.json"
    argv = ["bench", "--scene", f"run:{run_dir}", "--arms", "torch", "cpu:per_splat",
            "--warmup", "1", "--iters", "2", "--repeats", "2", "--no-calibrate",
            "--out", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "the training step is the trainer's own" in text
    res = json.loads(out.read_text())
    assert res["scene"]["run"]["step"] == 12 and res["scene"]["sh_degree"] == 1
    assert res["config"]["iters"] == 2 and res["parity_gate_passed"]
    step = res["arms"][1]["ms"]["step"]
    assert len(step["iterations"]) == 4 and {"median", "mean", "std"} <= set(step)
    parts = [res["arms"][1]["ms"][f"step_{p}"]["median"] for p in ("render", "loss", "backward",
                                                                   "adam")]
    assert 0 < sum(parts) <= step["median"] * 1.01 and "step: adam" in text


def test_bad_runs_are_one_line_errors(run_dir, tmp_path, capsys):
    assert main(["bench", "--scene", "run:"]) == 2
    assert "run folder or a checkpoint file" in capsys.readouterr().err
    assert main(["bench", "--scene", f"run:{tmp_path / 'nothing'}", "--parity", "torch",
                 "torch"]) == 2
    assert "run folder not found" in capsys.readouterr().err
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    ckpt["params"]["scales"] = ckpt["params"]["scales"][:, :2]
    save_checkpoint(tmp_path / "bad.pt", ckpt)
    assert main(["bench", "--scene", f"run:{tmp_path / 'bad.pt'}"]) == 2
    assert "'scales' has shape" in capsys.readouterr().err
    (tmp_path / "code.pt").write_bytes(b"\x80\x02cos\nsystem\n.")  # a pickle that imports
    assert main(["bench", "--scene", f"run:{tmp_path / 'code.pt'}"]) == 2
    assert "not a readable checkpoint" in capsys.readouterr().err


def test_run_parity_follows_the_policy_across_devices():
    from tilesplat.bench.replay import compare_passes

    g = torch.Generator().manual_seed(0)
    a = {"outputs": {"isect_offsets": torch.arange(6).reshape(1, 2, 3),
                     "flatten_ids": torch.arange(5)},
         "grads": {"v_means": torch.randn(700, 3, generator=g)}}
    b = {"outputs": {"isect_offsets": a["outputs"]["isect_offsets"].clone(),
                     "flatten_ids": torch.tensor([1, 0, 2, 3, 4])},
         "grads": {"v_means": a["grads"]["v_means"].clone()}}
    b["grads"]["v_means"][0, 0] += 1.0  # one flipped element

    def failed(rows):
        return [r["name"] for r in rows if not r["passed"]]

    assert failed(compare_passes(a, b, 1e-4, 1e-4)) == ["v_means"]  # one device type: none
    rows = compare_passes(a, b, 1e-4, 1e-4, cross_device=True)  # cpu vs cuda: a few allowed
    assert failed(rows) == [] and rows[-1]["verdict"].startswith("PASS 1/2,100 failing")
    assert "2 of 5 positions differ" in rows[1]["verdict"]  # the order: reported only
    b["outputs"]["isect_offsets"][0, 0, 1] += 1
    assert failed(compare_passes(a, b, 1e-4, 1e-4, cross_device=True)) == ["isect_offsets"]
