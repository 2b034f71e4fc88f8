"""The reference rasterizer against the contract written as a per-pixel loop, by hand, and
against itself (packed vs unpacked, batch dims, render modes, channel chunks)."""

import math

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, naive_rasterize, random_gaussians, tile_grid


def _project(n, C, W, H, seed=0, dtype=torch.float64, ts=16, **kw):
    means, quats, scales, opac, colors = random_gaussians(n, dtype=dtype, seed=seed)
    view, K = cameras(C, W, H, dtype=dtype)
    radii, m2d, depths, conics, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, W, H, backend="torch", **kw)
    tw, th = tile_grid(W, H, ts)
    _, isect_ids, flat = tilesplat.isect_tiles(m2d, radii, depths, ts, tw, th, backend="torch")
    offsets = tilesplat.isect_offset_encode(isect_ids, C, tw, th, backend="torch")
    cols = colors[None].expand(C, n, 3).contiguous()
    op = opac[None].expand(C, n).contiguous()
    return m2d, conics, cols, op, offsets, flat


@pytest.mark.parametrize("with_bg", [False, True])
@pytest.mark.parametrize("with_mask", [False, True])
def test_matches_per_pixel_loop(with_bg, with_mask):
    C, W, H, ts = 2, 37, 23, 16
    m2d, conics, cols, op, offsets, flat = _project(40, C, W, H, seed=1)
    g = torch.Generator().manual_seed(3)
    bg = torch.rand(C, 3, generator=g, dtype=torch.float64) if with_bg else None
    mask = None
    if with_mask:
        mask = torch.ones(offsets.shape, dtype=torch.bool)
        mask[0, 0, 1] = False
        mask[1, 1, 0] = False
    c, a, last = tilesplat.rasterize_to_pixels(
        m2d, conics, cols, op, W, H, ts, offsets, flat, backgrounds=bg, masks=mask,
        return_last_ids=True, backend="torch")
    G = C * m2d.shape[1]
    nc, na, nl = naive_rasterize(m2d.reshape(G, 2), conics.reshape(G, 3), cols.reshape(G, 3),
                                 op.reshape(G), W, H, ts, offsets, flat, bg, mask)
    assert_close("colors", c, nc, 1e-10, 1e-10)
    assert_close("alphas", a, na, 1e-10, 1e-10)
    assert torch.equal(last, nl)
    assert (a > 0.5).any() and (last >= 0).any(), "the scene must actually cover pixels"
    if with_mask:
        assert (a[0, :16, 16:32] == 0).all() and (last[0, :16, 16:32] == -1).all()


def test_transmittance_stop_matches_loop():
    # 30 nearly opaque Gaussians on one spot: T falls below 1e-4 after a few.
    C, W, H, ts = 1, 8, 8, 16
    n = 30
    m2d = torch.full((C, n, 2), 4.0, dtype=torch.float64)
    conics = torch.tensor([0.05, 0.0, 0.05], dtype=torch.float64).expand(C, n, 3).contiguous()
    op = torch.full((C, n), 0.95, dtype=torch.float64)
    cols = torch.rand(C, n, 3, dtype=torch.float64)
    offsets = torch.zeros(C, 1, 1, dtype=torch.int32)
    flat = torch.arange(n, dtype=torch.int32)
    c, a, last = tilesplat.rasterize_to_pixels(m2d, conics, cols, op, W, H, ts, offsets, flat,
                                               return_last_ids=True, backend="torch")
    nc, na, nl = naive_rasterize(m2d[0], conics[0], cols[0], op[0], W, H, ts, offsets, flat)
    assert_close("colors", c, nc, 1e-12, 1e-12)
    assert torch.equal(last, nl)
    assert 0 < int(last.max()) < n - 1, "the stop rule must cut the list"


def test_single_gaussian_by_hand():
    # One Gaussian centred on pixel (2, 1)'s centre, conic (a, b, c) = (0.5, 0.1, 0.25).
    m2d = torch.tensor([[2.5, 1.5]], dtype=torch.float64)
    conic = torch.tensor([[0.5, 0.1, 0.25]], dtype=torch.float64)
    color = torch.tensor([[0.2, 0.4, 0.8]], dtype=torch.float64)
    op = torch.tensor([0.6], dtype=torch.float64)
    bg = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)
    offsets = torch.zeros(1, 1, dtype=torch.int32)
    flat = torch.zeros(1, dtype=torch.int32)
    c, a = tilesplat.rasterize_to_pixels(m2d, conic, color, op, 5, 3, 16, offsets, flat,
                                         backgrounds=bg, backend="torch")
    # Pixel (x=2, y=1): d = 0, alpha = 0.6.
    assert a[1, 2, 0].item() == pytest.approx(0.6, abs=1e-15)
    assert c[1, 2].tolist() == pytest.approx([0.6 * 0.2 + 0.4 * 0.1, 0.6 * 0.4 + 0.4 * 0.2,
                                              0.6 * 0.8 + 0.4 * 0.3], abs=1e-15)
    # Pixel (x=4, y=0): dx = -2, dy = 1; sigma = 0.5(0.5·4 + 0.25·1) + 0.1·(-2)(1) = 0.925.
    alpha = 0.6 * math.exp(-0.925)
    assert a[0, 4, 0].item() == pytest.approx(alpha, abs=1e-15)
    assert c[0, 4, 0].item() == pytest.approx(alpha * 0.2 + (1 - alpha) * 0.1, abs=1e-15)


