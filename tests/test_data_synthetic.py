"""The built-in synthetic scene: ray caster, dataset files, determinism, reuse."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import (
    BOUNDING_RADIUS,
    CAMERA_DISTANCE,
    MARKER,
    TINY,
    intersect,
    write_synthetic_dataset,
)

RED_SPHERE = (np.array([0.3, -0.28, 0.44]), 0.14)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_synthetic_dataset(tmp_path_factory.mktemp("tiny"), **TINY)


def test_ray_caster_hits():
    o = np.array([0.3, -0.28, 5.0])
    d = np.array([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0], [0.6, 0.0, -0.8]])
    hit = intersect(o, d)
    assert hit.t[0] == pytest.approx(5.0 - 0.44 - 0.14)  # top of the small red sphere
    assert hit.material[0] == 3 and np.allclose(hit.normal[0], [0, 0, 1])
    assert np.isinf(hit.t[1]) and hit.material[1] == -1  # pointing away
    # a horizontal ray at the pedestal's height hits its side face, normal facing the ray
    side = intersect(np.array([5.0, 0.0, -0.6]), np.array([[-1.0, 0.0, 0.0]]))
    assert side.t[0] == pytest.approx(5.0 - 0.55) and np.allclose(side.normal[0], [1, 0, 0])


def test_dataset_layout_and_conventions(tiny):
    ds = load_dataset(tiny)
    assert len(ds.train) == TINY["n_train"] and len(ds.test) == TINY["n_test"]
    assert ds.background == (1.0, 1.0, 1.0)
    np.testing.assert_allclose(ds.scene_center.numpy(), 0, atol=1e-4)
    assert ds.scene_radius == pytest.approx(1.1 * CAMERA_DISTANCE, rel=1e-4)
    red_visible = 0
    for f in ds.train + ds.test:
        assert (f.width, f.height) == (TINY["size"], TINY["size"])
        c = f.camera_center.double().numpy()
        assert c[2] > 0 and np.linalg.norm(c) == pytest.approx(CAMERA_DISTANCE, rel=1e-5)
        a = f.alpha[:, :, 0].numpy()
        assert a.max() == 1.0 and a.min() == 0.0 and ((a > 0) & (a < 1)).any()  # antialiased
        img = f.image.numpy()
        assert np.all(img[a == 0] == 1.0)  # composited on white
        # Alpha only inside the projected bounding sphere (conservative: its angular radius).
        vm, K = f.viewmat.double().numpy(), f.K.double().numpy()
        ys, xs = np.nonzero(a > 0)
        rays = np.linalg.inv(K) @ np.stack([xs + 0.5, ys + 0.5, np.ones_like(xs)])
        rays /= np.linalg.norm(rays, axis=0)
        to_origin = vm[:3, 3] / np.linalg.norm(vm[:3, 3])  # origin in camera frame, unit
        half_pix = 1.0 / K[0, 0]
        assert np.all(
            to_origin @ rays >= np.cos(np.arcsin(BOUNDING_RADIUS / CAMERA_DISTANCE) + 2 * half_pix)
        )
        # The point of the red sphere nearest to the camera projects onto a red pixel.
        p = RED_SPHERE[0] + RED_SPHERE[1] * 0.5 * (c - RED_SPHERE[0]) / np.linalg.norm(
            c - RED_SPHERE[0]
        )
        q = K @ (vm[:3, :3] @ p + vm[:3, 3])
        x, y = int(q[0] / q[2]), int(q[1] / q[2])
        r, g, b = img[y, x]
        red_visible += a[y, x] == 1.0 and r > g + 0.25 and r > b + 0.25
    assert red_visible >= 0.8 * (len(ds.train) + len(ds.test))


def test_deterministic_and_reused(tmp_path, tiny):
    small = {"n_train": 2, "n_test": 1, "size": 16}
    a = write_synthetic_dataset(tmp_path / "a", **small)
    b = write_synthetic_dataset(tmp_path / "b", **small)
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert len(files) == 6  # 3 PNGs, 2 transforms, 1 marker
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    other = write_synthetic_dataset(tmp_path / "c", **small, seed=1)
    assert (other / "train/r_0.png").read_bytes() != (a / "train/r_0.png").read_bytes()
    # reuse: a complete dataset with the same arguments is not rewritten
    stamps = {p: p.stat().st_mtime_ns for p in tiny.rglob("*")}
    assert write_synthetic_dataset(tiny, **TINY) == tiny
    assert {p: p.stat().st_mtime_ns for p in tiny.rglob("*")} == stamps
    # other arguments: rewritten; an incomplete one (image lost) is completed
    write_synthetic_dataset(a, n_train=3, n_test=1, size=16)
    assert len(load_dataset(a).train) == 3
    (a / "train/r_1.png").unlink()
    write_synthetic_dataset(a, n_train=3, n_test=1, size=16)
    assert (a / "train/r_1.png").is_file()
    # interrupted while writing (the marker still says incomplete): rewritten, not refused
    marker = json.loads((a / MARKER).read_text())
    (a / MARKER).write_text(json.dumps({**marker, "complete": False}))
    write_synthetic_dataset(a, n_train=3, n_test=1, size=16)
    assert json.loads((a / MARKER).read_text())["complete"] is True


def test_refuses_foreign_folder(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a tilesplat synthetic dataset"):
        write_synthetic_dataset(tmp_path, n_train=1, n_test=0, size=8)
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
