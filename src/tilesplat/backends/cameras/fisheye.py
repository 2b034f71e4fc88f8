"""The equidistant fisheye camera (as gsplat's reference): r = f θ, with θ the angle between
the point and the optical axis."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..scalar_types import like

FUNCTIONS = ("fisheye_proj", "fisheye_proj_vjp")
FISHEYE_EPS = 1e-7  # gsplat's epsilon: the radius and the depth are offset by it


def fisheye_proj(x, y, z, fx, fy, cx, cy, width, height):
    """Equidistant fisheye projection (as gsplat's reference): (u, v, J 2x3 6-tuple)."""
    eps = like(x, FISHEYE_EPS)
    rho = math.sqrt(x * x + y * y)
    r = rho + eps
    theta = math.atan2(r, z + eps)
    u = x * fx * theta / r + cx
    v = y * fy * theta / r + cy
    x2 = x * x + eps
    y2 = y * y
    xy = x * y
    x2y2 = x2 + y2
    inv = like(x, 1.0) / (x2y2 + z * z)
    b = math.atan2(r, z) / r / x2y2
    a = z * inv / x2y2
    return (
        u,
        v,
        (
            fx * (x2 * a + y2 * b),
            fx * xy * (a - b),
            -fx * x * inv,
            fy * xy * (a - b),
            fy * (y2 * a + x2 * b),
            -fy * y * inv,
        ),
    )


def fisheye_proj_vjp(x, y, z, fx, fy, cx, cy, width, height, vu, vv, vj):
    """Gradient (v_x, v_y, v_z) of fisheye_proj by reverse mode through its formulas."""
    vj00, vj01, vj02, vj10, vj11, vj12 = vj
    eps = like(x, FISHEYE_EPS)
    one = like(x, 1.0)
    two = like(x, 2.0)
    rho = math.sqrt(x * x + y * y)
    r = rho + eps
    ze = z + eps
    theta = math.atan2(r, ze)
    x2 = x * x + eps
    y2 = y * y
    xy = x * y
    x2y2 = x2 + y2
    q = x2y2 + z * z
    inv = one / q
    at = math.atan2(r, z)
    b = at / r / x2y2
    a = z * inv / x2y2
    # means2d: u = fx x theta / r + cx, v = fy y theta / r + cy
    gx = vu * fx * theta / r
    gy = vv * fy * theta / r
    g_theta = (vu * fx * x + vv * fy * y) / r
    g_r = -(vu * fx * x + vv * fy * y) * theta / (r * r)
    # J entries
    g_a = vj00 * fx * x2 + (vj01 * fx + vj10 * fy) * xy + vj11 * fy * y2
    g_b = vj00 * fx * y2 - (vj01 * fx + vj10 * fy) * xy + vj11 * fy * x2
    g_x2 = vj00 * fx * a + vj11 * fy * b
    g_y2 = vj00 * fx * b + vj11 * fy * a
    g_xy = (vj01 * fx + vj10 * fy) * (a - b)
    g_inv = -(vj02 * fx * x + vj12 * fy * y)
    gx += -vj02 * fx * inv
    gy += -vj12 * fy * inv
    # a = z inv / x2y2
    gz = g_a * inv / x2y2
    g_inv += g_a * z / x2y2
    g_x2y2 = -g_a * a / x2y2
    # b = at / r / x2y2
    g_at = g_b / (r * x2y2)
    g_r += -g_b * b / r
    g_x2y2 += -g_b * b / x2y2
    # at = atan2(r, z); theta = atan2(r, z + eps): d atan2(p, q) = (q dp - p dq) / (p^2 + q^2)
    den = r * r + z * z
    g_r += g_at * z / den
    gz += -g_at * r / den
    den_e = r * r + ze * ze
    g_r += g_theta * ze / den_e
    gz += -g_theta * r / den_e
    # inv = 1 / (x2y2 + z^2)
    g_q = -g_inv * inv * inv
    g_x2y2 += g_q
    gz += g_q * two * z
    g_x2 += g_x2y2
    g_y2 += g_x2y2
    gx += g_x2 * two * x + g_xy * y
    gy += g_y2 * two * y + g_xy * x
    # r = sqrt(x^2 + y^2) + eps
    gx += g_r * x / rho
    gy += g_r * y / rho
    return gx, gy, gz


def fisheye_torch(means_c: Tensor, Ks: Tensor, width: int, height: int) -> tuple[Tensor, Tensor]:
    """The reference: image points [B, C, N, 2] and Jacobians [B, C, N, 2, 3] of camera-space
    points ``means_c`` [B, C, N, 3] under intrinsics ``Ks`` [B, C, 3, 3]."""
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
