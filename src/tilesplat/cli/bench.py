"""``tilesplat bench``: time backends stage by stage, check their parity and self-noise."""

from __future__ import annotations

import argparse

from ..constants import TILE_SIZE

COMMAND = "bench"
HELP = "Benchmark backends (per stage, per training step), check parity and self-noise."

_EPILOG = """\
arms are written backend[:scheme][@device]: backend torch | cpu | cuda, scheme per_pixel
(default) | per_splat, device cpu | cuda (default: cuda for the cuda backend, else cpu).

modes:
  (default)          time every arm: ms per stage (projection+SH, intersection+sort, raster
                     forward, raster backward, projection backward) and per training step
                     (rasterization forward + backward + Adam), median / mean / sigma over
                     repeats, speedups vs the first arm, pair evaluations per second and their
                     % of the calibrated ceiling, peak memory, and a parity gate vs the first
                     arm (a failing arm gets no speedup and the exit status is 1).
  --parity A B       every output and gradient of arms A and B on one scene, under one shared
                     random upstream gradient: element counts, max abs / rel difference, PASS
                     or FAIL per tensor (an element fails when abs > --atol and rel > --rtol).
  --self-noise K     K forward+backward passes of each arm of --arms: per gradient, the max
                     difference to the first pass (0 means deterministic).
  --calibrate-only   only measure the machine's per-pair ceiling.
  --eval3d N [N ...] 3DGUT's eval3d rasterizer against the 2D rasterizer at the same size
                     (--eval3d-size, default 320x240) on --eval3d-backend (default cpu): a
                     parity gate of eval3d against the reference, then per N Gaussians the two
                     rasterizers' forward + backward interleaved (--repeats, default 5), their
                     ratio per call and per intersection, and the projections' times.

run scenes (--scene run:RUN_DIR, a run folder's newest checkpoint or one checkpoint file):
  the training step is the trainer's own (tilesplat train's optimization_step) on each arm's
  copy of the checkpoint's parameters and Adam states: render the cameras of the run's next
  step, photometric loss against the real images, backward, fused Adam (densification is not
  replayed); defaults --warmup 10 --iters 50 --repeats 3; the stages time the checkpoint's
  Gaussians. --parity and --self-noise then run one trainer step per arm and pass and compare
  the loss, every parameter gradient (checkpoint names), the rasterizer's gradients, the tile
  offsets (exactly) and the intersection order (reported, not gated). --sh-degree and
  --tile-size are the run's.

exit status: 0 ok, 1 a parity FAIL, 2 bad arguments (unknown arm, backend or scene).

examples:
  tilesplat bench --scene garden --arms torch cpu:per_pixel cpu:per_splat --out garden.json
  tilesplat bench --scene synthetic:2000:64x48 --parity torch cpu:per_splat
  tilesplat bench --scene garden --arms cpu:per_pixel cpu:per_splat --self-noise 3
  tilesplat bench --scene run:runs/synthetic --arms torch cpu:per_pixel cpu:per_splat
  tilesplat bench --scene run:runs/synthetic --parity cpu:per_pixel cpu:per_splat
  tilesplat bench --eval3d 1000 10000 --eval3d-size 320x240 --markdown
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    parser.add_argument("--scene", default="synthetic:2000:64x48",
                        help="'garden', 'synthetic:N:WxH' or 'run:RUN_DIR' (a training run "
                             "folder or one checkpoint file) (default: %(default)s)")
    parser.add_argument("--gaussians", type=int, default=None, metavar="N",
                        help="multiply the scene's Gaussians to N, seen by its first camera "
                             "(tilesplat.bench.scale; not for run scenes)")
    parser.add_argument("--resolution", default=None, metavar="WxH",
                        help="render the scene's first camera at WxH (e.g. 1297x840)")
    parser.add_argument("--arms", nargs="+", default=["torch"], metavar="ARM",
                        help="arms to time, the first is the baseline (default: torch)")
    parser.add_argument("--iters", type=int, default=None,
                        help="timed iterations per repeat (default: 3; run scenes: 50)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats; statistics are over repeats (default: 3)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed passes per arm before timing, >= 1 (default: 1; run "
                             "scenes: 10)")
    parser.add_argument("--sh-degree", type=int, default=3,
                        help="SH degree of the colours, 0-4 (default: %(default)s)")
    parser.add_argument("--tile-size", type=int, default=TILE_SIZE, help="default: %(default)s")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the shared upstream gradient (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None,
                        help="Numba and torch threads (default: as configured)")
    parser.add_argument("--parity", nargs=2, metavar=("A", "B"), default=None,
                        help="compare every output and gradient of arms A and B")
    parser.add_argument("--atol", type=float, default=1e-4, help="parity abs tolerance")
    parser.add_argument("--rtol", type=float, default=1e-4, help="parity rel tolerance")
    parser.add_argument("--self-noise", type=int, default=None, metavar="K",
                        help="K repeated passes of each arm of --arms, difference to the first")
    parser.add_argument("--no-calibrate", action="store_true",
                        help="skip the per-pair ceiling (no %% of ceiling in the report)")
    parser.add_argument("--calibration-seconds", type=float, default=0.5,
                        help="time spent measuring the ceiling (default: %(default)s)")
    parser.add_argument("--calibrate-only", action="store_true",
                        help="only measure and print the per-pair ceiling")
    parser.add_argument("--eval3d", type=int, nargs="+", default=None, metavar="N",
                        help="time eval3d against the 2D rasterizer at N Gaussians each")
    parser.add_argument("--eval3d-size", default="320x240", metavar="WxH",
                        help="image size of --eval3d (default: %(default)s)")
    parser.add_argument("--eval3d-backend", default="cpu", choices=("cpu", "cuda", "torch"),
                        help="backend of --eval3d (default: %(default)s)")
    parser.add_argument("--markdown", action="store_true",
                        help="print the bench table as Markdown (as in docs/benchmarks.md)")
    parser.add_argument("--out", default=None, metavar="FILE.json",
                        help="write every number and the machine to this JSON file")


def run(args: argparse.Namespace) -> int:
    import torch

    from tilesplat import bench

    dtype = {"float32": torch.float32, "float64": torch.float64}[args.dtype]
    if args.eval3d is not None:
        return _eval3d(args)
    if args.calibrate_only:
        with bench.runner.thread_count(args.threads):
            cal = bench.calibrate(args.calibration_seconds)
        print(f"ceiling: {cal['pairs_per_s'] / 1e9:.3g} G pairs/s "
              f"(median {cal['median_pairs_per_s'] / 1e9:.3g}, {cal['threads']} threads)")
        result = {"schema": bench.SCHEMA, "kind": "calibration",
                  "machine": bench.machine_info(), "calibration": cal}
        _save(args.out, result)
        return 0
    scene = _scene(args, dtype)
    common = {"sh_degree": args.sh_degree, "tile_size": args.tile_size, "seed": args.seed,
              "dtype": dtype}
    if args.parity is None and args.self_noise is None:
        result = bench.run_bench(
            scene, args.arms, iters=args.iters, repeats=args.repeats, warmup=args.warmup,
            calibrate=not args.no_calibrate, calibration_seconds=args.calibration_seconds,
            threads=args.threads, **common,
        )
        print(bench.format_bench(result, markdown=args.markdown))
        _save(args.out, result)
        return 0 if result["parity_gate_passed"] else 1
    result = {"schema": bench.SCHEMA, "kind": "checks", "machine": bench.machine_info()}
    status = 0
    with bench.runner.thread_count(args.threads):
        if args.parity is not None:
            par = bench.run_parity(scene, *args.parity, atol=args.atol, rtol=args.rtol,
                                   **common)
            print(bench.format_parity(par))
            result["parity"] = par
            status = 0 if par["passed"] else 1
        if args.self_noise is not None:
            noise = bench.run_self_noise(scene, args.arms, k=args.self_noise, **common)
            print(bench.format_self_noise(noise))
            result["self_noise"] = noise
    _save(args.out, result)
    return status


def _eval3d(args: argparse.Namespace) -> int:
    from tilesplat.bench import eval3d_cost, machine_info, runner

    try:
        width, height = (int(v) for v in args.eval3d_size.lower().split("x"))
    except ValueError:
        raise ValueError(f"--eval3d-size must be WxH, got {args.eval3d_size!r}") from None
    if min(width, height, *args.eval3d) < 1:
        raise ValueError("--eval3d Gaussian counts and --eval3d-size must be >= 1")
    with runner.thread_count(args.threads):
        result = eval3d_cost.run_eval3d_cost(args.eval3d, width, height,
                                             repeats=args.repeats or 5,
                                             backend=args.eval3d_backend)
    result["machine"] = machine_info()
    print(eval3d_cost.format_eval3d_cost(result, markdown=args.markdown))
    _save(args.out, result)
    return 0 if result["gate"]["passed"] else 1


def _scene(args: argparse.Namespace, dtype):
    """The scene spec, or with --gaussians / --resolution the scaled scene."""
    if args.gaussians is None and args.resolution is None:
        return args.scene
    from tilesplat.bench.run_spec import is_run_spec
    from tilesplat.bench.scale import parse_size, scaled_scene
    from tilesplat.data.scenes import load_scene

    if is_run_spec(args.scene):
        raise ValueError("--gaussians and --resolution apply to 'garden' and synthetic scenes, "
                         f"not to {args.scene!r}")
    size = parse_size(args.resolution) if args.resolution is not None else None
    return scaled_scene(load_scene(args.scene, dtype=dtype), args.gaussians, size)


def _save(path: str | None, result: dict) -> None:
    if path:
        from tilesplat.bench import write_json

        write_json(result, path)
        print(f"wrote {path}")
