"""3DGUT in the torch reference (gsplat 1.5.3's ``fully_fused_projection_with_ut``,
``rasterize_to_pixels_eval3d`` and ``rasterization(with_ut=, with_eval3d=, ...)``).

- the eval3d rasterizer's gradients (float64 gradcheck, odd image sizes, backgrounds and a
  masked tile) for every camera kind and every shutter;
- the unscented transform of a perfect pinhole against ``fully_fused_projection``: the same
  depths, radii and tile lists, and means that differ by exactly the second-order term;
- the rolling shutter by its definition (one pose: the global shutter; each row or column:
  the global render at the pose of its time; a projected point at the pose of its pixel's
  time);
- the lens models against each other (OpenCV with zero coefficients is the perfect pinhole,
  a linear f-theta is the equidistant fisheye) and their inverses;
- gsplat's ``simple_trainer.py`` call through ``import tilesplat as gsplat``, batch dims,
  ``with_ut`` and ``with_eval3d`` each alone, a backend without the ops, ``auto``'s fallback,
  and every bad input's ValueError. The cpu backend's kernels: tests/test_ut_cpu.py; the cuda
  backend's: tests/test_ut_cuda.py.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.transform import Rotation, Slerp
from torch import Tensor

import tilesplat as gsplat
from helpers import assert_close
from tilesplat.backends import registry
from tilesplat.backends.torch import lens
from tilesplat.ops.camera import (
    FThetaCameraDistortionParameters,
    FThetaPolynomialType,
    RollingShutterType,
    UnscentedTransformParameters,
)

DT = torch.float64
W, H, TILE = 13, 11, 4  # odd sizes: the last tile row and column are partial
TW, TH = math.ceil(W / TILE), math.ceil(H / TILE)
F_PX = 14.0
ROLLING = [s for s in RollingShutterType if s is not RollingShutterType.GLOBAL]


@pytest.fixture(autouse=True)
def _reference_backend():
    with gsplat.use_backend("torch"):  # the reference under test; no kernel compilation
        yield


def _ftheta(reference: FThetaPolynomialType) -> FThetaCameraDistortionParameters:
    """An f-theta lens near F_PX px/rad: delta = F theta - 0.5 theta³ and its approximate
    inverse theta = delta / F + 0.5 delta³ / F⁴ (each exact when it is the reference)."""
    fw = (0.0, F_PX, 0.0, -0.5, 0.0, 0.0)
    bw = (0.0, 1.0 / F_PX, 0.0, 0.5 / F_PX**4, 0.0, 0.0)
    return FThetaCameraDistortionParameters(reference, bw, fw, 1.2, (1.01, 0.01, -0.005))


def _camera(kind: str, C: int = 1) -> dict:
    """The camera keywords of a kind, coefficients repeated for C cameras."""
    rep = lambda *v: torch.tensor([v] * C, dtype=DT)  # noqa: E731
    return {
        "pinhole": {},
        "pinhole_distorted": {
            "radial_coeffs": rep(-0.05, 0.01, 0.002, 0.01, 0.0, 0.0),
            "tangential_coeffs": rep(1e-3, -2e-3),
            "thin_prism_coeffs": rep(1e-3, 0.0, -1e-3, 0.0),
        },
        "fisheye_distorted": {"camera_model": "fisheye",
                              "radial_coeffs": rep(0.02, -0.005, 0.001, 0.0)},
        "ftheta": {"camera_model": "ftheta",
                   "ftheta_coeffs": _ftheta(FThetaPolynomialType.ANGLE_TO_PIXELDIST)},
        "ftheta_backward_reference": {
            "camera_model": "ftheta",
            "ftheta_coeffs": _ftheta(FThetaPolynomialType.PIXELDIST_TO_ANGLE)},
    }[kind]


def _rotz(angle: float) -> Tensor:
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]], dtype=DT)


def _views(C: int = 1):
    """viewmats [C, 4, 4], Ks [C, 3, 3], and the end-of-exposure poses viewmats_rs (moved
    0.15 sideways and turned 0.1 rad about the optical axis)."""
    view = torch.eye(4, dtype=DT).repeat(C, 1, 1)
    view[:, 2, 3] = 3.0
    view[:, 0, 3] = torch.linspace(-0.1, 0.1, C, dtype=DT)
    K = torch.tensor([[F_PX, 0, 6.3], [0, F_PX * 1.05, 5.2], [0, 0, 1]], dtype=DT).repeat(C, 1, 1)
    view_rs = view.clone()
    view_rs[:, 0, 3] += 0.15
    view_rs[:, :3, :3] = _rotz(0.1) @ view_rs[:, :3, :3]
    return view, K, view_rs


def _gaussians(n: int = 4, seed: int = 1, scale: float = 0.12):
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g, dtype=DT) - 0.5) * torch.tensor([1.2, 1.0, 0.6],
                                                                           dtype=DT)
    quats = F.normalize(torch.randn(n, 4, generator=g, dtype=DT), dim=-1)
    scales = torch.rand(n, 3, generator=g, dtype=DT) * 0.15 + scale
    opacities = torch.rand(n, generator=g, dtype=DT) * 0.4 + 0.5
    return means, quats, scales, opacities


def _shutter(shutter: RollingShutterType, view_rs: Tensor) -> dict:
    if shutter is RollingShutterType.GLOBAL:
        return {}
    return {"rolling_shutter": shutter, "viewmats_rs": view_rs}


def _lists_from_ut(means, quats, scales, opacities, view, K, camera: dict):
    radii, m2d, depths, _, _ = gsplat.fully_fused_projection_with_ut(
        means, quats, scales, opacities, view, K, W, H, **camera)
    _, isect_ids, flatten_ids = gsplat.isect_tiles(m2d, radii, depths, TILE, TW, TH)
    offsets = gsplat.isect_offset_encode(isect_ids, view.shape[0], TW, TH)
    return radii, offsets, flatten_ids


# ---------------------------------------------------------------------------------------------
# the eval3d rasterizer's gradients


@pytest.mark.parametrize("shutter", list(RollingShutterType), ids=lambda s: s.name)
@pytest.mark.parametrize("kind", ["pinhole", "pinhole_distorted", "fisheye_distorted", "ftheta",
                                  "ftheta_backward_reference"])
def test_eval3d_gradcheck(kind, shutter):
    means, quats, scales, opacities = _gaussians()
    view, K, view_rs = _views()
    camera = {**_camera(kind), **_shutter(shutter, view_rs)}
    radii, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, camera)
    assert int((radii > 0).all(-1).sum()) >= 3  # the lens sees the scene
    g = torch.Generator().manual_seed(2)
    colors = torch.rand(1, 4, 2, generator=g, dtype=DT)
    backgrounds = torch.rand(1, 2, generator=g, dtype=DT)
    masks = torch.ones(1, TH, TW, dtype=torch.bool)
    masks[0, 1, 2] = False

    def render(means, quats, scales, colors, opacities, backgrounds):
        return gsplat.rasterize_to_pixels_eval3d(
            means, quats, scales, colors, opacities, view, K, W, H, TILE, offsets, flatten_ids,
            backgrounds=backgrounds, masks=masks, **camera)

    inputs = [x.clone().requires_grad_(True)
              for x in (means, quats, scales, colors, opacities[None], backgrounds)]
    with torch.no_grad():
        image, alpha = render(*inputs)
    assert float(alpha.max()) > 0.5
    # the masked tile: background, alpha 0
    tile = (slice(1 * TILE, 2 * TILE), slice(2 * TILE, 3 * TILE))
    assert torch.equal(alpha[0, tile[0], tile[1]], torch.zeros_like(alpha[0, tile[0], tile[1]]))
    assert torch.equal(image[0, tile[0], tile[1]],
                       backgrounds[0].expand_as(image[0, tile[0], tile[1]]))
    assert torch.autograd.gradcheck(render, inputs, eps=1e-6, atol=1e-8, rtol=1e-5,
                                    fast_mode=True)


def test_eval3d_backward_is_autograd_of_the_definition():
    """The op's bucket-by-bucket backward against autograd straight through ``composite``."""
    from tilesplat.backends.torch import ut

    means, quats, scales, opacities = _gaussians(6, seed=4)
    view, K, view_rs = _views()
    camera = {**_camera("pinhole_distorted"),
              **_shutter(RollingShutterType.ROLLING_LEFT_TO_RIGHT, view_rs)}
    _, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, camera)
    g = torch.Generator().manual_seed(3)
    colors = torch.rand(1, 6, 3, generator=g, dtype=DT)
    bg = torch.rand(1, 3, generator=g, dtype=DT)
    v_img, v_alpha = torch.randn(1, H, W, 3, dtype=DT), torch.randn(1, H, W, 1, dtype=DT)
    leaves = [x.clone().requires_grad_(True) for x in (means, quats, scales, colors, opacities,
                                                       bg)]
    img, alpha = gsplat.rasterize_to_pixels_eval3d(
        leaves[0], leaves[1], leaves[2], leaves[3], leaves[4][None], view, K, W, H, TILE,
        offsets, flatten_ids, backgrounds=leaves[5], **camera)
    ours = torch.autograd.grad([img, alpha], leaves, [v_img, v_alpha])
    from tilesplat.ops.lens import check_camera
    from tilesplat.ops.validation import Shapes

    s = Shapes()
    s.check("viewmats", view, "..., C, 4, 4")
    cam = check_camera(s, "pinhole", K, W, H, camera["radial_coeffs"],
                       camera["tangential_coeffs"], camera["thin_prism_coeffs"], None,
                       camera["rolling_shutter"], camera["viewmats_rs"])
    leaves2 = [x.clone().requires_grad_(True) for x in (means, quats, scales, colors, opacities,
                                                        bg)]
    img2, alpha2, _ = ut.composite(
        leaves2[0][None], leaves2[1][None], leaves2[2][None], leaves2[3].reshape(-1, 3),
        leaves2[4], leaves2[5], None, view, K, W, H, TILE, offsets.int(), flatten_ids.int(),
        cam)
    assert_close("render", img2, img, 1e-12, 1e-12)
    theirs = torch.autograd.grad([img2, alpha2], leaves2, [v_img, v_alpha])
    for name, a, b in zip(("means", "quats", "scales", "colors", "opacities", "backgrounds"),
                          ours, theirs, strict=True):
        assert_close(f"v_{name}", a, b.reshape(a.shape), 1e-10, 1e-8)
    assert float(ours[0].abs().sum()) > 0


