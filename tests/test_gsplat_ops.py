"""The cheap gsplat 1.5.3 names with real implementations: world_to_cam, proj (against gsplat's
own torch functions), rasterize_to_indices_in_range + accumulate (against the rasterizer),
SelectiveAdam (gsplat's step rule) and export_splats (against gsplat's exporter)."""

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid

impl = pytest.importorskip("gsplat.cuda._torch_impl")


@pytest.mark.parametrize("batch", [(), (2,)])
@pytest.mark.parametrize("camera_model", ["pinhole", "ortho", "fisheye"])
def test_world_to_cam_and_proj_match_gsplat(batch, camera_model):
    means, quats, scales, _, _ = random_gaussians(30, batch, dtype=torch.float64, seed=3)
    covars, _ = tilesplat.quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    viewmats, Ks = cameras(3, 40, 30, batch, dtype=torch.float64)
    means = means.requires_grad_()
    means_c, covars_c = tilesplat.world_to_cam(means, covars, viewmats)
    want_m, want_c = impl._world_to_cam(means, covars, viewmats)
    assert_close("means_c", means_c, want_m, 1e-12, 1e-12)
    assert_close("covars_c", covars_c, want_c, 1e-12, 1e-12)

    ref = {"pinhole": impl._persp_proj, "ortho": impl._ortho_proj,
           "fisheye": impl._fisheye_proj}[camera_model]
    m2d, c2d = tilesplat.proj(means_c, covars_c, Ks, 40, 30, camera_model=camera_model)
    want_m2d, want_c2d = ref(means_c, covars_c, Ks, 40, 30)
    assert_close("means2d", m2d, want_m2d, 1e-9, 1e-9)
    assert_close("covars2d", c2d, want_c2d, 1e-9, 1e-9)
    g = torch.randn_like(m2d)
    (v_ours,) = torch.autograd.grad((m2d * g).sum() + c2d.sum(), means, retain_graph=True)
    (v_want,) = torch.autograd.grad((want_m2d * g).sum() + want_c2d.sum(), means)
    assert_close("v_means", v_ours, v_want, 1e-9, 1e-9)


def test_proj_and_world_to_cam_validate():
    with pytest.raises(ValueError, match="covars"):
        tilesplat.world_to_cam(torch.zeros(4, 3), torch.zeros(4, 3), torch.eye(4)[None])
    with pytest.raises(ValueError, match="camera_model"):
        tilesplat.proj(torch.ones(1, 2, 3), torch.zeros(1, 2, 3, 3), torch.eye(3)[None], 4, 4,
                       camera_model="equirect")


def _projected(width=37, height=29, tile_size=8, n=60, C=2):
    means, quats, scales, opac, colors = random_gaussians(n, seed=5, scale=0.3)
    viewmats, Ks = cameras(C, width, height)
    radii, means2d, depths, conics, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, width, height, backend="torch")
    tw, th = tile_grid(width, height, tile_size)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(
        means2d, radii, depths, tile_size, tw, th, backend="torch")
    offsets = tilesplat.isect_offset_encode(isect_ids, C, tw, th, backend="torch")
    colors = colors[None].expand(C, n, 3).contiguous()
    opac = opac[None].expand(C, n).contiguous()
    return means2d.detach(), conics.detach(), colors, opac, offsets, flatten_ids


def test_indices_and_accumulate_reproduce_the_rasterizer():
    width, height, tile_size = 37, 29, 8
    means2d, conics, colors, opac, offsets, flatten_ids = _projected(width, height, tile_size)
    leaves = [t.clone().requires_grad_() for t in (means2d, conics, colors, opac)]
    want_c, want_a = tilesplat.rasterize_to_pixels(
        *leaves[:2], leaves[2], leaves[3], width, height, tile_size, offsets, flatten_ids,
        backend="torch")
    T = torch.ones(2, height, width)
    gs, pix, img = tilesplat.rasterize_to_indices_in_range(
        0, 1e10, T, means2d, conics, opac, width, height, tile_size, offsets, flatten_ids)
    assert len(gs) > 500 and (img == 1).any()
    key = img * height * width + pix
    assert bool((key[1:] >= key[:-1]).all())  # ordered by image and pixel
    ours = [t.clone().requires_grad_() for t in (means2d, conics, colors, opac)]
    got_c, got_a = tilesplat.accumulate(ours[0], ours[1], ours[3], ours[2], gs, pix, img,
                                        width, height)
    assert_close("colors", got_c, want_c, 1e-5, 1e-5)
    assert_close("alphas", got_a, want_a, 1e-5, 1e-5)
    g_c, g_a = torch.randn_like(got_c), torch.randn_like(got_a)
    want_g = torch.autograd.grad((want_c * g_c).sum() + (want_a * g_a).sum(), leaves)
    got_g = torch.autograd.grad((got_c * g_c).sum() + (got_a * g_a).sum(), ours)
    for name, a, b in zip(("means2d", "conics", "colors", "opacities"), got_g, want_g,
                          strict=True):
        assert_close(f"v_{name}", a, b, 1e-4, 1e-4)

    # gsplat's iterative use: one batch of tile_size² Gaussians at a time, onto the
    # transmittance left by the batches before
    render_c, render_a = torch.zeros_like(want_c), torch.zeros_like(want_a)
    for step in range(20):
        T = 1.0 - render_a[..., 0]
        gs, pix, img = tilesplat.rasterize_to_indices_in_range(
            step, step + 1, T, means2d, conics, opac, width, height, tile_size, offsets,
            flatten_ids)
        if step == 0:
            assert len(gs) > 0
        c, a = tilesplat.accumulate(means2d, conics, opac, colors, gs, pix, img, width, height)
        render_c = render_c + c * T[..., None]
        render_a = render_a + a * T[..., None]
    assert_close("iterative colors", render_c, want_c.detach(), 1e-5, 1e-5)


