"""``rasterize_to_pixels_2dgs``: colours, alphas, normals, distortion and median depth and every
gradient (absgrad included) against the reference, on odd image sizes with backgrounds, masks,
empty and busy tiles, surfels as wide as the view or crossing the camera plane, no surfels at
all, packed input; float32 at the project's tolerances and float64 tight; bad input named.
The cuda backend's 2DGS kernels are checked in the simulator by tests/test_cuda_2dgs.py
(smaller scenes: the simulator is slow)."""

import math

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid

pytestmark = pytest.mark.backends("cpu")

OUTS = ("colors", "alphas", "normals", "distort", "median")
LEAVES = ("means2d", "ray_transforms", "colors", "opacities", "normals", "densify",
          "backgrounds")
TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-9)}  # forward, gradients


def _scene(n, W, H, tile, dtype, C=2, batch=(), seed=3, spread=1.0, scale=0.4):
    """Projected surfels [*batch, C, n] (reference projection), RGB+D colours, tile lists."""
    means, quats, scales, opac, colors = random_gaussians(n, batch, dtype=dtype, seed=seed,
                                                          scale=scale, spread=spread)
    view, K = cameras(C, W, H, batch, dtype=dtype, distance=3.0)
    radii, m2d, depths, M, normals = tilesplat.fully_fused_projection_2dgs(
        means, quats, scales, view, K, W, H, backend="torch")
    tw, th = tile_grid(W, H, tile)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, tile, tw, th,
                                                      backend="torch")
    images = (*batch, C)
    offsets = tilesplat.isect_offset_encode(isect_ids, math.prod(images), tw, th,
                                            backend="torch").reshape(*images, th, tw)
    colors = torch.cat([colors[..., None, :, :].expand(*images, n, 3), depths[..., None]], -1)
    opac = opac[..., None, :].expand(*images, n)
    return [m2d, M, colors.contiguous(), opac.contiguous(), normals,
            torch.zeros_like(m2d)], offsets, flatten_ids


def _run(backend, inputs, bg, masks, W, H, tile, offsets, flatten_ids, dtype, absgrad=True,
         upstream_dtype=None):
    """Outputs, gradients (inputs, then backgrounds) and absgrad under a random upstream
    gradient drawn in ``dtype`` (``upstream_dtype`` casts it: the float64 reference of a
    float32 run)."""
    leaves = [t.clone().requires_grad_() for t in inputs]
    bg_leaf = None if bg is None else bg.clone().requires_grad_()
    outs = tilesplat.rasterize_to_pixels_2dgs(
        *leaves, W, H, tile, offsets, flatten_ids, backgrounds=bg_leaf, masks=masks,
        absgrad=absgrad, backend=backend)
    g = torch.Generator().manual_seed(1)
    loss = sum((torch.randn(o.shape, generator=g, dtype=dtype).to(upstream_dtype or dtype) * o)
               .sum() for o in outs)
    wrt = leaves + ([bg_leaf] if bg is not None else [])
    grads = torch.autograd.grad(loss, wrt, allow_unused=True)
    grads = [torch.zeros_like(w) if g is None else g for w, g in zip(wrt, grads, strict=True)]
    return outs, grads, leaves[5].absgrad if absgrad else None


def _compare(backend, inputs, bg, masks, W, H, tile, offsets, flatten_ids, dtype):
    """``backend`` against the reference in ``dtype``. A float32 tensor off by more than the
    tolerance passes when it is no further from the float64 reference than twice the float32
    reference is: the ray-plane intersection cancels in float32 (the ray transforms'
    gradient is ill-conditioned), and the reference itself is ~1e-3 off there."""
    run = (W, H, tile, offsets, flatten_ids)
    got = _run(backend, inputs, bg, masks, *run, dtype)
    want = _run("torch", inputs, bg, masks, *run, dtype)
    exact = []

    def close(name, a, b, i, tol):
        try:
            assert_close(name, a, b, tol, tol)
        except AssertionError:
            if dtype != torch.float32:
                raise
            if not exact:  # the reference in float64, the upstream gradients rounded alike
                exact.append(_run("torch", [t.double() for t in inputs],
                                  None if bg is None else bg.double(), masks, *run, dtype,
                                  upstream_dtype=torch.float64))
            e = _flat(exact[0])[i]
            err, ref_err = (a.double() - e).abs().max(), (b.double() - e).abs().max()
            assert err <= 2 * ref_err, f"{name}: {err:.3g} from float64, reference {ref_err:.3g}"

    f_tol, g_tol = TOL[dtype]
    names = [*OUTS, *(f"v_{n}" for n in LEAVES[:len(got[1])]), "absgrad"]
    for i, (name, a, b) in enumerate(zip(names, _flat(got), _flat(want), strict=True)):
        assert a.dtype == dtype and torch.isfinite(a).all(), name
        close(name, a, b, i, f_tol if i < len(OUTS) else g_tol)
    return got, want


