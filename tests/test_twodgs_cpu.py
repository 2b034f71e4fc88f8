"""2DGS rasterizer on the ``cpu`` backend against the torch reference: every output and every
gradient (absgrad included) on odd image sizes, with backgrounds, masks, empty tiles and no
surfels at all, float32 at the project's tolerances and float64 tight; outputs poisoned with
NaN; gradients bit-identical for any thread count; bad input; ``auto`` picks it on CPU."""

import numba
import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid
from tilesplat.backends import registry
from tilesplat.backends.cpu import _common

OUTS = ("colors", "alphas", "normals", "distort", "median")
LEAVES = ("means2d", "ray_transforms", "colors", "opacities", "normals", "densify",
          "backgrounds")
TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-9)}  # forward, gradients


@pytest.fixture(autouse=True)
def _poison():
    _common.set_poison(True)  # a kernel that leaves an output unwritten fails
    yield
    _common.set_poison(None)


def _scene(n, W, H, tile, dtype, C=2, seed=3, spread=1.0, scale=0.4):
    """Projected surfels (reference projection), RGB+D colours, the tile lists."""
    means, quats, scales, opac, colors = random_gaussians(n, dtype=dtype, seed=seed, scale=scale,
                                                          spread=spread)
    view, K = cameras(C, W, H, dtype=dtype, distance=3.0)
    radii, m2d, depths, M, normals = tilesplat.fully_fused_projection_2dgs(
        means, quats, scales, view, K, W, H, backend="torch")
    tw, th = tile_grid(W, H, tile)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, tile, tw, th,
                                                      backend="torch")
    offsets = tilesplat.isect_offset_encode(isect_ids, C, tw, th, backend="torch")
    colors = torch.cat([colors[None].expand(C, n, 3), depths[..., None]], -1).contiguous()
    return [m2d, M, colors, opac[None].expand(C, n).contiguous(), normals,
            torch.zeros_like(m2d)], offsets, flatten_ids


def _run(backend, inputs, bg, masks, W, H, tile, offsets, flatten_ids, ups, absgrad=True):
    leaves = [t.clone().requires_grad_() for t in inputs]
    bg_leaf = None if bg is None else bg.clone().requires_grad_()
    outs = tilesplat.rasterize_to_pixels_2dgs(
        *leaves, W, H, tile, offsets, flatten_ids, backgrounds=bg_leaf, masks=masks,
        absgrad=absgrad, backend=backend)
    loss = sum((u * o).sum() for u, o in zip(ups(outs), outs, strict=True))
    wrt = leaves + ([bg_leaf] if bg is not None else [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, grads, strict=True)]
    return outs, grads, leaves[5].absgrad if absgrad else None


def _upstream(dtype, seed=1):
    def ups(outs):
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(o.shape, generator=g, dtype=dtype) for o in outs]

    return ups


def _compare(inputs, bg, masks, W, H, tile, offsets, flatten_ids, dtype):
    """CPU against the reference in ``dtype``. A float32 gradient off by more than the
    tolerance passes when it is no further from the float64 reference than twice the float32
    reference is: the ray transforms' gradient is ill-conditioned in float32 (the ray-plane
    intersection cancels), and the reference itself is ~1e-3 off there."""
    ups = _upstream(dtype)
    run = (W, H, tile, offsets, flatten_ids)
    got = _run("cpu", inputs, bg, masks, *run, ups)
    want = _run("torch", inputs, bg, masks, *run, ups)
    f_tol, g_tol = TOL[dtype]
    for name, a, b in zip(OUTS, got[0], want[0], strict=True):
        assert a.dtype == dtype and torch.isfinite(a).all(), name
        assert_close(name, a, b, f_tol, f_tol)
    exact = None
    for i, (name, a, b) in enumerate(zip(LEAVES, [*got[1], got[2]], [*want[1], want[2]],
                                         strict=False)):
        assert torch.isfinite(a).all(), name
        try:
            assert_close(f"v_{name}", a, b, g_tol, g_tol)
        except AssertionError:
            if dtype != torch.float32:
                raise
            if exact is None:
                exact = _run("torch", [t.double() for t in inputs],
                             None if bg is None else bg.double(), masks, *run,
                             lambda outs: [u.double() for u in ups(outs)])
            e = [*exact[1], exact[2]][i]
            err, ref_err = (a.double() - e).abs().max(), (b.double() - e).abs().max()
            assert err <= 2 * ref_err, f"v_{name}: {err:.3g} from float64, reference {ref_err:.3g}"
    assert_close("absgrad", got[2], want[2], g_tol, g_tol)
    return got, want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("extras", [False, True])
