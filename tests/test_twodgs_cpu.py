"""What only the ``cpu`` backend's 2DGS kernels have: gradients and the whole pipeline
bit-identical run to run and for any thread count (more than one chunk of surfels), and
``auto`` picking them on CPU tensors. Their parity against the reference (odd sizes,
backgrounds, masks, empty tiles, no surfels, packed, float32 and float64, bad input) is in
tests/ops (``test_*_2dgs.py``)."""

import numba
import torch

import tilesplat
from helpers import cameras, random_gaussians, tile_grid
from tilesplat.backends import registry

OUTS = ("colors", "alphas", "normals", "distort", "median")
LEAVES = ("means2d", "ray_transforms", "colors", "opacities", "normals", "densify",
          "backgrounds")


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


def _step(threads):
    """rasterize_to_pixels_2dgs on the cpu backend and its backward with ``threads``."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        W, H, tile = 40, 24, 8
        inputs, offsets, flatten_ids = _scene(1100, W, H, tile, torch.float32, C=1, seed=7,
                                              spread=1.5)
        bg = torch.rand(1, 4, generator=torch.Generator().manual_seed(3))
        leaves = [t.clone().requires_grad_() for t in inputs]
        bg_leaf = bg.clone().requires_grad_()
        outs = tilesplat.rasterize_to_pixels_2dgs(
            *leaves, W, H, tile, offsets, flatten_ids, backgrounds=bg_leaf, absgrad=True,
            backend="cpu")
        g = torch.Generator().manual_seed(4)
        loss = sum((torch.randn(o.shape, generator=g) * o).sum() for o in outs)
        grads = torch.autograd.grad(loss, [*leaves, bg_leaf])
        return [*outs, *grads, leaves[5].absgrad]
    finally:
        numba.set_num_threads(before)


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


def test_auto_uses_cpu():
    assert registry.resolve_name("rasterize_to_pixels_2dgs", torch.device("cpu"), "auto") == "cpu"
    assert registry.resolve_name("fully_fused_projection_2dgs", torch.device("cpu"),
                                 "auto") == "cpu"
