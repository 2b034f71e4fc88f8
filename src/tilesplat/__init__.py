"""tilesplat: differentiable 3D Gaussian Splatting with gsplat 1.5's public API.

``import tilesplat as gsplat`` gives every top-level name of gsplat 1.5.3 and its submodules
``strategy``, ``optimizers``, ``compression``, ``exporter`` and ``distributed``, with gsplat's
signatures. A name works (every backend; the torch reference serves ops that have no native
kernel, with the registry's one warning) but for the two wrappers of the original 3DGS CUDA
package (``rasterization_inria_wrapper``, ``rasterization_2dgs_inria_wrapper``), which raise
``NotImplementedError`` when called.
Importing compiles nothing: backends load on first use.
"""

# first, before anything loads torch: the tilesplat command's OpenMP wait policy and huge
# pages for torch's CPU allocations (standard library only)
from . import command_env  # noqa: F401, I001

from . import compression, distributed, exporter, optimizers, strategy
from .backends.registry import (
    available as available_backends,
)
from .backends.registry import (
    current_backend,
    current_backward_scheme,
    set_backend,
    set_backward_scheme,
    use_backend,
)
from .compression import PngCompression
from .exporter import export_splats
from .ops import (
    fully_fused_projection,
    isect_offset_encode,
    isect_tiles,
    quat_scale_to_covar_preci,
    rasterize_to_pixels,
    set_check_finite,
    spherical_harmonics,
)
from .ops.camera import RollingShutterType, proj, world_to_cam
from .ops.indices import (
    accumulate,
    accumulate_2dgs,
    rasterize_to_indices_in_range,
    rasterize_to_indices_in_range_2dgs,
)
from .ops.twodgs import fully_fused_projection_2dgs, rasterize_to_pixels_2dgs
from .ops.ut import fully_fused_projection_with_ut, rasterize_to_pixels_eval3d
from .optimizers import SelectiveAdam
from .rendering import (
    rasterization,
    rasterization_2dgs,
    rasterization_2dgs_inria_wrapper,
    rasterization_inria_wrapper,
)
from .strategy import DefaultStrategy, MCMCStrategy, Strategy

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "accumulate",
    "accumulate_2dgs",
    "available_backends",
    "compression",
    "current_backend",
    "current_backward_scheme",
    "DefaultStrategy",
    "distributed",
    "export_splats",
    "exporter",
    "fully_fused_projection",
    "fully_fused_projection_2dgs",
    "fully_fused_projection_with_ut",
    "isect_offset_encode",
    "isect_tiles",
    "MCMCStrategy",
    "optimizers",
    "PngCompression",
    "proj",
    "quat_scale_to_covar_preci",
    "rasterization",
    "rasterization_2dgs",
    "rasterization_2dgs_inria_wrapper",
    "rasterization_inria_wrapper",
    "rasterize_to_indices_in_range",
    "rasterize_to_indices_in_range_2dgs",
    "rasterize_to_pixels",
    "rasterize_to_pixels_2dgs",
    "rasterize_to_pixels_eval3d",
    "RollingShutterType",
    "SelectiveAdam",
    "set_backend",
    "set_backward_scheme",
    "set_check_finite",
    "spherical_harmonics",
    "Strategy",
    "strategy",
    "use_backend",
    "world_to_cam",
]
