"""``tilesplat bench --eval3d`` (``tilesplat.bench.eval3d_cost``) with the torch reference as
the backend under test (it compiles nothing; the cpu kernels have their own parity tests):
the gate passes and both rasterizers are timed in one run; a backend whose eval3d is off
fails the gate and gets no ratio."""

import json

from tilesplat.bench import eval3d_cost
from tilesplat.cli import main


def test_the_command_times_eval3d_and_the_2d_rasterizer_in_one_run(tmp_path, capsys):
    out = tmp_path / "e3.json"
    assert main(["bench", "--eval3d", "15", "30", "--eval3d-size", "32x24", "--repeats", "1",
                 "--eval3d-backend", "torch", "--markdown", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["gate"]["passed"] and [s["gaussians"] for s in res["scenes"]] == [15, 30]
    for s in res["scenes"]:
        assert s["intersections"]["eval3d"] > 0 and s["intersections"]["2d"] > 0
        assert s["raster_s"]["eval3d"] > 0 and s["raster_s"]["2d"] > 0
        assert s["ratio"]["min"] <= s["ratio"]["median"] <= s["ratio"]["max"]
    text = capsys.readouterr().out
    assert "| 30 (" in text and "PASS" in text


def test_a_wrong_eval3d_fails_the_gate(monkeypatch):
    real = eval3d_cost.run_eval3d

    def off(backend, *args):
        seconds, outs = real("torch", *args)
        return seconds, ([o * 1.01 for o in outs] if backend == "cpu" else outs)

    monkeypatch.setattr(eval3d_cost, "run_eval3d", off)
    res = eval3d_cost.run_eval3d_cost([20], 32, 24, repeats=1, backend="cpu", gate_gaussians=20)
    failed = {r["tensor"] for r in res["gate"]["rows"] if not r["passed"]}
    assert not res["gate"]["passed"] and "colors" in failed and res["scenes"] == []
    assert "no ratios" in eval3d_cost.format_eval3d_cost(res)


def test_bad_sizes_are_one_line(capsys):
    assert main(["bench", "--eval3d", "10", "--eval3d-size", "32by24"]) == 2
    assert "--eval3d-size must be WxH" in capsys.readouterr().err
