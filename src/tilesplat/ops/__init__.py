"""Public ops: signature, validation and autograd wiring; kernels live in backends."""

from .covariance import quat_scale_to_covar_preci
from .intersect import isect_offset_encode, isect_tiles, isect_tiles_tight
from .projection import fully_fused_projection
from .rasterize import rasterize_to_pixels
from .sh import spherical_harmonics
from .ssim import ssim
from .validation import set_check_finite

__all__ = [
    "fully_fused_projection",
    "isect_offset_encode",
    "isect_tiles",
    "isect_tiles_tight",
    "quat_scale_to_covar_preci",
    "rasterize_to_pixels",
    "set_check_finite",
    "spherical_harmonics",
    "ssim",
]
