"""The next step's training frames, made while this step runs.

A step's frames cost the main thread more than their decoding: an RGBA image is composited on
its background at every access (``data/composite.py``, ~0.2 ms at 200x200), and on the
resolution schedule's coarse steps averaged down (``train/features/resolution.py``, ~0.15-0.3
ms). On the CPU the trainer hands the next step's frames to a decoding thread when it has
queued this step (:meth:`FramesAhead.submit`) and takes them, made, at the next step
(:meth:`FramesAhead.take`): the compositing kernel and torch's average run without the GIL,
beside the step's own work, and make the same values. On a GPU the thread only decodes (the
frames' tensors are on the device, where the step's stream orders the work).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future
from typing import NamedTuple

import torch

from ...data.dataset import Frame
from ...data.image_cache import pool
from ...data.pixels import HeldPixels, prefetch
from ..features.resolution import CoarseFrames


def made(frame: Frame) -> Frame:
    """``frame`` holding its image and alpha (decoded, composited), the rest shared."""
    if isinstance(frame.pixels, HeldPixels):
        return frame
    image, alpha = frame.image_and_alpha()
    return dataclasses.replace(frame, image=image, alpha=alpha)


class _Pending(NamedTuple):
    """Frames submitted for ``step`` at ``factor``: their ``job`` (None where only decoded)."""

    step: int
    factor: int
    indices: list[int]
    job: Future[list[Frame]] | None


class FramesAhead:
    """The frames of one step ahead (see the module).

    Args:
        coarse: the training frames at the schedule's sizes.
        device: the training device; on the CPU the frames are made ahead, elsewhere only
            decoded.
    """

    def __init__(self, coarse: CoarseFrames, device: torch.device) -> None:
        self.coarse = coarse
        self.make_ahead = device.type == "cpu"
        self._next: _Pending | None = None

    def frames(self, indices: Sequence[int], factor: int) -> list[Frame]:
        """The frames ``indices`` at 1 / ``factor`` of their size, made now."""
        return [made(self.coarse.frame(i, factor)) for i in indices]

    def submit(self, step: int, indices: list[int], factor: int) -> None:
        """Start making step ``step``'s frames ``indices`` at ``factor`` (decoding only, on
        a GPU)."""
        if self.make_ahead:
            job = pool().submit(self.frames, list(indices), factor)
        else:
            prefetch(self.coarse.frames[i].pixels for i in indices)
            job = None
        self._next = _Pending(step, factor, list(indices), job)

    def take(self, step: int, factor: int) -> tuple[list[int], list[Frame]] | None:
        """(indices, frames) of ``step`` when they were submitted for it at ``factor``, made
        (an error of their making raised here); None otherwise."""
        pending, self._next = self._next, None
        if pending is None or (pending.step, pending.factor) != (step, factor):
            return None
        if pending.job is None:
            return pending.indices, self.frames(pending.indices, factor)
        return pending.indices, pending.job.result()