def test_matches_reference(dtype, extras):
    W, H, tile = 37, 29, 8
    inputs, offsets, flatten_ids = _scene(40, W, H, tile, dtype, spread=0.5, scale=0.25)
    counts = torch.diff(torch.cat([offsets.reshape(-1).long(),
                                   torch.tensor([len(flatten_ids)])]))
    assert (counts == 0).any() and counts.max() > 10  # empty tiles and busy ones
    bg = masks = None
    if extras:
        g = torch.Generator().manual_seed(2)
        bg = torch.rand(2, 4, dtype=dtype, generator=g)
        masks = torch.ones(offsets.shape, dtype=torch.bool)
        masks[0, 1, 1] = masks[1, 2, 0] = False
        inputs[5] = torch.randn(inputs[5].shape, dtype=dtype, generator=g)  # shifted surfels
    got, want = _compare(inputs, bg, masks, W, H, tile, offsets, flatten_ids, dtype)
    alphas, median = want[0][1].detach(), want[0][4].detach()
    assert float(alphas.max()) > 0.5 and float(median.max()) > 1.0  # covered pixels
    assert float(want[1][6 if extras else 0].abs().sum()) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_surfels_near_the_camera(dtype):
    """Surfels as wide as the view, some edge-on or crossing the plane of the camera: their
    reach is unbounded (no box) or long and thin, and nothing that contributes is skipped."""
    W, H, tile = 23, 19, 8
    inputs, offsets, flatten_ids = _scene(12, W, H, tile, dtype, C=1, seed=9, spread=1.2,
                                          scale=2.0)
    _compare(inputs, None, None, W, H, tile, offsets, flatten_ids, dtype)


def test_zero_surfels_give_the_background():
    W, H, tile = 13, 11, 4
    dtype = torch.float32
    inputs, offsets, flatten_ids = _scene(1, W, H, tile, dtype, C=1)
    inputs = [t[:, :0] for t in inputs]
    offsets = torch.zeros_like(offsets)
    flatten_ids = flatten_ids[:0]
    bg = torch.tensor([[0.2, 0.4, 0.6, 0.0]])
    got, _ = _compare(inputs, bg, None, W, H, tile, offsets, flatten_ids, dtype)
    assert torch.equal(got[0][0], bg.expand(1, H, W, 4))
    assert torch.equal(got[0][1], torch.zeros(1, H, W, 1))


