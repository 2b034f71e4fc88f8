"""Warp intrinsics (and an exact ``fma``) for numba's CUDA simulator, which has none.

The simulator runs every thread of a block as a Python thread and emulates ``syncthreads``
but not ``shfl_*_sync``/``any_sync``/``ballot_sync``. The kernels of this backend use them
only with the full mask in warp-uniform control flow, so a barrier over the lanes of a warp
gives the hardware's result. Installed once, when the backend is imported under
``NUMBA_ENABLE_CUDASIM=1``; nothing here runs on a GPU.
"""

from __future__ import annotations

import threading
from fractions import Fraction

import numpy as np

_lock = threading.Lock()
WARP = 32


class _Warp:
    """Two slot buffers used in turn, so that one barrier per exchange suffices: a lane
    writes buffer p again only after every lane has passed the next exchange's barrier, hence
    has finished reading buffer p."""

    def __init__(self, lanes: int) -> None:
        self.barrier = threading.Barrier(lanes)
        self.slots: tuple[list, list] = ([None] * WARP, [None] * WARP)
        self.phase = [0] * WARP


def _exchange(value):
    """Publishes this lane's value and returns (lane, the 32 slots of its warp)."""
    thread = threading.current_thread()
    manager = thread._manager
    dims = manager._block_dim
    nthreads = int(dims[0]) * int(dims[1]) * int(dims[2])
    warp_id, lane = divmod(thread.thread_id, WARP)
    with _lock:
        warps = getattr(manager, "_tilesplat_warps", None)
        if warps is None:
            warps = manager._tilesplat_warps = {}
        key = (tuple(thread.blockIdx), warp_id)
        if key not in warps:
            warps[key] = _Warp(min(WARP, nthreads - warp_id * WARP))
        warp = warps[key]
    phase = warp.phase[lane]
    warp.phase[lane] = 1 - phase
    slots = warp.slots[phase]
    slots[lane] = value
    warp.barrier.wait()
    return lane, slots


def _shfl_xor_sync(self, mask, value, lane_mask):
    lane, slots = _exchange(value)
    src = lane ^ lane_mask
    return slots[src] if src < len(slots) and slots[src] is not None else value


def _shfl_down_sync(self, mask, value, delta):
    lane, slots = _exchange(value)
    src = lane + delta
    return slots[src] if src < WARP and slots[src] is not None else value


def _any_sync(self, mask, predicate):
    _, slots = _exchange(bool(predicate))
    return any(s for s in slots if s is not None)


def _all_sync(self, mask, predicate):
    _, slots = _exchange(bool(predicate))
    return all(s for s in slots if s is not None)


def _fma(self, a, b, c):
    """``a * b + c`` rounded once, as the hardware's ``fma`` (the simulator's own rounds the
    product first, which breaks the exact-product trick of the per_splat backward)."""
    if isinstance(a, np.float32):
        return np.float32(float(a) * float(b) + float(c))  # the float64 product is exact
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    return type(a)(float(exact))


def install() -> None:
    """Adds the warp intrinsics and an exact ``fma`` to the simulator's fake ``cuda``
    module (idempotent)."""
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    FakeCUDAModule.fma = _fma
    FakeCUDAModule.shfl_xor_sync = _shfl_xor_sync
    FakeCUDAModule.shfl_down_sync = _shfl_down_sync
    FakeCUDAModule.any_sync = _any_sync
    FakeCUDAModule.all_sync = _all_sync
