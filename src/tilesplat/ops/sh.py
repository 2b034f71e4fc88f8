"""Public op ``spherical_harmonics``: view-dependent colour from SH coefficients; and
``spherical_harmonics_split``, the same op on coefficients held in two tensors along K (the
trainer's ``sh0`` and ``shN``), which are neither concatenated nor their gradient split.

The backends' launchers take the coefficients as two parts, ``coeffs`` [Nb, K0, 3] and
``rest`` [Nb, K1, 3] (coefficient k is ``coeffs[:, k]`` for k < K0, else ``rest[:, k - K0]``),
and return a gradient for each; the public op passes ``rest`` with K1 = 0.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backends.registry import resolve
from ..constants import SH_MAX_DEGREE
from .validation import Shapes, check_finite, check_int_at_least, check_tensor, common_float


class _SphericalHarmonics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, degree, dirs, coeffs, rest, masks, rows, rgb):
        ctx.impl, ctx.degree, ctx.rows, ctx.rgb = impl, degree, rows, rgb
        ctx.save_for_backward(dirs, coeffs, rest, masks)
        return impl.forward(degree, dirs, coeffs, rest, masks, rows, rgb)

    @staticmethod
    def backward(ctx, v_colors):
        dirs, coeffs, rest, masks = ctx.saved_tensors
        v_dirs, v_coeffs, v_rest = ctx.impl.backward(
            ctx.degree, dirs, coeffs, rest, masks, ctx.rows, v_colors.contiguous(),
            ctx.needs_input_grad[2], ctx.rgb,
        )
        return None, None, v_dirs, v_coeffs, v_rest, None, None, None


def _shared_rows(coeffs: Tensor, lead: tuple[int, ...]) -> tuple[Tensor, tuple[int, int]]:
    """coeffs [..., K, 3] (leading dims broadcastable to ``lead``) as coefficient rows [Nb, K, 3]
    and the row map ``(inner, reps)`` of ``backends/sh_rows.py`` (the same map for every K).

    When the broadcast dimensions of coeffs form one contiguous run (e.g. [N, K, 3] or
    [B, 1, N, K, 3] for [B, C, N] evaluations: every camera shares the coefficients), they
    are not copied; otherwise coeffs are expanded to one row per evaluation."""
    M = math.prod(lead)
    K = coeffs.shape[-2]
    clead = (1,) * (len(lead) - coeffs.dim() + 2) + tuple(coeffs.shape[:-2])
    bcast = [i for i, (a, b) in enumerate(zip(clead, lead, strict=True)) if a != b]
    if M and bcast and bcast == list(range(bcast[0], bcast[-1] + 1)):
        inner = math.prod(lead[bcast[-1] + 1:])
        reps = math.prod(lead[bcast[0]:bcast[-1] + 1])
        rows = math.prod(c for i, c in enumerate(clead) if i not in bcast)
        return coeffs.reshape(rows, K, 3).contiguous(), (inner, reps)
    return coeffs.expand(*lead, K, 3).reshape(M, K, 3).contiguous(), (max(M, 1), 1)


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
        coeffs: SH coefficients. [..., K, 3] with K >= (degree+1)²; the leading dims may
            broadcast to dirs' (e.g. [N, K, 3] for dirs [C, N, 3]: every camera shares them,
            without a copy; gsplat requires equal leading dims).
        masks: optional bool mask; masked-out entries return 0. [...]
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (default: the current backend).

    Returns:
        colours [..., 3] (no offset added: rasterization() adds 0.5 and clamps at 0).
    """
    return _evaluate(degrees_to_use, dirs, coeffs, None, masks, None, backend, False)


