"""``rasterization`` end to end (projection, SH, tile lists, rasterizer): images, alphas and
the gradients of means, quats, scales, opacities, colours / SH coefficients and viewmats
against the reference, both backward schemes, packed and not, camera models, render modes,
antialiased mode, backgrounds, batch dims.

On cuda-sim the scenes run in float64, where both backends must agree to rounding: in
float32 the composition of ops loses ~3e-4 against float64 in *both* backends (the per-op
tests hold the float32 tolerances)."""

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians

from .parity import SCHEMES, assert_parity, simulated

INPUTS = ["means", "quats", "scales", "opacities", "colors", "viewmats"]


def _inputs(backend, batch, dtype, sh_degree=None, seed=6, sim_size=(12, 8)):
    n, C, W, H = (8, 1, *sim_size) if simulated(backend) else (150, 2, 37, 23)
    means, quats, scales, opacities, colors = random_gaussians(
        n, batch, dtype=dtype, seed=seed, spread=0.8 if simulated(backend) else 1.2,
        scale=0.3 if simulated(backend) else 0.15)
    viewmats, Ks = cameras(C, W, H, batch, dtype=dtype)
    if sh_degree is not None:
        g = torch.Generator().manual_seed(8)
        K = (sh_degree + 1) ** 2
        colors = (torch.randn(*colors.shape[:-1], K, 3, generator=g) * 0.3).to(dtype)
    return [means, quats, scales, opacities, colors, viewmats], Ks, W, H


def _render(Ks, W, H, **kw):
    def fn(means, quats, scales, opacities, colors, viewmats, *, backend):
        img, alpha, _ = tilesplat.rasterization(means, quats, scales, opacities, colors,
                                                viewmats, Ks, W, H, backend=backend, **kw)
        return img, alpha

    return fn


CASES = {
    "packed-sh3": (torch.float32, dict(packed=True, sh_degree=3)),
    "antialiased-bg": (torch.float32, dict(packed=False, rasterize_mode="antialiased",
                                           backgrounds=True)),
    "fisheye-RGB+D": (torch.float32, dict(camera_model="fisheye", render_mode="RGB+D")),
    "packed-RGB+ED-sh2-f64": (torch.float64, dict(packed=True, render_mode="RGB+ED",
                                                  sh_degree=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(backend, case):
    """Both schemes per case; on cuda-sim one per case, alternating (the simulator's time)."""
    dtype, kw = CASES[case]
    kw = dict(kw)
    schemes = SCHEMES
    if simulated(backend):
        dtype = torch.float64
        schemes = (SCHEMES[list(CASES).index(case) % 2],)
    batch = (2,) if case == "packed-sh3" else ()
    inputs, Ks, W, H = _inputs(backend, batch, dtype, kw.get("sh_degree"))
    if kw.get("backgrounds"):
        g = torch.Generator().manual_seed(9)
        kw["backgrounds"] = torch.rand(*inputs[-1].shape[:-2], 3, generator=g, dtype=dtype)
    tile = 8 if simulated(backend) else 16
    for scheme in schemes:
        fn = _render(Ks, W, H, backward_scheme=scheme, tile_size=tile, **kw)
        assert_parity(fn, inputs, backend, dtype, f"{case} {scheme}",
                      outputs=["images", "alphas"], inputs=INPUTS)


@pytest.mark.parametrize("packed", [False, True])
def test_batch_dims(backend, batch, packed):
    """Batch dims with every option at once: SH, backgrounds, antialiased, RGB+ED."""
    dtype = torch.float64
    inputs, Ks, W, H = _inputs(backend, batch, dtype, sh_degree=2, seed=7, sim_size=(8, 8))
    g = torch.Generator().manual_seed(8)
    backgrounds = torch.rand(*inputs[-1].shape[:-2], 3, generator=g, dtype=dtype)
    fn = _render(Ks, W, H, sh_degree=2, packed=packed, tile_size=8, backgrounds=backgrounds,
                 render_mode="RGB+ED", rasterize_mode="antialiased")
    assert_parity(fn, inputs, backend, dtype, f"packed={packed}", outputs=["images", "alphas"],
                  inputs=INPUTS)
