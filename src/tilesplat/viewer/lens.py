"""The capture's lens in the viewer's render mode: a run trained with ``camera_mode =
"native"`` is shown through its first training camera's lens (its distortion and intrinsics,
scaled to the browser's canvas) by 3DGUT, or through a pinhole of the browser's field of view
(the panel's ``camera`` choice, ``tilesplat view --pinhole``), also by 3DGUT with a lens of no
distortion (a model trained by 3DGUT is shown by its rasterizer)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

CAMERAS = ("capture lens", "pinhole")


@dataclass(frozen=True)
class ViewLens:
    """A capture's camera: ``camera_model`` (``pinhole`` or ``fisheye``), gsplat's
    coefficients by keyword (``radial_coeffs`` [n], ...), and its intrinsics ``K`` [3, 3] at
    its image size ``width`` x ``height``."""

    camera_model: str
    coeffs: dict[str, Tensor]
    K: np.ndarray
    width: int
    height: int

    def intrinsics(self, width: int, height: int) -> np.ndarray:
        """[3, 3] the capture's intrinsics for a canvas of ``width`` x ``height``: scaled by
        the width ratio (square pixels stay square), centred vertically."""
        s = width / self.width
        K = np.asarray(self.K, np.float64) * np.array([[s], [s], [1.0]])
        K[1, 2] += 0.5 * (height - self.height * s)
        return K

    def zero(self) -> ViewLens:
        """A pinhole of no distortion (its render: 3DGUT's of the plain pinhole)."""
        return replace(self, camera_model="pinhole",
                       coeffs={"radial_coeffs": torch.zeros(6),
                               "tangential_coeffs": torch.zeros(2)})

    def render_kwargs(self) -> dict[str, Any]:
        """``rasterization``'s keywords that render one camera through this lens."""
        return {"camera_model": self.camera_model, "with_ut": True, "with_eval3d": True,
                **{k: v.float()[None] for k, v in self.coeffs.items()}}