def test_auto_uses_cpu_and_packed_matches():
    assert registry.resolve_name("rasterize_to_pixels_2dgs", torch.device("cpu"), "auto") == "cpu"
    W, H, tile = 21, 17, 8
    inputs, offsets, flatten_ids = _scene(30, W, H, tile, torch.float64, seed=5)
    vis = torch.zeros(inputs[0].shape[:2], dtype=torch.bool)
    vis.view(-1)[flatten_ids] = True
    nnz = vis.view(-1).nonzero()[:, 0]
    packed_ids = torch.full((vis.numel(),), -1, dtype=torch.long)
    packed_ids[nnz] = torch.arange(len(nnz))
    packed = [t.reshape(vis.numel(), *t.shape[2:])[nnz] for t in inputs]
    fids = packed_ids[flatten_ids.long()].int()
    outs = {}
    for backend in ("auto", "torch"):
        leaves = [t.clone().requires_grad_() for t in packed]
        o = tilesplat.rasterize_to_pixels_2dgs(*leaves, W, H, tile, offsets, fids, packed=True,
                                               backend=backend)
        g = torch.autograd.grad(sum((x * (i + 1)).sum() for i, x in enumerate(o)), leaves)
        outs[backend] = (o, g)
    f_tol, g_tol = TOL[torch.float64]
    for name, a, b in zip(OUTS, outs["auto"][0], outs["torch"][0], strict=True):
        assert_close(name, a, b, f_tol, f_tol)
    for name, a, b in zip(LEAVES, outs["auto"][1], outs["torch"][1], strict=False):
        assert_close(f"v_{name}", a, b, g_tol, g_tol)


def _step(threads):
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        W, H, tile = 40, 24, 8
        inputs, offsets, flatten_ids = _scene(1100, W, H, tile, torch.float32, C=1, seed=7,
                                              spread=1.5)
        bg = torch.rand(1, 4, generator=torch.Generator().manual_seed(3))
        outs, grads, absgrad = _run("cpu", inputs, bg, None, W, H, tile, offsets, flatten_ids,
                                    _upstream(torch.float32, seed=4))
        return [*outs, *grads, absgrad]
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_projection_matches_reference(dtype):
    """Batch dims, three cameras, surfels behind the near plane and off the image (culled)."""
    means, quats, scales, _, _ = random_gaussians(40, (2,), dtype=dtype, seed=2, scale=0.4,
                                                  spread=4.0)
    view, K = cameras(3, 41, 29, (2,), dtype=dtype, distance=3.0)
    res = {}
    for backend in ("cpu", "torch"):
        leaves = [t.clone().requires_grad_() for t in (means, quats, scales, view, K)]
        outs = tilesplat.fully_fused_projection_2dgs(*leaves, 41, 29, backend=backend)
        g = torch.Generator().manual_seed(0)
        loss = sum((torch.randn(o.shape, generator=g, dtype=dtype) * o).sum() for o in outs[1:])
        res[backend] = outs, torch.autograd.grad(loss, leaves)
    (got, v_got), (want, v_want) = res["cpu"], res["torch"]
    assert torch.equal(got[0], want[0]), "radii"
    vis = (want[0] > 0).all(-1)
    assert 20 < int(vis.sum()) < vis.numel()  # some culled
    f_tol, g_tol = TOL[dtype]
    for name, a, b in zip(("means2d", "depths", "ray_transforms", "normals"), got[1:], want[1:],
                          strict=True):
        assert_close(name, a, b, f_tol, f_tol)
    for name, a, b in zip(("means", "quats", "scales", "viewmats", "Ks"), v_got, v_want,
                          strict=True):
        assert_close(f"v_{name}", a, b, g_tol, g_tol)


def test_rasterization_2dgs_on_cpu_matches_reference():
    """The whole pipeline with backend="cpu" (packed, RGB+ED, backgrounds, distloss)."""
    means, quats, scales, opac, colors = random_gaussians(30, dtype=torch.float64, seed=5,
                                                          scale=0.3)
    view, K = cameras(2, 24, 20, dtype=torch.float64, distance=3.0)
    res = {}
    for backend in ("cpu", "torch"):
        leaves = [t.clone().requires_grad_() for t in (means, quats, scales, opac, colors)]
        out = tilesplat.rasterization_2dgs(*leaves, view, K, 24, 20, packed=True,
                                           render_mode="RGB+ED", distloss=True,
                                           backgrounds=torch.ones(2, 3, dtype=torch.float64),
                                           backend=backend)
        images = [o for o in out[:6] if o is not None]
        g = torch.Generator().manual_seed(1)
        loss = sum((torch.randn(o.shape, generator=g, dtype=o.dtype) * o).sum() for o in images)
        res[backend] = images, torch.autograd.grad(loss, leaves)
    f_tol, g_tol = TOL[torch.float64]
    for i, (a, b) in enumerate(zip(res["cpu"][0], res["torch"][0], strict=True)):
        assert_close(f"output {i}", a, b, f_tol, f_tol)
    for name, a, b in zip(("means", "quats", "scales", "opacities", "colors"), res["cpu"][1],
                          res["torch"][1], strict=True):
        assert_close(f"v_{name}", a, b, g_tol, g_tol)


