"""Public op ``quat_scale_to_covar_preci``: 3D covariance and precision matrices."""

from __future__ import annotations

import torch
from torch import Tensor

from ..backends.registry import resolve
from .validation import Shapes, check_bool, check_finite, check_tensor, common_float


class _QuatScaleToCovarPreci(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, quats, scales, compute_covar, compute_preci, triu):
        covars, precis = impl.forward(quats, scales, compute_covar, compute_preci, triu)
        ctx.impl, ctx.triu = impl, triu
        ctx.save_for_backward(quats, scales)
        return covars, precis

    @staticmethod
    def backward(ctx, v_covars, v_precis):
        quats, scales = ctx.saved_tensors
        v_quats, v_scales = ctx.impl.backward(
            quats, scales,
            None if v_covars is None else v_covars.contiguous(),
            None if v_precis is None else v_precis.contiguous(),
            ctx.triu,
        )
        return None, v_quats, v_scales, None, None, None


def quat_scale_to_covar_preci(
    quats: Tensor,  # [..., 4]
    scales: Tensor,  # [..., 3]
    compute_covar: bool = True,
    compute_preci: bool = True,
    triu: bool = False,
    *,
    backend: str | None = None,
) -> tuple[Tensor | None, Tensor | None]:
    """Covariance R S Sᵀ Rᵀ and precision (its inverse) of Gaussians.

    Args:
        quats: quaternions (w, x, y, z), need not be normalised. [..., 4]
        scales: standard deviations along the principal axes. [..., 3]
        compute_covar / compute_preci: which outputs to compute (the other is None).
        triu: return the upper triangle [..., 6] (xx, xy, xz, yy, yz, zz) instead of [..., 3, 3].
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (default: the current backend).

    Returns:
        (covars, precis), each [..., 3, 3] or [..., 6], or None when not computed.
    """
    check_tensor("quats", quats)
    check_tensor("scales", scales)
    for name, v in (("compute_covar", compute_covar), ("compute_preci", compute_preci),
                    ("triu", triu)):
        check_bool(name, v)
    s = Shapes()
    s.check("quats", quats, "..., 4")
    s.check("scales", scales, "..., 3")
    _, device = common_float({"quats": quats, "scales": scales})
    check_finite({"quats": quats, "scales": scales})
    lead = quats.shape[:-1]
    _, impl = resolve("quat_scale_to_covar_preci", device, backend)
    covars, precis = _QuatScaleToCovarPreci.apply(
        impl, quats.reshape(-1, 4).contiguous(), scales.reshape(-1, 3).contiguous(),
        compute_covar, compute_preci, triu,
    )
    tail = (6,) if triu else (3, 3)
    return (
        None if covars is None else covars.reshape(*lead, *tail),
        None if precis is None else precis.reshape(*lead, *tail),
    )
