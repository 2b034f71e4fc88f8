"""What only the ``cuda`` backend has, run in numba's CUDA simulator: its options (warp_skip,
splat_batch, their validation), images beyond the grid limit in chunks, colours read from
global memory, and its launch counts. Its op parity against the reference is in tests/ops
(the ``cuda-sim`` parameters).

numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported, and other test
files import numba in the same pytest process, so the outer run has one test that runs this
file again in a subprocess with the simulator on (``helpers.run_in_cuda_simulator``); the
inner run holds the tests, through the public API with ``use_backend("cuda")`` on CPU
tensors. Scenes are tiny (8×8 tiles, a handful of Gaussians): the simulator runs every GPU
thread as a Python thread. Tolerances: forward 1e-5, gradients 1e-4 (abs or rel), as
DESIGN.md.
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

    def test_cuda_kernels_in_simulator(request):
        from helpers import run_in_cuda_simulator

        passed = run_in_cuda_simulator([__file__], str(request.config.rootpath))
        assert len(passed) >= 8, passed

else:
    import numpy as np
    import torch
    from numba import cuda

    import tilesplat
    from helpers import assert_close, cameras, random_gaussians, tile_grid
    from tilesplat.backends.cuda import reset_options, set_options

    FWD = {"atol": 1e-5, "rtol": 1e-5}
    GRAD = {"atol": 1e-4, "rtol": 1e-4}
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
        """cuda against torch for rasterize_to_pixels with backgrounds, masks and absgrad;
        last_ids exactly."""
        means2d, conics, colors, opacities, offsets, flatten_ids, masks = _raster_scene(
            I, N, width, height, channels, seed)
        backgrounds = torch.rand((I, channels), generator=torch.Generator().manual_seed(3))

        def fn(m, q, c, o, bg):
            colors_, alphas, last = tilesplat.rasterize_to_pixels(
                m, q, c, o, width, height, TILE, offsets, flatten_ids, backgrounds=bg,
                masks=masks, absgrad=True, backward_scheme=scheme, return_last_ids=True)
            fn.means2d, fn.last = m, last
            return colors_, alphas

        inputs = [means2d, conics, colors, opacities, backgrounds]
        results = {}
        for backend in ("torch", "cuda"):
            with tilesplat.use_backend(backend):
                out, grad = _grads(fn, inputs)
                results[backend] = (out, grad, fn.means2d.absgrad, fn.last)
        (out, grad, absgrad, last), (ref_out, ref_grad, ref_abs, ref_last) = (
            results["cuda"], results["torch"])
        assert torch.equal(last, ref_last)
        assert int((ref_last >= 0).sum()) > ref_last.numel() // 3, "the scene should cover pixels"
        for name, a, e in zip(["colors", "alphas"], out, ref_out, strict=True):
            assert_close(name, a, e, **FWD)
        names = ["means2d", "conics", "colors", "opacities", "backgrounds"]
        for name, a, e in zip(names, grad, ref_grad, strict=True):
            assert_close(f"v_{name}", a, e, **GRAD)
        assert_close("absgrad", absgrad, ref_abs, **GRAD)

    @pytest.mark.parametrize(
        "scheme, options, channels",
        [("per_pixel", {"warp_skip": False}, 3), ("per_splat", {"splat_batch": 256}, 2),
         ("per_pixel", {"deterministic": True}, 3), ("per_splat", {"deterministic": True}, 2)],
    )
    def test_rasterize_options(scheme, options, channels):
        """The options that are not the default (tests/ops runs the defaults: warp_skip on,
        splat_batch 32) give the reference's images and gradients too."""
        set_options(**options)
        _compare_raster(scheme, 2, 7, 16, 8, channels, seed=0)  # 2 tiles: warps skip across

    def test_options_are_validated():
        with pytest.raises(ValueError, match="splat_batch"):
            set_options(splat_batch=64)
        with pytest.raises(TypeError, match="warp_skip"):
            set_options(warp_skip=1)
        with pytest.raises(TypeError, match="exact_transmittance"):
            set_options(exact_transmittance="yes")
        with pytest.raises(TypeError, match="deterministic"):
            set_options(deterministic=1)
        set_options(warp_skip=False, splat_batch=256)
        assert tilesplat.backends.cuda.get_options() == {
            "warp_skip": False, "exact_transmittance": True, "splat_batch": 256,
            "deterministic": False}
        reset_options()
        assert tilesplat.backends.cuda.get_options()["splat_batch"] == 32

    @pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
    def test_images_beyond_the_grid_limit_go_in_chunks(scheme, monkeypatch):
        """gridDim.z holds at most 65,535 images; with a fake limit of 2, three images take
        two launches of each kernel and match the reference."""
        from tilesplat.backends.cuda import runtime

        monkeypatch.setattr(runtime, "MAX_GRID_YZ", 2)
        runtime.reset_launch_stats()
        _compare_raster(scheme, 3, 5, 8, 8, 3)
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
            _compare_raster(scheme, 2, 6, 8, 8, 5)
        finally:
            rasterize_bwd.per_pixel_kernel.cache_clear()
            rasterize_bwd.per_splat_kernel.cache_clear()

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

    def test_a_blocks_threads_share_one_shared_array():
        """numba-cuda's simulator allocates a shared array when the first thread reaches its
        line, without a lock: threads released together could each get their own (about 1
        round in 8 of 64 threads), and one then read an unwritten batch (a CI failure in
        rasterize_fwd). backends/cuda/simulator.py installs a locked allocation; here 64
        threads reach the line at once, 100 times, with the interpreter switching threads
        as often as it can, and every thread of a round must get the same array."""
        import sys
        import threading

        from numba.cuda.simulator.kernelapi import FakeCUDAShared

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        try:
            for _ in range(100):
                shared = FakeCUDAShared(0)
                got = [None] * 64
                barrier = threading.Barrier(64, timeout=30)

                def reach(i, shared=shared, got=got, barrier=barrier):
                    barrier.wait()
                    got[i] = shared.array(16, np.int32)

                threads = [threading.Thread(target=reach, args=(i,)) for i in range(64)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(timeout=30)
                assert len({id(a) for a in got}) == 1
        finally:
            sys.setswitchinterval(interval)

        out = np.zeros((4, 32), np.int32)
        _rotate[4, 32](out)  # the same through a kernel: one array per call site
        assert (out == (np.arange(32) + 1) % 32).all()

    @cuda.jit
    def _rotate(out):
        """out[b, t] = t + 1 (mod 32), through a shared array (at module level: the simulator
        swaps ``cuda`` for its fake module in a kernel's globals only)."""
        s = cuda.shared.array(32, np.int32)
        t = cuda.threadIdx.x
        s[t] = t
        cuda.syncthreads()
        out[cuda.blockIdx.x, t] = s[(t + 1) % 32]

    def test_a_blocks_barrier_counts_the_threads_still_running():
        """syncthreads without the simulator's polling (backends/cuda/simulator_blocks.py):
        threads that returned early do not hold the others, each round sees every write of
        the one before, syncthreads_count counts, and a thread's error is the launch's."""
        out = np.zeros((3, 64), np.int32)
        _rounds[3, 64](out)
        for b in range(3):
            live = np.arange(64) < 48  # threads 48.. returned before the rounds
            expected = np.where(live, 5 * 48 + np.arange(64), 0)
            assert (out[b] == expected).all(), out[b]
        with pytest.raises(ValueError, match="thread 7 fails"):
            _fails[2, 16](np.zeros(32, np.int32))

    @cuda.jit
    def _rounds(out):
        """Five rounds of write, barrier, read a neighbour's write; out[b, t] = 5 * (the
        number of threads counted by syncthreads_count each round) + t."""
        s = cuda.shared.array(64, np.int32)
        t = cuda.threadIdx.x
        if t >= 48:
            return
        total = 0
        for r in range(5):
            s[t] = r * 64 + t
            cuda.syncthreads()
            if s[(t + 1) % 48] != r * 64 + (t + 1) % 48:
                total -= 1000
            total += cuda.syncthreads_count(1)
            cuda.syncthreads()
        out[cuda.blockIdx.x, t] = total + t

    @cuda.jit
    def _fails(out):
        t = cuda.threadIdx.x
        cuda.syncthreads()
        if t == 7:
            raise ValueError("thread 7 fails")
        cuda.syncthreads()
        out[cuda.blockIdx.x * 16 + t] = 1


    def _float_adds(monkeypatch):
        """Counts the simulator's float atomic adds per (array, element)."""
        from collections import Counter

        from numba.cuda.simulator.kernelapi import FakeCUDAAtomic

        counts: Counter = Counter()
        original = FakeCUDAAtomic.add

        def add(self, array, index, val):
            if np.dtype(array.dtype).kind == "f":
                key = index if isinstance(index, tuple) else (index,)
                counts[(id(array), tuple(int(i) for i in key))] += 1
            return original(self, array, index, val)

        monkeypatch.setattr(FakeCUDAAtomic, "add", add)
        return counts

    @pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
    def test_deterministic_gradients_have_one_writer_per_element(scheme, monkeypatch):
        """deterministic=True: a whole rasterization() step of 2 cameras (projection, SH,
        rasterization, their backward) adds no float twice to one element, so the gradients
        cannot depend on the threads' order; they equal the reference's, and three runs are
        bitwise equal. Without the option the same step adds to some element more than
        once (what the test would catch)."""
        C, N, width, height = 2, 9, 16, 8
        means, quats, scales, opacities, _ = random_gaussians(N, seed=5, spread=0.8, scale=0.3)
        viewmats, Ks = cameras(C, width, height)
        coeffs = torch.randn((N, 4, 3), generator=torch.Generator().manual_seed(6)) * 0.5

        def run():
            leaves = [t.clone().requires_grad_(True)
                      for t in (means, quats, scales, opacities, coeffs, viewmats)]
            colors, alphas, _ = tilesplat.rasterization(
                *leaves[:5], leaves[5], Ks, width, height, sh_degree=1, tile_size=TILE,
                backward_scheme=scheme)
            g = torch.Generator().manual_seed(2)
            loss = (colors * torch.randn(colors.shape, generator=g)).sum() + (
                alphas * torch.randn(alphas.shape, generator=g)).sum()
            return torch.autograd.grad(loss, leaves)

        with tilesplat.use_backend("torch"):
            ref = run()
        counts = _float_adds(monkeypatch)
        with tilesplat.use_backend("cuda"):
            run()
            assert max(counts.values()) > 1  # atomics meet on one element by default
            set_options(deterministic=True)
            counts.clear()
            first = run()
            assert counts and max(counts.values()) == 1, counts.most_common(3)
            again = [run() for _ in range(2)]
        names = ["means", "quats", "scales", "opacities", "coeffs", "viewmats"]
        for name, a, e in zip(names, first, ref, strict=True):
            assert_close(f"v_{name}", a, e, **GRAD)
        for other in again:
            for name, a, b in zip(names, first, other, strict=True):
                assert torch.equal(a, b), name

    @pytest.mark.parametrize("model", ["3dgs", "2dgs"])
    def test_the_deterministic_keyword_is_the_option_for_one_call(model, monkeypatch):
        """``rasterization(..., deterministic=True)`` (and ``rasterization_2dgs``) with the
        process-wide option off: the backward, run after the call returned, adds no float
        twice to one element; two runs are bitwise equal and equal to what
        ``set_options(deterministic=True)`` gives. ``deterministic=False`` under
        ``set_options(deterministic=True)`` has atomics again, for that call only."""
        C, N, width, height = 2, 9, 16, 8
        means, quats, scales, opacities, _ = random_gaussians(N, seed=5, spread=0.8, scale=0.3)
        viewmats, Ks = cameras(C, width, height)
        coeffs = torch.randn((N, 4, 3), generator=torch.Generator().manual_seed(6)) * 0.5
        render = tilesplat.rasterization if model == "3dgs" else tilesplat.rasterization_2dgs

        def run(**kw):
            leaves = [t.clone().requires_grad_(True)
                      for t in (means, quats, scales, opacities, coeffs, viewmats)]
            out = render(*leaves[:5], leaves[5], Ks, width, height, sh_degree=1,
                         tile_size=TILE, backend="cuda", **kw)
            g = torch.Generator().manual_seed(2)
            loss = sum((o * torch.randn(o.shape, generator=g)).sum() for o in out[:2])
            return torch.autograd.grad(loss, leaves)

        counts = _float_adds(monkeypatch)
        first = run(deterministic=True)
        assert max(counts.values(), default=0) <= 1, counts.most_common(3)
        assert tilesplat.backends.cuda.get_options()["deterministic"] is False  # call only
        second = run(deterministic=True)
        set_options(deterministic=True)
        by_option = run()
        counts.clear()
        run(deterministic=False)  # the call's False wins over the process option
        assert max(counts.values()) > 1
        names = ["means", "quats", "scales", "opacities", "coeffs", "viewmats"]
        for other in (second, by_option):
            for name, a, b in zip(names, first, other, strict=True):
                assert torch.equal(a, b), name

    def test_the_fixed_order_sum_of_the_segments():
        """segment.reduce_parts: rows of each intersection's warps summed, then each
        Gaussian's intersections in their order; float64 reference, Gaussians with no
        intersection get 0."""
        from tilesplat.backends.cuda.segment import reduce_parts

        g = torch.Generator().manual_seed(0)
        n, warps, G = 11, 3, 6
        ids = torch.tensor([4, 0, 4, 2, 0, 0, 5, 4, 2, 0, 5], dtype=torch.int32)
        a = torch.randn((n * warps, 2), generator=g)
        b = torch.randn(n * warps, generator=g)
        sa, sb = reduce_parts([a, b], warps, ids, G)
        ea = torch.zeros((G, 2), dtype=torch.float64)
        eb = torch.zeros(G, dtype=torch.float64)
        ea.index_add_(0, ids.long(), a.double().reshape(n, warps, 2).sum(1))
        eb.index_add_(0, ids.long(), b.double().reshape(n, warps).sum(1))
        assert sa.shape == (G, 2) and sb.shape == (G,)
        assert_close("a", sa.double(), ea, atol=1e-6, rtol=1e-6)
        assert_close("b", sb.double(), eb, atol=1e-6, rtol=1e-6)
        assert sa[1].abs().sum() == 0 and sb[3] == 0
