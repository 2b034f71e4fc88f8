"""``PngCompression`` (gsplat 1.5.3's codec): round trip within the quantisation, gsplat's
layout both ways (gsplat's decompress reads tilesplat's files; tilesplat's reads files
written by gsplat's own PNG writers), the crop to a square, the grid sort's smaller PNGs."""

from __future__ import annotations

import importlib.util
import json
import math
import warnings

import pytest
import torch

from tilesplat.compression import PngCompression
from tilesplat.compression.grid_sort import grid_sort, morton_order

HAS_GSPLAT_PNG = all(importlib.util.find_spec(m) is not None for m in ("gsplat", "imageio"))


def _splats(n: int, seed: int = 0, sh_rest: int = 15) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "means": torch.randn(n, 3, generator=g) * 3,
        "scales": torch.randn(n, 3, generator=g) - 4,
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g),
        "shN": torch.randn(n, sh_rest, 3, generator=g) * 0.1,
    }


def _log(x: torch.Tensor) -> torch.Tensor:
    return torch.sign(x) * torch.log1p(x.abs())


def _check_round_trip(splats, back, rows):
    """Every attribute within half a quantisation step of its range (means in the log space
    they are quantised in; shN: each row its own centroid when N <= 65536, 6 bits)."""
    def step(x, levels, dims):
        return (x.amax(dim=dims) - x.amin(dim=dims)) / levels / 2 + 1e-6

    kept = {k: v[rows] for k, v in splats.items()}
    lt = _log(kept["means"])
    assert (_log(back["means"]) - lt).abs().le(step(lt, 65535, 0)).all()
    q = torch.nn.functional.normalize(kept["quats"], dim=-1)
    assert (back["quats"] - q).abs().le(step(q, 255, 0)).all()
    for k in ("scales", "opacities", "sh0"):
        x = kept[k].reshape(len(rows), -1)
        err = (back[k].reshape(len(rows), -1) - x).abs()
        assert err.le(step(x, 255, 0)).all(), k
    if kept["shN"].numel():
        x = kept["shN"]
        assert (back["shN"] - x).abs().max() <= step(x, 63, None) * 1.01
    for k in splats:
        assert back[k].dtype == splats[k].dtype and back[k].shape[1:] == splats[k].shape[1:]


@pytest.mark.parametrize("use_sort", [False, True])
def test_round_trip_within_the_quantisation(tmp_path, use_sort):
    n = 400  # a square: nothing cropped
    splats = _splats(n)
    splats["row"] = torch.arange(n)  # any other key: npz, lossless
    before = {k: v.clone() for k, v in splats.items()}
    PngCompression(use_sort=use_sort, verbose=False).compress(str(tmp_path), splats)
    assert all(torch.equal(splats[k], before[k]) for k in splats)  # the caller's dict kept
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["means_l.png", "means_u.png", "meta.json", "opacities.png", "quats.png",
                     "row.npz", "scales.png", "sh0.png", "shN.npz"]
    back = PngCompression().decompress(str(tmp_path))
    rows = back["row"]
    assert torch.equal(rows.sort().values, torch.arange(n))
    assert use_sort or torch.equal(rows, torch.arange(n))
    _check_round_trip(splats, back, rows)


def test_a_count_not_square_drops_the_lowest_opacities(tmp_path):
    n = 110  # 10 x 10 kept
    splats = _splats(n, seed=1, sh_rest=0)  # SH degree 0: shN [N, 0, 3] round-trips empty
    splats["row"] = torch.arange(n)
    with pytest.warns(UserWarning, match="dropped the 10 of lowest opacity"):
        PngCompression(verbose=False).compress(str(tmp_path), splats)
    back = PngCompression().decompress(str(tmp_path))
    dropped = torch.argsort(splats["opacities"])[:10]
    assert set(back["row"].tolist()) == set(range(n)) - set(dropped.tolist())
    assert back["shN"].shape == (100, 0, 3)
    _check_round_trip(splats, back, back["row"])


def test_invalid_splats_are_one_line_value_errors(tmp_path):
    good = _splats(9)
    cases = [
        ({k: v for k, v in good.items() if k != "sh0"}, "missing \\['sh0'\\]"),
        ({**good, "opacities": good["opacities"][:5]}, "one row per Gaussian"),
        ({**good, "quats": good["quats"][:, :3]}, "quats.*must be \\[N, 4\\]"),
        ({**good, "scales": [1, 2, 3]}, "scales.*must be a tensor"),
    ]
    for splats, match in cases:
        with pytest.raises(ValueError, match=match) as e:
            PngCompression(verbose=False).compress(str(tmp_path), splats)
        assert "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError, match="meta.json"):
        PngCompression().decompress(str(tmp_path / "nothing"))


