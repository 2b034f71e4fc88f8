"""Launchers of the CPU fused projection (``fully_fused_projection``): they allocate the outputs
and run the kernels of ``projection_fwd`` and ``projection_bwd`` over threads.
"""

from __future__ import annotations

import numpy as np
import torch

from ..cameras import camera_code
from ._common import BLOCK, alloc, parallel_for, view
from .projection_bwd import CHUNK, backward_kernel, reduce_viewmats
from .projection_fwd import forward_kernel


def _np_or_empty(t: torch.Tensor | None, ndim: int, np_dt: np.dtype) -> np.ndarray:
    return view(t) if t is not None else np.zeros((0,) * ndim, np_dt)


def forward(
    means,
    covars,
    quats,
    scales,
    opacities,
    viewmats,
    Ks,
    width,
    height,
    eps2d,
    near_plane,
    far_plane,
    radius_clip,
    calc_compensations,
    camera_model,
):
    """Shapes: means [B,N,3], covars [B,N,6] or quats [B,N,4] + scales [B,N,3], opacities
    [B,N] or None, viewmats [B,C,4,4], Ks [B,C,3,3].

    Returns radii [B,C,N,2] int32, means2d [B,C,N,2], depths [B,C,N], conics [B,C,N,3],
    compensations [B,C,N] or None.
    """
    n_b, n_g = means.shape[:2]
    n_c = viewmats.shape[1]
    dt = means.dtype
    np_dt = view(means).dtype
    radii = alloc((n_b, n_c, n_g, 2), torch.int32)
    means2d = alloc((n_b, n_c, n_g, 2), dt)
    depths = alloc((n_b, n_c, n_g), dt)
    conics = alloc((n_b, n_c, n_g, 3), dt)
    comps = alloc((n_b, n_c, n_g), dt) if calc_compensations else None
    parallel_for(
        forward_kernel,
        n_b * ((n_g + BLOCK - 1) // BLOCK),
        view(means),
        _np_or_empty(covars, 3, np_dt),
        _np_or_empty(quats, 3, np_dt),
        _np_or_empty(scales, 3, np_dt),
        _np_or_empty(opacities, 2, np_dt),
        view(viewmats),
        view(Ks),
        width,
        height,
        float(eps2d),
        float(near_plane),
        float(far_plane),
        float(radius_clip),
        camera_code(camera_model),
        view(radii),
        view(means2d),
        view(depths),
        view(conics),
        _np_or_empty(comps, 3, np_dt),
    )
    return radii, means2d, depths, conics, comps


def backward(
    means,
    covars,
    quats,
    scales,
    opacities,
    viewmats,
    Ks,
    width,
    height,
    eps2d,
    camera_model,
    radii,
    conics,
    compensations,
    v_means2d,
    v_depths,
    v_conics,
    v_compensations,
    need_v_viewmats,
):
    """Returns v_means [B,N,3], v_covars [B,N,6] or None, v_quats [B,N,4] or None,
    v_scales [B,N,3] or None, v_viewmats [B,C,4,4] or None."""
    del opacities, conics
    n_b, n_g = means.shape[:2]
    n_c = viewmats.shape[1]
    dt = means.dtype
    np_dt = view(means).dtype
    v_means = alloc((n_b, n_g, 3), dt)
    v_covars = alloc((n_b, n_g, 6), dt) if covars is not None else None
    v_quats = alloc((n_b, n_g, 4), dt) if covars is None else None
    v_scales = alloc((n_b, n_g, 3), dt) if covars is None else None
    calc_comp = compensations is not None and v_compensations is not None
    n_chunks = n_b * ((n_g + CHUNK - 1) // CHUNK)
    vm_part = np.empty((n_chunks if need_v_viewmats else 0, n_c, 12), np_dt)
    parallel_for(
        backward_kernel,
        n_chunks,
        view(means),
        _np_or_empty(covars, 3, np_dt),
        _np_or_empty(quats, 3, np_dt),
        _np_or_empty(scales, 3, np_dt),
        view(viewmats),
        view(Ks),
        width,
        height,
        float(eps2d),
        camera_code(camera_model),
        view(radii),
        view(v_means2d.contiguous()),
        view(v_depths.contiguous()),
        view(v_conics.contiguous()),
        view(v_compensations.contiguous()) if calc_comp else np.zeros((0, 0, 0), np_dt),
        view(v_means),
        _np_or_empty(v_covars, 3, np_dt),
        _np_or_empty(v_quats, 3, np_dt),
        _np_or_empty(v_scales, 3, np_dt),
        vm_part,
    )
    v_viewmats = None
    if need_v_viewmats:
        v_viewmats = alloc((n_b, n_c, 4, 4), dt)
        if n_chunks > 0:
            reduce_viewmats(vm_part, n_b, view(v_viewmats))
        else:
            v_viewmats.zero_()
    return v_means, v_covars, v_quats, v_scales, v_viewmats
