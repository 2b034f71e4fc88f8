"""The ``cuda`` backend: numba-cuda kernels fed through ``__cuda_array_interface__`` on
PyTorch's current stream, compiled on first use by the NVVM of the pip packages.

Under numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) the same kernels run on CPU tensors,
which is how CI checks them without a GPU. Options for benchmarks: :func:`set_options`
(``warp_skip``, ``splat_batch``, ``exact_transmittance``; see :mod:`.runtime`).
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
from . import covariance, isect, projection, rasterize_bwd, rasterize_fwd, sh  # noqa: E402
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

register(
    "quat_scale_to_covar_preci",
    "cuda",
    DiffOp(covariance.covar_preci_forward, covariance.covar_preci_backward),
)
register(
    "fully_fused_projection",
    "cuda",
    DiffOp(projection.projection_forward, projection.projection_backward),
)
register("spherical_harmonics", "cuda", DiffOp(sh.sh_forward, sh.sh_backward))
register("isect_tiles", "cuda", isect.isect_tiles)
register("isect_offset_encode", "cuda", isect.isect_offset_encode)
register(
    "rasterize_to_pixels",
    "cuda",
    DiffOp(rasterize_fwd.rasterize_to_pixels_fwd, rasterize_bwd.rasterize_to_pixels_bwd),
)
# SSIM on the GPU is the reference's convolutions: they already are torch's CUDA kernels
from ..torch import ssim as _torch_ssim  # noqa: E402

register("ssim", "cuda", DiffOp(_torch_ssim.forward, _torch_ssim.backward))

__all__ = ["get_options", "launch_stats", "reset_launch_stats", "reset_options", "set_options"]
