"""Blender / NeRF-synthetic datasets: loader conventions, compositing, downscale, errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from tilesplat.data.dataset import detect_layout, load_dataset
from tilesplat.io.images import read_image, write_png


def _c2w_gl(eye, target=(0.0, 0.0, 0.0)) -> list[list[float]]:
    """Camera-to-world in OpenGL axes (x right, y up, z backward), z-up world."""
    eye = np.asarray(eye, float)
    back = eye - np.asarray(target)
    back /= np.linalg.norm(back)
    right = np.cross([0.0, 0.0, 1.0], back)
    right /= np.linalg.norm(right)
    up = np.cross(back, right)
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = right, up, back, eye
    return m.tolist()


def make_blender(
    root: Path,
    n_train: int = 3,
    n_test: int = 2,
    w: int = 8,
    h: int = 6,
    suffix: str = "",
    extra: dict | None = None,
) -> dict[str, np.ndarray]:
    """A tiny dataset of random RGBA images; returns the images by stem."""
    rng = np.random.default_rng(0)
    images = {}
    for split, n in (("train", n_train), ("test", n_test)):
        (root / split).mkdir(parents=True, exist_ok=True)
        frames = []
        for i in range(n):
            img = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
            write_png(root / split / f"r_{i}.png", img)
            images[f"{split}/r_{i}"] = img.astype(np.float32) / 255
            eye = (3 * math.cos(i), 3 * math.sin(i), 1.0 + 0.2 * i)
            frames.append(
                {"file_path": f"./{split}/r_{i}{suffix}", "transform_matrix": _c2w_gl(eye)}
            )
        meta = {"camera_angle_x": 0.8, "frames": frames, **(extra or {})}
        (root / f"transforms_{split}.json").write_text(json.dumps(meta))
    return images


def test_conventions_and_compositing(tmp_path):
    images = make_blender(tmp_path)
    assert detect_layout(tmp_path) == "blender"
    ds = load_dataset(tmp_path)
    assert ds.kind == "blender" and ds.points is None and ds.points_rgb is None
    assert ds.background == (1.0, 1.0, 1.0)
    assert [f.name for f in ds.train] == ["r_0", "r_1", "r_2"] and len(ds.test) == 2
    f = ds.train[1]
    src = images["train/r_1"]
    assert f.image.shape == (6, 8, 3) and f.alpha.shape == (6, 8, 1)
    assert f.image.dtype == f.alpha.dtype == torch.float32
    expected = src[:, :, :3] * src[:, :, 3:] + (1 - src[:, :, 3:])
    np.testing.assert_allclose(f.image.numpy(), expected, atol=1e-6)
    np.testing.assert_array_equal(f.alpha.numpy(), src[:, :, 3:])
    black = load_dataset(tmp_path, white_background=False)
    assert black.background == (0.0, 0.0, 0.0)
    np.testing.assert_allclose(
        black.train[1].image.numpy(), src[:, :, :3] * src[:, :, 3:], atol=1e-6
    )
    fx = 0.5 * 8 / math.tan(0.4)
    np.testing.assert_allclose(f.K.numpy(), [[fx, 0, 4], [0, fx, 3], [0, 0, 1]], rtol=1e-6)
    # OpenCV world-to-camera: the camera centre maps to 0, the look-at target lies ahead (+z)
    # on the optical axis, and world up (+z) points up in the image (-y in OpenCV axes).
    eye = np.array([3 * math.cos(1), 3 * math.sin(1), 1.2])
    vm = f.viewmat.double().numpy()
    np.testing.assert_allclose(vm[:3, :3] @ eye + vm[:3, 3], 0, atol=1e-5)
    target_cam = vm[:3, 3]
    assert target_cam[2] > 0 and np.allclose(target_cam[:2], 0, atol=1e-5)
    assert (vm[:3, :3] @ [0, 0, 1.0])[1] < 0
    np.testing.assert_allclose(vm[:3, :3] @ vm[:3, :3].T, np.eye(3), atol=1e-6)
    # all cameras look at the origin: it is the scene centre
    np.testing.assert_allclose(ds.scene_center.numpy(), 0, atol=1e-4)
    assert ds.scene_radius == pytest.approx(1.1 * math.hypot(3, 1.4), rel=1e-4)


def test_downscale_intrinsics_and_overrides(tmp_path):
    images = make_blender(
        tmp_path,
        suffix=".png",
        extra={"fl_x": 10.0, "fl_y": 11.0, "cx": 3.5, "cy": 2.5, "w": 8, "h": 6},
    )
    full = load_dataset(tmp_path)
    assert full.train[0].K.tolist() == [[10, 0, 3.5], [0, 11, 2.5], [0, 0, 1]]
    ds = load_dataset(tmp_path, downscale=2)
    f = ds.train[0]
    assert (f.width, f.height) == (4, 3)
    np.testing.assert_allclose(f.K.numpy(), [[5, 0, 1.75], [0, 5.5, 1.25], [0, 0, 1]])
    src = images["train/r_0"]
    comp = src[:, :, :3] * src[:, :, 3:] + (1 - src[:, :, 3:])
    pool = lambda a: a.reshape(3, 2, 4, 2, -1).mean((1, 3))
    np.testing.assert_allclose(f.image.numpy(), pool(comp), atol=1e-5)
    np.testing.assert_allclose(f.alpha.numpy(), pool(src[:, :, 3:]), atol=1e-6)


def test_without_test_json_splits_every_nth(tmp_path):
    make_blender(tmp_path, n_train=5, n_test=1)
    (tmp_path / "transforms_test.json").unlink()
    ds = load_dataset(tmp_path, test_every=2)
    assert [f.name for f in ds.test] == ["r_0", "r_2", "r_4"]
    assert [f.name for f in ds.train] == ["r_1", "r_3"]


def test_rgb_images_have_no_alpha(tmp_path):
    make_blender(tmp_path, n_train=1, n_test=1)
    write_png(tmp_path / "train/r_0.png", np.full((6, 8, 3), 0.25, np.float32))
    f = load_dataset(tmp_path).train[0]
    assert f.alpha is None and f.image.shape == (6, 8, 3)
    np.testing.assert_allclose(f.image.numpy(), 64 / 255, atol=1e-6)


def test_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        load_dataset(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="transforms_train.json"):
        load_dataset(tmp_path)
    with pytest.raises(ValueError, match="downscale"):
        load_dataset(tmp_path, downscale=0)
    make_blender(tmp_path)
    meta = json.loads((tmp_path / "transforms_test.json").read_text())

    (tmp_path / "transforms_test.json").write_text("{ not json")
    with pytest.raises(ValueError, match="transforms_test.json.*JSON"):
        load_dataset(tmp_path)
    bad = json.loads(json.dumps(meta))
    bad["frames"][1]["transform_matrix"] = [[1, 0, 0], [0, 1, 0]]
    (tmp_path / "transforms_test.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"transforms_test.json: frame 1.*4x4"):
        load_dataset(tmp_path)
    bad = {**meta, "w": 9, "h": 6}
    (tmp_path / "transforms_test.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"r_0.png: image is 8x6 but .*w=9"):
        load_dataset(tmp_path)
    bad = {k: v for k, v in meta.items() if k != "camera_angle_x"}
    (tmp_path / "transforms_test.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="camera_angle_x"):
        load_dataset(tmp_path)
    (tmp_path / "transforms_test.json").write_text(json.dumps(meta))

    write_png(tmp_path / "test/r_1.png", np.zeros((6, 9, 4), np.uint8))
    with pytest.raises(ValueError, match=r"test/r_1.png: image is 9x6 but the first train .* 8x6"):
        load_dataset(tmp_path)
    (tmp_path / "test/r_1.png").write_bytes(b"\x89PNG\r\n\x1a\ncorrupt")
    with pytest.raises(ValueError, match=r"test/r_1.png"):
        load_dataset(tmp_path)
    (tmp_path / "test/r_1.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"test/r_1"):
        load_dataset(tmp_path)
    assert read_image(tmp_path / "test/r_0.png").shape == (6, 8, 4)
