"""``fully_fused_projection``: radii exactly and means2d, depths, conics, compensations and
their gradients (means, covars or quats + scales, viewmats) against the reference, for the
three camera models, with Gaussians behind the near plane, culled by ``radius_clip`` and by
opacity, packed and unpacked."""

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians

from .parity import assert_parity, dtypes, simulated

OUTPUTS = ["radii", "means2d", "depths", "conics", "compensations"]


def _scene(backend, batch, dtype=torch.float32, seed=5):
    n, C, W, H = (10, 2, 24, 16) if simulated(backend) else (120, 3, 37, 23)
    means, quats, scales, opacities, _ = random_gaussians(n, batch, dtype=dtype, seed=seed,
                                                          spread=1.5)
    means[..., 0, :] = torch.tensor([0.0, 0.0, -4.5])  # behind the near plane of every camera
    viewmats, Ks = cameras(C, W, H, batch, dtype=dtype)
    return means, quats, scales, opacities, viewmats, Ks, W, H


def _visible_some(radii):
    vis = (radii > 0).all(-1)
    assert 0 < int(vis.sum()) < vis.numel(), "some Gaussians should be culled, not all"


@pytest.mark.parametrize("camera_model", ["pinhole", "ortho", "fisheye"])
def test_matches_reference(backend, batch, camera_model):
    for dtype in dtypes(backend, batch):
        means, quats, scales, opacities, viewmats, Ks, W, H = _scene(backend, batch, dtype)
        if camera_model == "ortho":
            Ks[..., 0, 0] = Ks[..., 1, 1] = 6.0 if simulated(backend) else 10.0

        def fn(m, q, s, v, o, *, backend, Ks=Ks, W=W, H=H):
            return tilesplat.fully_fused_projection(
                m, None, q, s, v, Ks, W, H, calc_compensations=True, camera_model=camera_model,
                radius_clip=0.5, eps2d=0.3, opacities=o, backend=backend)

        _, want = assert_parity(fn, [means, quats, scales, viewmats, opacities], backend, dtype,
                                f"{camera_model} {dtype}", outputs=OUTPUTS,
                                inputs=["means", "quats", "scales", "viewmats", "opacities"])
        _visible_some(want.outputs[0])


@pytest.mark.parametrize("opacities", [False, True])
def test_from_covars_with_clip_and_near_plane(backend, opacities):
    """Upper-triangle covariances instead of quats + scales; a near plane inside the scene."""
    means, quats, scales, opac, viewmats, Ks, W, H = _scene(backend, (2,), seed=4)
    covars, _ = tilesplat.quat_scale_to_covar_preci(quats, scales, True, False, triu=True,
                                                    backend="torch")

    def fn(m, c, v, *, backend):
        return tilesplat.fully_fused_projection(
            m, c, None, None, v, Ks, W, H, radius_clip=1.5, near_plane=3.7,
            opacities=opac if opacities else None, backend=backend)

    _, want = assert_parity(fn, [means, covars, viewmats], backend, torch.float32, "covars",
                            outputs=OUTPUTS[:4], inputs=["means", "covars", "viewmats"])
    _visible_some(want.outputs[0])


def test_packed_matches_reference(backend, batch):
    means, quats, scales, opacities, viewmats, Ks, W, H = _scene(backend, batch, seed=3)

    def fn(m, q, s, *, backend):
        return tilesplat.fully_fused_projection(m, None, q, s, viewmats, Ks, W, H, packed=True,
                                                calc_compensations=True, backend=backend)

    ids = ["batch_ids", "camera_ids", "gaussian_ids"]
    assert_parity(fn, [means, quats, scales], backend, torch.float32, "packed",
                  outputs=ids + OUTPUTS, inputs=["means", "quats", "scales"])
