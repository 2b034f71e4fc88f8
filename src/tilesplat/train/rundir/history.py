"""The training log: loss, PSNR and Gaussian count per logged step, test PSNR per evaluation.

It is ``history.json`` in the run folder and part of every checkpoint (``history`` and
``window``), so that a resumed run continues the same log.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from ...io.atomic import atomic_write_bytes
from ..step.metrics import psnr_of_mse

HISTORY_KEYS = ("step", "time", "loss", "psnr", "gaussians", "test_step", "test_time", "test_psnr")
WINDOW_LENGTHS = (3,)  # the window's lengths a checkpoint may hold


class TrainingLog:
    """The history (lists under :data:`HISTORY_KEYS`) and the window of steps since the last
    logged one: loss sum, PSNR sum, steps.

    The steps' numbers stay on the training device until a logged step reads them back in
    one transfer, so that a step on the GPU waits for no number.
    """

    def __init__(self, history: dict | None = None, window: list | None = None) -> None:
        history = history or {}
        self.history: dict[str, list[float]] = {k: list(history.get(k, [])) for k in HISTORY_KEYS}
        self.window = list(window) if window is not None else [0.0, 0.0, 0]
        self._pending: list[tuple[Tensor, Tensor]] = []  # (loss [], squared error [])

    def flush(self) -> None:
        """Add the pending steps' loss and PSNR to the window (one read-back)."""
        if not self._pending:
            return
        numbers = torch.stack([torch.stack([loss.double(), mse]) for loss, mse in self._pending])
        self._pending = []
        for loss, mse in numbers.tolist():
            self.window[0] += loss
            self.window[1] += psnr_of_mse(mse)
            self.window[2] += 1

    def record(self, step: int, loss: Tensor, mse: Tensor, logged: bool, elapsed: float,
               n_gaussians: int) -> None:
        """Keep step ``step``'s loss [] and squared error [] (float64); on a ``logged`` step
        append the window's means, the time and the Gaussian count to the history."""
        self._pending.append((loss, mse))
        if logged:
            self.flush()
            n = self.window[2]
            self.history["step"].append(step)
            self.history["time"].append(round(elapsed, 3))
            self.history["loss"].append(self.window[0] / n)
            self.history["psnr"].append(self.window[1] / n)
            self.history["gaussians"].append(n_gaussians)
            self.window = [0.0, 0.0, 0]

    def record_test(self, step: int, elapsed: float, psnr: float) -> None:
        """A test PSNR measured during training."""
        self.history["test_step"].append(step)
        self.history["test_time"].append(round(elapsed, 3))
        self.history["test_psnr"].append(psnr)

    def write(self, path: Path) -> None:
        """``history.json`` (atomically)."""
        atomic_write_bytes(path, json.dumps(self.history, indent=1).encode("utf-8"))
