"""``rasterization_2dgs`` end to end (2DGS projection, tile lists, surfel rasterizer): every
image it returns and the gradients of means, quats, scales, opacities and colours against
the reference, packed and not, RGB+ED, backgrounds, the distortion loss, batch dims. The
cuda backend's 2DGS kernels are checked in the simulator by tests/test_cuda_2dgs.py."""

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians

from .parity import assert_parity

pytestmark = pytest.mark.backends("cpu")

TOL64 = (1e-10, 1e-9)  # forward, gradients: the 2DGS kernels call exp


@pytest.mark.parametrize("packed", [False, True])
def test_matches_reference(backend, batch, packed):
    dtype = torch.float64
    means, quats, scales, opac, colors = random_gaussians(30, batch, dtype=dtype, seed=5,
                                                          scale=0.3)
    view, K = cameras(2, 24, 20, batch, dtype=dtype, distance=3.0)
    backgrounds = torch.ones(*batch, 2, 3, dtype=dtype)

    def fn(means, quats, scales, opacities, colors, *, backend):
        out = tilesplat.rasterization_2dgs(means, quats, scales, opacities, colors, view, K,
                                           24, 20, packed=packed, render_mode="RGB+ED",
                                           distloss=True, backgrounds=backgrounds,
                                           backend=backend)
        return out[:6]

    _, want = assert_parity(fn, [means, quats, scales, opac, colors], backend, dtype,
                            f"packed={packed}", tol=TOL64,
                            inputs=["means", "quats", "scales", "opacities", "colors"])
    assert float(want.outputs[1].max()) > 0.5  # covered pixels
