"""``tilesplat view``: a viser server showing Gaussians in the browser, in one of two modes.

- ``splats``: the browser draws the Gaussians itself (viser's WebGL splat renderer: base
  colour only, 32 bytes per Gaussian sent once); smooth on any machine with a GPU browser.
- ``render``: tilesplat renders every browser camera on the server (view-dependent colour,
  exactly what training sees) and sends it as the background image. One worker thread per
  browser renders its newest camera and skips the ones that came in meanwhile; while the
  camera moves it renders at half the resolution and JPEG quality 50, then once more at
  full resolution and quality 90 when the camera has been still for ``SETTLE_S``.

viser is imported inside :func:`require_viser`, only when a server starts. The server binds
127.0.0.1 unless told otherwise and prints the URL and the ``ssh -L`` line for a remote
machine; it never opens viser's public share tunnel.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..constants import BACKENDS
from .lens import CAMERAS, ViewLens
from .scene import (
    VIEW_MODES,
    Gaussians,
    default_pose,
    intrinsics,
    render_view,
    splat_buffers,
    viewmat_from_pose,
)

MODES = ("splats", "render")
INSTALL_HINT = 'the viewer needs viser: pip install "tilesplat[viewer]"'
SETTLE_S = 0.25  # a camera still this long is "stopped": render at full quality
MOVING_SCALE = 0.5  # resolution factor while the camera moves
QUALITY_MOVING, QUALITY_STILL = 50, 90  # JPEG quality while moving / when stopped


def require_viser() -> Any:
    """The viser module, or ``ValueError`` with the one line that says what to install.

    A ``ValueError`` so that the CLI prints it as a user error (one line, exit status 2).
    """
    try:
        import viser
    except ImportError:
        raise ValueError(INSTALL_HINT) from None
    return viser


def access_lines(host: str, port: int) -> list[str]:
    """The URL to open and, for a remote machine, the ``ssh -L`` line that forwards it."""
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    lines = [f"open http://{shown}:{port} in a browser"]
    if host in ("127.0.0.1", "localhost", "::1"):
        lines.append(
            f"from another machine: ssh -N -L {port}:127.0.0.1:{port} USER@THIS_HOST, "
            f"then open http://localhost:{port}"
        )
    else:
        lines.append(f"listening on {host}:{port}: anyone who can reach it can view the model")
    return lines


def start_server(host: str, port: int, label: str) -> Any:
    """A started ``viser.ViserServer`` (no share tunnel); ``port`` 0 picks a free one."""
    viser = require_viser()
    return viser.ViserServer(host=host, port=port, label=label, verbose=False)


@dataclass
class _ClientView:
    """One browser's render-mode state: the newest camera and what was drawn last."""

    client: Any
    version: int = 0  # bumped by every camera or setting change
    changed_at: float = 0.0
    moving: bool = False
    drawn_version: int = -1
    drawn_full: bool = False
    wake: threading.Event | None = None


