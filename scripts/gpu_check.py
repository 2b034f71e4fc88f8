#!/usr/bin/env python
"""One-shot check of the ``cuda`` backend on a GPU: parity against ``cpu``, then the bench.

Installs nothing; needs ``pip install -e .[cuda]`` done beforehand. Meant to fit one call of
under 8 minutes on a lent GPU (``--budget-s``, default 450: a step that would start after
the budget is skipped and reported as skipped, never silently dropped).

Steps, in order:
1. parity of ``cuda:per_pixel`` and ``cuda:per_splat`` against ``cpu:per_splat`` (``--against``)
   on every scene (``tilesplat.bench.run_parity``: every output and gradient, 1e-4);
2. bench (``tilesplat.bench.run_bench``) of ``cuda:per_pixel`` and ``cuda:per_splat`` with the
   warp skip on, then the same two arms with the warp skip off (``per_pixel`` variant; the
   ``per_splat`` arm does not depend on it and links the two runs), then ``per_splat`` with
   batches of 256 against 32;
3. writes ``OUT/gpu_check.json`` (everything) and ``OUT/gpu_check.md`` (a short table).

Usage::

    python scripts/gpu_check.py --out gpu_check            # garden + synthetic:400000:800x800
    NUMBA_ENABLE_CUDASIM=1 python scripts/gpu_check.py --scene synthetic:50:32x32 --quick

Under the simulator the ``cuda`` arms' tensors are on the CPU (``Arm.torch_device``); it only
exercises this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from typing import Any

DEFAULT_SCENES = ("garden", "synthetic:400000:800x800")
SCHEMES = ("per_pixel", "per_splat")


def _versions() -> dict[str, Any]:
    import numba
    import torch

    out: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "numba": numba.__version__}
    try:
        import numba_cuda

        out["numba_cuda"] = numba_cuda.__version__
    except ImportError as exc:  # reported, and every cuda step below will fail clearly
        out["numba_cuda"] = f"not installed ({exc})"
    out["simulator"] = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(0)
        out["cuda_runtime"] = torch.version.cuda
        cap = torch.cuda.get_device_capability(0)
        out["compute_capability"] = f"{cap[0]}.{cap[1]}"
    else:
        out["gpu"] = None
    return out


class Budget:
    """Wall-clock budget: ``run`` skips a step once the budget is spent."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds
        self.log: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def run(self, name: str, fn, *args, **kwargs) -> Any:
        entry: dict[str, Any] = {"step": name, "started_s": round(self.elapsed(), 1)}
        self.log.append(entry)
        if self.elapsed() > self.seconds:
            entry["status"] = "skipped (budget spent)"
            print(f"[{self.elapsed():6.1f}s] SKIP {name}: budget of {self.seconds:.0f}s spent")
            return None
        print(f"[{self.elapsed():6.1f}s] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
            entry["status"] = "ok"
            return result
        except Exception as exc:  # one failing step must not hide the others' numbers
            entry["status"] = f"error: {type(exc).__name__}: {exc}"
            entry["traceback"] = traceback.format_exc()
            print(f"    ERROR {type(exc).__name__}: {exc}")
            return None
        finally:
            entry["seconds"] = round(time.perf_counter() - t0, 1)


def _bench(scene: str, arms: list, options: dict[str, Any], quick: bool) -> dict[str, Any]:
    from tilesplat.backends.cuda import reset_options, set_options
    from tilesplat.bench import run_bench

    reset_options()
    set_options(**options)
    try:
        iters, repeats = (1, 1) if quick else (10, 5)
        res = run_bench(scene, arms, iters=iters, repeats=repeats, warmup=1 if quick else 3,
                        calibrate=False)
    finally:
        reset_options()
    res["cuda_options"] = options
    return res


def _step_row(res: dict[str, Any], arm: dict[str, Any], label: str) -> list[str]:
    step = arm["ms"]["step"]
    gpu = step.get("gpu", {}).get("median")
    host = step.get("host_overhead_median")
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    return [res["scene"]["name"], label, fmt(step["median"]), fmt(gpu), fmt(host),
            fmt(arm["ms"]["staged_total"]["median"]),
            "PASS" if arm["parity_gate"]["passed"] else "FAIL"]


def _table(report: dict[str, Any]) -> str:
    lines = ["# GPU check", "", "```", json.dumps(report["versions"], indent=1), "```", "",
             f"## Parity against {report['against']} (every output and gradient, 1e-4)", "",
             "| scene | arm | result | worst tensor |", "| --- | --- | --- | --- |"]
    for p in report["parity"]:
        worst = "-"
        if p.get("tensors"):
            w = max(p["tensors"], key=lambda r: r.get("max_abs", 0.0) or 0.0)
            worst = f"{w['name']} max abs {(w.get('max_abs') or 0.0):.2e}"
        lines.append(f"| {p['scene']} | {p['arms'][1]} | "
                     f"{'PASS' if p['passed'] else 'FAIL'} | {worst} |")
    lines += ["", "## Training step (forward + backward + Adam), ms, median over repeats", "",
              "| scene | arm | step | GPU-busy | host overhead | stages total | parity |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for b in report["bench"]:
        opts = b["cuda_options"]
        for arm in b["arms"]:
            label = arm["spec"]
            if arm["scheme"] == "per_pixel" and not opts.get("warp_skip", True):
                label += " (no warp skip)"
            if arm["scheme"] == "per_splat":
                label += f" (batch {opts.get('splat_batch', 32)})"
            lines.append("| " + " | ".join(_step_row(b, arm, label)) + " |")
    lines += ["", "## Steps", "", "| step | status | seconds |", "| --- | --- | --- |"]
    for s in report["steps"]:
        lines.append(f"| {s['step']} | {s['status'].splitlines()[0][:120]} | "
                     f"{s.get('seconds', '-')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scene", nargs="+", default=list(DEFAULT_SCENES),
                        help="scenes (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="one iteration per arm (a smoke test of this script)")
    parser.add_argument("--out", default="gpu_check", help="output folder (default: %(default)s)")
    parser.add_argument("--against", default="cpu:per_splat",
                        help="the arm the cuda arms must match (default: %(default)s; "
                        "cpu:per_pixel recovers T from 1 - render_alphas and is the less "
                        "precise of the CPU schemes, see docs/gpu.md)")
    parser.add_argument("--budget-s", type=float, default=450.0,
                        help="skip steps that would start after this many seconds")
    args = parser.parse_args(argv)

    from tilesplat.bench import format_bench, format_parity, run_parity

    os.makedirs(args.out, exist_ok=True)
    budget = Budget(args.budget_s)
    report: dict[str, Any] = {"versions": _versions(), "argv": sys.argv[1:],
                              "against": args.against, "parity": [], "bench": [],
                              "steps": budget.log}
    print(json.dumps(report["versions"]))

    for scene in args.scene:
        for scheme in SCHEMES:
            res = budget.run(f"parity {args.against} vs cuda:{scheme} on {scene}", run_parity,
                             scene, args.against, f"cuda:{scheme}")
            if res is not None:
                report["parity"].append(res)
                print(format_parity(res))

    arms = ["cuda:per_pixel", "cuda:per_splat"]
    variants = [("warp skip on, batch 32", {"warp_skip": True, "splat_batch": 32}, arms),
                ("warp skip off", {"warp_skip": False, "splat_batch": 32}, arms),
                ("per_splat batch 256", {"warp_skip": True, "splat_batch": 256}, arms[1:])]
    for scene in reversed(args.scene):  # the large synthetic scene first: the target's
        for title, options, arm_list in variants:
            res = budget.run(f"bench {scene}: {title}", _bench, scene, arm_list, options,
                             args.quick)
            if res is not None:
                report["bench"].append(res)
                print(format_bench(res))

    from tilesplat.bench import write_json

    report["elapsed_s"] = round(budget.elapsed(), 1)
    write_json(report, os.path.join(args.out, "gpu_check.json"))
    table = _table(report)
    with open(os.path.join(args.out, "gpu_check.md"), "w") as f:
        f.write(table)
    print(table)
    ok = (all(p["passed"] for p in report["parity"]) and report["parity"]
          and all(s["status"] == "ok" for s in budget.log))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
