"""Training speed with and without the live viewer (docs/viewer.md).

Trains the built-in scene ``--repeats`` times per arm, the arms interleaved (so a change in
the machine's load hits all of them alike), and prints steps/s per run and the median per
arm. Arms: ``off`` (viewer_port 0), ``idle`` (the viewer serving, no browser) and, with
``--browser``, ``browser`` (headless Chromium connected the whole run, from tests/browser.py;
it draws the splats in software on the same CPU).

    python scripts/viewer_speed.py --steps 300 --repeats 3 --browser
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def train_once(arm: str, steps: int, folder: Path, backend: str) -> float:
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.run import train_run
    from tilesplat.viewer import live

    cfg = TrainConfig(
        steps=steps, progress=False, lpips=False, save_renders=False, save_ply=False,
        checkpoint_every=0, backend=backend, viewer_port=0 if arm == "off" else 1,
        run_dir=str(folder / f"{arm}-{time.time_ns()}"),
    )  # fmt: skip
    stop = threading.Event()
    start = live.start_server
    live.start_server = lambda host, port, label: start(host, 0, label)  # a free port
    init, browsers = live.LiveViewer.__init__, []

    def init_and_browse(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if arm == "browser":
            t = threading.Thread(target=_browse, args=(self.port, stop), daemon=True)
            t.start()
            browsers.append(t)
            deadline = time.monotonic() + 60
            while not self.has_clients and time.monotonic() < deadline:
                time.sleep(0.1)

    live.LiveViewer.__init__ = init_and_browse
    try:
        _, metrics = train_run(cfg, log=lambda _: None)
    finally:
        live.LiveViewer.__init__, live.start_server = init, start
        stop.set()
        for t in browsers:
            t.join(timeout=30)
    return steps / metrics["train_seconds"]


def _browse(port: int, stop: threading.Event) -> None:
    from browser import chromium

    with chromium(f"http://127.0.0.1:{port}/"):
        stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--browser", action="store_true", help="add the browser arm")
    args = parser.parse_args()
    arms = ["off", "idle"] + (["browser"] if args.browser else [])
    rates: dict[str, list[float]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stderr(sys.stdout):
        train_once("off", 20, Path(tmp), args.backend)  # warm-up: data, kernels
        for r in range(args.repeats):
            for arm in arms if r % 2 == 0 else arms[::-1]:
                rate = train_once(arm, args.steps, Path(tmp), args.backend)
                rates[arm].append(rate)
                print(f"repeat {r}  {arm:8s} {rate:6.2f} steps/s", flush=True)
    base = statistics.median(rates["off"])
    for arm in arms:
        med = statistics.median(rates[arm])
        print(f"{arm:8s} median {med:6.2f} steps/s  ({med / base:.3f} x off)")


if __name__ == "__main__":
    main()
