"""The high-level render calls of gsplat 1.5.3's ``gsplat.rendering``: :func:`rasterization`
(3D Gaussians, ``rasterization.py``), :func:`rasterization_2dgs` (surfels, ``surfels.py``) and the
Inria wrappers (``inria.py``, not provided). ``sharding.py`` holds the model-parallel exchange
of ``rasterization(distributed=True)``, ``_pipeline.py`` the steps both renders share.
"""

from .inria import rasterization_2dgs_inria_wrapper, rasterization_inria_wrapper
from .rasterization import rasterization
from .surfels import rasterization_2dgs

__all__ = [
    "rasterization",
    "rasterization_2dgs",
    "rasterization_2dgs_inria_wrapper",
    "rasterization_inria_wrapper",
]
