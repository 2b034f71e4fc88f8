"""``tilesplat gate``: configs validated first, runs in their own processes, a verdict that fails.

Every training here is tiny (32 px, 4 train views, at most 40 steps, the torch backend, so
that no Numba kernel compiles in a child process).
"""

import json

import pytest
import torch

from tilesplat.bench.gate import format_gate, summarize_gate
from tilesplat.bench.gate_runs import error_of, read_metrics, run_one
from tilesplat.cli import main
from tilesplat.io.images import read_image
from tilesplat.train.config import TrainConfig
from tilesplat.train.rundir.outputs import peak_device_mib

TINY = """\
synthetic_size = 32
synthetic_train = 4
synthetic_test = 2
cache_dir = "{cache}"
steps = {steps}
init_points = 200
sh_degree = 1
backend = "torch"
lpips = false
save_ply = false
save_renders = false
checkpoint_every = 0
{extra}
"""


@pytest.fixture
def configs(tmp_path_factory, monkeypatch):
    """Writes tiny configs: ``make(name, steps=40, extra="")`` -> path."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the children share 2 cores with the tests
    folder = tmp_path_factory.mktemp("gate_configs")
    cache = tmp_path_factory.getbasetemp() / "gate_cache"  # the scene is written once

    def make(name: str, steps: int = 40, extra: str = "") -> str:
        path = folder / f"{name}.toml"
        path.write_text(TINY.format(cache=cache, steps=steps, extra=extra))
        return str(path)

    return make


def test_a_tenth_of_the_steps_fails_the_psnr_guard(configs, tmp_path, capsys):
    base, cand = configs("base"), configs("short", steps=4)
    out = tmp_path / "gate.json"
    argv = ["gate", base, cand, "--repeats", "1", "--out-dir", str(tmp_path / "g")]
    assert main([*argv, "--out", str(out)]) == 1
    text = capsys.readouterr().out
    assert "[1/2] base r0 (seed 0)" in text and "[2/2] cand r0 (seed 0)" in text
    assert "warm-up of base (2 steps, not counted): ok" in text
    assert (tmp_path / "g" / "warmup-cand" / "metrics.json").is_file()
    assert "verdict: FAIL" in text and "below the base's" in text
    result = json.loads(out.read_text())
    assert result == json.loads((tmp_path / "g" / "gate.json").read_text())
    assert result["verdict"] == "FAIL" and result["finished"]
    assert [r["ok"] for r in result["runs"]] == [True, True]
    assert [r["seed"] for r in result["runs"]] == [0, 0]  # one seed per repeat, both arms
    assert result["deltas"]["psnr_db"]["mean"] < -1.0
    # the colour-corrected PSNR (post_processing's measure) is read and paired too
    assert all(r["cc_psnr"] >= r["psnr"] for r in result["runs"])
    assert result["deltas"]["cc_psnr_db"]["n"] == 1 and "cc PSNR dB" in text
    assert result["arms"]["cand"]["config"]["steps"] == 4
    assert result["runs"][0]["code"]["source"].endswith("src")
    # evaluated during training (40 / EVAL_POINTS = every 2 steps) for the time to PSNR
    base_run, cand_run = result["runs"]
    assert [c[1] for c in base_run["curve"]] == [float(s) for s in range(2, 41, 2)]
    assert [c[1] for c in cand_run["curve"]] == [1.0, 2.0, 3.0, 4.0]  # at least every step
    assert result["target_psnr_db"] == pytest.approx(base_run["psnr"] - 0.1)
    assert base_run["time_to_psnr_s"] <= base_run["curve"][-1][0]  # the base reaches its target
    assert cand_run["time_to_psnr_s"] is None and result["arms"]["cand"]["reached_psnr"] == 0
    assert "s to " in text and "(0/1)" in text
    # each run's peak memory, from its metrics.json, and the paired change
    assert all(r["peak_rss_mib"] > 50 for r in result["runs"])
    assert result["deltas"]["peak_rss_pct"]["n"] == 1 and "peak MiB" in text
    # runs on the CPU have no device peak, and the table no row for it
    assert [r["peak_device_mib"] for r in result["runs"]] == [None, None]
    assert result["deltas"]["peak_device_pct"]["n"] == 0 and "peak device" not in text
    png = read_image(tmp_path / "g" / "time_to_psnr.png")
    assert png.shape[:2] == (270, 360) and png.std() > 0.01  # a chart, not a blank
    # the gate refuses to reuse a folder that holds one
    assert main(argv) == 2
    assert "--out-dir" in capsys.readouterr().err


def test_a_raising_run_is_reported_as_failed(configs, tmp_path, capsys):
    base = configs("base", steps=4)
    cand = configs("raises", steps=4, extra='init = "points"')  # the scene has no points
    assert main(["gate", base, cand, "--repeats", "1", "--out-dir", str(tmp_path / "g"),
                 "--no-warmup"]) == 1
    text = capsys.readouterr().out
    assert "FAILED cand r0" in text and "dataset has no point cloud" in text
    result = json.loads((tmp_path / "g" / "gate.json").read_text())
    rows = {r["arm"]: r for r in result["runs"]}
    assert rows["base"]["ok"] and not rows["cand"]["ok"]
    assert rows["cand"]["exit_status"] == 2 and "no point cloud" in rows["cand"]["error"]
    assert result["verdict"] == "FAIL" and "1 run(s) failed" in result["reasons"]


def test_configs_are_checked_before_any_run(configs, tmp_path, capsys):
    base = configs("base")
    bad = configs("bad", extra="stesp = 3")
    out_dir = tmp_path / "g"
    assert main(["gate", base, bad, "--out-dir", str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml: unknown config key 'stesp'; did you mean 'steps'?" in err
    assert main(["check", bad]) == 2  # the same error as tilesplat check
    assert "did you mean 'steps'?" in capsys.readouterr().err
    assert main(["gate", base, base, "--set", "steps=0", "--out-dir", str(out_dir)]) == 2
    assert "steps must be >= 1" in capsys.readouterr().err
    assert main(["gate", base, base, "--repeats", "0", "--out-dir", str(out_dir)]) == 2
    assert "--repeats must be" in capsys.readouterr().err
    assert main(["gate", base, base, "--psnr-guard", "nan", "--out-dir", str(out_dir)]) == 2
    assert "--psnr-guard" in capsys.readouterr().err
    assert not out_dir.exists()


def test_a_run_past_its_timeout_is_ended_and_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = TrainConfig(steps=100_000, cache_dir=str(tmp_path / "c"), synthetic_size=32,
                      synthetic_train=2, synthetic_test=1, backend="torch", lpips=False)
    row = run_one(cfg, tmp_path / "run", timeout=0.5)
    assert not row["ok"] and "ran past --timeout 0.5 s" in row["error"]
    assert row["exit_status"] is not None  # the child was ended and reaped
    assert row["wall_s"] < 30


def _row(arm, repeat, psnr, ok=True, wall=10.0, curve=None):
    if not ok:
        return {"arm": arm, "repeat": repeat, "ok": False, "error": "boom", "wall_s": wall}
    return {"arm": arm, "repeat": repeat, "ok": True, "wall_s": wall, "train_s": wall - 1,
            "steps_per_s": 100 / (wall - 1), "psnr": psnr, "ssim": 0.9, "gaussians": 1000,
            "curve": curve if curve is not None else [[wall - 1, 100.0, psnr]]}


def test_time_to_psnr_is_to_the_base_final_minus_a_tenth():
    """The target is the base's mean final PSNR - 0.1 dB; each run's time is its first test
    evaluation at or above it; the ratio pairs the repeats."""
    base = [[2.0, 10, 25.0], [4.0, 20, 29.95], [8.0, 40, 30.0]]
    runs = [_row("base", 0, 30.0, wall=9, curve=base),
            _row("cand", 0, 30.0, wall=5, curve=[[1.0, 10, 29.0], [2.0, 20, 29.9],
                                                 [4.0, 40, 30.0]]),
            _row("base", 1, 30.2, wall=9, curve=[[3.0, 10, 30.05], [8.0, 40, 30.2]]),
            _row("cand", 1, 29.0, wall=5, curve=[[4.0, 40, 29.0]])]
    res = summarize_gate(runs, psnr_guard=2.0)
    assert res["target_psnr_db"] == pytest.approx(30.0)
    assert [r["time_to_psnr_s"] for r in runs] == [8.0, 4.0, 3.0, None]
    assert res["arms"]["base"]["reached_psnr"] == 2 and res["arms"]["cand"]["reached_psnr"] == 1
    assert res["arms"]["cand"]["time_to_psnr_s"]["mean"] == pytest.approx(4.0)
    assert res["deltas"]["time_to_psnr_ratio"]["mean"] == pytest.approx(0.5)  # only repeat 0
    assert res["deltas"]["time_to_psnr_ratio"]["n"] == 1


def test_verdicts_and_paired_deltas():
    runs = [_row("base", 0, 30.0, wall=10), _row("cand", 0, 29.95, wall=8),
            _row("base", 1, 30.2, wall=12), _row("cand", 1, 30.15, wall=9)]
    res = summarize_gate(runs, psnr_guard=0.1)
    assert res["verdict"] == "PASS" and not res["reasons"]
    assert res["deltas"]["psnr_db"]["mean"] == pytest.approx(-0.05)
    assert res["deltas"]["wall_pct"]["mean"] == pytest.approx((-20.0 - 25.0) / 2)
    assert res["arms"]["base"]["psnr"]["mean"] == pytest.approx(30.1)
    assert summarize_gate(runs, psnr_guard=0.01)["verdict"] == "FAIL"
    failed = summarize_gate([*runs, _row("cand", 2, 0.0, ok=False)], psnr_guard=0.1)
    assert failed["verdict"] == "FAIL" and failed["reasons"] == ["1 run(s) failed"]
    assert failed["arms"]["cand"]["runs"] == 3 and failed["arms"]["cand"]["ok"] == 2
    assert res["notes"] == []
    runs[3]["code"] = {"commit": "abc", "dirty": False}
    runs[0]["code"] = {"commit": "def", "dirty": True}
    assert "source changed between runs" in summarize_gate(runs, 0.1)["notes"][0]


def test_the_device_peak_is_read_and_paired_where_runs_were_on_cuda(tmp_path, monkeypatch):
    """metrics.json's ``peak_device_mib``: torch.cuda.max_memory_allocated of the run's CUDA
    device in MiB, None elsewhere; the gate reads it (None when null or absent, as in the runs
    of older versions), pairs it like the RSS and shows its row only where a run had one."""
    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated",
                        lambda device=None: asked.append(device) or 3 * 2**20 + 2**19)
    assert peak_device_mib(torch.device("cuda", 1)) == 3.5
    assert asked == [torch.device("cuda", 1)]
    assert peak_device_mib(torch.device("cpu")) is None and len(asked) == 1

    base = {"psnr": 30.0, "ssim": 0.9, "n_gaussians": 10, "step": 4, "train_seconds": 1.0}
    for value, read in ((1234.5, 1234.5), (None, None), ("1", None), (True, None)):
        (tmp_path / "m.json").write_text(json.dumps({**base, "peak_device_mib": value}))
        assert read_metrics(tmp_path / "m.json")["peak_device_mib"] == read
    (tmp_path / "m.json").write_text(json.dumps(base))
    assert read_metrics(tmp_path / "m.json")["peak_device_mib"] is None

    runs = [_row("base", 0, 30.0), _row("cand", 0, 30.0), _row("base", 1, 30.0),
            _row("cand", 1, 30.0)]
    for r, peak in zip(runs, (1000.0, 800.0, 1100.0, 990.0), strict=True):
        r["peak_device_mib"] = peak
    res = summarize_gate(runs, psnr_guard=0.1)
    assert res["deltas"]["peak_device_pct"]["mean"] == pytest.approx((-20.0 - 10.0) / 2)
    assert res["arms"]["cand"]["peak_device_mib"]["mean"] == pytest.approx(895.0)
    _as_run_gate(res, runs)
    row = next(line for line in format_gate(res).splitlines() if "peak device MiB" in line)
    assert "1050" in row and "895" in row and "-15.0" in row
    for r in runs:
        r["peak_device_mib"] = None
    res = summarize_gate(runs, psnr_guard=0.1)
    _as_run_gate(res, runs)
    assert "peak device" not in format_gate(res)


def _as_run_gate(res, runs):
    """What ``run_gate`` adds to ``summarize_gate``'s result before it is formatted."""
    for arm in ("base", "cand"):
        res["arms"][arm]["name"] = arm
    res.update(psnr_guard_db=0.1, runs=runs)


def test_error_of_a_traceback(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("Traceback (most recent call last):\n  File x\nRuntimeError: out of memory\n")
    assert error_of(log, 1) == "RuntimeError: out of memory"
    log.write_text("killed\n")
    assert error_of(log, -9) == "exit status -9: killed"
