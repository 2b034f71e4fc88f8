"""The orthographic camera: u = fx x + cx, v = fy y + cy; a constant Jacobian."""

from __future__ import annotations

import torch
from torch import Tensor

from ..scalar_types import like

FUNCTIONS = ("ortho_proj", "ortho_proj_vjp")


def ortho_proj(x, y, z, fx, fy, cx, cy, width, height):
    """Orthographic projection: (u, v, J) with u = fx x + cx, v = fy y + cy."""
    zero = like(z, 0.0)
    return fx * x + cx, fy * y + cy, (fx, zero, zero, zero, fy, zero)


def ortho_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj):
    """Gradient (v_x, v_y, v_z) of ortho_proj (J is constant)."""
    return vu * fx, vv * fy, like(fx, 0.0) * vu


def ortho_torch(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """The reference: image points [B, C, N, 2] and Jacobians [B, C, N, 2, 3] of camera-space
    points ``means_c`` [B, C, N, 3] under intrinsics ``Ks`` [B, C, 3, 3]."""
    x, y, z = means_c.unbind(-1)
    fx, fy = Ks[..., 0, 0, None], Ks[..., 1, 1, None]
    cx, cy = Ks[..., 0, 2, None], Ks[..., 1, 2, None]
    zero = torch.zeros_like(z)
    J = torch.stack([fx + zero, zero, zero, zero, fy + zero, zero], dim=-1)
    means2d = torch.stack([fx * x + cx, fy * y + cy], dim=-1)
    return means2d, J.reshape(*z.shape, 2, 3)
