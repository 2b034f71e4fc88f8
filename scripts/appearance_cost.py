"""Cost of appearance compensation (``post_processing``) per training step on the CPU.

Three trainers of one config (none, bilateral_grid, affine; the same initial Gaussians, no
densification) on the exposure scene take turns of ``--steps`` steps each, ``--rounds``
times, in one process on one thread, so that each ratio to none is of runs measured side by
side; then the transforms alone (colours, TV, backward, Adam of one image) are timed.

    .venv/bin/python scripts/appearance_cost.py [--size 200] [--grid 16,16,8]
"""

from __future__ import annotations

import argparse
import time

import torch

from tilesplat.train.config import TrainConfig
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.scene import load_scene

MODES = ("none", "bilateral_grid", "affine")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=200, help="image side in pixels")
    p.add_argument("--views", type=int, default=30, help="training views")
    p.add_argument("--grid", default="16,16,8", help="bilateral_grid_shape")
    p.add_argument("--gaussians", type=int, default=10_000)
    p.add_argument("--steps", type=int, default=20, help="steps per turn")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default="runs/appearance-cost", help="scratch run folders")
    args = p.parse_args()
    torch.set_num_threads(1)
    base = dict(synthetic_scene="exposure", synthetic_size=args.size,
                synthetic_train=args.views, synthetic_test=4, steps=args.steps * args.rounds,
                init_points=args.gaussians, refine_start=10**9, sh_degree=1, backend="cpu",
                checkpoint_every=0, progress=False, lpips=False, bilateral_grid_shape=args.grid)
    dataset = load_scene(TrainConfig(**base).validate())
    trainers = {m: Trainer(TrainConfig(**base, post_processing=m).validate(), dataset,
                           f"{args.out}/{m}", log=lambda s: None) for m in MODES}
    per_step: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(args.rounds):
        for m, trainer in trainers.items():
            t0 = time.perf_counter()
            for s in range(args.steps):
                trainer.train_step(r * args.steps + s)
            per_step[m].append((time.perf_counter() - t0) / args.steps)
    for m in MODES:
        ratios = [t / n for t, n in zip(per_step[m], per_step["none"], strict=True)]
        print(f"{m:15s} s/step {' '.join(f'{t:.4f}' for t in per_step[m])}   vs none "
              f"{' '.join(f'{x:.3f}' for x in ratios)}")
    for m in MODES[1:]:
        feature = trainers[m].features[0]
        batch = type("Batch", (), {"views": torch.tensor([0])})()
        colors = torch.rand(1, args.size, args.size, 3, requires_grad=True)
        t0 = time.perf_counter()
        for s in range(50):
            out = feature.colors(colors, batch, s)
            loss = feature.loss(None, batch, s)
            (out.mean() + (0.0 if loss is None else loss)).backward()
            feature.optimizer_step(s)
        print(f"{m:15s} the transforms alone: {(time.perf_counter() - t0) / 50 * 1e3:.1f} ms "
              "a step")


if __name__ == "__main__":
    main()
