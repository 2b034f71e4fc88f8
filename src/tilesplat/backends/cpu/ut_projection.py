"""CPU kernels: ``fully_fused_projection_with_ut``, the projection of 3D Gaussians by the
unscented transform through the exact camera (no gradient, as gsplat's). The contract is the
reference's (``backends/torch/ut.py`` ``project_with_ut``, cameras ``backends/torch/lens.py``):
seven sigma points per Gaussian through the lens (perfect or OpenCV pinhole, OpenCV fisheye,
f-theta) at the pose of their pixel's time on a rolling shutter, their weighted mean and
scatter, then the culling and the radii.

One work item is a block of Gaussians of one batch entry (``_common.parallel_for``); each
Gaussian is projected into every camera. The math runs in float64 whatever the data's type
(each result rounded once). The per-camera numbers are the reference's own: the launcher
packs the reference's ``Lens`` and ``Shutter`` (focal lengths, principal point, the lens
coefficients, the fisheye's max angle, the poses and their quaternions) into one float64 row
per camera (``backends/ut_launch.py``), so that the kernel only evaluates the models. The
lens, the shutter, the sigma points and their footprint are ``shared/ut_projection.py``'s
functions, which the cuda kernel compiles too.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..shared import ut_projection as ut_math
from ._common import BLOCK, sm

# the camera and footprint functions of shared/ut_projection.py compiled for the CPU (the
# kernel below is cached; they compile only with it)
_fns = ut_math.compile_for(njit(error_model="numpy"), sm)
_pose = _fns._pose
_transform = _fns._transform
world_to_image = _fns.world_to_image
sigma_points = _fns.sigma_points
footprint = _fns.footprint

@njit(nogil=True, cache=True, error_model="numpy")
def projection_kernel(first, step, means, quats, scales, opacities, cams, model, ft, shutter,
                      rolling, eps, width, height, eps2d, near_plane, far_plane, radius_clip,
                      ut_alpha, ut_beta, ut_kappa, margin, require_all, radii, means2d, depths,
                      conics, comps):
    """Blocks first, first + step, ... of the B * ceil(N / BLOCK) blocks. means [B, N, 3],
    quats [B, N, 4], scales [B, N, 3], opacities [B, N] or [0, 0]; cams [B, C, N_PARAMS];
    outputs radii [B, C, N, 2] int32, means2d [B, C, N, 2], depths [B, C, N], conics
    [B, C, N, 3], comps [B, C, N]."""
    n_batch, n_cams = cams.shape[0], cams.shape[1]
    n = means.shape[1]
    n_blocks = (n + BLOCK - 1) // BLOCK
    has_opac = opacities.shape[0] > 0
    lam = ut_alpha * ut_alpha * (3.0 + ut_kappa) - 3.0
    spread = math.sqrt(3.0 + lam)
    w_mean0 = lam / (3.0 + lam)
    w_mean1 = 1.0 / (2.0 * (3.0 + lam))
    w_cov0 = w_mean0 + 1.0 - ut_alpha * ut_alpha + ut_beta
    pts = np.empty((7, 3))
    img = np.empty((7, 2))
    rot = np.empty(9)
    t = np.empty(3)
    q = np.empty(4)
    for item in range(first, n_batch * n_blocks, step):
        b = item // n_blocks
        blk = item - b * n_blocks
        for g in range(blk * BLOCK, min(n, (blk + 1) * BLOCK)):
            m0, m1, m2 = (np.float64(means[b, g, 0]), np.float64(means[b, g, 1]),
                          np.float64(means[b, g, 2]))
            r = sm.quat_to_rotmat(np.float64(quats[b, g, 0]), np.float64(quats[b, g, 1]),
                                  np.float64(quats[b, g, 2]), np.float64(quats[b, g, 3]))
            sigma_points(pts, m0, m1, m2, r, np.float64(scales[b, g, 0]),
                         np.float64(scales[b, g, 1]), np.float64(scales[b, g, 2]), spread)
            opacity = np.float64(opacities[b, g]) if has_opac else 0.0
            for c in range(n_cams):
                cam = cams[b, c]
                _pose(cam, rolling, 0.5, eps, rot, t, q)
                _, _, depth = _transform(rot, t, m0, m1, m2)
                depths[b, c, g] = depth
                valid = depth >= near_plane and depth <= far_plane
                n_ok = 0
                for sp in range(7):
                    u, v, ok = world_to_image(cam, model, ft, shutter, rolling, eps, width,
                                              height, margin, pts[sp, 0], pts[sp, 1],
                                              pts[sp, 2], rot, t, q)
                    img[sp, 0] = u
                    img[sp, 1] = v
                    n_ok += ok
                valid = valid and (n_ok == 7 if require_all else n_ok > 0)
                (valid, rx, ry, mx, my, conic0, conic1, conic2, comp) = footprint(
                    img, valid, w_mean0, w_mean1, w_cov0, eps2d, has_opac, opacity,
                    radius_clip, width, height)
                radii[b, c, g, 0] = rx
                radii[b, c, g, 1] = ry
                means2d[b, c, g, 0] = mx
                means2d[b, c, g, 1] = my
                conics[b, c, g, 0] = conic0
                conics[b, c, g, 1] = conic1
                conics[b, c, g, 2] = conic2
                comps[b, c, g] = comp
