"""``isect_tiles_tight`` (rasterization()'s tile lists, issue 37).

Native backends against the reference exactly (tiles per Gaussian, ids, flatten ids, offsets;
packed and not, sorted and not, float32 and float64, odd image sizes, needle-thin Gaussians,
opacities around 1/255), and the definition itself on the reference: the lists are
``isect_tiles``' lists less some pairs, in the same order; a row's span is the ellipse's
extent over the row (against a dense grid), and the per-row decisions are those of another
way to the same set, the minimum of the form over the tile's rectangle against the level (an
oracle itself checked against a dense grid); a dropped pair is one whose float32 alpha stays
below 1/255 at every pixel of the tile, on scenes built to sit on the threshold (and with
the margins set to zero the same check finds pairs it would wrongly drop: the margins are
needed, and the check can fail). The rasterizer's outputs with these lists:
``test_rasterization_tight_tiles.py``.
"""

import math

import pytest
import torch

import tilesplat
from helpers import tile_grid
from tilesplat.backends.shared import tiles as shared_tiles
from tilesplat.backends.torch import intersect as reference
from tilesplat.constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER
from tilesplat.ops import isect_tiles_tight

from .parity import simulated

NAMES = ("tiles_per_gauss", "isect_ids", "flatten_ids", "isect_offsets")


def conics_of(s1, s2, theta):
    """Conics [..., 3] of 2D Gaussians with principal standard deviations s1, s2, the first
    axis at angle theta."""
    cos, sin = torch.cos(theta), torch.sin(theta)
    v1, v2 = s1 * s1, s2 * s2
    xx = v1 * cos * cos + v2 * sin * sin
    xy = (v1 - v2) * cos * sin
    yy = v1 * sin * sin + v2 * cos * cos
    det = v1 * v2
    return torch.stack([yy / det, -xy / det, xx / det], -1)


