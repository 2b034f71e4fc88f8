"""The CPU rasterizer's culling of (pixel slice, Gaussian) pairs and the per_splat backward's
float64 start colour.

The bounds of ``backends/cpu/cull.py`` must contain every pixel centre a Gaussian reaches with
alpha >= 1/255 (else a contribution is silently lost); the rasterizer must then match the
reference on Gaussians at the edges of that analysis: opacities at 1/255, needle-thin conics,
Gaussians much larger than a tile, tile sizes whose slices split rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilesplat
from helpers import assert_close, tile_grid
from tilesplat.backends.cpu.cull import splat_bounds
from tilesplat.constants import ALPHA_SKIP

SCHEMES = ("per_pixel", "per_splat")


def _edge_gaussians(G, W, H, seed, dtype=torch.float32):
    """means2d [G, 2], conics [G, 3], opacities [G] with sizes from 0.3 to 40 px, axis ratios
    up to 1000:1 and opacities clustered around 1/255."""
    g = torch.Generator().manual_seed(seed)
    f = torch.float64
    means2d = torch.rand(G, 2, generator=g, dtype=f) * torch.tensor([W + 8.0, H + 8.0]) - 4
    s1 = 0.3 * torch.exp(torch.rand(G, generator=g, dtype=f) * np.log(130.0))
    ratio = torch.exp(torch.rand(G, generator=g, dtype=f) * np.log(1000.0))
    s2 = (s1 / ratio).clamp_min(0.05)
    th = torch.rand(G, generator=g, dtype=f) * np.pi
    cos, sin = torch.cos(th), torch.sin(th)
    a = cos**2 / s1**2 + sin**2 / s2**2
    b = cos * sin * (1 / s1**2 - 1 / s2**2)
    c = sin**2 / s1**2 + cos**2 / s2**2
    conics = torch.stack([a, b, c], -1)
    op = torch.rand(G, generator=g, dtype=f)
    near = torch.rand(G, generator=g, dtype=f) < 0.3  # 30% at the skip threshold
    op = torch.where(near, ALPHA_SKIP * (0.98 + 0.04 * torch.rand(G, generator=g, dtype=f)), op)
    radii = torch.stack([torch.ceil(3.33 * s1), torch.ceil(3.33 * s1)], -1).int()
    return means2d.to(dtype), conics.to(dtype), op.to(dtype), radii


def _edge_scene(W, H, ts, seed, draw_seed):
    """250 edge Gaussians (:func:`_edge_gaussians`) with random colours and depths, and their
    tile intersections at tile size ``ts``: (means2d, conics, colors, opacities,
    isect_offsets, flatten_ids, the generator of the colours, for further draws)."""
    means2d, conics, op, radii = _edge_gaussians(250, W, H, seed=seed)
    g = torch.Generator().manual_seed(draw_seed)
    colors = torch.rand(250, 3, generator=g)
    depths = torch.rand(250, generator=g) + 1
    TW, TH = tile_grid(W, H, ts)
    _, ids, flat = tilesplat.isect_tiles(means2d[None], radii[None], depths[None], ts, TW, TH,
                                         backend="torch")
    offsets = tilesplat.isect_offset_encode(ids, 1, TW, TH, backend="torch")
    return means2d, conics, colors, op, offsets, flat, g


def test_bounds_contain_every_visible_pixel():
    W, H = 120, 90
    means2d, conics, op, _ = _edge_gaussians(400, W, H, seed=0)
    bounds = splat_bounds(means2d, conics, op)
    ys, xs = np.mgrid[0:H, 0:W].astype(np.float32) + np.float32(0.5)
    m, cn, o = means2d.numpy(), conics.numpy(), op.numpy()
    n_visible = 0
    for i in range(m.shape[0]):
        dx = m[i, 0] - xs
        dy = m[i, 1] - ys
        a, b, c = cn[i]
        s = np.float32(0.5) * (a * dx * dx + c * dy * dy) + b * dx * dy
        alpha = np.minimum(np.float32(0.999), o[i] * np.exp(-s))
        visible = (s >= 0) & (alpha >= np.float32(ALPHA_SKIP))
        n_visible += int(visible.sum())
        x_lo, x_hi, y_lo, y_hi = bounds[i]
        inside = (xs >= x_lo) & (xs <= x_hi) & (ys >= y_lo) & (ys <= y_hi)
        assert not (visible & ~inside).any(), f"Gaussian {i}: visible pixels out of its bounds"
    assert n_visible > 10_000  # the scene is not trivially empty


def test_bounds_of_invisible_and_degenerate_gaussians():
    means2d = torch.tensor([[5.0, 5.0]] * 4)
    conics = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [float("nan")] * 3])
    op = torch.tensor([ALPHA_SKIP * 0.5, 0.5, 0.5, 0.5])
    b = splat_bounds(means2d, conics, op)
    assert b[0, 0] > b[0, 1] and b[0, 2] > b[0, 3]  # can never reach alpha 1/255: empty
    assert b[1, 0] < 5.0 < b[1, 1] and np.isfinite(b[1]).all()
    assert np.isinf(b[2]).all()  # singular conic: never culled
    assert not (b[3, 0] > b[3, 1])  # NaN: never culled either


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("ts", [16, 12])  # 12: slices of 64 pixels split rows
def test_rasterize_edge_gaussians_match_reference(scheme, ts):
    W, H = 53, 41
    means2d, conics, colors, op, offsets, flat, g = _edge_scene(W, H, ts, seed=1, draw_seed=5)
    v_colors = torch.randn(1, H, W, 3, generator=g)
    v_alphas = torch.randn(1, H, W, 1, generator=g)
    got = {}
    for backend in ("torch", "cpu"):
        leaves = [t.clone().requires_grad_(True) for t in (means2d, conics, colors, op)]
        rc, ra = tilesplat.rasterize_to_pixels(
            *(t[None] for t in leaves), W, H, ts, offsets, flat, backward_scheme=scheme,
            backend=backend,
        )
        ((rc * v_colors).sum() + (ra * v_alphas).sum()).backward()
        got[backend] = [rc, ra] + [t.grad for t in leaves]
    names = ("colors", "alphas", "v_means2d", "v_conics", "v_colors", "v_opacities")
    for name, a, e in zip(names, got["cpu"], got["torch"], strict=True):
        assert_close(f"{scheme} ts={ts} {name}", a, e, 1e-4, 1e-4)


@pytest.mark.parametrize("ts", [16, 12])
def test_row_ranges_change_no_bit(ts, monkeypatch):
    """The forward evaluates each Gaussian only on the tile rows its bounds reach: the render,
    last_ids and what it keeps for either backward (hit flags, final T, colour residual) are
    bit for bit those of the forward that evaluates every row (infinite bounds), on Gaussians
    at the edges of the bounds' analysis, an odd image size and slices that split rows."""
    from tilesplat.backends.cpu import rasterize

    W, H = 53, 41
    means2d, conics, colors, op, offsets, flat, g = _edge_scene(W, H, ts, seed=2, draw_seed=6)
    bg = torch.rand(1, 3, generator=g)
    args = (means2d, conics, colors, op, bg, None, W, H, ts, offsets, flat)
    for scheme in ("per_pixel", "per_splat"):
        tight = rasterize.forward(*args, scheme)
        with monkeypatch.context() as m:
            m.setattr(rasterize, "splat_bounds",
                      lambda *a: np.full((means2d.shape[0], 4), np.inf) * [-1, 1, -1, 1])
            every = rasterize.forward(*args, scheme)
        for name, a, e in zip(("colors", "alphas", "last_ids", "saved"), tight, every,
                              strict=True):
            assert torch.equal(a, e), f"{scheme} ts={ts}: {name} differs"