class ViewServer:
    """Serve Gaussians to browsers in ``splats`` or ``render`` mode (see the module docstring).

    Args:
        gaussians: the model (:mod:`tilesplat.viewer.scene`).
        mode: ``splats`` or ``render``.
        host, port: where to listen (port 0: a free port; see :attr:`port`).
        backend: render mode's rasterization backend (changeable in the panel).
        background: RGB in [0, 1] behind the model in render mode.
        max_side: render mode's full resolution: the longer image side in pixels.
        lens: render mode: the capture's lens to show the model through (``viewer/lens.py``;
            the panel's ``camera`` switches to a pinhole, and starts on it with ``pinhole``),
            or None (a pinhole).
        log: where the URL lines go.
    """

    def __init__(
        self,
        gaussians: Gaussians,
        mode: str = "splats",
        host: str = "127.0.0.1",
        port: int = 8080,
        backend: str = "auto",
        background: tuple[float, float, float] = (1.0, 1.0, 1.0),
        max_side: int = 640,
        antialiased: bool = False,
        lens: ViewLens | None = None,
        pinhole: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        self.mode = mode
        self.gaussians = gaussians
        self.background = background
        self.antialiased = antialiased
        self.lens, self._pinhole = lens, pinhole
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._views: dict[int, _ClientView] = {}
        self._threads: list[threading.Thread] = []
        self.frames = 0  # render mode: images sent, all browsers
        self.server = start_server(host, port, label="tilesplat")
        self.port = int(self.server.get_port())
        self.server.scene.set_up_direction("-y")  # 3DGS / COLMAP worlds: y points down
        wxyz, pos, look = default_pose(gaussians)
        self.server.initial_camera.position = tuple(pos)
        self.server.initial_camera.look_at = tuple(look)
        self._build_panel(backend, max_side)
        self.splats = None
        if mode == "splats":
            b = splat_buffers(gaussians)
            self.splats = self.server.scene.add_gaussian_splats(
                "/model", b.centers, b.covariances, b.rgbs, b.opacities
            )
        else:
            self.server.on_client_connect(self._connect)
            self.server.on_client_disconnect(self._disconnect)
        n = len(gaussians["means"])
        log(f"tilesplat view: {n} Gaussians, {mode} mode")
        for line in access_lines(host, self.port):
            log(line)

    # --- panel ---------------------------------------------------------------------------

    def _build_panel(self, backend: str, max_side: int) -> None:
        gui = self.server.gui
        n = len(self.gaussians["means"])
        if self.mode == "splats":
            gui.add_markdown(f"**{n} Gaussians**, drawn by the browser (base colour only)")
            return
        self.view_mode = gui.add_dropdown("view", VIEW_MODES, initial_value="RGB")
        side = int(max_side)  # the slider's range always holds the starting value
        self.max_side = gui.add_slider("resolution", min(64, side), max(2048, side), 16, side)
        self.backend = gui.add_dropdown("backend", BACKENDS, initial_value=backend)
        cameras = CAMERAS if self.lens else CAMERAS[1:]
        self.camera = gui.add_dropdown("camera", cameras,
                                       initial_value=cameras[-1] if self._pinhole else cameras[0])
        self.stats = gui.add_markdown(f"**{n} Gaussians**, rendered by tilesplat")
        for handle in (self.view_mode, self.max_side, self.backend, self.camera):
            handle.on_update(lambda _: self._touch_all())

    def _touch_all(self) -> None:
        with self._lock:
            views = list(self._views.values())
        for view in views:
            self._touch(view, moving=False)

    # --- render mode ---------------------------------------------------------------------

    def _connect(self, client: Any) -> None:
        view = _ClientView(client, wake=threading.Event())
        with self._lock:
            self._views[client.client_id] = view
        client.camera.on_update(lambda _: self._touch(view, moving=True))
        t = threading.Thread(target=self._render_loop, args=(view,), daemon=True)
        t.start()
        self._threads.append(t)

    def _disconnect(self, client: Any) -> None:
        with self._lock:
            view = self._views.pop(client.client_id, None)
        if view is not None and view.wake is not None:
            view.wake.set()

    def _touch(self, view: _ClientView, moving: bool) -> None:
        now = time.perf_counter()
        with self._lock:
            view.moving = moving and now - view.changed_at < SETTLE_S
            view.changed_at = now
            view.version += 1
        assert view.wake is not None
        view.wake.set()

    def _render_loop(self, view: _ClientView) -> None:
        assert view.wake is not None
        while not self._stop.is_set():
            with self._lock:
                alive = view.client.client_id in self._views
                version, moving = view.version, view.moving
                still_for = time.perf_counter() - view.changed_at
            if not alive:
                return
            if version != view.drawn_version:
                full = not moving
            elif not view.drawn_full and still_for >= SETTLE_S:
                full = True
            else:
                view.wake.wait(SETTLE_S / 2)
                view.wake.clear()
                continue
            try:
                drawn = self._draw(view, full)
            except Exception as exc:  # a closed browser, a backend that cannot run here
                drawn = True
                if view.client.client_id in self._views:
                    self.stats.content = f"render failed: {type(exc).__name__}: {exc}"
                    time.sleep(0.5)
            if not drawn:  # the browser has not reported its camera yet
                time.sleep(0.05)
                continue
            view.drawn_version, view.drawn_full = version, full

    def settled(self) -> bool:
        """Render mode: every connected browser has its newest camera drawn at full quality."""
        with self._lock:
            return all(v.drawn_version == v.version and v.drawn_full for v in self._views.values())

    def camera_image_size(self, client: Any) -> tuple[int, int]:
        """(width, height) to render for a browser: its canvas shape, longer side capped."""
        cam = client.camera
        w, h = max(1, int(cam.image_width)), max(1, int(cam.image_height))
        scale = min(1.0, int(self.max_side.value) / max(w, h))
        return max(1, round(w * scale)), max(1, round(h * scale))

    def _draw(self, view: _ClientView, full: bool) -> bool:
        """Render the browser's camera and send it; False when it has no camera yet."""
        cam = view.client.camera
        try:
            wxyz, position, fov = cam.wxyz, cam.position, cam.fov
            width, height = self.camera_image_size(view.client)
        except AssertionError:  # viser: no camera message from this browser yet
            return False
        if not full:
            width = max(1, round(width * MOVING_SCALE))
            height = max(1, round(height * MOVING_SCALE))
        t0 = time.perf_counter()
        capture = self.lens is not None and str(self.camera.value) == CAMERAS[0]
        lens = self.lens if capture or self.lens is None else self.lens.zero()
        image = render_view(
            self.gaussians,
            viewmat_from_pose(wxyz, position),
            lens.intrinsics(width, height) if capture else intrinsics(fov, width, height),
            width,
            height,
            mode=str(self.view_mode.value),
            backend=str(self.backend.value),
            background=self.background,
            antialiased=self.antialiased,
            lens=lens,
        )
        ms = 1000.0 * (time.perf_counter() - t0)
        view.client.scene.set_background_image(
            image, format="jpeg", jpeg_quality=QUALITY_STILL if full else QUALITY_MOVING
        )
        self.frames += 1
        n = len(self.gaussians["means"])
        self.stats.content = (
            f"**{n} Gaussians**, rendered by tilesplat  \n"
            f"{width}x{height}{'' if full else ' (moving)'}: {ms:.0f} ms, "
            f"{1000.0 / max(ms, 1e-3):.1f} FPS"
        )
        return True

    # --- both modes ----------------------------------------------------------------------

    def set_gaussians(self, gaussians: Gaussians) -> None:
        """Show other Gaussians (the count may change)."""
        self.gaussians = {k: v.detach().to("cpu", torch.float32) for k, v in gaussians.items()}
        if self.splats is not None:
            b = splat_buffers(self.gaussians)
            self.splats.set_gaussians(b.centers, b.covariances, b.rgbs, b.opacities)
        else:
            self._touch_all()

    def refresh(self) -> None:
        """Render mode: draw every browser again (after the server moved their cameras)."""
        self._touch_all()

    def clients(self) -> dict[int, Any]:
        """The connected browsers by id."""
        return dict(self.server.get_clients())

    def serve_forever(self) -> None:
        """Serve until Ctrl-C, then stop."""
        try:
            while not self._stop.is_set():
                time.sleep(0.5)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the render threads and the server."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            views = list(self._views.values())
        for view in views:
            if view.wake is not None:
                view.wake.set()
        for t in self._threads:
            t.join(timeout=5.0)
        self.server.stop()
