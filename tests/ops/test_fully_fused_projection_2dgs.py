"""``fully_fused_projection_2dgs``: radii exactly and means2d, depths, ray transforms, normals
and the gradients of means, quats, scales, viewmats and Ks against the reference, with
surfels behind the near plane and off the image (culled). The cuda backend's 2DGS
kernels are checked in the simulator by tests/test_cuda_2dgs.py."""

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians

pytestmark = pytest.mark.backends("cpu")

TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-9)}  # forward, gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_reference(backend, batch, dtype):
    means, quats, scales, _, _ = random_gaussians(40, batch, dtype=dtype, seed=2, scale=0.4,
                                                  spread=4.0)
    view, K = cameras(3, 41, 29, batch, dtype=dtype, distance=3.0)
    res = {}
    for b in (backend, "torch"):
        leaves = [t.clone().requires_grad_() for t in (means, quats, scales, view, K)]
        outs = tilesplat.fully_fused_projection_2dgs(*leaves, 41, 29, backend=b)
        g = torch.Generator().manual_seed(0)
        loss = sum((torch.randn(o.shape, generator=g, dtype=dtype) * o).sum() for o in outs[1:])
        res[b] = outs, torch.autograd.grad(loss, leaves)
    (got, v_got), (want, v_want) = res[backend], res["torch"]
    assert torch.equal(got[0], want[0]), "radii"
    vis = (want[0] > 0).all(-1)
    assert 0 < int(vis.sum()) < vis.numel() and int(vis.sum()) > vis.numel() // 6  # some culled
    f_tol, g_tol = TOL[dtype]
    for name, a, b in zip(("means2d", "depths", "ray_transforms", "normals"), got[1:], want[1:],
                          strict=True):
        assert_close(name, a, b, f_tol, f_tol)
    for name, a, b in zip(("means", "quats", "scales", "viewmats", "Ks"), v_got, v_want,
                          strict=True):
        assert_close(f"v_{name}", a, b, g_tol, g_tol)
