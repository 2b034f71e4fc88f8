"""3DGUT on the ``cpu`` backend (issue 38): the Numba kernels of the eval3d rasterizer and of
the unscented-transform projection against the torch reference.

- forward images, alphas, last ids and every gradient (means, quats, scales, colours,
  opacities, backgrounds) at DESIGN.md's float32 parity (forward 1e-5, gradients 1e-4, abs and
  rel) for each camera kind (pinhole, OpenCV radial/tangential/thin prism, fisheye, f-theta
  with either reference polynomial) under the global and a rolling shutter, with odd image
  sizes, two cameras, backgrounds and masked tiles;
- float64: the kernels compute the reference's definition (to 1e-10);
- zero Gaussians, empty tiles, batch dims, bit-identical gradients for any thread count, and
  ``rasterization(with_ut=True, with_eval3d=True)`` on ``cpu`` and ``auto``;
- the projection: every camera kind and shutter, culled Gaussians (depth, image, opacity,
  radius clip), gsplat's options, float64 and float32 against the float64 reference.

Tile lists come from the reference (no other kernel compiles here); the kernels compile once
per dtype (float32, float64).
"""

from __future__ import annotations

import math

import numba
import pytest
import torch
import torch.nn.functional as F

import tilesplat as gsplat
from helpers import assert_close
from tilesplat.backends import registry
from tilesplat.ops.camera import (
    FThetaCameraDistortionParameters,
    FThetaPolynomialType,
    RollingShutterType,
    UnscentedTransformParameters,
)

W, H, TILE = 37, 29, 8  # odd sizes: the last tile row and column are partial
TW, TH = math.ceil(W / TILE), math.ceil(H / TILE)
F_PX = 30.0
TOL32 = {"forward": 1e-5, "gradient": 1e-4}
KINDS = ["pinhole", "opencv", "fisheye", "ftheta", "ftheta_backward_reference"]
OUTS = ("colors", "alphas")
LEAVES = ("means", "quats", "scales", "colors", "opacities", "backgrounds")


def _ftheta(reference: FThetaPolynomialType) -> FThetaCameraDistortionParameters:
    """delta = F theta - 0.5 theta³ and its approximate inverse (exact when the reference)."""
    fw = (0.0, F_PX, 0.0, -0.5, 0.0, 0.0)
    bw = (0.0, 1.0 / F_PX, 0.0, 0.5 / F_PX**4, 0.0, 0.0)
    return FThetaCameraDistortionParameters(reference, bw, fw, 1.2, (1.01, 0.01, -0.005))


def _camera(kind: str, lead: tuple[int, ...], dtype: torch.dtype) -> dict:
    def rep(*v: float) -> torch.Tensor:
        return torch.tensor(v, dtype=dtype).expand(*lead, len(v)).contiguous()

    return {
        "pinhole": {},
        "opencv": {"radial_coeffs": rep(-0.05, 0.01, 0.002, 0.01, 0.0, 0.0),
                   "tangential_coeffs": rep(1e-3, -2e-3),
                   "thin_prism_coeffs": rep(1e-3, 0.0, -1e-3, 0.0)},
        "fisheye": {"camera_model": "fisheye", "radial_coeffs": rep(0.02, -0.005, 0.001, 0.0)},
        "ftheta": {"camera_model": "ftheta",
                   "ftheta_coeffs": _ftheta(FThetaPolynomialType.ANGLE_TO_PIXELDIST)},
        "ftheta_backward_reference": {
            "camera_model": "ftheta",
            "ftheta_coeffs": _ftheta(FThetaPolynomialType.PIXELDIST_TO_ANGLE)},
    }[kind]


