"""What both native launchers of ``fully_fused_projection_with_ut`` (``cpu/ut.py``,
``cuda/ut.py``) hand their kernel besides the Gaussians and the outputs: the cameras as float64
rows (columns ``shared/ut_projection.P_*``) built from the reference's ``Lens`` and ``Shutter``
(``torch/lens.py``: focal lengths, principal point, coefficients, the fisheye's max angle, the
poses' quaternions; a few numbers per camera, on the host), the model's code, the f-theta's
numbers, and the scalar options in the kernels' order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..constants import SHUTTER_GLOBAL
from .shared.ut_projection import (
    MODEL_FISHEYE,
    MODEL_FTHETA,
    MODEL_OPENCV,
    MODEL_PINHOLE,
    N_PARAMS,
    P_C,
    P_F,
    P_K,
    P_MAX_ANGLE,
    P_P,
    P_Q0,
    P_Q1,
    P_R0,
    P_R1,
    P_S,
    P_T0,
    P_T1,
)
from .torch.lens import Lens, Shutter
from .ut_camera import UTCamera, UTParams


def camera_rows(viewmats: torch.Tensor, Ks: torch.Tensor, camera: UTCamera, width: int,
                 height: int, margin: float) -> tuple[np.ndarray, int, np.ndarray, bool]:
    """The cameras [B, C] as the kernel takes them: rows [B, C, N_PARAMS] float64 (columns
    ``ut_projection.P_*``, from the reference's Lens and Shutter), the model's code, the
    f-theta's numbers [17] and whether the shutter rolls."""
    lead = viewmats.shape[:-2]

    def f64(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.detach().double()

    # in float64 whatever the data's type, as the kernel's math (the fisheye's max angle and
    # the poses' quaternions would otherwise be rounded to float32 before the kernel sees them)
    camera = dataclasses.replace(camera, radial=f64(camera.radial),
                                 tangential=f64(camera.tangential),
                                 thin_prism=f64(camera.thin_prism),
                                 viewmats_rs=f64(camera.viewmats_rs))
    lens = Lens(camera, f64(Ks), width, height, margin, 0)
    shutter = Shutter(f64(viewmats), camera.viewmats_rs, camera.shutter, width, height, 0)
    rows = torch.zeros(*lead, N_PARAMS, dtype=torch.float64)

    def put(col: int, t: torch.Tensor) -> None:
        t = t.double().expand(*lead, *t.shape[len(lead):]).reshape(*lead, -1)
        rows[..., col:col + t.shape[-1]] = t

    put(P_R0, shutter.R0)
    put(P_T0, shutter.t0)
    if shutter.rolling:
        put(P_R1, shutter.R1)
        put(P_T1, shutter.t1)
        put(P_Q0, shutter.q0)
        put(P_Q1, shutter.q1)
    put(P_F, lens.focal)
    put(P_C, lens.principal)
    ft = np.zeros(17)
    if lens.model == "fisheye":
        model = MODEL_FISHEYE
        put(P_K, lens.k)
        put(P_MAX_ANGLE, lens.max_angle[..., None])
    elif lens.model == "ftheta":
        model = MODEL_FTHETA
        p = lens.ftheta
        ft[0:6], ft[6:12] = p.angle_to_pixeldist, p.pixeldist_to_angle
        ft[12], ft[13:16] = p.max_angle, p.linear_cde
        ft[16] = p.reference
    elif lens.opencv:
        model = MODEL_OPENCV
        put(P_K, lens.k)
        put(P_P, lens.p)
        put(P_S, lens.s)
    else:
        model = MODEL_PINHOLE
    return rows.numpy(), model, ft, shutter.rolling


def projection_args(
    viewmats: torch.Tensor,  # [B, C, 4, 4]
    Ks: torch.Tensor,  # [B, C, 3, 3]
    camera: UTCamera,  # tensors [B, C, ...]
    width: int,
    height: int,
    dtype: torch.dtype,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    ut: UTParams,
) -> tuple[np.ndarray, np.ndarray, tuple]:
    """(rows [B, C, N_PARAMS] float64, the f-theta's numbers [17], the scalars) of the
    projection kernels' arguments ``cams, model, ft, shutter, rolling, eps, width, height,
    eps2d, near_plane, far_plane, radius_clip, ut_alpha, ut_beta, ut_kappa, margin,
    require_all``: the scalars are ``model`` and those after ``ft``. ``viewmats``, ``Ks`` and
    the camera's tensors on the host."""
    rows, model, ft, rolling = camera_rows(viewmats, Ks, camera, width, height,
                                           ut.in_image_margin_factor)
    scalars = (model, camera.shutter if rolling else SHUTTER_GLOBAL, rolling,
               float(torch.finfo(dtype).eps), width, height, eps2d, near_plane, far_plane,
               radius_clip, ut.alpha, ut.beta, ut.kappa, ut.in_image_margin_factor,
               ut.require_all_sigma_points_valid)
    return rows, ft, scalars