def _pipeline_step(threads):
    """rasterization_2dgs on the cpu backend: > 1 chunk of surfels, 2 cameras."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        means, quats, scales, opac, colors = random_gaussians(1100, seed=8, spread=1.5,
                                                              scale=0.1)
        view, K = cameras(2, 32, 24, distance=3.0)
        leaves = [t.clone().requires_grad_() for t in (means, quats, scales, opac, colors, view)]
        out = tilesplat.rasterization_2dgs(*leaves[:5], leaves[5], K, 32, 24,
                                           render_mode="RGB+D", backend="cpu")
        g = torch.Generator().manual_seed(2)
        loss = sum((torch.randn(o.shape, generator=g) * o).sum() for o in out[:6]
                   if o is not None)
        return [*(o for o in out[:6] if o is not None), *torch.autograd.grad(loss, leaves)]
    finally:
        numba.set_num_threads(before)


def test_pipeline_bit_identical_for_any_thread_count():
    many = min(2, numba.config.NUMBA_NUM_THREADS)
    first, again, single = _pipeline_step(many), _pipeline_step(many), _pipeline_step(1)
    for i, (a, b, c) in enumerate(zip(first, again, single, strict=True)):
        assert bool(a.abs().sum() > 0), f"tensor {i}: all zero"
        assert torch.equal(a, b) and torch.equal(a, c), f"tensor {i} differs"


def test_gradients_bit_identical_for_any_thread_count():
    many = min(2, numba.config.NUMBA_NUM_THREADS)
    first, again, single = _step(many), _step(many), _step(1)
    names = [*OUTS, *(f"v_{n}" for n in LEAVES), "absgrad"]
    for name, a, b, c in zip(names, first, again, single, strict=True):
        assert bool(a.abs().sum() > 0), f"{name}: all zero"
        assert torch.equal(a, b), f"{name} differs between two runs"
        assert torch.equal(a, c), f"{name} differs between {many} threads and 1 thread"


def test_bad_input_is_named():
    W, H, tile = 13, 11, 4
    inputs, offsets, flatten_ids = _scene(6, W, H, tile, torch.float32, C=1)
    m2d, M, colors, opac, normals, dens = inputs
    call = tilesplat.rasterize_to_pixels_2dgs
    with pytest.raises(ValueError, match="ray_transforms"):
        call(m2d, M[..., :2], colors, opac, normals, dens, W, H, tile, offsets, flatten_ids,
             backend="cpu")
    with pytest.raises(ValueError, match="normals"):
        call(m2d, M, colors, opac, normals[..., :2], dens, W, H, tile, offsets, flatten_ids,
             backend="cpu")
    with pytest.raises(ValueError, match="flatten_ids"):
        call(m2d, M, colors, opac, normals, dens, W, H, tile, offsets, flatten_ids + 100,
             backend="cpu")
    with pytest.raises(ValueError, match="isect_offsets"):
        call(m2d, M, colors, opac, normals, dens, W + 8, H, tile, offsets, flatten_ids,
             backend="cpu")
    with pytest.raises(TypeError):
        call(m2d, M.double(), colors, opac, normals, dens, W, H, tile, offsets, flatten_ids,
             backend="cpu")
    with pytest.raises(ValueError, match="absgrad"):
        call(m2d, M, colors, opac, normals, dens, W, H, tile, offsets, flatten_ids,
             absgrad=True, backend="cpu")
