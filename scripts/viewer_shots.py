"""Screenshots of ``tilesplat view`` for docs/viewer.md, taken with the browser tests'
machinery (tests/browser.py: headless Chromium on 127.0.0.1, pixels read back by viser).

    python scripts/viewer_shots.py RUN_OR_FILE --out docs/images
    python scripts/viewer_shots.py MODEL.ply --check     # does a (large) model draw?

Shows the model from the run's first test camera (or the default pose for a file) in
splats mode, then in render mode (RGB and depth), and writes small PNGs. ``--check``: splats
mode only; prints the seconds to open the model, to the browser's connection and to the
first frame with splats in it, the share of the frame that is not background (white), and
writes ``viewer_check.png``; exits 1 when nothing is drawn.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _camera(source: str, model) -> tuple[np.ndarray, np.ndarray, float]:
    """(wxyz, position, vertical fov) of the run's first test view, else the default."""
    from tilesplat.viewer.scene import default_pose, rotation_to_wxyz

    try:
        from tilesplat.train.loop.run import load_run
        from tilesplat.train.rundir.scene import load_scene

        cfg, _, _ = load_run(source)
        frame = (lambda d: (d.test or d.train)[0])(load_scene(cfg, log=lambda _: None))
        c2w = np.linalg.inv(frame.viewmat.double().numpy())
        fov = 2 * math.atan(0.5 * frame.height / float(frame.K[1, 1]))
        return rotation_to_wxyz(c2w[:3, :3]), c2w[:3, 3], fov
    except (FileNotFoundError, ValueError):
        wxyz, position, _ = default_pose(model.gaussians)
        return wxyz, position, math.radians(50)


def _save(image: np.ndarray, path: Path) -> None:
    from PIL import Image

    Image.fromarray(image).quantize(colors=128, dither=Image.Dither.NONE).save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


def check(source: str, out: Path, width: int, wait: float) -> int:
    """Open ``source`` in ``tilesplat view`` (splats mode) in headless Chromium and wait for
    a frame with splats in it: 0 when one is drawn."""
    from browser import chromium, first_client
    from tilesplat.cli._model import open_model
    from tilesplat.viewer.server import ViewServer

    t0 = time.perf_counter()
    model = open_model(source)
    wxyz, position, fov = _camera(source, model)
    t_open = time.perf_counter() - t0
    server = ViewServer(model.gaussians, mode="splats", port=0, max_side=width,
                        log=lambda _: None)  # fmt: skip
    t_server = time.perf_counter() - t0
    share, image, t_frame = 0.0, None, None
    try:
        with chromium(f"http://127.0.0.1:{server.port}/"):
            client = first_client(server.server, timeout=wait)
            t_client = time.perf_counter() - t0
            client.camera.fov, client.camera.wxyz = fov, tuple(wxyz)
            client.camera.position = tuple(position)
            height = round(width * client.camera.image_height / client.camera.image_width)
            while time.perf_counter() - t0 < wait:  # the browser sorts and uploads splats
                time.sleep(2.0)
                image = client.get_render(height, width, wxyz=wxyz, position=position,
                                          timeout=wait)  # fmt: skip
                share = float((np.abs(image.astype(int) - 255).max(-1) > 40).mean())
                if share > 0.01:
                    t_frame = time.perf_counter() - t0
                    break
    finally:
        server.close()
    n = len(model.gaussians["means"])
    print(f"{n} Gaussians: opened in {t_open:.1f} s, served in {t_server:.1f} s, browser "
          f"connected at {t_client:.1f} s, first frame with splats at "
          f"{'-' if t_frame is None else f'{t_frame:.1f}'} s; {100 * share:.1f} % of the "
          "frame not background")  # fmt: skip
    if image is not None:
        out.mkdir(parents=True, exist_ok=True)
        _save(image, out / "viewer_check.png")
    return 0 if t_frame is not None else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", metavar="RUN_OR_FILE")
    parser.add_argument("--out", default="docs/images")
    parser.add_argument("--width", type=int, default=480)
    parser.add_argument("--check", action="store_true", help="splats mode: is a frame drawn?")
    parser.add_argument("--wait", type=float, default=600, help="--check: seconds to wait")
    args = parser.parse_args()
    if args.check:
        sys.exit(check(args.source, Path(args.out), args.width, args.wait))
    from browser import chromium, first_client, wait_for
    from tilesplat.cli._model import open_model
    from tilesplat.viewer.server import ViewServer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = open_model(args.source)
    wxyz, position, fov = _camera(args.source, model)
    for mode in ("splats", "render"):
        server = ViewServer(model.gaussians, mode=mode, port=0, max_side=args.width,
                            log=lambda _: None)  # fmt: skip
        try:
            with chromium(f"http://127.0.0.1:{server.port}/"):
                client = first_client(server.server)
                client.camera.fov = fov
                client.camera.wxyz = tuple(wxyz)
                client.camera.position = tuple(position)
                time.sleep(1.0)
                cam = client.camera
                height = round(args.width * cam.image_height / cam.image_width)
                if mode == "splats":
                    for _ in range(20):  # the browser sorts and uploads splats asynchronously
                        time.sleep(1.0)
                        image = client.get_render(
                            height, args.width, wxyz=wxyz, position=position, timeout=120
                        )
                    _save(image, out / "viewer_splats.png")
                    continue
                for view in ("RGB", "depth"):
                    server.view_mode.value = view
                    server.refresh()
                    time.sleep(0.5)
                    wait_for(server.settled, 300, "the full-quality frame")
                    time.sleep(1.0)
                    image = client.get_render(height, args.width, timeout=120)
                    _save(image, out / f"viewer_render_{view.lower()}.png")
        finally:
            server.close()


if __name__ == "__main__":
    main()
