"""CUDA kernel: ``fully_fused_projection_with_ut``, the projection of 3D Gaussians by the
unscented transform through the exact camera (no gradient, as gsplat's). The contract is the
reference's (``backends/torch/ut.py`` ``project_with_ut``); the math is the CPU kernel's
(``cpu/ut_projection.py``, which says how): seven sigma points per Gaussian through the lens
at the pose of their pixel's time on a rolling shutter, their weighted mean and scatter, then
the culling and the radii, in float64 whatever the data's type (each result rounded once).

The camera, sigma-point and footprint functions are not written twice: the plain Python
functions of ``shared/ut_projection.py`` (``project``, ``world_to_image``, the shutter's pose
and time, the f-theta polynomials, ``sigma_points``, ``footprint``) are compiled here as CUDA
device functions, as the CPU kernel compiles them with ``njit`` (:func:`_device_functions`).
The cameras come as both launchers build them (``backends/ut_launch.py``: one float64 row per
camera from the reference's ``Lens`` and ``Shutter``). One thread per (batch, camera,
Gaussian).
"""

from __future__ import annotations

import math
import types
from functools import cache

import numpy as np
from numba import cuda

from ..shared import ut_projection as ut_math
from .device_math import device_math
from .runtime import jit

THREADS = 128


@cache
def _device_functions() -> types.SimpleNamespace:
    """CUDA device copies of ``shared/ut_projection.py``'s camera and footprint functions."""
    return ut_math.compile_for(cuda.jit(device=True, inline=True), device_math())


def make_ut_projection(ft: type):
    """Kernel body of the unscented-transform projection for float type ``ft``."""
    fns = _device_functions()
    pose = fns._pose
    transform = fns._transform
    world_to_image = fns.world_to_image
    sigma_points = fns.sigma_points
    footprint = fns.footprint
    quat_to_rotmat = device_math().quat_to_rotmat
    f64 = np.float64

    def ut_projection(
        means, quats, scales, opacities, has_opac,  # [B,N,3], [B,N,4], [B,N,3], [B,N] | [1,1]
        cams, model, ftheta, shutter, rolling,  # [B, C, N_PARAMS] f64, int, [17] f64, ...
        eps, width, height, eps2d, near_plane, far_plane, radius_clip,
        ut_alpha, ut_beta, ut_kappa, margin, require_all,
        radii, means2d, depths, conics, comps,  # [B,C,N,2] i32, [B,C,N,2], [B,C,N], ..
    ):  # fmt: skip
        idx = cuda.grid(1)
        n_batch = cams.shape[0]
        n_cams = cams.shape[1]
        n = means.shape[1]
        if idx >= n_batch * n_cams * n:
            return
        g = idx % n
        c = (idx // n) % n_cams
        b = idx // (n * n_cams)
        pts = cuda.local.array((7, 3), np.float64)
        img = cuda.local.array((7, 2), np.float64)
        rot = cuda.local.array(9, np.float64)
        t = cuda.local.array(3, np.float64)
        q = cuda.local.array(4, np.float64)
        lam = ut_alpha * ut_alpha * (3.0 + ut_kappa) - 3.0
        spread = math.sqrt(3.0 + lam)
        w_mean0 = lam / (3.0 + lam)
        w_mean1 = 1.0 / (2.0 * (3.0 + lam))
        w_cov0 = w_mean0 + 1.0 - ut_alpha * ut_alpha + ut_beta

        m0 = f64(means[b, g, 0])
        m1 = f64(means[b, g, 1])
        m2 = f64(means[b, g, 2])
        r = quat_to_rotmat(f64(quats[b, g, 0]), f64(quats[b, g, 1]), f64(quats[b, g, 2]),
                           f64(quats[b, g, 3]))
        sigma_points(pts, m0, m1, m2, r, f64(scales[b, g, 0]), f64(scales[b, g, 1]),
                     f64(scales[b, g, 2]), spread)
        cam = cams[b, c]
        pose(cam, rolling, 0.5, eps, rot, t, q)
        _, _, depth = transform(rot, t, m0, m1, m2)
        depths[b, c, g] = depth
        valid = depth >= near_plane and depth <= far_plane
        n_ok = 0
        for sp in range(7):
            u, v, ok = world_to_image(cam, model, ftheta, shutter, rolling, eps, width, height,
                                      margin, pts[sp, 0], pts[sp, 1], pts[sp, 2], rot, t, q)
            img[sp, 0] = u
            img[sp, 1] = v
            if ok:
                n_ok += 1
        valid = valid and (n_ok == 7 if require_all else n_ok > 0)
        opacity = f64(opacities[b, g]) if has_opac else 0.0
        (valid, rx, ry, mx, my, conic0, conic1, conic2, comp) = footprint(
            img, valid, w_mean0, w_mean1, w_cov0, eps2d, has_opac, opacity, radius_clip, width,
            height)
        radii[b, c, g, 0] = rx
        radii[b, c, g, 1] = ry
        means2d[b, c, g, 0] = ft(mx)
        means2d[b, c, g, 1] = ft(my)
        conics[b, c, g, 0] = ft(conic0)
        conics[b, c, g, 1] = ft(conic1)
        conics[b, c, g, 2] = ft(conic2)
        comps[b, c, g] = ft(comp)

    return ut_projection


@cache
def projection_kernel(ft: type):
    return jit(make_ut_projection(ft), THREADS)
