#!/usr/bin/env python
"""One-shot check of the ``cuda`` backend on a GPU: kernels, parity against ``cpu``, bench.

Installs nothing, and needs only torch, numpy, numba and numba-cuda (the lent GPU machine's
``python3`` has them): ``PYTHONPATH=src python3 scripts/gpu_check.py --out $OUT/gpu``. A run
with the defaults fits well under 10 minutes on an H200, compilation included: a step that
would start after ``--budget-s`` (default 360) is reported as skipped, never dropped.

Output: the first line gives the versions (and says so when numba-cuda is older than the
floor, 0.21); ``OUT/gpu_check.json`` (every number) and ``OUT/gpu_check.md`` (tables) are
rewritten atomically after every step, so a run killed at the machine's time cap leaves what
it had.

Steps, the most valuable numbers first:

0. NVVM preflight: one tiny ``numba.cuda.compile_ptx`` (a clear message if NVVM is missing;
   the GPU steps are then skipped);
1. smoke test (:mod:`tilesplat.bench.smoke`, seconds): every op forward and backward on the
   GPU through the public API against the ``torch`` reference, both backward schemes, warp
   skip on and off, batches 32 and 256;
2. parity of ``cuda:per_pixel`` and ``cuda:per_splat`` against ``cpu:per_splat``
   (``--against``) on the first scene: every output and gradient, failing elements counted
   per tensor under the cross-device policy of :mod:`tilesplat.bench.tolerance`;
3. bench (:func:`tilesplat.bench.run_bench`) of ``cuda:per_pixel`` and ``cuda:per_splat`` on
   the last scene (the 4 ms target's); then 2DGS (:mod:`tilesplat.bench.twodgs`):
   ``rasterization_2dgs`` forward + backward on ``cuda`` against the torch reference on the
   GPU, parity (float32, arbitrated by the float64 reference) then the median time of each,
   on 3,000 surfels at 128x128; then 3DGUT (:mod:`tilesplat.bench.ut`): ``rasterization(
   with_ut=True, with_eval3d=True)`` through an OpenCV camera under a rolling shutter, the
   same gate and times on 3,000 Gaussians at 128x128; then parity on the other scenes and
   the bench there;
4. variants: warp skip off (``per_pixel``; ``per_splat`` links the runs), ``per_splat`` with
   batches of 256;
5. train the built-in scene on the GPU: ``tilesplat train`` (:func:`tilesplat.train.train_run`,
   in this process) with ``backend = "cuda"`` for ``--train-steps`` steps (default 500) at
   the default size, no progress line, into a temporary folder: steps/s, test PSNR and the
   Gaussian count (needs Pillow: the built-in scene is PNG files; skipped without it);
6. two deterministic trainings (the same PLY bytes?), then the trainer's own step in its
   three modes (``scripts/gpu_step.py``: exact, capacity, CUDA graph; wall and GPU-busy time,
   syncs, launches, aten ops per step, and the graph's parity), into ``OUT/step``;
7. several ranks (``scripts/gpu_multi.py``): NCCL with one rank trains the built-in scene,
   and two ranks on the one GPU over gloo with CUDA tensors train it to within 0.5 dB of
   one process (data and model mode).

After the smoke test: µs per launch, thin path vs ``kernel[...]`` (1,000 raster-backward
launches), and parity of every output and gradient between the two paths
(:func:`tilesplat.bench.launch_cost.device_launches`).

Usage::

    PYTHONPATH=src python3 scripts/gpu_check.py --out gpu_check   # garden + 400k at 800x800
    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=src python scripts/gpu_check.py \\
        --scene synthetic:20:16x16 --quick --out /tmp/gpucheck           # rehearsal, no GPU

Under numba's simulator the ``cuda`` arms' tensors are on the CPU (``Arm.torch_device``); it
only rehearses this script (slowly: every GPU thread is a Python thread).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

DEFAULT_SCENES = ("garden", "synthetic:400000:800x800")
SCHEMES = ("per_pixel", "per_splat")
# The oldest numba-cuda the cuda backend works with (numba.cuda.types, launch_bounds).
NUMBA_CUDA_FLOOR = (0, 21)


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"0.30.4"`` -> ``(0, 30, 4)``; stops at the first piece that is not a number."""
    out = []
    for piece in text.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if digits is None:
            break
        out.append(int(digits.group()))
    return tuple(out)


