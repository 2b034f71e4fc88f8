#!/usr/bin/env python
"""Device check of training on several ranks (docs/distributed.md), for a machine with one
GPU; also a step of ``scripts/gpu_check.py``.

1. **NCCL with one rank trains the built-in scene** (:func:`nccl_one_rank`, in this process):
   a NCCL process group of one rank on ``cuda:0``. First the collectives on CUDA tensors
   (``all_reduce``, ``all_gather_equal``, the row all-to-all with its backward), checked
   against the values they must give and for the device of their results; then the built-in
   scene trained as the data-parallel rank of that group (its gradient all-reduce, the sync
   check and the stop agreement run over NCCL; a group of one rank is otherwise trained as a
   single process), against one process (``parallel = "none"``) on the same config.
2. **Two ranks on the one GPU over gloo with CUDA tensors** (:func:`gloo_two_ranks`):
   ``tilesplat train --nproc 2 --set dist_backend=gloo`` with ``backend = "cuda"`` (both
   ranks on ``cuda:0``; NCCL refuses two ranks on one GPU), data and model mode, each
   against one process: the test PSNR within ``PSNR_TOLERANCE_DB``.

Every result goes to ``OUT/gpu_multi.json`` (rewritten after each item). Rehearsal without
a GPU (``--rehearse``): gloo instead of NCCL on the CPU, with ``--backend cpu`` (seconds) or,
under ``NUMBA_ENABLE_CUDASIM=1``, ``--backend cuda`` (minutes: the simulator runs every GPU
thread as a Python thread)::

    PYTHONPATH=src python3 scripts/gpu_multi.py --out $OUT/multi           # on the GPU
    PYTHONPATH=src python scripts/gpu_multi.py --rehearse --tiny --backend cpu --out /tmp/m
    NUMBA_ENABLE_CUDASIM=1 PYTHONPATH=src python scripts/gpu_multi.py --rehearse --tiny \
        --steps 3 --set synthetic_size=12 --set synthetic_train=2 --set init_points=30 \
        --set ssim_lambda=0 --out /tmp/m                       # SIM_KEYS; ~15 minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

# two ranks train as one process does up to float rounding and densification decisions
PSNR_TOLERANCE_DB = 0.5
TINY = {"synthetic_size": 32, "synthetic_train": 4, "synthetic_test": 1, "init_points": 200}
# config keys given with --set (key=value strings, as tilesplat train takes them)
EXTRA: list[str] = []
# a rehearsal under numba's CUDA simulator (a step of a 12-pixel view takes ~30 s there)
SIM_KEYS = ("synthetic_size=12", "synthetic_train=2", "init_points=30", "ssim_lambda=0")


def _keys(steps: int, backend: str, tiny: bool) -> dict[str, Any]:
    """The config of every run: batch 2 (a camera per rank), densification from step
    ``steps // 3`` every ``steps // 6`` steps (the exchange, and model mode's rebalancing,
    take part), then ``--set``'s keys."""
    from tilesplat.train.config import TrainConfig, apply_overrides

    keys: dict[str, Any] = {"backend": backend, "steps": steps, "batch_size": 2,
                            "refine_start": max(1, steps // 3),
                            "refine_every": max(1, steps // 6), "progress": False,
                            "lpips": False, "save_renders": False, "save_ply": False,
                            "checkpoint_every": 0}
    if tiny:
        keys.update(TINY)
    given = apply_overrides(TrainConfig(), EXTRA)
    keys.update({k.split("=", 1)[0]: getattr(given, k.split("=", 1)[0]) for k in EXTRA})
    return keys


def _run_in_process(keys: dict[str, Any], tmp: str, name: str) -> dict[str, Any]:
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.run import train_run

    cfg = TrainConfig(run_dir=os.path.join(tmp, name), cache_dir=os.path.join(tmp, "cache"),
                      **keys).validate()
    t0 = time.perf_counter()
    _, metrics = train_run(cfg, log=lambda line: None)
    return _summary(metrics, time.perf_counter() - t0)


def _summary(metrics: dict[str, Any], wall: float) -> dict[str, Any]:
    seconds = metrics["train_seconds"]
    return {"test_psnr": metrics["psnr"], "n_gaussians": metrics["n_gaussians"],
            "train_seconds": seconds, "steps_per_s": metrics["step"] / seconds if seconds else None,
            "wall_seconds": round(wall, 1)}


def _check_collectives(device: Any) -> dict[str, Any]:
    """The collectives of ``tilesplat.distributed`` in the current group (one rank) on
    ``device``: values and devices. Their world-size shortcut is bypassed (a group of one
    would otherwise move nothing)."""
    import torch

    import tilesplat.distributed as tdist

    x = torch.arange(6.0, device=device).reshape(2, 3)
    summed = tdist.all_reduce(x.clone())
    gathered = tdist.all_gather_equal(x)
    rows = x.clone().requires_grad_(True)
    moved = tdist._exchange(rows, [2], [2])
    (moved * 3.0).sum().backward()
    checks = {
        "all_reduce": bool(torch.equal(summed, x)) and summed.device == x.device,
        "all_gather_equal": len(gathered) == 1 and bool(torch.equal(gathered[0], x))
        and gathered[0].device == x.device,
        "all_to_all_rows": bool(torch.equal(moved, x)) and moved.device == x.device,
        "all_to_all_backward": rows.grad is not None and rows.grad.device == x.device
        and bool(torch.equal(rows.grad, torch.full_like(x, 3.0))),
    }
    if not all(checks.values()):
        raise RuntimeError(f"collectives gave wrong values or devices: {checks}")
    return checks


def nccl_one_rank(steps: int, backend: str = "cuda", tiny: bool = False,
                  group: str = "nccl") -> dict[str, Any]:
    """Item 1: see the module docstring. ``group``: ``nccl`` (the check) or ``gloo`` (its
    rehearsal on the CPU)."""
    import torch
    import torch.distributed as dist

    from tilesplat.ranks import _free_port
    from tilesplat.train.loop.trainer import Trainer
    from tilesplat.train.parallel.data import DataParallel

    keys = _keys(steps, backend, tiny)
    out: dict[str, Any] = {"group": group, "backend": backend, "steps": steps}
    with tempfile.TemporaryDirectory(prefix="gpu_multi-") as tmp:
        out["one_process"] = _run_in_process(keys, tmp, "one")
        gpu = torch.device("cuda", 0) if group == "nccl" else None
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
        if gpu is not None:
            torch.cuda.set_device(gpu)
        extra = {"device_id": gpu} if gpu is not None else {}
        dist.init_process_group(group, rank=0, world_size=1, **extra)
        original = DataParallel.__dict__["current"]
        ranks_seen: list[Any] = []

        def one_rank(cls):  # the data-parallel rank of a group of one
            rank = cls(0, 1)
            ranks_seen.append(rank)
            return rank

        DataParallel.current = classmethod(one_rank)  # type: ignore[method-assign]
        try:
            device = gpu if gpu is not None else torch.device("cpu")
            out["collectives"] = _check_collectives(device)
            built = []
            original_init = Trainer.__init__

            def init(self, *args, **kwargs):
                original_init(self, *args, **kwargs)
                built.append(self)

            Trainer.__init__ = init  # type: ignore[method-assign]
            try:
                out["nccl_rank"] = _run_in_process({**keys, "parallel": "data"}, tmp, "rank")
            finally:
                Trainer.__init__ = original_init  # type: ignore[method-assign]
            trainer = built[-1]
            out["rank_device"] = str(trainer.device)
            out["rank_mode"] = type(trainer.parallel).__name__
            if not isinstance(trainer.parallel, DataParallel) or not ranks_seen:
                raise RuntimeError("the run did not train as a data-parallel rank")
        finally:
            DataParallel.current = original  # type: ignore[method-assign]
            dist.destroy_process_group()
    out["psnr_gap_db"] = out["nccl_rank"]["test_psnr"] - out["one_process"]["test_psnr"]
    out["passed"] = abs(out["psnr_gap_db"]) < PSNR_TOLERANCE_DB
    return out


def _cli_train(args: list[str], timeout: float) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "tilesplat.cli", "train", *args]
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return run.returncode, run.stdout + run.stderr


def gloo_two_ranks(steps: int, backend: str = "cuda", tiny: bool = False,
                   modes: tuple[str, ...] = ("data", "model"),
                   timeout: float = 300) -> dict[str, Any]:
    """Item 2: see the module docstring (each mode against one process, all by the CLI)."""
    keys = _keys(steps, backend, tiny)
    sets = [a for k, v in keys.items() for a in ("--set", f"{k}={str(v).lower()}"
                                                  if isinstance(v, bool) else f"{k}={v}")]
    out: dict[str, Any] = {"group": "gloo", "backend": backend, "steps": steps, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="gpu_multi-") as tmp:
        cache = ["--set", f"cache_dir={os.path.join(tmp, 'cache')}"]
        for name, extra in (("one_process", []),
                            *((m, ["--nproc", "2", "--set", "dist_backend=gloo", "--set",
                                   f"parallel={m}"]) for m in modes)):
            run_dir = os.path.join(tmp, name)
            t0 = time.perf_counter()
            code, text = _cli_train([*sets, *cache, "--set", f"run_dir={run_dir}", *extra],
                                    timeout)
            if code != 0:
                raise RuntimeError(f"{name}: tilesplat train exited {code}:\n{text[-3000:]}")
            with open(os.path.join(run_dir, "metrics.json")) as f:
                metrics = json.load(f)
            out["runs"][name] = _summary(metrics, time.perf_counter() - t0)
            out["runs"][name]["summary_lines"] = text.count("PSNR")  # rank 0 alone reports
    one = out["runs"]["one_process"]["test_psnr"]
    out["psnr_gap_db"] = {m: out["runs"][m]["test_psnr"] - one for m in modes}
    out["passed"] = all(abs(g) < PSNR_TOLERANCE_DB for g in out["psnr_gap_db"].values())
    return out


def run_checks(out_dir: str, steps: int, backend: str = "cuda", tiny: bool = False,
               rehearse: bool = False) -> dict[str, Any]:
    """Both items; ``OUT/gpu_multi.json`` rewritten after each (a killed run keeps what it
    had). An item that fails is recorded with its error and does not hide the other."""
    from tilesplat.bench import write_json

    os.makedirs(out_dir, exist_ok=True)
    report: dict[str, Any] = {"psnr_tolerance_db": PSNR_TOLERANCE_DB, "rehearsal": rehearse}
    path = os.path.join(out_dir, "gpu_multi.json")
    items = (("nccl_one_rank", lambda: nccl_one_rank(steps, backend, tiny,
                                                     "gloo" if rehearse else "nccl")),
             ("gloo_two_ranks_one_gpu", lambda: gloo_two_ranks(steps, backend, tiny)))
    import importlib.util

    if importlib.util.find_spec("PIL") is None:  # the built-in scene is PNG files
        for name, _ in items:
            report[name] = {"passed": False, "error": "Pillow is not installed (pip install "
                            "pillow): the built-in scene is PNG files", "seconds": 0.0}
        report["passed"] = False
        write_json(report, path)
        return report
    for name, fn in items:
        t0 = time.perf_counter()
        print(f"gpu_multi: {name} ...", flush=True)
        try:
            report[name] = fn()
        except Exception as exc:  # one failing item must not hide the other's numbers
            report[name] = {"passed": False, "error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()}
        report[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"gpu_multi: {name}: {_line(report[name])}", flush=True)
        write_json(report, path)
    report["passed"] = all(report[n]["passed"] for n, _ in items)
    write_json(report, path)
    return report


def _line(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"ERROR {result['error']}"
    gap = result["psnr_gap_db"]
    gaps = gap if isinstance(gap, dict) else {"rank": gap}
    return ("passed" if result["passed"] else "FAILED") + ", PSNR gap " + ", ".join(
        f"{k} {v:+.3f} dB" for k, v in gaps.items()) + f" ({result['seconds']} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for gpu_multi.json")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--backend", default="cuda", help="rasterization backend (cuda)")
    parser.add_argument("--tiny", action="store_true", help=f"a small scene: {TINY}")
    parser.add_argument("--rehearse", action="store_true",
                        help="no GPU: gloo instead of NCCL in item 1")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="another config key of every run")
    args = parser.parse_args(argv)
    EXTRA[:] = args.overrides
    report = run_checks(args.out, args.steps, args.backend, args.tiny, args.rehearse)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
