"""Image I/O: PNG writing (atomic) and reading as float32 in [0, 1]."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from tilesplat.io import images
from tilesplat.io.images import image_size, read_image, resize_image, to_uint8, write_png


def test_uint8_round_trip_is_exact(tmp_path):
    rng = np.random.default_rng(0)
    for c in (3, 4):
        img = rng.integers(0, 256, (7, 5, c), dtype=np.uint8)
        write_png(tmp_path / f"u{c}.png", img)
        back = read_image(tmp_path / f"u{c}.png")
        assert back.dtype == np.float32 and back.shape == (7, 5, c)
        np.testing.assert_array_equal(np.round(back * 255).astype(np.uint8), img)
        assert back.min() >= 0.0 and back.max() <= 1.0


def test_float_and_tensor_inputs_round_to_nearest(tmp_path):
    img = torch.tensor([[[0.0, 0.5, 1.0], [-0.2, 1.7, 0.502]]])  # [1, 2, 3], out of range clipped
    write_png(tmp_path / "f.png", img)
    back = np.asarray(Image.open(tmp_path / "f.png"))
    assert back.tolist() == [[[0, 128, 255], [0, 255, 128]]]
    assert to_uint8(np.full((2, 2), np.nan, np.float32)).max() == 0


@pytest.mark.parametrize("part", [1, 5, 1 << 16])
@pytest.mark.parametrize("channels", [1, 3, 4])
def test_quantisation_in_parts_is_the_whole_float64_one(monkeypatch, part, channels):
    """Parts of one pixel, of a size that leaves a remainder, and the default give what one
    float64 pass over the whole image gives: ties (k + 0.5) / 255 to even, NaN as 0, +-inf
    and out-of-range values clipped; float16/32/64 and a non-contiguous view."""
    monkeypatch.setattr(images, "QUANTISE_PIXELS", part)
    rng = np.random.default_rng(part + channels)
    base = rng.uniform(-0.1, 1.1, (13, 7, channels))
    base.flat[:8] = [np.nan, np.inf, -np.inf, 0.5 / 255, 1.5 / 255, 2.5 / 255, 254.5 / 255, 1.0]
    for arr in (base, base.astype(np.float32), base.astype(np.float16),
                base.astype(np.float32).transpose(1, 0, 2)):
        want = np.round(np.clip(np.nan_to_num(arr.astype(np.float64), nan=0.0), 0, 1) * 255)
        got = to_uint8(arr[:, :, 0] if channels == 1 and arr is base else arr)
        assert got.dtype == np.uint8 and got.shape == arr.shape
        np.testing.assert_array_equal(got, want.astype(np.uint8))


def test_grey_image_reads_as_rgb(tmp_path):
    Image.fromarray(np.array([[0, 255]], dtype=np.uint8)).save(tmp_path / "g.png")
    back = read_image(tmp_path / "g.png")
    assert back.shape == (1, 2, 3)
    assert back[0, 1].tolist() == [1.0, 1.0, 1.0]


def test_write_is_atomic_and_overwrites(tmp_path):
    write_png(tmp_path / "a.png", np.zeros((3, 3, 3), np.float32))
    write_png(tmp_path / "a.png", np.ones((3, 3, 3), np.float32))
    assert [p.name for p in tmp_path.iterdir()] == ["a.png"]
    assert read_image(tmp_path / "a.png").min() == 1.0


def test_bad_inputs(tmp_path):
    with pytest.raises(ValueError, match="shape"):
        write_png(tmp_path / "x.png", np.zeros((3, 3, 2)))
    with pytest.raises(ValueError, match="dtype"):
        write_png(tmp_path / "x.png", np.zeros((3, 3, 3), dtype=np.int32))
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError, match="missing.png"):
        read_image(tmp_path / "missing.png")
    write_png(tmp_path / "ok.png", np.random.default_rng(0).random((16, 16, 3)))
    raw = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "trunc.png").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="trunc.png"):
        read_image(tmp_path / "trunc.png")
    (tmp_path / "junk.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with pytest.raises(ValueError, match="junk.png"):
        read_image(tmp_path / "junk.png")


def test_resize_is_an_area_average():
    img = np.random.default_rng(1).random((6, 8, 4)).astype(np.float32)
    small = resize_image(img, 4, 3)
    expected = img.reshape(3, 2, 4, 2, 4).mean(axis=(1, 3))
    np.testing.assert_allclose(small, expected, atol=1e-6)


def test_image_size_reads_the_header(tmp_path):
    write_png(tmp_path / "a.png", np.zeros((3, 5, 4), np.uint8))
    assert image_size(tmp_path / "a.png") == (5, 3)
    with pytest.raises(FileNotFoundError, match="b.png"):
        image_size(tmp_path / "b.png")
    (tmp_path / "c.png").write_bytes(b"nothing")
    with pytest.raises(ValueError, match="c.png"):
        image_size(tmp_path / "c.png")