def projected(images, n, W, H, seed=0, dtype=torch.float32):
    """[*images, n] Gaussians as a projection gives them: means2d, radii (3.33 sigma along
    x and y, some 0: culled), depths, conics, opacities. Every sixth one is a needle (axis
    ratio 30 to 3000, at any angle); opacities span [0, 1], some below 1/255."""
    g = torch.Generator().manual_seed(seed)
    f = torch.float64
    shape = (*images, n)
    means2d = torch.rand(*shape, 2, generator=g, dtype=f) * torch.tensor([W, H]) * 1.3 - 4
    s1 = torch.rand(shape, generator=g, dtype=f) * 6 + 0.6
    s2 = torch.rand(shape, generator=g, dtype=f) * 6 + 0.6
    ratio = 30 * 100 ** torch.rand(shape, generator=g, dtype=f)
    s2 = torch.where(torch.arange(n) % 6 == 5, s1 / ratio, s2)
    theta = torch.rand(shape, generator=g, dtype=f) * math.pi
    conics = conics_of(s1, s2, theta)
    cos, sin = torch.cos(theta), torch.sin(theta)
    sd = torch.stack([(s1 * cos) ** 2 + (s2 * sin) ** 2, (s1 * sin) ** 2 + (s2 * cos) ** 2], -1)
    radii = torch.ceil(3.33 * sd.sqrt()).int()
    radii[..., ::7, :] = 0
    depths = torch.rand(shape, generator=g, dtype=f) * 4 - 0.5
    depths[..., : n // 5] = 1.5  # ties keep the listing order
    opacities = torch.rand(shape, generator=g, dtype=f)
    opacities[..., ::9] *= 2 * ALPHA_SKIP  # half of these below 1/255
    means2d, depths, conics, opacities = (t.to(dtype) for t in (means2d, depths, conics,
                                                                 opacities))
    return means2d, radii, depths, conics, opacities


def lists(backend, args, I, ts, TW, TH, W, H, sort=True, **kw):
    res = isect_tiles_tight(*args, ts, TW, TH, W, H, sort=sort, backend=backend, **kw)
    if sort:
        res = (*res, tilesplat.isect_offset_encode(res[1], I, TW, TH, backend=backend))
    return res


def packed_args(args, I):
    sel = (args[1] > 0).all(-1)
    image_ids, gaussian_ids = sel.reshape(I, -1).nonzero(as_tuple=True)
    kw = dict(packed=True, n_images=I, image_ids=image_ids, gaussian_ids=gaussian_ids)
    return [a[sel] for a in args], kw


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("packed", [False, True])
def test_matches_reference_exactly(backend, batch, packed, sort):
    C = 2 if simulated(backend) else 3
    n, W, H, ts = (14, 21, 13, 8) if simulated(backend) else (240, 61, 37, 8)
    I = math.prod(batch) * C
    TW, TH = tile_grid(W, H, ts)
    dtypes = (torch.float32,) if simulated(backend) and batch else (torch.float32, torch.float64)
    for dtype in dtypes:
        args = list(projected((*batch, C), n, W, H, seed=3, dtype=dtype))
        kw = {}
        if packed:
            args, kw = packed_args(args, I)
        want = lists("torch", args, I, ts, TW, TH, W, H, sort, **kw)
        got = lists(backend, args, I, ts, TW, TH, W, H, sort, **kw)
        for name, a, e in zip(NAMES, got, want, strict=False):
            assert a.dtype == e.dtype and torch.equal(a, e), f"{name} {dtype}"
        square = tilesplat.isect_tiles(*args[:3], ts, TW, TH, sort=sort, backend="torch",
                                       **kw)
        assert 20 < want[1].numel() < square[1].numel(), "the scene should drop some pairs"


@pytest.mark.parametrize("case", ["all_culled", "no_gaussians", "all_transparent"])
def test_no_intersections(backend, case):
    means2d, radii, depths, conics, opacities = projected((2,), 8, 20, 11)
    if case == "all_culled":
        radii = torch.zeros_like(radii)
    elif case == "no_gaussians":
        means2d, radii, depths, conics, opacities = (
            t[:, :0] for t in (means2d, radii, depths, conics, opacities))
    else:  # below 1/255: alpha stays below 1/255 everywhere
        opacities = torch.full_like(opacities, ALPHA_SKIP * 0.999)
    TW, TH = tile_grid(20, 11, 4)
    for b in ("torch", backend):
        counts, ids, flat, offsets = lists(b, (means2d, radii, depths, conics, opacities), 2,
                                           4, TW, TH, 20, 11)
        assert ids.numel() == 0 and flat.numel() == 0 and not counts.any() and not offsets.any()


# ---- the definition, on the reference ---------------------------------------------------

def is_subsequence(part, whole) -> bool:
    """Whether the rows of ``part`` [k, 2] occur in ``whole`` [n, 2] in the same order."""
    j = 0
    whole = whole.tolist()
    for row in part.tolist():
        while j < len(whole) and whole[j] != row:
            j += 1
        if j == len(whole):
            return False
        j += 1
    return True


@pytest.mark.parametrize("sort", [True, False])
def test_the_box_lists_less_some_pairs_in_the_same_order(sort):
    W, H, ts = 45, 29, 8
    args = projected((2,), 120, W, H, seed=5)
    TW, TH = tile_grid(W, H, ts)
    counts, ids, flat = isect_tiles_tight(*args, ts, TW, TH, W, H, sort=sort, backend="torch")
    b_counts, b_ids, b_flat = tilesplat.isect_tiles(*args[:3], ts, TW, TH, sort=sort,
                                                    backend="torch")
    assert bool((counts <= b_counts).all()) and int(counts.sum()) == ids.numel()
    assert ids.numel() < b_ids.numel()
    pairs = torch.stack([ids, flat.long()], -1)
    assert is_subsequence(pairs, torch.stack([b_ids, b_flat.long()], -1))
    # a Gaussian below 1/255 (every ninth one, half of them) is in no list
    low = (args[4] < ALPHA_SKIP) & (args[1] > 0).all(-1)
    assert bool(low.any()) and not counts[low].any()


def test_opacity_at_the_threshold():
    """float32(1/255) is above 1/255: at a mean on a pixel centre alpha is exactly the
    rasterizer's threshold, and the Gaussian is listed in that tile (only); one float32 step
    below, alpha < 1/255 at every pixel, and it is in none."""
    W, H, ts = 20, 12, 4
    TW, TH = tile_grid(W, H, ts)
    means2d = torch.tensor([[[9.5, 6.5]]])
    conics = torch.tensor([[[0.5, 0.1, 0.4]]])
    at = torch.tensor(ALPHA_SKIP, dtype=torch.float32)
    below = torch.nextafter(at, torch.tensor(0.0))
    radii = torch.tensor([[[6, 6]]], dtype=torch.int32)
    depths = torch.ones(1, 1)
    for backend in ("torch", "cpu"):
        for op, tiles in ((at, [(2, 1)]), (below, [])):
            _, ids, flat = isect_tiles_tight(means2d, radii, depths, conics, op.reshape(1, 1),
                                             ts, TW, TH, W, H, backend=backend)
            tile = (ids >> 32).tolist()
            assert tile == [ty * TW + tx for tx, ty in tiles], (backend, float(op))
    gid, tx, ty = torch.zeros(1, dtype=torch.long), torch.tensor([2]), torch.tensor([1])
    assert rasterizer_lights(means2d[0], conics[0], at.reshape(1), gid, tx, ty, ts, W, H)
    assert not rasterizer_lights(means2d[0], conics[0], below.reshape(1), gid, tx, ty, ts, W,
                                 H)


def box_sigma_min(a, b, c, x0, x1, y0, y1):
    """The oracle of the tile test, another way to the same set: the minimum of
    0.5 (a dx² + c dy²) + b dx dy (positive definite) over x0 <= dx <= x1, y0 <= dy <= y1:
    0 when the box holds d = 0, else the least minimum of the edges that face d = 0 (a far
    edge cannot hold it: where the form is least along it, it still falls towards d = 0)."""
    def edge(p, q, u, lo, hi):  # u fixed, v in [lo, hi]: the parabola's vertex, clamped
        v = min(max(-b * u / q, lo), hi)
        return 0.5 * (p * u * u + q * v * v) + b * u * v

    lowest = math.inf
    if x0 > 0 or x1 < 0:
        lowest = edge(a, c, x0 if x0 > 0 else x1, y0, y1)
    if y0 > 0 or y1 < 0:
        lowest = min(lowest, edge(c, a, y0 if y0 > 0 else y1, x0, x1))
    return 0.0 if lowest == math.inf else lowest


def random_forms(n, seed):
    """Positive definite conics [n, 3] from round to needle-thin (axis ratio up to 300)."""
    g = torch.Generator().manual_seed(seed)
    f = torch.float64
    sx = torch.rand(n, generator=g, dtype=f) * 5 + 0.3
    ratio = 10 ** (torch.rand(n, generator=g, dtype=f) * 2.5)
    theta = torch.rand(n, generator=g, dtype=f) * math.pi
    return conics_of(sx, sx / ratio, theta)


def test_the_oracle_is_the_minimum_over_the_rectangle():
    """The oracle against a dense grid of the rectangle: boxes inside, around and beside the
    centre (spanning dx = 0 or dy = 0)."""
    g = torch.Generator().manual_seed(2)
    f = torch.float64
    n = 240
    conics = random_forms(n, seed=2)
    lo = (torch.rand(n, 2, generator=g, dtype=f) - 0.5) * 30
    size = torch.rand(n, 2, generator=g, dtype=f) * 15
    lo[::4, 0] = -size[::4, 0] / 2  # boxes that span dx = 0 (then only a y edge faces it)
    lo[1::4, 1] = -size[1::4, 1] / 3
    t = torch.linspace(0, 1, 401, dtype=f)
    for i in range(n):
        a, b, c = conics[i].tolist()
        (x0, y0), (x1, y1) = lo[i].tolist(), (lo[i] + size[i]).tolist()
        least = box_sigma_min(a, b, c, x0, x1, y0, y1)
        dx = (x0 + (x1 - x0) * t)[:, None]
        dy = (y0 + (y1 - y0) * t)[None, :]
        dense = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
        scale = float(dense.abs().max()) + 1.0
        assert least <= float(dense.min()) + 1e-9 * scale, i  # never above the minimum
        # and the grid's minimum is a point of the box: at most its spacing's worth above
        assert float(dense.min()) - least <= 2e-3 * scale, i


def test_row_span_is_the_ellipse_extent_over_the_band():
    """``row_span`` (the shared function as plain Python, and the reference's twin) is the
    ellipse's extent in x over the band of a tile row's pixel centres: every point of a dense
    grid inside the ellipse and the band lies within the span, and each end of the span is a
    point of the ellipse's boundary within the band (a needle's tip can be thinner than any
    grid); bands through, beside, past and tangent to the ellipse, round to needle-thin."""
    g = torch.Generator().manual_seed(4)
    f = torch.float64
    n, ts, H = 200, 8, 4000
    conics = random_forms(n, seed=4)
    opacities = torch.rand(n, generator=g, dtype=f) * 0.9 + 0.05
    form, level, half = reference.alpha_ellipse(conics, opacities)
    assert bool((level > 0).all() & (level < math.inf).all())
    ty = torch.randint(100, 300, (n,), generator=g)
    band_mid = ty * ts + ts / 2  # where the band's centre sits relative to the mean:
    my = band_mid + (torch.rand(n, generator=g, dtype=f) * 2 - 1) * (half[:, 1] + ts)
    xl, xr = reference.row_span(form, level, half, my, ty, ts, H)
    t = torch.linspace(0, 1, 801, dtype=f)
    hits = 0
    for i in range(n):
        a, b, c = form[i].tolist()
        lv = float(level[i])
        got = shared_tiles.row_span(a, b, c, lv, float(half[i, 0]), float(half[i, 1]),
                                    float(my[i]), int(ty[i]), ts, H)
        assert got == pytest.approx((float(xl[i]), float(xr[i])), rel=1e-12, abs=1e-12)
        y0 = float(my[i]) - (int(ty[i]) * ts + ts - 0.5)
        y1 = float(my[i]) - (int(ty[i]) * ts + 0.5)
        w = float(half[i, 0])
        dx = (-w + 2 * w * t)[:, None]
        dy = (y0 + (y1 - y0) * t)[None, :]
        inside = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy <= lv
        xs = dx.expand_as(inside)[inside]
        if got[0] > got[1]:
            assert xs.numel() == 0, i
            continue
        hits += 1
        if xs.numel():
            assert got[0] <= float(xs.min()) + 1e-9 and float(xs.max()) <= got[1] + 1e-9, i
        for x, e in ((got[0], 1), (got[1], -1)):  # the end: on the boundary, in the band
            y = min(max(e * b * w / c, max(y0, -float(half[i, 1]))), min(y1, float(half[i, 1])))
            sigma = 0.5 * (a * x * x + c * y * y) + b * x * y
            assert sigma == pytest.approx(lv, rel=1e-7), i
            assert y0 <= y <= y1
    assert 50 < hits < n


def test_a_tile_is_listed_when_the_minimum_over_its_rectangle_reaches_the_level():
    """The reference's decisions (per row span) are the oracle's (the minimum of the shrunk
    form over the tile's rectangle of pixel centres against the level) on random scenes and
    on scenes built on the threshold, but within 1e-9 of the level."""
    for W, H, ts, scene in ((61, 37, 8, projected((), 300, 61, 37, seed=9)),
                            (97, 73, 16, on_the_threshold(200, 97, 73, 16, seed=5))):
        if len(scene) == 5:
            means2d, radii, _, conics, opacities = scene
        else:
            means2d, radii, conics, opacities = scene
        TW, TH = tile_grid(W, H, ts)
        gid, tx, ty = reference._box_pairs(means2d, radii, ts, TW, TH)
        keep = reference.tiles_reached(means2d, conics, opacities, gid, tx, ty, ts, W, H)
        form, level, _ = reference.alpha_ellipse(conics, opacities)
        decided = 0
        for k in range(gid.shape[0]):
            i = int(gid[k])
            lv = float(level[i])
            x_lo, y_lo = int(tx[k]) * ts + 0.5, int(ty[k]) * ts + 0.5
            x_hi, y_hi = min(int(tx[k]) * ts + ts, W) - 0.5, min(int(ty[k]) * ts + ts, H) - 0.5
            if lv < 0 or lv == math.inf:
                assert bool(keep[k]) == (lv == math.inf), k
                continue
            mx, my = float(means2d[i, 0]), float(means2d[i, 1])
            least = box_sigma_min(*form[i].tolist(), mx - x_hi, mx - x_lo, my - y_hi,
                                  my - y_lo)
            if abs(least - lv) > 1e-9 * (1 + lv):
                assert bool(keep[k]) == (least <= lv), (k, least, lv)
                decided += 1
        assert decided > 0.99 * gid.shape[0] - int((level[gid] == math.inf).sum()
                                                   + (level[gid] < 0).sum())
        assert 0 < int(keep.sum()) < gid.shape[0]


def rasterizer_lights(means2d, conics, opacities, gid, tx, ty, ts, W, H):
    """bool [n]: whether the float32 rasterizer (the reference's formula) composites
    Gaussian gid at some pixel of tile (tx, ty): sigma >= 0 and alpha >= 1/255."""
    p = torch.arange(ts)
    x = tx[:, None, None] * ts + p[None, None, :]  # [n, 1, ts]
    y = ty[:, None, None] * ts + p[None, :, None]  # [n, ts, 1]
    inside = (x < W) & (y < H)
    dx = means2d[gid, 0, None, None] - (x.float() + PIXEL_CENTER)
    dy = means2d[gid, 1, None, None] - (y.float() + PIXEL_CENTER)
    a, b, c = (conics[gid, k, None, None] for k in range(3))
    sigma = 0.5 * (a * dx * dx + c * dy * dy) + b * dx * dy
    alpha = torch.clamp_max(opacities[gid, None, None] * torch.exp(-sigma), ALPHA_CLAMP)
    return (inside & (sigma >= 0) & (alpha >= ALPHA_SKIP)).flatten(1).any(1)


def on_the_threshold(n, W, H, ts, seed):
    """Gaussians whose float32 alpha is within a relative 1e-8 .. 1e-2 (either side) of 1/255
    at the corner pixel of a tile where their sigma over the tile is least: means2d [n, 2],
    radii [n, 2] (boxes that hold that tile), conics [n, 3], opacities [n], float32.

    Half are needles (major sd 2 to 32 px, minor up to 0.5, blurred by a projection's eps2d
    0.3) aimed at the corner along their major axis, where sigma's terms are ~1e4 times
    sigma and float32 loses ~1e-3 of it to cancellation; half are round-ish."""
    g = torch.Generator().manual_seed(seed)
    f = torch.float64
    TW, TH = tile_grid(W, H, ts)
    s1 = torch.rand(n, generator=g, dtype=f) * 30 + 2
    s2 = torch.where(torch.arange(n) % 2 == 0, torch.rand(n, generator=g, dtype=f) * 0.5,
                     s1 * (0.5 + 0.5 * torch.rand(n, generator=g, dtype=f)))
    # the major axis points from the corner back towards smaller x and y, where the mean is:
    # the rest of the tile lies further along it, so the corner is the tile's least sigma
    theta = math.pi + torch.rand(n, generator=g, dtype=f) * math.pi / 2
    cos, sin = torch.cos(theta), torch.sin(theta)
    v1, v2 = s1 * s1 + 0.3, s2 * s2 + 0.3
    xx = v1 * cos * cos + v2 * sin * sin
    xy = (v1 - v2) * cos * sin
    yy = v1 * sin * sin + v2 * cos * cos
    det = xx * yy - xy * xy
    conics = torch.stack([yy / det, -xy / det, xx / det], -1).float()
    tx = torch.randint(1, TW, (n,), generator=g)
    ty = torch.randint(1, TH, (n,), generator=g)
    corner = torch.stack([tx * ts + PIXEL_CENTER, ty * ts + PIXEL_CENTER], -1).to(f)
    sigma = torch.rand(n, generator=g, dtype=f) * 4.5 + 0.5  # at the corner
    t = torch.sqrt(2 * sigma * v1)  # along the major axis, sigma = t² / (2 v1)
    means2d = (corner + t[:, None] * torch.stack([cos, sin], -1)).float()
    d = means2d.double() - corner
    a, b, c = conics.double().unbind(-1)
    sigma = 0.5 * (a * d[:, 0] ** 2 + c * d[:, 1] ** 2) + b * d[:, 0] * d[:, 1]
    rel = 10 ** (-8 + 6 * torch.rand(n, generator=g, dtype=f))
    rel = torch.where(torch.rand(n, generator=g) < 0.5, -rel, rel)
    opacities = (ALPHA_SKIP * torch.exp(sigma) * (1 + rel)).float()
    radii = torch.full((n, 2), 111, dtype=torch.int32)  # 3.33 sd of the largest
    return means2d, radii, conics, opacities


def dropped_but_lit(scene, W, H, ts):
    """(pairs of isect_tiles the reference's tight lists drop, how many of them the float32
    rasterizer composites at some pixel)."""
    means2d, radii, conics, opacities = scene
    TW, TH = tile_grid(W, H, ts)
    gid, tx, ty = reference._box_pairs(means2d, radii, ts, TW, TH)
    keep = reference.tiles_reached(means2d, conics, opacities, gid, tx, ty, ts, W, H)
    lit = rasterizer_lights(means2d, conics, opacities, gid[~keep], tx[~keep], ty[~keep], ts,
                            W, H)
    return int((~keep).sum()), int(lit.sum())


def test_a_dropped_pair_is_never_composited(monkeypatch):
    W, H, ts = 97, 73, 16
    scene = on_the_threshold(300, W, H, ts, seed=1)
    dropped, lit = dropped_but_lit(scene, W, H, ts)
    assert dropped > 1000 and lit == 0
    # without the margins the exact-arithmetic decision drops pairs that float32 rounding
    # composites (the needles' sigma cancels): the margins are needed, the check has teeth
    monkeypatch.setattr(reference, "TILE_CONIC_SLACK", 0.0)
    monkeypatch.setattr(reference, "TILE_SIGMA_SLACK", 0.0)
    assert dropped_but_lit(scene, W, H, ts)[1] > 0


def test_a_dropped_pair_is_never_composited_on_random_scenes():
    W, H, ts = 53, 31, 16
    means2d, radii, depths, conics, opacities = projected((), 300, W, H, seed=8)
    dropped, lit = dropped_but_lit((means2d, radii, conics, opacities), W, H, ts)
    assert dropped > 100 and lit == 0


@pytest.mark.backends("torch", "cpu")
def test_validation(backend):
    means2d, radii, depths, conics, opacities = projected((1,), 5, 20, 11)
    TW, TH = tile_grid(20, 11, 4)
    args = (means2d, radii, depths, conics, opacities, 4)
    with pytest.raises(ValueError, match="needs more than"):
        isect_tiles_tight(*args, TW, TH, 21, 11, backend=backend)
    with pytest.raises(ValueError, match="conics"):
        isect_tiles_tight(means2d, radii, depths, conics[..., :2], opacities, 4, TW, TH, 20,
                          11, backend=backend)
    with pytest.raises(ValueError, match="opacities"):
        isect_tiles_tight(means2d, radii, depths, conics, opacities[..., :4], 4, TW, TH, 20,
                          11, backend=backend)
    with pytest.raises(TypeError):
        isect_tiles_tight(means2d, radii, depths, conics.double(), opacities, 4, TW, TH, 20,
                          11, backend=backend)
    bad = opacities.clone()
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="opacities"):
        isect_tiles_tight(means2d, radii, depths, conics, bad, 4, TW, TH, 20, 11,
                          backend=backend)
    # a grid larger than the image: its tiles past the edge have no pixel, so no pair
    counts, ids, _ = isect_tiles_tight(*args, TW + 2, TH + 1, 20, 11, backend=backend)
    tile = (ids >> 32) & ((1 << ((TW + 2) * (TH + 1)).bit_length()) - 1)
    assert bool(((tile % (TW + 2) < TW) & (tile // (TW + 2) < TH)).all()) and ids.numel()