def _scene(n: int, dtype: torch.dtype, batch: tuple[int, ...] = (), C: int = 2, seed: int = 1,
           kind: str = "pinhole", shutter: RollingShutterType = RollingShutterType.GLOBAL,
           left: bool = False):
    """Gaussians in front of C cameras (``left``: only in the image's left part, so tiles on
    the right are empty), the camera keywords and the reference's tile lists."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(*batch, n, 3, generator=g, dtype=dtype) - 0.5) * torch.tensor(
        [2.2, 1.8, 1.0], dtype=dtype)
    if left:
        means[..., 0] = means[..., 0] * 0.3 - 0.9
    quats = F.normalize(torch.randn(*batch, n, 4, generator=g, dtype=dtype), dim=-1) * 1.3
    scales = torch.rand(*batch, n, 3, generator=g, dtype=dtype) * 0.12 + 0.03
    opacities = torch.rand(*batch, C, n, generator=g, dtype=dtype) * 0.8 + 0.15
    colors = torch.rand(*batch, C, n, 3, generator=g, dtype=dtype)
    view = torch.eye(4, dtype=dtype).repeat(*batch, C, 1, 1)
    view[..., 2, 3] = 3.0
    view[..., 0, 3] = torch.linspace(-0.1, 0.1, C, dtype=dtype)
    K = torch.tensor([[F_PX, 0, 18.3], [0, F_PX * 1.03, 14.2], [0, 0, 1]],
                     dtype=dtype).repeat(*batch, C, 1, 1)
    camera = _camera(kind, (*batch, C), dtype)
    if shutter is not RollingShutterType.GLOBAL:
        rs = view.clone()
        rs[..., 0, 3] += 0.12
        c, s = math.cos(0.08), math.sin(0.08)
        rot = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]], dtype=dtype)
        rs[..., :3, :3] = rot @ rs[..., :3, :3]
        camera.update(rolling_shutter=shutter, viewmats_rs=rs)
    radii, m2d, depths, _, _ = gsplat.fully_fused_projection_with_ut(
        means, quats, scales, opacities.mean(-2), view, K, W, H, backend="torch", **camera)
    _, isect_ids, flatten_ids = gsplat.isect_tiles(m2d, radii, depths, TILE, TW, TH,
                                                   backend="torch")
    offsets = gsplat.isect_offset_encode(isect_ids, C * math.prod(batch), TW, TH,
                                         backend="torch").reshape(*batch, C, TH, TW)
    backgrounds = torch.rand(*batch, C, 3, generator=g, dtype=dtype)
    return [means, quats, scales, colors, opacities], view, K, camera, offsets, flatten_ids, \
        backgrounds


def _render(backend, inputs, view, K, camera, offsets, flatten_ids, backgrounds=None,
            masks=None, seed=5):
    """Outputs (colors, alphas, last_ids) and the gradients of a random projection of them."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    bg = None if backgrounds is None else backgrounds.clone().requires_grad_()
    colors, alphas, last = gsplat.rasterize_to_pixels_eval3d(
        *leaves, view, K, W, H, TILE, offsets, flatten_ids, backgrounds=bg, masks=masks,
        return_last_ids=True, backend=backend, **camera)
    g = torch.Generator().manual_seed(seed)
    loss = sum((torch.randn(o.shape, generator=g).to(o.dtype) * o).sum()
               for o in (colors, alphas))
    wrt = leaves if bg is None else [*leaves, bg]
    return (colors, alphas), last, torch.autograd.grad(loss, wrt)


def _float64(camera: dict) -> dict:
    return {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in camera.items()}


def _compare(scene, masks=None, forward=TOL32["forward"], gradient=TOL32["gradient"],
             with_bg=True):
    """cpu against the reference in the scene's dtype. As the 2DGS parity tests
    (tests/ops/test_rasterize_to_pixels_2dgs.py): a float32 tensor off by more than the
    tolerance passes when it is no further from the reference run in float64 on the same
    inputs than twice the float32 reference is (the float32 reference's own gradients are up
    to ~3e-3 relative off where the response's cross product cancels; the kernels run the
    pair's math in float64)."""
    inputs, view, K, camera, offsets, flatten_ids, bg = scene
    bg = bg if with_bg else None
    run = (view, K, camera, offsets, flatten_ids, bg, masks)
    got = _render("cpu", inputs, *run)
    ref = _render("torch", inputs, *run)
    exact = []

    def close(name, a, b, i, tol):
        try:
            assert_close(name, a, b, tol, tol)
        except AssertionError:
            if a.dtype != torch.float32:
                raise
            if not exact:
                exact.append(_render(
                    "torch", [t.double() for t in inputs], view.double(), K.double(),
                    _float64(camera), offsets, flatten_ids,
                    None if bg is None else bg.double(), masks))
            e = [*exact[0][0], *exact[0][2]][i]
            err, ref_err = (a.double() - e).abs().max(), (b.double() - e).abs().max()
            assert err <= 2 * ref_err, f"{name}: {err:.3g} from float64, reference {ref_err:.3g}"

    names = [*OUTS, *(f"v_{n}" for n in LEAVES)]
    for i, (name, a, b) in enumerate(zip(names, [*got[0], *got[2]], [*ref[0], *ref[2]],
                                         strict=False)):
        close(name, a, b, i, forward if i < len(OUTS) else gradient)
    assert torch.equal(got[1], ref[1]), "last_ids differ"
    return got


def _masks(batch=(), C=2):
    m = torch.ones(*batch, C, TH, TW, dtype=torch.bool)
    m[..., 1, 2] = False
    m[..., 0, 0, 0] = False
    return m


