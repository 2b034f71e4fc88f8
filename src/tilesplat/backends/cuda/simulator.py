"""Warp intrinsics (and an exact ``fma``) for numba's CUDA simulator, which has none, and a
race-free ``cuda.shared.array``.

The simulator runs every thread of a block as a Python thread and emulates ``syncthreads``
but not ``shfl_*_sync``/``any_sync``/``ballot_sync``. The kernels of this backend use them
only with the full mask in warp-uniform control flow, so a barrier over the lanes of a warp
gives the hardware's result.

The simulator hands out a block's shared arrays by call site (file and line): the first
thread to reach the line allocates, the others look the array up. numba-cuda 0.30 does the
look-up and the store without a lock, so two threads of a block that reach the line at once
can each allocate their own array; one of them then reads an uninitialised buffer where the
block wrote its batch (seen as an out-of-range Gaussian id in ``rasterize_fwd``, once in a CI
run; ~1 round in 8 of 64 threads released together). Here the look-up and the allocation
hold one lock. Installed once, when the backend is imported under
``NUMBA_ENABLE_CUDASIM=1``; nothing here runs on a GPU.
"""

from __future__ import annotations

import sys
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


_shared_lock = threading.Lock()


def _shared_array(self, shape, dtype, alignment=None):
    """``cuda.shared.array`` with the look-up and the allocation under one lock, so that every
    thread of the block gets the one array of its call site (dynamic shared memory, shape 0,
    is one buffer already and goes to the simulator's own)."""
    if shape == 0 or alignment is not None:
        return _simulator_shared_array(self, shape, dtype, alignment)
    from numba.cuda.simulator import kernelapi

    if isinstance(dtype, kernelapi.types.Type):
        dtype = kernelapi.numpy_support.as_dtype(dtype)
    caller = sys._getframe(1)
    site = (caller.f_code.co_filename, caller.f_lineno)
    with _shared_lock:
        arr = self._allocations.get(site)
        if arr is None:
            arr = self._allocations[site] = np.empty(shape, dtype)
    return arr


_simulator_shared_array = None


def install() -> None:
    """Adds the warp intrinsics and an exact ``fma`` to the simulator's fake ``cuda``
    module, makes its shared arrays race-free and its barriers poll-free
    (:mod:`.simulator_blocks`) (idempotent)."""
    global _simulator_shared_array
    from numba.cuda.simulator.kernelapi import FakeCUDAModule, FakeCUDAShared

    from .simulator_blocks import install as install_blocks

    install_blocks()

    if FakeCUDAShared.array is not _shared_array:
        _simulator_shared_array = FakeCUDAShared.array
        FakeCUDAShared.array = _shared_array

    FakeCUDAModule.fma = _fma
    FakeCUDAModule.shfl_xor_sync = _shfl_xor_sync
    FakeCUDAModule.shfl_down_sync = _shfl_down_sync
    FakeCUDAModule.any_sync = _any_sync
    FakeCUDAModule.all_sync = _all_sync
