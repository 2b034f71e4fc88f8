"""Public op ``spherical_harmonics``: view-dependent colour from SH coefficients."""

from __future__ import annotations

import torch
from torch import Tensor

from ..backends.registry import resolve
from ..constants import SH_MAX_DEGREE
from .validation import Shapes, check_finite, check_int_at_least, check_tensor, common_float


class _SphericalHarmonics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, degree, dirs, coeffs, masks):
        ctx.impl, ctx.degree = impl, degree
        ctx.save_for_backward(dirs, coeffs, masks)
        return impl.forward(degree, dirs, coeffs, masks)

    @staticmethod
    def backward(ctx, v_colors):
        dirs, coeffs, masks = ctx.saved_tensors
        v_dirs, v_coeffs = ctx.impl.backward(
            ctx.degree, dirs, coeffs, masks, v_colors.contiguous(), ctx.needs_input_grad[2]
        )
        return None, None, v_dirs, v_coeffs, None


def spherical_harmonics(
    degrees_to_use: int,
    dirs: Tensor,  # [..., 3]
    coeffs: Tensor,  # [..., K, 3]
    masks: Tensor | None = None,  # [...]
    *,
    backend: str | None = None,
) -> Tensor:
    """Evaluates real spherical harmonics of degree ``degrees_to_use`` (0–4).

    Args:
        degrees_to_use: SH degree; uses the first (degree+1)² of the K coefficients.
        dirs: view directions, normalised inside. [..., 3]
        coeffs: SH coefficients. [..., K, 3] with K >= (degree+1)²
        masks: optional bool mask; masked-out entries return 0. [...]
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (default: the current backend).

    Returns:
        colours [..., 3] (no offset added: rasterization() adds 0.5 and clamps at 0).
    """
    degree = check_int_at_least("degrees_to_use", degrees_to_use, 0)
    if degree > SH_MAX_DEGREE:
        raise ValueError(f"expected degrees_to_use in 0..{SH_MAX_DEGREE}, got {degree}")
    check_tensor("dirs", dirs)
    check_tensor("coeffs", coeffs)
    s = Shapes()
    s.check("dirs", dirs, "..., 3")
    s.check("coeffs", coeffs, "..., K, 3")
    need = (degree + 1) ** 2
    if s["K"] < need:
        raise ValueError(
            f"expected coeffs [..., K, 3] with K >= {need} for degree {degree}, "
            f"got K = {s['K']} (shape {tuple(coeffs.shape)})"
        )
    if masks is not None:
        check_tensor("masks", masks, "bool")
        s.check("masks", masks, "...")
    _, device = common_float({"dirs": dirs, "coeffs": coeffs, "masks": masks})
    check_finite({"dirs": dirs, "coeffs": coeffs})
    lead = dirs.shape[:-1]
    _, impl = resolve("spherical_harmonics", device, backend)
    colors = _SphericalHarmonics.apply(
        impl, degree, dirs.reshape(-1, 3).contiguous(),
        coeffs.reshape(-1, s["K"], 3).contiguous(),
        None if masks is None else masks.reshape(-1).contiguous(),
    )
    return colors.reshape(*lead, 3)
