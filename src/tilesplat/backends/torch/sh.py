"""Reference: real spherical harmonics of degree 0–4 (``spherical_harmonics``).

The basis is the real SH basis in the sign convention of 3DGS / gsplat, evaluated with the
sine/cosine recurrences in x, y (Sloan, "Efficient Spherical Harmonic Evaluation", JCGT 2013).
Directions are normalised inside; colour = Σ_k basis_k(dir) · coeffs_k (no offset).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...constants import SH_C0
from ..sh_rows import expand_rows
from ._vjp import recompute

# Normalisation constants, band by band (standard real-SH values); band 0 is SH_C0.
Y1 = 0.4886025119029199
Y2 = (1.0925484305920792, 0.31539156525252005, 0.5462742152960396)
Y3 = (0.5900435899266435, 2.890611442640554, 0.4570457994644658, 0.3731763325901154,
      1.445305721320277)
Y4 = (0.6258357354491763, 1.7701307697799304, 0.47308734787878004, 0.6690465435572892,
      0.10578554691520431, 2.5033429417967046, 0.9461746957575601)


def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """Basis values [..., (degree+1)^2] at unit directions [..., 3]."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-Y1 * y, Y1 * z, -Y1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            Y2[0] * x * y,
            -Y2[0] * y * z,
            Y2[1] * (3.0 * zz - 1.0),
            -Y2[0] * x * z,
            Y2[2] * (xx - yy),
        ]
    if degree >= 3:
        c2, s2 = xx - yy, 2.0 * x * y  # cos(2φ)·r², sin(2φ)·r²
        c3, s3 = x * c2 - y * s2, x * s2 + y * c2
        p31 = 5.0 * zz - 1.0
        out += [
            -Y3[0] * s3,
            Y3[1] * 0.5 * z * s2,
            -Y3[2] * y * p31,
            Y3[3] * z * (5.0 * zz - 3.0),
            -Y3[2] * x * p31,
            Y3[4] * z * c2,
            -Y3[0] * c3,
        ]
    if degree >= 4:
        c4, s4 = x * c3 - y * s3, x * s3 + y * c3
        p42 = 7.0 * zz - 1.0
        p41 = z * (7.0 * zz - 3.0)
        out += [
            Y4[0] * s4,
            -Y4[1] * z * s3,
            Y4[2] * p42 * s2,
            -Y4[3] * p41 * y,
            Y4[4] * (35.0 * zz * zz - 30.0 * zz + 3.0),
            -Y4[3] * p41 * x,
            Y4[2] * p42 * c2,
            -Y4[1] * z * c3,
            Y4[0] * c4,
        ]
    return torch.stack(out, dim=-1)


def evaluate(degree: int, dirs: Tensor, coeffs: Tensor, masks: Tensor | None) -> Tensor:
    """Colours [M, 3] from dirs [M, 3] and coeffs [M, K, 3]; masked-out rows are 0."""
    n = (degree + 1) ** 2
    unit = dirs / dirs.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    colors = torch.einsum("mk,mkc->mc", sh_basis(degree, unit), coeffs[:, :n, :])
    if masks is not None:
        colors = torch.where(masks[:, None], colors, torch.zeros_like(colors))
    return colors


def forward(degree, dirs, coeffs, masks, rows):
    """colors [M, 3] of dirs [M, 3] and coeffs [Nb, K, 3] read through ``rows``
    (``backends/sh_rows.py``)."""
    return evaluate(degree, dirs, expand_rows(coeffs, rows), masks)


def backward(degree, dirs, coeffs, masks, rows, v_colors, need_v_dirs):
    d = dirs if need_v_dirs else dirs.detach()

    def fn(dirs, coeffs):
        return (evaluate(degree, dirs, expand_rows(coeffs, rows), masks),)

    if need_v_dirs:
        v_dirs, v_coeffs = recompute(fn, [d, coeffs], [v_colors])
    else:
        (v_coeffs,) = recompute(lambda c: fn(d, c), [coeffs], [v_colors])
        v_dirs = None
    return v_dirs, v_coeffs
