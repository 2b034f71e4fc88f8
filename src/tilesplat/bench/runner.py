"""``run_bench``: every arm measured in one run, interleaved, after warm-up, with a parity gate.

Order of a run: calibration (the machine's per-pair ceiling); warm-up passes of every arm
(compiling kernels; the first one also gives the parity gate against the first arm and the
pair counts); then ``repeats`` × ``iters`` rounds in which every arm in turn runs one staged
pass and one training step (arm A, arm B, ..., arm A, ...), each arm preceded by 0.1 s of the
calibration micro-kernel, so that a slow phase of a shared machine hits all arms and the
ceiling alike; finally one training step per arm under a peak-memory probe.

The percentages of the ceiling use the micro-kernel's median over the same rounds; the best
rate of the standalone calibration is reported too.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..backends.cpu.heap import keep_freed_heap
from ..constants import TILE_SIZE
from ..data.scenes import Scene
from .arms import Arm, parse_arms
from .counts import count_pairs
from .dispatch import open_workload
from .parity import Hook, check_sh_degree, compare_results
from .report import machine_info
from .stages import STAGES, make_inputs, staged_pass, upstream_gradient
from .timing import LaunchCounter, NullTimer, PeakMemory, StageTimer, summarize
from .tolerance import ATOL, RTOL, across_devices, policy, summary

SCHEMA = "tilesplat.bench/1"


@contextlib.contextmanager
def thread_count(threads: int | None) -> Iterator[None]:
    """Runs the block with ``threads`` Numba and torch threads (None: leave them)."""
    if threads is None:
        yield
        return
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    import numba

    if threads > numba.config.NUMBA_NUM_THREADS:
        raise ValueError(
            f"threads must be <= {numba.config.NUMBA_NUM_THREADS} (NUMBA_NUM_THREADS), "
            f"got {threads}"
        )
    old = (numba.get_num_threads(), torch.get_num_threads())
    numba.set_num_threads(threads)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        numba.set_num_threads(old[0])
        torch.set_num_threads(old[1])


def _check_counts(**kw: int) -> None:
    for name, (value, low) in kw.items():
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def scene_info(scene: Scene, sh_degree: int, tile_size: int) -> dict[str, Any]:
    return {
        "name": scene.name,
        "gaussians": scene.num_gaussians,
        "cameras": int(scene.viewmats.shape[0]),
        "width": scene.width,
        "height": scene.height,
        "sh_degree": sh_degree,
        "tile_size": tile_size,
        "dtype": str(scene.means.dtype).replace("torch.", ""),
    }


def run_bench(
    scene: Scene | str,
    arms: list[str | Arm] | str,
    iters: int | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    sh_degree: int = 3,
    tile_size: int = TILE_SIZE,
    seed: int = 0,
    calibrate: bool = True,
    calibration_seconds: float = 0.5,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    hook: Hook | None = None,
) -> dict[str, Any]:
    """Measures every arm on one scene; returns a JSON-ready dict (schema ``SCHEMA``).

    Args:
        scene: a Scene, a name for ``load_scene`` (``garden``, ``synthetic:N:WxH``), or
            ``run:RUN_DIR``: a training run's checkpoint, whose training step is the trainer's
            own (:mod:`.replay`; ``sh_degree`` and ``tile_size`` are then the run's).
        arms: specs ``backend[:scheme][@device]``; the first is the baseline of the ratios
            and of the parity gate.
        iters: timed iterations per repeat; repeats: repeats (the statistics are over the
            repeats, each one the mean of its iterations); warmup: untimed passes first (>= 1).
            None: 3, 3, 1 (run scenes: 50, 3, 10).
        calibrate: measure the per-pair ceiling (:func:`.ceiling.calibrate`).
        threads: Numba and torch threads for the run (None: as configured).
        hook: test hook called with each arm's first warm-up pass (see :mod:`.parity`).
    """
    keep_freed_heap()  # as the trainer does (its steps' freed tensors stay mapped)
    workload = open_workload(scene)  # a bench scene, or a run replayed by the trainer's step
    sh_degree, tile_size = workload.settings(sh_degree, tile_size)
    counts = workload.counts
    iters = counts["iters"] if iters is None else iters
    repeats = counts["repeats"] if repeats is None else repeats
    warmup = counts["warmup"] if warmup is None else warmup
    _check_counts(iters=(iters, 1), repeats=(repeats, 1), warmup=(warmup, 1),
                  tile_size=(tile_size, 1))
    check_sh_degree(sh_degree)
    if not isinstance(arms, str):
        arms = [a.spec if isinstance(a, Arm) else a for a in arms]
    arm_list = parse_arms(arms)
    sc = workload.load(dtype)
    parts = workload.step_parts(arm_list)
    with thread_count(threads):
        res = _run(sc, arm_list, iters, repeats, warmup, sh_degree, tile_size, seed,
                   calibrate, calibration_seconds, hook, workload.make_step, parts)
    res["scene"].update(workload.scene_info())
    res["config"].update(threads=threads, calibrate=calibrate,
                         calibration_seconds=calibration_seconds)
    return res


def _run(sc: Scene, arms: list[Arm], iters: int, repeats: int, warmup: int, sh_degree: int,
         tile_size: int, seed: int, calibrate: bool, calibration_seconds: float,
         hook: Hook | None, make_step: Callable[[Any, Arm], Callable[[StageTimer], None]],
         step_parts: tuple[str, ...] = ()) -> dict[str, Any]:
    from .ceiling import MicroKernel
    from .ceiling import calibrate as run_calibration

    calibration = run_calibration(calibration_seconds) if calibrate else None
    kernel = MicroKernel() if calibrate else None
    upstream = upstream_gradient(sc, seed)
    inputs = [make_inputs(sc, arm, sh_degree, tile_size, upstream) for arm in arms]
    steps = [make_step(inp, arm) for inp, arm in zip(inputs, arms, strict=True)]

    first: list[dict[str, Any]] = []
    for w in range(warmup):
        for i, arm in enumerate(arms):
            # The first round is also the parity gate: later arms get the first arm's stage
            # inputs, so each op is compared on identical inputs (see run_parity).
            feed = first[0] if (w == 0 and first) else None
            res = staged_pass(inputs[i], arm, NullTimer(), feed=feed)
            if w == 0:
                if hook is not None:
                    hook(arm.spec, res)
                first.append(res)
            steps[i](NullTimer())
    gate = [parity_gate(arms[0], first[0], arm, res) for arm, res in zip(arms, first,
                                                                       strict=True)]
    out0 = first[0]["outputs"]
    pairs = count_pairs(out0["means2d"], out0["conics"], _raster_opacities(inputs[0]),
                        out0["isect_offsets"], out0["flatten_ids"], sc.width, sc.height,
                        tile_size)
    del first, out0

    # samples[arm][name] = [[ms of each iteration] of each repeat]; "ceiling" in pairs/s
    names = (*STAGES, "staged_total", "step", *step_parts)
    samples = [{n: [[] for _ in range(repeats)] for n in names} for _ in arms]
    gpu = [{n: [[] for _ in range(repeats)] for n in names} for _ in arms]
    ceiling_rates: list[list[float]] = [[] for _ in range(repeats)]
    launches = [LaunchCounter(arm.backend) for arm in arms]
    for r in range(repeats):
        for _ in range(iters):
            for i, arm in enumerate(arms):
                if kernel is not None:  # the ceiling under the same load as the arms
                    ceiling_rates[r].append(kernel.sustained_rate())
                timer = StageTimer(arm.torch_device)
                staged_pass(inputs[i], arm, timer)
                with launches[i].count():
                    steps[i](timer)
                times = dict(timer.times)
                times["staged_total"] = (
                    sum(times[s][0] for s in STAGES),
                    None if times[STAGES[0]][1] is None else sum(times[s][1] for s in STAGES),
                )
                for n in names:
                    samples[i][n][r].append(times[n][0])
                    if times[n][1] is not None:
                        gpu[i][n][r].append(times[n][1])

    memory = []
    for i, arm in enumerate(arms):
        with PeakMemory(arm.torch_device) as probe:
            steps[i](NullTimer())
        memory.append(probe.result)

    if calibration is not None:
        kernel.check()
        calibration["interleaved"] = _stats(ceiling_rates)
        calibration["interleaved"]["unit"] = "pairs/s"
    arm_rows = []
    for i, arm in enumerate(arms):
        timings = {}
        for n in names:
            t = _stats(samples[i][n])
            if gpu[i][n][0]:
                t["gpu"] = _stats(gpu[i][n])
                t["host_overhead_median"] = t["median"] - t["gpu"]["median"]
            timings[n] = t
        arm_rows.append({"spec": arm.spec, "backend": arm.backend, "scheme": arm.scheme,
                         "device": arm.device, "ms": timings, "peak_memory": memory[i],
                         "cuda_launches": launches[i].result(), "parity_gate": gate[i]})
    _derive(arm_rows, pairs, calibration)
    return {
        "schema": SCHEMA,
        "kind": "bench",
        "machine": machine_info(),
        "config": {"iters": iters, "repeats": repeats, "warmup": warmup, "seed": seed,
                   "statistics": "over repeats; each repeat is the mean of its iterations",
                   "parity_atol": ATOL, "parity_rtol": RTOL},
        "scene": {**scene_info(sc, sh_degree, tile_size),
                  "intersections": pairs["intersections"]},
        "pairs": {**pairs, "evals_per_s_uses": "forward/backward (exact per the contract)"},
        "calibration": calibration,
        "arms": arm_rows,
        "parity_gate_passed": all(g["passed"] for g in gate),
    }


def parity_gate(base: Arm, base_res: dict[str, Any], arm: Arm,
                res: dict[str, Any]) -> dict[str, Any]:
    """The gate of ``arm`` against the first arm: every tensor's failing elements within its
    allowance (:mod:`.tolerance`). ``tensors`` holds the counts of every tensor, ``failed`` the
    names of the failing ones, ``summary`` one line."""
    across = across_devices(base, arm)
    rows = compare_results(base_res, res, cross_device=across)
    failed = [r for r in rows if not r["passed"]]
    keep = ("name", "n_fail", "numel_a", "allowed", "max_abs", "max_rel", "verdict")
    return {"arm": arm.spec, "against": base.spec, "passed": not failed,
            "cross_device": across, "policy": policy(across),
            "n_fail": sum(r.get("n_fail") or 0 for r in rows), "summary": summary(rows),
            "failed": [r["name"] for r in failed], "failed_rows": failed,
            "tensors": [{k: r.get(k) for k in keep} for r in rows]}


def _stats(per_repeat: list[list[float]]) -> dict[str, Any]:
    """Statistics over repeats of the per-repeat means, plus every iteration's value."""
    out = summarize([statistics.fmean(x) for x in per_repeat])
    out["iterations"] = [v for x in per_repeat for v in x]
    return out


def _raster_opacities(inp) -> torch.Tensor:
    """[C, N]: the opacities the rasterizer sees in the staged pass."""
    c = inp.viewmats.shape[0]
    return inp.params["opacities"][None].expand(c, -1)


def _derive(arm_rows: list[dict[str, Any]], pairs: dict[str, int],
            calibration: dict[str, Any] | None) -> None:
    """Adds ratios to the first arm, pair evaluations per second and % of the ceiling."""
    base = arm_rows[0]
    # the ceiling measured under the same load as the arms (median over repeats)
    ceiling = calibration["interleaved"]["median"] if calibration else None
    for row in arm_rows:
        ok = row["parity_gate"]["passed"]
        for name, t in row["ms"].items():
            b = base["ms"][name]["median"]
            t["time_ratio_to_first"] = t["median"] / b if b > 0 else None
            # a speedup is never reported on a red parity gate
            t["speedup_vs_first"] = b / t["median"] if ok and t["median"] > 0 else None
        rates: dict[str, Any] = {}
        for direction, stage in (("forward", "raster_forward"), ("backward", "raster_backward")):
            t = row["ms"][stage]
            ms = t["gpu"]["median"] if "gpu" in t else t["median"]
            rate = pairs[direction] / (ms * 1e-3) if ms > 0 else None
            rates[direction] = {
                "pairs_per_s": rate,
                "pct_of_ceiling": (100.0 * rate / ceiling
                                   if rate is not None and ceiling and row["device"] == "cpu"
                                   else None),
            }
        row["evals"] = rates
