"""Public op ``fully_fused_projection``: 3D Gaussians → 2D means, conics, depths, radii."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backends import call_options
from ..backends.cameras import CAMERA_MODELS
from ..backends.registry import resolve
from .sparse_grad import SparseRows, check_sparse_grad, with_sparse_grad
from .validation import (
    Shapes,
    check_bool,
    check_choice,
    check_finite,
    check_projection_options,
    check_tensor,
    common_float,
)


class _FullyFusedProjection(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, means, covars, quats, scales, opacities, viewmats, Ks, width, height,
                eps2d, near_plane, far_plane, radius_clip, calc_compensations, camera_model):
        radii, means2d, depths, conics, comps = impl.forward(
            means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d,
            near_plane, far_plane, radius_clip, calc_compensations, camera_model,
        )
        ctx.impl = impl
        ctx.params = (width, height, eps2d, camera_model)
        ctx.deterministic = call_options.deterministic()
        ctx.save_for_backward(means, covars, quats, scales, opacities, viewmats, Ks, radii,
                              conics, comps)
        ctx.mark_non_differentiable(radii)
        return radii, means2d, depths, conics, comps

    @staticmethod
    def backward(ctx, _v_radii, v_means2d, v_depths, v_conics, v_comps):
        means, covars, quats, scales, opacities, viewmats, Ks, radii, conics, comps = (
            ctx.saved_tensors
        )
        width, height, eps2d, camera_model = ctx.params

        def z(v, like):
            return torch.zeros_like(like) if v is None else v.contiguous()

        with call_options.scope(ctx.deterministic):
            v_means, v_covars, v_quats, v_scales, v_viewmats = ctx.impl.backward(
                means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d,
                camera_model, radii, conics, comps,
                z(v_means2d, conics[..., :2]), z(v_depths, conics[..., 0]),
                z(v_conics, conics),
                None if (v_comps is None or comps is None) else v_comps.contiguous(),
                ctx.needs_input_grad[6],
            )
        return (None, v_means, v_covars, v_quats, v_scales, None,
                v_viewmats if ctx.needs_input_grad[6] else None,
                None, None, None, None, None, None, None, None, None)


def fully_fused_projection(
    means: Tensor,  # [..., N, 3]
    covars: Tensor | None,  # [..., N, 6] or None
    quats: Tensor | None,  # [..., N, 4] or None
    scales: Tensor | None,  # [..., N, 3] or None
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    eps2d: float = 0.3,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    packed: bool = False,
    sparse_grad: bool = False,
    calc_compensations: bool = False,
    camera_model: str = "pinhole",
    opacities: Tensor | None = None,  # [..., N] or None
    *,
    backend: str | None = None,
) -> tuple[Tensor, ...]:
    """Projects Gaussians to 2D (covariance, world→camera, EWA projection, conic, radii).

    Args follow gsplat 1.5.3: ``covars`` (upper triangle xx, xy, xz, yy, yz, zz) or
    ``quats`` + ``scales``; ``camera_model`` is one of ``backends.cameras.CAMERA_MODELS``
    (``pinhole``, ``ortho``, ``fisheye``);
    ``sparse_grad`` (needs ``packed=True``, no batch dims): the gradients of ``means``,
    ``covars``, ``quats`` and ``scales`` are sparse COO tensors over the visible Gaussians
    (``ops/sparse_grad.py``);
    ``opacities`` (optional) tightens radii and culls Gaussians below 1/255.
    ``backend``: ``auto`` | ``torch`` | ``cpu`` | ``cuda``.

    Returns:
        unpacked: radii [..., C, N, 2] int32, means2d [..., C, N, 2], depths [..., C, N],
        conics [..., C, N, 3], compensations [..., C, N] or None. Culled entries have radii 0
        and zero means2d/conics.
        packed: batch_ids, camera_ids, gaussian_ids [nnz] int64, radii [nnz, 2],
        means2d [nnz, 2], depths [nnz], conics [nnz, 3], compensations [nnz] or None, for the
        entries with radii > 0, ordered by (batch, camera, gaussian).
    """
    check_tensor("means", means)
    check_tensor("viewmats", viewmats)
    check_tensor("Ks", Ks)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    if covars is not None:
        check_tensor("covars", covars)
        s.check("covars", covars, "..., N, 6")
        quats = scales = None
    else:
        if quats is None or scales is None:
            raise ValueError("expected covars, or both quats and scales; got neither")
        check_tensor("quats", quats)
        check_tensor("scales", scales)
        s.check("quats", quats, "..., N, 4")
        s.check("scales", scales, "..., N, 3")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    s.check("Ks", Ks, "..., C, 3, 3")
    if opacities is not None:
        check_tensor("opacities", opacities)
        s.check("opacities", opacities, "..., N")
    width, height, eps2d, near_plane, far_plane, radius_clip = check_projection_options(
        width, height, eps2d, near_plane, far_plane, radius_clip)
    check_bool("packed", packed)
    check_bool("calc_compensations", calc_compensations)
    check_choice("camera_model", camera_model, CAMERA_MODELS)
    named = {"means": means, "covars": covars, "quats": quats, "scales": scales,
             "viewmats": viewmats, "Ks": Ks, "opacities": opacities}
    _, device = common_float(named)
    check_finite(named)

    batch = s["..."]
    B, N, C = math.prod(batch), s["N"], s["C"]
    rows = None
    if check_sparse_grad(sparse_grad, packed, batch, "fully_fused_projection"):
        rows = SparseRows()
        means, covars, quats, scales = with_sparse_grad(rows, means, covars, quats, scales)

    def flat(t, *tail):
        return None if t is None else t.reshape(B, *tail).contiguous()

    _, impl = resolve("fully_fused_projection", device, backend)
    radii, means2d, depths, conics, comps = _FullyFusedProjection.apply(
        impl, flat(means, N, 3), flat(covars, N, 6), flat(quats, N, 4), flat(scales, N, 3),
        None if opacities is None else opacities.detach().reshape(B, N).contiguous(),
        flat(viewmats, C, 4, 4), flat(Ks, C, 3, 3).detach(), width, height, eps2d, near_plane,
        far_plane, radius_clip, calc_compensations, camera_model,
    )
    if packed:
        sel = (radii > 0).all(dim=-1)  # [B, C, N]
        b, c, n = sel.nonzero(as_tuple=True)
        if rows is not None:
            rows.set(sel.any(dim=1)[0])
        return (b, c, n, radii[b, c, n], means2d[b, c, n], depths[b, c, n], conics[b, c, n],
                None if comps is None else comps[b, c, n])
    return (
        radii.reshape(*batch, C, N, 2),
        means2d.reshape(*batch, C, N, 2),
        depths.reshape(*batch, C, N),
        conics.reshape(*batch, C, N, 3),
        None if comps is None else comps.reshape(*batch, C, N),
    )
