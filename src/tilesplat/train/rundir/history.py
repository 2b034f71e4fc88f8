"""The training log: loss, PSNR and Gaussian count per logged step, test PSNR per evaluation.

It is ``history.json`` in the run folder and part of every checkpoint (``history`` and
``window``), so that a resumed run continues the same log.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import Tensor

from ...io.atomic import atomic_write_bytes
from ...io.json_file import strict_json_bytes
from ..step.metrics import psnr_of_mse

HISTORY_KEYS = ("step", "time", "loss", "psnr", "gaussians", "test_step", "test_time", "test_psnr")
WINDOW_LENGTHS = (3, 4)  # the window's lengths a checkpoint may hold (3: before its PSNR count)


class TrainingLog:
    """The history (lists under :data:`HISTORY_KEYS`) and the window of steps since the last
    logged one: loss sum, PSNR sum, steps, steps whose PSNR is defined (a step whose views'
    masks keep no pixel has none).

    The steps' numbers stay on the training device until a logged step reads them back in
    one transfer, so that a step on the GPU waits for no number.
    """

    def __init__(self, history: dict | None = None, window: list | None = None) -> None:
        history = history or {}
        self.history: dict[str, list[float]] = {k: list(history.get(k, [])) for k in HISTORY_KEYS}
        self.window = list(window) if window is not None else [0.0, 0.0, 0, 0]
        if len(self.window) == 3:  # a checkpoint from before the PSNR count: every step's
            self.window.append(self.window[2])
        self._pending: list[tuple[Tensor, Tensor]] = []  # (loss [], squared error [])

    def flush(self) -> None:
        """Add the pending steps' loss and PSNR to the window (one read-back)."""
        if not self._pending:
            return
        numbers = torch.stack([torch.stack([loss.double(), mse]) for loss, mse in self._pending])
        self._pending = []
        for loss, mse in numbers.tolist():
            self.window[0] += loss
            self.window[2] += 1
            if not math.isnan(mse):  # NaN: no pixel of the step's views counted
                self.window[1] += psnr_of_mse(mse)
                self.window[3] += 1

    def record(self, step: int, loss: Tensor, mse: Tensor, logged: bool, elapsed: float,
               n_gaussians: int) -> None:
        """Keep step ``step``'s loss [] and squared error [] (float64); on a ``logged`` step
        append the window's means, the time and the Gaussian count to the history (the PSNR
        is NaN when no step of the window had one)."""
        self._pending.append((loss, mse))
        if logged:
            self.flush()
            n, n_psnr = self.window[2], self.window[3]
            self.history["step"].append(step)
            self.history["time"].append(round(elapsed, 3))
            self.history["loss"].append(self.window[0] / n)
            self.history["psnr"].append(self.window[1] / n_psnr if n_psnr else math.nan)
            self.history["gaussians"].append(n_gaussians)
            self.window = [0.0, 0.0, 0, 0]

    def record_test(self, step: int, elapsed: float, psnr: float) -> None:
        """A test PSNR measured during training."""
        self.history["test_step"].append(step)
        self.history["test_time"].append(round(elapsed, 3))
        self.history["test_psnr"].append(psnr)

    def write(self, path: Path) -> list[str]:
        """``history.json`` (atomically), every number that is not finite (an undefined PSNR)
        written as ``null``; returns where those are (``psnr[3]``)."""
        data, nulled = strict_json_bytes(self.history)
        atomic_write_bytes(path, data)
        return nulled
