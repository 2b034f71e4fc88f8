"""3DGUT's ``rasterization(with_ut=True, with_eval3d=True, distributed=True)`` on 2 CPU
processes with gloo on 127.0.0.1 (the harness of tests/test_distributed.py: bounded waits,
every rank ended by its PID): each rank renders its own cameras, with their own lenses and
rolling shutter, from every rank's Gaussians, and its images and its Gaussians' gradients
are those of one process rendering all Gaussians into all cameras."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from test_distributed import _init, _spawn


def _lenses(C: int) -> dict:
    """A distorted OpenCV pinhole per camera (each camera's coefficients its own, so a
    gather in the wrong order shows) and a rolling shutter moving each camera sideways."""
    from helpers import cameras
    from tilesplat import RollingShutterType

    W, H = 24, 16
    viewmats, Ks = cameras(C, W, H, dtype=torch.float64)
    step = torch.arange(C, dtype=torch.float64)[:, None]
    radial = torch.tensor([[-0.04, 0.01, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64) * (1 + step)
    tangential = torch.tensor([[1e-3, -2e-3]], dtype=torch.float64) * (1 - step)
    viewmats_rs = viewmats.clone()
    viewmats_rs[:, 0, 3] += 0.05 * (1 + step[:, 0])
    return {"viewmats": viewmats, "Ks": Ks, "radial_coeffs": radial,
            "tangential_coeffs": tangential, "viewmats_rs": viewmats_rs,
            "rolling_shutter": RollingShutterType.ROLLING_TOP_TO_BOTTOM}


def _sharded_ut(rank: int, port: int) -> None:
    """Rank 0 holds 6 Gaussians and 1 camera, rank 1 holds 7 Gaussians and 2 cameras (as in
    test_distributed's sharded rendering), unpacked and packed; images within 1e-9,
    gradients rel 1e-6."""
    import tilesplat
    from helpers import random_gaussians

    _init(rank, port)
    try:
        W, H, N = 24, 16, 13
        means, quats, scales, opacities, _ = random_gaussians(N, seed=3, spread=0.8, scale=0.3,
                                                              dtype=torch.float64)
        lens = _lenses(3)
        g = torch.Generator().manual_seed(5)
        sh = torch.randn((N, 4, 3), generator=g, dtype=torch.float64) * 0.5
        bgs = torch.rand((3, 3), generator=g, dtype=torch.float64)
        weights = torch.randn((3, H, W, 3), generator=g, dtype=torch.float64)
        gauss = slice(0, 6) if rank == 0 else slice(6, 13)
        cams = slice(0, 1) if rank == 0 else slice(1, 3)

        for packed in (False, True):

            def render(params, cams, distributed, packed=packed):
                camera = {k: v[cams] if isinstance(v, torch.Tensor) else v
                          for k, v in lens.items()}
                viewmats, Ks = camera.pop("viewmats"), camera.pop("Ks")
                colors, alphas, _ = tilesplat.rasterization(
                    *params, viewmats, Ks, W, H, sh_degree=1, packed=packed,
                    backgrounds=bgs[cams], distributed=distributed, tile_size=4, with_ut=True,
                    with_eval3d=True, backend="torch", **camera)
                return colors, alphas

            full = [t.clone().requires_grad_(True) for t in (means, quats, scales, opacities,
                                                             sh)]
            ref_c, ref_a = render(full, slice(0, 3), False)
            assert float((ref_a > 0.1).double().mean()) > 0.2, "the scene should cover pixels"
            ((ref_c * weights).sum() + ref_a.sum()).backward()

            mine = [t[gauss].detach().clone().requires_grad_(True)
                    for t in (means, quats, scales, opacities, sh)]
            out_c, out_a = render(mine, cams, True)
            torch.testing.assert_close(out_c, ref_c[cams].detach(), atol=1e-9, rtol=0)
            torch.testing.assert_close(out_a, ref_a[cams].detach(), atol=1e-9, rtol=0)
            ((out_c * weights[cams]).sum() + out_a.sum()).backward()
            for name, a, e in zip(("means", "quats", "scales", "opacities", "sh"), mine, full,
                                  strict=True):
                assert float(e.grad[gauss].abs().max()) > 0, f"v_{name} should not be zero"
                torch.testing.assert_close(a.grad, e.grad[gauss], atol=1e-10, rtol=1e-6,
                                           msg=f"v_{name} (packed={packed})")

        # a rank whose lens differs (no tangential coefficients on rank 1) ends every rank's
        # call with the same clear error, not a hang in a gather
        camera = {k: v[cams] if isinstance(v, torch.Tensor) else v for k, v in lens.items()}
        if rank == 1:
            camera.pop("tangential_coeffs")
        viewmats, Ks = camera.pop("viewmats"), camera.pop("Ks")
        with pytest.raises(ValueError, match="every rank must render the same way; rank "
                           f"{rank} .* and rank {1 - rank} "):
            tilesplat.rasterization(means[gauss], quats[gauss], scales[gauss],
                                    opacities[gauss], sh[gauss], viewmats, Ks, W, H,
                                    sh_degree=1, distributed=True, with_ut=True,
                                    with_eval3d=True, backend="torch", **camera)
    finally:
        dist.destroy_process_group()


def test_sharded_3dgut_rendering_matches_one_process():
    _spawn(_sharded_ut)