def spherical_harmonics_split(
    degrees_to_use: int,
    dirs: Tensor,  # [..., 3]
    coeffs: Tensor,  # [..., K0, 3]
    rest: Tensor,  # [..., K1, 3]
    masks: Tensor | None = None,  # [...]
    *,
    radii: Tensor | None = None,  # [..., 2]
    rgb: bool = False,
    backend: str | None = None,
) -> Tensor:
    """:func:`spherical_harmonics` of the coefficients ``torch.cat([coeffs, rest], -2)``,
    without that copy: the kernels read both tensors and write each its own gradient (the
    trainer's ``sh0`` [N, 1, 3] and ``shN`` [N, K - 1, 3]). The same bits as the public op
    on the concatenation, forward and backward.

    Args:
        coeffs: the first K0 coefficients. [..., K0, 3]
        rest: the next K1. [..., K1, 3], the same leading dims as ``coeffs``; K0 + K1 >=
            (degree+1)².
        radii: instead of ``masks``, the projection's radii (int): the entries whose two
            radii are > 0 are evaluated, as ``masks = (radii > 0).all(-1)`` would. [..., 2]
        rgb: return ``torch.clamp_min(colours + 0.5, 0)`` (``rasterization``'s colours),
            differentiated as those two ops are, without their temporaries.
        degrees_to_use, dirs, masks, backend: as :func:`spherical_harmonics`.

    Returns:
        colours [..., 3].
    """
    check_tensor("rest", rest)
    if rest.dim() != coeffs.dim() or rest.shape[:-2] != coeffs.shape[:-2] or rest.shape[-1] != 3:
        raise ValueError(f"expected rest [..., K1, 3] with coeffs' leading dims "
                         f"{list(coeffs.shape[:-2])}, got {list(rest.shape)}")
    if radii is not None:
        if masks is not None:
            raise ValueError("expected masks or radii, got both")
        check_tensor("radii", radii, "int")
        Shapes(**{"...": tuple(dirs.shape[:-1])}).check("radii", radii, "..., 2")
    return _evaluate(degrees_to_use, dirs, coeffs, rest, masks, radii, backend, bool(rgb))


def _evaluate(
    degrees_to_use: int,
    dirs: Tensor,  # [..., 3]
    coeffs: Tensor,  # [..., K0, 3]
    rest: Tensor | None,  # [..., K1, 3]
    masks: Tensor | None,  # [...] bool
    radii: Tensor | None,  # [..., 2] int, instead of masks (checked by the caller)
    backend: str | None,
    rgb: bool,
) -> Tensor:
    """The checks of both ops, then the autograd Function on (coeffs, rest) rows."""
    degree = check_int_at_least("degrees_to_use", degrees_to_use, 0)
    if degree > SH_MAX_DEGREE:
        raise ValueError(f"expected degrees_to_use in 0..{SH_MAX_DEGREE}, got {degree}")
    check_tensor("dirs", dirs)
    check_tensor("coeffs", coeffs)
    s = Shapes()
    s.check("dirs", dirs, "..., 3")
    lead = tuple(dirs.shape[:-1])
    if coeffs.dim() < 2 or coeffs.shape[-1] != 3 or not _broadcasts(coeffs.shape[:-2], lead):
        raise ValueError(
            f"expected coeffs [..., K, 3] with leading dims broadcastable to dirs' {list(lead)}, "
            f"got {list(coeffs.shape)}"
        )
    need = (degree + 1) ** 2
    K = coeffs.shape[-2] + (0 if rest is None else rest.shape[-2])
    if K < need:
        got = (f"K = {K} (shape {tuple(coeffs.shape)})" if rest is None else
               f"K0 + K1 = {K} (shapes {tuple(coeffs.shape)} and {tuple(rest.shape)})")
        raise ValueError(f"expected coeffs [..., K, 3] with K >= {need} for degree {degree}, "
                         f"got {got}")
    flat_masks = None if radii is None else radii.reshape(-1, 2).contiguous()
    if masks is not None:
        check_tensor("masks", masks, "bool")
        s.check("masks", masks, "...")
        flat_masks = masks.reshape(-1).contiguous()
    _, device = common_float({"dirs": dirs, "coeffs": coeffs, "rest": rest, "masks": masks,
                              "radii": radii})
    check_finite({"dirs": dirs, "coeffs": coeffs, "rest": rest})
    _, impl = resolve("spherical_harmonics", device, backend)
    rows_coeffs, rows = _shared_rows(coeffs, lead)
    if rest is None:
        rows_rest = coeffs.new_empty((rows_coeffs.shape[0], 0, 3))
    else:
        rows_rest, _ = _shared_rows(rest, lead)
    colors = _SphericalHarmonics.apply(
        impl, degree, dirs.reshape(-1, 3).contiguous(), rows_coeffs, rows_rest, flat_masks, rows,
        rgb,
    )
    return colors.reshape(*lead, 3)


def _broadcasts(shape: torch.Size, lead: tuple[int, ...]) -> bool:
    """True when ``shape`` broadcasts to exactly ``lead``."""
    if len(shape) > len(lead):
        return False
    return all(a in (1, b) for a, b in zip(shape[::-1], lead[::-1], strict=False))
