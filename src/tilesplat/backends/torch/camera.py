"""Reference: the camera transforms gsplat exposes on their own (``world_to_cam``, ``proj``).

Both are plain differentiable PyTorch (autograd gives their gradients). ``proj`` uses the
projection's camera models, so it agrees with ``fully_fused_projection`` before the ``eps2d``
blur: the Jacobian clamps x/z and y/z to the widened field of view, the means do not.
"""

from __future__ import annotations

from torch import Tensor

from .projection import _fisheye, _ortho, _pinhole


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
    if camera_model == "pinhole":
        means2d, J = _pinhole(means, Ks, width, height)
    elif camera_model == "ortho":
        means2d, J = _ortho(means, Ks)
    else:
        means2d, J = _fisheye(means, Ks)
    return means2d, J @ covars @ J.transpose(-1, -2)
