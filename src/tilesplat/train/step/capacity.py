"""The trainer's tile-intersection capacity: a step that never reads the count back.

In capacity mode (``isect_capacity = "auto"`` on the ``cuda`` backend in one process, no
training features) every render of a step sizes its intersection lists at a capacity
(``ops/intersect_capacity.py``) instead of reading the count from the device:

- **The capacity** is 1.15 x the largest count a batch of the training views can have: the
  sum of the ``batch_size`` largest per-view counts, measured over every training view (the
  projection and the tile count only; the render stops there) at the step's image size. It
  is measured again when the Gaussian count or the image size changes (a densification, a
  resolution level), which reads the counts once.
- **An overflow** (a render with more intersections than the capacity) fails the step's
  check, as a NaN does: fused Adam skips the step on the device, and the strategy's
  statistics see no Gaussian in its views (:meth:`StepCapacity.mask_info`). The flag is
  *sticky*: the steps queued after it are skipped too, until the host has read it (one step
  late) and cleared it. The host then grows the capacity to 1.15 x the largest count met and
  redoes the skipped steps, in order, with their own batches; since the skipped steps changed
  nothing, the run equals the exact one.
- **Before a strategy step that changes the model** (``Strategy.acts_at``: a densification,
  an opacity reset; such a step reads the device anyway) the trainer settles at once, so that
  no densification is made from a step that is to be redone.

Everything else (the CPU, a parallel job, training features, whose own optimisers cannot skip
a step on the device yet) keeps exact sizes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...keys import Key
from ...ops.deferred_checks import FiniteFlag
from ...ops.intersect_capacity import (
    OVERFLOW,
    IntersectionCounts,
    IsectCapacity,
    counting_intersections,
)
from .. import seams
from ..parallel.base import several_ranks
from .device import runs_cuda_kernels

HEADROOM = 1.15
BLOCKED = "intersection capacity (a step before it overflowed)"


KEYS = (Key("isect_capacity", "auto", "how the step sizes its tile-intersection lists: auto (on "
            "cuda, one process, no training feature: at a capacity, 1.15 x the largest count "
            "over the training views, so that the step reads nothing back; an overflow grows "
            "it and redoes the step) or exact (the count is read back each render; "
            "docs/gpu.md)", choices=("auto", "exact")),)
seams.register_keys("intersection capacity (train/step/capacity.py)", KEYS)


def capacity_applies(cfg: Any, device: torch.device, n_features: int) -> bool:
    """Whether the run sizes its intersection lists at a capacity (see the module docs)."""
    one_process = not several_ranks(cfg)
    return (cfg.isect_capacity == "auto" and runs_cuda_kernels(cfg, device) and one_process
            and n_features == 0)


class StepCapacity:
    """The capacity of the trainer's renders and the sticky overflow flag.

    Args:
        count_views: ``count_views(params, factor)`` -> [V] int64 the intersection count of
            every training view at the downscale ``factor`` (rendered inside
            :func:`counting_views`).
        batch_size: the images one step renders.
        device: where the flag lives.
        headroom: the capacity over the largest measured count (a test forces overflows
            with less than 1; growing after an overflow always uses :data:`HEADROOM`).
    """

    def __init__(self, count_views: Callable[[dict[str, Tensor], int], Tensor],
                 batch_size: int, device: torch.device, headroom: float = HEADROOM) -> None:
        self.count_views = count_views
        self.batch_size = batch_size
        self.headroom = headroom
        self.current: IsectCapacity | None = None
        self._key: tuple[int, int] | None = None
        self.blocked = torch.zeros((), dtype=torch.bool, device=device)
        self.grown = 0  # overflows met (the run's log says so)
        self.measured = 0  # capacity measurements

    def for_step(self, params: dict[str, Tensor], factor: int) -> IsectCapacity:
        """The capacity of a step at image downscale ``factor``; measured over the views when
        the Gaussian count or the factor changed since the last measurement."""
        key = (int(params["means"].shape[0]), int(factor))
        if self.current is None or key != self._key:
            counts = self.count_views(params, factor)
            top = torch.topk(counts, min(self.batch_size, counts.numel())).values
            self.current = IsectCapacity(max(1, math.ceil(self.headroom * int(top.sum()))))
            self._key = key
            self.measured += 1
        return self.current

    def begin_step(self, flag: FiniteFlag) -> None:
        """A step skips itself while an earlier step's overflow is not yet handled."""
        flag.record((BLOCKED,), (~self.blocked).reshape(1))
        if self.current is not None:
            self.current.new_step()

    def end_step(self) -> None:
        """Make the step's overflow sticky (no host read)."""
        cap = self.current
        if cap is not None and cap.overflow is not None:
            self.blocked |= cap.overflow  # in place: a CUDA graph replays it

    @staticmethod
    def mask_info(info: dict[str, Any], flag: FiniteFlag, device: torch.device
                  ) -> dict[str, Any]:
        """``info`` with no Gaussian seen (radii 0) when the step is skipped, so that a
        strategy's statistics are left as they were (a device op, no read)."""
        if "radii" not in info:
            return info
        keep = (flag.found_inf(device) == 0).to(info["radii"].dtype)
        return {**info, "radii": info["radii"] * keep}

    def grow(self) -> None:
        """After an overflow: 1.15 x the largest count met (one host read), at least one
        more than before; clears the sticky flag."""
        cap = self.current
        if cap is None:
            raise RuntimeError("grow() before a capacity was set")
        largest = cap.largest_count()
        self.current = IsectCapacity(max(math.ceil(HEADROOM * largest), cap.size + 1))
        self.blocked.zero_()
        self.grown += 1


def overflowed(bad_names: list[str]) -> bool:
    """Whether a step's failed checks are only the capacity's (its own overflow, or an
    earlier step's): such a step is redone, not reported."""
    return bool(bad_names) and set(bad_names) <= {OVERFLOW, BLOCKED}


def count_views(render: Callable[[list[int]], Any], n_views: int, batch_size: int,
                device: torch.device) -> Tensor:
    """[n_views] int64: the intersection count of each view, ``render(views)`` called on
    chunks of ``batch_size`` views inside :func:`counting_intersections` (it stops after the
    tile lists)."""
    counts = []
    with torch.no_grad(), counting_intersections():
        for start in range(0, n_views, batch_size):
            views = list(range(start, min(start + batch_size, n_views)))
            try:
                render(views)
            except IntersectionCounts as taken:
                counts.append(taken.counts.to(device))
            else:
                raise RuntimeError("the render did not reach its tile lists")
    return torch.cat(counts) if counts else torch.zeros(0, dtype=torch.int64, device=device)
