"""What ``tensorboard = true`` costs a training on the CPU: the built-in scene, alternating runs
without and with the board (after a short warm-up run that loads the kernels), and the seconds
spent inside the board's own calls during one more run with it (a direct measure where the
machine's noise hides the difference of the alternating pairs).

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE THP_MEM_ALLOC_ENABLE=1 \\
        .venv/bin/python scripts/tensorboard_cost.py [--steps 300] [--pairs 3] [--out DIR]

Prints one JSON line per run (wall-clock steps/s of the loop, evaluations included, and steps/s
of training time), then the pairs' on/off ratios and the board's time by call.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from tilesplat.train.config import TrainConfig
from tilesplat.train.loop import tensorboard as tb
from tilesplat.train.loop.trainer import Trainer
from tilesplat.train.rundir.scene import load_scene


def quiet(_: str) -> None:
    pass


def timed_run(cfg: TrainConfig, dataset, run: Path) -> dict:
    trainer = Trainer(cfg, dataset, run, log=quiet)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    return {"tensorboard": cfg.tensorboard, "wall_s": round(wall, 2),
            "steps_per_s": round(cfg.steps / wall, 3),
            "train_steps_per_s": round(cfg.steps / trainer.elapsed, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--out", default=None, help="folder for the runs (default: a temp one)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="tensorboard-cost-"))
    base = dict(steps=args.steps, eval_every=args.eval_every, checkpoint_every=0,
                progress=False, lpips=False, save_renders=False, save_ply=False, backend="cpu")
    dataset = load_scene(TrainConfig(**base), log=print)
    warm = TrainConfig(**{**base, "steps": 5, "eval_every": 5})
    Trainer(warm, dataset, out / "warmup", log=quiet).train()

    ratios = []
    for pair in range(args.pairs):
        speeds = {}
        for on in (False, True):
            cfg = TrainConfig(**base, tensorboard=on)
            result = timed_run(cfg, dataset, out / f"pair{pair}-{'on' if on else 'off'}")
            print(json.dumps(result), flush=True)
            speeds[on] = result["steps_per_s"]
        ratios.append(round(speeds[True] / speeds[False], 3))
    print(json.dumps({"on_over_off_steps_per_s": ratios}))

    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def timer(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t0
                calls[name] += 1
        return wrapper

    for name in ("__init__", "record", "add_renders", "close"):
        setattr(tb.TensorBoard, name, timer(name, getattr(tb.TensorBoard, name)))
    result = timed_run(TrainConfig(**base, tensorboard=True), dataset, out / "inside")
    board = sum(spent.values())
    share = round(board / result["wall_s"], 4)
    print(json.dumps({**result, "board_s": {k: round(v, 4) for k, v in spent.items()},
                      "board_calls": dict(calls), "board_share": share}))


if __name__ == "__main__":
    main()
