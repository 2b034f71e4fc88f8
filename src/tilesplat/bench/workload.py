"""What the bench times on a scene: its staged passes' Gaussians and cameras, each arm's
training step, and the defaults that go with them.

Two kinds, one interface (:class:`Workload`), so that :func:`.runner.run_bench` never asks
which it has: :class:`SceneWorkload`, a scene of :mod:`tilesplat.data.scenes` trained by the
bench's :class:`~.stages.TrainStep`, and :class:`.replay.RunWorkload`, a training run whose
step is the trainer's own. :func:`.dispatch.open_workload` picks one by the scene's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from ..data.scenes import Scene, load_scene
from .arms import Arm
from .stages import Inputs, TrainStep
from .timing import StageTimer


class Workload(Protocol):
    """What :func:`.runner.run_bench` times on a scene (see the module docstring)."""

    counts: dict[str, int]  # defaults of iters, repeats and warmup

    def settings(self, sh_degree: int, tile_size: int) -> tuple[int, int]:
        """The SH degree and tile size to render with (a run has its own)."""
        ...

    def load(self, dtype: torch.dtype) -> Scene:
        """The Gaussians and cameras of the staged passes, in ``dtype``."""
        ...

    def make_step(self, inp: Inputs, arm: Arm) -> Callable[[StageTimer], None]:
        """One arm's training step; each call is one step, timed on the timer it is given."""
        ...

    def step_parts(self, arms: list[Arm]) -> tuple[str, ...]:
        """The parts of the step timed inside ``step`` for these arms (none, or names)."""
        ...

    def scene_info(self) -> dict[str, Any]:
        """What the report's ``scene`` holds beyond the scene's size (a run: ``run``)."""
        ...


class SceneWorkload:
    """A scene of :func:`~tilesplat.data.scenes.load_scene` (``garden``,
    ``synthetic:N:WxH``) or a :class:`Scene`, trained by the bench's ``TrainStep``:
    rasterization forward + backward + Adam under the shared upstream gradient."""

    counts = {"iters": 3, "repeats": 3, "warmup": 1}

    def __init__(self, scene: Scene | str) -> None:
        self.scene = scene

    def settings(self, sh_degree: int, tile_size: int) -> tuple[int, int]:
        return sh_degree, tile_size

    def load(self, dtype: torch.dtype) -> Scene:
        sc = self.scene
        return load_scene(sc, dtype=dtype) if isinstance(sc, str) else sc

    def make_step(self, inp: Inputs, arm: Arm) -> Callable[[StageTimer], None]:
        return TrainStep(inp, arm)

    def step_parts(self, arms: list[Arm]) -> tuple[str, ...]:
        return ()

    def scene_info(self) -> dict[str, Any]:
        return {}