def versions() -> dict[str, Any]:
    """Python, torch, numba, numba-cuda (without importing it), the GPU, the simulator."""
    from importlib import metadata

    import numba
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "numba": numba.__version__}
    try:
        out["numba_cuda"] = metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:
        out["numba_cuda"] = None
    out["simulator"] = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    out["gpu"] = None
    if torch.cuda.is_available():
        cap = torch.cuda.get_device_capability(0)
        out.update(gpu=torch.cuda.get_device_name(0), compute_capability=f"{cap[0]}.{cap[1]}",
                   gpus=torch.cuda.device_count())
    return out


def version_line(v: dict[str, Any]) -> str:
    """The first line of output; names a numba-cuda older than the floor."""
    floor = ".".join(map(str, NUMBA_CUDA_FLOOR))
    gpu = (f"{v['gpu']} (sm_{v['compute_capability'].replace('.', '')}, {v['gpus']} GPU(s))"
           if v["gpu"] else "no GPU")
    line = (f"gpu_check: python {v['python']}, torch {v['torch']} (CUDA {v['torch_cuda']}), "
            f"numba {v['numba']}, numba-cuda {v['numba_cuda'] or 'NOT INSTALLED'}, {gpu}"
            f"{', numba CUDA simulator' if v['simulator'] else ''}")
    if v["numba_cuda"] is None:
        return line + f" -- the cuda backend needs numba-cuda >= {floor}"
    if _version_tuple(v["numba_cuda"]) < NUMBA_CUDA_FLOOR:
        return (line + f" -- numba-cuda {v['numba_cuda']} is OLDER THAN THE FLOOR {floor}: "
                "the cuda backend will not import")
    return line


def nvvm_preflight(cc: tuple[int, int] | None = None) -> dict[str, Any]:
    """Compiles a one-line kernel to PTX; ``ok`` False with a clear ``message`` when NVVM is
    missing or broken (then no kernel of the cuda backend can compile)."""
    t0 = time.perf_counter()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return {"ok": True, "seconds": 0.0, "message": "skipped: numba's simulator has no NVVM"}
    try:
        import torch
        from numba import cuda

        if cc is None:
            cc = torch.cuda.get_device_capability(0) if torch.cuda.is_available() else (9, 0)

        def tiny(x):
            i = cuda.grid(1)
            if i < x.size:
                x[i] = x[i] * 2.0 + 1.0

        ptx, _ = cuda.compile_ptx(tiny, "void(float32[:])", cc=tuple(cc))
        if ".entry" not in ptx:
            raise RuntimeError("the PTX has no kernel entry")
    except Exception as exc:
        return {"ok": False, "seconds": time.perf_counter() - t0,
                "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc(),
                "message": ("NVVM preflight FAILED: numba-cuda cannot compile a one-line kernel "
                            f"to PTX ({type(exc).__name__}: {exc}; traceback in the JSON). If NVVM "
                            "(libnvvm) is missing or broken: numba-cuda takes it from the "
                            "nvidia-nvvm wheel (pip install 'numba-cuda[cu13]') or from a "
                            "CUDA toolkit (CUDA_HOME). "
                            "Every GPU step is skipped.")}
    return {"ok": True, "seconds": time.perf_counter() - t0,
            "message": f"NVVM ok: a kernel compiled to PTX for sm_{cc[0]}{cc[1]}"}


