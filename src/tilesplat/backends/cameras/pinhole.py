"""The pinhole camera: u = fx x / z + cx, v = fy y / z + cy.

The Jacobian takes x/z and y/z clamped to the field of view widened by 30% (as 3DGS), so that
it stays bounded off-screen; the means are not clamped.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..scalar_types import like

FUNCTIONS = ("_pinhole_bounds", "pinhole_proj", "pinhole_proj_vjp")


def _pinhole_bounds(tz, fx, fy, cx, cy, width, height):
    """(x+, x-, y+, y-): x/z is clamped to [-x-, x+] and y/z to [-y-, y+] in the pinhole
    Jacobian, the field of view widened by 30% (as 3DGS)."""
    width = like(tz, width)
    height = like(tz, height)
    tan_x = like(tz, 0.5) * width / fx
    tan_y = like(tz, 0.5) * height / fy
    lim_xp = (width - cx) / fx + like(tz, 0.3) * tan_x
    lim_xn = cx / fx + like(tz, 0.3) * tan_x
    lim_yp = (height - cy) / fy + like(tz, 0.3) * tan_y
    lim_yn = cy / fy + like(tz, 0.3) * tan_y
    return lim_xp, lim_xn, lim_yp, lim_yn


def pinhole_proj(tx, ty, tz, fx, fy, cx, cy, width, height):
    """Pinhole projection of a camera-space point: (u, v, J 2x3 as 6-tuple).

    u = fx x / z + cx, v = fy y / z + cy; the Jacobian uses the point with x/z and y/z clamped
    to the field of view widened by 30% (as 3DGS), so that it stays bounded off-screen.
    """
    u = fx * tx / tz + cx
    v = fy * ty / tz + cy
    lim_xp, lim_xn, lim_yp, lim_yn = _pinhole_bounds(tz, fx, fy, cx, cy, width, height)
    lx = tz * min(max(tx / tz, -lim_xn), lim_xp)
    ly = tz * min(max(ty / tz, -lim_yn), lim_yp)
    z2 = tz * tz
    zero = like(tz, 0.0)
    return u, v, (fx / tz, zero, -fx * lx / z2, zero, fy / tz, -fy * ly / z2)


def pinhole_proj_vjp(tx, ty, tz, fx, fy, cx, cy, width, height, vu, vv, vj):
    """Gradient (v_tx, v_ty, v_tz) of pinhole_proj from v_u, v_v and v_J (a 2x3 6-tuple),
    following the clamp as autograd does (the gradient passes inside the bounds)."""
    vj00, _, vj02, _, vj11, vj12 = vj
    z2 = tz * tz
    vtx = vu * fx / tz
    vty = vv * fy / tz
    vtz = -(vu * fx * tx + vv * fy * ty) / z2
    lim_xp, lim_xn, lim_yp, lim_yn = _pinhole_bounds(tz, fx, fy, cx, cy, width, height)
    rx = tx / tz
    ry = ty / tz
    qx = min(max(rx, -lim_xn), lim_xp)
    qy = min(max(ry, -lim_yn), lim_yp)
    lx = tz * qx
    ly = tz * qy
    z3 = z2 * tz
    two = like(tz, 2.0)
    # J00 = fx / z, J11 = fy / z, J02 = -fx lx / z^2, J12 = -fy ly / z^2
    vtz += -(vj00 * fx + vj11 * fy) / z2
    vtz += two * (vj02 * fx * lx + vj12 * fy * ly) / z3
    vlx = -vj02 * fx / z2
    vly = -vj12 * fy / z2
    # lx = z * clamp(x / z)
    vtz += vlx * qx + vly * qy
    if rx >= -lim_xn and rx <= lim_xp:
        vtx += vlx
        vtz -= vlx * tx / tz
    if ry >= -lim_yn and ry <= lim_yp:
        vty += vly
        vtz -= vly * ty / tz
    return vtx, vty, vtz


def pinhole_torch(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """The reference: image points [B, C, N, 2] and Jacobians [B, C, N, 2, 3] of camera-space
    points ``means_c`` [B, C, N, 3] under intrinsics ``Ks`` [B, C, 3, 3]."""
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
