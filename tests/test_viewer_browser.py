"""The viewer in a real browser: headless Chromium (SwiftShader WebGL) on 127.0.0.1.

- splats mode: the browser's splats sit where tilesplat's own render of the same camera puts
  them (foreground share, centroid, spread), and the centroid moves as the model moves;
- render mode: the image the browser shows is tilesplat's render of the browser's camera,
  within JPEG tolerance;
- training: a browser connected to ``tilesplat train --set viewer_port=...`` sees the model
  change, and Pause holds the trainer.

viser renders ``get_render`` with the browser's own camera field of view and canvas aspect
(resampled to the requested size), so every comparison uses those.
"""

from __future__ import annotations

import math
import os
import threading
import time

import numpy as np
import pytest
import torch

from browser import centroid, chromium, first_client, foreground, require_browser, wait_for
from helpers import splats_of
from tilesplat.viewer.scene import intrinsics, look_at_pose, render_view, viewmat_from_pose

WHITE = np.array([255, 255, 255])
STEPS = 200  # the training test's run: torch backend (nothing to compile), 32x32 images
SHOTS = os.environ.get("TILESPLAT_VIEWER_SHOTS")  # folder: save the screenshots for docs


@pytest.fixture(autouse=True)
def _browser():
    require_browser()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _blob(n: int = 2000, seed: int = 0) -> dict[str, torch.Tensor]:
    """A dark red ball of ``n`` small Gaussians around the origin (SH degree 1: the render
    mode's colour is view-dependent)."""
    g = torch.Generator().manual_seed(seed)
    sh = torch.zeros(n, 4, 3)
    sh[:, 0] = torch.tensor([0.0, -1.5, -1.5])
    sh[:, 1:] = 0.3 * torch.randn(n, 3, 3, generator=g)
    return splats_of(torch.randn(n, 3, generator=g) * 0.25, torch.randn(n, 4, generator=g),
                     torch.full((n, 3), math.log(0.03)) + 0.3 * torch.randn(n, 3, generator=g),
                     torch.full((n,), 3.0), sh)


def _shot(client, width: int, pose=None) -> np.ndarray:
    """The browser's pixels at its canvas aspect, ``width`` wide: [H, W, 3] uint8."""
    cam = client.camera
    height = round(width * cam.image_height / cam.image_width)
    kw = {} if pose is None else {"wxyz": pose[0], "position": pose[1], "fov": cam.fov}
    return client.get_render(height, width, timeout=30, **kw)


def _spread(mask: np.ndarray) -> np.ndarray:
    ys, xs = np.nonzero(mask)
    return np.array([xs.std(), ys.std()])


def _save(name: str, image: np.ndarray) -> None:
    if SHOTS:
        from PIL import Image

        Image.fromarray(image).save(os.path.join(SHOTS, name), optimize=True)


def test_splats_appear_where_the_camera_says_and_follow_the_model():
    from tilesplat.viewer.server import ViewServer

    model = _blob()
    server = ViewServer(model, mode="splats", port=0, log=lambda _: None)
    try:
        with chromium(f"http://127.0.0.1:{server.port}/"):
            client = first_client(server.server)
            pose = look_at_pose((0.0, 0.0, -3.0), (0.0, 0.0, 0.0), up=(0.0, -1.0, 0.0))
            width = 192

            def expected(g) -> tuple[np.ndarray, np.ndarray]:
                cam = client.camera
                height = round(width * cam.image_height / cam.image_width)
                K = intrinsics(cam.fov, width, height)
                image = render_view(g, viewmat_from_pose(*pose), K, width, height, backend="torch")
                return image, foreground(image, WHITE)

            def shown() -> np.ndarray:
                # the browser sorts and uploads splats asynchronously: wait for a stable frame
                last = None
                for _ in range(40):
                    mask = foreground(_shot(client, width, pose), WHITE)
                    if mask.any() and last is not None and np.array_equal(mask, last):
                        return mask
                    last = mask
                    time.sleep(0.15)
                pytest.fail("the browser's splats never settled")

            ref_image, ref = expected(model)
            got = shown()
            _save("viewer_splats.png", _shot(client, 480))
            assert abs(got.mean() / ref.mean() - 1) < 0.35, (got.mean(), ref.mean())
            assert np.abs(centroid(got) - centroid(ref)).max() < 2.0
            assert np.abs(_spread(got) / _spread(ref) - 1).max() < 0.15

            moved = {**model, "means": model["means"] + torch.tensor([0.5, 0.0, 0.0])}
            server.set_gaussians(moved)
            _, ref_moved = expected(moved)
            shift = centroid(ref_moved) - centroid(ref)
            assert abs(shift[0]) > 10  # the move is large on screen

            def moved() -> list[np.ndarray]:
                m = shown()
                return [m] if np.abs(centroid(m) - centroid(got) - shift).max() < 2.0 else []

            (got_moved,) = wait_for(moved, 20, "the splats to move")
            assert np.abs(centroid(got_moved) - centroid(ref_moved)).max() < 2.0
    finally:
        server.close()