def _flat(result):
    """outputs, gradients, absgrad of :func:`_run` as one list."""
    return [*result[0], *result[1], result[2]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("extras", [False, True])
def test_matches_reference(backend, batch, extras, dtype):
    W, H, tile = 37, 29, 8
    inputs, offsets, flatten_ids = _scene(40, W, H, tile, dtype, batch=batch, spread=0.5,
                                          scale=0.25)
    counts = torch.diff(torch.cat([offsets.reshape(-1).long(),
                                   torch.tensor([len(flatten_ids)])]))
    assert (counts == 0).any() and counts.max() > 10  # empty tiles and busy ones
    bg = masks = None
    if extras:
        g = torch.Generator().manual_seed(2)
        bg = torch.rand(*offsets.shape[:-2], 4, dtype=dtype, generator=g)
        masks = torch.ones(offsets.shape, dtype=torch.bool)
        tiles = masks.view(-1, *offsets.shape[-2:])
        tiles[0, 1, 1] = tiles[-1, 2, 0] = False
        inputs[5] = torch.randn(inputs[5].shape, dtype=dtype, generator=g)  # shifted surfels
    got, want = _compare(backend, inputs, bg, masks, W, H, tile, offsets, flatten_ids, dtype)
    alphas, median = want[0][1].detach(), want[0][4].detach()
    assert float(alphas.max()) > 0.5 and float(median.max()) > 1.0  # covered pixels
    assert float(want[1][6 if extras else 0].abs().sum()) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_large_surfels_near_the_camera(backend, dtype):
    """Surfels as wide as the view, some edge-on or crossing the plane of the camera: their
    reach is unbounded (no box) or long and thin, and nothing that contributes is skipped."""
    W, H, tile = 23, 19, 8
    inputs, offsets, flatten_ids = _scene(12, W, H, tile, dtype, C=1, seed=9, spread=1.2,
                                          scale=2.0)
    _compare(backend, inputs, None, None, W, H, tile, offsets, flatten_ids, dtype)


def test_zero_surfels_give_the_background(backend):
    W, H, tile = 13, 11, 4
    inputs, offsets, flatten_ids = _scene(1, W, H, tile, torch.float32, C=1)
    inputs = [t[:, :0] for t in inputs]
    offsets = torch.zeros_like(offsets)
    flatten_ids = flatten_ids[:0]
    bg = torch.tensor([[0.2, 0.4, 0.6, 0.0]])
    got, _ = _compare(backend, inputs, bg, None, W, H, tile, offsets, flatten_ids,
                      torch.float32)
    assert torch.equal(got[0][0], bg.expand(1, H, W, 4))
    assert torch.equal(got[0][1], torch.zeros(1, H, W, 1))


def test_packed_matches_reference(backend):
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
    for b in (backend, "torch"):
        leaves = [t.clone().requires_grad_() for t in packed]
        o = tilesplat.rasterize_to_pixels_2dgs(*leaves, W, H, tile, offsets, fids, packed=True,
                                               backend=b)
        g = torch.autograd.grad(sum((x * (i + 1)).sum() for i, x in enumerate(o)), leaves)
        outs[b] = (o, g)
    f_tol, g_tol = TOL[torch.float64]
    for name, a, b in zip(OUTS, outs[backend][0], outs["torch"][0], strict=True):
        assert_close(name, a, b, f_tol, f_tol)
    for name, a, b in zip(LEAVES, outs[backend][1], outs["torch"][1], strict=False):
        assert_close(f"v_{name}", a, b, g_tol, g_tol)


def test_bad_input_is_named(backend):
    W, H, tile = 13, 11, 4
    inputs, offsets, flatten_ids = _scene(6, W, H, tile, torch.float32, C=1)
    m2d, M, colors, opac, normals, dens = inputs
    call = tilesplat.rasterize_to_pixels_2dgs
    tail = (W, H, tile, offsets, flatten_ids)
    with pytest.raises(ValueError, match="ray_transforms"):
        call(m2d, M[..., :2], colors, opac, normals, dens, *tail, backend=backend)
    with pytest.raises(ValueError, match="normals"):
        call(m2d, M, colors, opac, normals[..., :2], dens, *tail, backend=backend)
    with pytest.raises(ValueError, match="flatten_ids"):
        call(m2d, M, colors, opac, normals, dens, W, H, tile, offsets, flatten_ids + 100,
             backend=backend)
    with pytest.raises(ValueError, match="isect_offsets"):
        call(m2d, M, colors, opac, normals, dens, W + 8, H, tile, offsets, flatten_ids,
             backend=backend)
    with pytest.raises(TypeError):
        call(m2d, M.double(), colors, opac, normals, dens, *tail, backend=backend)
    with pytest.raises(ValueError, match="absgrad"):
        call(m2d, M, colors, opac, normals, dens, *tail, absgrad=True, backend=backend)