def test_opacity_zero_gives_background():
    m2d, conics, cols, op, offsets, flat = _project(30, 1, 21, 19, seed=2)
    bg = torch.tensor([[0.3, 0.6, 0.9]], dtype=torch.float64)
    c, a = tilesplat.rasterize_to_pixels(m2d, conics, cols, torch.zeros_like(op), 21, 19, 16,
                                         offsets, flat, backgrounds=bg, backend="torch")
    assert (a == 0).all()
    assert torch.equal(c, bg[:, None, None, :].expand_as(c))


@pytest.mark.parametrize("W,H,n", [(1, 1, 5), (7, 5, 0), (7, 5, 6), (40, 3, 0)])
def test_tiny_images_and_zero_gaussians_render_and_backprop(W, H, n):
    means, quats, scales, opac, colors = random_gaussians(n, seed=4, scale=0.5)
    view, K = cameras(2, W, H)
    for t in (means, quats, scales, opac, colors):
        t.requires_grad_(True)
    bg = torch.tensor([[0.5, 0.5, 0.5], [1.0, 0.0, 0.0]])
    c, a, meta = tilesplat.rasterization(means, quats, scales, opac, colors, view, K, W, H,
                                         backgrounds=bg, backend="torch")
    assert c.shape == (2, H, W, 3) and a.shape == (2, H, W, 1)
    if n == 0:
        assert (a == 0).all() and torch.equal(c, bg[:, None, None, :].expand_as(c))
    (c.sum() + a.sum()).backward()
    for t in (means, quats, scales, opac, colors):
        assert t.grad is not None and t.grad.shape == t.shape and torch.isfinite(t.grad).all()


def _render(packed, dtype=torch.float64, batch=(), sh_degree=None, **kw):
    n, C, W, H = 60, 2, 45, 29
    # The same scene in every batch entry, so that entries can be compared.
    scene = random_gaussians(n, dtype=dtype, seed=5)
    view, K = cameras(C, W, H, batch=batch, dtype=dtype)
    if sh_degree is not None:
        g = torch.Generator().manual_seed(12)
        scene[4] = torch.randn(n, (sh_degree + 1) ** 2, 3, generator=g, dtype=dtype) * 0.3
    params = [t.expand(*batch, *t.shape).contiguous() for t in scene]
    means, quats, scales, opac, colors = params
    for t in params:
        t.requires_grad_(True)
    c, a, meta = tilesplat.rasterization(means, quats, scales, opac, colors, view, K, W, H,
                                         packed=packed, sh_degree=sh_degree, backend="torch",
                                         **kw)
    g = torch.Generator().manual_seed(9)
    w_c = torch.rand(c.shape, generator=g, dtype=dtype)
    w_a = torch.rand(a.shape, generator=g, dtype=dtype)
    ((c * w_c).sum() + (a * w_a).sum()).backward()
    return c, a, [p.grad for p in params]


@pytest.mark.parametrize("sh_degree", [None, 3])
def test_packed_equals_unpacked(sh_degree):
    c1, a1, g1 = _render(True, sh_degree=sh_degree)
    c2, a2, g2 = _render(False, sh_degree=sh_degree)
    assert torch.equal(c1, c2) and torch.equal(a1, a2)
    for x, y in zip(g1, g2, strict=True):
        assert_close("grad", x, y, 1e-12, 1e-10)


@pytest.mark.parametrize("batch", [(), (2,), (1, 2)])
def test_batch_dims(batch):
    c, a, grads = _render(True, dtype=torch.float32, batch=batch)
    assert c.shape == (*batch, 2, 29, 45, 3) and a.shape == (*batch, 2, 29, 45, 1)
    c0, a0, _ = _render(True, dtype=torch.float32, batch=())
    flat = c.reshape(-1, 2, 29, 45, 3)
    for b in range(flat.shape[0]):  # every batch entry holds the same scene
        assert_close("batched", flat[b], c0, 1e-6, 1e-6)


