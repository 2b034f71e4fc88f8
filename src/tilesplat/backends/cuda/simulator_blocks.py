"""A block of numba's CUDA simulator run without polling: ``syncthreads`` as a counting
barrier that the threads release themselves.

The simulator runs each thread of a block as a Python thread. Its block manager finds a
barrier's end by polling every live thread in a loop (``is_alive`` and a flag, for each thread
in turn), and that loop holds the GIL the block's threads need: a 16 x 16 tile's backward of
30 Gaussians spent 130 s of a 134 s step there (10 M ``is_alive`` calls), which put the
simulator's training-step test past its 600 s limit in CI.

Here a block shares one :class:`_Block`: a thread that reaches ``syncthreads`` waits on a
condition until every thread still running has arrived, and the last to arrive (or a thread
that ends, when the others all wait) opens the barrier for the next round. The launching
thread only joins the block's threads. The semantics are the simulator's: a barrier counts the
threads still running, so threads that returned early do not hold the others; a thread that
raises aborts the others' barriers, and the first exception is raised from the launch with
the thread's ``tid``/``ctaid``. Nothing here runs on a GPU.
"""

from __future__ import annotations

import threading

import numpy as np


class _Block:
    """The barrier of one block: ``live`` threads still running, ``arrived`` of them waiting,
    ``round`` counting the barriers opened (a waiter leaves when it changes)."""

    def __init__(self, live: int) -> None:
        self.cond = threading.Condition()
        self.live = live
        self.arrived = 0
        self.round = 0
        self.failed = False

    def _open(self) -> None:  # with cond held
        self.arrived = 0
        self.round += 1
        self.cond.notify_all()

    def wait(self) -> None:
        """``syncthreads``: returns once every running thread of the block has called it."""
        with self.cond:
            if self.failed:
                raise RuntimeError("another thread of the block failed")
            self.arrived += 1
            if self.arrived == self.live:
                self._open()
                return
            mine = self.round
            while self.round == mine and not self.failed:
                self.cond.wait()
            if self.failed:
                raise RuntimeError("another thread of the block failed")

    def leave(self, failed: bool) -> None:
        """A thread's end: it no longer counts at the barrier (and aborts it if it failed)."""
        with self.cond:
            self.live -= 1
            if failed:
                self.failed = True
                self.cond.notify_all()
            elif self.arrived and self.arrived == self.live:
                self._open()


def _syncthreads(self) -> None:
    self._manager._tilesplat_block.wait()


def _run_block(self, grid_point, *args) -> None:
    """``BlockManager.run``: starts the block's threads, joins them, raises the first error."""
    from numba.cuda.simulator.kernel import BlockThread

    points = list(np.ndindex(*self._block_dim))
    block = self._tilesplat_block = _Block(len(points))

    def target() -> None:
        failed = True
        try:
            self._f(*args)
            failed = False
        finally:
            block.leave(failed)

    threads = [BlockThread(target, self, grid_point, p, self._debug) for p in points]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [t.exception for t in threads if t.exception is not None]
    # the failing thread's own error, not the aborts it caused in the others
    first = next((e for e in errors if "another thread of the block failed" not in str(e[0])),
                 errors[0] if errors else None)
    if first is not None:
        raise first[0].with_traceback(first[1])


def install() -> bool:
    """Puts the counting barrier into the simulator (idempotent). False, leaving the
    simulator's own polling, where this numba-cuda's block manager is not the one described
    above."""
    from numba.cuda.simulator import kernel

    manager, thread = getattr(kernel, "BlockManager", None), getattr(kernel, "BlockThread", None)
    if manager is None or thread is None or not hasattr(manager, "run") or not hasattr(
            thread, "syncthreads"):
        return False
    manager.run = _run_block
    thread.syncthreads = _syncthreads
    return True
