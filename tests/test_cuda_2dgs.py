"""The ``cuda`` backend's 2DGS kernels in numba's CUDA simulator, against the torch reference:
``fully_fused_projection_2dgs`` and ``rasterize_to_pixels_2dgs``, values and every gradient in
float32 and float64, with backgrounds, masks, shifted surfels (``densify``), absgrad, packed
input, no surfels, empty tiles, full and partial warps (tile 8: 64 threads; tile 4: 16), the
``deterministic`` option (bitwise-equal runs), and a short 2DGS training through the CLI with
``backend = "cuda"`` that runs the kernels and warns nothing. 2DGS renders pinhole cameras
only (``ops/twodgs.py`` has no camera model), so that is the one camera model here.

As ``test_cuda_sim.py``: the outer run has one test that runs this file again in a
subprocess with the simulator on and ``TILESPLAT_POISON=1`` (every output buffer starts as
NaN). Scenes are tiny (13×9 images, a dozen surfels): the simulator runs every GPU thread
as a Python thread. Tolerances: forward 1e-5, gradients 1e-4 (abs or rel) in float32, 1e-10
/ 1e-9 in float64, as the CPU backend's 2DGS tests.
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

    def test_cuda_2dgs_kernels_in_simulator(request):
        from helpers import run_in_cuda_simulator

        passed = run_in_cuda_simulator([__file__], str(request.config.rootpath))
        assert len(passed) >= 16, passed

else:
    import warnings

    import torch

    import tilesplat
    from helpers import assert_close, cameras, random_gaussians, tile_grid
    from tilesplat.backends.cuda import reset_options, set_options
    from tilesplat.backends.cuda import twodgs as cuda_twodgs

    TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-9)}  # forward, gradients
    OUTS = ("colors", "alphas", "normals", "distort", "median")
    LEAVES = ("means2d", "ray_transforms", "colors", "opacities", "normals", "densify",
              "backgrounds")

    @pytest.fixture(autouse=True)
    def _options():
        reset_options()
        yield
        reset_options()

    def test_outputs_are_poisoned_here():
        assert os.environ.get("TILESPLAT_POISON") == "1"  # unwritten outputs would be NaN

    @pytest.mark.parametrize("dtype, batch", [(torch.float32, ()), (torch.float64, ()),
                                              (torch.float32, (2,))])
    def test_projection_matches_reference(dtype, batch):
        W, H = 13, 9
        means, quats, scales, _, _ = random_gaussians(16, batch, dtype=dtype, seed=2,
                                                      scale=0.4, spread=4.0)
        view, K = cameras(2, W, H, batch, dtype=dtype, distance=3.0)
        res = {}
        for b in ("cuda", "torch"):
            leaves = [t.clone().requires_grad_() for t in (means, quats, scales, view, K)]
            outs = tilesplat.fully_fused_projection_2dgs(*leaves, W, H, backend=b)
            g = torch.Generator().manual_seed(0)
            loss = sum((torch.randn(o.shape, generator=g, dtype=dtype) * o).sum()
                       for o in outs[1:])
            res[b] = outs, torch.autograd.grad(loss, leaves)
        (got, v_got), (want, v_want) = res["cuda"], res["torch"]
        assert torch.equal(got[0], want[0]), "radii"
        vis = (want[0] > 0).all(-1)
        assert 0 < int(vis.sum()) < vis.numel()  # some culled, some kept
        f_tol, g_tol = TOL[dtype]
        for name, a, e in zip(("means2d", "depths", "ray_transforms", "normals"), got[1:],
                              want[1:], strict=True):
            assert a.dtype == dtype
            assert_close(name, a, e, f_tol, f_tol)
        for name, a, e in zip(("means", "quats", "scales", "viewmats", "Ks"), v_got, v_want,
                              strict=True):
            assert_close(f"v_{name}", a, e, g_tol, g_tol)

    def _scene(n, W, H, tile, dtype, C=1, seed=3, spread=0.6, scale=0.4, off_view=0):
        """Projected surfels [C, n] (reference projection), RGB+D colours, tile lists; the
        first ``off_view`` surfels are moved out of every view."""
        means, quats, scales, opac, colors = random_gaussians(n, (), dtype=dtype, seed=seed,
                                                              scale=scale, spread=spread)
        means[:off_view, 0] += 100.0
        view, K = cameras(C, W, H, (), dtype=dtype, distance=3.0)
        radii, m2d, depths, M, normals = tilesplat.fully_fused_projection_2dgs(
            means, quats, scales, view, K, W, H, backend="torch")
        tw, th = tile_grid(W, H, tile)
        _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, tile, tw, th,
                                                          backend="torch")
        offsets = tilesplat.isect_offset_encode(isect_ids, C, tw, th, backend="torch")
        colors = torch.cat([colors[None].expand(C, n, 3), depths[..., None]], -1)
        opac = opac[None].expand(C, n)
        inputs = [m2d, M, colors.contiguous(), opac.contiguous(), normals, torch.zeros_like(m2d)]
        return inputs, offsets, flatten_ids

    def _run(backend, inputs, bg, masks, W, H, tile, offsets, flatten_ids, packed=False):
        """Outputs, gradients (inputs, then backgrounds) and absgrad under a random upstream
        gradient."""
        dtype = inputs[0].dtype
        leaves = [t.clone().requires_grad_() for t in inputs]
        bg_leaf = None if bg is None else bg.clone().requires_grad_()
        outs = tilesplat.rasterize_to_pixels_2dgs(
            *leaves, W, H, tile, offsets, flatten_ids, backgrounds=bg_leaf, masks=masks,
            packed=packed, absgrad=True, backend=backend)
        g = torch.Generator().manual_seed(1)
        loss = sum((torch.randn(o.shape, generator=g, dtype=dtype) * o).sum() for o in outs)
        wrt = leaves + ([bg_leaf] if bg is not None else [])
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        grads = [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, grads,
                                                                         strict=True)]
        return [o.detach() for o in outs], grads, leaves[5].absgrad

    def _compare(inputs, bg, masks, W, H, tile, offsets, flatten_ids, packed=False):
        """cuda against the reference; returns both results."""
        run = (W, H, tile, offsets, flatten_ids, packed)
        got = _run("cuda", inputs, bg, masks, *run)
        want = _run("torch", inputs, bg, masks, *run)
        dtype = inputs[0].dtype
        f_tol, g_tol = TOL[dtype]
        for name, a, e in zip(OUTS, got[0], want[0], strict=True):
            assert a.dtype == dtype and torch.isfinite(a).all(), name
            assert_close(name, a, e, f_tol, f_tol)
        for name, a, e in zip(LEAVES, got[1], want[1], strict=False):
            assert a.dtype == dtype and torch.isfinite(a).all(), f"v_{name}"
            assert_close(f"v_{name}", a, e, g_tol, g_tol)
        assert_close("absgrad", got[2], want[2], g_tol, g_tol)
        return got, want

    def _extras(offsets, dtype, inputs):
        """Backgrounds, masks with one tile off, surfels shifted by a random densify."""
        g = torch.Generator().manual_seed(2)
        bg = torch.rand(offsets.shape[0], 4, dtype=dtype, generator=g)
        masks = torch.ones(offsets.shape, dtype=torch.bool)
        masks[-1, 0, 1] = False
        inputs[5] = 0.3 * torch.randn(inputs[5].shape, dtype=dtype, generator=g)
        return bg, masks

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    @pytest.mark.parametrize("extras", [False, True])
    def test_rasterize_matches_reference(dtype, extras):
        W, H, tile = 13, 9, 8
        C = 2 if extras else 1
        inputs, offsets, flatten_ids = _scene(10, W, H, tile, dtype, C=C, seed=3)
        bg = masks = None
        if extras:
            bg, masks = _extras(offsets, dtype, inputs)
        _, want = _compare(inputs, bg, masks, W, H, tile, offsets, flatten_ids)
        assert float(want[0][1].max()) > 0.5 and float(want[0][4].max()) > 1.0  # covered
        assert float(want[1][1].abs().sum()) > 0 and float(want[0][3].abs().max()) > 0

    def test_partial_warps_and_empty_tiles():
        """tile 4: blocks of 16 threads (a partial warp reduces by its tree); tiles with
        no surfel."""
        W, H, tile = 11, 7, 4
        inputs, offsets, flatten_ids = _scene(6, W, H, tile, torch.float32, seed=1,
                                              spread=0.4, scale=0.15)
        counts = torch.diff(torch.cat([offsets.reshape(-1).long(),
                                       torch.tensor([len(flatten_ids)])]))
        assert (counts == 0).any() and counts.max() > 1  # empty tiles and busy ones
        bg, masks = _extras(offsets, torch.float32, inputs)
        _compare(inputs, bg, masks, W, H, tile, offsets, flatten_ids)

    def test_packed_matches_reference():
        W, H, tile = 13, 9, 8
        inputs, offsets, flatten_ids = _scene(10, W, H, tile, torch.float64, C=2, seed=7,
                                              off_view=2)
        vis = torch.zeros(inputs[0].shape[:2], dtype=torch.bool)
        vis.view(-1)[flatten_ids] = True
        nnz = vis.view(-1).nonzero()[:, 0]
        packed_ids = torch.full((vis.numel(),), -1, dtype=torch.long)
        packed_ids[nnz] = torch.arange(len(nnz))
        packed = [t.reshape(vis.numel(), *t.shape[2:])[nnz] for t in inputs]
        fids = packed_ids[flatten_ids.long()].int()
        assert len(nnz) < vis.numel()  # some surfels are off every tile
        _compare(packed, None, None, W, H, tile, offsets, fids, packed=True)

    def test_zero_surfels_give_the_background():
        W, H, tile = 13, 9, 8
        inputs, offsets, flatten_ids = _scene(1, W, H, tile, torch.float32)
        inputs = [t[:, :0] for t in inputs]
        offsets = torch.zeros_like(offsets)
        flatten_ids = flatten_ids[:0]
        bg = torch.tensor([[0.2, 0.4, 0.6, 0.0]])
        got, _ = _compare(inputs, bg, None, W, H, tile, offsets, flatten_ids)
        assert torch.equal(got[0][0], bg.expand(1, H, W, 4))
        assert torch.equal(got[0][1], torch.zeros(1, H, W, 1))

    def test_deterministic_option_is_bitwise_reproducible():
        """With ``deterministic`` the backward stores rows and sums them in a fixed order:
        the reference's gradients, bitwise equal from run to run, and within rounding of the
        atomic path."""
        W, H, tile = 13, 9, 8
        inputs, offsets, flatten_ids = _scene(10, W, H, tile, torch.float32, C=2, seed=3)
        bg, masks = _extras(offsets, torch.float32, inputs)
        atomic = _run("cuda", inputs, bg, masks, W, H, tile, offsets, flatten_ids)
        set_options(deterministic=True)
        first, _ = _compare(inputs, bg, masks, W, H, tile, offsets, flatten_ids)
        again = _run("cuda", inputs, bg, masks, W, H, tile, offsets, flatten_ids)
        for a, b in zip([*first[1], first[2]], [*again[1], again[2]], strict=True):
            assert torch.equal(a, b)
        for name, a, b in zip(LEAVES, first[1], atomic[1], strict=True):
            assert_close(f"v_{name}", a, b, 1e-6, 1e-6)

    def test_rasterization_2dgs_matches_reference():
        """The whole pipeline (projection, SH colours, tiles, rasterizer) on backend cuda, in
        float64 (in float32 the pipeline's gradients are ill-conditioned for the reference
        itself, see ``cpu/twodgs_rasterize_fwd.py``; the CPU's pipeline test is float64 too)."""
        W, H = 13, 9
        dt = torch.float64
        means, quats, scales, opac, _ = random_gaussians(8, (), dtype=dt, seed=4, scale=0.4,
                                                         spread=0.6)
        view, K = cameras(1, W, H, (), dtype=dt, distance=3.0)
        sh = torch.randn(8, 4, 3, dtype=dt, generator=torch.Generator().manual_seed(5)) * 0.5
        res = {}
        for b in ("cuda", "torch"):
            leaves = [t.clone().requires_grad_() for t in (means, quats, scales, opac, sh)]
            outs = tilesplat.rasterization_2dgs(*leaves, view, K, W, H, sh_degree=1,
                                                tile_size=8, render_mode="RGB+ED",
                                                distloss=True, backend=b)
            g = torch.Generator().manual_seed(6)
            loss = sum((torch.randn(o.shape, generator=g, dtype=dt) * o).sum()
                       for o in (outs[0], outs[1], outs[2], outs[4], outs[5]))
            res[b] = outs, torch.autograd.grad(loss, leaves)
        (got, v_got), (want, v_want) = res["cuda"], res["torch"]
        for name, i in (("colors", 0), ("alphas", 1), ("normals", 2), ("distort", 4),
                        ("median", 5)):
            assert_close(name, got[i], want[i], TOL[dt][0], TOL[dt][0])
        for name, a, e in zip(("means", "quats", "scales", "opacities", "sh"), v_got, v_want,
                              strict=True):
            assert_close(f"v_{name}", a, e, TOL[dt][1], TOL[dt][1])
        assert float(want[1].detach().max()) > 0.5

    def test_2dgs_trains_on_backend_cuda_without_a_warning(tmp_path, monkeypatch):
        """``tilesplat train --set model=2dgs --set backend=cuda``: the 2DGS kernels run
        (forward and backward), nothing falls back and nothing warns."""
        from tilesplat.cli import main

        calls = {"forward": 0, "backward": 0}
        for name, key in (("rasterize_forward", "forward"), ("rasterize_backward", "backward")):
            original = getattr(cuda_twodgs, name)

            def counted(*args, _original=original, _key=key, **kwargs):
                calls[_key] += 1
                return _original(*args, **kwargs)

            monkeypatch.setattr(cuda_twodgs, name, counted)
        keys = ["model=2dgs", "backend=cuda", "steps=2", "synthetic_size=12",
                "synthetic_train=1", "synthetic_test=1", "init_points=20", "lpips=false",
                "progress=false", "save_renders=false", "ssim_lambda=0",
                f"run_dir={tmp_path / 'run'}", f"cache_dir={tmp_path / 'cache'}"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert main(["train", *(a for k in keys for a in ("--set", k))]) == 0
        assert calls["forward"] >= 3 and calls["backward"] == 2, calls
        assert (tmp_path / "run" / "metrics.json").is_file()

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_indices_in_range_match_reference(dtype):
        """``rasterize_to_indices_in_range_2dgs``: the same pairs in the same order as the
        reference, for all batches onto T = 1 and for one batch onto a partial T."""
        W, H = 13, 9
        T = torch.ones(2, H, W, dtype=dtype)
        T[1, 2:5] = 3e-4  # near the stop: the first pair of alpha > 2/3 ends the pixel
        for tile, start, end in ((4, 0, 10**10), (2, 1, 3)):  # tile 2: batches of 4
            inputs, offsets, flatten_ids = _scene(10, W, H, tile, dtype, C=2, seed=3)
            m2d, rays, _, opac, _, _ = inputs
            args = (T, m2d, rays, opac, W, H, tile, offsets, flatten_ids)
            got = tilesplat.rasterize_to_indices_in_range_2dgs(start, end, *args,
                                                               backend="cuda")
            want = tilesplat.rasterize_to_indices_in_range_2dgs(start, end, *args,
                                                                backend="torch")
            for name, a, e in zip(("gaussian_ids", "pixel_ids", "image_ids"), got, want,
                                  strict=True):
                assert a.dtype == e.dtype and torch.equal(a, e), (name, start, a[:8], e[:8])
            assert len(want[0]) > (100 if start == 0 else 5) and (want[2] == 1).any()
        none = tilesplat.rasterize_to_indices_in_range_2dgs(50, 60, *args, backend="cuda")
        assert all(len(t) == 0 for t in none)  # no tile has 50 batches
