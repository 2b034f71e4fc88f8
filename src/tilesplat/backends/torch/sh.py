"""Reference: real spherical harmonics of degree 0–4 (``spherical_harmonics``).

The basis is the real SH basis in the sign convention of 3DGS / gsplat, evaluated with the
sine/cosine recurrences in x, y (Sloan, "Efficient Spherical Harmonic Evaluation", JCGT 2013).
Directions are normalised inside; colour = Σ_k basis_k(dir) · coeffs_k (no offset).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...constants import SH_C0, SH_C1, SH_C2, SH_C3, SH_C4
from ..sh_rows import expand_rows
from ._vjp import recompute


def sh_basis(degree: int, dirs: Tensor) -> Tensor:
    """Basis values [..., (degree+1)^2] at unit directions [..., 3]."""
    x, y, z = dirs.unbind(-1)
    out = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        out += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        out += [
            SH_C2[0] * x * y,
            -SH_C2[0] * y * z,
            SH_C2[1] * (3.0 * zz - 1.0),
            -SH_C2[0] * x * z,
            SH_C2[2] * (xx - yy),
        ]
    if degree >= 3:
        c2, s2 = xx - yy, 2.0 * x * y  # cos(2φ)·r², sin(2φ)·r²
        c3, s3 = x * c2 - y * s2, x * s2 + y * c2
        p31 = 5.0 * zz - 1.0
        out += [
            -SH_C3[0] * s3,
            SH_C3[1] * z * s2,
            -SH_C3[2] * y * p31,
            SH_C3[3] * z * (5.0 * zz - 3.0),
            -SH_C3[2] * x * p31,
            SH_C3[1] * z * c2,
            -SH_C3[0] * c3,
        ]
    if degree >= 4:
        c4, s4 = x * c3 - y * s3, x * s3 + y * c3
        p42 = 7.0 * zz - 1.0
        p41 = z * (7.0 * zz - 3.0)
        out += [
            SH_C4[0] * s4,
            -SH_C4[1] * z * s3,
            SH_C4[2] * p42 * s2,
            -SH_C4[3] * p41 * y,
            SH_C4[4] * (35.0 * zz * zz - 30.0 * zz + 3.0),
            -SH_C4[3] * p41 * x,
            SH_C4[2] * p42 * c2,
            -SH_C4[1] * z * c3,
            SH_C4[0] * c4,
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


def joined(coeffs: Tensor, rest: Tensor) -> Tensor:
    """The coefficients [Nb, K0 + K1, 3] of the two parts (``ops/sh.py``)."""
    return coeffs if rest.shape[1] == 0 else torch.cat([coeffs, rest], 1)


def bool_masks(masks: Tensor | None) -> Tensor | None:
    """masks [M] bool, or of radii [M, 2]: the rows where both are > 0."""
    return masks if masks is None or masks.dim() == 1 else (masks > 0).all(dim=-1)


def rgb_colors(degree, dirs, coeffs, rest, masks, rows, rgb):
    """colors [M, 3] of the two coefficient parts read through ``rows``; with ``rgb``
    max(colour + 0.5, 0), as ``rasterization`` composites them."""
    colors = evaluate(degree, dirs, expand_rows(joined(coeffs, rest), rows), bool_masks(masks))
    return torch.clamp_min(colors + 0.5, 0.0) if rgb else colors


def forward(degree, dirs, coeffs, rest, masks, rows, rgb=False):
    """colors [M, 3] of dirs [M, 3] and the coefficients ``coeffs`` [Nb, K0, 3] then ``rest``
    [Nb, K1, 3], read through ``rows`` (``backends/sh_rows.py``); masks [M] bool or radii
    [M, 2]; with ``rgb`` max(colour + 0.5, 0)."""
    return rgb_colors(degree, dirs, coeffs, rest, masks, rows, rgb)


def backward(degree, dirs, coeffs, rest, masks, rows, v_colors, need_v_dirs, rgb=False):
    """(v_dirs [M, 3] or None, v_coeffs [Nb, K0, 3], v_rest [Nb, K1, 3]) by autograd."""
    d = dirs if need_v_dirs else dirs.detach()

    def fn(dirs, coeffs, rest):
        return (rgb_colors(degree, dirs, coeffs, rest, masks, rows, rgb),)

    if need_v_dirs:
        v_dirs, v_coeffs, v_rest = recompute(fn, [d, coeffs, rest], [v_colors])
    else:
        v_coeffs, v_rest = recompute(lambda c, r: fn(d, c, r), [coeffs, rest], [v_colors])
        v_dirs = None
    return v_dirs, v_coeffs, v_rest