@pytest.mark.skipif(not HAS_GSPLAT_PNG, reason="gsplat and imageio (the oracle) not installed")
def test_gsplat_decompress_reads_our_files(tmp_path):
    from gsplat.compression.png_compression import PngCompression as GsplatPng

    splats = _splats(256, seed=2)
    PngCompression(verbose=False).compress(str(tmp_path), splats)
    ours = PngCompression().decompress(str(tmp_path))
    theirs = GsplatPng().decompress(str(tmp_path))
    assert set(ours) == set(theirs)
    for k in ours:  # gsplat reads mins/maxs as float32: one float32 rounding apart
        torch.testing.assert_close(theirs[k], ours[k], atol=1e-5, rtol=1e-5, msg=k)


@pytest.mark.skipif(not HAS_GSPLAT_PNG, reason="gsplat and imageio (the oracle) not installed")
def test_we_read_files_from_gsplat_writers(tmp_path):
    """gsplat's compress needs plas and torchpq (CUDA); its PNG and npz writers do not: the
    files they write, with their meta, decompress here to what gsplat's decompress gives."""
    from gsplat.compression import png_compression as gp

    splats = _splats(144, seed=3)
    del splats["shN"]  # gsplat's k-means writer needs torchpq (CUDA)
    splats["means"] = _log(splats["means"])
    splats["quats"] = torch.nn.functional.normalize(splats["quats"], dim=-1)
    splats["extra"] = torch.randn(144, 2)
    meta = {}
    for k, v in splats.items():
        fn = {"means": gp._compress_png_16bit, "extra": gp._compress_npz}.get(
            k, gp._compress_png)
        meta[k] = fn(str(tmp_path), k, v, n_sidelen=12)
        meta[k]["shape"] = list(meta[k]["shape"])
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    ours = PngCompression().decompress(str(tmp_path))
    theirs = gp.PngCompression().decompress(str(tmp_path))
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], atol=1e-6, rtol=1e-6, msg=k)


def test_grid_sort_is_a_permutation_that_smooths_the_grid():
    """A smooth field shuffled: the sort's grid is far smoother than the shuffle, and than
    the Morton start alone; the same input gives the same order."""
    side = 24
    g = torch.Generator().manual_seed(4)
    u, v = torch.meshgrid(torch.linspace(0, 1, side), torch.linspace(0, 1, side),
                          indexing="ij")
    field = torch.stack([u, v, torch.sin(3 * u) * v, u * v], -1).reshape(-1, 4)
    field = field[torch.randperm(side * side, generator=g)]

    def roughness(order):
        grid = field[order].reshape(side, side, -1)
        return float((grid[1:] - grid[:-1]).abs().mean() + (grid[:, 1:] - grid[:, :-1]).abs()
                     .mean())

    order = grid_sort(field)
    assert torch.equal(order.sort().values, torch.arange(side * side))
    assert torch.equal(order, grid_sort(field))
    start = grid_sort(field, sweeps=0)
    assert roughness(order) < 0.8 * roughness(start) < 0.5 * roughness(torch.arange(side**2))
    with pytest.raises(ValueError, match="square"):
        grid_sort(field[:-1])
    assert torch.equal(morton_order(torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])),
                       torch.tensor([1, 2, 0]))


def test_the_sort_makes_smaller_pngs(tmp_path):
    """Garden points shuffled (positions, colours and sizes that vary smoothly in space, as a
    trained model's do; rotations and opacities constant): the sorted images are smaller by
    more than 10 %. docs/formats.md has the whole garden model's numbers."""
    from tilesplat.data.scenes import load_garden

    scene = load_garden(max_points=4096)
    n = math.isqrt(scene.num_gaussians) ** 2
    shuffle = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    size = scene.scales[:n].log().mean(-1, True).expand(n, 3)
    splats = {"means": scene.means[:n], "scales": size,
              "quats": torch.tensor([1.0, 0, 0, 0]).expand(n, 4), "opacities": torch.zeros(n),
              "sh0": scene.colors[:n, None], "shN": torch.zeros(n, 0, 3)}
    splats = {k: v[shuffle] for k, v in splats.items()}
    sizes = {}
    for use_sort in (False, True):
        out = tmp_path / str(use_sort)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a square: no crop warning
            PngCompression(use_sort=use_sort, verbose=False).compress(str(out), splats)
        sizes[use_sort] = sum(p.stat().st_size for p in out.glob("*.png"))
    assert sizes[True] < 0.9 * sizes[False], sizes


def test_coherence_weights_ignore_what_no_order_smooths():
    """The swaps weigh a column by how smooth the start made it: ~1 for a smooth field, ~0
    for noise (random rotations in a model), which would only pull the swaps around."""
    from tilesplat.compression.grid_sort import _coherence

    side = 32
    u, _ = torch.meshgrid(torch.linspace(0, 1, side), torch.linspace(0, 1, side),
                          indexing="ij")
    noise = torch.rand((side, side), generator=torch.Generator().manual_seed(5))
    w = _coherence(torch.stack([u, noise], -1))
    assert w[0] > 0.8 and w[1] < 0.1, w
