"""Reference: quaternion + scale → 3D covariance and precision (``quat_scale_to_covar_preci``)."""

from __future__ import annotations

import torch
from torch import Tensor

from ._vjp import recompute

# Upper triangle of a 3×3 matrix, row-major: xx, xy, xz, yy, yz, zz.
TRIU_ROWS = (0, 0, 0, 1, 1, 2)
TRIU_COLS = (0, 1, 2, 1, 2, 2)


def quat_to_rotmat(quats: Tensor) -> Tensor:
    """Rotation matrices [..., 3, 3] of quaternions [..., 4] (w, x, y, z), normalised here."""
    q = quats / quats.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    w, x, y, z = q.unbind(-1)
    rows = (
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
    )
    return torch.stack(rows, dim=-1).reshape(*quats.shape[:-1], 3, 3)


def to_triu(m: Tensor) -> Tensor:
    """[..., 3, 3] symmetric → [..., 6] upper triangle (mean of the two off-diagonal copies)."""
    return 0.5 * (m[..., TRIU_ROWS, TRIU_COLS] + m[..., TRIU_COLS, TRIU_ROWS])


def from_triu(t: Tensor) -> Tensor:
    """[..., 6] upper triangle → [..., 3, 3] symmetric."""
    xx, xy, xz, yy, yz, zz = t.unbind(-1)
    rows = (xx, xy, xz, xy, yy, yz, xz, yz, zz)
    return torch.stack(rows, dim=-1).reshape(*t.shape[:-1], 3, 3)


def covar_preci(quats: Tensor, scales: Tensor, compute_covar: bool, compute_preci: bool,
                triu: bool) -> tuple[Tensor | None, Tensor | None]:
    """Σ = R S Sᵀ Rᵀ and Σ⁻¹ = R S⁻¹ S⁻ᵀ Rᵀ for quats [M, 4], scales [M, 3]."""
    R = quat_to_rotmat(quats)
    covars = precis = None
    if compute_covar:
        M = R * scales[..., None, :]
        covars = M @ M.transpose(-1, -2)
        covars = to_triu(covars) if triu else covars
    if compute_preci:
        P = R / scales[..., None, :]
        precis = P @ P.transpose(-1, -2)
        precis = to_triu(precis) if triu else precis
    return covars, precis


def forward(quats, scales, compute_covar, compute_preci, triu):
    return covar_preci(quats, scales, compute_covar, compute_preci, triu)


def backward(quats, scales, v_covars, v_precis, triu):
    v_quats, v_scales = recompute(
        covar_preci, [quats, scales], [v_covars, v_precis],
        v_covars is not None, v_precis is not None, triu,
    )
    return v_quats, v_scales