def _write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (a temporary file renamed over it)."""
    fd, tmp = tempfile.mkstemp(prefix=".gpu_check-", dir=os.path.dirname(path) or ".")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
    os.replace(tmp, path)


class Run:
    """The report, the wall-clock budget, and the files rewritten after every step."""

    def __init__(self, out: str, budget_s: float, report: dict[str, Any]) -> None:
        self.out, self.budget_s, self.report = out, budget_s, report
        self.start = time.perf_counter()
        report["steps"] = []
        os.makedirs(out, exist_ok=True)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def step(self, name: str, fn: Callable[[], Any], skip: str | None = None) -> Any:
        """Runs ``fn`` unless ``skip`` (a reason) or the budget is spent; records it, writes."""
        entry: dict[str, Any] = {"step": name, "started_s": round(self.elapsed(), 1)}
        self.report["steps"].append(entry)
        if skip is None and self.elapsed() > self.budget_s:
            skip = f"budget of {self.budget_s:.0f} s spent"
        if skip is not None:
            entry.update(status=f"skipped ({skip})", seconds=0.0)
            print(f"[{self.elapsed():6.1f}s] SKIP {name}: {skip}", flush=True)
            self.write()
            return None
        print(f"[{self.elapsed():6.1f}s] {name} ...", flush=True)
        entry["status"] = "running (a run killed here stops with this status)"
        self.write()
        t0 = time.perf_counter()
        try:
            result = fn()
            entry["status"] = "ok"
            return result
        except Exception as exc:  # one failing step must not hide the others' numbers
            entry["status"] = f"error: {type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()
            print(f"    ERROR {type(exc).__name__}: {exc}", flush=True)
            return None
        finally:
            entry["seconds"] = round(time.perf_counter() - t0, 1)
            self.report["elapsed_s"] = round(self.elapsed(), 1)
            self.write()

    def write(self) -> None:
        from tilesplat.bench import write_json

        write_json(self.report, os.path.join(self.out, "gpu_check.json"))
        _write_text(os.path.join(self.out, "gpu_check.md"), tables(self.report))


def _bench(scene: str, arms: list[str], options: dict[str, Any], quick: bool) -> dict[str, Any]:
    from tilesplat.backends.cuda import reset_options, set_options
    from tilesplat.bench import run_bench

    reset_options()
    set_options(**options)
    try:
        iters, repeats, warmup = (1, 1, 1) if quick else (5, 5, 2)
        res = run_bench(scene, arms, iters=iters, repeats=repeats, warmup=warmup,
                        calibrate=False)
    finally:
        reset_options()
    res["cuda_options"] = options
    return res


def train_builtin_scene(steps: int, tiny: bool, backend: str = "cuda",
                        **extra: Any) -> dict[str, Any]:
    """A ``tilesplat train`` run of the built-in scene with ``backend``, in a temporary
    folder; its speed, test PSNR and Gaussian count. ``tiny``: a 16-pixel scene of 2 views
    (a rehearsal under the simulator). ``extra``: more config keys; with ``save_ply`` the
    result holds the PLY's sha256."""
    import hashlib

    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.run import train_run
    from tilesplat.train.step.device import training_device

    keys: dict[str, Any] = {"backend": backend, "steps": steps, "progress": False,
                            "lpips": False, "save_renders": False, "save_ply": False,
                            "checkpoint_every": 0}
    if tiny:
        keys.update(synthetic_size=16, synthetic_train=2, synthetic_test=1, init_points=50)
    keys.update(extra)
    t0 = time.perf_counter()
    ply_sha = None
    with tempfile.TemporaryDirectory(prefix="gpu_check-train-") as tmp:
        cfg = TrainConfig(run_dir=os.path.join(tmp, "run"), cache_dir=os.path.join(tmp, "cache"),
                          **keys).validate()
        device = str(training_device(cfg))
        _, metrics = train_run(cfg, log=lambda line: None)
        ply = os.path.join(tmp, "run", "point_cloud.ply")
        if cfg.save_ply and os.path.exists(ply):
            with open(ply, "rb") as f:
                ply_sha = hashlib.sha256(f.read()).hexdigest()
    seconds = metrics["train_seconds"]
    return {"scene": f"built-in {cfg.synthetic_size}px, {cfg.synthetic_train} train / "
                     f"{cfg.synthetic_test} test views",
            "backend": cfg.backend, "device": device, "steps": steps,
            "train_seconds": seconds, "steps_per_s": steps / seconds if seconds else None,
            "test_psnr": metrics["psnr"], "test_ssim": metrics["ssim"],
            "n_gaussians": metrics["n_gaussians"], "ply_sha256": ply_sha,
            # the device's peak (torch.cuda.max_memory_allocated); None off CUDA (simulator)
            "peak_device_mib": metrics.get("peak_device_mib"),
            "wall_seconds": time.perf_counter() - t0}  # with the scene's generation


