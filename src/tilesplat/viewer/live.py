"""The live view of a training run: ``tilesplat train --set viewer_port=PORT``.

The trainer calls :meth:`LiveViewer.after_step` after every step. With no browser connected
that is one attribute read, so training runs at its usual speed (docs/viewer.md has the
measurement). While a browser is connected, every ``PUSH_S`` seconds the trainer thread
copies the Gaussians (a detached clone: densification replaces the tensors, so the copy is
made where they change) into a one-slot mailbox, and the viewer's own thread turns the
newest copy into splat buffers and sends it; a slow browser makes it skip copies, never
slows a step. The panel shows step, loss, PSNR and the Gaussian count, with Pause / Resume:
paused, the trainer waits between steps (Ctrl-C still stops it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from torch import Tensor

from .scene import Gaussians, default_pose, gaussians_from_params, splat_buffers
from .server import access_lines, start_server

PUSH_S = 2.0  # seconds between model pushes while a browser is connected
PANEL_S = 0.5  # seconds between panel updates


class LiveViewer:
    """A viser server that shows the model a trainer is optimising (splats mode).

    Args:
        port: where to listen (0: a free port, see :attr:`port`).
        host: the interface (127.0.0.1 by default: reach it through ``ssh -L``).
        log: where the URL lines go.
        push_s: seconds between model pushes while a browser is connected (default
            ``PUSH_S``).
    """

    def __init__(
        self,
        port: int,
        host: str = "127.0.0.1",
        log: Callable[[str], None] = print,
        push_s: float | None = None,
    ) -> None:
        self.push_s = PUSH_S if push_s is None else push_s
        self.server = start_server(host, port, label="tilesplat train")
        self.port = int(self.server.get_port())
        self.server.scene.set_up_direction("-y")
        self.has_clients = False  # the trainer's fast path reads only this
        self.paused = threading.Event()
        self.holding = threading.Event()  # set while the trainer waits at the pause
        self.pushes = 0  # models sent to browsers
        self.pushed_step = -1
        self.step = -1  # the newest step seen while a browser was connected or paused
        self._stop = threading.Event()
        self._mail: tuple[int, Gaussians] | None = None
        self._mail_ready = threading.Event()
        self._last_push = -float("inf")
        self._last_panel = -float("inf")
        self._splats: Any = None
        gui = self.server.gui
        self.status = gui.add_markdown("waiting for the first step")
        self.pause_button = gui.add_button("Pause")
        self.resume_button = gui.add_button("Resume", visible=False)
        self.pause_button.on_click(lambda _: self.pause())
        self.resume_button.on_click(lambda _: self.resume())
        self.server.on_client_connect(self._clients_changed)
        self.server.on_client_disconnect(self._clients_changed)
        self._thread = threading.Thread(target=self._send_loop, daemon=True)
        self._thread.start()
        log(f"live view of the training at http://127.0.0.1:{self.port}")
        for line in access_lines(host, self.port)[1:]:
            log(line)

    def _clients_changed(self, _: Any) -> None:
        self.has_clients = bool(self.server.get_clients())
        if self.has_clients:
            self._last_push = -float("inf")  # a new browser gets the model at the next step

    def pause(self) -> None:
        """Hold the trainer before its next step."""
        self.paused.set()
        self.pause_button.visible, self.resume_button.visible = False, True

    def resume(self) -> None:
        """Let the trainer continue."""
        self.paused.clear()
        self.pause_button.visible, self.resume_button.visible = True, False

    def after_step(
        self,
        step: int,
        loss: float,
        psnr: float,
        params: dict[str, Tensor],
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Called by the trainer after each step (on its thread); returns at once unless a
        browser is connected or the view is paused."""
        if not self.has_clients and not self.paused.is_set():
            return
        self.step = step
        now = time.perf_counter()
        if now - self._last_panel >= PANEL_S or self.paused.is_set():
            self._last_panel = now
            state = " (paused)" if self.paused.is_set() else ""
            self.status.content = (
                f"**step {step}**{state}  \nloss {loss:.4f}  \nPSNR {psnr:.2f} dB  \n"
                f"{len(params['means'])} Gaussians"
            )
        if self.has_clients and now - self._last_push >= self.push_s:
            self._last_push = now
            self._mail = (step, gaussians_from_params(params))
            self._mail_ready.set()
        if self.paused.is_set():
            self.holding.set()
            while self.paused.is_set() and not stop() and not self._stop.is_set():
                time.sleep(0.1)
            self.holding.clear()

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            if not self._mail_ready.wait(0.2):
                continue
            self._mail_ready.clear()
            mail, self._mail = self._mail, None
            if mail is None:
                continue
            step, g = mail
            try:
                self._send(g)
            except Exception as exc:  # keep serving: the next push may well go through
                self.status.content = f"sending the model failed: {type(exc).__name__}: {exc}"
                continue
            self.pushed_step = step
            self.pushes += 1

    def _send(self, g: Gaussians) -> None:
        b = splat_buffers(g)
        if self._splats is None:
            self._splats = self.server.scene.add_gaussian_splats(
                "/model", b.centers, b.covariances, b.rgbs, b.opacities
            )
            self._aim_cameras(g)
        else:
            self._splats.set_gaussians(b.centers, b.covariances, b.rgbs, b.opacities)

    def _aim_cameras(self, g: Gaussians) -> None:
        """Point the browsers (and Reset View) at the first model pushed."""
        _, position, look = default_pose(g)
        self.server.initial_camera.position = tuple(position)
        self.server.initial_camera.look_at = tuple(look)
        for client in self.server.get_clients().values():
            client.camera.position = tuple(position)
            client.camera.look_at = tuple(look)

    def close(self) -> None:
        """Stop the sending thread and the server."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5.0)
        self.server.stop()
