"""The CPU 2DGS ops, ``fully_fused_projection_2dgs`` and ``rasterize_to_pixels_2dgs``: each a
``torch.autograd.Function`` whose forward and backward only call the launchers of the kernel
modules (``twodgs_projection``, ``twodgs_rasterize_fwd``, ``twodgs_rasterize_bwd``), made by
``backends/twodgs_autograd.py`` as for the cuda backend.

Unlike the other ops, the public 2DGS ops (``ops/twodgs.py``) call their backend's
implementation as a differentiable function, as the reference is differentiable by autograd;
so each is registered as a plain op under its own name.
"""

from __future__ import annotations

from ..twodgs_autograd import differentiable_2dgs
from . import twodgs_projection as projection
from . import twodgs_rasterize_bwd as rasterize_bwd
from . import twodgs_rasterize_fwd as rasterize_fwd

fully_fused_projection_2dgs, rasterize_to_pixels_2dgs = differentiable_2dgs(
    projection.forward, projection.backward, rasterize_fwd.forward, rasterize_bwd.backward,
    "cpu")

__all__ = ["fully_fused_projection_2dgs", "rasterize_to_pixels_2dgs"]