def test_eval3d_refuses_a_viewmats_gradient_as_gsplat():
    means, quats, scales, opacities = _gaussians()
    view, K, _ = _views()
    _, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, {})
    view = view.clone().requires_grad_(True)
    img, _ = gsplat.rasterize_to_pixels_eval3d(
        means, quats, scales, torch.ones(1, 4, 3, dtype=DT), opacities[None], view, K, W, H,
        TILE, offsets, flatten_ids)
    with pytest.raises(ValueError, match="viewmats"):
        img.sum().backward()


# ---------------------------------------------------------------------------------------------
# the unscented transform against the EWA projection


def test_ut_pinhole_is_the_ewa_projection_to_second_order():
    """A perfect pinhole, global shutter: the UT mean is the projected mean plus the
    second-order term 1/2 tr(Hess(u) Sigma_c) (to 1e-5 px: the rest is alpha² times higher
    orders), the same depths, radii and tile lists, conics and compensations to 1e-3."""
    from helpers import cameras, random_gaussians

    w, h = 37, 29
    means, quats, scales, opacities, _ = random_gaussians(40, dtype=DT, seed=3, scale=0.1)
    view, K = cameras(2, w, h, dtype=DT)
    ewa = gsplat.fully_fused_projection(means, None, quats, scales, view, K, w, h,
                                        opacities=opacities, calc_compensations=True)
    ut = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, w, h,
                                               calc_compensations=True)
    assert torch.equal(ut[0], ewa[0])
    visible = (ewa[0] > 0).all(-1)
    assert int(visible.sum()) > 40
    assert torch.equal(ut[2], ewa[2])
    covar, _ = gsplat.quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    R, t = view[:, :3, :3], view[:, :3, 3]
    mc = torch.einsum("cij,nj->cni", R, means) + t[:, None]
    sc = torch.einsum("cij,njk,clk->cnil", R, covar, R)
    x, y, z = mc.unbind(-1)
    fx, fy = K[:, 0, 0, None], K[:, 1, 1, None]
    second = torch.stack([fx * (x * sc[..., 2, 2] / z**3 - sc[..., 0, 2] / z**2),
                          fy * (y * sc[..., 2, 2] / z**3 - sc[..., 1, 2] / z**2)], dim=-1)
    assert float(second[visible].abs().max()) > 1e-3  # the term is there to see
    assert_close("means2d", ut[1][visible], (ewa[1] + second)[visible], 1e-5, 0)
    scale = ewa[3].abs().amax(-1, keepdim=True)
    assert_close("conics", (ut[3] / scale)[visible], (ewa[3] / scale)[visible], 1e-3, 0)
    assert_close("compensations", ut[4][visible], ewa[4][visible], 1e-3, 0)
    lists_ewa = gsplat.isect_tiles(ewa[1], ewa[0], ewa[2], 16, 3, 2)
    lists_ut = gsplat.isect_tiles(ut[1], ut[0], ut[2], 16, 3, 2)
    for a, b in zip(lists_ut, lists_ewa, strict=True):
        assert torch.equal(a, b)


