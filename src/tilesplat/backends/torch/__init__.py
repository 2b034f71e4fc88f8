"""The ``torch`` reference backend: plain vectorised PyTorch, differentiable by autograd,
float32 and float64, any device. It defines what every other backend computes."""

from ..registry import DiffOp, register
from . import (
    camera,
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

# One line an op (the scheme: ``backends/registry.py``).
register("quat_scale_to_covar_preci", "torch", DiffOp(covariance.forward, covariance.backward))
register("fully_fused_projection", "torch", DiffOp(projection.forward, projection.backward))
register("spherical_harmonics", "torch", DiffOp(sh.forward, sh.backward))
register("isect_tiles", "torch", intersect.isect_tiles)
register("isect_tiles_tight", "torch", intersect.isect_tiles_tight)
register("isect_offset_encode", "torch", intersect.isect_offset_encode)
register("rasterize_to_pixels", "torch", DiffOp(rasterize.forward, rasterize.backward))
register("world_to_cam", "torch", camera.world_to_cam)
register("proj", "torch", camera.proj)
register("rasterize_to_indices_in_range", "torch", indices.rasterize_to_indices_in_range)
register("accumulate", "torch", indices.accumulate)
register("fully_fused_projection_2dgs", "torch", twodgs.fully_fused_projection_2dgs)
register("rasterize_to_pixels_2dgs", "torch", twodgs.rasterize_to_pixels_2dgs)
register("rasterize_to_indices_in_range_2dgs", "torch", indices.rasterize_to_indices_in_range_2dgs)
register("accumulate_2dgs", "torch", indices.accumulate_2dgs)
register("ssim", "torch", DiffOp(ssim.forward, ssim.backward))
register("fully_fused_projection_with_ut", "torch", ut.project_with_ut)
register("rasterize_to_pixels_eval3d", "torch", DiffOp(ut.forward, ut.backward))
