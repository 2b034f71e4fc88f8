"""Reference: fused projection of 3D Gaussians to 2D (``fully_fused_projection``).

World → camera with ``viewmats``, then the EWA projection of the covariance with the
Jacobian of the camera model (``camera.PROJECTIONS``), ``eps2d`` added to the 2D
covariance, its inverse (the conic), radii and culling. Entries that are culled (radii 0)
output zeros for means2d, conics and compensations, and pass no gradient.
"""

from __future__ import annotations

import torch

from ...constants import ALPHA_SKIP, DET_MIN, RADIUS_SIGMAS
from ._vjp import leaf, vjp
from .camera import PROJECTIONS
from .covariance import covar_preci, from_triu


def _values(means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model,
            in_depth, calc_compensations):
    """Differentiable part of the projection. ``in_depth`` [B,C,N] marks the entries whose
    values matter; the others are evaluated at a harmless point so everything stays finite.

    Returns means2d, depths, conics, compensations (or None), cov2d, det_raw.
    """
    if covars is not None:
        covar3 = from_triu(covars)
    else:
        covar3, _ = covar_preci(quats, scales, True, False, False)
    R, t = viewmats[..., :3, :3], viewmats[..., :3, 3]
    means_c = torch.einsum("bcij,bnj->bcni", R, means) + t[:, :, None, :]
    covars_c = torch.einsum("bcij,bnjk,bclk->bcnil", R, covar3, R)
    depths = means_c[..., 2]
    safe_c = torch.where(in_depth[..., None], means_c, torch.ones_like(means_c))
    means2d, J = PROJECTIONS[camera_model](safe_c, Ks, width, height)
    cov2d = J @ covars_c @ J.transpose(-1, -2)
    det_orig = cov2d[..., 0, 0] * cov2d[..., 1, 1] - cov2d[..., 0, 1] * cov2d[..., 1, 0]
    cov2d = cov2d + eps2d * torch.eye(2, dtype=cov2d.dtype, device=cov2d.device)
    det_raw = cov2d[..., 0, 0] * cov2d[..., 1, 1] - cov2d[..., 0, 1] * cov2d[..., 1, 0]
    ok = in_depth & (det_raw > 0)
    det = torch.where(ok, det_raw.clamp_min(DET_MIN), torch.ones_like(det_raw))
    conics = torch.stack(
        [cov2d[..., 1, 1] / det, -0.5 * (cov2d[..., 0, 1] + cov2d[..., 1, 0]) / det,
         cov2d[..., 0, 0] / det],
        dim=-1,
    )
    compensations = None
    if calc_compensations:
        ratio = det_orig / det
        pos = ratio > 0
        compensations = torch.where(
            pos, torch.sqrt(torch.where(pos, ratio, torch.ones_like(ratio))),
            torch.zeros_like(ratio),
        )
    return means2d, depths, conics, compensations, cov2d, det_raw


def _mask(valid, means2d, conics, compensations):
    keep = valid[..., None]
    means2d = torch.where(keep, means2d, torch.zeros_like(means2d))
    conics = torch.where(keep, conics, torch.zeros_like(conics))
    if compensations is not None:
        compensations = torch.where(valid, compensations, torch.zeros_like(compensations))
    return means2d, conics, compensations


def project(means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d,
            near_plane, far_plane, radius_clip, calc_compensations, camera_model):
    """The definition. Shapes: means [B,N,3], covars [B,N,6] or quats [B,N,4] + scales
    [B,N,3], opacities [B,N] or None, viewmats [B,C,4,4], Ks [B,C,3,3].

    Returns radii [B,C,N,2] int32, means2d [B,C,N,2], depths [B,C,N], conics [B,C,N,3],
    compensations [B,C,N] or None.
    """
    with torch.no_grad():
        R, t = viewmats[..., :3, :3], viewmats[..., :3, 3]
        z = torch.einsum("bcj,bnj->bcn", R[..., 2, :], means) + t[..., 2, None]
        in_depth = (z > near_plane) & (z < far_plane)
    means2d, depths, conics, compensations, cov2d, det_raw = _values(
        means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model,
        in_depth, calc_compensations,
    )
    with torch.no_grad():
        valid = in_depth & (det_raw > 0)
        extend = torch.full_like(depths, RADIUS_SIGMAS)
        if opacities is not None:
            opac = opacities[:, None, :].expand_as(depths)
            if compensations is not None:
                opac = opac * compensations
            valid = valid & (opac >= ALPHA_SKIP)
            ratio = torch.clamp(opac / ALPHA_SKIP, min=1.0)
            extend = torch.minimum(extend, torch.sqrt(2.0 * torch.log(ratio)))
        rx = torch.ceil(extend * torch.sqrt(cov2d[..., 0, 0].clamp_min(0)))
        ry = torch.ceil(extend * torch.sqrt(cov2d[..., 1, 1].clamp_min(0)))
        valid = valid & ~((rx <= radius_clip) & (ry <= radius_clip))
        mx, my = means2d[..., 0], means2d[..., 1]
        valid = valid & (mx + rx > 0) & (mx - rx < width) & (my + ry > 0) & (my - ry < height)
        radii = (torch.stack([rx, ry], dim=-1) * valid[..., None]).to(torch.int32)
    means2d, conics, compensations = _mask(valid, means2d, conics, compensations)
    return radii, means2d, depths, conics, compensations


def forward(means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d,
            near_plane, far_plane, radius_clip, calc_compensations, camera_model):
    return project(means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d,
                   near_plane, far_plane, radius_clip, calc_compensations, camera_model)


def backward(means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d,
             camera_model, radii, conics, compensations, v_means2d, v_depths, v_conics,
             v_compensations, need_v_viewmats):
    """Gradients by recomputation; culling is taken from ``radii`` (not re-evaluated)."""
    valid = (radii > 0).all(dim=-1)
    calc_comp = compensations is not None

    def fn(means, covars, quats, scales, viewmats):
        m2d, depths, con, comp, _, _ = _values(
            means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model,
            valid, calc_comp,
        )
        m2d, con, comp = _mask(valid, m2d, con, comp)
        depths = torch.where(valid, depths, torch.zeros_like(depths))
        return m2d, depths, con, comp

    if not need_v_viewmats:
        viewmats = viewmats.detach()
    with torch.enable_grad():
        leaves = [leaf(means), leaf(covars), leaf(quats), leaf(scales),
                  leaf(viewmats) if need_v_viewmats else viewmats]
        outs = fn(*leaves)
        return tuple(vjp(outs, [v_means2d, v_depths, v_conics, v_compensations], leaves))


__all__ = ["backward", "forward", "project"]
