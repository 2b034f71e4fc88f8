#!/usr/bin/env python
"""Where a ``cuda`` training step's time goes: host syncs, Python, launches, kernels.

On the H200 every stage of the bench's step cost 1.1-2 ms whatever its size (projection of
136k and of 400k Gaussians alike), so the step is bound by the host, not the kernels. This
script says by what. Installs nothing (torch, numpy, numba, numba-cuda)::

    PYTHONPATH=src python3 scripts/gpu_profile.py --out $OUT/prof        # about a minute
    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=src python scripts/gpu_profile.py \\
        --scene synthetic:20:16x16 --steps 2 --out /tmp/prof             # rehearsal, no GPU

It runs the bench's training step (:class:`tilesplat.bench.stages.TrainStep`: rasterization
forward, backward and Adam) on the scene and writes to ``OUT``:

- ``summary.md``: ms per step with the finite checks on and off, host syncs per step (each
  with the Python line that caused it, from ``torch.cuda.set_sync_debug_mode``), numba
  launches and the launchers' Python per step;
- ``torch_profile.txt``: ``torch.profiler`` tables, by self CPU time and by device time;
- ``python_profile.txt``: ``cProfile`` of the steps, by own time and by cumulative time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import sys
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
from typing import Any


class _NoTimer:
    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_steps(step: Any, device: Any, steps: int) -> float:
    """Median ms of ``steps`` steps, each synchronised."""
    times = []
    for _ in range(steps):
        _sync(device)
        t0 = time.perf_counter()
        step(_NoTimer())
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _sync_sites(step: Any, device: Any, steps: int) -> Counter:
    """Host syncs of ``steps`` steps, counted per (file:line of the caller in tilesplat)."""
    import torch

    sites: Counter = Counter()
    if device.type != "cuda":
        return sites
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                step(_NoTimer())
            _sync(device)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for w in caught:
        sites[f"{os.path.relpath(w.filename)}:{w.lineno}"] += 1
    return sites


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scene", default="garden")
    parser.add_argument("--arm", default="cuda:per_pixel")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", default="gpu_profile")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    import torch

    from tilesplat import set_check_finite
    from tilesplat.backends.cuda import launch_stats, reset_launch_stats
    from tilesplat.bench.arms import parse_arm
    from tilesplat.bench.stages import TrainStep, make_inputs, upstream_gradient
    from tilesplat.data.scenes import load_scene

    arm = parse_arm(args.arm)
    device = arm.torch_device
    scene = load_scene(args.scene)
    inp = make_inputs(scene, arm, 3, 16, upstream_gradient(scene, 0))
    step = TrainStep(inp, arm)
    lines = [f"# Profile of a training step: {args.arm} on {args.scene}", "",
             f"torch {torch.__version__}, device {device}"
             + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
             ""]
    for _ in range(3):  # compile and warm
        step(_NoTimer())
    _sync(device)

    n = args.steps
    on = _time_steps(step, device, n)
    set_check_finite(False)
    off = _time_steps(step, device, n)
    set_check_finite(None)
    reset_launch_stats()
    _time_steps(step, device, n)
    stats = launch_stats()
    lines += [f"| | ms per step (median of {n}) |", "| --- | --- |",
              f"| finite checks on (the default) | {on:.3f} |",
              f"| finite checks off (`set_check_finite(False)`) | {off:.3f} |", "",
              f"Per step: {stats['launches'] / n:.1f} numba launches from "
              f"{stats['launcher_calls'] / n:.1f} launcher calls; the launchers' own Python "
              f"{stats['host_s'] / n * 1e3:.3f} ms, inside the kernel calls (numba's dispatch "
              f"on a GPU) {stats['kernel_s'] / n * 1e3:.3f} ms.", ""]

    sites = _sync_sites(step, device, n)
    lines += [f"## Host syncs: {sum(sites.values()) / max(n, 1):.1f} per step", "",
              "| site | per step |", "| --- | --- |"]
    lines += [f"| {site} | {count / n:.1f} |" for site, count in sites.most_common(30)]
    lines.append("")

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(n):
            step(_NoTimer())
        _sync(device)
    averages = prof.key_averages()
    text = averages.table(sort_by="self_cpu_time_total", row_limit=40)
    if device.type == "cuda":
        text += "\n\n" + averages.table(sort_by="self_device_time_total", row_limit=25)
    with open(os.path.join(args.out, "torch_profile.txt"), "w") as f:
        f.write(f"{n} steps\n{text}\n")

    prof_py = cProfile.Profile()
    prof_py.enable()
    for _ in range(n):
        step(_NoTimer())
    _sync(device)
    prof_py.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof_py, stream=buf)
    buf.write(f"{n} steps, by own time\n")
    st.sort_stats("tottime").print_stats(40)
    buf.write("\nby cumulative time\n")
    st.sort_stats("cumulative").print_stats(50)
    with open(os.path.join(args.out, "python_profile.txt"), "w") as f:
        f.write(buf.getvalue())
    top = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:15]  # type: ignore[attr-defined]
    lines += ["## Python, own time per step (cProfile; it slows what it measures)", "",
              "| function | ms per step | calls per step |", "| --- | --- | --- |"]
    for (file, line, fn), (_, calls, tottime, _, _) in top:
        where = f"{os.path.basename(file)}:{line} {fn}"
        lines.append(f"| {where} | {tottime / n * 1e3:.3f} | {calls / n:.1f} |")
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
