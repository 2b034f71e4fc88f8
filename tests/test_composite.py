"""The one-pass alpha composite (``data/composite.py``) gives the NumPy formula's float32 values,
bit for bit, for the stored forms the image cache holds."""

from __future__ import annotations

import numpy as np
import pytest

from tilesplat.data.composite import composite
from tilesplat.data.image_cache import StoredImage, image_to_tensors

BACKGROUNDS = [(0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.3, 0.71, 0.123456789)]


def numpy_formula(rgba: np.ndarray, background) -> tuple[np.ndarray, np.ndarray]:
    """What the loaders computed before: value / 255 in float32 (uint8), then the composite
    in float32 with NumPy's temporaries."""
    f = rgba.astype(np.float32) / np.float32(255.0) if rgba.dtype == np.uint8 else rgba
    alpha = f[:, :, 3:4]
    bg = np.asarray(background, dtype=np.float32)
    rgb = f[:, :, :3] * alpha + bg * (1.0 - alpha)
    return np.ascontiguousarray(rgb, np.float32), np.ascontiguousarray(alpha, np.float32)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(
        a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("shape", [(1, 1, 4), (7, 13, 4), (64, 3, 4), (0, 5, 4)])
@pytest.mark.parametrize("background", BACKGROUNDS)
def test_composite_is_the_numpy_formula(shape, background):
    rng = np.random.default_rng(sum(shape))
    u8 = rng.integers(0, 256, shape, dtype=np.uint8)
    u8.reshape(-1, 4)[:4, 3] = [0, 255, 1, 254][: u8.reshape(-1, 4).shape[0]]  # alpha's ends
    f32 = rng.random(shape, dtype=np.float32)
    for image in (u8, f32):
        rgb, alpha = composite(image, background)
        ref_rgb, ref_alpha = numpy_formula(image, background)
        assert same_bits(rgb, ref_rgb)
        assert same_bits(alpha, ref_alpha)


def test_stored_images_and_image_to_tensors_keep_their_values():
    rng = np.random.default_rng(3)
    u8 = rng.integers(0, 256, (31, 17, 4), dtype=np.uint8)
    f32 = rng.random((31, 17, 4), dtype=np.float32)
    bg = (0.25, 0.5, 1.0)
    for data in (u8, f32):
        held = data.copy()
        rgb, alpha = StoredImage(data, bg).tensors()
        ref_rgb, ref_alpha = numpy_formula(data, bg)
        assert same_bits(rgb.numpy(), ref_rgb) and same_bits(alpha.numpy(), ref_alpha)
        rgb += 1.0  # the caller's tensors are its own: the cached pixels stay as they were
        assert np.array_equal(data, held)
    rgb, alpha = image_to_tensors(f32, bg)
    ref_rgb, ref_alpha = numpy_formula(f32, bg)
    assert same_bits(rgb.numpy(), ref_rgb) and same_bits(alpha.numpy(), ref_alpha)
    # float64 keeps NumPy's path (its products are rounded once, at the end)
    rgb64, _ = image_to_tensors(f32.astype(np.float64), bg)
    assert rgb64.dtype == rgb.dtype and np.allclose(rgb64.numpy(), ref_rgb, atol=1e-6)


@pytest.mark.parametrize("image, message", [
    (np.zeros((4, 4, 3), np.uint8), r"expected an image \[H, W, 4\], got shape \(4, 4, 3\)"),
    (np.zeros((4, 4, 4), np.float64), "expected a uint8 or float32 image, got float64"),
])
def test_composite_names_what_it_expected(image, message):
    with pytest.raises(ValueError, match=message):
        composite(image, (0.0, 0.0, 0.0))