def train_reproducibly(steps: int, tiny: bool) -> dict[str, Any]:
    """Two ``deterministic = true`` trainings of the built-in scene on cuda (batch 2, so the
    projection sums over cameras too): whether their PLY files are the same bytes, and the
    steps/s against one run without the option."""
    common = {"batch_size": 2, "save_ply": True}
    runs = [train_builtin_scene(steps, tiny, deterministic=True, **common) for _ in range(2)]
    plain = train_builtin_scene(steps, tiny, deterministic=False, **common)
    return {"steps": steps, "same_ply": runs[0]["ply_sha256"] == runs[1]["ply_sha256"],
            "ply_sha256": [r["ply_sha256"] for r in runs],
            "plain_same_as_deterministic": plain["ply_sha256"] == runs[0]["ply_sha256"],
            "steps_per_s": [r["steps_per_s"] for r in runs],
            "plain_steps_per_s": plain["steps_per_s"], "test_psnr": runs[0]["test_psnr"],
            "plain_test_psnr": plain["test_psnr"]}


def several_ranks(out: str, steps: int, tiny: bool, rehearse: bool) -> dict[str, Any]:
    """scripts/gpu_multi.py's two items (into ``OUT/gpu_multi.json``); ``rehearse`` (under
    the simulator): gloo instead of NCCL."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_multi

    if rehearse:
        gpu_multi.EXTRA[:] = gpu_multi.SIM_KEYS
    return gpu_multi.run_checks(out, steps, "cuda", tiny, rehearse)
def launch_cost(tiny: bool) -> dict[str, Any]:
    """The thin launch path against kernel[...] on the device (two launches of a 16x8 scene
    in 8-pixel tiles when ``tiny``: a rehearsal, minutes under the simulator)."""
    from tilesplat.bench.launch_cost import device_launches

    if tiny:
        return device_launches("synthetic:8:16x8", n=2, repeats=1, tile_size=8)
    # a small scene for the loop: kernels shorter than a launch, so the loop times the host
    return device_launches("synthetic:5000:128x128", n=1000, repeats=3, parity_scene="garden")


def launch_line(r: dict[str, Any]) -> str:
    """One line: µs per launch of both paths, parity, whether the thin path ran."""
    rows = [f"{k}: {'PASS' if p['passed'] else 'FAIL'} ({p['rule']})"
            for k, p in r["parity"].items()]
    taken = ("thin path taken" if r["thin_taken"] else
             "the simulator: kernel[...] in both arms" if r.get("simulator") else
             f"thin path NOT taken ({r['refused']})")
    return (f"{r['launches']} launches of {r['kernel']} ({r['arguments']} arguments) on "
            f"{r['scene']}: thin {r['thin_host_us']:.1f} µs host / {r['thin_wall_us']:.1f} µs "
            f"wall per launch, kernel[...] {r['numba_host_us']:.1f} / {r['numba_wall_us']:.1f}; "
            f"{taken}; parity on {r['parity_scene']}: {'; '.join(rows)}")


def _f(v: float | None, digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"


def tables(report: dict[str, Any]) -> str:
    """The Markdown summary: versions, preflight, smoke, parity, bench, steps."""
    lines = ["# GPU check", "", report["version_line"], ""]
    pre = report.get("nvvm_preflight")
    if pre:
        lines += [pre["message"], ""]
    smoke = report.get("smoke")
    if smoke:
        lines += [f"## Smoke test: every kernel against the torch reference "
                  f"({smoke['seconds']:.1f} s)", "",
                  "| case | status | first call s | warm call ms |", "| --- | --- | --- | --- |"]
        for r in smoke["cases"]:
            warm = r.get("warm_call_s")
            lines.append(f"| {r['case']} | {r['status'].splitlines()[0][:160]} | "
                         f"{_f(r.get('first_call_s'), 2)} | "
                         f"{'-' if warm is None else f'{warm * 1e3:.2f}'} |")
        lines.append("")
    launch = report.get("launch_cost")
    if launch:
        lines += ["## Launch cost: thin path vs kernel[...]", "", launch_line(launch), ""]
    if report["parity"]:
        lines += [f"## Parity against {report['against']} (atol = rtol = 1e-4, failing "
                  "elements counted per tensor)", "",
                  "| scene | arm | result | failing elements (all tensors) | worst tensor |",
                  "| --- | --- | --- | --- | --- |"]
        for p in report["parity"]:
            rows = p["tensors"]
            total = sum(r.get("n_fail") or 0 for r in rows)
            worst = max(rows, key=lambda r: (r.get("n_fail") or 0, r.get("max_abs") or 0.0))
            lines.append(f"| {p['scene']} | {p['arms'][1]} | {'PASS' if p['passed'] else 'FAIL'}"
                         f" | {total:,} | {worst['name']}: {worst.get('verdict', '-')}, max abs "
                         f"{_g(worst.get('max_abs'))} |")
        lines += ["", "Policy: " + report["parity"][0].get("policy", "-"), ""]
    if report["bench"]:
        lines += ["## Training step (forward + backward + Adam), ms, median over repeats", "",
                  "Launches: numba kernel launches per step (PyTorch's own kernels not "
                  "counted); launcher Python: the cuda launchers' Python outside the kernel "
                  "calls, per step.", "",
                  "| scene | arm | step | GPU-busy | host overhead | launches | launcher "
                  "Python | stages total | parity vs first |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for b in report["bench"]:
            opts = b["cuda_options"]
            for arm in b["arms"]:
                label = arm["spec"]
                if arm["scheme"] == "per_pixel" and not opts.get("warp_skip", True):
                    label += " (no warp skip)"
                if arm["scheme"] == "per_splat":
                    label += f" (batch {opts.get('splat_batch', 32)})"
                step = arm["ms"]["step"]
                gate = arm["parity_gate"]
                n = arm.get("cuda_launches") or {}
                lines.append(
                    f"| {b['scene']['name']} | {label} | {_f(step['median'])} | "
                    f"{_f(step.get('gpu', {}).get('median'))} | "
                    f"{_f(step.get('host_overhead_median'))} | {n.get('launches', '-')} | "
                    f"{_f(n.get('host_ms', {}).get('median'))} | "
                    f"{_f(arm['ms']['staged_total']['median'])} | "
                    f"{'PASS' if gate['passed'] else 'FAIL'} ({gate.get('n_fail', '-')} failing) |")
        lines.append("")
    if report.get("twodgs"):
        from tilesplat.bench.twodgs import format_twodgs_check

        lines += ["## 2DGS against the torch reference", "", format_twodgs_check(
            report["twodgs"]), ""]
    if report.get("ut"):
        from tilesplat.bench.ut import format_ut_check

        lines += ["## 3DGUT against the torch reference", "", format_ut_check(report["ut"]),
                  ""]
    train = report.get("train")
    if train:
        lines += ["## Training the built-in scene (tilesplat train)", "",
                  "Steps/s over the training loop (evaluation and the scene's generation "
                  "excluded); test PSNR and SSIM at the end.", "",
                  "| scene | backend | device | steps | steps/s | train s | test PSNR | "
                  "test SSIM | Gaussians | device peak MiB |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
                  f"| {train['scene']} | {train['backend']} | {train['device']} | "
                  f"{train['steps']} | {_f(train['steps_per_s'], 1)} | "
                  f"{_f(train['train_seconds'], 1)} | {_f(train['test_psnr'], 2)} | "
                  f"{_f(train['test_ssim'], 4)} | {train['n_gaussians']:,} | "
                  f"{_f(train.get('peak_device_mib'), 0)} |", ""]
    lines += ["## Steps", "", "| step | status | started s | seconds |",
              "| --- | --- | --- | --- |"]
    for s in report["steps"]:
        lines.append(f"| {s['step']} | {s['status'].splitlines()[0][:160]} | {s['started_s']} | "
                     f"{s.get('seconds', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scene", nargs="+", default=list(DEFAULT_SCENES),
                        help="scenes; parity runs first on the first, the bench first on the "
                        "last (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny smoke test and one bench iteration (rehearsals)")
    parser.add_argument("--out", default="gpu_check", help="output folder (default: %(default)s)")
    parser.add_argument("--against", default="cpu:per_splat",
                        help="the arm the cuda arms must match (default: %(default)s; "
                        "cpu:per_pixel recovers T from 1 - render_alphas and is the less "
                        "precise of the CPU schemes, see docs/gpu.md)")
    parser.add_argument("--budget-s", type=float, default=360.0,
                        help="skip steps that would start after this many seconds "
                        "(default: %(default)s)")
    parser.add_argument("--train-steps", type=int, default=500,
                        help="steps of the training run on the built-in scene (default: "
                        "%(default)s; 2 with --quick or under the simulator)")
    args = parser.parse_args(argv)

    from tilesplat.backends.numpy_aliases import restore_numpy_aliases

    shims = restore_numpy_aliases()  # before numba-cuda registers its overloads
    v = versions()
    line = version_line(v)
    if shims:
        line += f" (NumPy compatibility shim: {', '.join(shims)})"
    print(line, flush=True)  # the first line, before anything can fail
    report: dict[str, Any] = {"version_line": line, "versions": v, "argv": sys.argv[1:],
                              "against": args.against, "parity": [], "bench": []}
    run = Run(args.out, args.budget_s, report)
    pre = report["nvvm_preflight"] = nvvm_preflight()
    print(pre["message"], flush=True)
    if not pre["ok"]:
        print(pre["traceback"], flush=True)
    no_gpu = None if pre["ok"] else "NVVM preflight failed"
    run.write()

    from tilesplat.bench import format_bench, format_parity
    from tilesplat.bench.smoke import format_smoke, run_smoke

    sim = v["simulator"]
    tiny = {"n": 8, "width": 16, "height": 8, "tile_size": 8, "warm": False}
    smoke = run.step("smoke test of every kernel", lambda: run_smoke(
        **(tiny if sim or args.quick else {})), skip=no_gpu)
    if smoke is not None:
        report["smoke"] = smoke
        print(format_smoke(smoke), flush=True)

    launch = run.step("µs per launch, thin vs kernel[...] (1,000 raster-backward launches) "
                      "and parity of outputs between the two paths",
                      lambda: launch_cost(sim or args.quick), skip=no_gpu)
    if launch is not None:
        report["launch_cost"] = launch
        print(launch_line(launch), flush=True)

    def parity(scene: str) -> None:
        from tilesplat.bench import run_parity

        for scheme in SCHEMES:
            res = run.step(f"parity {args.against} vs cuda:{scheme} on {scene}",
                           lambda s=scheme: run_parity(scene, args.against, f"cuda:{s}"),
                           skip=no_gpu)
            if res is not None:
                report["parity"].append(res)
                print(format_parity(res), flush=True)

    arms = ["cuda:per_pixel", "cuda:per_splat"]

    def bench(scene: str, title: str, options: dict[str, Any], arm_list: list[str]) -> None:
        res = run.step(f"bench {scene}: {title}",
                       lambda: _bench(scene, arm_list, options, args.quick), skip=no_gpu)
        if res is not None:
            report["bench"].append(res)
            print(format_bench(res), flush=True)

    scenes = list(dict.fromkeys(args.scene))
    default = ("warp skip on, batch 32", {"warp_skip": True, "splat_batch": 32}, arms)
    variants = [("warp skip off", {"warp_skip": False, "splat_batch": 32}, arms),
                ("per_splat batch 256", {"warp_skip": True, "splat_batch": 256}, arms[1:]),
                ("deterministic", {"warp_skip": True, "splat_batch": 32,
                                   "deterministic": True}, arms)]
    parity(scenes[0])
    bench(scenes[-1], *default)

    from tilesplat.bench.twodgs import format_twodgs_check, run_twodgs_check

    twodgs = run.step("2DGS parity and speed against the torch reference", lambda: (
        run_twodgs_check(n=30, size=16, repeats=1) if sim or args.quick
        else run_twodgs_check()), skip=no_gpu)
    if twodgs is not None:
        report["twodgs"] = twodgs
        print(format_twodgs_check(twodgs), flush=True)
        if not twodgs["passed"]:  # the run's verdict reads the steps' statuses
            report["steps"][-1]["status"] = "failed: 2DGS parity against the torch reference"

    from tilesplat.bench.ut import format_ut_check, run_ut_check

    ut = run.step("3DGUT parity and speed against the torch reference", lambda: (
        run_ut_check(n=30, size=16, repeats=1) if sim or args.quick else run_ut_check()),
        skip=no_gpu)
    if ut is not None:
        report["ut"] = ut
        print(format_ut_check(ut), flush=True)
        if not ut["passed"]:
            report["steps"][-1]["status"] = "failed: 3DGUT parity against the torch reference"
    for scene in scenes[1:]:
        parity(scene)
    for scene in scenes[:-1]:
        bench(scene, *default)
    for scene in reversed(scenes):
        for variant in variants:
            bench(scene, *variant)

    tiny_train = sim or args.quick
    no_pil = (None if importlib.util.find_spec("PIL") is not None
              else "Pillow is not installed: the built-in scene is PNG files")
    train = run.step("train the built-in scene on the GPU",
                     lambda: train_builtin_scene(2 if tiny_train else args.train_steps,
                                                 tiny_train),
                     skip=no_gpu or no_pil)
    if train is not None:
        report["train"] = train
        print(f"trained {train['scene']} for {train['steps']} steps on {train['device']}: "
              f"{_f(train['steps_per_s'], 1)} steps/s, test PSNR {_f(train['test_psnr'], 2)}, "
              f"{train['n_gaussians']:,} Gaussians", flush=True)

    repro = run.step("two deterministic trainings give the same PLY bytes",
                     lambda: train_reproducibly(2 if tiny_train else 300, tiny_train),
                     skip=no_gpu or no_pil)
    if repro is not None:
        report["reproducible_training"] = repro
        print(f"deterministic training, {repro['steps']} steps twice: same PLY bytes "
              f"{repro['same_ply']} (without the option, the same as with it: "
              f"{repro['plain_same_as_deterministic']}); steps/s "
              f"{[_f(x, 1) for x in repro['steps_per_s']]} against "
              f"{_f(repro['plain_steps_per_s'], 1)} without", flush=True)

    def trainer_step() -> dict[str, Any]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_step

        return gpu_step.run(os.path.join(args.out, "step"), tiny_train,
                            1 if tiny_train else 50, 2 if tiny_train else 200)

    step_modes = run.step("the trainer's step: exact, capacity and CUDA graph",
                          trainer_step, skip=no_gpu or no_pil)
    if step_modes is not None:
        report["trainer_step"] = step_modes
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_step

        print(gpu_step._table(step_modes), flush=True)
    multi = run.step("several ranks: NCCL with one rank, two gloo ranks on the one GPU",
                     lambda: several_ranks(args.out, 2 if tiny_train else 300, tiny_train, sim),
                     skip=no_gpu or no_pil)
    if multi is not None:
        report["several_ranks"] = multi

    report["elapsed_s"] = round(run.elapsed(), 1)
    run.write()
    print(tables(report), flush=True)
    ok = (smoke is not None and smoke["passed"] and report["parity"]
          and (launch is None or launch["passed"])
          and all(p["passed"] for p in report["parity"])
          and all(s["status"] == "ok" for s in report["steps"])
          and (repro is None or repro["same_ply"])
          and (multi is None or multi["passed"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
