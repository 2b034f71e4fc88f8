"""Distorted and fisheye COLMAP captures train without a manual undistortion step.

The room (tilesplat.data.room) is ray cast through each lens of capture_helpers.LENSES from
the same 24 poses; the SIMPLE_RADIAL and OPENCV captures are undistorted on load to PINHOLE
(COLMAP's image_undistorter conventions) and must train to within 0.5 dB of the pinhole
twin, judged on the twin's test views (the same poses, the sharp ground truth); the text and
binary models load the same frames. The wide fisheye (79 degrees off axis, distortion beyond
the equidistant model) is undistorted to an equidistant fisheye and trained natively with the
rasterizer's fisheye camera.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from capture_helpers import psnr_on, shared_captures, train
from tilesplat.data.captures import render
from tilesplat.data.dataset import load_dataset
from tilesplat.data.undistort import Camera

TOLERANCE_DB = 0.5
# An undistorted frame against the room ray cast through the camera it trains as: ~37 dB
# (bilinear resampling); a remap that ignores the distortion gives 28-31 dB (fisheye: 20).
SEES_DB = 34.0

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by the workers of this session
    return shared_captures(base / "lens_captures")


@pytest.fixture(scope="module")
def pinhole(captures, tmp_path_factory):
    trainer, ds = train(captures["pinhole_txt"], tmp_path_factory.mktemp("pinhole"))
    return psnr_on(trainer, ds.test), ds


@pytest.mark.parametrize("lens", ["simple_radial", "opencv", "pinhole"])
def test_text_and_binary_models_load_the_same_frames(captures, lens):
    a = load_dataset(captures[f"{lens}_txt"])
    b = load_dataset(captures[f"{lens}_bin"])
    assert [f.name for f in a.train + a.test] == [f.name for f in b.train + b.test]
    for fa, fb in zip(a.train + a.test, b.train + b.test, strict=True):
        assert torch.equal(fa.viewmat, fb.viewmat) and torch.equal(fa.K, fb.K)
        assert torch.equal(fa.image, fb.image)
    assert torch.equal(a.points, b.points)


@pytest.mark.parametrize("lens", ["simple_radial_txt", "opencv_bin", "fisheye_bin"])
def test_undistorted_frames_see_what_their_camera_sees(captures, lens):
    ds = load_dataset(captures[lens], test_every=0)
    for f in ds.train[:3]:
        K = f.K.double().numpy()
        model = "FISHEYE" if f.camera_model == "fisheye" else "PINHOLE"
        truth, _ = render(f.viewmat.double().numpy(),
                          Camera(model, f.width, f.height, (K[0, 0], K[1, 1], K[0, 2], K[1, 2])))
        keep = np.ones((f.height, f.width), bool) if f.mask is None else f.mask.numpy()
        psnr = -10.0 * np.log10(((f.image.numpy() - truth) ** 2)[keep].mean())
        assert psnr > SEES_DB, (f.name, psnr)


@pytest.mark.parametrize("lens, fmt", [("simple_radial", "txt"), ("opencv", "bin")])
def test_distorted_capture_trains_within_half_a_db_of_its_pinhole_twin(
        captures, pinhole, lens, fmt, tmp_path, capsys):
    lines = []
    ds = load_dataset(captures[f"{lens}_{fmt}"], log=lines.append)
    assert "undistorted to PINHOLE" in lines[0], lines
    f = ds.train[0]
    assert f.camera_model == "pinhole" and (f.width, f.height) != (80, 60)
    trainer, _ = train(ds, tmp_path / "run")
    twin_psnr, twin = pinhole
    got = psnr_on(trainer, twin.test)
    own = psnr_on(trainer, ds.test)
    with capsys.disabled():
        print(f"\n{lens} ({fmt}): {got:.2f} dB on the pinhole twin's test views "
              f"({own:.2f} dB on its own), pinhole {twin_psnr:.2f} dB")
    assert got >= twin_psnr - TOLERANCE_DB, (got, twin_psnr)


def test_wide_fisheye_capture_trains_natively(captures, tmp_path, capsys):
    lines, starts = [], []
    ds = load_dataset(captures["fisheye_bin"], log=lines.append)
    assert "undistorted to an equidistant fisheye" in lines[0], lines
    assert all(f.camera_model == "fisheye" for f in ds.train + ds.test)
    trainer, _ = train(ds, tmp_path / "run", before=lambda t: starts.append(psnr_on(t, ds.test)))
    start, got = starts[0], psnr_on(trainer, ds.test)
    with capsys.disabled():
        print(f"\nfisheye: {start:.2f} dB at the start, {got:.2f} dB trained")
    assert got > 22.0 and got > start + 8.0, (start, got)


def test_undistortion_needs_no_sfm_extra(captures, tmp_path):
    # pycolmap and imageio-ffmpeg made unimportable: a distorted capture still loads
    data = tmp_path / "opencv"
    shutil.copytree(captures["opencv_bin"], data, ignore=shutil.ignore_patterns("tilesplat_cache"))
    code = ("import sys; sys.modules['pycolmap'] = None; sys.modules['imageio_ffmpeg'] = None\n"
            "from tilesplat.data.dataset import load_dataset\n"
            f"ds = load_dataset({str(data)!r})\n"
            "f = ds.train[0]; print(f.camera_model, f.width, f.height)\n"
            "assert 'pycolmap' not in sys.modules or sys.modules['pycolmap'] is None\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["pinhole", "81", "60"]
