"""gsplat 1.5.3 ops that tilesplat does not implement yet: importable under gsplat's names and
signatures, raising ``NotImplementedError`` when called (the 2DGS pair listing and
compositing, 3DGUT)."""

from __future__ import annotations

from typing import NoReturn

from torch import Tensor

from .camera import (
    FThetaCameraDistortionParameters,
    RollingShutterType,
    UnscentedTransformParameters,
)

TWO_DGS = (
    "the 2DGS pair listing / compositing is not implemented in tilesplat yet (issue 13); "
    "rasterize_to_pixels_2dgs renders surfels"
)
UT = "3DGUT (the unscented-transform projection and eval3d) is not implemented in tilesplat"


def _missing(name: str, why: str) -> NoReturn:
    raise NotImplementedError(f"tilesplat.{name}(): {why}")


def rasterize_to_indices_in_range_2dgs(
    range_start: int,
    range_end: int,
    transmittances: Tensor,  # [..., image_height, image_width]
    means2d: Tensor,  # [..., N, 2]
    ray_transforms: Tensor,  # [..., N, 3, 3]
    opacities: Tensor,  # [..., N]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., tile_height, tile_width]
    flatten_ids: Tensor,  # [n_isects]
) -> tuple[Tensor, Tensor, Tensor]:
    """gsplat's 2DGS pair listing. Not implemented: raises NotImplementedError."""
    _missing("rasterize_to_indices_in_range_2dgs", TWO_DGS)


def accumulate_2dgs(
    means2d: Tensor,  # [..., N, 2]
    ray_transforms: Tensor,  # [..., N, 3, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor,  # [..., N, channels]
    normals: Tensor,  # [..., N, 3]
    gaussian_ids: Tensor,  # [M]
    pixel_ids: Tensor,  # [M]
    image_ids: Tensor,  # [M]
    image_width: int,
    image_height: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """gsplat's 2DGS compositing of pairs. Not implemented: raises NotImplementedError."""
    _missing("accumulate_2dgs", TWO_DGS)


def fully_fused_projection_with_ut(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    opacities: Tensor | None,  # [..., N]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    calc_compensations: bool = False,
    camera_model: str = "pinhole",
    ut_params: UnscentedTransformParameters = UnscentedTransformParameters(),  # noqa: B008
    radial_coeffs: Tensor | None = None,
    tangential_coeffs: Tensor | None = None,
    thin_prism_coeffs: Tensor | None = None,
    ftheta_coeffs: FThetaCameraDistortionParameters | None = None,
    rolling_shutter: RollingShutterType = RollingShutterType.GLOBAL,
    viewmats_rs: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """gsplat's 3DGUT projection. Not implemented: raises NotImplementedError."""
    _missing("fully_fused_projection_with_ut", UT)


def rasterize_to_pixels_eval3d(
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    colors: Tensor,  # [..., C, N, channels]
    opacities: Tensor,  # [..., C, N]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    image_width: int,
    image_height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., C, tile_height, tile_width]
    flatten_ids: Tensor,  # [n_isects]
    backgrounds: Tensor | None = None,
    masks: Tensor | None = None,
    camera_model: str = "pinhole",
    ut_params: UnscentedTransformParameters = UnscentedTransformParameters(),  # noqa: B008
    radial_coeffs: Tensor | None = None,
    tangential_coeffs: Tensor | None = None,
    thin_prism_coeffs: Tensor | None = None,
    ftheta_coeffs: FThetaCameraDistortionParameters | None = None,
    rolling_shutter: RollingShutterType = RollingShutterType.GLOBAL,
    viewmats_rs: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """gsplat's 3DGUT rasterizer (eval3d). Not implemented: raises NotImplementedError."""
    _missing("rasterize_to_pixels_eval3d", UT)
