"""scripts/gpu_check.py without a GPU: the version line and its floor, the NVVM preflight, the
report written after every step (a killed run keeps what it had), the Markdown tables.

The end-to-end rehearsal runs under numba's simulator and takes minutes, so it is not here
(docs/gpu.md gives the command); the smoke test it starts with is tested in
``test_bench_devices.py``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "scripts", "gpu_check.py")
_spec = importlib.util.spec_from_file_location("gpu_check", _PATH)
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)

VERSIONS = {"python": "3.12.3", "torch": "2.11.0+cu130", "torch_cuda": "13.0",
            "numba": "0.62.1", "numba_cuda": "0.22.0", "simulator": False,
            "gpu": "NVIDIA H200", "compute_capability": "9.0", "gpus": 1}


def test_version_line_names_a_numba_cuda_below_the_floor():
    line = gpu_check.version_line(VERSIONS)
    assert line.startswith("gpu_check: python 3.12.3, torch 2.11.0+cu130")
    assert "numba-cuda 0.22.0" in line and "NVIDIA H200 (sm_90" in line
    assert "FLOOR" not in line
    old = gpu_check.version_line({**VERSIONS, "numba_cuda": "0.20.1"})
    assert "numba-cuda 0.20.1 is OLDER THAN THE FLOOR 0.21" in old
    assert "NOT INSTALLED" in gpu_check.version_line({**VERSIONS, "numba_cuda": None})
    assert gpu_check._version_tuple("0.21.0rc1+local") == (0, 21, 0)
    assert gpu_check._version_tuple("0.21") >= gpu_check.NUMBA_CUDA_FLOOR
    assert "no GPU" in gpu_check.version_line({**VERSIONS, "gpu": None})


def test_versions_of_this_machine():
    v = gpu_check.versions()
    assert {"python", "torch", "numba", "numba_cuda", "simulator", "gpu"} <= set(v)
    assert gpu_check.version_line(v).startswith("gpu_check: python ")


def test_nvvm_preflight(monkeypatch):
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed")
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    ok = gpu_check.nvvm_preflight(cc=(8, 0))
    assert ok["ok"] and "sm_80" in ok["message"], ok
    from numba import cuda

    def missing(*args, **kwargs):
        raise OSError("libnvvm.so: cannot open shared object file")

    monkeypatch.setattr(cuda, "compile_ptx", missing)
    bad = gpu_check.nvvm_preflight(cc=(9, 0))
    assert not bad["ok"] and "NVVM preflight FAILED" in bad["message"]
    assert "libnvvm.so" in bad["message"] and "skipped" in bad["message"]


def test_the_report_is_written_after_every_step(tmp_path):
    out = str(tmp_path / "gpu")
    report = {"version_line": "gpu_check: test", "versions": VERSIONS, "against": "cpu",
              "parity": [], "bench": []}
    run = gpu_check.Run(out, 60.0, report)
    seen = []

    def first():
        return 1

    def broken():
        # the first step's result is on disk before this one starts (a kill here keeps it)
        data = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
        seen.append(data)
        raise RuntimeError("kernel failed to load")

    assert run.step("first", first) == 1
    assert run.step("broken", broken) is None
    assert run.step("skipped", first, skip="NVVM preflight failed") is None
    run.budget_s = -1.0
    assert run.step("late", first) is None
    assert [s["step"] for s in seen[0]["steps"]] == ["first", "broken"]
    assert seen[0]["steps"][0]["status"] == "ok"
    assert seen[0]["steps"][1]["status"].startswith("running")
    data = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    status = {s["step"]: s["status"] for s in data["steps"]}
    assert status == {"first": "ok", "broken": "error: RuntimeError: kernel failed to load",
                      "skipped": "skipped (NVVM preflight failed)",
                      "late": "skipped (budget of -1 s spent)"}
    text = (tmp_path / "gpu" / "gpu_check.md").read_text()
    assert "| broken | error: RuntimeError: kernel failed to load |" in text
    assert sorted(os.listdir(out)) == ["gpu_check.json", "gpu_check.md"]  # no temporaries


def test_the_script_needs_only_torch_numpy_numba_and_numba_cuda():
    """The GPU machine's python3 may lack Pillow and scikit-image: the script, the bench and
    the cuda backend import without them, and a parity run works."""
    code = f"""
import runpy, sys
for name in ("PIL", "skimage", "imageio", "matplotlib", "viser", "pycolmap"):
    sys.modules[name] = None  # importing it raises ImportError
runpy.run_path({_PATH!r})  # defines everything; main() runs only as __main__
import tilesplat.bench, tilesplat.bench.smoke
if {importlib.util.find_spec("numba_cuda") is not None}:
    import tilesplat.backends.cuda
res = tilesplat.bench.run_parity("synthetic:10:16x8", "torch", "torch:per_splat",
                                 sh_degree=0, tile_size=8)
