"""COLMAP datasets: binary and text model readers, camera models, downscale, split, errors.

The test writes its own small COLMAP models, following https://colmap.github.io/format.html.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from tilesplat.data.colmap_format import (
    read_cameras_bin,
    read_images_bin,
    read_points3d_bin,
)
from tilesplat.data.dataset import load_dataset
from tilesplat.io.images import write_png

W, H = 16, 12
MODEL_IDS = {
    "SIMPLE_PINHOLE": 0,
    "PINHOLE": 1,
    "SIMPLE_RADIAL": 2,
    "OPENCV": 4,
    "OPENCV_FISHEYE": 5,
}


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    w1, x1, y1, z1 = a
    w2, x2, y2, z2 = b
    return np.array(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ]
    )


def _rotate(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """v rotated by the unit quaternion q, as q v q*."""
    qc = q * np.array([1, -1, -1, -1])
    return _quat_mul(_quat_mul(q, np.concatenate([[0.0], v])), qc)[1:]


def _scene(n_images: int = 10, n_points: int = 20, seed: int = 0):
    rng = np.random.default_rng(seed)
    qs = rng.normal(size=(n_images, 4))
    qs /= np.linalg.norm(qs, axis=1, keepdims=True)
    ts = rng.normal(size=(n_images, 3))
    names = [f"img_{i:02d}.png" for i in range(n_images)][::-1]  # listed out of order
    xyz = rng.normal(size=(n_points, 3))
    rgb = rng.integers(0, 256, (n_points, 3))
    return qs, ts, names, xyz, rgb


def write_model_bin(sparse: Path, cameras, qs, ts, names, xyz, rgb) -> None:
    """cameras: list of (id, model name, width, height, params)."""
    sparse.mkdir(parents=True, exist_ok=True)
    buf = struct.pack("<Q", len(cameras))
    for cid, model, w, h, params in cameras:
        buf += struct.pack("<iiQQ", cid, MODEL_IDS[model], w, h)
        buf += struct.pack(f"<{len(params)}d", *params)
    (sparse / "cameras.bin").write_bytes(buf)
    buf = struct.pack("<Q", len(names))
    for i, (q, t, name) in enumerate(zip(qs, ts, names, strict=True)):
        buf += struct.pack("<i4d3di", i + 1, *q, *t, cameras[i % len(cameras)][0])
        buf += name.encode() + b"\0"
        buf += struct.pack("<Q", 2) + struct.pack("<ddq", 1.5, 2.5, 7) * 2
    (sparse / "images.bin").write_bytes(buf)
    buf = struct.pack("<Q", len(xyz))
    for j, (p, c) in enumerate(zip(xyz, rgb, strict=True)):
        buf += struct.pack("<Q3d3Bd", j + 1, *p, *c, 0.5)
        buf += struct.pack("<Q", 3) + struct.pack("<ii", 1, 0) * 3
    (sparse / "points3D.bin").write_bytes(buf)


def write_model_txt(sparse: Path, cameras, qs, ts, names, xyz, rgb) -> None:
    sparse.mkdir(parents=True, exist_ok=True)
    lines = ["# Camera list with one line of data per camera:", "#   CAMERA_ID, MODEL, ..."]
    for cid, model, w, h, params in cameras:
        lines.append(f"{cid} {model} {w} {h} " + " ".join(repr(float(p)) for p in params))
    (sparse / "cameras.txt").write_text("\n".join(lines) + "\n")
    lines = ["# Image list with two lines of data per image:", "# Number of images: x"]
    for i, (q, t, name) in enumerate(zip(qs, ts, names, strict=True)):
        vals = " ".join(repr(float(v)) for v in (*q, *t))
        lines.append(f"{i + 1} {vals} {cameras[i % len(cameras)][0]} {name}")
        lines.append("" if i % 2 else "1.5 2.5 7 3.0 4.0 -1")  # empty points lines too
    (sparse / "images.txt").write_text("\n".join(lines) + "\n")
    lines = ["# 3D point list"]
    for j, (p, c) in enumerate(zip(xyz, rgb, strict=True)):
        lines.append(f"{j + 1} {' '.join(repr(float(v)) for v in p)} {c[0]} {c[1]} {c[2]} 0.5 1 0")
    (sparse / "points3D.txt").write_text("\n".join(lines) + "\n")


def write_images(root: Path, names, folder: str = "images", size=(W, H), seed: int = 1) -> dict:
    (root / folder).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images = {}
    for name in names:
        img = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        write_png(root / folder / name, img)
        images[name] = img.astype(np.float32) / 255
    return images


PINHOLE = [(1, "PINHOLE", W, H, [20.0, 22.0, 8.5, 6.25]), (2, "SIMPLE_PINHOLE", W, H, [18.0, 8, 6])]


@pytest.fixture(scope="module")
def model():
    return _scene()


def _make(root: Path, model, cameras=PINHOLE, fmt: str = "bin", sparse: str = "sparse/0"):
    qs, ts, names, xyz, rgb = model
    (write_model_bin if fmt == "bin" else write_model_txt)(root / sparse, cameras, *model)
    return write_images(root, names)


@pytest.mark.parametrize("fmt", ["bin", "txt"])
def test_load_colmap(tmp_path, model, fmt):
    images = _make(tmp_path, model, fmt=fmt)
    qs, ts, names, xyz, rgb = model
    ds = load_dataset(tmp_path)
    assert ds.kind == "colmap" and ds.background == (0.0, 0.0, 0.0)
    # sorted by name; every 8th (0 and 8) in test
    assert [f.name for f in ds.test] == ["img_00", "img_08"]
    assert [f.name for f in ds.train] == [f"img_{i:02d}" for i in range(10) if i % 8]
    for f in ds.train + ds.test:
        i = names.index(f.name + ".png")
        assert f.viewmat.dtype == torch.float32 and f.viewmat.shape == (4, 4)
        R, t = f.viewmat[:3, :3].double().numpy(), f.viewmat[:3, 3].double().numpy()
        v = np.array([0.3, -1.2, 2.0])
        np.testing.assert_allclose(R @ v, _rotate(qs[i], v), atol=1e-6)
        np.testing.assert_allclose(t, ts[i], atol=1e-6)
        assert f.viewmat[3].tolist() == [0, 0, 0, 1]
        cam = PINHOLE[i % 2]
        fx, fy, cx, cy = cam[4] if cam[1] == "PINHOLE" else [cam[4][0], *cam[4]]
        np.testing.assert_allclose(f.K.numpy(), [[fx, 0, cx], [0, fy, cy], [0, 0, 1]])
        assert (f.width, f.height) == (W, H) and f.alpha is None
        np.testing.assert_array_equal(f.image.numpy(), images[f.name + ".png"])
    np.testing.assert_allclose(ds.points.numpy(), xyz, atol=1e-6)
    np.testing.assert_allclose(ds.points_rgb.numpy() * 255, rgb, atol=1e-4)
    centers = np.stack([f.camera_center.numpy() for f in ds.train])
    np.testing.assert_allclose(ds.scene_center.numpy(), centers.mean(0), atol=1e-5)
    dists = np.linalg.norm(centers - centers.mean(0), axis=1)
    assert ds.scene_radius == pytest.approx(1.1 * dists.max(), rel=1e-5)


def test_bin_and_txt_agree_and_sparse_without_0(tmp_path, model):
    _make(tmp_path / "a", model, fmt="bin")
    _make(tmp_path / "b", model, fmt="txt", sparse="sparse")
    a, b = load_dataset(tmp_path / "a", test_every=3), load_dataset(tmp_path / "b", test_every=3)
    assert (
        [f.name for f in a.test]
        == [f.name for f in b.test]
        == ["img_00", "img_03", "img_06", "img_09"]
    )
    for fa, fb in zip(a.train + a.test, b.train + b.test, strict=True):
        assert torch.equal(fa.viewmat, fb.viewmat) and torch.equal(fa.K, fb.K)
    assert torch.equal(a.points, b.points)
    assert len(load_dataset(tmp_path / "a", test_every=0).test) == 0
    (tmp_path / "a/sparse/0/points3D.bin").write_bytes(struct.pack("<Q", 0))
    empty = load_dataset(tmp_path / "a")
    assert empty.points is None and empty.points_rgb is None


def test_downscale_resizes_or_uses_images_n(tmp_path, model):
    images = _make(tmp_path, model)
    ds = load_dataset(tmp_path, downscale=2)
    f = ds.train[0]
    assert (f.width, f.height) == (W // 2, H // 2)
    np.testing.assert_allclose(f.K.numpy(), [[10, 0, 4.25], [0, 11, 3.125], [0, 0, 1]])
    full = images[f.name + ".png"]
    np.testing.assert_allclose(f.image.numpy(), full.reshape(6, 2, 8, 2, 3).mean((1, 3)), atol=1e-6)
    small = write_images(tmp_path, model[2], folder="images_2", size=(W // 2, H // 2), seed=5)
    ds = load_dataset(tmp_path, downscale=2)
    np.testing.assert_array_equal(ds.train[0].image.numpy(), small[ds.train[0].name + ".png"])
    write_images(tmp_path, model[2][:1], folder="images_2", size=(W // 2 + 3, H // 2))
    with pytest.raises(ValueError, match="images_2"):
        load_dataset(tmp_path, downscale=2)


@pytest.mark.parametrize(
    "camera, kind, remapped",
    [
        # zero or negligible distortion (< 0.1 px anywhere): the image as it is
        ((1, "SIMPLE_RADIAL", W, H, [20.0, 8.0, 6.0, 0.0]), "pinhole", False),
        ((1, "OPENCV", W, H, [20.0, 21.0, 8.0, 6.0, 0, 0, 0, 0]), "pinhole", False),
        ((1, "SIMPLE_RADIAL", W, H, [20.0, 8.0, 6.0, 0.01]), "pinhole", False),
        ((1, "OPENCV_FISHEYE", W, H, [20.0, 21.0, 8.0, 6.0, 0, 0, 0, 0]), "fisheye", False),
        # real distortion: undistorted (the image size changes)
        ((1, "SIMPLE_RADIAL", W, H, [20.0, 8.0, 6.0, -0.3]), "pinhole", True),
        ((1, "OPENCV", W, H, [20.0, 21.0, 8.0, 6.0, 0.2, 0, 0.01, 0]), "pinhole", True),
    ],
)
def test_camera_models(tmp_path, model, camera, kind, remapped):
    _make(tmp_path, model, cameras=[camera], fmt="txt")
    lines = []
    f = load_dataset(tmp_path, log=lines.append).train[0]
    assert f.camera_model == kind and len(lines) >= 1 and camera[1] in lines[0]
    assert ((f.width, f.height) != (W, H)) == remapped
    assert ("undistorted" in lines[0]) == remapped
    if not remapped:
        assert f.K[0, 0] == 20.0 and f.K[0, 2] == 8.0


@pytest.mark.parametrize("model_name", ["RAD_TAN_THIN_PRISM_FISHEYE", "EQUIRECTANGULAR",
                                        "DIVISION"])
def test_unsupported_camera_models_are_refused_by_name(tmp_path, model, model_name):
    n = {"RAD_TAN_THIN_PRISM_FISHEYE": 16, "EQUIRECTANGULAR": 2, "DIVISION": 5}[model_name]
    _make(tmp_path, model, cameras=[(1, model_name, W, H, [20.0, 8.0, 6.0] + [0.0] * (n - 3)
                                     if n > 3 else [W, H])], fmt="txt")
    with pytest.raises(ValueError, match=rf"cameras\.txt: camera 1.*{model_name} is not supported"):
        load_dataset(tmp_path)


def test_truncated_binary_files_give_clear_errors(tmp_path, model):
    _make(tmp_path, model)
    sparse = tmp_path / "sparse/0"
    readers = {
        "cameras.bin": read_cameras_bin,
        "images.bin": read_images_bin,
        "points3D.bin": read_points3d_bin,
    }
    for fname, reader in readers.items():
        raw = (sparse / fname).read_bytes()
        reader(sparse / fname)  # intact
        bad = tmp_path / fname
        # truncation points spread over every field of every record (stride prime to the
        # record sizes), the last byte, and trailing junk
        for cut in [*range(0, len(raw), 7), len(raw) - 1]:
            bad.write_bytes(raw[:cut])
            with pytest.raises(ValueError, match=fname):
                reader(bad)
        bad.write_bytes(raw + b"\0")
        with pytest.raises(ValueError, match="unexpected bytes"):
            reader(bad)
    # a huge declared count is caught before any allocation
    (sparse / "points3D.bin").write_bytes(struct.pack("<Q", 2**60))
    with pytest.raises(ValueError, match="points3D.bin.*declares"):
        load_dataset(tmp_path)


def test_corrupt_text_and_bad_model_files(tmp_path, model):
    _make(tmp_path, model, fmt="txt")
    sparse = tmp_path / "sparse/0"
    good = (sparse / "images.txt").read_text()
    (sparse / "images.txt").write_text(good.replace("img_03.png", "").replace(" 2 img", " x img"))
    with pytest.raises(ValueError, match=r"images\.txt:\d+"):
        load_dataset(tmp_path)
    (sparse / "images.txt").write_text(good)
    (sparse / "cameras.txt").write_text("1 PINHOLE 16 12 20 22 8\n")  # 3 of 4 params
    with pytest.raises(ValueError, match=r"cameras\.txt:1"):
        load_dataset(tmp_path)
    (sparse / "cameras.txt").write_text("1 WEIRD 16 12 20\n")
    with pytest.raises(ValueError, match="unknown camera model 'WEIRD'"):
        load_dataset(tmp_path)
    (sparse / "cameras.txt").write_text("7 PINHOLE 16 12 20 22 8 6\n")
    with pytest.raises(ValueError, match=r"img_\d\d.png.* missing camera [12]"):
        load_dataset(tmp_path)
    (sparse / "cameras.txt").unlink()
    with pytest.raises(FileNotFoundError, match="sparse"):
        load_dataset(tmp_path)


def test_missing_or_wrong_images(tmp_path, model):
    _make(tmp_path, model)
    (tmp_path / "images/img_04.png").unlink()
    with pytest.raises(FileNotFoundError, match="img_04.png"):
        load_dataset(tmp_path)
    write_png(tmp_path / "images/img_04.png", np.zeros((H + 1, W, 3), np.uint8))
    with pytest.raises(ValueError, match=r"img_04.png.*16x13.*16x12"):
        load_dataset(tmp_path)
    (tmp_path / "images/img_04.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="img_04.png"):
        load_dataset(tmp_path)
