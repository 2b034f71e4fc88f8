#!/usr/bin/env python
"""The trainer's own ``cuda`` step in its three modes, side by side (issue 21).

- ``exact``: ``isect_capacity = "exact"``, ``cuda_graph = false`` (each render reads its
  intersection count back: one host sync);
- ``capacity``: intersection lists at a capacity, eager (no host read);
- ``graph``: the same step replayed as one CUDA graph (the default on a GPU).

Installs nothing (torch, numpy, numba, numba-cuda)::

    PYTHONPATH=src python3 scripts/gpu_step.py --out $OUT/step            # ~2 minutes
    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=src python scripts/gpu_step.py --tiny \\
        --out /tmp/step                                                   # rehearsal, no GPU

For each mode, on the built-in scene (steady state: no densification, no log step): wall
ms per step (the mean over ``--steps`` steps between two synchronisations), GPU-busy ms per
step (the kernels' device time in ``torch.profiler``), the sync tax (wall minus busy), host
syncs per step (``torch.cuda.set_sync_debug_mode``), numba launches per step and aten ops per
step (a TorchDispatchMode: what PyTorch launches). Then parity: the capacity and graph modes
train the same seed for ``--parity-steps`` steps with ``deterministic = true``: the largest
parameter difference and both test PSNRs. Writes ``OUT/gpu_step.json`` and ``OUT/gpu_step.md``
after every mode, so a run cut short keeps what it had. Under the simulator the graph mode
is reported as unavailable (with the trainer's reason) and the device times are absent.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from typing import Any

MODES = {"exact": {"isect_capacity": "exact", "cuda_graph": False},
         "capacity": {"isect_capacity": "auto", "cuda_graph": False},
         "graph": {"isect_capacity": "auto", "cuda_graph": True}}


def _trainer(folder: str, run: str, tiny: bool, log: Any, **keys: Any) -> Any:
    from tilesplat.data.dataset import load_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.trainer import Trainer

    sizes = {"init_points": 50} if tiny else {}  # else the defaults (gpu_check's training)
    cfg = TrainConfig(backend="cuda", steps=100_000, progress=False, lpips=False,
                      checkpoint_every=0, eval_every=0, log_every=100_000, seed=3,
                      **sizes, **keys)
    return Trainer(cfg, load_dataset(folder), run, log=log)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measure_mode(folder: str, tmp: str, mode: str, steps: int, warm: int,
                 tiny: bool) -> dict[str, Any]:
    """One mode's numbers (see the module docstring)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from tilesplat.backends.cuda import launch_stats, reset_launch_stats

    lines: list[str] = []
    trainer = _trainer(folder, os.path.join(tmp, mode), tiny, lines.append, **MODES[mode])
    out: dict[str, Any] = {"mode": mode, "graph": trainer.graph is not None,
                           "capacity": trainer.capacity is not None,
                           "log": [s for s in lines if "cuda_graph" in s]}
    if mode == "graph" and trainer.graph is None:
        out["unavailable"] = out["log"][0] if out["log"] else "no graph"
        return out
    step = 0
    for _ in range(warm):  # compile, warm, measure the capacity, capture
        trainer.train_step(step)
        step += 1
    _sync()
    reset_launch_stats()
    t0 = time.perf_counter()
    for _ in range(steps):
        trainer.train_step(step)
        step += 1
    _sync()
    out["wall_ms"] = (time.perf_counter() - t0) / steps * 1e3
    out["steps_per_s"] = 1e3 / out["wall_ms"]
    stats = launch_stats()
    out["numba_launches"] = stats["launches"] / steps

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            trainer.train_step(step)
            step += 1
        _sync()
    if torch.cuda.is_available():
        busy_us = sum(e.self_device_time_total for e in prof.key_averages()
                      if e.self_device_time_total > 0)
        out["gpu_busy_ms"] = busy_us / steps / 1e3
        out["sync_tax_ms"] = out["wall_ms"] - out["gpu_busy_ms"]

    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in range(steps):
                    trainer.train_step(step)
                    step += 1
                _sync()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        sites = Counter(f"{os.path.relpath(w.filename)}:{w.lineno}" for w in caught)
        out["syncs_per_step"] = sum(sites.values()) / steps
        out["sync_sites"] = dict(sites.most_common(10))

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view and "_record_function" not in str(func):
                self.n += 1
            return func(*args, **(kwargs or {}))

    ops = Ops()
    with ops:
        trainer.train_step(step)
    _sync()
    out["aten_ops"] = ops.n
    if trainer.graph is not None:
        out["captures"], out["replays"] = trainer.graph.captures, trainer.graph.replays
    return out


