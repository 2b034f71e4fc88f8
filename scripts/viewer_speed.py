"""Training speed with and without the live viewer (docs/viewer.md).

Trains the built-in scene ``--repeats`` times per arm, the arms interleaved (so a change in
the machine's load hits all of them alike), and prints, per run, steps per second of wall
time and CPU seconds of the whole training process per step (all its threads: the trainer's
and the viewer's; a shared machine's other load moves the first much more than the second),
then the median per arm. The clock spans ``Trainer.train()``: the viewer's start and stop
and every hook call are inside it. Arms: ``off`` (viewer_port 0), ``idle`` (the viewer
serving, no browser) and, with ``--browser``, ``browser`` (headless Chromium from
tests/browser.py connected the whole run; it is another process, as a browser on the
user's own machine would be).

    python scripts/viewer_speed.py --steps 150 --repeats 4 --size 100 --browser
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def train_once(arm: str, cfg, dataset, folder: Path) -> tuple[float, float]:
    """(steps per wall second, process CPU seconds per step) of one run of ``arm``."""

    from tilesplat.train.loop.trainer import Trainer
    from tilesplat.viewer import live

    cfg = cfg.replace(viewer_port=0 if arm == "off" else 1)
    trainer = Trainer(cfg, dataset, folder / f"{arm}-{time.time_ns()}", log=lambda _: None)
    stop = threading.Event()
    start, init, browsers = live.start_server, live.LiveViewer.__init__, []
    live.start_server = lambda host, port, label: start(host, 0, label)  # a free port

    def init_and_browse(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if arm == "browser":
            t = threading.Thread(target=_browse, args=(self.port, stop), daemon=True)
            t.start()
            browsers.append(t)
            deadline = time.monotonic() + 60
            while not self.has_clients and time.monotonic() < deadline:
                time.sleep(0.05)

    live.LiveViewer.__init__ = init_and_browse
    try:
        c0, t0 = os.times(), time.perf_counter()
        trainer.train()
        c1, t1 = os.times(), time.perf_counter()
    finally:
        live.LiveViewer.__init__, live.start_server = init, start
        stop.set()
        for t in browsers:
            t.join(timeout=30)
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return cfg.steps / (t1 - t0), cpu / cfg.steps


def _browse(port: int, stop: threading.Event) -> None:
    from browser import chromium

    with chromium(f"http://127.0.0.1:{port}/"):
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--size", type=int, default=100, help="built-in scene's image size")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--browser", action="store_true", help="add the browser arm")
    args = parser.parse_args()
    import torch

    from tilesplat.train.config import TrainConfig
    from tilesplat.train.rundir.scene import load_scene

    cfg = TrainConfig(
        steps=args.steps, synthetic_size=args.size, progress=False, backend=args.backend,
        checkpoint_every=0, keep_checkpoints=1,
    )  # fmt: skip
    dataset = load_scene(cfg, log=lambda _: None)
    arms = ["off", "idle"] + (["browser"] if args.browser else [])
    wall: dict[str, list[float]] = {a: [] for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    print(f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, "
          f"{args.steps} steps at {args.size}x{args.size}, backend {args.backend}")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(sys.stderr):
        warm = cfg.replace(steps=10)
        train_once("off", warm, dataset, Path(tmp))  # warm-up: kernels, caches
        for r in range(args.repeats):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                rate, per_step = train_once(arm, cfg, dataset, Path(tmp))
                wall[arm].append(rate)
                cpu[arm].append(per_step)
                print(f"repeat {r}  {arm:8s} {rate:6.2f} steps/s  {1000 * per_step:6.1f} "
                      "CPU ms/step", file=sys.__stdout__, flush=True)  # fmt: skip
    base_w, base_c = statistics.median(wall["off"]), statistics.median(cpu["off"])
    for arm in arms:
        w, c = statistics.median(wall[arm]), statistics.median(cpu[arm])
        print(f"{arm:8s} median {w:6.2f} steps/s ({w / base_w:.3f} x off)  "
              f"{1000 * c:6.1f} CPU ms/step ({c / base_c:.3f} x off)")  # fmt: skip


if __name__ == "__main__":
    main()