def test_render_modes():
    n, C, W, H = 50, 1, 33, 27
    means, quats, scales, opac, colors = random_gaussians(n, dtype=torch.float64, seed=6)
    view, K = cameras(C, W, H, dtype=torch.float64)
    out = {}
    for mode in ("RGB", "D", "ED", "RGB+D", "RGB+ED"):
        out[mode] = tilesplat.rasterization(means, quats, scales, opac, colors, view, K, W, H,
                                            render_mode=mode, backend="torch")
    rgb, alpha, meta = out["RGB"]
    assert out["D"][0].shape == (C, H, W, 1)
    assert_close("RGB+D rgb", out["RGB+D"][0][..., :3], rgb, 1e-12, 1e-12)
    assert_close("RGB+D depth", out["RGB+D"][0][..., 3:], out["D"][0], 1e-12, 1e-12)
    ed = out["D"][0] / alpha.clamp(min=1e-10)
    assert_close("ED", out["ED"][0], ed, 1e-12, 1e-12)
    assert_close("RGB+ED", out["RGB+ED"][0][..., 3:], ed, 1e-12, 1e-12)
    covered = alpha[..., 0] > 0.5
    depth = out["ED"][0][..., 0][covered]
    assert (depth > 3.0).all() and (depth < 5.0).all()  # the scene lies 3..5 from the camera


def test_channel_chunk():
    n, C, W, H = 40, 1, 30, 20
    means, quats, scales, opac, _ = random_gaussians(n, dtype=torch.float64, seed=7)
    feats = torch.rand(n, 40, dtype=torch.float64)
    view, K = cameras(C, W, H, dtype=torch.float64)
    a = tilesplat.rasterization(means, quats, scales, opac, feats, view, K, W, H,
                                channel_chunk=16, backend="torch")[0]
    b = tilesplat.rasterization(means, quats, scales, opac, feats, view, K, W, H,
                                channel_chunk=64, backend="torch")[0]
    assert a.shape == (C, H, W, 40)
    assert_close("chunked", a, b, 1e-12, 1e-12)


def test_antialiased_scales_opacity_by_compensation():
    n, C, W, H = 40, 1, 30, 20
    means, quats, scales, opac, colors = random_gaussians(n, dtype=torch.float64, seed=8,
                                                          scale=0.02)
    view, K = cameras(C, W, H, dtype=torch.float64)
    _, _, meta = tilesplat.rasterization(means, quats, scales, opac, colors, view, K, W, H,
                                         rasterize_mode="antialiased", packed=False,
                                         backend="torch")
    _, _, _, _, comp = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, W, H, calc_compensations=True, backend="torch")
    visible = (meta["radii"] > 0).all(-1)
    assert_close("opacities", meta["opacities"][visible], (opac[None] * comp)[visible],
                 1e-12, 1e-12)
    assert (comp[visible] < 1).all() and (comp[visible] > 0).all()


def test_absgrad_is_sum_of_per_pixel_abs_gradients():
    C, W, H, ts = 1, 7, 6, 16
    m2d, conics, cols, op, offsets, flat = _project(5, C, W, H, seed=10)
    m2d = m2d.detach().requires_grad_(True)
    w = torch.randn(C, H, W, 3, dtype=torch.float64)
    c, _ = tilesplat.rasterize_to_pixels(m2d, conics, cols, op, W, H, ts, offsets, flat,
                                         absgrad=True, backend="torch")
    (c * w).sum().backward()
    expected = torch.zeros_like(m2d)
    for y in range(H):
        for x in range(W):
            m = m2d.detach().requires_grad_(True)
            cp, _ = tilesplat.rasterize_to_pixels(m, conics, cols, op, W, H, ts, offsets, flat,
                                                  backend="torch")
            (g,) = torch.autograd.grad((cp[:, y, x] * w[:, y, x]).sum(), m)
            expected += g.abs()
    assert m2d.absgrad.shape == m2d.shape
    assert (m2d.absgrad > 0).sum() >= 4, "some Gaussians must touch the pixels"
    assert (m2d.absgrad > m2d.grad.abs() + 1e-6).any(), "signs must cancel somewhere"
    assert_close("absgrad", m2d.absgrad, expected, 1e-12, 1e-10)
    assert (m2d.absgrad >= m2d.grad.abs() - 1e-12).all()


@pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
def test_schemes_give_the_reference_gradient(scheme):
    m2d, conics, cols, op, offsets, flat = _project(30, 1, 25, 17, seed=11)
    ins = [t.detach().requires_grad_(True) for t in (m2d, conics, cols, op)]
    c, a = tilesplat.rasterize_to_pixels(*ins, 25, 17, 16, offsets, flat,
                                         backward_scheme=scheme, backend="torch")
    (c.sum() + a.sum()).backward()
    ref = [t.detach().requires_grad_(True) for t in (m2d, conics, cols, op)]
    c, a = tilesplat.rasterize_to_pixels(*ref, 25, 17, 16, offsets, flat, backend="torch")
    (c.sum() + a.sum()).backward()
    for x, y in zip(ins, ref, strict=True):
        assert torch.equal(x.grad, y.grad)
