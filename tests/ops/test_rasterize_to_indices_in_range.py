"""``rasterize_to_indices_in_range`` + ``accumulate`` (gsplat's two-step rasterization): together
they reproduce ``rasterize_to_pixels`` and its gradients, in one call and in gsplat's
iterative use; ids are checked. Only the torch backend implements them (``backend`` lists
it: a native one joins here)."""

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid

pytestmark = pytest.mark.backends("torch")


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


def test_indices_and_accumulate_reproduce_the_rasterizer(backend):
    width, height, tile_size = 37, 29, 8
    means2d, conics, colors, opac, offsets, flatten_ids = _projected(width, height, tile_size)
    leaves = [t.clone().requires_grad_() for t in (means2d, conics, colors, opac)]
    want_c, want_a = tilesplat.rasterize_to_pixels(
        *leaves[:2], leaves[2], leaves[3], width, height, tile_size, offsets, flatten_ids,
        backend="torch")
    T = torch.ones(2, height, width)
    gs, pix, img = tilesplat.rasterize_to_indices_in_range(
        0, 1e10, T, means2d, conics, opac, width, height, tile_size, offsets, flatten_ids,
        backend=backend)
    assert len(gs) > 500 and (img == 1).any()
    key = img * height * width + pix
    assert bool((key[1:] >= key[:-1]).all())  # ordered by image and pixel
    ours = [t.clone().requires_grad_() for t in (means2d, conics, colors, opac)]
    got_c, got_a = tilesplat.accumulate(ours[0], ours[1], ours[3], ours[2], gs, pix, img,
                                        width, height, backend=backend)
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
            flatten_ids, backend=backend)
        if step == 0:
            assert len(gs) > 0
        c, a = tilesplat.accumulate(means2d, conics, opac, colors, gs, pix, img, width, height,
                                    backend=backend)
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
