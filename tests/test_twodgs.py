"""2DGS torch reference: projection against gsplat's ``_torch_impl_2dgs``, the rasterizer
against a pixel-by-pixel loop of gsplat's kernel rules, float64 gradcheck, bad input, and
``rasterization_2dgs`` end to end (with densification by ``gradient_2dgs``)."""

import math

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid

W, H, TILE = 13, 11, 4


@pytest.fixture(autouse=True)
def _reference_backend():
    with tilesplat.use_backend("torch"):
        yield


def _surfels(n=12, batch=(), dtype=torch.float64, seed=1):
    means, quats, scales, opac, colors = random_gaussians(n, batch, dtype=dtype, seed=seed,
                                                          scale=0.4)
    return means, quats, scales, opac, colors


@pytest.mark.parametrize("batch", [(), (2,)])
def test_projection_matches_gsplat_torch_impl(batch):
    impl = pytest.importorskip("gsplat.cuda._torch_impl_2dgs")
    means, quats, scales, _, _ = _surfels(40, batch, seed=2)
    scales[..., 2] = 1.0  # gsplat's torch normals are scaled by it, its CUDA ones are not
    view, K = cameras(3, 40, 30, batch, dtype=torch.float64)
    r, m, d, M, n = tilesplat.fully_fused_projection_2dgs(means, quats, scales, view, K, 40, 30)
    R, m_ref, d_ref, M_ref, n_ref = impl._fully_fused_projection_2dgs(
        means, quats, scales, view, K, 40, 30)
    assert torch.equal(r, R)
    vis = (r > 0).all(-1)
    assert vis.sum() > 20
    for name, a, b in (("means2d", m, m_ref), ("depths", d, d_ref), ("ray_transforms", M, M_ref),
                       ("normals", n, n_ref)):
        assert_close(name, a[vis], b[vis], 1e-10, 1e-10)
    packed = tilesplat.fully_fused_projection_2dgs(means, quats, scales, view, K, 40, 30,
                                                   packed=True)
    idx = vis.nonzero(as_tuple=True)
    assert torch.equal(packed[4], m[idx]) and torch.equal(packed[6], M[idx])


def _setup(n=12, seed=1, dtype=torch.float64):
    means, quats, scales, opac, colors = _surfels(n, seed=seed, dtype=dtype)
    view, K = cameras(2, W, H, dtype=dtype, distance=3.0)
    radii, m2d, depths, M, normals = tilesplat.fully_fused_projection_2dgs(
        means, quats, scales, view, K, W, H)
    tw, th = tile_grid(W, H, TILE)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, TILE, tw, th)
    offsets = tilesplat.isect_offset_encode(isect_ids, 2, tw, th)
    colors = torch.cat([colors[None].expand(2, n, 3), depths[..., None]], -1)  # RGB+D
    opac = opac[None].expand(2, n).contiguous()
    return m2d, M, colors.contiguous(), opac, normals, offsets, flatten_ids


