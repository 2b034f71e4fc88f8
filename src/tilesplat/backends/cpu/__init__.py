"""The ``cpu`` backend: multithreaded Numba kernels for CPU tensors.

Importing this package compiles nothing: every kernel is an ``@njit(cache=True)`` function
that compiles on its first call (and loads from Numba's on-disk cache in later processes;
``backends.kernel_cache`` invalidates that cache when code compiled into a kernel changes).
Work is split into fixed items (tiles for the rasterizer, blocks of Gaussians elsewhere) run on
``numba.get_num_threads()`` threads (``_common.parallel_for``); reductions run in a fixed
order, so gradients are bit-identical for any thread count. ``TILESPLAT_POISON=1`` fills
output buffers with NaN before the kernels run (a test mode; see ``_common``).
"""

from ..kernel_cache import install as _install_kernel_cache

_install_kernel_cache()  # before the kernels below are decorated with cache=True

from ..registry import DiffOp, register  # noqa: E402
from . import (  # noqa: E402
    covariance,
    intersect,
    projection,
    projection_2dgs,
    projection_bwd,
    rasterize_2dgs_bwd,
    rasterize_bwd,
    rasterize_fwd,
    sh,
    ssim,
)

register("quat_scale_to_covar_preci", "cpu", DiffOp(covariance.forward, covariance.backward))
register("fully_fused_projection", "cpu", DiffOp(projection.forward, projection_bwd.backward))
register("spherical_harmonics", "cpu", DiffOp(sh.forward, sh.backward))
register("isect_tiles", "cpu", intersect.isect_tiles)
register("isect_offset_encode", "cpu", intersect.isect_offset_encode)
register("rasterize_to_pixels", "cpu", DiffOp(rasterize_fwd.forward, rasterize_bwd.backward))
register("fully_fused_projection_2dgs", "cpu", projection_2dgs.project)
register("rasterize_to_pixels_2dgs", "cpu", rasterize_2dgs_bwd.rasterize)
register("ssim", "cpu", DiffOp(ssim.forward, ssim.backward))