def test_ut_culls_as_gsplat():
    """near/far at the depth of the mean, the opacity times compensation below 1/255 (even
    without calc_compensations), radius_clip, off-image boxes; culled entries are zero."""
    view, K, _ = _views()
    means = torch.tensor([[0.0, 0.0, -2.995], [0.0, 0.0, 0.0], [0.0, 0.0, 0.5],
                          [30.0, 0.0, 0.0], [0.1, 0.1, 0.2]], dtype=DT)  # z = 0.005, 3, ...
    quats = torch.tensor([[1.0, 0, 0, 0]] * 5, dtype=DT)
    scales = torch.full((5, 3), 0.05, dtype=DT)
    scales[1] = 1e-4  # tiny: its compensation is small, its opacity drops below 1/255
    opacities = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.9], dtype=DT)
    radii, m2d, depths, conics, comps = gsplat.fully_fused_projection_with_ut(
        means, quats, scales, opacities, view, K, W, H, far_plane=3.4)
    assert comps is None
    visible = (radii > 0).all(-1)[0].tolist()
    assert visible == [False, False, False, False, True]
    assert_close("depths", depths[0], means[:, 2] + 3.0, 1e-12, 0)
    assert torch.equal(m2d[0, :4], torch.zeros(4, 2, dtype=DT))
    assert torch.equal(conics[0, :4], torch.zeros(4, 3, dtype=DT))
    clipped = gsplat.fully_fused_projection_with_ut(
        means, quats, scales, None, view, K, W, H, radius_clip=100.0)[0]
    assert not bool((clipped > 0).any())


@pytest.mark.parametrize("require_all", [True, False])
def test_sigma_point_validity(require_all):
    """A Gaussian straddling the image's margin: culled when every sigma point must be valid,
    kept when one suffices."""
    view, K, _ = _views()
    # x = 1.6 at z = 3: the mean is at u = 6.3 + 14 * 1.6 / 3 = 13.8 (margin: 13 * 1.1 = 14.3),
    # its sigma points along x at +-sqrt(0.03) * 3 = 0.52 land at 11.4 and 16.2
    means = torch.tensor([[1.6, 0.0, 0.0]], dtype=DT)
    params = UnscentedTransformParameters(require_all_sigma_points_valid=require_all)
    radii = gsplat.fully_fused_projection_with_ut(
        means, torch.tensor([[1.0, 0, 0, 0]], dtype=DT), torch.tensor([[3.0, 0.01, 0.01]],
                                                                      dtype=DT),
        None, view, K, W, H, ut_params=params)[0]
    assert bool((radii > 0).all()) is (not require_all)


# ---------------------------------------------------------------------------------------------
# the rolling shutter by its definition


def _times(shutter: RollingShutterType) -> Tensor:
    """The exposure time of each row (top to bottom / bottom to top) or column."""
    rows = shutter in (RollingShutterType.ROLLING_TOP_TO_BOTTOM,
                       RollingShutterType.ROLLING_BOTTOM_TO_TOP)
    n = H if rows else W
    tau = torch.arange(n, dtype=DT) / (n - 1)
    if shutter in (RollingShutterType.ROLLING_BOTTOM_TO_TOP,
                   RollingShutterType.ROLLING_RIGHT_TO_LEFT):
        tau = tau.flip(0)
    return tau


def _pose_at(view: Tensor, view_rs: Tensor, tau: float) -> Tensor:
    """[4, 4] the world-to-camera pose at ``tau``: scipy's slerp of the rotations, the
    translations interpolated linearly."""
    rots = Rotation.from_matrix(np.stack([view[:3, :3].numpy(), view_rs[:3, :3].numpy()]))
    out = torch.eye(4, dtype=DT)
    out[:3, :3] = torch.from_numpy(Slerp([0.0, 1.0], rots)([tau]).as_matrix()[0])
    out[:3, 3] = (1 - tau) * view[:3, 3] + tau * view_rs[:3, 3]
    return out


@pytest.mark.parametrize("shutter", ROLLING, ids=lambda s: s.name)
def test_rolling_shutter_with_one_pose_is_the_global_shutter(shutter):
    means, quats, scales, opacities = _gaussians(12, seed=5)
    view, K, _ = _views(2)
    colors = torch.rand(12, 3, dtype=DT, generator=torch.Generator().manual_seed(0))
    kw = dict(packed=False, with_ut=True, with_eval3d=True, **_camera("pinhole_distorted", 2))
    img_g, alpha_g, meta_g = gsplat.rasterization(means, quats, scales, opacities, colors, view,
                                                  K, W, H, **kw)
    img_r, alpha_r, meta_r = gsplat.rasterization(means, quats, scales, opacities, colors, view,
                                                  K, W, H, rolling_shutter=shutter,
                                                  viewmats_rs=view.clone(), **kw)
    assert float(alpha_g.max()) > 0.5
    assert torch.equal(meta_r["radii"], meta_g["radii"])
    assert_close("means2d", meta_r["means2d"], meta_g["means2d"], 1e-9, 0)
    assert_close("render_colors", img_r, img_g, 1e-9, 0)
    assert_close("render_alphas", alpha_r, alpha_g, 1e-9, 0)


@pytest.mark.parametrize("shutter", ROLLING, ids=lambda s: s.name)
@pytest.mark.parametrize("kind", ["pinhole", "fisheye_distorted"])
def test_each_line_of_a_rolling_shutter_is_the_global_render_at_its_time(kind, shutter):
    """The same tile lists (every Gaussian in every tile): row (or column) j of the rolling
    render is row j of the global render at the pose of time tau_j."""
    n = 5
    means, quats, scales, opacities = _gaussians(n, seed=6)
    view, K, view_rs = _views()
    order = torch.argsort(means[:, 2] + view[0, 2, 3])
    flatten_ids = order.repeat(TH * TW).int()
    offsets = (torch.arange(TH * TW, dtype=torch.int32) * n).reshape(1, TH, TW)
    colors = torch.rand(1, n, 3, dtype=DT, generator=torch.Generator().manual_seed(1))
    bg = torch.tensor([[0.2, 0.3, 0.4]], dtype=DT)
    camera = _camera(kind)

    def render(viewmats, **shutter_kw):
        return gsplat.rasterize_to_pixels_eval3d(
            means, quats, scales, colors, opacities[None], viewmats, K, W, H, TILE, offsets,
            flatten_ids, backgrounds=bg, **camera, **shutter_kw)

    rolling, alpha = render(view, rolling_shutter=shutter, viewmats_rs=view_rs)
    glob, _ = render(view)
    assert float(alpha.max()) > 0.5
    assert float((rolling - glob).abs().max()) > 1e-2  # the motion shows
    rows = shutter in (RollingShutterType.ROLLING_TOP_TO_BOTTOM,
                       RollingShutterType.ROLLING_BOTTOM_TO_TOP)
    for j, tau in enumerate(_times(shutter).tolist()):
        at_tau, _ = render(_pose_at(view[0], view_rs[0], tau)[None])
        line = (slice(None), j) if rows else (slice(None), slice(None), j)
        assert_close(f"line {j}", rolling[line], at_tau[line], 1e-9, 0)


