"""Reference: the camera models, and the camera transforms gsplat exposes on their own
(``world_to_cam``, ``proj``).

A camera model is one function ``model(means_c, Ks, width, height) -> (means2d, J)``: camera-
space points [B, C, N, 3] and intrinsics [B, C, 3, 3] to image points [B, C, N, 2] and the
Jacobian d(u, v)/d(x, y, z) [B, C, N, 2, 3], plain differentiable PyTorch; :data:`PROJECTIONS`
maps the model's name to it, for the projection (``projection.py``) and ``proj`` alike. Each
is the twin of the native backends' pair in ``backends/shared/cameras.py``; the model's code
is in ``constants.CAMERA_CODES`` (docs/README.md, "where things go").

``proj`` uses the same models as the projection, so it agrees with ``fully_fused_projection``
before the ``eps2d`` blur: the pinhole Jacobian clamps x/z and y/z to the widened field of
view, the means do not.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ...constants import FISHEYE_EPS

# ---------------------------------------------------------------------------------------------
# camera models


def pinhole(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """Pinhole: u = fx x / z + cx, v = fy y / z + cy; the Jacobian takes x/z and y/z clamped
    to the field of view widened by 30% (as 3DGS), so that it stays sane off-screen."""
    x, y, z = means_c.unbind(-1)
    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    tan_fovx, tan_fovy = 0.5 * width / fx, 0.5 * height / fy
    lim_x_pos = (width - cx) / fx + 0.3 * tan_fovx
    lim_x_neg = cx / fx + 0.3 * tan_fovx
    lim_y_pos = (height - cy) / fy + 0.3 * tan_fovy
    lim_y_neg = cy / fy + 0.3 * tan_fovy
    tx = z * torch.minimum(torch.maximum(x / z, -lim_x_neg), lim_x_pos)
    ty = z * torch.minimum(torch.maximum(y / z, -lim_y_neg), lim_y_pos)
    zero = torch.zeros_like(z)
    J = torch.stack(
        [fx / z, zero, -fx * tx / (z * z), zero, fy / z, -fy * ty / (z * z)], dim=-1
    ).reshape(*z.shape, 2, 3)
    means2d = torch.stack([fx * x / z + cx, fy * y / z + cy], dim=-1)
    return means2d, J


def ortho(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """Orthographic: u = fx x + cx, v = fy y + cy; a constant Jacobian."""
    x, y, z = means_c.unbind(-1)
    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    zero = torch.zeros_like(z)
    J = torch.stack([fx + zero, zero, zero, zero, fy + zero, zero], dim=-1)
    means2d = torch.stack([fx * x + cx, fy * y + cy], dim=-1)
    return means2d, J.reshape(*z.shape, 2, 3)


def fisheye(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """Equidistant fisheye: r = f·θ with θ the angle to the optical axis."""
    x, y, z = means_c.unbind(-1)
    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    eps = FISHEYE_EPS
    xy_len = torch.sqrt(x * x + y * y) + eps
    theta = torch.atan2(xy_len, z + eps)
    means2d = torch.stack([x * fx * theta / xy_len + cx, y * fy * theta / xy_len + cy], dim=-1)
    x2 = x * x + eps
    y2 = y * y
    xy = x * y
    x2y2 = x2 + y2
    inv_r2 = 1.0 / (x2y2 + z * z)
    b = torch.atan2(xy_len, z) / xy_len / x2y2
    a = z * inv_r2 / x2y2
    J = torch.stack(
        [fx * (x2 * a + y2 * b), fx * xy * (a - b), -fx * x * inv_r2,
         fy * xy * (a - b), fy * (y2 * a + x2 * b), -fy * y * inv_r2],
        dim=-1,
    ).reshape(*z.shape, 2, 3)
    return means2d, J


PROJECTIONS: dict[str, Callable[[Tensor, Tensor, int, int], tuple[Tensor, Tensor]]] = {
    "pinhole": pinhole,
    "ortho": ortho,
    "fisheye": fisheye,
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
