"""The reference against gsplat 1.5.3's own pure-PyTorch functions (its ``_torch_impl``):
projection, SH and covariance to 1e-5, tile intersection exactly."""

import math

import pytest
import torch
from gsplat.cuda import _torch_impl as gs

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("triu", [False, True])
def test_covariance(dtype, triu):
    _, quats, scales, _, _ = random_gaussians(300, dtype=dtype, seed=1)
    cov, pre = tilesplat.quat_scale_to_covar_preci(quats, scales, triu=triu, backend="torch")
    gcov, gpre = gs._quat_scale_to_covar_preci(quats, scales, triu=triu)
    assert_close("covars", cov, gcov, 1e-5, 1e-5)
    assert_close("precis", pre, gpre, 1e-5, 1e-5)


@pytest.mark.parametrize("camera_model", ["pinhole", "ortho", "fisheye"])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_projection(camera_model, batch):
    n, C, W, H = 500, 3, 97, 61
    means, quats, scales, _, _ = random_gaussians(n, batch=batch, seed=2, spread=3.0)
    view, K = cameras(C, W, H, batch=batch)
    if camera_model == "ortho":
        K[..., 0, 0] = K[..., 1, 1] = 20.0
    radii, m2d, depths, conics, comp = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, W, H, calc_compensations=True,
        camera_model=camera_model, backend="torch")
    covars, _ = gs._quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    g_radii, g_m2d, g_depths, g_conics, g_comp = gs._fully_fused_projection(
        means, covars, view, K, W, H, calc_compensations=True, camera_model=camera_model)
    assert torch.equal(radii, g_radii)
    valid = (radii > 0).all(-1)
    assert valid.sum() > n // 4 and (~valid).sum() > 0, "test both visible and culled"
    assert_close("means2d", m2d[valid], g_m2d[valid], 1e-5, 1e-5)
    assert_close("depths", depths, g_depths, 1e-5, 1e-5)
    assert_close("conics", conics[valid], g_conics[valid], 1e-5, 1e-5)
    assert_close("compensations", comp[valid], g_comp[valid], 1e-5, 1e-5)
    assert (m2d[~valid] == 0).all() and (conics[~valid] == 0).all()


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4])
def test_spherical_harmonics(degree):
    g = torch.Generator().manual_seed(degree)
    dirs = torch.randn(400, 3, generator=g)
    coeffs = torch.randn(400, 25, 3, generator=g)
    ours = tilesplat.spherical_harmonics(degree, dirs, coeffs, backend="torch")
    theirs = gs._spherical_harmonics(degree, dirs, coeffs)
    assert_close("sh", ours, theirs, 1e-5, 1e-5)


@pytest.mark.parametrize("tile_size", [16, 8])
def test_tile_intersection_exact(tile_size):
    n, C, W, H = 400, 2, 83, 45
    means, quats, scales, _, _ = random_gaussians(n, seed=3, spread=2.0)
    view, K = cameras(C, W, H)
    radii, m2d, depths, _, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, W, H, backend="torch")
    tw, th = tile_grid(W, H, tile_size)
    tiles, ids, flat = tilesplat.isect_tiles(m2d, radii, depths, tile_size, tw, th,
                                             backend="torch")
    g_tiles, g_ids, g_flat = gs._isect_tiles(m2d, radii, depths, tile_size, tw, th)
    assert torch.equal(tiles, g_tiles)
    assert torch.equal(ids, g_ids)
    assert torch.equal(flat.long(), g_flat.long())
    offsets = tilesplat.isect_offset_encode(ids, C, tw, th, backend="torch")
    assert torch.equal(offsets, gs._isect_offset_encode(g_ids, C, tw, th))
    assert offsets.shape == (C, th, tw) and ids.numel() > n
    assert math.prod(tiles.shape) == C * n