def _loop(m2d, M, colors, opac, normals, offsets, flatten_ids):
    """gsplat's 2DGS forward kernel, one pixel at a time."""
    I, N, D = colors.shape
    out = {k: torch.zeros(I, H, W, c, dtype=colors.dtype)
           for k, c in (("c", D), ("a", 1), ("n", 3), ("d", 1), ("m", 1))}
    flat_off = offsets.reshape(-1).tolist() + [len(flatten_ids)]
    tw = offsets.shape[-1]
    for i in range(I):
        for y in range(H):
            for x in range(W):
                tile = i * offsets.shape[1] * tw + (y // TILE) * tw + x // TILE
                px, py = x + 0.5, y + 0.5
                T, dist, acc_wd, med = 1.0, 0.0, 0.0, 0.0
                for g in flatten_ids[flat_off[tile]:flat_off[tile + 1]].tolist():
                    Mg = M.reshape(-1, 3, 3)[g]
                    h_u, h_v = px * Mg[2] - Mg[0], py * Mg[2] - Mg[1]
                    cr = torch.linalg.cross(h_u, h_v)
                    if cr[2] == 0:
                        continue
                    s2 = float((cr[0] / cr[2]) ** 2 + (cr[1] / cr[2]) ** 2)
                    dd = m2d.reshape(-1, 2)[g] - torch.tensor([px, py], dtype=m2d.dtype)
                    sigma = 0.5 * min(s2, 2.0 * float((dd * dd).sum()))
                    alpha = min(0.999, float(opac.reshape(-1)[g]) * math.exp(-sigma))
                    if sigma < 0 or alpha < 1 / 255:
                        continue
                    if T * (1 - alpha) <= 1e-4:
                        break
                    w, c = alpha * T, colors.reshape(-1, D)[g]
                    out["c"][i, y, x] += w * c
                    out["n"][i, y, x] += w * normals.reshape(-1, 3)[g]
                    depth = float(c[-1])
                    dist += 2 * (w * depth * (1 - T) - w * acc_wd)
                    acc_wd += w * depth
                    if T > 0.5:
                        med = depth
                    T *= 1 - alpha
                out["a"][i, y, x] = 1 - T
                out["d"][i, y, x] = dist
                out["m"][i, y, x] = med
    return out["c"], out["a"], out["n"], out["d"], out["m"]


def test_rasterizer_follows_the_kernel_rules():
    m2d, M, colors, opac, normals, offsets, flatten_ids = _setup()
    densify = torch.zeros_like(m2d)
    got = tilesplat.rasterize_to_pixels_2dgs(m2d, M, colors, opac, normals, densify, W, H,
                                             TILE, offsets, flatten_ids)
    want = _loop(m2d, M, colors, opac, normals, offsets, flatten_ids)
    assert float(want[1].max()) > 0.5  # the scene covers pixels
    for name, a, b in zip(("colors", "alphas", "normals", "distort", "median"), got, want,
                          strict=True):
        assert_close(name, a, b, 1e-10, 1e-10)


def test_rasterizer_gradcheck_float64():
    m2d, M, colors, opac, normals, offsets, flatten_ids = _setup(n=6, seed=4)
    densify = torch.zeros_like(m2d)
    leaves = [t.clone().requires_grad_() for t in (m2d, M, colors, opac, normals, densify)]

    def fn(m, rays, c, o, n, dens):
        outs = tilesplat.rasterize_to_pixels_2dgs(m, rays, c, o, n, dens, W, H, TILE,
                                                  offsets, flatten_ids)
        return tuple(x for x in outs)

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_projection_gradcheck_float64():
    means, quats, scales, _, _ = _surfels(8, seed=3)
    view, K = cameras(2, W, H, dtype=torch.float64, distance=3.0)

    def fn(m, q, s):
        _, m2d, d, rays, n = tilesplat.fully_fused_projection_2dgs(m, q, s, view, K, W, H)
        return m2d, d, rays, n

    leaves = [t.clone().requires_grad_() for t in (means, quats, scales)]
    assert torch.autograd.gradcheck(fn, leaves, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_bad_input_is_named():
    m2d, M, colors, opac, normals, offsets, flatten_ids = _setup(dtype=torch.float32)
    densify = torch.zeros_like(m2d)
    with pytest.raises(ValueError, match="ray_transforms"):
        tilesplat.rasterize_to_pixels_2dgs(m2d, M[..., :2], colors, opac, normals, densify, W,
                                           H, TILE, offsets, flatten_ids)
    with pytest.raises(ValueError, match="flatten_ids"):
        tilesplat.rasterize_to_pixels_2dgs(m2d, M, colors, opac, normals, densify, W, H, TILE,
                                           offsets, flatten_ids + 1000)
    with pytest.raises(ValueError, match="absgrad"):
        tilesplat.rasterize_to_pixels_2dgs(m2d, M, colors, opac, normals, densify, W, H, TILE,
                                           offsets, flatten_ids, absgrad=True)
    means, quats, scales, _, _ = _surfels(dtype=torch.float32)
    view, K = cameras(2, W, H)
    with pytest.raises(ValueError, match="quats"):
        tilesplat.fully_fused_projection_2dgs(means, quats[:, :3], scales, view, K, W, H)
    with pytest.raises(ValueError, match="distloss"):
        tilesplat.rasterization_2dgs(means, quats, scales, torch.ones(12), torch.ones(12, 3),
                                     view, K, W, H, distloss=True)


@pytest.mark.parametrize("packed", [False, True])
def test_rasterization_2dgs_end_to_end(packed):
    means, quats, scales, opac, colors = _surfels(30, dtype=torch.float32, seed=5)
    params = {k: torch.nn.Parameter(v) for k, v in
              (("means", means), ("quats", quats), ("scales", scales.log()),
               ("opacities", torch.logit(opac)))}
    view, K = cameras(2, 24, 20, distance=3.0)
    out = tilesplat.rasterization_2dgs(
        params["means"], params["quats"], params["scales"].exp(),
        torch.sigmoid(params["opacities"]), colors, view, K, 24, 20, packed=packed,
        render_mode="RGB+ED", distloss=True, backgrounds=torch.ones(2, 3), absgrad=packed)
    colors_out, alphas, normals, normals_depth, distort, median, meta = out
    assert colors_out.shape == (2, 20, 24, 4) and normals.shape == (2, 20, 24, 3)
    assert normals_depth.shape == (2, 20, 24, 3) and distort.shape == (2, 20, 24, 1)
    assert alphas.max().item() > 0.5 and median.max().item() > 2.0
    strategy = tilesplat.DefaultStrategy(key_for_gradient="gradient_2dgs", refine_start_iter=0,
                                         refine_every=1, grow_grad2d=0.0, absgrad=packed)
    opts = {k: torch.optim.Adam([p], lr=1e-3) for k, p in params.items()}
    state = strategy.initialize_state()
    strategy.step_pre_backward(params, opts, state, 1, meta)
    loss = colors_out[..., :3].mean() + distort.mean() + (1 - normals.sum(-1)).abs().mean()
    loss.backward()
    assert meta["gradient_2dgs"].grad.abs().sum() > 0
    strategy.step_post_backward(params, opts, state, 1, meta, packed=packed)
    assert len(params["means"]) > 30  # grew by the 2DGS screen-space gradient


def test_indices_and_accumulate_2dgs_reproduce_the_rasterizer():
    m2d, M, colors, opac, normals, offsets, flatten_ids = _setup(n=20, seed=6)
    densify = torch.zeros_like(m2d)
    leaves = [t.clone().requires_grad_() for t in (m2d, M, colors, opac, normals)]
    want = tilesplat.rasterize_to_pixels_2dgs(*leaves[:4], leaves[4], densify, W, H, TILE,
                                              offsets, flatten_ids)
    gs, pix, img = tilesplat.rasterize_to_indices_in_range_2dgs(
        0, 1e10, torch.ones(2, H, W, dtype=m2d.dtype), m2d, M, opac, W, H, TILE, offsets,
        flatten_ids)
    assert len(gs) > 100
    ours = [t.clone().requires_grad_() for t in (m2d, M, colors, opac, normals)]
    got = tilesplat.accumulate_2dgs(ours[0], ours[1], ours[3], ours[2], ours[4], gs, pix, img,
                                    W, H)
    for name, a, b in zip(("colors", "alphas", "normals"), got, want[:3], strict=True):
        assert_close(name, a, b, 1e-10, 1e-10)
    ups = [torch.randn_like(t) for t in got]
    g_want = torch.autograd.grad(sum((u * t).sum() for u, t in zip(ups, want[:3], strict=True)),
                                 leaves)
    g_got = torch.autograd.grad(sum((u * t).sum() for u, t in zip(ups, got, strict=True)), ours)
    for name, a, b in zip(("means2d", "ray_transforms", "colors", "opacities", "normals"),
                          g_got, g_want, strict=True):
        assert_close(f"v_{name}", a, b, 1e-9, 1e-9)


def test_absgrad_sums_absolute_per_pixel_gradients():
    m2d, M, colors, opac, normals, offsets, flatten_ids = _setup(n=10, seed=7)
    up = torch.randn(2, H, W, colors.shape[-1], dtype=colors.dtype)
    densify = torch.zeros_like(m2d, requires_grad=True)
    out = tilesplat.rasterize_to_pixels_2dgs(m2d, M, colors, opac, normals, densify, W, H,
                                             TILE, offsets, flatten_ids, absgrad=True)
    (out[0] * up).sum().backward()
    want = torch.zeros_like(m2d)
    for i in range(2):
        for y in range(H):
            for x in range(W):
                d = torch.zeros_like(m2d, requires_grad=True)
                c = tilesplat.rasterize_to_pixels_2dgs(m2d, M, colors, opac, normals, d, W, H,
                                                       TILE, offsets, flatten_ids)[0]
                (g,) = torch.autograd.grad((c[i, y, x] * up[i, y, x]).sum(), d)
                want += g.abs()
    assert want.abs().sum() > 0
    assert_close("absgrad", densify.absgrad, want, 1e-10, 1e-10)
    assert (densify.absgrad >= densify.grad.abs() - 1e-12).all()
