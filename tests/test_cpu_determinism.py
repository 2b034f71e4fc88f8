"""CPU gradients are bit-identical run to run and for any number of threads, in both backward
schemes (DESIGN.md "Numbers to keep")."""

from __future__ import annotations

import numba
import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians


def _step(scheme: str, threads: int) -> list[torch.Tensor]:
    """One forward + backward of a scene with several work items per kernel (> 1024 Gaussians,
    many tiles, 2 cameras); returns the image and every gradient."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        W, H = 96, 64
        means, quats, scales, opacities, _ = random_gaussians(2500, seed=11, spread=1.5, scale=0.08)
        g = torch.Generator().manual_seed(12)
        sh = torch.randn(2500, 9, 3, generator=g) * 0.3
        viewmats, Ks = cameras(2, W, H)
        leaves = [
            t.clone().requires_grad_(True) for t in (means, quats, scales, opacities, sh, viewmats)
        ]
        img, alpha, meta = tilesplat.rasterization(
            *leaves[:5],
            leaves[5],
            Ks,
            W,
            H,
            sh_degree=2,
            absgrad=True,
            packed=False,
            backgrounds=torch.rand(2, 3, generator=g),
            backend="cpu",
            backward_scheme=scheme,
        )
        meta["means2d"].retain_grad()
        up = torch.randn(img.shape, generator=g)
        ((img * up).sum() + alpha.square().sum()).backward()
        return [img, alpha, meta["means2d"].grad, meta["means2d"].absgrad] + [
            x.grad for x in leaves
        ]
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
def test_gradients_bit_identical(scheme):
    many = min(2, numba.config.NUMBA_NUM_THREADS)
    first = _step(scheme, many)
    again = _step(scheme, many)
    single = _step(scheme, 1)
    names = [
        "img",
        "alpha",
        "v_means2d",
        "absgrad",
        "v_means",
        "v_quats",
        "v_scales",
        "v_opacities",
        "v_sh",
        "v_viewmats",
    ]
    for name, a, b, c in zip(names, first, again, single, strict=True):
        assert a is not None and bool(a.abs().sum() > 0), f"{name}: missing or all zero"
        assert torch.equal(a, b), f"{name} differs between two runs"
        assert torch.equal(a, c), f"{name} differs between {many} threads and 1 thread"


def _packed_step(torch_threads: int) -> list[torch.Tensor]:
    """A packed render of 40,000 Gaussians that three cameras all see (so each Gaussian's
    per-camera gradients are summed, and the gathered per-Gaussian tensors pass torch's 32,768
    elements of parallel indexing), with ``torch_threads`` intra-op threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        W, H = 48, 32
        n = 40_000
        means, quats, scales, opacities, _ = random_gaussians(n, seed=5, spread=1.0, scale=0.01)
        g = torch.Generator().manual_seed(6)
        sh = torch.randn(n, 4, 3, generator=g) * 0.3
        viewmats, Ks = cameras(3, W, H)
        leaves = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities, sh)]
        img, alpha, _ = tilesplat.rasterization(*leaves, viewmats, Ks, W, H, sh_degree=1,
                                                packed=True, backend="cpu")
        ((img * torch.randn(img.shape, generator=g)).sum() + alpha.sum()).backward()
        return [x.grad for x in leaves]
    finally:
        torch.set_num_threads(before)


def test_packed_gradients_do_not_depend_on_torch_threads():
    """The packed path gathers per-Gaussian tensors for each (camera, Gaussian) pair; their
    gradients are summed per Gaussian in a fixed order (``rendering/_pipeline.gather_rows``),
    not with torch's multithreaded atomic ``index_put_``, so two torch threads give the bits
    one gives (before, garden's v_means, v_opacities and SH gradients varied run to run)."""
    single = _packed_step(1)
    for _ in range(2):
        for name, a, b in zip(("v_means", "v_quats", "v_scales", "v_opacities", "v_sh"),
                              _packed_step(2), single, strict=True):
            assert bool(b.abs().sum() > 0), f"{name}: all zero"
            assert torch.equal(a, b), f"{name} differs between 2 torch threads and 1"