@pytest.mark.parametrize("shutter", [RollingShutterType.GLOBAL,
                                     RollingShutterType.ROLLING_TOP_TO_BOTTOM],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("kind", KINDS)
def test_eval3d_matches_the_reference_float32(kind, shutter):
    scene = _scene(160, torch.float32, kind=kind, shutter=shutter)
    got = _compare(scene, masks=_masks())
    assert float(got[0][1].detach().max()) > 0.5  # a scene that covers pixels
    assert int((got[1] >= 0).sum()) > W * H // 2  # and composites many of them


@pytest.mark.parametrize(("kind", "shutter"), [
    ("opencv", RollingShutterType.ROLLING_LEFT_TO_RIGHT),
    ("fisheye", RollingShutterType.ROLLING_BOTTOM_TO_TOP),
    ("ftheta", RollingShutterType.ROLLING_RIGHT_TO_LEFT),
], ids=str)
def test_eval3d_is_the_definition_in_float64(kind, shutter):
    _compare(_scene(120, torch.float64, kind=kind, shutter=shutter, seed=2), masks=_masks(),
             forward=1e-10, gradient=1e-9)


def test_zero_gaussians_empty_tiles_and_no_background():
    _compare(_scene(0, torch.float32), with_bg=True)
    _compare(_scene(0, torch.float32), with_bg=False)
    inputs, view, K, camera, offsets, flatten_ids, bg = scene = _scene(60, torch.float32,
                                                                       left=True, seed=3)
    assert int((offsets.reshape(2, -1).diff(dim=1) == 0).sum()) > 0  # some tiles are empty
    got = _compare(scene, with_bg=False)
    assert float(got[0][1].detach()[..., -3:, :].abs().max()) == 0.0  # the right edge stays empty


def test_invalid_rays_get_the_background(monkeypatch):
    """Pixels whose camera inverse fails (every 7th here, through the rays both backends take
    from ``image_rays``): background, alpha 0, no gradient, on both."""
    from tilesplat.backends.cpu import ut as cpu_ut
    from tilesplat.backends.torch import ut as torch_ut

    original = torch_ut.image_rays

    def some_invalid(*args):
        origin, direction, valid = original(*args)
        valid = valid.clone()
        valid[::7] = False
        return origin, direction, valid

    monkeypatch.setattr(torch_ut, "image_rays", some_invalid)
    monkeypatch.setattr(cpu_ut, "image_rays", some_invalid)
    scene = _scene(120, torch.float32, kind="opencv", seed=9)
    got = _compare(scene, masks=_masks())
    alphas = got[0][1].detach().reshape(-1)
    assert float(alphas[::7].abs().max()) == 0.0 and float(alphas.max()) > 0.5


def test_batch_dims():
    scene = _scene(80, torch.float32, batch=(2,), C=2, kind="fisheye",
                   shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, seed=4)
    _compare(scene, masks=_masks(batch=(2,)))


def _gradients(threads: int) -> list[torch.Tensor]:
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        inputs, view, K, camera, offsets, flatten_ids, bg = _scene(
            400, torch.float32, seed=6, kind="opencv",
            shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM)
        outs, last, grads = _render("cpu", inputs, view, K, camera, offsets, flatten_ids, bg)
        return [*outs, last, *grads]
    finally:
        numba.set_num_threads(before)


def test_bit_identical_for_any_thread_count():
    many = min(2, numba.config.NUMBA_NUM_THREADS)
    first, again, single = _gradients(many), _gradients(many), _gradients(1)
    for i, (a, b, c) in enumerate(zip(first, again, single, strict=True)):
        assert torch.equal(a, b) and torch.equal(a, c), f"tensor {i} differs"


def test_rasterization_on_cpu_and_auto_is_the_reference():
    inputs, view, K, camera, _, _, bg = _scene(150, torch.float32, C=2, kind="ftheta",
                                              shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM,
                                              seed=7)
    means, quats, scales, colors, opacities = inputs
    assert registry.resolve_name("rasterize_to_pixels_eval3d", means.device, "auto") == "cpu"
    assert registry.resolve_name("fully_fused_projection_with_ut", means.device,
                                 "auto") == "cpu"
    results = {}
    for backend in ("cpu", "torch"):
        leaves = [t.clone().requires_grad_() for t in (means, quats, scales, opacities[0],
                                                       colors[0])]
        img, alpha, meta = gsplat.rasterization(
            *leaves, view, K, W, H, packed=False, with_ut=True, with_eval3d=True,
            backgrounds=bg, tile_size=TILE, backend=backend, **camera)
        g = torch.Generator().manual_seed(8)
        loss = (torch.randn(img.shape, generator=g) * img).sum() + alpha.square().sum()
        results[backend] = (img, alpha, meta["radii"], *torch.autograd.grad(loss, leaves))
    for i, (a, e) in enumerate(zip(results["cpu"], results["torch"], strict=True)):
        tol = TOL32["forward"] if i < 3 else TOL32["gradient"]
        assert_close(f"output {i}", a, e, tol, tol)


def test_packed_colors_are_the_dense_pairs():
    """Packed rows (shuffled, some unread) give the dense call's outputs and gradients, bit
    for bit, with batch dims and masks."""
    from ut_packed_parity import check_packed_parity

    inputs, view, K, camera, offsets, flatten_ids, bg = _scene(
        90, torch.float32, batch=(2,), kind="opencv",
        shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, seed=12)
    check_packed_parity("cpu", inputs, view, K, camera, offsets, flatten_ids, bg, W, H, TILE,
                        masks=_masks(batch=(2,)))


def test_rasterization_packed_is_unpacked_on_cpu():
    inputs, view, K, camera, _, _, bg = _scene(120, torch.float32, kind="fisheye", seed=13)
    means, quats, scales, colors, opacities = inputs
    out = {}
    for packed in (False, True):
        leaves = [t.clone().requires_grad_() for t in (means, quats, scales, opacities[0],
                                                       colors[0])]
        img, alpha, _ = gsplat.rasterization(
            *leaves, view, K, W, H, packed=packed, with_ut=True, with_eval3d=True,
            backgrounds=bg, tile_size=TILE, backend="cpu", **camera)
        loss = (torch.randn(img.shape, generator=torch.Generator().manual_seed(8)) * img).sum()
        out[packed] = (img, alpha, *torch.autograd.grad(loss + alpha.sum(), leaves))
    assert float(out[False][1].detach().max()) > 0.5
    for i, (a, e) in enumerate(zip(out[True], out[False], strict=True)):
        assert torch.equal(a, e), f"output {i}: packed differs from unpacked"


# ---------------------------------------------------------------------------------------------
# the projection


def _projection_scene(kind, shutter, dtype, seed=11):
    """Gaussians around and behind two cameras (batch 2): some culled by depth, by the image
    (wider than it) and by opacity."""
    inputs, view, K, camera, *_ = _scene(250, dtype, batch=(2,), kind=kind, shutter=shutter,
                                         seed=seed)
    means, quats, scales, _, _ = inputs
    g = torch.Generator().manual_seed(seed)
    means = means * torch.tensor([2.5, 2.5, 9.0], dtype=dtype)  # depths from -1.5 to 7.5
    opacities = torch.rand(means.shape[:-1], generator=g, dtype=dtype) * 0.6 + 0.002
    return (means, quats, scales, opacities, view, K), camera


def _project(args, camera, backend, **options):
    return gsplat.fully_fused_projection_with_ut(*args, W, H, backend=backend, **camera,
                                                 **options)


OPTIONS = [
    {"calc_compensations": True},
    {"near_plane": 2.5, "far_plane": 5.0, "radius_clip": 1.5, "eps2d": 0.1},
    {"ut_params": UnscentedTransformParameters(alpha=0.3, beta=1.0, kappa=1.0,
                                               in_image_margin_factor=0.05,
                                               require_all_sigma_points_valid=False),
     "calc_compensations": True},
]


@pytest.mark.parametrize("shutter", [RollingShutterType.GLOBAL,
                                     RollingShutterType.ROLLING_RIGHT_TO_LEFT],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("kind", KINDS)
def test_projection_is_the_definition(kind, shutter):
    """float64: the reference's outputs (radii exactly). float32: the kernel computes in
    float64, so it is the float64 reference's result rounded (radii exactly, the rest to
    1e-5); the float32 reference is up to ~1e-3 px off, and its rolling f-theta Newton
    inverse can flip a sigma point's validity, so it is not the oracle here."""
    for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
        args, camera = _projection_scene(kind, shutter, dtype)
        exact_args = [a.double() for a in args]
        for i, options in enumerate(OPTIONS):
            got = _project(args, camera, "cpu", **options)
            want = _project(exact_args, _float64(camera), "torch", **options)
            assert torch.equal(got[0], want[0]), f"options {i}: radii differ"
            visible = int((want[0] > 0).any(-1).sum())
            assert 0 < visible < want[0][..., 0].numel(), f"options {i}: {visible} visible"
            for name, a, e in zip(("means2d", "depths", "conics", "compensations"), got[1:],
                                  want[1:], strict=True):
                if e is None:
                    assert a is None
                    continue
                assert a.dtype == dtype
                assert_close(f"{name} (options {i}, {dtype})", a, e, tol, tol)


def test_projection_without_opacities_and_zero_gaussians():
    args, camera = _projection_scene("fisheye", RollingShutterType.ROLLING_TOP_TO_BOTTOM,
                                     torch.float64)
    args = (*args[:3], None, *args[4:])
    for a, e in zip(_project(args, camera, "cpu"), _project(args, camera, "torch"),
                    strict=True):
        if e is not None:
            assert_close("output", a, e, 1e-10, 1e-10)
    empty = (args[0][:, :0], args[1][:, :0], args[2][:, :0], None, *args[4:])
    radii = _project(empty, camera, "cpu")[0]
    assert radii.shape == (2, 2, 0, 2)
