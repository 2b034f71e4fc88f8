"""Headless Chromium for the viewer tests: started on a loopback URL with a fresh profile,
ended by its PID (and its process group) in every case."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = os.environ.get("TILESPLAT_CHROMIUM", "/usr/bin/chromium")
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # WebGL on the CPU (SwiftShader) once --disable-gpu has taken the GPU away
    "--enable-unsafe-swiftshader",
    "--mute-audio", "--disable-extensions", "--hide-scrollbars",
)  # fmt: skip
WINDOW = (640, 480)


def require_browser() -> None:
    """Skip without viser or Chromium, unless TILESPLAT_REQUIRE_BROWSER=1 (CI): then fail."""
    missing = []
    try:
        import viser  # noqa: F401
    except ImportError:
        missing.append('viser (pip install "tilesplat[viewer]")')
    if not Path(CHROMIUM).is_file():
        missing.append(f"Chromium at {CHROMIUM} (apt-get install chromium)")
    if missing:
        msg = "browser tests need " + " and ".join(missing)
        if os.environ.get("TILESPLAT_REQUIRE_BROWSER") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def _end(proc: subprocess.Popen) -> None:
    """End the browser by its PID: SIGTERM to its group (renderer, GPU process), then
    SIGKILL after 5 s."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children left behind by a clean exit


@contextlib.contextmanager
def chromium(url: str, log: Path | None = None) -> Iterator[subprocess.Popen]:
    """Headless Chromium showing ``url`` (loopback only) with a fresh profile."""
    assert url.startswith(("http://127.0.0.1:", "http://localhost:")), url
    profile = tempfile.mkdtemp(prefix="tilesplat-chromium-")
    err = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
         f"--window-size={WINDOW[0]},{WINDOW[1]}", url],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
        start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        _end(proc)
        if log:
            err.close()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(cond: Callable[[], object], timeout: float, what: str, every: float = 0.05):
    """Poll ``cond`` until it is truthy (returns its value) or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def first_client(server, timeout: float = 30.0):
    """The first browser connected to a viser server, once its camera has reported."""
    client = wait_for(lambda: next(iter(server.get_clients().values()), None), timeout,
                      "the browser to connect")  # fmt: skip

    def camera_known() -> bool:
        try:
            return client.camera.image_width > 0
        except AssertionError:
            return False

    wait_for(camera_known, timeout, "the browser's camera")
    return client


def foreground(image: np.ndarray, background: np.ndarray, threshold: int = 40) -> np.ndarray:
    """[H, W] bool: pixels that differ from ``background`` (RGB) by more than ``threshold``."""
    diff = np.abs(image[..., :3].astype(np.int16) - background.astype(np.int16)).max(-1)
    return diff > threshold


def centroid(mask: np.ndarray) -> np.ndarray:
    """(x, y) of the pixel centres in ``mask``."""
    ys, xs = np.nonzero(mask)
    return np.array([xs.mean() + 0.5, ys.mean() + 0.5])
