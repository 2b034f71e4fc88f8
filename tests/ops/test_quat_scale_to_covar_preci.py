"""``quat_scale_to_covar_preci``: covariances and precisions of every backend against the
reference, full and upper-triangle, unnormalised quaternions, float32 and float64."""

import pytest
import torch

import tilesplat
from helpers import random_gaussians

from .parity import assert_parity, dtypes, simulated


@pytest.mark.parametrize("triu", [False, True])
def test_matches_reference(backend, batch, triu):
    n = 7 if simulated(backend) else 50

    def fn(q, s, *, backend):
        return tilesplat.quat_scale_to_covar_preci(q, s, True, True, triu=triu, backend=backend)

    for dtype in dtypes(backend, batch):
        _, quats, scales, _, _ = random_gaussians(n, batch, dtype=dtype, seed=5)
        quats[..., 0, :] *= 3.0  # not normalised
        assert_parity(fn, [quats, scales + 0.2], backend, dtype, f"triu={triu} {dtype}",
                      outputs=["covars", "precis"], inputs=["quats", "scales"])


@pytest.mark.parametrize("covar, preci", [(True, False), (False, True)])
def test_one_output(backend, covar, preci):
    _, quats, scales, _, _ = random_gaussians(5, seed=6)

    def fn(q, s, *, backend):
        out = tilesplat.quat_scale_to_covar_preci(q, s, covar, preci, backend=backend)
        assert (out[0] is None) != covar and (out[1] is None) != preci
        return out

    assert_parity(fn, [quats, scales], backend, torch.float32, "one output",
                  inputs=["quats", "scales"])