def parity(folder: str, tmp: str, steps: int, tiny: bool) -> dict[str, Any]:
    """Capacity (eager) against graph, ``deterministic = true``, the same seed."""
    import torch

    res: dict[str, Any] = {"steps": steps}
    trainers = {}
    for mode in ("capacity", "graph"):
        t = _trainer(folder, os.path.join(tmp, f"parity-{mode}"), tiny, lambda s: None,
                     deterministic=True, **MODES[mode])
        if mode == "graph" and t.graph is None:
            res["unavailable"] = "no graph on this device"
            return res
        for step in range(steps):
            t.train_step(step)
        t._check_finite_step()
        trainers[mode] = t
        res[f"{mode}_psnr"] = t.test_psnr()
    a, b = trainers["capacity"].params, trainers["graph"].params
    res["same_count"] = len(a["means"]) == len(b["means"])
    if res["same_count"]:
        res["max_abs_diff"] = {k: float((a[k] - b[k]).abs().max()) for k in a}
        res["bitwise_equal"] = all(torch.equal(a[k], b[k]) for k in a)
    return res


def _table(report: dict[str, Any]) -> str:
    def f(v: Any, d: int = 3) -> str:
        return "—" if v is None else (f"{v:.{d}f}" if isinstance(v, float) else str(v))

    rows = ["| mode | wall ms/step | steps/s | GPU-busy ms | sync tax ms | syncs/step | "
            "numba launches/step | aten ops/step |", "| --- | --- | --- | --- | --- | --- | "
            "--- | --- |"]
    for m in report["modes"]:
        if "unavailable" in m:
            rows.append(f"| {m['mode']} | {m['unavailable']} | | | | | | |")
            continue
        rows.append(f"| {m['mode']} | {f(m.get('wall_ms'))} | {f(m.get('steps_per_s'), 1)} | "
                    f"{f(m.get('gpu_busy_ms'))} | {f(m.get('sync_tax_ms'))} | "
                    f"{f(m.get('syncs_per_step'), 1)} | {f(m.get('numba_launches'), 1)} | "
                    f"{f(m.get('aten_ops'))} |")
    p = report.get("parity")
    if p:
        rows += ["", f"Parity, {p['steps']} steps, deterministic: {json.dumps(p)}"]
    return "\n".join(rows)


def _write(out: str, report: dict[str, Any]) -> None:
    os.makedirs(out, exist_ok=True)
    for name, text in (("gpu_step.json", json.dumps(report, indent=1)),
                       ("gpu_step.md", _table(report) + "\n")):
        tmp = os.path.join(out, name + ".tmp")
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, os.path.join(out, name))


def run(out: str, tiny: bool, steps: int, parity_steps: int) -> dict[str, Any]:
    """Every mode, then the parity run; the report (also written to ``out``)."""
    from tilesplat.data.synthetic import write_synthetic_dataset

    report: dict[str, Any] = {"tiny": tiny, "steps": steps, "modes": []}
    with tempfile.TemporaryDirectory(prefix="gpu_step-") as tmp:
        folder = os.path.join(tmp, "scene")
        if tiny:
            write_synthetic_dataset(folder, n_train=2, n_test=1, size=12)
        else:
            write_synthetic_dataset(folder)
        for mode in MODES:
            try:
                report["modes"].append(measure_mode(folder, tmp, mode, steps,
                                                    2 if tiny else 8, tiny))
            except Exception:
                report["modes"].append({"mode": mode, "unavailable": "failed",
                                        "traceback": traceback.format_exc()})
            _write(out, report)
        try:
            report["parity"] = parity(folder, tmp, parity_steps, tiny)
        except Exception:
            report["parity"] = {"steps": parity_steps, "failed": traceback.format_exc()}
        _write(out, report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_step")
    parser.add_argument("--tiny", action="store_true", help="a 12-pixel scene, 1 step each")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per mode")
    parser.add_argument("--parity-steps", type=int, default=None)
    args = parser.parse_args(argv)
    steps = args.steps or (1 if args.tiny else 50)
    parity_steps = args.parity_steps or (2 if args.tiny else 200)
    report = run(args.out, args.tiny, steps, parity_steps)
    print(_table(report), flush=True)
    failed = [m for m in report["modes"] if m.get("unavailable") == "failed"]
    for m in failed:
        print(m["traceback"], flush=True)
    return 1 if failed or "failed" in report.get("parity", {}) else 0


if __name__ == "__main__":
    sys.exit(main())
