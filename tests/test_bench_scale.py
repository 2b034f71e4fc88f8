"""``tilesplat.bench.scale``: a bench scene multiplied to N Gaussians at a larger image size."""

import pytest
import torch

from tilesplat.bench.scale import parse_size, scaled_scene
from tilesplat.data.scenes import synthetic_scene


def test_scaled_scene_counts_camera_and_intrinsics():
    base = synthetic_scene(100, 64, 48)
    sc = scaled_scene(base, 250, (128, 72))
    assert sc.num_gaussians == 250 and (sc.width, sc.height) == (128, 72)
    assert sc.viewmats.shape == (1, 4, 4) and sc.Ks.shape == (1, 3, 3)
    k0, k = base.Ks[0], sc.Ks[0]
    assert torch.allclose(k[0], k0[0] * 2.0) and torch.allclose(k[1], k0[1] * 1.5)
    assert torch.equal(k[2], k0[2])
    # 3 copies: each copy's Gaussians smaller by cbrt(3), near its original
    assert torch.allclose(sc.scales[:100], base.scales / 3 ** (1 / 3))
    assert torch.equal(sc.opacities[100:200], base.opacities)
    reach = base.scales.max(dim=1).values
    assert ((sc.means[100:200] - base.means).norm(dim=1) < 6 * reach).all()
    assert torch.allclose(sc.quats.norm(dim=1), torch.ones(250, dtype=sc.quats.dtype))
    again = scaled_scene(base, 250, (128, 72))
    assert torch.equal(again.means, sc.means) and torch.equal(again.quats, sc.quats)


def test_scaled_scene_subset_and_own_size():
    base = synthetic_scene(100, 64, 48)
    sc = scaled_scene(base, 10)
    assert sc.num_gaussians == 10 and (sc.width, sc.height) == (64, 48)
    assert torch.equal(sc.means[0], base.means[0]) and torch.equal(sc.means[-1], base.means[-1])
    assert torch.equal(sc.Ks, base.Ks[:1])


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="gaussians"):
        scaled_scene(synthetic_scene(10, 8, 8), 0)
    for bad in ("1297", "0x840", "axb", "12x-3"):
        with pytest.raises(ValueError, match="resolution"):
            parse_size(bad)
    assert parse_size("1297x840") == (1297, 840)