@pytest.mark.parametrize("shutter", ROLLING, ids=lambda s: s.name)
def test_ut_projection_under_a_rolling_shutter_lands_at_its_pixels_time(shutter):
    """A point-like Gaussian projects where the pose of its pixel's time puts it: p is the
    projection at the pose of time(q), q the projection at the pose of time(p). Mostly q = p
    (a fixed point); a point about a line's motion from a line boundary has none, and the
    iteration alternates between two lines (p and q), as gsplat's does."""
    g = torch.Generator().manual_seed(7)
    n = 30
    means = (torch.rand(n, 3, generator=g, dtype=DT) - 0.5) * torch.tensor([1.6, 1.4, 1.0],
                                                                           dtype=DT)
    quats = torch.tensor([[1.0, 0, 0, 0]] * n, dtype=DT)
    scales = torch.full((n, 3), 1e-5, dtype=DT)
    view, K, view_rs = _views()
    radii, m2d, _, _, _ = gsplat.fully_fused_projection_with_ut(
        means, quats, scales, None, view, K, W, H, eps2d=1.0, rolling_shutter=shutter,
        viewmats_rs=view_rs)
    glob = gsplat.fully_fused_projection_with_ut(means, quats, scales, None, view, K, W, H,
                                                 eps2d=1.0)[1]
    visible = (radii > 0).all(-1)[0]
    assert int(visible.sum()) >= 10
    assert float((m2d - glob)[0, visible].abs().max()) > 0.3

    def at_time_of(point: Tensor, i: int) -> Tensor:
        tau = float(lens.shutter_time(point, int(shutter.value), W, H))
        pose = _pose_at(view[0], view_rs[0], tau)
        p = pose[:3, :3] @ means[i] + pose[:3, 3]
        return torch.stack([K[0, 0, 0] * p[0] / p[2] + K[0, 0, 2],
                            K[0, 1, 1] * p[1] / p[2] + K[0, 1, 2]])

    fixed = 0
    for i in visible.nonzero().flatten().tolist():
        p = m2d[0, i]
        q = at_time_of(p, i)
        assert_close(f"means2d[{i}]", p, at_time_of(q, i), 1e-6, 0)
        fixed += int(float((q - p).abs().max()) < 1e-6)
    assert fixed >= 0.6 * int(visible.sum())


# ---------------------------------------------------------------------------------------------
# the lens models


def test_opencv_pinhole_with_zero_coefficients_is_the_perfect_pinhole():
    means, quats, scales, opacities = _gaussians(8, seed=8)
    view, K, _ = _views()
    zeros = {"radial_coeffs": torch.zeros(1, 6, dtype=DT),
             "tangential_coeffs": torch.zeros(1, 2, dtype=DT)}
    perfect = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W,
                                                    H)
    opencv = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W,
                                                   H, **zeros)
    for a, b in zip(perfect[:4], opencv[:4], strict=True):
        assert_close("projection", b, a, 1e-12, 0)
    _, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, {})
    colors = torch.rand(1, 8, 3, dtype=DT, generator=torch.Generator().manual_seed(0))
    args = (means, quats, scales, colors, opacities[None], view, K, W, H, TILE, offsets,
            flatten_ids)
    assert_close("eval3d", gsplat.rasterize_to_pixels_eval3d(*args, **zeros)[0],
                 gsplat.rasterize_to_pixels_eval3d(*args)[0], 1e-12, 0)


def test_a_linear_ftheta_is_the_equidistant_fisheye():
    """delta = f theta with the identity linear term, its principal point half a pixel
    before the fisheye's (f-theta's image origin is the first pixel's centre), and the
    fisheye's max angle: the same projection and the same rays."""
    means, quats, scales, opacities = _gaussians(8, seed=9)
    view, K, _ = _views()
    K[:, 1, 1] = K[:, 0, 0]
    f = float(K[0, 0, 0])
    max_angle = float(lens.fisheye_max_angle(torch.zeros(1, 4, dtype=DT),
                                             torch.stack([K[:, 0, 0], K[:, 1, 1]], -1),
                                             K[:, :2, 2], W, H)[0])
    ft = FThetaCameraDistortionParameters(
        FThetaPolynomialType.ANGLE_TO_PIXELDIST, (0.0, 1 / f, 0, 0, 0, 0), (0.0, f, 0, 0, 0, 0),
        max_angle, (1.0, 0.0, 0.0))
    K_ft = K.clone()
    K_ft[:, :2, 2] -= 0.5
    fisheye = {"camera_model": "fisheye"}
    ftheta = {"camera_model": "ftheta", "ftheta_coeffs": ft}
    a = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W, H,
                                              **fisheye)
    b = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K_ft, W, H,
                                              **ftheta)
    assert int((a[0] > 0).all(-1).sum()) >= 5
    for x, y in zip(a[:4], b[:4], strict=True):
        assert_close("projection", y, x, 1e-9, 0)
    _, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, fisheye)
    colors = torch.rand(1, 8, 3, dtype=DT, generator=torch.Generator().manual_seed(0))
    args = (means, quats, scales, colors, opacities[None], view)
    rest = (W, H, TILE, offsets, flatten_ids)
    img_a, alpha_a = gsplat.rasterize_to_pixels_eval3d(*args, K, *rest, **fisheye)
    img_b, _ = gsplat.rasterize_to_pixels_eval3d(*args, K_ft, *rest, **ftheta)
    assert float(alpha_a.max()) > 0.5
    assert_close("eval3d", img_b, img_a, 1e-9, 0)


def test_opencv_undistortion_inverts_the_distortion():
    g = torch.Generator().manual_seed(10)
    uv = (torch.rand(200, 2, generator=g, dtype=DT) - 0.5) * 1.2
    k = torch.tensor([-0.05, 0.01, 0.002, 0.01, 0.0, 0.0], dtype=DT)
    p = torch.tensor([1e-3, -2e-3], dtype=DT)
    s = torch.tensor([1e-3, 0.0, -1e-3, 0.0], dtype=DT)
    icD, delta = lens.opencv_distortion(uv, k, p, s)
    back, converged = lens.opencv_undistort(icD[..., None] * uv + delta, k, p, s)
    assert bool(converged.all())
    assert_close("uv", back, uv, 1e-9, 0)


@pytest.mark.parametrize("kind", ["fisheye_distorted", "ftheta", "ftheta_backward_reference"])
def test_angular_lenses_unproject_what_they_project(kind):
    camera = _camera(kind)
    view, K, _ = _views()
    from tilesplat.ops.lens import check_camera
    from tilesplat.ops.validation import Shapes

    s = Shapes()
    s.check("viewmats", view, "..., C, 4, 4")
    cam = check_camera(s, camera["camera_model"], K, W, H, camera.get("radial_coeffs"), None,
                       None, camera.get("ftheta_coeffs"), RollingShutterType.GLOBAL, None)
    lm = lens.Lens(cam, K, W, H, 0.1, 1)
    g = torch.Generator().manual_seed(11)
    rays = F.normalize(torch.rand(1, 100, 3, generator=g, dtype=DT) - 0.5
                       + torch.tensor([0, 0, 1.0], dtype=DT), dim=-1)
    image, ok = lm.project(rays)
    back, ok_back = lm.unproject(image)
    keep = ok & ok_back
    assert int(keep.sum()) > 30
    assert_close("rays", back[keep], rays[keep], 1e-7, 0)


