"""3DGUT in ``rasterization()`` (gsplat 1.5.3's ``with_ut``, ``with_eval3d``, lens coefficients
and rolling shutter): the arguments checked and refused as gsplat refuses them, and the two
steps they change, the projection (``with_ut``: the unscented transform) and the rasterizer
(``with_eval3d``: Gaussians evaluated in 3D along the pixels' rays).

gsplat's refusals, each a ``ValueError`` naming the argument: distortion coefficients,
``ftheta_coeffs``, ``camera_model="ftheta"`` or a rolling shutter without ``with_ut=True``; a
rolling shutter without ``viewmats_rs`` or ``viewmats_rs`` without one; ``with_ut`` or
``with_eval3d`` with ``covars`` (they need quats and scales) or ``sparse_grad=True``.
gsplat also refuses ``packed=True`` (its eval3d has no packed colours); tilesplat renders it:
the UT projection's visible pairs are packed as ``fully_fused_projection(packed=True)``
packs its own, and the eval3d rasterizer takes packed colours (``ops/ut_packed.py``, the
memory of the unpacked call). tilesplat adds: ``absgrad=True`` with ``with_eval3d`` (its
rasterizer has no 2D means to take the gradient of; gsplat ignores the flag and leaves no
``absgrad``).

``distributed=True`` (tilesplat's; gsplat 1.5.3 gathers only ``viewmats`` and ``Ks``, so its
3DGUT renders break there): each rank projects its Gaussians into every rank's cameras, so the
lens tensors of the cameras (the coefficients and ``viewmats_rs``) are gathered as the cameras
are (:func:`gather_cameras`); the eval3d rasterizer of a rank's own cameras evaluates every
rank's Gaussians in 3D, so their means, quats and scales are gathered too
(:func:`gather_gaussians`, whose backward sums each rank's gradients into the rank that owns
the Gaussian). Every rank passes the same kinds of lens tensors (the gathers are collective).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ..constants import SHUTTER_GLOBAL
from ..distributed import all_gather_tensor_list
from ..ops.lens import check_camera, check_camera_values, shutter_code
from ..ops.ut import fully_fused_projection_with_ut, rasterize_to_pixels_eval3d
from ..ops.validation import Shapes, check_bool, check_tensor


@dataclass(frozen=True)
class UTRender:
    """What a 3DGUT render passes its two ops: which of them it uses, and the camera keywords
    (``camera_model``, the coefficients, ``rolling_shutter``, ``viewmats_rs``)."""

    with_ut: bool
    with_eval3d: bool
    camera: dict[str, Any] = field(default_factory=dict)


def check_arguments(
    shapes: Shapes,  # bound: the batch dims and C
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    camera_model: str,
    with_ut: bool,
    with_eval3d: bool,
    radial_coeffs: Tensor | None,
    tangential_coeffs: Tensor | None,
    thin_prism_coeffs: Tensor | None,
    ftheta_coeffs: Any,
    rolling_shutter: object,
    viewmats_rs: Tensor | None,
    covars: Tensor | None,
    sparse_grad: bool,
    absgrad: bool,
) -> UTRender | None:
    """The 3DGUT arguments of a ``rasterization()`` call checked (the lens's values too, once:
    the ops skip them inside its ``internal_call``); None for a plain 3DGS render."""
    check_bool("with_ut", with_ut)
    check_bool("with_eval3d", with_eval3d)
    rolling = shutter_code(rolling_shutter) != SHUTTER_GLOBAL
    if not with_ut:
        given = {"radial_coeffs": radial_coeffs, "tangential_coeffs": tangential_coeffs,
                 "thin_prism_coeffs": thin_prism_coeffs, "ftheta_coeffs": ftheta_coeffs}
        for name, value in given.items():
            if value is not None:
                raise ValueError(f"rasterization({name}=...) needs with_ut=True (distortion "
                                 "is only supported with the unscented transform, as in gsplat)")
        if rolling:
            raise ValueError("rasterization(rolling_shutter=...) needs with_ut=True (a rolling "
                             "shutter is only supported with the unscented transform, as in "
                             "gsplat)")
        if camera_model == "ftheta":
            raise ValueError("rasterization(camera_model='ftheta') needs with_ut=True (the "
                             "f-theta camera projects only by the unscented transform)")
    if rolling and viewmats_rs is None:
        raise ValueError("rasterization(rolling_shutter=...) needs viewmats_rs, the pose at the "
                         "end of the exposure [..., C, 4, 4]")
    if not rolling and viewmats_rs is not None:
        raise ValueError("rasterization(viewmats_rs=...) is for a rolling shutter; with "
                         "rolling_shutter=GLOBAL leave it None")
    if not (with_ut or with_eval3d):
        return None
    what = "with_ut" if with_ut else "with_eval3d"
    if covars is not None:
        raise ValueError(f"rasterization({what}=True) needs quats and scales, not covars")
    if sparse_grad:
        raise ValueError(f"rasterization({what}=True) does not support sparse_grad=True")
    if absgrad and with_eval3d:
        raise ValueError("rasterization(with_eval3d=True) does not support absgrad=True: its "
                         "rasterizer evaluates Gaussians in 3D and gives means2d no gradient")
    check_tensor("Ks", Ks)
    shapes.check("Ks", Ks, "..., C, 3, 3")
    camera = check_camera(shapes, camera_model, Ks, width, height, radial_coeffs,
                          tangential_coeffs, thin_prism_coeffs, ftheta_coeffs, rolling_shutter,
                          viewmats_rs)
    check_camera_values(camera, Ks, width, height)
    return UTRender(with_ut, with_eval3d, {
        "camera_model": camera_model, "radial_coeffs": radial_coeffs,
        "tangential_coeffs": tangential_coeffs, "thin_prism_coeffs": thin_prism_coeffs,
        "ftheta_coeffs": ftheta_coeffs, "rolling_shutter": rolling_shutter,
        "viewmats_rs": viewmats_rs,
    })


_LENS_TENSORS = ("radial_coeffs", "tangential_coeffs", "thin_prism_coeffs", "viewmats_rs")


def gather_cameras(ut: UTRender, world_size: int) -> UTRender:
    """The render's lens tensors ([C, *] each) of every rank's cameras, rank 0's first
    ([C_all, *]), as ``sharding.gather_cameras`` gathers ``viewmats`` and ``Ks``."""
    names = [k for k in _LENS_TENSORS if ut.camera[k] is not None]
    if not names:
        return ut
    got = all_gather_tensor_list(world_size, [ut.camera[k] for k in names])
    return UTRender(ut.with_ut, ut.with_eval3d, {**ut.camera, **dict(zip(names, got,
                                                                         strict=True))})


def gather_gaussians(
    world_size: int,
    means: Tensor,  # [N_rank, 3]
    quats: Tensor,  # [N_rank, 4]
    scales: Tensor,  # [N_rank, 3]
) -> tuple[Tensor, Tensor, Tensor]:
    """Every rank's means [N_all, 3], quats [N_all, 4] and scales [N_all, 3], rank 0's first
    (the order of the exchanged pairs), for the eval3d rasterizer; differentiable, the
    gradients going back to the rank that holds the Gaussian."""
    m, q, s = all_gather_tensor_list(world_size, [means, quats, scales])
    return m, q, s


def project(
    ut: UTRender,
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    calc_compensations: bool,
    packed: bool,
    backend: str | None,
) -> tuple[Tensor | None, ...]:
    """The unscented-transform projection (no gradient), as gsplat's ``rasterization`` calls
    it: the opacities tighten the radii. Unpacked: radii, means2d, depths, conics,
    compensations, [..., C, N, *] each; packed: batch_ids, camera_ids, gaussian_ids [nnz]
    int64 of the pairs whose radii are positive, then those tensors' rows [nnz, *], as
    ``fully_fused_projection(packed=True)`` returns them."""
    proj = fully_fused_projection_with_ut(
        means, quats, scales, opacities, viewmats, Ks, width, height, eps2d=eps2d,
        near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip,
        calc_compensations=calc_compensations, backend=backend, **ut.camera,
    )
    if not packed:
        return proj
    B, C, N = math.prod(means.shape[:-2]), viewmats.shape[-3], means.shape[-2]
    radii = proj[0].reshape(B, C, N, 2)
    b, c, n = (radii > 0).all(dim=-1).nonzero(as_tuple=True)
    return (b, c, n, *(None if t is None else t.reshape(B, C, N, *t.shape[means.dim() :])
                       [b, c, n] for t in proj))


def rasterize(
    ut: UTRender,
    means: Tensor,  # [..., N, 3]
    quats: Tensor,  # [..., N, 4]
    scales: Tensor,  # [..., N, 3]
    colors: Tensor,  # [..., C, N, D] or [nnz, D]
    opacities: Tensor,  # [..., C, N] or [nnz]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,  # [..., C, TH, TW]
    flatten_ids: Tensor,  # [n]
    backgrounds: Tensor | None,  # [..., C, D]
    backend: str | None,
    gaussian_ids: Tensor | None = None,  # [nnz] with packed colours
) -> tuple[Tensor, Tensor, Tensor]:
    """The eval3d rasterizer: render_colors [..., C, H, W, D], render_alphas [..., C, H, W, 1]
    and last_ids [..., C, H, W]."""
    return rasterize_to_pixels_eval3d(
        means, quats, scales, colors, opacities, viewmats, Ks, width, height, tile_size,
        isect_offsets, flatten_ids, backgrounds=backgrounds, gaussian_ids=gaussian_ids,
        return_last_ids=True, backend=backend, **ut.camera,
    )
