"""The CPU projection's blocks: its kernels run branch-free loops over blocks of Gaussians
(vectorised), so a Gaussian's outputs and gradients must not depend on its neighbours, on
where the block boundaries fall, or on the loop's remainder. Checked with several blocks, two
cameras, a batch, each camera model, and the reference's values."""

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians
from tilesplat.backends.cpu._common import BLOCK

N = 2 * BLOCK + 37  # two full blocks and a remainder


def _scene(seed):
    means, quats, scales, opacities, _ = random_gaussians(N, (2,), seed=seed, spread=1.5)
    means[0, :40] = torch.tensor([0.0, 0.0, -4.5])  # behind the near plane of every camera
    opacities[1, :300] = 0.002  # culled by opacity
    viewmats, Ks = cameras(2, 61, 47, (2,))
    return means, quats, scales, opacities, viewmats, Ks


def _project(means, quats, scales, opacities, viewmats, Ks, model, backend):
    return tilesplat.fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, 61, 47, eps2d=0.3, radius_clip=0.4,
        calc_compensations=True, opacities=opacities, camera_model=model, backend=backend)


def _with_grads(inputs, model, seed):
    leaves = [t.clone().requires_grad_(i < 3) for i, t in enumerate(inputs)]
    radii, means2d, depths, conics, comps = _project(*leaves, model, "cpu")
    g = torch.Generator().manual_seed(seed)
    loss = sum((x * torch.randn(x.shape, generator=g)).sum()
               for x in (means2d, depths, conics, comps))
    loss.backward()
    return (radii, means2d, depths, conics, comps), tuple(t.grad for t in leaves[:3])


@pytest.mark.parametrize("model", ["pinhole", "ortho", "fisheye"])
def test_each_gaussian_is_independent_of_its_block(model):
    inputs = _scene(seed=11)
    outs, grads = _with_grads(inputs, model, seed=1)
    vis = (outs[0] > 0).all(-1)
    assert 0 < int(vis.sum()) < vis.numel()
    # the same Gaussians in slices whose boundaries and remainders fall elsewhere
    for lo, hi in ((0, 17), (17, BLOCK + 5), (BLOCK + 5, N)):
        part = [t[:, lo:hi] if i < 4 else t for i, t in enumerate(inputs)]
        got = _project(*part, model, "cpu")
        for whole, piece in zip(outs, got, strict=True):
            assert torch.equal(whole[:, :, lo:hi], piece)
    ref = _project(*inputs, model, "torch")
    assert torch.equal(ref[0], outs[0])
    for want, got in zip(ref[1:], outs[1:], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for grad in grads:
        assert torch.isfinite(grad).all()
        assert torch.equal(grad[~vis.any(1)], torch.zeros_like(grad[~vis.any(1)]))


def test_gradients_of_a_slice_are_the_whole_runs():
    inputs = _scene(seed=12)
    _, grads = _with_grads(inputs, "pinhole", seed=2)
    lo, hi = 3, BLOCK + 40
    part = [t[:, lo:hi] if i < 4 else t for i, t in enumerate(inputs)]
    leaves = [t.clone().requires_grad_(i < 3) for i, t in enumerate(part)]
    outs = _project(*leaves, "pinhole", "cpu")
    g = torch.Generator().manual_seed(2)
    ups = [torch.randn((2, 2, N) + x.shape[3:], generator=g)[:, :, lo:hi] for x in outs[1:]]
    sum((x * u).sum() for x, u in zip(outs[1:], ups, strict=True)).backward()
    for whole, leaf in zip(grads, leaves[:3], strict=True):
        assert torch.equal(whole[:, lo:hi], leaf.grad)