def test_smallest_positive_root_and_the_fisheye_max_angle():
    rng = np.random.default_rng(0)
    abc = torch.from_numpy(rng.normal(size=(2000, 3)))
    got = lens.smallest_positive_root(*abc.unbind(-1))
    for (a, b, c), x in zip(abc.tolist(), got.tolist(), strict=True):
        roots = [r.real for r in np.roots([c, b, a, 1.0]) if abs(r.imag) < 1e-9 and r.real > 0]
        want = min(roots) if roots else math.inf
        assert (x == want == math.inf) or abs(x - want) <= 1e-7 * max(1.0, want), (a, b, c)
    # only k1: theta_d' = 1 + 3 k1 theta² vanishes at sqrt(-1 / (3 k1)), below the image's cap
    k = torch.tensor([[-0.2, 0.0, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0]], dtype=DT)
    focal = torch.tensor([[4.0, 4.0]] * 2, dtype=DT)
    angle = lens.fisheye_max_angle(k, focal, torch.tensor([[6.5, 5.5]] * 2, dtype=DT), W, H)
    assert_close("max angle", angle[0], torch.tensor(math.sqrt(1 / 0.6), dtype=DT), 1e-12, 0)
    assert_close("capped", angle[1], torch.tensor(math.hypot(6.5, 5.5) / 4.0, dtype=DT), 1e-12,
                 0)


def test_slerp_and_shutter_times():
    q0 = lens.rotmat_to_quat(_rotz(0.3))
    q1 = lens.rotmat_to_quat(_rotz(-0.5) @ torch.tensor([[0, 0, 1.0], [0, 1, 0], [-1, 0, 0]],
                                                        dtype=DT))
    rots = Rotation.from_quat(np.stack([q0.numpy(), q1.numpy()]), scalar_first=True)
    for tau in (0.0, 0.25, 0.5, 1.0):
        want = torch.from_numpy(Slerp([0, 1], rots)([tau]).as_matrix()[0])
        got = lens.quat_to_rotmat(lens.slerp(q0, q1, torch.tensor(tau, dtype=DT)))
        assert_close(f"slerp {tau}", got, want, 1e-12, 0)
    # the shorter arc whatever the sign of the end quaternion
    assert_close("-q1", lens.slerp(q0, -q1, torch.tensor(0.3, dtype=DT)),
                 lens.slerp(q0, q1, torch.tensor(0.3, dtype=DT)), 1e-15, 0)
    centres = torch.tensor([[0.5, 0.5], [12.5, 10.5], [3.5, 7.5]], dtype=DT)
    top = lens.shutter_time(centres, RollingShutterType.ROLLING_TOP_TO_BOTTOM.value, W, H)
    right = lens.shutter_time(centres, RollingShutterType.ROLLING_RIGHT_TO_LEFT.value, W, H)
    assert top.tolist() == [0.0, 1.0, 0.7]
    assert right.tolist() == [1.0, 0.0, 1 - 3 / 12]


# ---------------------------------------------------------------------------------------------
# rasterization(), gsplat's trainer, the backends


def test_simple_trainer_call_pattern_trains():
    """gsplat's simple_trainer.py with --with_ut --with_eval3d and MCMC: SH colours, packed
    False, rasterize_splats' keywords; every parameter gets a gradient and the loss falls."""
    torch.manual_seed(0)
    n, w, h = 40, 17, 15
    view, K, _ = _views(2)
    view, K = view.float(), K.float()
    K[:, 0, 2], K[:, 1, 2] = w / 2, h / 2
    target = torch.zeros(2, h, w, 3)
    target[:, 4:11, 5:12] = torch.tensor([0.9, 0.3, 0.1])
    splats = torch.nn.ParameterDict({
        "means": torch.nn.Parameter((torch.rand(n, 3) - 0.5) * 1.0),
        "scales": torch.nn.Parameter(torch.full((n, 3), math.log(0.08))),
        "quats": torch.nn.Parameter(torch.randn(n, 4)),
        "opacities": torch.nn.Parameter(torch.logit(torch.full((n,), 0.5))),
        "sh0": torch.nn.Parameter(torch.zeros(n, 1, 3)),
        "shN": torch.nn.Parameter(torch.zeros(n, 3, 3)),
    })
    optimizers = {k: torch.optim.Adam([{"params": p, "lr": 2e-2, "name": k}], eps=1e-15)
                  for k, p in splats.items()}
    strategy = gsplat.MCMCStrategy(cap_max=48, refine_start_iter=4, refine_every=4)
    state = strategy.initialize_state()
    strategy.check_sanity(splats, optimizers)
    losses = []
    for step in range(12):
        cam = step % 2
        colors = torch.cat([splats["sh0"], splats["shN"]], 1)
        renders, _, info = gsplat.rasterization(
            means=splats["means"], quats=splats["quats"], scales=torch.exp(splats["scales"]),
            opacities=torch.sigmoid(splats["opacities"]), colors=colors,
            viewmats=view[cam:cam + 1], Ks=K[cam:cam + 1], width=w, height=h, packed=False,
            absgrad=False, sparse_grad=False, rasterize_mode="classic", distributed=False,
            camera_model="pinhole", with_ut=True, with_eval3d=True, sh_degree=1,
            near_plane=0.01, far_plane=1e10, render_mode="RGB")
        loss = F.l1_loss(renders, target[cam:cam + 1])
        loss.backward()
        if step == 0:
            for name, p in splats.items():
                assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name
                assert float(p.grad.abs().sum()) > 0, name
        for opt in optimizers.values():
            opt.step()
            opt.zero_grad(set_to_none=True)
        strategy.step_post_backward(params=splats, optimizers=optimizers, state=state, step=step,
                                    info=info, lr=2e-2)
        losses.append(loss.item())
    assert len(splats["means"]) > n  # MCMC grew it
    assert sum(losses[-3:]) < sum(losses[:3])


