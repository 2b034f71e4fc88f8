"""TensorBoard events of a run (``tensorboard = true``): ``RUN/tensorboard/events.out.tfevents.*``.

``tensorboard --logdir runs/`` then shows every run. What is written, and when:

- at every logged step (``log_every``), from the training log (``history.json``): ``train/loss``
  and ``train/psnr`` (the means over the steps since the last logged one, the numbers
  history.json holds), ``train/gaussians``, ``train/steps_per_second`` (steps over training
  seconds since the previous logged step: the time history.json records, evaluation and
  checkpoints excluded) and ``lr/<parameter>`` (each optimiser's rate at that step);
- at every evaluation (``eval_every``): ``test/psnr`` and the renders of the first
  :data:`TEST_VIEWS` test views as images ``test/<view>``.

The numbers are the training log's: it reads them back from the device once per logged step,
so the board adds no host sync to a step on the GPU. Only the process that writes the run
(rank 0 of a job) writes events; the others hold :data:`NO_BOARD`, which does nothing.

A resumed run appends to the same folder: the writer starts a new event file with a purge step
one past the checkpoint's step, so TensorBoard's reader drops what the interrupted run wrote
after that checkpoint, and no step is shown twice. A run that turns the board on at resume
(its folder has no events yet) first writes the scalars history.json already holds.

The writer is torch's ``torch.utils.tensorboard.SummaryWriter``: it ships with torch, takes
images as [H, W, 3] tensors and has the purge step; it needs only the ``tensorboard`` package
(the ``tensorboard`` extra), which whoever reads the events has anyway. It is imported when the
board opens, never by ``import tilesplat``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...keys import Key
from .. import seams

if TYPE_CHECKING:
    from ...data.frames import Frame
    from ..config import TrainConfig

FOLDER = "tensorboard"  # under the run folder
TEST_VIEWS = 4  # test views shown as images at each evaluation: a few, so events stay small
INSTALL = 'pip install "tilesplat[tensorboard]"'


def tensorboard_installed() -> bool:
    """Whether the ``tensorboard`` package can be imported (found without importing it)."""
    return importlib.util.find_spec("tensorboard") is not None


KEYS = (Key("tensorboard", False, "write TensorBoard events to RUN/tensorboard (loss, PSNR, "
            "Gaussian count, learning rates, steps/s; the test PSNR and a few test renders every "
            "eval_every steps) for tensorboard --logdir runs/ (pip install "
            "\"tilesplat[tensorboard]\"; docs/training.md)"),)


def tensorboard_errors(cfg: TrainConfig) -> list[str]:
    """Why ``tensorboard = true`` cannot run here (empty when it can, or when it is off)."""
    if cfg.tensorboard and not tensorboard_installed():
        return [f"tensorboard = true needs the tensorboard package: {INSTALL}"]
    return []


seams.register_keys("TensorBoard (train/loop/tensorboard.py)", KEYS, tensorboard_errors)


class NullBoard:
    """The board of a run without TensorBoard, and of the ranks that write nothing."""

    test_views = 0

    def record(self, history: dict[str, list[float]], optimizers: dict[str, Any]) -> None:
        """Write what the training log added since the last call (nothing here)."""

    def add_renders(self, step: int, params: dict[str, Tensor], frames: Sequence[Frame],
                    cfg: TrainConfig, background: Sequence[float]) -> None:
        """Write the renders of the first test views (nothing here)."""

    def close(self) -> None:
        """Flush and close the event file (nothing here)."""


NO_BOARD = NullBoard()


class TensorBoard(NullBoard):
    """The events of one run folder, written as the training log grows.

    Args:
        run_dir: the run folder; events go to ``run_dir/tensorboard``.
        step: the step the training starts from (a resumed run's checkpoint step, else 0).
        history: the training log's lists as they are now (a resumed run's).
    """

    test_views = TEST_VIEWS

    def __init__(self, run_dir: str | Path, step: int, history: dict[str, list[float]]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard missing (validate() says so earlier)
            raise ValueError(f"tensorboard = true needs the tensorboard package: {INSTALL}"
                             ) from exc
        folder = Path(run_dir) / FOLDER
        fresh = not any(folder.glob("events.out.tfevents.*"))
        # events past the checkpoint we resume from were written by the interrupted run
        self.writer = SummaryWriter(str(folder), purge_step=step + 1 if step > 0 else None)
        # a fresh folder shows the steps the history already holds; else they are there
        self.written = 0 if fresh else len(history["step"])
        self.tested = 0 if fresh else len(history["test_step"])

    def record(self, history: dict[str, list[float]], optimizers: dict[str, Any]) -> None:
        """Write the logged steps and test PSNRs the history gained since the last call; the
        learning rates are the optimisers' now (so the newest logged step's)."""
        steps, times = history["step"], history["time"]
        add = self.writer.add_scalar
        for i in range(self.written, len(steps)):
            step = int(steps[i])
            add("train/loss", history["loss"][i], step)
            add("train/psnr", history["psnr"][i], step)
            add("train/gaussians", history["gaussians"][i], step)
            prev_step, prev_time = (steps[i - 1], times[i - 1]) if i else (0, 0.0)
            if times[i] > prev_time:
                add("train/steps_per_second", (step - prev_step) / (times[i] - prev_time), step)
            if i == len(steps) - 1:
                for name, opt in optimizers.items():
                    add(f"lr/{name}", opt.param_groups[0]["lr"], step)
        self.written = len(steps)
        for i in range(self.tested, len(history["test_step"])):
            add("test/psnr", history["test_psnr"][i], int(history["test_step"][i]))
        self.tested = len(history["test_step"])

    @torch.no_grad()
    def add_renders(self, step: int, params: dict[str, Tensor], frames: Sequence[Frame],
                    cfg: TrainConfig, background: Sequence[float]) -> None:
        """The first :data:`TEST_VIEWS` of ``frames`` rendered by ``params``, as images
        ``test/<frame name>`` at ``step``."""
        from ..rundir.evaluate import render_frame

        for frame in frames[: self.test_views]:
            image = render_frame(params, frame, cfg, background).cpu()  # [H, W, 3]
            self.writer.add_image(f"test/{frame.name}", image, step, dataformats="HWC")

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def open_board(cfg: TrainConfig, run_dir: str | Path, step: int,
               history: dict[str, list[float]], writes: bool) -> NullBoard:
    """The run's board: a :class:`TensorBoard` when ``cfg.tensorboard`` is on and this process
    ``writes`` the run, else :data:`NO_BOARD`."""
    if not (cfg.tensorboard and writes):
        return NO_BOARD
    return TensorBoard(run_dir, step, history)
