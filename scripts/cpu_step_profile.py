#!/usr/bin/env python
"""The trainer's CPU step at a real size, stage by stage, in two checkouts alternately (issue 36).

    PYTHONPATH=src python scripts/cpu_step_profile.py --src /work/main/src src \\
        [--gaussians 1000000] [--resolution 1297x840] [--rounds 3] [--steps 2] [--warmup 1]
        [--json F]

The parent makes the scene once (the garden multiplied to ``--gaussians`` and seen by its
first camera at ``--resolution``: :func:`tilesplat.bench.scale.scaled_scene`) and a target
image, saves them, then runs ``--rounds`` rounds; in each, a child per (checkout, scheme) in
turn (so a slow phase of a shared machine hits every arm alike) times ``--steps`` steps of
the trainer's own ``optimization_step`` (L1 + 0.2 SSIM, fused Adam, SH degree 3, packed =
False, the NaN/Inf checks recorded into a flag as the trainer's runner has them) after
``--warmup`` untimed steps (default 1; the first steps of a process still fault in its
heap and buffer pool, which a long training run does once: ``--warmup 4`` times the steps it
repeats), on the Gaussians in the order that checkout's trainer keeps them (``--orders
trainer``: sorted in space where it has ``spatial_order``) or in the scene's own order
(``scene``) or shuffled (``random``, seed 0); ``--orders trainer scene random`` times each,
as arms of each checkout. A child times every cpu-backend op it calls (forward and backward
launchers, wrapped in the registry) and the step's parts; ``python`` is the step's time
outside the ops and Adam (autograd, PyTorch's glue ops, the loss's L1). Reports per stage the
min over steps and rounds, the median and the mean (a run's time per step: every timed step
counts, the slow ones too), and the step's ratios when there are two arms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from arm_args import arm_parser, child_env

# registry op -> stage name (forward, backward)
OPS = {
    "fully_fused_projection": ("projection", "projection_bwd"),
    "spherical_harmonics": ("sh", "sh_bwd"),
    "isect_tiles_tight": ("intersection", None),
    "isect_tiles": ("intersection", None),
    "isect_offset_encode": ("intersection", None),
    "rasterize_to_pixels": ("raster_fwd", "raster_bwd"),
    "ssim": ("ssim", "ssim_bwd"),
}
ORDER = ("projection", "sh", "intersection", "raster_fwd", "ssim", "ssim_bwd", "raster_bwd",
         "sh_bwd", "projection_bwd", "adam", "python", "step")


def child(scene_path: str, scheme: str, steps: int, threads: int | None, order: str,
          warmup: int = 1) -> dict:
    import torch

    if threads:
        import numba

        numba.set_num_threads(threads)
        torch.set_num_threads(threads)
    from tilesplat.backends import registry
    from tilesplat.ops.deferred_checks import FiniteFlag
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.models import model_kind
    from tilesplat.train.models.splats import make_optimizers, make_params
    from tilesplat.train.step.batch import Batch
    from tilesplat.train.step.optimization import StepPlan, optimization_step

    registry._load("cpu")
    try:  # as the trainer does (trees from before it have no such module)
        from tilesplat.backends.cpu.heap import keep_freed_heap
    except ImportError:
        pass
    else:
        keep_freed_heap()
    times: dict[str, float] = {}  # wall ms, and CPU ms as "cpu:" + name

    def add(name, t0, c0):
        times[name] = times.get(name, 0.0) + (time.perf_counter() - t0) * 1e3
        times[f"cpu:{name}"] = times.get(f"cpu:{name}", 0.0) + (time.process_time() - c0) * 1e3

    def timed(name, fn):
        def run(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                add(name, t0, c0)
        return run

    for (op, backend), impl in list(registry._impls.items()):
        if backend != "cpu" or op not in OPS:
            continue
        fwd, bwd = OPS[op]
        if isinstance(impl, registry.DiffOp):
            registry._impls[(op, backend)] = registry.DiffOp(timed(fwd, impl.forward),
                                                             timed(bwd, impl.backward))
        else:
            registry._impls[(op, backend)] = timed(fwd, impl)

    d = torch.load(scene_path)
    cfg = TrainConfig(backend="cpu", backward_scheme=scheme, sh_degree=3, sh_degree_interval=1,
                      packed=False, ssim_lambda=0.2)
    start = {k: d[k] for k in ("means", "quats", "scales", "opacities", "sh0", "shN")}
    if order == "random":  # the rows shuffled, as densification leaves a trained model's
        perm = torch.randperm(len(start["means"]), generator=torch.Generator().manual_seed(0))
        start = {k: v[perm] for k, v in start.items()}
    elif order == "trainer":  # the rows in the order this checkout's trainer keeps them
        try:
            from tilesplat.train.features.spatial_order import sorted_start
        except ImportError:  # a trainer that keeps the model's own order
            sorted_start = None
        if sorted_start is not None and cfg.spatial_order:
            start = sorted_start(start)
    params = make_params(start)
    optimizers = make_optimizers(params, cfg, 1.0)
    plan = StepPlan(cfg, model_kind(cfg), 1.0)
    batch = Batch(d["viewmats"], d["Ks"], d["width"], d["height"],
                  torch.zeros(1, 3), d["target"])

    class Clock:
        import contextlib

        @contextlib.contextmanager
        def stage(self, name):
            t0, c0 = time.perf_counter(), time.process_time()
            yield
            add(f"part_{name}", t0, c0)

    out = []
    for i in range(steps + warmup):
        times.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        # as the trainer's runner: the NaN/Inf checks into a flag, read after the step
        flag = FiniteFlag()
        optimization_step(params, optimizers, batch, plan, 10_000 + i, finite=flag,
                          clock=Clock())
        assert not flag.bad_names()
        add("step", t0, c0)
        row = {k: v for k, v in times.items() if "part_" not in k}
        row["adam"], row["cpu:adam"] = times["part_adam"], times["cpu:part_adam"]
        for pre in ("", "cpu:"):
            row[f"{pre}python"] = row[f"{pre}step"] - sum(
                v for k, v in row.items() if k.startswith(pre) and k.count(":") == len(pre) // 4
                and k not in (f"{pre}step", f"{pre}python"))
        if i >= warmup:
            out.append(row)
    return {"steps": out, "pairs": None}


def make_scene(gaussians: int, resolution: str, path: str) -> dict:
    import torch

    from tilesplat.bench.scale import parse_size, scaled_scene
    from tilesplat.data.scenes import load_garden

    sc = scaled_scene(load_garden(), gaussians, parse_size(resolution))
    sh = sc.sh_coeffs(3)
    g = torch.Generator().manual_seed(1)
    target = torch.rand((1, sc.height, sc.width, 3), generator=g)
    torch.save({
        "means": sc.means, "quats": sc.quats, "scales": torch.log(sc.scales),
        "opacities": torch.logit(sc.opacities), "sh0": sh[:, :1].clone(),
        "shN": sh[:, 1:].clone(), "viewmats": sc.viewmats, "Ks": sc.Ks, "width": sc.width,
        "height": sc.height, "target": target,
    }, path)
    return {"name": sc.name, "gaussians": sc.num_gaussians, "width": sc.width,
            "height": sc.height}


def main(argv: list[str] | None = None) -> int:
    p = arm_parser(__doc__.split("\n\n")[0], rounds=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per child first")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--orders", nargs="+", choices=("trainer", "scene", "random"),
                   default=["trainer"],
                   help="the Gaussians in the order each checkout's trainer keeps them "
                   "(spatial_order), in the scene's own order, or shuffled; each is an arm of "
                   "each --src")
    p.add_argument("--order", default="trainer", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.scheme, args.steps, args.threads,
                               args.order, args.warmup)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        scene_path = os.path.join(tmp, "scene.pt")
        info = make_scene(args.gaussians, args.resolution, scene_path)
        print(f"scene {info}", flush=True)
        rows: dict[tuple[str, str], list[dict]] = {}
        arms = [(src, order) for src in args.src for order in args.orders]
        for r in range(args.rounds):
            for scheme in args.schemes:
                for src, order in arms:
                    env = child_env(src)
                    cmd = [sys.executable, os.path.abspath(__file__), "--child", scene_path,
                           "--scheme", scheme, "--steps", str(args.steps), "--order", order,
                           "--warmup", str(args.warmup)]
                    arm = src if len(args.orders) == 1 else f"{src}@{order}"
                    if args.threads:
                        cmd += ["--threads", str(args.threads)]
                    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if res.returncode:
                        print(res.stderr, file=sys.stderr)
                        return 1
                    got = json.loads(res.stdout.strip().splitlines()[-1])["steps"]
                    rows.setdefault((arm, scheme), []).extend(got)
                    print(f"round {r} {scheme} {arm}: step "
                          f"{[round(s['step']) for s in got]} ms", flush=True)
    table = {}
    keys = [*ORDER, *(f"cpu:{k}" for k in ORDER)]
    for (src, scheme), steps in rows.items():
        table[f"{src}|{scheme}"] = {
            k: {"min": min(s.get(k, 0.0) for s in steps),
                "median": statistics.median(s.get(k, 0.0) for s in steps),
                "mean": statistics.fmean(s.get(k, 0.0) for s in steps)}
            for k in keys}
    for pre, title in (("", "wall ms"), ("cpu:", "CPU ms (both threads)")):
        print(f"\n{title}, min / median / mean\n| stage | " + " | ".join(table) + " |")
        print("|---|" + "---|" * len(table))
        for k in ORDER:
            print(f"| {k} | " + " | ".join(
                " / ".join(f"{v[pre + k][s]:.0f}" for s in ("min", "median", "mean"))
                for v in table.values()) + " |")
    names = list(dict.fromkeys(arm for arm, _ in rows))
    if len(names) == 2:
        for scheme in args.schemes:
            for pre in ("", "cpu:"):
                a, b = (table[f"{s}|{scheme}"][f"{pre}step"] for s in names)
                print(f"{scheme} {pre or 'wall:'} step {names[0]} / {names[1]}: "
                      f"min {a['min'] / b['min']:.2f}x, median {a['median'] / b['median']:.2f}x, "
                      f"mean {a['mean'] / b['mean']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"scene": info, "rows": {f"{k[0]}|{k[1]}": v for k, v in rows.items()},
                       "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