def test_rasterization_depth_modes_and_sh_directions_with_a_rolling_shutter():
    """RGB+ED composites the UT depth (the middle of the exposure); SH colours look from the
    middle of the two camera centres, as gsplat's."""
    means, quats, scales, opacities = _gaussians(6, seed=12)
    view, K, view_rs = _views()
    sh = torch.rand(6, 4, 3, dtype=DT, generator=torch.Generator().manual_seed(2))
    kw = dict(packed=False, with_ut=True, with_eval3d=True, sh_degree=1,
              rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, viewmats_rs=view_rs)
    img, alpha, meta = gsplat.rasterization(means, quats, scales, opacities, sh, view, K, W, H,
                                            render_mode="RGB+ED", **kw)
    mid = gsplat.fully_fused_projection_with_ut(
        means, quats, scales, opacities, view, K, W, H,
        rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, viewmats_rs=view_rs)
    assert torch.equal(meta["depths"], mid[2])
    centre = 0.5 * (torch.linalg.inv(view)[0, :3, 3] + torch.linalg.inv(view_rs)[0, :3, 3])
    colors = torch.clamp_min(gsplat.spherical_harmonics(1, means - centre, sh) + 0.5, 0)
    expect, _ = gsplat.rasterize_to_pixels_eval3d(
        means, quats, scales, torch.cat([colors, mid[2][0, :, None]], -1)[None],
        opacities[None], view, K, W, H, 16, meta["isect_offsets"], meta["flatten_ids"],
        rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, viewmats_rs=view_rs)
    assert_close("rgb", img[..., :3], expect[..., :3], 1e-12, 0)
    depth = expect[..., 3:] / alpha.clamp_min(1e-10)
    assert_close("expected depth", img[..., 3:], depth, 1e-12, 0)
    assert float(alpha.max()) > 0.5


def test_a_backend_without_the_ops_names_the_missing_op(monkeypatch):
    # every native backend has 3DGUT's ops (tests/test_ut_cpu.py, tests/test_ut_cuda.py): the
    # cpu backend's entries taken away
    backend = "cpu"
    registry.implemented_ops(backend)
    for op in ("fully_fused_projection_with_ut", "rasterize_to_pixels_eval3d"):
        monkeypatch.delitem(registry._impls, (op, backend))
    means, quats, scales, opacities = _gaussians()
    view, K, _ = _views()
    with pytest.raises(NotImplementedError,
                       match=f"'fully_fused_projection_with_ut'.*backend '{backend}'"):
        gsplat.rasterization(means, quats, scales, opacities, torch.ones(4, 3, dtype=DT), view,
                             K, W, H, packed=False, with_ut=True, with_eval3d=True,
                             backend=backend)
    with pytest.raises(NotImplementedError,
                       match=f"'rasterize_to_pixels_eval3d'.*backend '{backend}'"):
        gsplat.rasterize_to_pixels_eval3d(
            means, quats, scales, torch.ones(1, 4, 3, dtype=DT), opacities[None], view, K, W,
            H, TILE, torch.zeros(1, TH, TW, dtype=torch.int32),
            torch.zeros(0, dtype=torch.int32), backend=backend)


def test_auto_falls_back_to_the_reference_with_one_warning(monkeypatch):
    monkeypatch.setattr(registry, "_warned", set())
    registry.implemented_ops("cpu")  # loads the cpu backend
    # a native backend without the op: the cpu backend's entry taken away
    monkeypatch.delitem(registry._impls, ("fully_fused_projection_with_ut", "cpu"))
    means, quats, scales, opacities = _gaussians()
    view, K, _ = _views()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K,
                                                      W, H, backend="auto") for _ in range(3)]
    msgs = [str(w.message) for w in caught if "falls back" in str(w.message)]
    assert len(msgs) == 1 and "fully_fused_projection_with_ut" in msgs[0], msgs
    ref = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W, H,
                                                backend="torch")
    assert torch.equal(outs[0][1], ref[1])


# ---------------------------------------------------------------------------------------------
# bad input


BAD = {
    "radial of a fisheye on a pinhole": (
        dict(radial_coeffs=torch.zeros(1, 4, dtype=DT)), r"radial_coeffs \[\.\.\., C, 6\]"),
    "radial of the wrong count of cameras": (
        dict(radial_coeffs=torch.zeros(2, 6, dtype=DT)), r"radial_coeffs \[\.\.\., C, 6\]"),
    "tangential on a fisheye": (
        dict(camera_model="fisheye", tangential_coeffs=torch.zeros(1, 2, dtype=DT)),
        "tangential_coeffs is not a parameter of camera_model='fisheye'"),
    "thin prism of 3": (dict(thin_prism_coeffs=torch.zeros(1, 3, dtype=DT)),
                        r"thin_prism_coeffs \[\.\.\., C, 4\]"),
    "NaN radial": (dict(radial_coeffs=torch.tensor([[0.01, float("nan"), 0, 0, 0, 0]],
                                                   dtype=DT)), "radial_coeffs contains 1 NaN"),
    "NaN tangential": (dict(tangential_coeffs=torch.tensor([[0.0, float("inf")]], dtype=DT)),
                       "tangential_coeffs contains 1 NaN"),
    "a pinhole that folds": (dict(radial_coeffs=torch.tensor([[-0.5, 0, 0, 0, 0, 0]], dtype=DT)),
                             "radial_coeffs of camera 0 fold over inside the image"),
    "a denominator that folds": (
        dict(radial_coeffs=torch.tensor([[0, 0, 0, 4.0, 0, 0]], dtype=DT)),
        "radial_coeffs of camera 0 fold over"),
    "a fisheye that folds": (
        dict(camera_model="fisheye", radial_coeffs=torch.tensor([[-0.4, 0, 0, 0]], dtype=DT)),
        "radial_coeffs of camera 0 fold over"),
    "an f-theta that folds": (
        dict(camera_model="ftheta", ftheta_coeffs=FThetaCameraDistortionParameters(
            FThetaPolynomialType.ANGLE_TO_PIXELDIST, (0.0,) * 6,
            (0.0, F_PX, 0.0, -20.0, 0.0, 0.0), 1.2, (1.0, 0.0, 0.0))),
        "angle_to_pixeldist_poly folds over"),
    "an f-theta with NaN": (
        dict(camera_model="ftheta", ftheta_coeffs=FThetaCameraDistortionParameters(
            FThetaPolynomialType.ANGLE_TO_PIXELDIST, (0.0,) * 6,
            (0.0, float("nan"), 0.0, 0.0, 0.0, 0.0), 1.2, (1.0, 0.0, 0.0))),
        "ftheta_coeffs.angle_to_pixeldist_poly contains NaN"),
    "an f-theta polynomial of 5": (
        dict(camera_model="ftheta", ftheta_coeffs=FThetaCameraDistortionParameters(
            FThetaPolynomialType.ANGLE_TO_PIXELDIST, (0.0,) * 6, (0.0, F_PX, 0.0, 0.0, 0.0),
            1.2, (1.0, 0.0, 0.0))),
        "angle_to_pixeldist_poly to be 6 numbers"),
    "an f-theta without coefficients": (dict(camera_model="ftheta"), "needs ftheta_coeffs"),
    "f-theta coefficients on a pinhole": (
        dict(ftheta_coeffs=_ftheta(FThetaPolynomialType.ANGLE_TO_PIXELDIST)),
        "ftheta_coeffs is a parameter of camera_model='ftheta'"),
    "viewmats_rs without a rolling shutter": (
        dict(viewmats_rs=torch.eye(4, dtype=DT)[None]), "viewmats_rs.*is for a rolling shutter"),
    "a rolling shutter without viewmats_rs": (
        dict(rolling_shutter=RollingShutterType.ROLLING_LEFT_TO_RIGHT), "needs viewmats_rs"),
    "a rolling shutter of something else": (
        dict(rolling_shutter="top-down", viewmats_rs=torch.eye(4, dtype=DT)[None]),
        "expected rolling_shutter to be a RollingShutterType"),
    "viewmats_rs of the wrong shape": (
        dict(rolling_shutter=RollingShutterType.ROLLING_LEFT_TO_RIGHT,
             viewmats_rs=torch.eye(4, dtype=DT)), r"viewmats_rs \[\.\.\., C, 4, 4\]"),
    "the orthographic camera": (dict(camera_model="ortho"), "camera_model"),
    "distortion without with_ut": (
        dict(with_ut=False, radial_coeffs=torch.zeros(1, 6, dtype=DT)),
        r"radial_coeffs=\.\.\.\) needs with_ut=True"),
    "thin prism without with_ut": (
        dict(with_ut=False, with_eval3d=False, thin_prism_coeffs=torch.zeros(1, 4, dtype=DT)),
        r"thin_prism_coeffs=\.\.\.\) needs with_ut=True"),
    "f-theta without with_ut": (
        dict(with_ut=False, camera_model="ftheta",
             ftheta_coeffs=_ftheta(FThetaPolynomialType.ANGLE_TO_PIXELDIST)),
        r"ftheta_coeffs=\.\.\.\) needs with_ut=True"),
    "a rolling shutter without with_ut": (
        dict(with_ut=False, rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM,
             viewmats_rs=torch.eye(4, dtype=DT)[None]),
        r"rolling_shutter=\.\.\.\) needs with_ut=True"),
    "sparse_grad": (dict(sparse_grad=True), "sparse_grad"),
    "absgrad with eval3d": (dict(absgrad=True), "absgrad"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_value_error(case):
    means, quats, scales, opacities = _gaussians()
    view, K, _ = _views()
    over, match = BAD[case]
    colors = torch.ones(4, 3, dtype=DT)
    kw = {"packed": False, "with_ut": True, "with_eval3d": True, **over}
    with pytest.raises(ValueError, match=match):
        gsplat.rasterization(means, quats, scales, opacities, colors, view, K, W, H, **kw)
    camera = {k: v for k, v in over.items()
              if k not in ("packed", "sparse_grad", "absgrad", "with_ut", "with_eval3d")}
    if "with_ut" not in over and set(camera) == set(over):
        # the ops refuse the same camera with the same words
        with pytest.raises(ValueError, match=match):
            gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W,
                                                  H, **camera)


@pytest.mark.parametrize(("field", "value", "match"), [
    ("alpha", 0.0, "alpha > 0"), ("kappa", -3.0, "kappa > -3"),
    ("in_image_margin_factor", -0.1, "margin_factor >= 0"), ("beta", float("nan"), "beta"),
    ("require_all_sigma_points_valid", 1, "require_all_sigma_points_valid to be a bool")])
def test_bad_ut_params(field, value, match):
    means, quats, scales, opacities = _gaussians()
    view, K, _ = _views()
    params = UnscentedTransformParameters(**{field: value})
    with pytest.raises(ValueError if field != "require_all_sigma_points_valid" else TypeError,
                       match=match):
        gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W, H,
                                              ut_params=params)


