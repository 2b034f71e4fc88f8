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
parameter difference and both test PSNRs. Last, the bench's step (``bench.stages.TrainStep``)
on ``garden`` and ``synthetic:400000:800x800`` (the 4 ms target's scenes), eager exact, eager
at a capacity and replayed as a graph: wall and GPU-busy ms and the graph's parity
(:func:`bench_step`). Writes ``OUT/gpu_step.json`` and ``OUT/gpu_step.md``
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

BENCH_SCENES = ("garden", "synthetic:400000:800x800")  # the 4 ms target's scenes
MODES = {"exact": {"isect_capacity": "exact", "cuda_graph": False},
         "capacity": {"isect_capacity": "auto", "cuda_graph": False},
         "graph": {"isect_capacity": "auto", "cuda_graph": True}}


def _trainer(folder: str, run: str, tiny: bool, log: Any, **keys: Any) -> Any:
    from tilesplat.data.dataset import load_dataset
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.trainer import Trainer

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
    out: dict[str, Any] = {"mode": mode, "graph": trainer.steps.graph is not None,
                           "capacity": trainer.steps.capacity is not None,
                           "log": [s for s in lines if "cuda_graph" in s]}
    if mode == "graph" and trainer.steps.graph is None:
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
    if trainer.steps.graph is not None:
        out["captures"], out["replays"] = trainer.steps.graph.captures, trainer.steps.graph.replays
    return out


def parity(folder: str, tmp: str, steps: int, tiny: bool) -> dict[str, Any]:
    """Capacity (eager) against graph, ``deterministic = true``, the same seed."""
    import torch

    res: dict[str, Any] = {"steps": steps}
    trainers = {}
    for mode in ("capacity", "graph"):
        t = _trainer(folder, os.path.join(tmp, f"parity-{mode}"), tiny, lambda s: None,
                     deterministic=True, **MODES[mode])
        if mode == "graph" and t.steps.graph is None:
            res["unavailable"] = "no graph on this device"
            return res
        for step in range(steps):
            t.train_step(step)
        t.steps.settle()
        trainers[mode] = t
        res[f"{mode}_psnr"] = t.test_psnr()
    a, b = trainers["capacity"].params, trainers["graph"].params
    res["same_count"] = len(a["means"]) == len(b["means"])
    if res["same_count"]:
        res["max_abs_diff"] = {k: float((a[k] - b[k]).abs().max()) for k in a}
        res["bitwise_equal"] = all(torch.equal(a[k], b[k]) for k in a)
    return res


class _NoTimer:
    def stage(self, name: str) -> Any:
        import contextlib

        return contextlib.nullcontext()


def bench_step(scene_name: str, steps: int, tiny: bool) -> dict[str, Any]:
    """The bench's training step (``bench.stages.TrainStep``: rasterization forward, backward
    and Adam, the 4 ms target's step) on a bench scene (``garden``,
    ``synthetic:400000:800x800``) in the three modes: eager with exact lists, eager at a
    capacity (1.15 x the exact count), and the capacity step replayed as a CUDA graph; wall
    and GPU-busy ms per step, and the parity of one graphed step against one eager step from
    the same state (the largest relative parameter difference)."""
    import torch

    from tilesplat.bench.arms import parse_arm
    from tilesplat.bench.stages import TrainStep, make_inputs, upstream_gradient
    from tilesplat.data.scenes import load_scene
    from tilesplat.ops.deferred_checks import FiniteFlag, deferred_finite_checks
    from tilesplat.ops.intersect_capacity import IsectCapacity, intersection_capacity
    from tilesplat.train.step.cuda_graph import CudaGraphMaker, graph_unavailable, use_rate_tensors

    arm = parse_arm("cuda:per_pixel")
    scene = load_scene(scene_name)
    inp = make_inputs(scene, arm, 3, 16, upstream_gradient(scene, 0))
    step = TrainStep(inp, arm)
    out: dict[str, Any] = {"scene": scene_name, "steps": steps}
    cuda = torch.cuda.is_available()

    def timed(fn: Any) -> dict[str, Any]:
        for _ in range(1 if tiny else 3):
            fn()
        _sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        _sync()
        res: dict[str, Any] = {"wall_ms": (time.perf_counter() - t0) / steps * 1e3}
        if cuda:
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts) as prof:
                for _ in range(steps):
                    fn()
                _sync()
            busy = sum(e.self_device_time_total for e in prof.key_averages()
                       if e.self_device_time_total > 0)
            res["gpu_busy_ms"] = busy / steps / 1e3
            res["wall_over_busy"] = res["wall_ms"] / max(res["gpu_busy_ms"], 1e-9)
        return res

    out["exact"] = timed(lambda: step(_NoTimer()))
    from tilesplat import rasterization

    with torch.no_grad():
        p = step.params
        _, _, meta = rasterization(
            p["means"], p["quats"], torch.exp(p["scales"]),
            torch.sigmoid(p["opacities"]), torch.cat([p["sh0"], p["shN"]], dim=1),
            inp.viewmats, inp.Ks, inp.width, inp.height, sh_degree=inp.sh_degree,
            tile_size=inp.tile_size, backend="cuda")
    capacity = IsectCapacity(max(1, int(1.15 * int(meta["tiles_per_gauss"].sum()))))
    out["capacity_size"] = capacity.size

    def at_capacity() -> FiniteFlag:
        flag = FiniteFlag()
        with deferred_finite_checks(flag), intersection_capacity(capacity):
            step(_NoTimer())
        return flag

    out["capacity"] = timed(at_capacity)
    why_not = graph_unavailable(arm.torch_device, True)
    if why_not is not None:
        out["graph"] = {"unavailable": why_not}
        return out
    use_rate_tensors({"all": step.optimizer}, arm.torch_device)
    for _ in range(3):  # warm: every kernel compiled, the allocator warm
        at_capacity()
    replay = CudaGraphMaker().capture(at_capacity)
    out["graph"] = timed(replay)
    # parity: one eager step and one replay from the same state
    state = [t for t in step.params.values()]
    state += [v for st in step.optimizer.state.values() for v in st.values()
              if isinstance(v, torch.Tensor)]
    saved = [t.detach().clone() for t in state]
    at_capacity()
    eager = {k: t.detach().clone() for k, t in step.params.items()}
    with torch.no_grad():
        for t, s0 in zip(state, saved, strict=True):
            t.copy_(s0)
    replay()
    _sync()
    out["parity_max_rel"] = max(
        float((step.params[k] - eager[k]).abs().max()
               / eager[k].abs().max().clamp_min(1e-12)) for k in eager)
    return out


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
    for b in report.get("bench_steps", []):
        rows += ["", f"Bench step on {b.get('scene')}: " + json.dumps(
            {k: v for k, v in b.items() if k != "traceback"}, default=str)]
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
    report["bench_steps"] = []
    for scene in (("synthetic:20:16x16",) if tiny else BENCH_SCENES):
        try:
            report["bench_steps"].append(bench_step(scene, 2 if tiny else 20, tiny))
        except Exception:
            report["bench_steps"].append({"scene": scene, "failed": True,
                                          "traceback": traceback.format_exc()})
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
    failed += [b for b in report["bench_steps"] if b.get("failed")]
    for m in failed:
        print(m["traceback"], flush=True)
    return 1 if failed or "failed" in report.get("parity", {}) else 0


if __name__ == "__main__":
    sys.exit(main())
