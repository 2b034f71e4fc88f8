"""``world_to_cam`` and ``proj`` (gsplat's standalone camera steps) against gsplat 1.5.3's own
torch functions, for the three camera models and batch dims; their input checks. Only the
torch backend implements them (``backend`` lists it: a native one joins here)."""

import pytest
import torch

import tilesplat
from helpers import assert_close, cameras, random_gaussians

pytestmark = pytest.mark.backends("torch")

impl = pytest.importorskip("gsplat.cuda._torch_impl")


@pytest.mark.parametrize("camera_model", ["pinhole", "ortho", "fisheye"])
def test_world_to_cam_and_proj_match_gsplat(backend, batch, camera_model):
    means, quats, scales, _, _ = random_gaussians(30, batch, dtype=torch.float64, seed=3)
    covars, _ = tilesplat.quat_scale_to_covar_preci(quats, scales, compute_preci=False)
    viewmats, Ks = cameras(3, 40, 30, batch, dtype=torch.float64)
    means = means.requires_grad_()
    means_c, covars_c = tilesplat.world_to_cam(means, covars, viewmats, backend=backend)
    want_m, want_c = impl._world_to_cam(means, covars, viewmats)
    assert_close("means_c", means_c, want_m, 1e-12, 1e-12)
    assert_close("covars_c", covars_c, want_c, 1e-12, 1e-12)

    ref = {"pinhole": impl._persp_proj, "ortho": impl._ortho_proj,
           "fisheye": impl._fisheye_proj}[camera_model]
    m2d, c2d = tilesplat.proj(means_c, covars_c, Ks, 40, 30, camera_model=camera_model,
                              backend=backend)
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
