"""The ``cuda`` backend: numba-cuda kernels fed through ``__cuda_array_interface__`` on
PyTorch's current stream, compiled on first use by the NVVM of the pip packages.

Under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) the same kernels run on CPU tensors,
which is how CI checks them without a GPU. Options for benchmarks: :func:`set_options`
(``warp_skip``, ``splat_batch``, ``exact_transmittance``; see :mod:`.runtime`).

Layout (``backends/registry.py``): ``<op module>.py`` holds an op's launchers, and for the
small ops its kernel bodies too (``covariance``, ``projection``, ``sh``, ``intersect``);
``rasterize`` launches the kernels of ``rasterize_fwd`` and ``rasterize_bwd``. ``kernels``
lists every kernel for the PTX checks; ``device_math`` compiles ``backends/shared/``.
"""

try:
    import numba_cuda  # noqa: F401 - the numba.cuda target of the [cuda] extra
except ImportError as exc:  # the registry reports it: backend 'cuda' unavailable
    raise ImportError(
        f"backend 'cuda' needs numba-cuda: pip install 'tilesplat[cuda]' ({exc})"
    ) from exc

from ..numpy_aliases import restore_numpy_aliases  # noqa: E402

restore_numpy_aliases()  # before numba.cuda registers its NumPy overloads

from .runtime import check_numba_cuda_version  # noqa: E402

check_numba_cuda_version(getattr(numba_cuda, "__version__", "0"))

from ..registry import DiffOp, register  # noqa: E402
from . import (  # noqa: E402
    covariance,
    indices,
    intersect,
    projection,
    rasterize,
    sh,
    ssim,
    twodgs,
    ut,
)
from .runtime import (  # noqa: E402
    SIMULATOR,
    get_options,
    launch_stats,
    reset_launch_stats,
    reset_options,
    set_options,
)

if SIMULATOR:
    from .simulator import install as _install_warp_intrinsics

    _install_warp_intrinsics()

# One line an op (the scheme: ``backends/registry.py``).
register("quat_scale_to_covar_preci", "cuda", DiffOp(covariance.forward, covariance.backward))
register("fully_fused_projection", "cuda", DiffOp(projection.forward, projection.backward))
register("spherical_harmonics", "cuda", DiffOp(sh.forward, sh.backward))
register("isect_tiles", "cuda", intersect.isect_tiles)
register("isect_tiles_tight", "cuda", intersect.isect_tiles_tight)
register("isect_offset_encode", "cuda", intersect.isect_offset_encode)
register("rasterize_to_pixels", "cuda", DiffOp(rasterize.forward, rasterize.backward))
register("fully_fused_projection_2dgs", "cuda", twodgs.fully_fused_projection_2dgs)
register("rasterize_to_pixels_2dgs", "cuda", twodgs.rasterize_to_pixels_2dgs)
register("rasterize_to_indices_in_range_2dgs", "cuda", indices.rasterize_to_indices_in_range_2dgs)
register("ssim", "cuda", DiffOp(ssim.forward, ssim.backward))
register("fully_fused_projection_with_ut", "cuda", ut.project_with_ut)
register("rasterize_to_pixels_eval3d", "cuda", DiffOp(ut.forward, ut.backward))

__all__ = ["get_options", "launch_stats", "reset_launch_stats", "reset_options", "set_options"]
