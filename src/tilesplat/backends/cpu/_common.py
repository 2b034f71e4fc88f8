"""Shared helpers of the CPU backend: output allocation (with a NaN-poison test mode), zero-copy
NumPy views of CPU tensors, and the scalar math compiled for the CPU.

Poison mode: with ``TILESPLAT_POISON=1`` in the environment (or :func:`set_poison(True)`),
every output buffer a launcher allocates is filled with NaN (integers with ``POISON_INT``)
instead of left uninitialised, so that a kernel that leaves memory unwritten fails the tests.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait

import numba
import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import shared
from . import buffer_pool
from .hugepages import advise_huge_pages

# Numba-IR inlining: the per-pair functions of the rasterizer's vectorised loops, and the
# per-Gaussian functions of the projection and SH kernels that LLVM left as calls
# (many-argument calls through Numba's exception protocol, per Gaussian): inlined, the
# projection's forward and backward at 1 M Gaussians take ~20 % and ~30 % less CPU time, the
# SH backward ~10 % less (docs/benchmarks.md). The rest are ordinary calls (LLVM may still
# inline them), which keeps compilation short.
INLINED = (
    "exp_neg", "gaussian_sigma",
    "project", "project_vjp", "transform_covar_vjp", "quat_scale_to_covar_vjp", "_rs_gram_vjp",
    "sh_basis", "sh_basis_vjp",
)


def _decorate(fn):
    # error_model="numpy": a float division by zero gives inf / nan instead of raising, so
    # loops with divisions keep no exception branch and can vectorise.
    if fn.__name__ in INLINED:
        return njit(inline="always", error_model="numpy")(fn)
    return njit(error_model="numpy")(fn)


sm = shared.build(_decorate, "tilesplat.backends.cpu._scalar")


@njit(inline="always", error_model="numpy")
def tile_span(t, th, tw, offs, n_isects):
    """Tile t of the rasterizer's flat [I * TH * TW] tiles: (image, tile row, tile column,
    first intersection, end of its intersections); ``offs`` [I * TH * TW] (the flattened
    ``isect_offsets``), ``n_isects`` the length of ``flatten_ids``."""
    img = t // (th * tw)
    rest = t - img * th * tw
    ty = rest // tw
    tx = rest - ty * tw
    end = offs[t + 1] if t + 1 < offs.shape[0] else n_isects
    return img, ty, tx, offs[t], end


@intrinsic
def prefetch(typingctx, arr, index):
    """prefetch(arr, i): asks the cache for the line holding element i of the flat C-contiguous
    array ``arr`` (a hint: no effect on results, never faults). For gathers whose indices are
    known ahead (``rasterize_bwd``'s reduce reads 1.3 M scattered rows on garden: without it,
    one cache miss after another)."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        idx = context.cast(builder, args[1], signature.args[1], types.intp)
        ptr = builder.bitcast(builder.gep(ary.data, [idx]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # read, high temporal locality, data cache
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, index), codegen


POISON_INT = -(2**31) + 7
_poison: dict[str, bool | None] = {"on": None}


def set_poison(enabled: bool | None) -> None:
    """Fills every output buffer with NaN (True), leaves it uninitialised (False), or follows
    ``TILESPLAT_POISON`` (None)."""
    _poison["on"] = enabled


def poison_enabled() -> bool:
    if _poison["on"] is not None:
        return bool(_poison["on"])
    return os.environ.get("TILESPLAT_POISON", "0") == "1"


def alloc(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An output buffer on the CPU, NaN-/sentinel-filled in poison mode; a large one is
    reused from :mod:`.buffer_pool` when it has one free, and backed by huge pages
    (:mod:`.hugepages`)."""
    out = buffer_pool.take(shape, dtype)
    if out is None:
        out = torch.empty(shape, dtype=dtype)
        advise_huge_pages(out)
    if poison_enabled():
        out.fill_(float("nan") if dtype.is_floating_point else POISON_INT)
    return out


def view(t: torch.Tensor) -> np.ndarray:
    """Zero-copy NumPy view of a contiguous CPU tensor (bool stays bool)."""
    return (t.detach() if t.requires_grad else t).numpy()


# ---------------------------------------------------------------------------------------------
# threads
#
# Kernels are plain ``@njit(nogil=True, cache=True, error_model="numpy")`` functions over work
# items ``first, first + step, ...`` (tiles, or fixed blocks of Gaussians), run on ``step``
# Python threads (the caller and ``step - 1`` of a pool). Numba's ``parallel=True`` would do the
# same but costs ~5 s of compilation per kernel and dtype; the work split is fixed by the items,
# so results never depend on the thread count.

BLOCK = 1024  # rows per work item of the per-Gaussian kernels

_pool: list[ThreadPoolExecutor] = []


def num_threads() -> int:
    """Threads used by the kernels: Numba's setting (``NUMBA_NUM_THREADS``,
    ``numba.set_num_threads``)."""
    return max(1, int(numba.get_num_threads()))


def parallel_for(kernel, n_items: int, *args) -> None:
    """Runs ``kernel(first, step, *args)`` for first = 0 .. step-1 on ``step`` threads, where
    ``step = min(num_threads(), n_items)``; the kernel processes items first, first + step, ...

    The calling thread runs ``first = 0`` itself, the pool the rest: one hand-off fewer a call
    (each costs tens of microseconds of a thread's wake-up), and the caller's core stays busy
    instead of waiting. Every part has finished when it returns, also when one raised."""
    torch_threads = torch.get_num_threads()
    step = min(num_threads(), n_items)
    if step <= 1:
        kernel(0, 1, *args)
    else:
        if not _pool or _pool[0]._max_workers < step - 1:
            _pool[:] = [ThreadPoolExecutor(max_workers=step - 1,
                                           thread_name_prefix="tilesplat-cpu")]
        futures = [_pool[0].submit(kernel, first, step, *args) for first in range(1, step)]
        try:
            kernel(0, step, *args)
        finally:
            wait(futures)
        for f in futures:
            f.result()
    if torch.get_num_threads() != torch_threads:
        # Numba's OpenMP layer, started by the first kernel, sets the process's OpenMP thread
        # count, which is torch's intra-op pool: keep the caller's (OMP_NUM_THREADS=1 or
        # torch.set_num_threads(1) on a shared machine, where torch ops with more threads than
        # free cores ran ~30x slower: Adam of 300 Gaussians took 40 ms instead of 0.1 ms).
        torch.set_num_threads(torch_threads)
