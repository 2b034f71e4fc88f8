"""tilesplat: differentiable 3D Gaussian Splatting with gsplat 1.5's public API.

``import tilesplat as gsplat`` works for the rasterization API. Importing compiles nothing:
backends load on first use.
"""

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
from .ops import (
    fully_fused_projection,
    isect_offset_encode,
    isect_tiles,
    quat_scale_to_covar_preci,
    rasterize_to_pixels,
    set_check_finite,
    spherical_harmonics,
)
from .rendering import rasterization

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "available_backends",
    "current_backend",
    "current_backward_scheme",
    "fully_fused_projection",
    "isect_offset_encode",
    "isect_tiles",
    "quat_scale_to_covar_preci",
    "rasterization",
    "rasterize_to_pixels",
    "set_backend",
    "set_backward_scheme",
    "set_check_finite",
    "spherical_harmonics",
    "use_backend",
]
