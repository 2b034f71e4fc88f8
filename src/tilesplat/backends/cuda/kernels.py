"""Catalogue of every kernel of the backend with its argument types, for ahead-of-time
checks: ``numba.cuda.compile_ptx`` compiles each one for a given compute capability without
a GPU (``tests/test_cuda_ptx.py``). The launchers compile the same kernel bodies lazily, on
first use, for the device they run on; their arguments have exactly these types (Python
ints are int64, floats float64, bools boolean; tensors C-contiguous).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba.core import types as nt

from ...constants import TILE_SIZE  # what the PTX checks compile for (kernels take any)
from .covariance import make_covar_bwd, make_covar_fwd
from .indices import make_indices_2dgs
from .intersect import isect_offset_encode_kernel, make_isect_count, make_isect_fill
from .projection import make_projection_bwd, make_projection_fwd
from .rasterize_bwd import make_bwd_per_pixel, make_bwd_per_splat
from .rasterize_fwd import make_rasterize_fwd
from .segment import make_segment_sum
from .sh import make_sh_bwd, make_sh_fwd
from .twodgs_projection import make_projection_2dgs_bwd, make_projection_2dgs_fwd
from .twodgs_rasterize_bwd import make_rasterize_2dgs_bwd
from .twodgs_rasterize_fwd import make_rasterize_2dgs_fwd
from .ut_projection import make_ut_projection
from .ut_rasterize_bwd import make_ut_rasterize_bwd
from .ut_rasterize_fwd import make_ut_rasterize_fwd

CHANNELS = 3


def _arr(dtype, ndim: int):
    return nt.Array(dtype, ndim, "C")


@dataclass(frozen=True)
class KernelSpec:
    """A kernel body builder and its argument types for one float type."""

    name: str
    body: Callable[[type], Callable]  # np.float32 / np.float64 -> Python kernel body
    args: Callable[[nt.Type], tuple]  # numba float type -> argument types
    float_types: tuple = (np.float32, np.float64)
    # computes in float64 whatever the data's type (the 2DGS kernels: their ray-plane
    # intersection is ill-conditioned in float32, see twodgs_rasterize_fwd)
    float64_inside: bool = False


def _raster_common(F):
    b, i64, i32 = nt.boolean, nt.int64, nt.int32
    return (_arr(F, 2), _arr(F, 2), _arr(F, 2), _arr(F, 1), _arr(F, 2), b, _arr(b, 3), b,
            i64, i64, _arr(i32, 1), _arr(i32, 1), i64, i64, i64)  # fmt: skip


def _raster_grads(F):
    return (_arr(F, 2), _arr(F, 2), _arr(F, 2), _arr(F, 1), _arr(F, 2))


def _fwd_args(F):
    return _raster_common(F) + (_arr(F, 4), _arr(F, 4), _arr(nt.int32, 3), _arr(F, 4))


def _per_pixel_args(F):
    b = nt.boolean
    return (_raster_common(F) + (_arr(F, 4), _arr(F, 4), b, _arr(nt.int32, 3), _arr(F, 4),
            _arr(F, 4), b, b) + _raster_grads(F))  # fmt: skip


def _per_splat_args(F):
    return (_raster_common(F) + (_arr(F, 4), _arr(F, 4), _arr(F, 4), nt.boolean)
            + _raster_grads(F))  # fmt: skip


def raster_spec(kernel: str, tile_size: int, channels: int, variant: int = 0) -> KernelSpec:
    """A rasterization kernel in any configuration the launchers allow: ``kernel`` is
    ``forward`` (``variant``: what it keeps, ``rasterize_fwd.KEEP_*``), ``per_pixel`` or
    ``per_splat`` (``variant``: the splat batch, 32 or 256)."""
    name = f"{kernel}-t{tile_size}-c{channels}-v{variant}"
    if kernel == "forward":
        return KernelSpec(name, lambda ft: make_rasterize_fwd(ft, tile_size, channels, variant),
                          _fwd_args)
    if kernel == "per_pixel":
        return KernelSpec(name, lambda ft: make_bwd_per_pixel(ft, tile_size, channels),
                          _per_pixel_args)
    if kernel == "per_splat":
        return KernelSpec(name, lambda ft: make_bwd_per_splat(ft, tile_size, channels, variant),
                          _per_splat_args)
    raise ValueError(f"kernel must be forward, per_pixel or per_splat, got {kernel!r}")


def block_threads(kernel: str, tile_size: int, variant: int = 0) -> int:
    """Threads per block the launchers use for ``kernel`` (also its launch bound)."""
    return variant if kernel == "per_splat" else tile_size * tile_size


def _count_args(F):
    i64 = nt.int64
    return (_arr(F, 2), _arr(nt.int32, 2), _arr(F, 2), _arr(F, 1), i64, i64, i64, i64, i64,
            _arr(nt.int32, 1))  # fmt: skip


def _fill_args(F):
    i64, i32 = nt.int64, nt.int32
    return (_arr(F, 2), _arr(i32, 2), _arr(F, 2), _arr(F, 1), i64, i64, _arr(i64, 1),
            _arr(i32, 1), nt.boolean, i64, i64, i64, i64, i64, _arr(i64, 1), _arr(i64, 1),
            _arr(i32, 1))  # fmt: skip


def _offset_args(F):
    i64 = nt.int64
    return (_arr(i64, 1), i64, i64, _arr(nt.int32, 1))


def _proj_fwd_args(F):
    b, i64, f64 = nt.boolean, nt.int64, nt.float64
    return (_arr(F, 3), _arr(F, 3), _arr(F, 3), _arr(F, 3), b, _arr(F, 2), b, _arr(F, 4),
            _arr(F, 4), i64, i64, f64, f64, f64, f64, b, i64, _arr(nt.int32, 4), _arr(F, 4),
            _arr(F, 3), _arr(F, 4), _arr(F, 3))  # fmt: skip


def _proj_bwd_args(F):
    b, i64 = nt.boolean, nt.int64
    return (_arr(F, 3), _arr(F, 3), _arr(F, 3), _arr(F, 3), b, _arr(F, 4), _arr(F, 4), i64,
            i64, nt.float64, i64, _arr(nt.int32, 4), _arr(F, 4), _arr(F, 3), _arr(F, 4),
            _arr(F, 3), b, b, _arr(F, 3), _arr(F, 3), _arr(F, 3), _arr(F, 3),
            _arr(F, 4))  # fmt: skip


def _covar_fwd_args(F):
    b = nt.boolean
    return (_arr(F, 2), _arr(F, 2), b, b, b, _arr(F, 2), _arr(F, 2))


def _covar_bwd_args(F):
    b = nt.boolean
    return (_arr(F, 2), _arr(F, 2), _arr(F, 2), b, _arr(F, 2), b, b, _arr(F, 2), _arr(F, 2))


def _sh_fwd_args(F):
    b = nt.boolean
    return (nt.int64, _arr(F, 2), _arr(F, 3), _arr(F, 3), _arr(b, 1), b, _arr(F, 2))


def _sh_bwd_args(F):
    b = nt.boolean
    return (nt.int64, _arr(F, 2), _arr(F, 3), _arr(F, 3), _arr(b, 1), b, _arr(F, 2), b,
            _arr(F, 3), _arr(F, 3), _arr(F, 2))  # fmt: skip


def _segment_args(F):
    return (_arr(F, 2), _arr(nt.int64, 1), _arr(F, 2))


def _proj_2dgs_fwd_args(F):
    f64 = nt.float64
    return (_arr(F, 3), _arr(F, 3), _arr(F, 3), _arr(F, 4), _arr(F, 4), f64, f64, f64, f64,
            f64, _arr(nt.int32, 4), _arr(F, 4), _arr(F, 3), _arr(F, 5),
            _arr(F, 4))  # fmt: skip


def _proj_2dgs_bwd_args(F):
    return (_arr(F, 3), _arr(F, 3), _arr(F, 3), _arr(F, 4), _arr(F, 4), _arr(nt.int32, 4),
            _arr(F, 4), _arr(F, 3), _arr(F, 5), _arr(F, 4),
            _arr(nt.float64, 4))  # fmt: skip


def _raster_2dgs_common(F):
    b, i64, i32 = nt.boolean, nt.int64, nt.int32
    return (_arr(F, 2), _arr(F, 3), _arr(F, 2), _arr(F, 1), _arr(F, 2), _arr(F, 2), _arr(F, 2),
            b, _arr(b, 3), b, i64, i64, _arr(i32, 1), _arr(i32, 1), i64, i64,
            i64)  # fmt: skip


def _raster_2dgs_fwd_args(F):
    i32 = nt.int32
    return _raster_2dgs_common(F) + (
        _arr(F, 4), _arr(F, 4), _arr(F, 4), _arr(F, 4), _arr(F, 4), _arr(F, 3), _arr(i32, 3),
        _arr(i32, 3), _arr(nt.float64, 3))  # fmt: skip


def _raster_2dgs_bwd_args(F):
    i32 = nt.int32
    return _raster_2dgs_common(F) + (
        _arr(F, 3), _arr(i32, 3), _arr(i32, 3), _arr(nt.float64, 3), _arr(F, 4), _arr(F, 4),
        _arr(F, 4), _arr(F, 4), _arr(F, 4), _arr(nt.float64, 2))  # fmt: skip


def _indices_2dgs_args(F):
    i64, i32 = nt.int64, nt.int32
    return (i64, i64, _arr(F, 3), _arr(F, 2), _arr(F, 3), _arr(F, 1), _arr(F, 2), _arr(F, 2),
            i64, i64, i64, _arr(i32, 1), _arr(i32, 1), i64, i64, i64, _arr(i32, 1),
            _arr(i64, 1), _arr(i64, 1), _arr(i64, 1), _arr(i64, 1))  # fmt: skip


TWODGS_KERNELS = ("forward", "backward", "backward_det")


def twodgs_raster_spec(kernel: str, tile_size: int, channels: int) -> KernelSpec:
    """A 2DGS rasterization kernel (``TWODGS_KERNELS``) in any configuration the launchers
    allow; its block is ``tile_size**2`` threads."""
    name = f"twodgs_rasterize_{kernel}-t{tile_size}-c{channels}"
    if kernel == "forward":
        return KernelSpec(name, lambda ft: make_rasterize_2dgs_fwd(ft, tile_size, channels),
                          _raster_2dgs_fwd_args, float64_inside=True)
    if kernel in ("backward", "backward_det"):
        det = kernel == "backward_det"
        return KernelSpec(
            name, lambda ft: make_rasterize_2dgs_bwd(ft, tile_size, channels, det),
            _raster_2dgs_bwd_args, float64_inside=True)
    raise ValueError(f"kernel must be one of {TWODGS_KERNELS}, got {kernel!r}")


def _raster_ut_common(F):
    b, i64, i32 = nt.boolean, nt.int64, nt.int32
    return (_arr(F, 2), _arr(F, 2), _arr(F, 2), _arr(F, 2), _arr(F, 1), _arr(F, 2), b,
            _arr(b, 3), b, i64, i64, i64, i64, _arr(i32, 1), _arr(i32, 1), i64, i64, i64,
            _arr(F, 4))  # fmt: skip


def _raster_ut_fwd_args(F):
    return _raster_ut_common(F) + (_arr(F, 4), _arr(F, 4), _arr(nt.int32, 3))


def _raster_ut_bwd_args(F):
    return _raster_ut_common(F) + (_arr(nt.int32, 3), _arr(F, 4), _arr(F, 4),
                                   _arr(nt.float64, 2))


def _ut_proj_args(F):
    b, i64, f64 = nt.boolean, nt.int64, nt.float64
    return (_arr(F, 3), _arr(F, 3), _arr(F, 3), _arr(F, 2), b, _arr(f64, 3), i64, _arr(f64, 1),
            i64, b, f64, i64, i64, f64, f64, f64, f64, f64, f64, f64, f64, b,
            _arr(nt.int32, 4), _arr(F, 4), _arr(F, 3), _arr(F, 4), _arr(F, 3))  # fmt: skip


UT_KERNELS = ("forward", "backward", "backward_det")


def ut_raster_spec(kernel: str, tile_size: int, channels: int) -> KernelSpec:
    """A 3DGUT eval3d rasterization kernel (``UT_KERNELS``) in any configuration the launchers
    allow; its block is ``tile_size**2`` threads. The pair's power is float64 whatever the
    data's type (``ut_rasterize_fwd``)."""
    name = f"ut_rasterize_{kernel}-t{tile_size}-c{channels}"
    if kernel == "forward":
        return KernelSpec(name, lambda ft: make_ut_rasterize_fwd(ft, tile_size, channels),
                          _raster_ut_fwd_args, float64_inside=True)
    if kernel in ("backward", "backward_det"):
        det = kernel == "backward_det"
        return KernelSpec(
            name, lambda ft: make_ut_rasterize_bwd(ft, tile_size, channels, det),
            _raster_ut_bwd_args, float64_inside=True)
    raise ValueError(f"kernel must be one of {UT_KERNELS}, got {kernel!r}")


KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec("rasterize_fwd", lambda ft: make_rasterize_fwd(ft, TILE_SIZE, CHANNELS), _fwd_args),
    KernelSpec("rasterize_fwd_keep_sum",
               lambda ft: make_rasterize_fwd(ft, TILE_SIZE, CHANNELS, 2), _fwd_args),
    KernelSpec("rasterize_bwd_per_pixel", lambda ft: make_bwd_per_pixel(ft, TILE_SIZE, CHANNELS),
               _per_pixel_args),
    KernelSpec("rasterize_bwd_per_splat_32",
               lambda ft: make_bwd_per_splat(ft, TILE_SIZE, CHANNELS, 32), _per_splat_args),
    KernelSpec("rasterize_bwd_per_splat_256",
               lambda ft: make_bwd_per_splat(ft, TILE_SIZE, CHANNELS, 256), _per_splat_args),
    # the deterministic option's variants (a row per intersection and warp) and their sum
    KernelSpec("rasterize_bwd_per_pixel_det",
               lambda ft: make_bwd_per_pixel(ft, TILE_SIZE, CHANNELS, True), _per_pixel_args),
    KernelSpec("rasterize_bwd_per_splat_32_det",
               lambda ft: make_bwd_per_splat(ft, TILE_SIZE, CHANNELS, 32, True), _per_splat_args),
    KernelSpec("segment_sum", make_segment_sum, _segment_args),
    KernelSpec("isect_count", make_isect_count, _count_args),
    KernelSpec("isect_fill", make_isect_fill, _fill_args),
    # rasterization()'s lists: the tile test runs in float64 (shared.tiles) for any data type
    KernelSpec("isect_count_tight", lambda ft: make_isect_count(ft, True), _count_args,
               float64_inside=True),
    KernelSpec("isect_fill_tight", lambda ft: make_isect_fill(ft, True), _fill_args,
               float64_inside=True),
    KernelSpec("isect_offset_encode", lambda ft: isect_offset_encode_kernel, _offset_args,
               (np.float32,)),
    KernelSpec("projection_fwd", make_projection_fwd, _proj_fwd_args),
    KernelSpec("projection_bwd", make_projection_bwd, _proj_bwd_args),
    KernelSpec("projection_bwd_det", lambda ft: make_projection_bwd(ft, True), _proj_bwd_args),
    KernelSpec("covar_fwd", make_covar_fwd, _covar_fwd_args),
    KernelSpec("covar_bwd", make_covar_bwd, _covar_bwd_args),
    KernelSpec("sh_fwd", make_sh_fwd, _sh_fwd_args),
    KernelSpec("sh_bwd", make_sh_bwd, _sh_bwd_args),
    # 2DGS (surfels); channels 4: RGB + depth, as the trainer renders them
    KernelSpec("twodgs_projection_fwd", make_projection_2dgs_fwd, _proj_2dgs_fwd_args,
               float64_inside=True),
    KernelSpec("twodgs_projection_bwd", make_projection_2dgs_bwd, _proj_2dgs_bwd_args,
               float64_inside=True),
    twodgs_raster_spec("forward", TILE_SIZE, CHANNELS + 1),
    twodgs_raster_spec("backward", TILE_SIZE, CHANNELS + 1),
    twodgs_raster_spec("backward_det", TILE_SIZE, CHANNELS + 1),
    KernelSpec("twodgs_indices_count", lambda ft: make_indices_2dgs(ft, TILE_SIZE, False),
               _indices_2dgs_args, float64_inside=True),
    KernelSpec("twodgs_indices_fill", lambda ft: make_indices_2dgs(ft, TILE_SIZE, True),
               _indices_2dgs_args, float64_inside=True),
    # 3DGUT: the unscented projection (float64 inside, as the cpu kernel) and eval3d
    KernelSpec("ut_projection", make_ut_projection, _ut_proj_args, float64_inside=True),
    ut_raster_spec("forward", TILE_SIZE, CHANNELS),
    ut_raster_spec("backward", TILE_SIZE, CHANNELS),
    ut_raster_spec("backward_det", TILE_SIZE, CHANNELS),
)


def compile_ptx(spec: KernelSpec, ft: type, cc: tuple[int, int],
                threads: int | None = None) -> str:
    """The PTX of one kernel for float type ``ft`` and compute capability ``cc``;
    ``threads``: the launch bound the launchers compile it with (``runtime.jit``)."""
    from numba import cuda

    F = nt.float32 if ft is np.float32 else nt.float64
    ptx, _ = cuda.compile_ptx(spec.body(ft), spec.args(F), cc=cc, launch_bounds=threads)
    return ptx
