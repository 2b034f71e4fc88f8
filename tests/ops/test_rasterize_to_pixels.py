"""``rasterize_to_pixels``, both backward schemes: colours, alphas, last_ids (exactly) and the
gradients of means2d, conics, colours, opacities and backgrounds, plus absgrad, against the
reference; odd image sizes (partial tiles), masks, backgrounds, 1-4 channels, mostly empty
tiles, a 1-pixel image, no Gaussians, no intersections, pixels driven to the T = 1e-4 stop,
tiles whose thread count ends in a partial warp (5, 12), and per_splat's float32 precision
near saturation."""

import math

import pytest
import torch

import tilesplat
from helpers import assert_close, tile_grid

from .parity import SCHEMES, assert_parity, dtypes, run, simulated, tolerances

OUTPUTS = ["colors", "alphas", "last_ids"]
INPUTS = ["means2d", "conics", "colors", "opacities", "backgrounds"]


def _splats(images, n, W, H, ts, dtype=torch.float32, seed=0, opacity=0.9, D=3):
    """Random 2D Gaussians [*images, n] and their sorted intersections (from the reference):
    means2d, conics, colors, opacities, then isect_offsets [*images, TH, TW], flatten_ids."""
    g = torch.Generator().manual_seed(seed)
    f = torch.float64
    means2d = torch.rand(*images, n, 2, generator=g, dtype=f) * torch.tensor([W * 1.2, H * 1.2],
                                                                             dtype=f) - 2
    sx = torch.rand(*images, n, generator=g, dtype=f) * 4 + 0.5
    sy = torch.rand(*images, n, generator=g, dtype=f) * 4 + 0.5
    rho = (torch.rand(*images, n, generator=g, dtype=f) - 0.5) * 1.6
    det = sx * sx * sy * sy * (1 - rho * rho)
    conics = torch.stack([sy * sy / det, -rho * sx * sy / det, sx * sx / det], -1)
    radii = torch.stack([torch.ceil(3 * sx), torch.ceil(3 * sy)], -1).int()
    depths = torch.rand(*images, n, generator=g, dtype=f) * 5 + 1
    colors = torch.rand(*images, n, D, generator=g, dtype=f)
    opac = torch.rand(*images, n, generator=g, dtype=f) * opacity
    TW, TH = tile_grid(W, H, ts)
    means2d, conics, colors, opac, depths = (t.to(dtype) for t in (means2d, conics, colors,
                                                                   opac, depths))
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(means2d, radii, depths, ts, TW, TH,
                                                      backend="torch")
    offsets = tilesplat.isect_offset_encode(isect_ids, math.prod(images), TW, TH,
                                            backend="torch")
    return means2d, conics, colors, opac, offsets.reshape(*images, TH, TW), flatten_ids


def _raster(W, H, ts, offsets, flatten_ids, masks=None, scheme="per_pixel", absgrad=False):
    def fn(m, q, c, o, bg=None, *, backend):
        return tilesplat.rasterize_to_pixels(
            m, q, c, o, W, H, ts, offsets, flatten_ids, backgrounds=bg, masks=masks,
            absgrad=absgrad, backward_scheme=scheme, return_last_ids=True, backend=backend)

    return fn


@pytest.mark.parametrize("scheme", SCHEMES)
def test_matches_reference(backend, batch, scheme):
    """Odd sizes (partial tiles on both edges), masks, backgrounds, absgrad; opacities up to
    0.95 so that many pixels reach the T = 1e-4 stop."""
    # cuda-sim: one partial tile per image (its cost is per block), the mask on a whole image
    W, H, ts, C, n = (7, 5, 8, 1, 6) if simulated(backend) else (37, 23, 16, 2, 300)
    images = (*batch, C)
    for dtype in dtypes(backend, batch):
        m, q, c, o, offsets, flat = _splats(images, n, W, H, ts, dtype, opacity=0.95)
        bg = torch.rand(*images, 3, generator=torch.Generator().manual_seed(3)).to(dtype)
        masks = torch.ones(offsets.shape, dtype=torch.bool)
        tiles = masks.view(-1, *offsets.shape[-2:])  # [I, TH, TW]
        if masks.numel() > 1:
            tiles[0, 0, -1] = False  # the first image's top right tile
        if len(tiles) > 1 and tiles[0].numel() > 1:
            tiles[-1, -1, 0] = False  # and the last image's bottom left one
        fn = _raster(W, H, ts, offsets, flat, masks, scheme, absgrad=True)
        got, want = assert_parity(fn, [m, q, c, o, bg], backend, dtype, f"{scheme} {dtype}",
                                  outputs=OUTPUTS, inputs=INPUTS)
        grad_tol = tolerances(backend, dtype)[1]
        assert_close("absgrad", got.leaves[0].absgrad, want.leaves[0].absgrad, grad_tol,
                     grad_tol)
        last = want.outputs[2]
        assert int((last >= 0).sum()) > last.numel() // 3, "the scene should cover pixels"