def test_covars_and_a_one_row_rolling_shutter_are_refused():
    means, quats, scales, opacities = _gaussians()
    view, K, view_rs = _views()
    covars = torch.eye(3, dtype=DT).expand(4, 3, 3) * 0.01
    with pytest.raises(ValueError, match="with_ut=True\\) needs quats and scales, not covars"):
        gsplat.rasterization(means, quats, scales, opacities, torch.ones(4, 3, dtype=DT), view,
                             K, W, H, covars=covars, packed=False, with_ut=True)
    with pytest.raises(ValueError, match="needs an image height >= 2"):
        gsplat.fully_fused_projection_with_ut(
            means, quats, scales, opacities, view, K, W, 1,
            rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, viewmats_rs=view_rs)



def test_packed_colors_refused_without_their_gaussians():
    means, quats, scales, opacities = _gaussians()
    view, K, _ = _views()
    lists = (torch.zeros(1, TH, TW, dtype=torch.int32), torch.zeros(0, dtype=torch.int32))
    packed = (torch.ones(7, 3, dtype=DT), torch.ones(7, dtype=DT))
    with pytest.raises(ValueError, match="needs gaussian_ids"):
        gsplat.rasterize_to_pixels_eval3d(means, quats, scales, *packed, view, K, W, H, TILE,
                                          *lists)
    with pytest.raises(ValueError, match="gaussian_ids in \\[0, 4\\)"):
        gsplat.rasterize_to_pixels_eval3d(means, quats, scales, *packed, view, K, W, H, TILE,
                                          *lists, gaussian_ids=torch.arange(7))
    with pytest.raises(ValueError, match="gaussian_ids=...\\) is for packed colors"):
        gsplat.rasterize_to_pixels_eval3d(
            means, quats, scales, torch.ones(1, 4, 3, dtype=DT), torch.ones(1, 4, dtype=DT),
            view, K, W, H, TILE, *lists, gaussian_ids=torch.arange(4))
    with pytest.raises(ValueError, match="colors"):  # gsplat's [..., nnz, D] with batch dims
        gsplat.rasterize_to_pixels_eval3d(
            means[None], quats[None], scales[None], torch.ones(1, 7, 3, dtype=DT),
            torch.ones(1, 7, dtype=DT), view[None], K[None], W, H, TILE, lists[0][None],
            lists[1], gaussian_ids=torch.zeros(7, dtype=torch.int64))
    # two rows of one pair
    radii, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, {})
    n = flatten_ids.numel()
    with pytest.raises(ValueError, match="two rows of colors are the same"):
        gsplat.rasterize_to_pixels_eval3d(
            means, quats, scales, torch.ones(n, 3, dtype=DT), torch.ones(n, dtype=DT), view, K,
            W, H, TILE, offsets, torch.arange(n, dtype=torch.int32),
            gaussian_ids=torch.zeros(n, dtype=torch.int64))


@pytest.mark.parametrize("kind", ["pinhole_distorted", "ftheta"])
def test_packed_colors_are_the_dense_pairs(kind):
    """rasterize_to_pixels_eval3d with packed rows (shuffled, some unread) gives the dense
    call's images, last ids and gradients, bit for bit."""
    from ut_packed_parity import check_packed_parity

    means, quats, scales, opacities = _gaussians(8, seed=21)
    view, K, view_rs = _views(2)
    camera = {**_camera(kind, 2), **_shutter(RollingShutterType.ROLLING_LEFT_TO_RIGHT, view_rs)}
    _, offsets, flatten_ids = _lists_from_ut(means, quats, scales, opacities, view, K, camera)
    g = torch.Generator().manual_seed(9)
    colors = torch.rand(2, 8, 3, dtype=DT, generator=g)
    opac = torch.rand(2, 8, dtype=DT, generator=g) * 0.5 + 0.4
    bgs = torch.rand(2, 3, dtype=DT, generator=g)
    check_packed_parity("torch", [means, quats, scales, colors, opac], view, K, camera, offsets,
                        flatten_ids, bgs, W, H, TILE)


