"""3DGUT on the ``cuda`` backend (issue 38) in numba's CUDA simulator, against the torch
reference: the eval3d rasterizer's kernels (``rasterize_to_pixels_eval3d``: images, alphas,
last ids and every gradient: means, quats, scales, colours, opacities, backgrounds) with a
pinhole camera, a distorted (OpenCV) one under a rolling shutter and a fisheye one in float64,
backgrounds, masked tiles, empty tiles, zero Gaussians, full and partial warps (tile 8: 64
threads; tile 4: 16), batch dims, the ``deterministic`` option (bitwise-equal runs), and
the unscented projection's kernel (every lens kind but the perfect pinhole's twin, rolling and
global shutters, culled Gaussians, float64 and float32 against the float64 reference, no
opacities, zero Gaussians), and ``rasterization(with_ut=True, with_eval3d=True)`` on
``cuda``.

As ``test_cuda_2dgs.py``: the outer run has one test that runs this file again in a subprocess
with the simulator on and ``TILESPLAT_POISON=1`` (every output buffer starts as NaN). Scenes
are tiny (13×9 images, a dozen Gaussians, one or two cameras): the simulator runs every GPU
thread as a Python thread. Tolerances: forward 1e-5, gradients 1e-4 (abs or rel) in float32,
1e-10 / 1e-9 in float64, as the CPU backend's 3DGUT tests.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)

INNER = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if not INNER:

    def test_ut_cuda_kernels_in_simulator(request):
        from helpers import run_in_cuda_simulator

        passed = run_in_cuda_simulator([__file__], str(request.config.rootpath))
        assert len(passed) >= 14, passed

else:
    import math

    import torch
    import torch.nn.functional as F

    import tilesplat as gsplat
    from helpers import assert_close
    from tilesplat.backends import registry
    from tilesplat.backends.cuda import reset_options, set_options
    from tilesplat.ops.camera import RollingShutterType

    W, H = 13, 9
    TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-9)}  # forward, gradients
    LEAVES = ("means", "quats", "scales", "colors", "opacities", "backgrounds")

    @pytest.fixture(autouse=True)
    def _options():
        reset_options()
        yield
        reset_options()

    def test_outputs_are_poisoned_here():
        assert os.environ.get("TILESPLAT_POISON") == "1"  # unwritten outputs would be NaN

    def _camera(kind, C, dtype):
        def rep(*v):
            return torch.tensor(v, dtype=dtype).expand(C, len(v)).contiguous()

        return {
            "pinhole": {},
            "opencv": {"radial_coeffs": rep(-0.05, 0.01, 0.002, 0.01, 0.0, 0.0),
                       "tangential_coeffs": rep(1e-3, -2e-3),
                       "thin_prism_coeffs": rep(1e-3, 0.0, -1e-3, 0.0)},
            "fisheye": {"camera_model": "fisheye",
                        "radial_coeffs": rep(0.02, -0.005, 0.001, 0.0)},
        }[kind]

    def _scene(n, dtype, C=1, tile=8, seed=1, kind="pinhole", rolling=False, left=False,
               width=W, height=H):
        """n Gaussians in front of C cameras (``left``: in the image's left part only, so
        the right tiles are empty), the camera keywords, the reference's tile lists and
        backgrounds."""
        g = torch.Generator().manual_seed(seed)
        means = (torch.rand(n, 3, generator=g, dtype=dtype) - 0.5) * torch.tensor(
            [1.2, 0.8, 1.0], dtype=dtype)
        if left:
            means[:, 0] = means[:, 0] * 0.2 - 0.7
        quats = F.normalize(torch.randn(n, 4, generator=g, dtype=dtype), dim=-1) * 1.3
        scales = torch.rand(n, 3, generator=g, dtype=dtype) * 0.2 + 0.08
        opacities = torch.rand(C, n, generator=g, dtype=dtype) * 0.8 + 0.15
        colors = torch.rand(C, n, 3, generator=g, dtype=dtype)
        view = torch.eye(4, dtype=dtype).repeat(C, 1, 1)
        view[:, 2, 3] = 3.0
        view[:, 0, 3] = torch.linspace(-0.1, 0.1, C, dtype=dtype)
        K = torch.tensor([[10.0, 0, width / 2 - 0.2], [0, 10.3, height / 2 - 0.3], [0, 0, 1]],
                         dtype=dtype).repeat(C, 1, 1)
        camera = _camera(kind, C, dtype)
        if rolling:
            rs = view.clone()
            rs[:, 0, 3] += 0.12
            c, s = math.cos(0.08), math.sin(0.08)
            rs[:, :3, :3] = torch.tensor([[c, -s, 0], [s, c, 0], [0, 0, 1]],
                                         dtype=dtype) @ rs[:, :3, :3]
            camera.update(rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM,
                          viewmats_rs=rs)
        tw, th = math.ceil(width / tile), math.ceil(height / tile)
        radii, m2d, depths, _, _ = gsplat.fully_fused_projection_with_ut(
            means, quats, scales, opacities.mean(0), view, K, width, height, backend="torch",
            **camera)
        _, isect_ids, flatten_ids = gsplat.isect_tiles(m2d, radii, depths, tile, tw, th,
                                                       backend="torch")
        offsets = gsplat.isect_offset_encode(isect_ids, C, tw, th, backend="torch")
        backgrounds = torch.rand(C, 3, generator=g, dtype=dtype)
        return {"inputs": [means, quats, scales, colors, opacities], "view": view, "K": K,
                "camera": camera, "offsets": offsets, "flatten_ids": flatten_ids,
                "backgrounds": backgrounds, "tile": tile, "size": (width, height)}

    def _render(backend, sc, with_bg=True, masks=None, seed=5):
        """Outputs (colors, alphas), last ids and the gradients of a random projection."""
        leaves = [t.clone().requires_grad_() for t in sc["inputs"]]
        bg = sc["backgrounds"].clone().requires_grad_() if with_bg else None
        colors, alphas, last = gsplat.rasterize_to_pixels_eval3d(
            *leaves, sc["view"], sc["K"], *sc["size"], sc["tile"], sc["offsets"],
            sc["flatten_ids"], backgrounds=bg, masks=masks, return_last_ids=True,
            backend=backend, **sc["camera"])
        g = torch.Generator().manual_seed(seed)
        loss = sum((torch.randn(o.shape, generator=g).to(o.dtype) * o).sum()
                   for o in (colors, alphas))
        wrt = leaves if bg is None else [*leaves, bg]
        return (colors.detach(), alphas.detach()), last, torch.autograd.grad(loss, wrt)

    def _compare(sc, with_bg=True, masks=None):
        """cuda against the reference; returns the cuda run."""
        got = _render("cuda", sc, with_bg, masks)
        want = _render("torch", sc, with_bg, masks)
        dtype = sc["inputs"][0].dtype
        f_tol, g_tol = TOL[dtype]
        for name, a, e in zip(("colors", "alphas"), got[0], want[0], strict=True):
            assert a.dtype == dtype and torch.isfinite(a).all(), name
            assert_close(name, a, e, f_tol, f_tol)
        assert torch.equal(got[1], want[1]), "last_ids differ"
        for name, a, e in zip(LEAVES, got[2], want[2], strict=False):
            assert a.dtype == dtype and torch.isfinite(a).all(), f"v_{name}"
            assert_close(f"v_{name}", a, e, g_tol, g_tol)
        return got

    def _masks(offsets):
        masks = torch.ones(offsets.shape, dtype=torch.bool)
        masks[-1, 0, 1] = False
        return masks

    def test_pinhole_two_cameras_backgrounds_masks_float32():
        sc = _scene(8, torch.float32, C=2)
        got = _compare(sc, masks=_masks(sc["offsets"]))
        assert float(got[0][1].max()) > 0.5 and int((got[1] >= 0).sum()) > W * H // 3
        assert torch.equal(got[0][1][-1, :8, 8:], torch.zeros(1, 8, 5, 1)[0])  # masked tile

    def test_distorted_rolling_shutter_float32():
        sc = _scene(8, torch.float32, kind="opencv", rolling=True, seed=2)
        got = _compare(sc)
        assert float(got[0][1].max()) > 0.5

    def test_fisheye_rolling_shutter_is_the_definition_in_float64():
        sc = _scene(10, torch.float64, kind="fisheye", rolling=True, seed=3)
        _compare(sc, masks=_masks(sc["offsets"]))

    def test_partial_warps_empty_tiles_no_background():
        """tile 4: blocks of 16 threads (a partial warp reduces by its tree); tiles with no
        Gaussian."""
        sc = _scene(8, torch.float32, tile=4, seed=4, left=True, width=11, height=7)
        counts = torch.diff(torch.cat([sc["offsets"].reshape(-1).long(),
                                       torch.tensor([len(sc["flatten_ids"])])]))
        assert (counts == 0).any() and counts.max() > 1  # empty tiles and busy ones
        _compare(sc, with_bg=False)

    def test_batch_dims():
        """means [2, N, 3] seen by [2, 2] cameras: pair p of the [B*C*N] is Gaussian
        (p // (C N)) N + p % N, each Gaussian's gradient summed over its batch's cameras."""
        w, h, tile, B, C, n = 11, 7, 4, 2, 2, 5
        dt = torch.float32
        g = torch.Generator().manual_seed(3)
        means = (torch.rand(B, n, 3, generator=g, dtype=dt) - 0.5) * torch.tensor(
            [1.2, 0.8, 1.0])
        quats = F.normalize(torch.randn(B, n, 4, generator=g, dtype=dt), dim=-1)
        scales = torch.rand(B, n, 3, generator=g, dtype=dt) * 0.2 + 0.08
        opac = torch.rand(B, C, n, generator=g, dtype=dt) * 0.8 + 0.15
        colors = torch.rand(B, C, n, 3, generator=g, dtype=dt)
        view = torch.eye(4, dtype=dt).repeat(B, C, 1, 1)
        view[..., 2, 3] = 3.0
        view[:, 1, 0, 3] = 0.2
        K = torch.tensor([[10.0, 0, 5.3], [0, 10.3, 3.2], [0, 0, 1]], dtype=dt).repeat(
            B, C, 1, 1)
        radii, m2d, depths, _, _ = gsplat.fully_fused_projection_with_ut(
            means, quats, scales, opac.mean(-2), view, K, w, h, backend="torch")
        tw, th = math.ceil(w / tile), math.ceil(h / tile)
        _, isect_ids, flatten_ids = gsplat.isect_tiles(m2d, radii, depths, tile, tw, th,
                                                       backend="torch")
        offsets = gsplat.isect_offset_encode(isect_ids, B * C, tw, th,
                                             backend="torch").reshape(B, C, th, tw)
        sc = {"inputs": [means, quats, scales, colors, opac], "view": view, "K": K,
              "camera": {}, "offsets": offsets, "flatten_ids": flatten_ids,
              "backgrounds": torch.rand(B, C, 3, generator=g, dtype=dt), "tile": tile,
              "size": (w, h)}
        got = _compare(sc)
        assert float(got[0][1].max()) > 0.5

    def test_zero_gaussians_give_the_background():
        sc = _scene(0, torch.float32)
        got = _compare(sc)
        assert torch.equal(got[0][0], sc["backgrounds"][:, None, None].expand(1, H, W, 3))
        assert torch.equal(got[0][1], torch.zeros(1, H, W, 1))

    def test_deterministic_option_is_bitwise_reproducible():
        """With ``deterministic`` the backward stores rows and sums them in a fixed order:
        the reference's gradients, bitwise equal from run to run."""
        sc = _scene(6, torch.float32, seed=6)
        set_options(deterministic=True)
        first = _compare(sc)
        again = _render("cuda", sc)
        for a, b in zip(first[2], again[2], strict=True):
            assert torch.equal(a, b)

    @pytest.mark.parametrize(("kind", "shutter"), [
        ("opencv", RollingShutterType.ROLLING_TOP_TO_BOTTOM),
        ("fisheye", RollingShutterType.ROLLING_LEFT_TO_RIGHT),
        ("ftheta_backward_reference", RollingShutterType.GLOBAL),
    ], ids=str)
    def test_projection_is_the_definition(kind, shutter):
        """As the cpu kernel's test (``test_ut_cpu.py``): float64, the float64 reference's
        outputs (radii exactly); float32, its result rounded (radii exactly, the rest to
        1e-5); 12 Gaussians of its scene (batch 2, two cameras: some culled)."""
        from test_ut_cpu import H as PH
        from test_ut_cpu import W as PW
        from test_ut_cpu import _float64, _projection_scene

        for dtype, tol in ((torch.float64, 1e-10), (torch.float32, 1e-5)):
            args, camera = _projection_scene(kind, shutter, dtype)
            args = (*(a[:, :12].contiguous() for a in args[:4]), *args[4:])
            got = gsplat.fully_fused_projection_with_ut(*args, PW, PH, backend="cuda",
                                                        calc_compensations=True, **camera)
            want = gsplat.fully_fused_projection_with_ut(
                *(a.double() for a in args), PW, PH, backend="torch", calc_compensations=True,
                **_float64(camera))
            assert torch.equal(got[0], want[0]), "radii differ"
            visible = int((want[0] > 0).any(-1).sum())
            assert 0 < visible < want[0][..., 0].numel(), visible
            for name, a, e in zip(("means2d", "depths", "conics", "compensations"), got[1:],
                                  want[1:], strict=True):
                assert a.dtype == dtype
                assert_close(f"{name} ({dtype})", a, e, tol, tol)

    def test_projection_without_opacities_and_zero_gaussians():
        from test_ut_cpu import H as PH
        from test_ut_cpu import W as PW
        from test_ut_cpu import _projection_scene

        args, camera = _projection_scene("pinhole", RollingShutterType.GLOBAL, torch.float64)
        args = (*(a[:, :6].contiguous() for a in args[:3]), None, *args[4:])
        for a, e in zip(
                gsplat.fully_fused_projection_with_ut(*args, PW, PH, backend="cuda", **camera),
                gsplat.fully_fused_projection_with_ut(*args, PW, PH, backend="torch", **camera),
                strict=True):
            if e is not None:
                assert_close("output", a, e, 1e-10, 1e-10)
        empty = (args[0][:, :0], args[1][:, :0], args[2][:, :0], None, *args[4:])
        radii = gsplat.fully_fused_projection_with_ut(*empty, PW, PH, backend="cuda",
                                                      **camera)[0]
        assert radii.shape == (2, 2, 0, 2)

    def test_packed_colors_are_the_dense_pairs():
        """Packed rows (shuffled, some unread) give the dense call's outputs and gradients
        (float64; the simulator's atomics may add in another order)."""
        from ut_packed_parity import check_packed_parity

        sc = _scene(10, torch.float64, C=2, seed=3, kind="opencv", rolling=True)
        check_packed_parity("cuda", sc["inputs"], sc["view"], sc["K"], sc["camera"],
                            sc["offsets"], sc["flatten_ids"], sc["backgrounds"], *sc["size"],
                            sc["tile"], tol=1e-12)

    def test_rasterization_with_ut_and_eval3d_on_cuda():
        """The whole pipeline (the projection kernel, tiles, the eval3d kernels) on backend
        cuda; ``auto`` picks cuda for CUDA tensors."""
        for op in ("rasterize_to_pixels_eval3d", "fully_fused_projection_with_ut"):
            assert registry.resolve_name(op, torch.device("cuda"), "auto") == "cuda"
        sc = _scene(8, torch.float32, seed=7, kind="opencv")
        means, quats, scales, colors, opacities = sc["inputs"]
        results = {}
        for backend in ("cuda", "torch"):
            leaves = [t.clone().requires_grad_() for t in (means, quats, scales, opacities[0],
                                                           colors[0])]
            img, alpha, meta = gsplat.rasterization(
                *leaves, sc["view"], sc["K"], W, H, packed=False, with_ut=True,
                with_eval3d=True, backgrounds=sc["backgrounds"], tile_size=8,
                backend=backend, **sc["camera"])
            g = torch.Generator().manual_seed(8)
            loss = (torch.randn(img.shape, generator=g) * img).sum() + alpha.square().sum()
            results[backend] = (img, alpha, meta["radii"], *torch.autograd.grad(loss, leaves))
        for i, (a, e) in enumerate(zip(results["cuda"], results["torch"], strict=True)):
            tol = TOL[torch.float32][0 if i < 3 else 1]
            assert_close(f"output {i}", a, e, tol, tol)
        assert float(results["torch"][1].detach().max()) > 0.5
