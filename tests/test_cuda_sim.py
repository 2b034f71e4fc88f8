"""The ``cuda`` backend's kernels run in numba's CUDA simulator and match the reference.

numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported, and other test
files import numba in the same pytest process, so the outer run has one test that runs this
file again in a subprocess with the simulator on; the inner run holds the parity tests,
all through the public API with ``use_backend("cuda")`` on CPU tensors. Scenes are tiny
(8×8 tiles, a handful of Gaussians): the simulator runs every GPU thread as a Python thread.
Tolerances: forward 1e-5, gradients 1e-4 (abs or rel), as DESIGN.md.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)

INNER = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

if not INNER:

    def test_cuda_kernels_in_simulator():
        env = {k: v for k, v in os.environ.items() if not k.startswith("TILESPLAT_CUDA_")}
        env.update(NUMBA_ENABLE_CUDASIM="1", TILESPLAT_POISON="1")
        cmd = [sys.executable, "-m", "pytest", __file__, "-q", "-x", "-p", "no:xdist",
               "-p", "no:cacheprovider"]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
        assert " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]

else:
    import torch

    import tilesplat
    from helpers import assert_close, cameras, random_gaussians, tile_grid
    from tilesplat.backends.cuda import reset_options, set_options

    FWD = {"atol": 1e-5, "rtol": 1e-5}
    GRAD = {"atol": 1e-4, "rtol": 1e-4}
    F64 = {"atol": 1e-10, "rtol": 1e-10}
    TILE = 8

    def _grads(fn, inputs, seed=1):
        """Outputs of fn(*leaves) and the gradients of a random linear loss of them."""
        leaves = [None if t is None else t.detach().clone().requires_grad_(True)
                  for t in inputs]
        outs = [o for o in fn(*leaves) if o is not None and o.is_floating_point()]
        g = torch.Generator().manual_seed(seed)
        loss = sum((o * torch.randn(o.shape, generator=g, dtype=o.dtype)).sum() for o in outs)
        used = [t for t in leaves if t is not None]
        grads = torch.autograd.grad(loss, used, allow_unused=True)
        return outs, [torch.zeros_like(t) if gr is None else gr
                      for t, gr in zip(used, grads, strict=True)]

    def _compare(fn, inputs, names, fwd=FWD, grad=GRAD):
        with tilesplat.use_backend("torch"):
            ref_out, ref_grad = _grads(fn, inputs)
        with tilesplat.use_backend("cuda"):
            out, grads = _grads(fn, inputs)
        for i, (a, e) in enumerate(zip(out, ref_out, strict=True)):
            assert_close(f"output {i}", a, e, **fwd)
        used = [n for n, t in zip(names, inputs, strict=True) if t is not None]
        for n, a, e in zip(used, grads, ref_grad, strict=True):
            assert_close(f"v_{n}", a, e, **grad)

    def _splats(I: int, N: int, width: int, height: int, channels: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        means2d = torch.rand((I, N, 2), generator=g) * torch.tensor([width, height]) * 1.2 - 1
        a = torch.rand((I, N), generator=g) * 0.25 + 0.04
        c = torch.rand((I, N), generator=g) * 0.25 + 0.04
        b = (torch.rand((I, N), generator=g) - 0.5) * 0.5 * torch.sqrt(a * c)
        conics = torch.stack([a, b, c], -1)
        colors = torch.rand((I, N, channels), generator=g)
        opacities = torch.rand((I, N), generator=g) * 0.9 + 0.1
        opacities[0, 0] = 1.0  # saturates alpha at 0.999 near its centre
        depths = torch.rand((I, N), generator=g) + 1
        radii = torch.full((I, N, 2), 7, dtype=torch.int32)
        return means2d, conics, colors, opacities, depths, radii

    @pytest.fixture(autouse=True)
    def _options():
        reset_options()
        yield
        reset_options()

    @pytest.mark.parametrize(
        "scheme, options, channels",
        [("per_pixel", {"warp_skip": True}, 3), ("per_pixel", {"warp_skip": False}, 3),
         ("per_splat", {"splat_batch": 32}, 3), ("per_splat", {"splat_batch": 256}, 2)],
    )
    def test_rasterize_to_pixels(scheme, options, channels):
        I, N, width, height = 2, 7, 16, 8
        tw, th = tile_grid(width, height, TILE)
        means2d, conics, colors, opacities, depths, radii = _splats(I, N, width, height,
                                                                    channels)
        _, isect_ids, flatten_ids = tilesplat.isect_tiles(
            means2d, radii, depths, TILE, tw, th, backend="torch")
        offsets = tilesplat.isect_offset_encode(isect_ids, I, tw, th, backend="torch")
        backgrounds = torch.rand((I, channels))
        masks = torch.ones((I, th, tw), dtype=torch.bool)
        masks[1, 0, 0] = False
        set_options(**options)

        def fn(m, q, c, o, bg):
            colors_, alphas, last = tilesplat.rasterize_to_pixels(
                m, q, c, o, width, height, TILE, offsets, flatten_ids, backgrounds=bg,
                masks=masks, absgrad=True, backward_scheme=scheme, return_last_ids=True)
            fn.last = last
            fn.means2d = m
            return colors_, alphas

        inputs = [means2d, conics, colors, opacities, backgrounds]
        names = ["means2d", "conics", "colors", "opacities", "backgrounds"]
        with tilesplat.use_backend("torch"):
            ref_out, ref_grad = _grads(fn, inputs)
            ref_last, ref_abs = fn.last, fn.means2d.absgrad
        with tilesplat.use_backend("cuda"):
            out, grad = _grads(fn, inputs)
            last, absgrad = fn.last, fn.means2d.absgrad
        assert torch.equal(last, ref_last)
        assert int((last >= 0).sum()) > 40, "the scene should cover pixels"
        for name, a, e in zip(["colors", "alphas"], out, ref_out, strict=True):
            assert_close(name, a, e, **FWD)
        for name, a, e in zip(names, grad, ref_grad, strict=True):
            assert_close(f"v_{name}", a, e, **GRAD)
        assert_close("absgrad", absgrad, ref_abs, **GRAD)

    @pytest.mark.parametrize("scheme, tile", [("per_pixel", 8), ("per_splat", 8),
                                              ("per_pixel", 12), ("per_pixel", 5)])
    def test_rasterize_saturated_pixels(scheme, tile):
        """Opaque splats drive T to the 1e-4 stop, where 1 - render_alphas keeps ~6e-4 of
        T's relative precision: the per_pixel backward replays T instead (exact_transmittance)
        and both schemes hold the gradient tolerance. Tiles of 12 (144 threads) and 5 (25)
        end in a partial warp."""
        width = height = tile
        g = torch.Generator().manual_seed(9)
        N = 10
        means2d = (torch.rand((1, N, 2), generator=g) * 2 + 3)
        conics = torch.tensor([0.08, 0.01, 0.08]).repeat(1, N, 1)
        colors = torch.rand((1, N, 3), generator=g)
        opacities = torch.full((1, N), 0.97)
        opacities[0, 3] = 1.0
        radii = torch.full((1, N, 2), 9, dtype=torch.int32)
        depths = torch.rand((1, N), generator=g) + 1
        _, isect_ids, flatten_ids = tilesplat.isect_tiles(means2d, radii, depths, tile, 1, 1,
                                                          backend="torch")
        offsets = tilesplat.isect_offset_encode(isect_ids, 1, 1, 1, backend="torch")

        def fn(m, q, c, o):
            out = tilesplat.rasterize_to_pixels(m, q, c, o, width, height, tile, offsets,
                                                flatten_ids, backward_scheme=scheme)
            assert float(out[1].detach().max()) > 0.999, "the scene should saturate some pixels"
            return out

        _compare(fn, [means2d, conics, colors, opacities],
                 ["means2d", "conics", "colors", "opacities"])

    def test_rasterize_schemes_agree_without_background():
        I, N, width, height = 1, 8, 16, 8
        tw, th = tile_grid(width, height, TILE)
        means2d, conics, colors, opacities, depths, radii = _splats(I, N, width, height, 3, 5)
        _, isect_ids, flatten_ids = tilesplat.isect_tiles(means2d, radii, depths, TILE, tw, th,
                                                          backend="torch")
        offsets = tilesplat.isect_offset_encode(isect_ids, I, tw, th, backend="torch")
        grads = {}
        for scheme in ("per_pixel", "per_splat"):
            def fn(m, q, c, o, scheme=scheme):
                return tilesplat.rasterize_to_pixels(m, q, c, o, width, height, TILE, offsets,
                                                     flatten_ids, backward_scheme=scheme)
            with tilesplat.use_backend("cuda"):
                grads[scheme] = _grads(fn, [means2d, conics, colors, opacities])[1]
        for a, e in zip(grads["per_splat"], grads["per_pixel"], strict=True):
            assert_close("per_splat vs per_pixel", a, e, **GRAD)

    @pytest.mark.parametrize("packed", [False, True])
    def test_isect_tiles_and_offsets_exact(packed):
        I, N, width, height = 2, 12, 24, 16
        tw, th = tile_grid(width, height, TILE)
        means2d, _, _, _, depths, radii = _splats(I, N, width, height, 3, 2)
        radii[0, 3] = 0  # culled
        radii[1, 4, 0] = 13
        depths[1, 5] = depths[1, 6]  # a tie: the stable sort keeps Gaussian order
        kwargs = {}
        if packed:
            keep = (radii > 0).all(-1)
            image_ids, gaussian_ids = keep.nonzero(as_tuple=True)
            means2d, radii, depths = means2d[keep], radii[keep], depths[keep]
            kwargs = {"packed": True, "n_images": I, "image_ids": image_ids,
                      "gaussian_ids": gaussian_ids}
        outs = {}
        for backend in ("torch", "cuda"):
            tiles, ids, flat = tilesplat.isect_tiles(means2d, radii, depths, TILE, tw, th,
                                                     backend=backend, **kwargs)
            offsets = tilesplat.isect_offset_encode(ids, I, tw, th, backend=backend)
            outs[backend] = (tiles, ids, flat, offsets)
        for a, e in zip(outs["cuda"], outs["torch"], strict=True):
            assert a.dtype == e.dtype and torch.equal(a, e)

    @pytest.mark.parametrize("camera_model", ["pinhole", "ortho", "fisheye"])
    def test_fully_fused_projection(camera_model):
        C, N, width, height = 2, 10, 24, 16
        means, quats, scales, opacities, _ = random_gaussians(N, seed=3, spread=1.5)
        means[0] = torch.tensor([0.0, 0.0, -4.5])  # behind the near plane of both cameras
        viewmats, Ks = cameras(C, width, height)
        if camera_model == "ortho":
            Ks[:, 0, 0] = Ks[:, 1, 1] = 6.0
        kwargs = {"calc_compensations": True, "camera_model": camera_model,
                  "radius_clip": 0.5, "eps2d": 0.3}

        def fn(m, q, s, o, v):
            radii, means2d, depths, conics, comps = tilesplat.fully_fused_projection(
                m, None, q, s, v, Ks, width, height, opacities=o, **kwargs)
            fn.radii = radii
            return means2d, depths, conics, comps

        inputs = [means, quats, scales, opacities, viewmats]
        _compare(fn, inputs, ["means", "quats", "scales", "opacities", "viewmats"])
        with tilesplat.use_backend("cuda"):
            fn(*inputs)
            radii = fn.radii
        with tilesplat.use_backend("torch"):
            fn(*inputs)
        assert torch.equal(radii, fn.radii)
        assert 0 < int((radii > 0).all(-1).sum()) < C * N

    def test_fully_fused_projection_from_covars():
        C, N, width, height = 1, 6, 16, 16
        means, quats, scales, _, _ = random_gaussians(N, seed=4)
        covars, _ = tilesplat.quat_scale_to_covar_preci(quats, scales, True, False, triu=True,
                                                        backend="torch")
        viewmats, Ks = cameras(C, width, height)

        def fn(m, cov):
            return tilesplat.fully_fused_projection(m, cov, None, None, viewmats, Ks, width,
                                                    height)[1:4]

        _compare(fn, [means, covars], ["means", "covars"])

    @pytest.mark.parametrize("triu", [False, True])
    def test_quat_scale_to_covar_preci(triu):
        _, quats, scales, _, _ = random_gaussians(7, seed=5)
        quats[0] *= 3.0  # not normalised

        def fn(q, s):
            return tilesplat.quat_scale_to_covar_preci(q, s, True, True, triu=triu)

        _compare(fn, [quats, scales], ["quats", "scales"])

    def test_spherical_harmonics_all_degrees_with_masks():
        M = 9
        g = torch.Generator().manual_seed(6)
        dirs = torch.randn((M, 3), generator=g) * 2
        coeffs = torch.randn((M, 25, 3), generator=g)
        masks = torch.rand(M, generator=g) > 0.3
        for degree in range(5):
            def fn(d, c, degree=degree):
                return (tilesplat.spherical_harmonics(degree, d, c, masks=masks),)

            _compare(fn, [dirs, coeffs], ["dirs", "coeffs"])

    @pytest.mark.parametrize("packed", [False, True])
    def test_rasterization_end_to_end(packed):
        """The whole pipeline in float64, where both backends must agree to rounding: in
        float32 the composition of ops loses ~3e-4 against float64 in *both* backends (the
        per-op tests above hold the float32 tolerances)."""
        C, N, width, height = 2, 8, 16, 8
        means, quats, scales, opacities, _ = random_gaussians(N, seed=7, spread=0.8,
                                                              scale=0.3, dtype=torch.float64)
        viewmats, Ks = cameras(C, width, height, dtype=torch.float64)
        g = torch.Generator().manual_seed(8)
        coeffs = torch.randn((N, 9, 3), generator=g, dtype=torch.float64) * 0.5
        backgrounds = torch.rand((C, 3), generator=g, dtype=torch.float64)

        def fn(m, q, s, o, sh, v):
            colors, alphas, _ = tilesplat.rasterization(
                m, q, s, o, sh, v, Ks, width, height, sh_degree=2, packed=packed,
                tile_size=TILE, backgrounds=backgrounds, render_mode="RGB+ED",
                rasterize_mode="antialiased")
            return colors, alphas

        _compare(fn, [means, quats, scales, opacities, coeffs, viewmats],
                 ["means", "quats", "scales", "opacities", "sh", "viewmats"],
                 fwd=F64, grad=F64)

    def test_options_are_validated():
        with pytest.raises(ValueError, match="splat_batch"):
            set_options(splat_batch=64)
        with pytest.raises(TypeError, match="warp_skip"):
            set_options(warp_skip=1)
        with pytest.raises(TypeError, match="exact_transmittance"):
            set_options(exact_transmittance="yes")
        set_options(warp_skip=False, splat_batch=256)
        assert tilesplat.backends.cuda.get_options() == {
            "warp_skip": False, "exact_transmittance": True, "splat_batch": 256}
        reset_options()
        assert tilesplat.backends.cuda.get_options()["splat_batch"] == 32

    def _raster_scene(I, N, width, height, channels, seed):
        tw, th = tile_grid(width, height, TILE)
        means2d, conics, colors, opacities, depths, radii = _splats(I, N, width, height,
                                                                    channels, seed)
        _, isect_ids, flatten_ids = tilesplat.isect_tiles(
            means2d, radii, depths, TILE, tw, th, backend="torch")
        offsets = tilesplat.isect_offset_encode(isect_ids, I, tw, th, backend="torch")
        masks = torch.ones((I, th, tw), dtype=torch.bool)
        masks[-1, 0, 0] = False
        return means2d, conics, colors, opacities, offsets, flatten_ids, masks

    def _compare_raster(scheme, I, N, width, height, channels, seed=11):
        """cuda against torch for rasterize_to_pixels with backgrounds, masks and absgrad."""
        means2d, conics, colors, opacities, offsets, flatten_ids, masks = _raster_scene(
            I, N, width, height, channels, seed)
        backgrounds = torch.rand((I, channels), generator=torch.Generator().manual_seed(3))

        def fn(m, q, c, o, bg):
            out = tilesplat.rasterize_to_pixels(
                m, q, c, o, width, height, TILE, offsets, flatten_ids, backgrounds=bg,
                masks=masks, absgrad=True, backward_scheme=scheme)
            fn.means2d = m
            return out

        inputs = [means2d, conics, colors, opacities, backgrounds]
        results = {}
        for backend in ("torch", "cuda"):
            with tilesplat.use_backend(backend):
                out, grad = _grads(fn, inputs)
                results[backend] = (out, grad, fn.means2d.absgrad)
        (out, grad, absgrad), (ref_out, ref_grad, ref_abs) = results["cuda"], results["torch"]
        for name, a, e in zip(["colors", "alphas"], out, ref_out, strict=True):
            assert_close(name, a, e, **FWD)
        names = ["means2d", "conics", "colors", "opacities", "backgrounds"]
        for name, a, e in zip(names, grad, ref_grad, strict=True):
            assert_close(f"v_{name}", a, e, **GRAD)
        assert_close("absgrad", absgrad, ref_abs, **GRAD)

    @pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
    def test_images_beyond_the_grid_limit_go_in_chunks(scheme, monkeypatch):
        """gridDim.z holds at most 65,535 images; with a fake limit of 2, three images take
        two launches of each kernel and match the reference."""
        from tilesplat.backends.cuda import runtime

        monkeypatch.setattr(runtime, "MAX_GRID_YZ", 2)
        runtime.reset_launch_stats()
        _compare_raster(scheme, 3, 6, 16, 8, 3)
        assert runtime.launch_stats()["launches"] == 4  # forward and backward, 2 chunks each

    @pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
    def test_colours_in_global_memory(scheme, monkeypatch):
        """Past 48 KB of shared memory (many channels, large tiles, float64) the backward
        kernels read colours from global memory; forced here for 5 channels."""
        from tilesplat.backends.cuda import raster_limits, rasterize_bwd

        monkeypatch.setattr(raster_limits, "colors_in_shared", lambda *args: False)
        rasterize_bwd.per_pixel_kernel.cache_clear()
        rasterize_bwd.per_splat_kernel.cache_clear()
        try:
            _compare_raster(scheme, 2, 7, 16, 8, 5)
        finally:
            rasterize_bwd.per_pixel_kernel.cache_clear()
            rasterize_bwd.per_splat_kernel.cache_clear()

    def test_per_splat_float32_near_saturation():
        """Many opaque layers: the colour still to come is the pixel's colour minus nearly all
        of it. Started from the float32 render_colors, per_splat's float32 gradients were off
        by ~1e-3 against float64 here; from the forward's hi + lo colour sum and a
        double-float remainder they are as close as per_pixel's (the CPU backend's test
        ``test_per_splat_float32_near_saturation``, at simulator size)."""
        W, H, G = 8, 8, 40
        g = torch.Generator().manual_seed(7)
        f = torch.float64
        means2d = torch.rand(G, 2, generator=g, dtype=f) * torch.tensor([W, H], dtype=f)
        s = torch.rand(G, generator=g, dtype=f) * 3 + 4
        conics = torch.stack([1 / s**2, torch.zeros(G, dtype=f), 1 / s**2], -1)
        colors = torch.rand(G, 3, generator=g, dtype=f)
        op = torch.rand(G, generator=g, dtype=f) * 0.3 + 0.25
        depths = torch.rand(G, generator=g, dtype=f) + 1
        radii = torch.ceil(3.33 * s)[:, None].expand(G, 2).int()
        _, ids, flat = tilesplat.isect_tiles(means2d[None], radii[None], depths[None], TILE,
                                             1, 1, backend="torch")
        offsets = tilesplat.isect_offset_encode(ids, 1, 1, 1, backend="torch")
        v_colors = torch.randn(1, H, W, 3, generator=g, dtype=f)
        backgrounds = torch.rand(1, 3, generator=g, dtype=f)

        def grads(dtype, scheme, backend):
            leaves = [t.to(dtype).clone().requires_grad_(True)
                      for t in (means2d, conics, colors, op)]
            rc, ra = tilesplat.rasterize_to_pixels(
                *(t[None] for t in leaves), W, H, TILE, offsets, flat,
                backgrounds=backgrounds.to(dtype), backward_scheme=scheme, backend=backend)
            assert float(ra.detach().min()) > 0.995  # saturated: T reaches the stop
            (rc * v_colors.to(dtype)).sum().backward()
            return [t.grad.double() for t in leaves]

        exact = grads(torch.float64, "per_pixel", "torch")
        err = {}
        for scheme in ("per_pixel", "per_splat"):
            got = grads(torch.float32, scheme, "cuda")
            # elementwise relative error, for elements above 1e-3 of their tensor's largest
            err[scheme] = max(float(((a - e).abs() / (e.abs() + 1e-3 * e.abs().max())).max())
                              for a, e in zip(got, exact, strict=True))
        assert err["per_splat"] < 5e-5, err
        assert err["per_splat"] < 4 * err["per_pixel"] + 1e-6, err

    def test_launch_counts_and_host_time():
        """One training-style step is 9 kernel launches from 8 launcher calls: projection,
        SH, isect_tiles (count and fill), isect_offset_encode, rasterization; then the
        rasterization, SH and projection backward. The launchers' own Python time is
        counted apart from the kernel calls."""
        from tilesplat.backends.cuda import launch_stats, reset_launch_stats

        C, N, width, height = 2, 8, 16, 8
        means, quats, scales, opacities, _ = random_gaussians(N, seed=7, spread=0.8, scale=0.3)
        viewmats, Ks = cameras(C, width, height)
        coeffs = torch.randn((N, 4, 3), generator=torch.Generator().manual_seed(8)) * 0.5
        leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities,
                                                           coeffs)]
        reset_launch_stats()
        with tilesplat.use_backend("cuda"):
            colors, alphas, _ = tilesplat.rasterization(*leaves, viewmats, Ks, width, height,
                                                        sh_degree=1, tile_size=TILE)
            (colors.sum() + alphas.sum()).backward()
        stats = launch_stats()
        assert stats["launches"] == 9, stats
        assert stats["launcher_calls"] == 8, stats
        assert 0 < stats["host_s"] < stats["host_s"] + stats["kernel_s"]