def test_rasterization_packed_is_unpacked():
    """rasterization(packed=True) with with_ut and with_eval3d (gsplat asserts packed=False
    there): the unpacked render's images and gradients, batch dims and SH colours included,
    and with_ut alone (the 2D rasterizer's packed path)."""
    view, K, view_rs = _views(2)
    scenes = [_gaussians(6, seed=31 + b) for b in range(2)]
    batched = [torch.stack(x) for x in zip(*scenes, strict=True)]
    sh = torch.randn(2, 6, 4, 3, dtype=DT, generator=torch.Generator().manual_seed(2)) * 0.4
    kw = dict(with_ut=True, sh_degree=1, viewmats_rs=view_rs.expand(2, 2, 4, 4),
              rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM,
              backgrounds=torch.full((2, 2, 3), 0.2, dtype=DT),
              **{k: v.expand(2, *v.shape) for k, v in _camera("pinhole_distorted", 2).items()})
    for eval3d in (True, False):
        out = {}
        for packed in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in (*batched, sh)]
            img, alpha, meta = gsplat.rasterization(
                *leaves[:4], leaves[4], view.expand(2, 2, 4, 4), K.expand(2, 2, 3, 3), W, H,
                packed=packed, with_eval3d=eval3d, tile_size=TILE, **kw)
            assert (meta["gaussian_ids"] is not None) == packed
            weights = torch.randn(img.shape, dtype=DT, generator=torch.Generator().manual_seed(4))
            grads = torch.autograd.grad((img * weights).sum() + alpha.sum(), leaves,
                                        allow_unused=True)
            out[packed] = (img, alpha, *grads)
        assert float(out[False][1].detach().max()) > 0.5
        for i, (a, e) in enumerate(zip(out[True], out[False], strict=True)):
            if e is None:  # with_ut alone: no gradient to the geometry, as gsplat's
                assert a is None
                continue
            assert_close(f"eval3d={eval3d} output {i}", a, e, 1e-12, 1e-12)


def test_batch_dims_render_each_batch_as_alone():
    """[2] batches of 2 cameras each: the flattened pair ids map to each batch's Gaussians."""
    view, K, view_rs = _views(2)
    radial = _camera("fisheye_distorted", 2)["radial_coeffs"]
    scenes = [_gaussians(6, seed=13 + b) for b in range(2)]
    colors = torch.rand(2, 6, 3, dtype=DT, generator=torch.Generator().manual_seed(3))
    kw = dict(packed=False, with_ut=True, with_eval3d=True, camera_model="fisheye",
              rolling_shutter=RollingShutterType.ROLLING_BOTTOM_TO_TOP)
    batched = [torch.stack(x) for x in zip(*scenes, strict=True)]
    img, alpha, _ = gsplat.rasterization(
        *batched, colors, view.expand(2, 2, 4, 4), K.expand(2, 2, 3, 3), W, H,
        viewmats_rs=view_rs.expand(2, 2, 4, 4), radial_coeffs=radial.expand(2, 2, 4), **kw)
    assert img.shape == (2, 2, H, W, 3)
    assert float(alpha.max()) > 0.5
    for b in range(2):
        alone, _, _ = gsplat.rasterization(*scenes[b], colors[b], view, K, W, H,
                                           viewmats_rs=view_rs, radial_coeffs=radial, **kw)
        assert_close(f"batch {b}", img[b], alone, 1e-12, 0)


def test_each_half_of_3dgut_alone():
    """with_ut alone: the UT projection feeds the 2D rasterizer (no gradient to the geometry,
    as gsplat's); with_eval3d alone: the EWA projection's tile lists feed eval3d."""
    means, quats, scales, opacities = _gaussians(6, seed=20)
    view, K, _ = _views()
    colors = torch.rand(6, 3, dtype=DT, generator=torch.Generator().manual_seed(4))
    leaves = [x.clone().requires_grad_(True) for x in (means, colors, opacities)]
    img, _, meta = gsplat.rasterization(leaves[0], quats, scales, leaves[2], leaves[1], view, K,
                                        W, H, packed=False, with_ut=True)
    ut = gsplat.fully_fused_projection_with_ut(means, quats, scales, opacities, view, K, W, H)
    assert torch.equal(meta["means2d"], ut[1]) and not meta["means2d"].requires_grad
    expect, _ = gsplat.rasterize_to_pixels(ut[1], ut[3], colors.expand(1, 6, 3),
                                           opacities.expand(1, 6), W, H, 16,
                                           meta["isect_offsets"], meta["flatten_ids"])
    assert_close("with_ut", img, expect, 1e-12, 0)
    img.sum().backward()
    assert leaves[0].grad is None and float(leaves[1].grad.abs().sum()) > 0
    img3, alpha3, meta3 = gsplat.rasterization(means, quats, scales, opacities, colors, view, K,
                                               W, H, packed=False, with_eval3d=True)
    ewa = gsplat.fully_fused_projection(means, None, quats, scales, view, K, W, H,
                                        opacities=opacities)
    assert torch.equal(meta3["radii"], ewa[0])
    expect3, _ = gsplat.rasterize_to_pixels_eval3d(
        means, quats, scales, colors.expand(1, 6, 3), opacities.expand(1, 6), view, K, W, H, 16,
        meta3["isect_offsets"], meta3["flatten_ids"])
    assert_close("with_eval3d", img3, expect3, 1e-12, 0)
    assert float(alpha3.max()) > 0.5


def test_to_cpp_gives_what_the_kernels_take():
    """gsplat's ``to_cpp()`` (its C++ structs; tilesplat has no C++ extension): the checked
    values tilesplat's kernels take, never NotImplementedError."""
    from tilesplat.backends.ut_camera import FThetaParams, UTParams
    from tilesplat.constants import FTHETA_ANGLE_TO_PIXELDIST, SHUTTER_CODES

    assert RollingShutterType.ROLLING_LEFT_TO_RIGHT.to_cpp() == \
        SHUTTER_CODES["ROLLING_LEFT_TO_RIGHT"]
    assert FThetaPolynomialType.ANGLE_TO_PIXELDIST.to_cpp() == FTHETA_ANGLE_TO_PIXELDIST
    assert UnscentedTransformParameters(alpha=0.2).to_cpp() == UTParams(0.2, 2.0, 0.0, 0.1,
                                                                        True)
    ft = _ftheta(FThetaPolynomialType.ANGLE_TO_PIXELDIST).to_cpp()
    assert isinstance(ft, FThetaParams) and ft.reference == FTHETA_ANGLE_TO_PIXELDIST
    assert ft.angle_to_pixeldist == (0.0, F_PX, 0.0, -0.5, 0.0, 0.0)
    with pytest.raises(ValueError, match="alpha > 0"):
        UnscentedTransformParameters(alpha=0.0).to_cpp()
