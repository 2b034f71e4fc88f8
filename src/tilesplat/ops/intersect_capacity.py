"""Tile-intersection lists at a fixed capacity: the trainer's step without the count read.

``isect_tiles`` sizes its lists by the number of intersections, which it must read from the
device: on a GPU the host then waits for the projection to finish, once per render. Inside
:func:`intersection_capacity` a backend that can (``takes_capacity`` on its launcher: the
``cuda`` backend) allocates the lists at the given capacity instead, reads nothing, and gives
every step the same shapes (what a CUDA graph needs). Backends that cannot keep exact sizes.

The count is still computed on the device (the sum of ``tiles_per_gauss``):
:class:`IsectCapacity` keeps the largest one met (a device tensor, not read) and records
"count <= capacity" as one more check of the step's :class:`.deferred_checks.FiniteFlag`, so
that an overflowing step is skipped on the device like a step with a NaN, and the trainer,
reading the flag one step late, grows the capacity and redoes it (``train/step/capacity.py``).

:func:`counting_intersections` is the other use: a render inside it stops after the tile
lists with :class:`IntersectionCounts`, which carries the count of every image, so that the
trainer can size the capacity from all its views without rasterizing them.

Outside both contexts (every direct call of the public ops) the lists have exact sizes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor

from .deferred_checks import current_flag

OVERFLOW = "intersection capacity"  # the name an overflow is reported under


class IsectCapacity:
    """The capacity of the tile-intersection lists of a render (``size`` entries).

    ``largest`` (0-dim int64 on the renders' device, None before the first) is the largest
    count met; ``overflow`` (0-dim bool, None before the first render since
    :meth:`new_step`) whether a count exceeded ``size``. Neither is read unless asked
    (:meth:`largest_count`, after an overflow).
    """

    def __init__(self, size: int) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"capacity must be a positive int, got {size!r}")
        self.size = size
        self.largest: Tensor | None = None
        self.overflow: Tensor | None = None

    def observe(self, count: Tensor) -> None:
        """Record one render's intersection count (0-dim int64), and on the step's flag the
        check that it fits (no host read)."""
        over = count > self.size
        self.largest = count if self.largest is None else torch.maximum(self.largest, count)
        self.overflow = over if self.overflow is None else self.overflow | over
        flag = current_flag()
        if flag is not None:
            flag.record((OVERFLOW,), (~over).reshape(1))

    def new_step(self) -> None:
        """Forget whether the renders so far overflowed (``largest`` stays)."""
        self.overflow = None

    def largest_count(self) -> int:
        """The largest count met (a host read), 0 when none was."""
        return 0 if self.largest is None else int(self.largest)


class IntersectionCounts(Exception):  # noqa: N818 (a result carried out of the render)
    """Raised by a render inside :func:`counting_intersections` once its tile lists are
    known: ``counts`` [I] int64, the intersections of each of its I images."""

    def __init__(self, counts: Tensor) -> None:
        super().__init__("intersection counts")
        self.counts = counts


_CAPACITY: contextvars.ContextVar[IsectCapacity | None] = contextvars.ContextVar(
    "tilesplat_isect_capacity", default=None
)
_COUNTING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tilesplat_isect_counting", default=False
)


@contextlib.contextmanager
def intersection_capacity(capacity: IsectCapacity | None) -> Iterator[IsectCapacity | None]:
    """Inside, ``isect_tiles`` sizes its lists at ``capacity`` where the backend can (None:
    exact sizes, as outside)."""
    token = _CAPACITY.set(capacity)
    try:
        yield capacity
    finally:
        _CAPACITY.reset(token)


@contextlib.contextmanager
def counting_intersections() -> Iterator[None]:
    """Inside, a render raises :class:`IntersectionCounts` after its tile lists."""
    token = _COUNTING.set(True)
    try:
        yield
    finally:
        _COUNTING.reset(token)


def current_capacity() -> IsectCapacity | None:
    """The capacity of the enclosing :func:`intersection_capacity`, or None."""
    return _CAPACITY.get()


def counting() -> bool:
    """Whether the enclosing code only counts intersections (:func:`counting_intersections`)."""
    return _COUNTING.get()
