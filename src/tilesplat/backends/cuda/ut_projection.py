"""CUDA kernel: ``fully_fused_projection_with_ut``, the projection of 3D Gaussians by the
unscented transform through the exact camera (no gradient, as gsplat's). The contract is the
reference's (``backends/torch/ut.py`` ``project_with_ut``); the math is the CPU kernel's
(``cpu/ut_projection.py``, which says how): seven sigma points per Gaussian through the lens
at the pose of their pixel's time on a rolling shutter, their weighted mean and scatter, then
the culling and the radii, in float64 whatever the data's type (each result rounded once).

The camera functions are not written twice: the CPU module's plain Python functions
(``project``, ``world_to_image``, the shutter's pose and time, the f-theta polynomials) are
compiled here as CUDA device functions, each calling the others' CUDA copies
(:func:`_camera_functions`). The cameras come as the CPU launcher builds them
(``cpu/ut.py``'s ``camera_rows``: one float64 row per camera from the reference's ``Lens``
and ``Shutter``). One thread per (batch, camera, Gaussian).
"""

from __future__ import annotations

import math
import types
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_SKIP, RADIUS_SIGMAS
from ..cpu import ut_projection as cpu_projection
from ..torch.ut import EIGEN_GAP_MIN
from .device_math import device_math
from .runtime import jit

THREADS = 128
# the CPU module's camera functions, in the order they call each other
CAMERA_FUNCTIONS = ("_horner", "_horner_derivative", "project", "_transform", "_shutter_time",
                    "_pose", "world_to_image")


@cache
def _camera_functions() -> types.SimpleNamespace:
    """CUDA device copies of the CPU module's camera functions: each one's globals are the
    CPU module's with the scalar math (``sm``) and the other camera functions replaced by
    their device copies."""
    namespace = dict(vars(cpu_projection))
    namespace["sm"] = device_math()
    out = {}
    for name in CAMERA_FUNCTIONS:
        py = getattr(cpu_projection, name).py_func
        fn = types.FunctionType(py.__code__, namespace, name, py.__defaults__, py.__closure__)
        out[name] = namespace[name] = cuda.jit(device=True, inline=True)(fn)
    return types.SimpleNamespace(**out)


def make_ut_projection(ft: type):
    """Kernel body of the unscented-transform projection for float type ``ft``."""
    cam_fns = _camera_functions()
    pose = cam_fns._pose
    transform = cam_fns._transform
    world_to_image = cam_fns.world_to_image
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
        pts[0, 0] = m0
        pts[0, 1] = m1
        pts[0, 2] = m2
        for i in range(3):  # axis i: column i of R times its scale
            s = spread * f64(scales[b, g, i])
            for k in range(3):
                pts[1 + i, k] = pts[0, k] + s * r[3 * k + i]
                pts[4 + i, k] = pts[0, k] - s * r[3 * k + i]
        cam = cams[b, c]
        pose(cam, rolling, 0.5, eps, rot, t, q)
        _, _, depth = transform(rot, t, m0, m1, m2)
        depths[b, c, g] = depth
        valid = depth >= near_plane and depth <= far_plane
        n_ok = 0
        mx = 0.0
        my = 0.0
        for sp in range(7):
            u, v, ok = world_to_image(cam, model, ftheta, shutter, rolling, eps, width, height,
                                      margin, pts[sp, 0], pts[sp, 1], pts[sp, 2], rot, t, q)
            img[sp, 0] = u
            img[sp, 1] = v
            if ok:
                n_ok += 1
            w = w_mean0 if sp == 0 else w_mean1
            mx += w * u
            my += w * v
        valid = valid and (n_ok == 7 if require_all else n_ok > 0)
        c00 = 0.0
        c01 = 0.0
        c11 = 0.0
        for sp in range(7):
            w = w_cov0 if sp == 0 else w_mean1
            du = img[sp, 0] - mx
            dv = img[sp, 1] - my
            c00 += w * du * du
            c01 += w * du * dv
            c11 += w * dv * dv
        det_orig = c00 * c11 - c01 * c01
        a = c00 + eps2d
        cc = c11 + eps2d
        det = a * cc - c01 * c01
        valid = valid and det > 0.0
        safe_det = det if valid else 1.0
        comp = math.sqrt(max(det_orig / safe_det, 0.0))
        extend = RADIUS_SIGMAS
        if has_opac:
            opac = f64(opacities[b, g]) * comp
            valid = valid and opac >= ALPHA_SKIP
            extend = min(extend, math.sqrt(2.0 * math.log(max(opac / ALPHA_SKIP, 1.0))))
        half = 0.5 * (a + cc)
        v1 = half + math.sqrt(max(half * half - det, EIGEN_GAP_MIN))
        r1 = extend * math.sqrt(max(v1, 0.0))
        rx = math.ceil(min(extend * math.sqrt(max(a, 0.0)), r1))
        ry = math.ceil(min(extend * math.sqrt(max(cc, 0.0)), r1))
        valid = valid and not (rx <= radius_clip and ry <= radius_clip)
        valid = valid and mx + rx > 0 and mx - rx < width and my + ry > 0 and my - ry < height
        if valid:
            radii[b, c, g, 0] = int(rx)
            radii[b, c, g, 1] = int(ry)
            means2d[b, c, g, 0] = ft(mx)
            means2d[b, c, g, 1] = ft(my)
            conics[b, c, g, 0] = ft(cc / safe_det)
            conics[b, c, g, 1] = ft(-c01 / safe_det)
            conics[b, c, g, 2] = ft(a / safe_det)
            comps[b, c, g] = ft(comp)
        else:
            radii[b, c, g, 0] = 0
            radii[b, c, g, 1] = 0
            for k in range(2):
                means2d[b, c, g, k] = ft(0.0)
            for k in range(3):
                conics[b, c, g, k] = ft(0.0)
            comps[b, c, g] = ft(0.0)

    return ut_projection


@cache
def projection_kernel(ft: type):
    return jit(make_ut_projection(ft), THREADS)
