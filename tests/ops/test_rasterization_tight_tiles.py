"""The rasterizer cannot tell the tight tile lists (issue 37) from gsplat's box lists.

Every output and gradient of ``rasterize_to_pixels`` on the lists of ``isect_tiles_tight``
against the same call on the lists of ``isect_tiles``: the colours, alphas and the gradients
of means2d, conics, colours, opacities and backgrounds, and absgrad; masks, backgrounds,
odd image sizes, batch dims, both backward schemes, scenes with needles and opacities
around 1/255, and scenes built so that many pairs sit on the alpha threshold. Then
``rasterization()`` end to end (its default lists against ``box_tile_lists()``): packed and
unpacked, batch dims, antialiased mode (the compensation in the opacity the bound reads),
both schemes, zero Gaussians. ``last_ids`` index different lists, so they are compared
through ``flatten_ids``: the same Gaussian must be the last one of every pixel.

On ``cpu`` all of it is bitwise equal (the backend sums in a fixed order and a dropped pair
added nothing); on ``torch`` and ``cuda`` (sums in another order over other lists) within
the parity tolerances.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians, tile_grid
from tilesplat.ops import isect_tiles_tight
from tilesplat.rendering._pipeline import box_tile_lists

from .parity import SCHEMES, simulated, tolerances
from .test_isect_tiles_tight import on_the_threshold, projected

pytestmark = pytest.mark.backends("torch", "cpu", "cuda")


def same(what: str, got: torch.Tensor, want: torch.Tensor, backend: str, tol: float) -> None:
    """Bitwise on cpu; within ``tol`` (abs and rel) elsewhere."""
    if backend == "cpu":
        assert got.dtype == want.dtype and got.shape == want.shape, what
        differ = got != want
        assert not bool(differ.any()), (
            f"{what}: {int(differ.sum())} of {differ.numel()} elements differ (max "
            f"{float((got.double() - want.double()).abs().max()):.3g})")
    else:
        assert_close(what, got, want, tol, tol)


def same_last(last_a, flat_a, last_b, flat_b) -> None:
    """The last contributing Gaussian of every pixel is the same (-1: none)."""
    def gaussian(last, flat):  # index -1 reads the appended -1
        return torch.cat([flat.long(), torch.tensor([-1])])[last.long()]

    assert torch.equal(gaussian(last_a, flat_a), gaussian(last_b, flat_b))


def offsets_of(ids, images, TW, TH, backend):
    off = tilesplat.isect_offset_encode(ids, math.prod(images), TW, TH, backend=backend)
    return off.reshape(*images, TH, TW)


def raster_both(backend, scene, images, W, H, ts, scheme, masks=None, backgrounds=None,
                dtype=torch.float32):
    """rasterize_to_pixels on the box lists and on the tight ones: per list kind, (outputs
    [colours, alphas, last_ids], flatten_ids, gradients [means2d, conics, colours,
    opacities, backgrounds?], absgrad), and the two lists' lengths."""
    means2d, radii, depths, conics, opacities, colors = (
        t.to(dtype) if t.is_floating_point() else t for t in scene)
    TW, TH = tile_grid(W, H, ts)
    g = torch.Generator().manual_seed(4)
    v_colors = torch.randn((*images, H, W, colors.shape[-1]), generator=g).to(dtype)
    v_alphas = torch.randn((*images, H, W, 1), generator=g).to(dtype)
    out = {}
    for kind in ("box", "tight"):
        if kind == "box":
            _, ids, flat = tilesplat.isect_tiles(means2d, radii, depths, ts, TW, TH,
                                                 backend=backend)
        else:
            _, ids, flat = isect_tiles_tight(means2d, radii, depths, conics, opacities, ts,
                                             TW, TH, W, H, backend=backend)
        leaves = [t.detach().clone().requires_grad_(True)
                  for t in (means2d, conics, colors, opacities)]
        bg = None if backgrounds is None else backgrounds.to(dtype).clone().requires_grad_(True)
        rc, ra, last = tilesplat.rasterize_to_pixels(
            *leaves, W, H, ts, offsets_of(ids, images, TW, TH, backend), flat,
            backgrounds=bg, masks=masks, absgrad=True, backward_scheme=scheme,
            return_last_ids=True, backend=backend)
        ((rc * v_colors).sum() + (ra * v_alphas).sum()).backward()
        grads = [t.grad for t in leaves] + ([] if bg is None else [bg.grad])
        out[kind] = ([rc.detach(), ra.detach(), last], flat, grads, leaves[0].absgrad,
                     ids.numel())
    return out


