"""The hit flags the CPU rasterizer's forward keeps for its backward
(``backends/cpu/rasterize_saved``): bit g of flags[k, s] is 1 exactly where intersection k
contributes to a pixel of group g (GROUP_PIXELS pixels) of slice s. The backward evaluates each
intersection only from its first flagged group to its last, so a missing flag at either end
loses a gradient and a spurious one only costs time; both directions are checked through the
gradients, with the flags edited between the forward and the backward.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tilesplat
from helpers import tile_grid
from tilesplat.backends.cpu import rasterize
from tilesplat.backends.cpu.rasterize_saved import n_slices


def _scene(D: int, seed: int = 5):
    """2 images of 37 x 23 px, 250 random 2D Gaussians each (dense enough that many pixels
    stop at T = 1e-4), their tile lists, a background and a mask."""
    W, H, ts, I, G = 37, 23, 16, 2, 250
    g = torch.Generator().manual_seed(seed)
    means2d = torch.rand(I, G, 2, generator=g) * torch.tensor([W * 1.2, H * 1.2]) - 2
    sx = torch.rand(I, G, generator=g) * 4 + 0.5
    sy = torch.rand(I, G, generator=g) * 4 + 0.5
    rho = (torch.rand(I, G, generator=g) - 0.5) * 1.6
    det = sx * sx * sy * sy * (1 - rho * rho)
    conics = torch.stack([sy * sy / det, -rho * sx * sy / det, sx * sx / det], -1)
    radii = torch.stack([torch.ceil(3 * sx), torch.ceil(3 * sy)], -1).int()
    depths = torch.rand(I, G, generator=g) * 5 + 1
    TW, TH = tile_grid(W, H, ts)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(means2d, radii, depths, ts, TW, TH,
                                                      backend="torch")
    offsets = tilesplat.isect_offset_encode(isect_ids, I, TW, TH, backend="torch")
    masks = torch.ones(I, TH, TW, dtype=torch.bool)
    masks[1, 0, 1] = False
    return dict(
        means2d=means2d.reshape(I * G, 2), conics=conics.reshape(I * G, 3),
        colors=torch.rand(I * G, D, generator=g),
        opacities=torch.rand(I * G, generator=g) * 0.95,
        backgrounds=torch.rand(I, D, generator=g), masks=masks, width=W, height=H,
        tile_size=ts, isect_offsets=offsets, flatten_ids=flatten_ids,
        v_colors=torch.randn(I, H, W, D, generator=g),
        v_alphas=torch.randn(I, H, W, 1, generator=g),
    )


def _grads(sc, scheme, edit=None):
    keys = ("means2d", "conics", "colors", "opacities", "backgrounds", "masks", "width",
            "height", "tile_size", "isect_offsets", "flatten_ids")
    args = [sc[k] for k in keys]
    rc, ra, last, saved = rasterize.forward(*args, scheme)
    n = sc["flatten_ids"].shape[0]
    flags = saved.numpy()[: n * n_slices(sc["tile_size"])].reshape(n, -1)
    if edit is not None:
        edit(flags)
    out = rasterize.backward(*args, rc, ra, last, sc["v_colors"], sc["v_alphas"], True,
                                 scheme, saved)
    return flags.copy(), [t for t in out if t is not None]


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("D", [3, 2])  # RGB has its own colour loops
@pytest.mark.parametrize("scheme", ["per_pixel", "per_splat"])
def test_flags_mark_exactly_the_contributing_pairs(scheme, D):
    sc = _scene(D)
    flags, base = _grads(sc, scheme)
    bits = np.unpackbits(flags[..., None], axis=-1, bitorder="little")  # [n, n_sub, 8]
    flagged = np.argwhere(bits == 1)
    assert 0 < len(flagged) < bits.size  # some pairs contribute, some do not

    def set_all(f):
        f[:] = 255

    # a spurious flag changes nothing: unflagged pairs contribute nothing
    assert _same(_grads(sc, scheme, set_all)[1], base)

    def clear_all(f):
        f[:] = 0

    v_means2d = _grads(sc, scheme, clear_all)[1][0]
    assert not v_means2d.abs().any()  # no pair evaluated

    # every flag marks a contributing pair: clearing any one loses a gradient. The backward
    # evaluates an intersection from its first flagged group to its last, so a flag is
    # cleared where that changes the span: at either end of it.
    groups = bits.reshape(len(bits), -1)
    ends = np.array([(k, s, g) for k, s, g in flagged
                     if not groups[k, :s * 8 + g].any() or not groups[k, s * 8 + g + 1:].any()])
    rng = np.random.default_rng(0)
    for k, s, g in ends[rng.choice(len(ends), 8, replace=False)]:

        def clear_one(f, k=k, s=s, g=g):
            f[k, s] &= np.uint8(255 - (1 << g))

        assert not _same(_grads(sc, scheme, clear_one)[1], base), (k, s, g)


def test_saved_buffer_layout():
    sc = _scene(3)
    args = [sc[k] for k in ("means2d", "conics", "colors", "opacities", "backgrounds", "masks",
                            "width", "height", "tile_size", "isect_offsets", "flatten_ids")]
    n, I, H, W = sc["flatten_ids"].shape[0], 2, sc["height"], sc["width"]
    flag_bytes = (n * n_slices(16) + 7) // 8 * 8
    assert rasterize.forward(*args, None)[3] is None  # no backward: nothing kept
    assert rasterize.forward(*args, "per_pixel")[3].numel() == flag_bytes + I * H * W * 4
    assert rasterize.forward(*args, "per_splat")[3].numel() == flag_bytes + I * H * W * 3 * 4
    f64 = [a.double() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
    assert rasterize.forward(*f64, "per_splat")[3].numel() == flag_bytes