@pytest.mark.parametrize("D", [1, 4])  # not RGB: the kernels' general channel loops
@pytest.mark.parametrize("scheme", SCHEMES)
def test_channels(backend, scheme, D):
    W, H, ts, n = (8, 8, 8, 6) if simulated(backend) else (29, 21, 16, 150)
    m, q, c, o, offsets, flat = _splats((1,), n, W, H, ts, seed=4, D=D)
    bg = torch.rand(1, D, generator=torch.Generator().manual_seed(5))
    assert_parity(_raster(W, H, ts, offsets, flat, scheme=scheme), [m, q, c, o, bg], backend,
                  torch.float32, f"D={D} {scheme}", outputs=OUTPUTS, inputs=INPUTS)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_absgrad_and_empty_tiles(backend, scheme):
    W, H, ts, n = (16, 12, 4, 1) if simulated(backend) else (150, 90, 16, 6)
    m, q, c, o, offsets, flat = _splats((1,), n, W, H, ts, seed=3)
    counts = torch.cat([offsets.reshape(-1), torch.tensor([len(flat)])]).diff()
    assert int((counts == 0).sum()) > 5  # empty tiles
    fn = _raster(W, H, ts, offsets, flat, scheme=scheme, absgrad=True)
    got, want = assert_parity(fn, [m, q, c, o], backend, torch.float32, scheme,
                              outputs=OUTPUTS, inputs=INPUTS[:4])
    assert_close("absgrad", got.leaves[0].absgrad, want.leaves[0].absgrad, 1e-4, 1e-4)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("case", ["one_pixel", "no_gaussians", "no_intersections"])
def test_degenerate(backend, case, scheme):
    W, H, ts, I = (1, 1, 16, 1) if case == "one_pixel" else (20, 9, 8, 2)
    if simulated(backend):
        ts, I = 8, 1
    n = 0 if case == "no_gaussians" else 5
    m, q, c, o, offsets, flat = _splats((I,), n, W, H, ts, seed=1)
    if case == "no_intersections":
        flat, offsets = flat[:0], torch.zeros_like(offsets)
    bg = torch.rand(I, 3)
    assert_parity(_raster(W, H, ts, offsets, flat, scheme=scheme), [m, q, c, o, bg], backend,
                  torch.float32, f"{case} {scheme}", outputs=OUTPUTS, inputs=INPUTS)


@pytest.mark.parametrize("scheme, tile", [("per_pixel", 8), ("per_splat", 8),
                                          ("per_pixel", 12), ("per_pixel", 5)])
def test_saturated_pixels(backend, scheme, tile):
    """Opaque splats drive T to the 1e-4 stop, where 1 - render_alphas keeps ~6e-4 of T's
    relative precision (cuda's per_pixel backward reads the T the forward kept:
    exact_transmittance). On the GPU, tiles of 12 (144 threads) and 5 (25) end in a partial
    warp."""
    g = torch.Generator().manual_seed(9)
    N = 10
    means2d = torch.rand((1, N, 2), generator=g) * 2 + 3
    conics = torch.tensor([0.08, 0.01, 0.08]).repeat(1, N, 1)
    colors = torch.rand((1, N, 3), generator=g)
    opacities = torch.full((1, N), 0.97)
    opacities[0, 3] = 1.0
    radii = torch.full((1, N, 2), 9, dtype=torch.int32)
    depths = torch.rand((1, N), generator=g) + 1
    _, isect_ids, flat = tilesplat.isect_tiles(means2d, radii, depths, tile, 1, 1,
                                               backend="torch")
    offsets = tilesplat.isect_offset_encode(isect_ids, 1, 1, 1, backend="torch")
    fn = _raster(tile, tile, tile, offsets, flat, scheme=scheme)
    _, want = assert_parity(fn, [means2d, conics, colors, opacities], backend, torch.float32,
                            f"{scheme} tile {tile}", outputs=OUTPUTS, inputs=INPUTS[:4])
    assert float(want.outputs[1].max()) > 0.999, "the scene should saturate some pixels"


def test_schemes_agree_without_background(backend):
    W, H, ts, n = (8, 8, 8, 6) if simulated(backend) else (37, 23, 16, 300)
    m, q, c, o, offsets, flat = _splats((1,), n, W, H, ts, seed=5, opacity=0.95)
    grads = {s: run(_raster(W, H, ts, offsets, flat, scheme=s), [m, q, c, o], backend).grads
             for s in SCHEMES}
    for name, a, e in zip(INPUTS, grads["per_splat"], grads["per_pixel"], strict=False):
        assert_close(f"v_{name} per_splat vs per_pixel", a, e, 1e-4, 1e-4)


