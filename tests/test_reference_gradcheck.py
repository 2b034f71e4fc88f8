"""float64 gradcheck of every differentiable op of the torch reference (through the public
ops, so the autograd wiring of ops/ is checked too)."""

import pytest
import torch
from torch.autograd import gradcheck

import tilesplat
from helpers import cameras, random_gaussians, tile_grid

D64 = torch.float64


def _req(*ts):
    return [t.detach().clone().requires_grad_(True) for t in ts]


@pytest.mark.parametrize("triu", [False, True])
def test_quat_scale_to_covar_preci(triu):
    _, quats, scales, _, _ = random_gaussians(7, dtype=D64, seed=1)
    q, s = _req(quats, scales)

    def fn(q, s):
        return tilesplat.quat_scale_to_covar_preci(q, s, triu=triu, backend="torch")

    assert gradcheck(fn, (q, s))


@pytest.mark.parametrize("camera_model", ["pinhole", "ortho", "fisheye"])
@pytest.mark.parametrize("use_covars", [False, True])
def test_fully_fused_projection(camera_model, use_covars):
    means, quats, scales, _, _ = random_gaussians(6, dtype=D64, seed=2)
    view, K = cameras(2, 30, 20, dtype=D64)
    if camera_model == "ortho":
        K[:, 0, 0] = K[:, 1, 1] = 10.0
    covars, _ = tilesplat.quat_scale_to_covar_preci(quats, scales, triu=True, backend="torch")
    m, q, s, c, v = _req(means, quats, scales, covars, view)

    def fn(m, q, s, c, v):
        _, m2d, depths, conics, comp = tilesplat.fully_fused_projection(
            m, c if use_covars else None, None if use_covars else q,
            None if use_covars else s, v, K, 30, 20, calc_compensations=True,
            camera_model=camera_model, backend="torch")
        return m2d, depths, conics, comp

    radii = tilesplat.fully_fused_projection(m, None, q, s, v, K, 30, 20, backend="torch",
                                             camera_model=camera_model)[0]
    assert (radii > 0).all(-1).sum() >= 6, "most Gaussians must be visible to test anything"
    assert gradcheck(fn, (m, q, s, c, v))


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_spherical_harmonics(degree):
    g = torch.Generator().manual_seed(degree)
    dirs = torch.randn(5, 3, generator=g, dtype=D64)
    coeffs = torch.randn(5, 25, 3, generator=g, dtype=D64)
    masks = torch.tensor([True, False, True, True, True])
    d, c = _req(dirs, coeffs)
    assert gradcheck(lambda d, c: tilesplat.spherical_harmonics(degree, d, c, masks=masks,
                                                                backend="torch"), (d, c))


@pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
@pytest.mark.parametrize("with_bg_mask", [False, True])
def test_rasterize_to_pixels(scheme, with_bg_mask):
    n, C, W, H, ts = 8, 2, 19, 13, 8
    means, quats, scales, opac, colors = random_gaussians(n, dtype=D64, seed=3, scale=0.3)
    view, K = cameras(C, W, H, dtype=D64)
    radii, m2d, depths, conics, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, W, H, backend="torch")
    tw, th = tile_grid(W, H, ts)
    _, ids, flat = tilesplat.isect_tiles(m2d, radii, depths, ts, tw, th, backend="torch")
    offsets = tilesplat.isect_offset_encode(ids, C, tw, th, backend="torch")
    cols = colors[None].expand(C, n, 3)
    op = opac[None].expand(C, n) * 0.9
    bg = torch.tensor([[0.2, 0.5, 0.7], [0.9, 0.1, 0.3]], dtype=D64)
    mask = torch.ones(C, th, tw, dtype=torch.bool)
    mask[1, 0, 1] = False
    m, co, cl, o, b = _req(m2d, conics, cols, op, bg)

    def fn(m, co, cl, o, b):
        return tilesplat.rasterize_to_pixels(
            m, co, cl, o, W, H, ts, offsets, flat, backgrounds=b if with_bg_mask else None,
            masks=mask if with_bg_mask else None, backward_scheme=scheme, backend="torch")

    c, a = fn(m, co, cl, o, b)
    assert (a > 0.3).sum() > 20, "the scene must cover pixels"
    # fast_mode checks random projections vᵀJu: one backward instead of one per output.
    assert gradcheck(fn, (m, co, cl, o, b), atol=1e-5, fast_mode=True)


def test_rasterization_end_to_end():
    n, C, W, H = 6, 1, 17, 11
    means, quats, scales, opac, _ = random_gaussians(n, dtype=D64, seed=4, scale=0.3)
    g = torch.Generator().manual_seed(4)
    sh = torch.randn(n, 4, 3, generator=g, dtype=D64) * 0.3
    view, K = cameras(C, W, H, dtype=D64)
    params = _req(means, quats, scales, opac * 0.9, sh)

    def fn(*p):
        c, a, _ = tilesplat.rasterization(*p, view, K, W, H, sh_degree=1, backend="torch")
        return c, a

    assert gradcheck(fn, params, atol=1e-5, fast_mode=True)
