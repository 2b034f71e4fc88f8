"""What the 3DGUT ops (``fully_fused_projection_with_ut``, ``rasterize_to_pixels_eval3d``) hand
a backend about the camera besides ``viewmats`` and ``Ks``: the lens (the model and its
distortion), the shutter and the unscented transform's parameters.

``ops/lens.py`` builds these from gsplat's public types once the arguments are checked; they
hold plain numbers and contiguous tensors of the ops' dtype, so a Numba kernel can take them
as they are (a code for the shutter, tuples of floats for the f-theta polynomials).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class UTParams:
    """gsplat's ``UnscentedTransformParameters``: the sigma points' spread ``alpha``, ``beta``
    (prior knowledge of the distribution, 2 for a Gaussian), ``kappa``; a sigma point is valid
    when it lands within ``in_image_margin_factor`` × the image size of the image; with
    ``require_all_sigma_points_valid`` one invalid point culls the Gaussian, else one valid
    point keeps it."""

    alpha: float
    beta: float
    kappa: float
    in_image_margin_factor: float
    require_all_sigma_points_valid: bool


@dataclass(frozen=True)
class FThetaParams:
    """gsplat's ``FThetaCameraDistortionParameters``: polynomials in increasing powers, the
    reference one evaluated directly and the other one only as Newton's start for its
    inverse; ``linear_cde`` = (c, d, e) of the matrix [[c, d], [e, 1]] applied to the image
    offsets; ``max_angle`` clamps the angle a point is projected at."""

    reference: int  # constants.FTHETA_PIXELDIST_TO_ANGLE or FTHETA_ANGLE_TO_PIXELDIST
    pixeldist_to_angle: tuple[float, float, float, float, float, float]
    angle_to_pixeldist: tuple[float, float, float, float, float, float]
    max_angle: float
    linear_cde: tuple[float, float, float]


@dataclass(frozen=True)
class UTCamera:
    """The lens and shutter of each camera; tensors lead with the camera dims of ``viewmats``
    in the launcher's call ([B, C] for the projection, [I] for the rasterizer).

    ``radial`` is OpenCV's (k1..k6) for ``pinhole`` or (k1..k4) for ``fisheye``; a pinhole
    with none of ``radial``, ``tangential`` (p1, p2), ``thin_prism`` (s1..s4) is the perfect
    pinhole, one with any of them the OpenCV pinhole (the missing ones zero). ``viewmats_rs``
    is the pose at the end of the exposure, given exactly when ``shutter`` is not global.
    """

    model: str  # one of constants.UT_CAMERA_MODELS
    radial: Tensor | None  # [..., 6] pinhole or [..., 4] fisheye
    tangential: Tensor | None  # [..., 2]
    thin_prism: Tensor | None  # [..., 4]
    ftheta: FThetaParams | None  # the model "ftheta" only
    shutter: int  # constants.SHUTTER_CODES
    viewmats_rs: Tensor | None  # [..., 4, 4]

    def reshaped(self, *lead: int) -> UTCamera:
        """The same camera with its tensors' camera dims reshaped to ``lead``."""

        def r(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.reshape(*lead, *t.shape[-1:]).contiguous()

        rs = self.viewmats_rs
        return UTCamera(self.model, r(self.radial), r(self.tangential), r(self.thin_prism),
                        self.ftheta, self.shutter,
                        None if rs is None else rs.reshape(*lead, 4, 4).contiguous())