assert res["passed"], res["summary"]
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_tables_show_counts_launches_and_steps(tmp_path):
    from tilesplat.bench import run_bench, run_parity

    scene = "synthetic:10:16x8"
    parity = run_parity(scene, "torch", "torch:per_splat", sh_degree=0, tile_size=8)
    bench = run_bench(scene, ["torch", "torch:per_splat"], iters=1, repeats=1, sh_degree=0,
                      tile_size=8, calibrate=False)
    bench["cuda_options"] = {"warp_skip": True, "splat_batch": 32}
    bench["arms"][1]["cuda_launches"] = {"launches": 9, "host_ms": {"median": 0.5}}
    smoke = {"seconds": 1.5, "cases": [
        {"case": "spherical_harmonics", "status": "ok", "first_call_s": 1.25,
         "warm_call_s": 0.002},
        {"case": "rasterize_to_pixels per_pixel, warp skip on", "status":
         "error: RuntimeError: too many resources requested for launch"}]}
    report = {"version_line": "gpu_check: test", "versions": VERSIONS, "against": "torch",
              "parity": [parity], "bench": [bench], "smoke": smoke,
              "nvvm_preflight": {"message": "NVVM ok"}}
    run = gpu_check.Run(str(tmp_path), 60.0, report)
    run.step("one", lambda: None)
    text = (tmp_path / "gpu_check.md").read_text()
    assert "| spherical_harmonics | ok | 1.25 | 2.00 |" in text
    assert "| rasterize_to_pixels per_pixel, warp skip on | error: RuntimeError" in text
    assert f"| {scene} | torch:per_splat | PASS | 0 |" in text
    assert "Policy: same device type: 0 failing elements per tensor" in text
    assert "| torch:per_splat (batch 32) |" in text and "| 9 | 0.500 |" in text
    assert "PASS (0 failing) |" in text and "| one | ok |" in text
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "gpu_check.md").st_mode & 0o777 == 0o666 & ~umask


def test_tables_show_the_training_run(tmp_path):
    train = {"scene": "built-in 200px, 100 train / 20 test views", "backend": "cuda",
             "device": "cuda", "steps": 500, "train_seconds": 12.5, "steps_per_s": 40.0,
             "test_psnr": 27.123, "test_ssim": 0.91234, "n_gaussians": 123456,
             "peak_device_mib": 1534.6, "wall_seconds": 40.0}
    report = {"version_line": "gpu_check: test", "versions": VERSIONS, "against": "cpu",
              "parity": [], "bench": [], "train": train}
    run = gpu_check.Run(str(tmp_path), 60.0, report)
    run.step("train the built-in scene on the GPU", lambda: None)
    text = (tmp_path / "gpu_check.md").read_text()
    assert "## Training the built-in scene (tilesplat train)" in text
    assert ("| built-in 200px, 100 train / 20 test views | cuda | cuda | 500 | 40.0 | 12.5 | "
            "27.12 | 0.9123 | 123,456 | 1535 |") in text
    assert "| train the built-in scene on the GPU | ok |" in text
    assert "Training the built-in scene" not in gpu_check.tables({**report, "train": None})


def test_the_training_step_trains_the_builtin_scene(one_torch_thread):
    """The step's run, rehearsed on the CPU (backend cpu stands for cuda: no GPU here)."""
    got = gpu_check.train_builtin_scene(3, tiny=True, backend="cpu")
    assert got["scene"] == "built-in 16px, 2 train / 1 test views" and got["steps"] == 3
    assert got["device"] == "cpu" and got["n_gaussians"] == 50
    assert got["peak_device_mib"] is None  # on CUDA, the run's metrics.json's device peak
    assert got["steps_per_s"] == pytest.approx(3 / got["train_seconds"])
    assert 0.0 < got["test_psnr"] < 100.0 and got["wall_seconds"] >= got["train_seconds"]


def test_tables_show_the_launch_cost(tmp_path):
    launch = {"launches": 1000, "kernel": "rasterize_bwd_per_pixel", "arguments": 28,
              "scene": "synthetic:20000:256x256", "parity_scene": "garden",
              "thin_host_us": 4.25, "thin_wall_us": 9.5, "numba_host_us": 80.0,
              "numba_wall_us": 81.0, "thin_taken": True, "refused": None, "passed": True,
              "parity": {"deterministic": {"passed": True, "rule": "bitwise equal"},
                         "default": {"passed": False, "rule": "abs 1e-4 + rel 1e-4"}}}
    report = {"version_line": "gpu_check: test", "versions": VERSIONS, "against": "cpu",
              "parity": [], "bench": [], "launch_cost": launch}
    run = gpu_check.Run(str(tmp_path), 60.0, report)
    run.step("launch cost", lambda: None)
    text = (tmp_path / "gpu_check.md").read_text()
    assert "## Launch cost: thin path vs kernel[...]" in text
    assert ("thin 4.2 µs host / 9.5 µs wall per launch, kernel[...] 80.0 / 81.0; thin path "
            "taken; parity on garden: deterministic: PASS (bitwise equal); default: FAIL") in text
    line = gpu_check.launch_line({**launch, "thin_taken": False, "refused": "PTX differs"})
    assert "thin path NOT taken (PTX differs)" in line
