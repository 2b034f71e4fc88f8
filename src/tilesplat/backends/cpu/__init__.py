"""The ``cpu`` backend: multithreaded Numba kernels for CPU tensors.

Importing this package compiles nothing: every kernel is an ``@njit(cache=True)`` function
that compiles on its first call (and loads from Numba's on-disk cache in later processes;
``backends.kernel_cache`` invalidates that cache when code compiled into a kernel changes).
Work is split into fixed items (tiles for the rasterizer, blocks of Gaussians elsewhere) run on
``numba.get_num_threads()`` threads (``_common.parallel_for``); reductions run in a fixed
order, so gradients are bit-identical for any thread count. ``TILESPLAT_POISON=1`` fills
output buffers with NaN before the kernels run (a test mode; see ``_common``).

Layout (``backends/registry.py``): ``<op module>.py`` holds an op's launchers, after its kernels
for the small ops (``covariance``, ``sh``, ``intersect``, ``ssim``); the large ones keep their
kernels in ``<op module>_<part>.py`` (``projection_fwd``, ``rasterize_bwd``,
``twodgs_rasterize_fwd``, ...; ``twodgs`` is the 2DGS autograd wiring). ``_common`` and ``cull``
serve several ops; the scalar math is ``backends/shared/``, compiled by ``_common``.
"""

from ..kernel_cache import install as _install_kernel_cache
from ..vector_width import prefer_wide_vectors as _prefer_wide_vectors

_install_kernel_cache()  # before the kernels below are decorated with cache=True
_prefer_wide_vectors()  # before Numba makes its target (the first compile or cache load)

from ..registry import DiffOp, register  # noqa: E402
from . import covariance, intersect, projection, rasterize, sh, ssim, twodgs, ut  # noqa: E402

# One line an op (the scheme: ``backends/registry.py``).
register("quat_scale_to_covar_preci", "cpu", DiffOp(covariance.forward, covariance.backward))
register("fully_fused_projection", "cpu", DiffOp(projection.forward, projection.backward))
register("spherical_harmonics", "cpu", DiffOp(sh.forward, sh.backward))
register("isect_tiles", "cpu", intersect.isect_tiles)
register("isect_tiles_tight", "cpu", intersect.isect_tiles_tight)
register("isect_offset_encode", "cpu", intersect.isect_offset_encode)
register("rasterize_to_pixels", "cpu", DiffOp(rasterize.forward, rasterize.backward))
register("fully_fused_projection_2dgs", "cpu", twodgs.fully_fused_projection_2dgs)
register("rasterize_to_pixels_2dgs", "cpu", twodgs.rasterize_to_pixels_2dgs)
register("ssim", "cpu", DiffOp(ssim.forward, ssim.backward))
register("fully_fused_projection_with_ut", "cpu", ut.project_with_ut)
register("rasterize_to_pixels_eval3d", "cpu", DiffOp(ut.forward, ut.backward))
