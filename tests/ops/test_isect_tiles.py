"""``isect_tiles`` and ``isect_offset_encode``: exactly the reference's tiles per Gaussian,
intersection ids, flatten ids and tile offsets, packed and unpacked, sorted and not, with
culled Gaussians, depth ties (the stable sort keeps listing order), negative depths, images
with no intersection at all."""

import math

import pytest
import torch

import tilesplat
from helpers import tile_grid

from .parity import simulated

NAMES = ("tiles_per_gauss", "isect_ids", "flatten_ids", "isect_offsets")


def _scene(backend, images, seed=2):
    n, W, H, ts = (12, 24, 16, 8) if simulated(backend) else (200, 37, 23, 8)
    g = torch.Generator().manual_seed(seed)
    means2d = torch.rand(*images, n, 2, generator=g) * torch.tensor([W, H]) * 1.3 - 3
    radii = (torch.rand(*images, n, 2, generator=g) * 9).int()  # some 0: culled
    depths = torch.rand(*images, n, generator=g) * 3 - 0.5
    depths[..., : n // 5] = 1.5  # ties keep the listing order
    return means2d, radii, depths, W, H, ts


def _both(backend, args, I, ts, TW, TH, sort=True, **kw):
    outs = {}
    for b in ("torch", backend):
        res = tilesplat.isect_tiles(*args, ts, TW, TH, sort=sort, backend=b, **kw)
        if sort:
            res = (*res, tilesplat.isect_offset_encode(res[1], I, TW, TH, backend=b))
        outs[b] = res
    for name, a, e in zip(NAMES, outs[backend], outs["torch"], strict=False):
        assert a.dtype == e.dtype and torch.equal(a, e), name
    return outs["torch"]


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_matches_reference_exactly(backend, batch, packed, sort):
    C = 2 if simulated(backend) else 3
    means2d, radii, depths, W, H, ts = _scene(backend, (*batch, C))
    I = math.prod(batch) * C
    TW, TH = tile_grid(W, H, ts)
    args, kw = (means2d, radii, depths), {}
    if packed:
        sel = (radii > 0).all(-1)
        image_ids, gaussian_ids = sel.reshape(I, -1).nonzero(as_tuple=True)
        args = (means2d[sel], radii[sel], depths[sel])
        kw = dict(packed=True, n_images=I, image_ids=image_ids, gaussian_ids=gaussian_ids)
    ref = _both(backend, args, I, ts, TW, TH, sort=sort, **kw)
    assert ref[1].numel() > 20


@pytest.mark.parametrize("case", ["all_culled", "no_gaussians"])
def test_no_intersections(backend, case):
    means2d, radii, depths, W, H, ts = _scene(backend, (2,))
    if case == "all_culled":
        radii = torch.zeros_like(radii)
    else:
        means2d, radii, depths = means2d[:, :0], radii[:, :0], depths[:, :0]
    TW, TH = tile_grid(W, H, ts)
    ref = _both(backend, (means2d, radii, depths), 2, ts, TW, TH)
    assert ref[1].numel() == 0 and not ref[3].any()