def test_accumulate_validates_ids():
    m, c, col, o, _, _ = _projected()
    ids = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="pixel_ids"):
        tilesplat.accumulate(m, c, o, col, ids, torch.tensor([0, 10**6]), ids, 37, 29)
    with pytest.raises(TypeError, match="gaussian_ids"):
        tilesplat.accumulate(m, c, o, col, ids.float(), ids, ids, 37, 29)


def test_selective_adam_updates_only_visible_rows():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(5, 3))
    opt = tilesplat.SelectiveAdam([{"params": [p], "lr": 0.1}], eps=1e-8, betas=(0.9, 0.99))
    m, v, ref = torch.zeros(5, 3), torch.zeros(5, 3), p.detach().clone()
    visible = torch.tensor([True, False, True, True, False])
    for _ in range(3):
        p.grad = torch.randn(5, 3)
        g = p.grad.clone()
        opt.step(visibility=visible)
        m_new, v_new = 0.9 * m + 0.1 * g, 0.99 * v + 0.01 * g * g
        upd = 0.1 * m_new / (v_new.sqrt() + 1e-8)  # gsplat's kernel: no bias correction
        rows = visible[:, None]
        m, v = torch.where(rows, m_new, m), torch.where(rows, v_new, v)
        ref = torch.where(rows, ref - upd, ref)
        assert_close("param", p.detach(), ref, 1e-6, 1e-6)
    st = opt.state[p]
    assert_close("exp_avg", st["exp_avg"], m, 1e-7, 1e-6)
    assert not st["exp_avg_sq"][~visible].any()
    with pytest.raises(ValueError, match="first dimension"):
        opt.step(visibility=torch.ones(4, dtype=torch.bool))


def _splats(n=700, k=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return dict(
        means=torch.randn(n, 3, generator=g) * 3,
        scales=torch.randn(n, 3, generator=g) - 2,
        quats=torch.randn(n, 4, generator=g),
        opacities=torch.randn(n, generator=g) * 3,
        sh0=torch.randn(n, 1, 3, generator=g),
        shN=torch.randn(n, k - 1, 3, generator=g) * 0.3,
    )


def test_export_splats_formats(tmp_path):
    from gsplat import exporter as theirs

    from tilesplat.io.ply import load_ply
    from tilesplat.io.splat import load_splat

    s = _splats()
    assert tilesplat.export_splats(**s, format="ply_compressed") == theirs.export_splats(
        **s, format="ply_compressed")

    data = tilesplat.export_splats(**s, format="ply", save_to=str(tmp_path / "a.ply"))
    assert (tmp_path / "a.ply").read_bytes() == data
    (tmp_path / "gsplat.ply").write_bytes(theirs.export_splats(**s, format="ply"))
    ours, want = load_ply(tmp_path / "a.ply"), load_ply(tmp_path / "gsplat.ply")
    for key in want:
        assert torch.equal(ours[key], want[key]), key
    assert torch.equal(ours["sh"][:, 1:], s["shN"])

    (tmp_path / "b.splat").write_bytes(tilesplat.export_splats(**s, format="splat"))
    got = load_splat(tmp_path / "b.splat")
    assert len(got["means"]) == 700
    order = torch.argsort(got["means"][:, 0])
    assert_close("splat means", got["means"][order],
                 s["means"][torch.argsort(s["means"][:, 0])], 1e-6, 1e-6)


def test_export_splats_drops_non_finite_and_checks_shapes():
    s = _splats(n=10, k=1)
    s["means"][3, 1] = float("nan")
    s["opacities"][5] = float("inf")
    assert len(tilesplat.export_splats(**s, format="splat")) == 8 * 32
    with pytest.raises(ValueError, match="sh0"):
        tilesplat.export_splats(**{**s, "sh0": s["sh0"][:, 0]})
    with pytest.raises(ValueError, match="format"):
        tilesplat.export_splats(**s, format="spz")
