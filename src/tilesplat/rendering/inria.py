"""gsplat 1.5.3's wrappers of the original 3DGS and 2DGS CUDA rasterizers, importable under
their names and signatures; they raise ``NotImplementedError`` when called."""

from __future__ import annotations

from typing import NoReturn

from torch import Tensor

INRIA = (
    "gsplat's Inria wrappers call the 'diff_gaussian_rasterization' CUDA package of the "
    "original 3DGS code; tilesplat does not wrap it (use tilesplat.rasterization)"
)


def _missing(name: str, why: str) -> NoReturn:
    raise NotImplementedError(f"tilesplat.{name}(): {why}")


def rasterization_inria_wrapper(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [N, D] or [N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 100.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    backgrounds: Tensor | None = None,
    **kwargs,
) -> tuple[Tensor, Tensor, dict]:
    """gsplat's wrapper of the Inria rasterizer. Not provided: raises NotImplementedError."""
    _missing("rasterization_inria_wrapper", INRIA)


def rasterization_2dgs_inria_wrapper(
    means: Tensor,  # [N, 3]
    quats: Tensor,  # [N, 4]
    scales: Tensor,  # [N, 3]
    opacities: Tensor,  # [N]
    colors: Tensor,  # [N, D] or [N, K, 3]
    viewmats: Tensor,  # [C, 4, 4]
    Ks: Tensor,  # [C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 100.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    backgrounds: Tensor | None = None,
    depth_ratio: int = 0,
    **kwargs,
) -> tuple[tuple, dict]:
    """gsplat's wrapper of the 2DGS Inria rasterizer. Not provided: raises
    NotImplementedError."""
    _missing("rasterization_2dgs_inria_wrapper", INRIA)