def test_render_mode_shows_tilesplats_render_of_the_browser_camera():
    from tilesplat.viewer.server import ViewServer

    model = _blob(1500, seed=1)
    server = ViewServer(model, mode="render", port=0, backend="torch", max_side=192,
                        log=lambda _: None)  # fmt: skip
    try:
        with chromium(f"http://127.0.0.1:{server.port}/"):
            client = first_client(server.server)
            wait_for(lambda: server.frames >= 1 and server.settled(), 60, "a full-quality frame")
            # the browser shows the settled frame once it has decoded it: read it back until
            # it does (bounded), then judge the last read
            deadline = time.monotonic() + 20.0
            while True:
                cam = client.camera
                width, height = server.camera_image_size(client)
                assert max(width, height) == 192
                want = render_view(
                    model, viewmat_from_pose(cam.wxyz, cam.position),
                    intrinsics(cam.fov, width, height), width, height, backend="torch",
                )  # fmt: skip
                time.sleep(0.5)  # let the browser decode the JPEG
                got = client.get_render(height, width, timeout=30)
                err = np.abs(got.astype(np.float64) - want.astype(np.float64))
                psnr = 10 * math.log10(255.0**2 / max((err**2).mean(), 1e-9))
                if (err.mean() < 4.0 and psnr > 28.0) or time.monotonic() > deadline:
                    break
            _save("viewer_render.png", got)
            assert err.mean() < 4.0 and psnr > 28.0, (err.mean(), psnr)
            # and it is not just any image: a render of another camera is far off
            other = render_view(
                model, viewmat_from_pose(*look_at_pose((0.4, 0.0, -2.0), (0.0, 0.0, 0.0),
                                                       (0.0, -1.0, 0.0))),
                intrinsics(cam.fov, width, height), width, height, backend="torch",
            )  # fmt: skip
            assert np.abs(got.astype(np.float64) - other).mean() > 3 * err.mean()
    finally:
        server.close()


def test_training_view_shows_the_model_change_and_pauses(tmp_path, monkeypatch):
    from tilesplat.train.config import TrainConfig
    from tilesplat.train.loop.run import train_run
    from tilesplat.viewer import live

    monkeypatch.setattr(live, "PUSH_S", 0.5)
    viewers: list[live.LiveViewer] = []
    init = live.LiveViewer.__init__

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        viewers.append(self)

    monkeypatch.setattr(live.LiveViewer, "__init__", recording_init)
    cfg = TrainConfig(
        synthetic_size=32, synthetic_train=6, synthetic_test=1, steps=STEPS, init_points=300,
        refine_start=40, refine_every=40, progress=False, lpips=False, save_renders=False,
        backend="torch", checkpoint_every=0, cache_dir=str(tmp_path / "cache"),
        run_dir=str(tmp_path / "run"), viewer_port=1,  # start_server below takes a free port
    )  # fmt: skip
    start = live.start_server
    monkeypatch.setattr(live, "start_server", lambda host, port, label: start(host, 0, label))
    result: dict = {}
    trainer = threading.Thread(
        target=lambda: result.update(out=train_run(cfg, log=lambda _: None)), daemon=True
    )
    trainer.start()
    try:
        viewer = wait_for(lambda: viewers and viewers[0], 60, "the training's viewer")
        with chromium(f"http://127.0.0.1:{viewer.port}/"):
            client = first_client(viewer.server)
            wait_for(lambda: viewer.pushes >= 1, 60, "the first model push")
            # Pause holds the trainer (and so the model the browser shows) for each picture.
            viewer.pause()
            wait_for(viewer.holding.is_set, 60, "the trainer to wait at the pause")
            held = viewer.step
            time.sleep(1.0)  # meanwhile the browser draws the last pushed model
            assert viewer.step == held  # the trainer waits between steps
            first_step, first = viewer.pushed_step, _shot(client, 160)
            assert foreground(first, first[0, 0]).mean() > 0.01  # the model is in view
            viewer.resume()
            wait_for(lambda: viewer.pushed_step >= first_step + 80, 90, "80 more steps")
            viewer.pause()
            wait_for(viewer.holding.is_set, 60, "the trainer to wait at the pause")
            time.sleep(1.0)
            later = _shot(client, 160)
            _save("viewer_training.png", _shot(client, 480))
            change = np.abs(later.astype(np.float64) - first.astype(np.float64)).mean()
            assert change > 0.5, change  # an unchanged model gives the same pixels (0)
            assert "step" in viewer.status.content and "Gaussians" in viewer.status.content
            viewer.resume()
        trainer.join(timeout=120)
        assert not trainer.is_alive() and result["out"][1]["step"] == STEPS
    finally:
        for v in viewers:
            v.close()
        trainer.join(timeout=60)