def check_raster(backend, out, dtype=torch.float32):
    fwd, grad = tolerances(backend, dtype)
    (box_o, box_f, box_g, box_abs, n_box), (t_o, t_f, t_g, t_abs, n_tight) = (
        out["box"], out["tight"])
    assert n_tight < n_box, "the scene should drop some pairs"
    for name, a, e in zip(("colors", "alphas"), t_o, box_o, strict=False):
        same(name, a, e, backend, fwd)
    same_last(t_o[2], t_f, box_o[2], box_f)
    names = ("v_means2d", "v_conics", "v_colors", "v_opacities", "v_backgrounds")
    for name, a, e in zip(names, t_g, box_g, strict=False):
        same(name, a, e, backend, grad)
    same("absgrad", t_abs, box_abs, backend, grad)
    assert int((box_o[2] >= 0).sum()) > box_o[2].numel() // 4, "the scene should cover pixels"


def scene_with_colors(images, n, W, H, seed, D=3):
    means2d, radii, depths, conics, opacities = projected(images, n, W, H, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    colors = torch.rand((*images, n, D), generator=g)
    return means2d, radii, depths.abs() + 0.1, conics, opacities, colors


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rasterizer_sees_the_same(backend, batch, scheme):
    """Random projected Gaussians (needles, opacities around 1/255, culled ones), an odd
    image size, two masked-out tiles, backgrounds, absgrad."""
    # cuda-sim: four tiles, of which the right and bottom ones partial (its time is per block)
    W, H, ts, C, n = (7, 6, 4, 1, 10) if simulated(backend) else (45, 29, 8, 2, 150)
    images = (*batch, C)
    dtypes = ((torch.float32,) if simulated(backend) and batch
              else (torch.float32, torch.float64))
    for dtype in dtypes:
        scene = scene_with_colors(images, n, W, H, seed=5)
        TW, TH = tile_grid(W, H, ts)
        masks = torch.ones((*images, TH, TW), dtype=torch.bool)
        flat_masks = masks.view(-1, TH, TW)
        flat_masks[0, 0, -1] = False
        flat_masks[-1, -1, 0] = False
        bg = torch.rand((*images, 3), generator=torch.Generator().manual_seed(3))
        out = raster_both(backend, scene, images, W, H, ts, scheme, masks, bg, dtype)
        check_raster(backend, out, dtype)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rasterizer_sees_the_same_on_the_threshold(backend, scheme):
    """Gaussians whose alpha is within 1e-8 .. 1e-2 of 1/255 at the nearest pixel of a tile,
    needles among them: the pairs the margins decide."""
    W, H, ts, n = (8, 8, 4, 12) if simulated(backend) else (97, 73, 16, 300)
    means2d, radii, conics, opacities = on_the_threshold(n, W, H, ts, seed=3)
    g = torch.Generator().manual_seed(6)
    depths = torch.rand(n, generator=g) + 1
    colors = torch.rand(n, 3, generator=g)
    scene = [t[None] for t in (means2d, radii, depths, conics, opacities, colors)]
    out = raster_both(backend, scene, (1,), W, H, ts, scheme)
    check_raster(backend, out)


# ---- rasterization() -------------------------------------------------------------------

def render(backend, inputs, Ks, W, H, box, **kw):
    """rasterization() with its lists (box: gsplat's), its loss under a fixed upstream
    gradient: (images, alphas, grads of the inputs, meta)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    with box_tile_lists() if box else contextlib.nullcontext():
        img, alpha, meta = tilesplat.rasterization(*leaves[:6], Ks, W, H, backend=backend,
                                                   backgrounds=leaves[6], absgrad=True, **kw)
    meta["means2d"].retain_grad()
    g = torch.Generator().manual_seed(2)
    loss = ((img * torch.randn(img.shape, generator=g, dtype=img.dtype)).sum()
            + (alpha * torch.randn(alpha.shape, generator=g, dtype=img.dtype)).sum())
    loss.backward()
    return img.detach(), alpha.detach(), [t.grad for t in leaves], meta


def check_rasterization(backend, inputs, Ks, W, H, dtype, expect_fewer=True, **kw):
    fwd, grad = tolerances(backend, dtype)
    tight = render(backend, inputs, Ks, W, H, False, **kw)
    box = render(backend, inputs, Ks, W, H, True, **kw)
    n_tight, n_box = (int(r[3]["tiles_per_gauss"].sum()) for r in (tight, box))
    assert n_tight == tight[3]["isect_ids"].numel() and n_tight <= n_box
    if expect_fewer:
        assert n_tight < n_box, "the scene should drop some pairs"
    same("images", tight[0], box[0], backend, fwd)
    same("alphas", tight[1], box[1], backend, fwd)
    names = ("means", "quats", "scales", "opacities", "colors", "viewmats", "backgrounds")
    for name, a, e in zip(names, tight[2], box[2], strict=True):
        same(f"v_{name}", a, e, backend, grad)
    same("v_means2d", tight[3]["means2d"].grad, box[3]["means2d"].grad, backend, grad)
    same("absgrad", tight[3]["means2d"].absgrad, box[3]["means2d"].absgrad, backend, grad)
    same_last(tight[3]["last_ids"], tight[3]["flatten_ids"], box[3]["last_ids"],
              box[3]["flatten_ids"])


def scene_3d(backend, batch, n, dtype, seed=6):
    C, W, H = (1, 7, 6) if simulated(backend) else (2, 41, 27)
    if simulated(backend):
        n = min(n, 8)
    means, quats, scales, opacities, colors = random_gaussians(
        n, batch, dtype=dtype, seed=seed, spread=0.8 if simulated(backend) else 1.2,
        scale=0.3 if simulated(backend) else 0.15)
    opacities = opacities * 0.5 + 0.01 * (torch.arange(n) % 3 == 0).to(dtype)  # some faint
    viewmats, Ks = cameras(C, W, H, batch, dtype=dtype)
    bg = torch.rand((*batch, C, 3), generator=torch.Generator().manual_seed(seed)).to(dtype)
    return [means, quats, scales, opacities, colors, viewmats, bg], Ks, W, H


@pytest.mark.backends("torch", "cpu")  # cuda-sim: the two tests below (the simulator's time)
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_rasterization_is_unchanged(backend, batch, packed, scheme):
    dtype = torch.float64 if simulated(backend) else torch.float32
    inputs, Ks, W, H = scene_3d(backend, batch, 120, dtype)
    check_rasterization(backend, inputs, Ks, W, H, dtype, packed=packed,
                        backward_scheme=scheme, tile_size=4 if simulated(backend) else 8)


@pytest.mark.parametrize("packed", [False, True])
def test_rasterization_antialiased_depth(backend, packed):
    """The compensation scales the opacity the bound reads; a depth channel."""
    dtype = torch.float64 if simulated(backend) else torch.float32
    inputs, Ks, W, H = scene_3d(backend, (), 120, dtype, seed=9)
    check_rasterization(backend, inputs, Ks, W, H, dtype, packed=packed,
                        rasterize_mode="antialiased", render_mode="RGB+D",
                        tile_size=4 if simulated(backend) else 16)


def test_rasterization_without_gaussians(backend):
    dtype = torch.float32
    inputs, Ks, W, H = scene_3d(backend, (), 6, dtype)
    inputs[:5] = [t[:0] for t in inputs[:5]]
    for packed in (False, True):
        check_rasterization(backend, inputs, Ks, W, H, dtype, expect_fewer=False,
                            packed=packed, tile_size=4)
