"""gsplat 1.5.3 ops that tilesplat does not implement yet: importable under gsplat's names and
signatures, raising ``NotImplementedError`` when called (3DGUT)."""

from __future__ import annotations

from typing import NoReturn

from torch import Tensor

from .camera import (
    FThetaCameraDistortionParameters,
    RollingShutterType,
    UnscentedTransformParameters,
)

UT = "3DGUT (the unscented-transform projection and eval3d) is not implemented in tilesplat"


def _missing(name: str, why: str) -> NoReturn:
    raise NotImplementedError(f"tilesplat.{name}(): {why}")


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