def test_per_splat_float32_near_saturation(backend):
    """Many opaque layers: the colour still to come is the pixel's colour minus nearly all
    of it. Started from the float32 render_colors, per_splat's float32 gradients were off by
    ~1e-3 against float64 here; from the forward's more exact colour sum they are as close
    as per_pixel's."""
    # sizes, splat scales s_lo + [0, s_span) px, opacities op_lo + [0, op_span)
    W, H, ts, G, s_lo, s_span, op_lo, op_span, min_alpha = (
        (8, 8, 8, 40, 4, 3, 0.25, 0.3, 0.995) if simulated(backend)
        else (24, 20, 16, 300, 3, 4, 0.45, 0.5, 0.99))
    g = torch.Generator().manual_seed(7)
    f = torch.float64
    means2d = torch.rand(G, 2, generator=g, dtype=f) * torch.tensor([W, H], dtype=f)
    s = torch.rand(G, generator=g, dtype=f) * s_span + s_lo
    conics = torch.stack([1 / s**2, torch.zeros(G, dtype=f), 1 / s**2], -1)
    colors = torch.rand(G, 3, generator=g, dtype=f)
    op = torch.rand(G, generator=g, dtype=f) * op_span + op_lo
    depths = torch.rand(G, generator=g, dtype=f) + 1
    radii = torch.ceil(3.33 * s)[:, None].expand(G, 2).int()
    TW, TH = tile_grid(W, H, ts)
    _, ids, flat = tilesplat.isect_tiles(means2d[None], radii[None], depths[None], ts, TW, TH,
                                         backend="torch")
    offsets = tilesplat.isect_offset_encode(ids, 1, TW, TH, backend="torch")
    v_colors = torch.randn(1, H, W, 3, generator=g, dtype=f)
    backgrounds = torch.rand(1, 3, generator=g, dtype=f)

    def grads(dtype, scheme, backend):
        leaves = [t.to(dtype).clone().requires_grad_(True) for t in (means2d, conics, colors, op)]
        rc, ra = tilesplat.rasterize_to_pixels(
            *(t[None] for t in leaves), W, H, ts, offsets, flat,
            backgrounds=backgrounds.to(dtype), backward_scheme=scheme, backend=backend)
        assert float(ra.detach().min()) > min_alpha  # saturated: T reaches the stop
        (rc * v_colors.to(dtype)).sum().backward()
        return [t.grad.double() for t in leaves]

    exact = grads(torch.float64, "per_pixel", "torch")
    err = {}
    for scheme in SCHEMES:
        got = grads(torch.float32, scheme, backend)
        # elementwise relative error, for elements above 1e-3 of their tensor's largest
        err[scheme] = max(float(((a - e).abs() / (e.abs() + 1e-3 * e.abs().max())).max())
                          for a, e in zip(got, exact, strict=True))
    assert err["per_splat"] < 5e-5, err
    assert err["per_splat"] < 4 * err["per_pixel"] + 1e-6, err


@pytest.mark.parametrize("scheme", SCHEMES)
def test_deep_tile_lists_match_reference(scheme):
    """Tiles of 700-2,000 intersections at opacities up to 0.3: the CPU forward gathers a list
    GATHER_CHUNK intersections at a time, and here the slices of a tile stop in different
    chunks and some tiles stop long before their list's end (a list's tail is never gathered).
    The CPU backend's own case (the simulator's cost is per GPU thread)."""
    from tilesplat.backends.cpu.rasterize_fwd import GATHER_CHUNK

    backend = "cpu"

    W, H, ts = 40, 20, 16
    m, q, c, o, offsets, flat = _splats((1,), 3000, W, H, ts, seed=1, opacity=0.3)
    masks = torch.ones(offsets.shape, dtype=torch.bool)
    masks[0, 1, 2] = False
    fn = _raster(W, H, ts, offsets, flat, masks, scheme)
    got, want = assert_parity(fn, [m, q, c, o], backend, torch.float32, f"{scheme} deep",
                              outputs=OUTPUTS, inputs=INPUTS[:4])
    last = want.outputs[2][0]
    starts = offsets.reshape(-1).tolist() + [flat.shape[0]]
    spans = []  # per tile: its list's length, and its pixels' first and last stop
    for t in range(len(starts) - 1):
        ty, tx = divmod(t, offsets.shape[-1])
        block = last[ty * ts:(ty + 1) * ts, tx * ts:(tx + 1) * ts] - starts[t]
        spans.append((starts[t + 1] - starts[t], int(block.min()), int(block.max())))
    assert max(n for n, _, _ in spans) > 4 * GATHER_CHUNK
    assert any(hi // GATHER_CHUNK > lo // GATHER_CHUNK + 1 for _, lo, hi in spans)
    assert any(n - hi > GATHER_CHUNK for n, _, hi in spans)
