"""Bad input gets a clear error naming the argument, what was expected and what came."""

import pytest
import torch

import tilesplat
from helpers import cameras, random_gaussians, tile_grid


@pytest.fixture()
def raster_inputs():
    n, C, W, H = 20, 1, 20, 12
    means, quats, scales, opac, colors = random_gaussians(n, seed=1)
    view, K = cameras(C, W, H)
    radii, m2d, depths, conics, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, W, H, backend="torch")
    tw, th = tile_grid(W, H, 16)
    _, ids, flat = tilesplat.isect_tiles(m2d, radii, depths, 16, tw, th, backend="torch")
    offsets = tilesplat.isect_offset_encode(ids, C, tw, th, backend="torch")
    return dict(means2d=m2d, conics=conics, colors=colors[None], opacities=opac[None],
                image_width=W, image_height=H, tile_size=16, isect_offsets=offsets,
                flatten_ids=flat, backend="torch")


def test_wrong_shape_names_argument(raster_inputs):
    raster_inputs["means2d"] = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"expected means2d \[\.\.\., N, 2\].*got \(4, 3\)"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_int_dtype_rejected(raster_inputs):
    raster_inputs["conics"] = raster_inputs["conics"].to(torch.int64)
    with pytest.raises(TypeError, match="conics of dtype float32 or float64"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_mixed_float_dtypes_rejected(raster_inputs):
    raster_inputs["colors"] = raster_inputs["colors"].double()
    with pytest.raises(TypeError, match="mixed float dtypes.*colors is torch.float64"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_non_contiguous_inputs_are_handled(raster_inputs):
    ref = tilesplat.rasterize_to_pixels(**raster_inputs)[0]
    c = raster_inputs["colors"]
    strided = torch.zeros(*c.shape[:-1], 6)[..., ::2]
    strided.copy_(c)
    assert not strided.is_contiguous()
    raster_inputs["colors"] = strided
    assert torch.equal(tilesplat.rasterize_to_pixels(**raster_inputs)[0], ref)


def test_wrong_device_rejected(raster_inputs):
    raster_inputs["colors"] = raster_inputs["colors"].to("meta")
    with pytest.raises(ValueError, match="different devices.*colors is on meta"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_offsets_not_sorted(raster_inputs):
    off = raster_inputs["isect_offsets"].clone()
    off.view(-1)[0] = off.view(-1)[1] + 1
    raster_inputs["isect_offsets"] = off
    with pytest.raises(ValueError, match="isect_offsets"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_offsets_out_of_range(raster_inputs):
    off = raster_inputs["isect_offsets"].clone()
    off.view(-1)[-1] = raster_inputs["flatten_ids"].numel() + 5
    raster_inputs["isect_offsets"] = off
    with pytest.raises(ValueError, match=r"isect_offsets in \[0, "):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_flatten_ids_out_of_range(raster_inputs):
    flat = raster_inputs["flatten_ids"].clone()
    flat[0] = 10_000
    raster_inputs["flatten_ids"] = flat
    with pytest.raises(ValueError, match=r"flatten_ids in \[0, 20\)"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


@pytest.mark.parametrize("arg", ["image_width", "image_height", "tile_size"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_non_positive_sizes(raster_inputs, arg, value):
    raster_inputs[arg] = value
    with pytest.raises(ValueError, match=f"expected {arg} to be a positive integer"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


def test_grid_must_cover_image(raster_inputs):
    raster_inputs["image_width"] = 40
    with pytest.raises(ValueError, match="does not cover"):
        tilesplat.rasterize_to_pixels(**raster_inputs)


@pytest.mark.parametrize("degree", [-1, 5])
def test_sh_degree_out_of_range(degree):
    with pytest.raises(ValueError, match="degrees_to_use"):
        tilesplat.spherical_harmonics(degree, torch.zeros(3, 3), torch.zeros(3, 25, 3))


def test_sh_too_few_coefficients():
    with pytest.raises(ValueError, match=r"K >= 9 for degree 2, got K = 4"):
        tilesplat.spherical_harmonics(2, torch.zeros(3, 3), torch.zeros(3, 4, 3))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_inf_rejected_and_switch(raster_inputs, bad):
    raster_inputs["opacities"] = raster_inputs["opacities"].clone()
    raster_inputs["opacities"][0, 3] = bad
    with pytest.raises(ValueError, match="opacities contains 1 NaN or Inf"):
        tilesplat.rasterize_to_pixels(**raster_inputs)
    tilesplat.set_check_finite(False)
    try:
        tilesplat.rasterize_to_pixels(**raster_inputs)  # no check: runs
    finally:
        tilesplat.set_check_finite(None)


def test_finite_check_large_values_and_broadcast_inputs():
    # finite values whose float32 sum overflows are accepted (the one-pass check falls back)
    tilesplat.spherical_harmonics(0, torch.ones(4, 3), torch.full((4, 1, 3), 3e38))
    # a NaN in a broadcast (expanded) tensor is found, and counted once per stored value
    coeffs = torch.zeros(1, 4, 3)
    coeffs[0, 2, 1] = float("nan")
    with pytest.raises(ValueError, match="coeffs contains 1 NaN or Inf"):
        tilesplat.spherical_harmonics(1, torch.ones(5, 3), coeffs.expand(5, 4, 3))
    with pytest.raises(ValueError, match="dirs contains 2 NaN or Inf"):
        tilesplat.spherical_harmonics(0, torch.tensor([[1.0, -float("inf"), 0.0]] * 2),
                                      torch.zeros(2, 1, 3))


def test_the_steps_deferred_check_is_exact():
    """Inside the trainer's step the check records whether each tensor is finite (on the CPU
    by its sum, and by its extremes, aminmax, where the sum is not finite): a NaN, Inf or
    -Inf at any position of an odd-sized tensor is flagged, in float32, float64 and
    float16; finite values whose sum overflows (float32 and float64) are not; a bad tensor
    is named once, and the good ones not at all."""
    from tilesplat.ops.deferred_checks import FiniteFlag, deferred_finite_checks
    from tilesplat.ops.validation import check_finite

    def bad_names(**named):
        got = []
        for reads_free in (False, True):  # a device's step, and the CPU's (sums first)
            flag = FiniteFlag(reads_free=reads_free)
            with deferred_finite_checks(flag):
                check_finite(named)
            found = float(flag.found_inf(torch.device("cpu")))
            got.append(flag.bad_names())
            assert found == float(bool(got[-1]))
        assert got[0] == got[1]
        return got[0]

    for dtype in (torch.float32, torch.float64, torch.float16):
        for bad in (float("nan"), float("inf"), -float("inf")):
            for i in range(37):
                t = torch.linspace(-2.0, 2.0, 37, dtype=dtype)
                t[i] = bad
                assert bad_names(a=torch.ones(3), b=t, c=None) == ["b"], (dtype, bad, i)
    assert bad_names(x=torch.full((1000,), 3e38), y=torch.full((9,), 1.7e308,
                                                                 dtype=torch.float64)) == []
    both = torch.tensor([float("nan"), 1.0, float("inf")])
    assert bad_names(p=both, q=both.clone()) == ["p", "q"]


def test_projection_errors():
    means, quats, scales, opac, _ = random_gaussians(5)
    view, K = cameras(1, 10, 10)
    with pytest.raises(ValueError, match="covars, or both quats and scales"):
        tilesplat.fully_fused_projection(means, None, None, scales, view, K, 10, 10)
    with pytest.raises(ValueError, match=r"expected Ks \[\.\.\., C, 3, 3\]"):
        tilesplat.fully_fused_projection(means, None, quats, scales, view, K[:, :2], 10, 10)
    with pytest.raises(ValueError, match="camera_model"):
        tilesplat.fully_fused_projection(means, None, quats, scales, view, K, 10, 10,
                                         camera_model="ftheta")
    with pytest.raises(ValueError, match="far_plane > near_plane"):
        tilesplat.fully_fused_projection(means, None, quats, scales, view, K, 10, 10,
                                         near_plane=5.0, far_plane=1.0)


def test_rasterization_errors():
    means, quats, scales, opac, colors = random_gaussians(5)
    view, K = cameras(2, 10, 10)
    with pytest.raises(ValueError, match="render_mode"):
        tilesplat.rasterization(means, quats, scales, opac, colors, view, K, 10, 10,
                                render_mode="RGBD")
    with pytest.raises(ValueError, match=r"expected colors \[\.\.\., N, K, 3\]"):
        tilesplat.rasterization(means, quats, scales, opac, colors, view, K, 10, 10,
                                sh_degree=1)
    with pytest.raises(ValueError, match=r"expected opacities \[\.\.\., N\] \(with"):
        tilesplat.rasterization(means, quats, scales, opac[:3], colors, view, K, 10, 10)
    with pytest.raises(ValueError, match=r"with_ut=True\) needs quats and scales"):
        tilesplat.rasterization(means, quats, scales, opac, colors, view, K, 10, 10,
                                with_ut=True, covars=torch.eye(3).expand(5, 3, 3) * 0.01)
    with pytest.raises(ValueError, match="backward_scheme"):
        tilesplat.rasterization(means, quats, scales, opac, colors, view, K, 10, 10,
                                backward_scheme="per_tile")


def test_isect_errors():
    m2d = torch.zeros(1, 3, 2)
    with pytest.raises(TypeError, match="radii of dtype int32 or int64"):
        tilesplat.isect_tiles(m2d, torch.zeros(1, 3, 2), torch.ones(1, 3), 16, 2, 2)
    with pytest.raises(ValueError, match="isect_ids sorted"):
        tilesplat.isect_offset_encode(torch.tensor([5, 1], dtype=torch.int64), 1, 2, 2)


def test_isect_offset_encode_rejects_bad_keys():
    bits = (4 * 3).bit_length()  # a 4 x 3 tile grid

    def key(img, tile, depth=0):
        return (img << (32 + bits)) | (tile << 32) | depth

    good = torch.tensor([key(0, 1), key(0, 5), key(1, 0)], dtype=torch.int64)
    offsets = tilesplat.isect_offset_encode(good, 2, 4, 3)
    assert offsets.shape == (2, 3, 4) and int(offsets[1, 0, 0]) == 2
    with pytest.raises(ValueError, match="sorted ascending"):
        tilesplat.isect_offset_encode(good.flip(0), 2, 4, 3)
    with pytest.raises(ValueError, match=r"images outside \[0, 1\)"):
        tilesplat.isect_offset_encode(good, 1, 4, 3)
    with pytest.raises(ValueError, match="tiles outside the 4×3 grid"):
        tilesplat.isect_offset_encode(torch.tensor([key(0, 12)], dtype=torch.int64), 1, 4, 3)
