"""Reference: the camera models, and the camera transforms gsplat exposes on their own
(``world_to_cam``, ``proj``).

A camera model's reference is its twin ``<name>_torch(means_c, Ks, width, height) -> (means2d,
J)`` in its module of ``backends/cameras/`` (beside the native kernels' pair): camera-space
points [B, C, N, 3] and intrinsics [B, C, 3, 3] to image points [B, C, N, 2] and the Jacobian
d(u, v)/d(x, y, z) [B, C, N, 2, 3], plain differentiable PyTorch. :data:`PROJECTIONS` maps
each name of the table ``backends/cameras.CAMERA_MODELS`` to it, for the projection
(``projection.py``) and ``proj`` alike.

``proj`` uses the same models as the projection, so it agrees with ``fully_fused_projection``
before the ``eps2d`` blur: the pinhole Jacobian clamps x/z and y/z to the widened field of
view, the means do not.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from ..cameras import CAMERA_MODELS, camera_module

Projection = Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]]

# camera model name -> its reference projection
PROJECTIONS: dict[str, Projection] = {
    name: getattr(camera_module(name), f"{name}_torch") for name in CAMERA_MODELS
}


# ---------------------------------------------------------------------------------------------
# gsplat's camera transforms


def world_to_cam(
    means: Tensor,  # [B, N, 3]
    covars: Tensor,  # [B, N, 3, 3]
    viewmats: Tensor,  # [B, C, 4, 4]
) -> tuple[Tensor, Tensor]:
    """Means [B, C, N, 3] and covariances [B, C, N, 3, 3] in each camera's frame."""
    R, t = viewmats[..., :3, :3], viewmats[..., :3, 3]
    means_c = (R[:, :, None] @ means[:, None, :, :, None])[..., 0] + t[:, :, None, :]
    covars_c = R[:, :, None] @ covars[:, None] @ R[:, :, None].transpose(-1, -2)
    return means_c, covars_c


def proj(
    means: Tensor,  # [B, C, N, 3], camera frame
    covars: Tensor,  # [B, C, N, 3, 3], camera frame
    Ks: Tensor,  # [B, C, 3, 3]
    width: int,
    height: int,
    camera_model: str,
) -> tuple[Tensor, Tensor]:
    """Projected means [B, C, N, 2] and 2D covariances J Σ Jᵀ [B, C, N, 2, 2]."""
    means2d, J = PROJECTIONS[camera_model](means, Ks, width, height)
    return means2d, J @ covars @ J.transpose(-1, -2)
