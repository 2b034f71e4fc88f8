"""``tilesplat prepare`` on bad input: one line on stderr, exit status 2, no traceback, no output
folder; and the staging of photos (EXIF orientation and focal length, sizes, formats)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image

from tilesplat.cli import main
from tilesplat.data.room import camera_poses as room_poses
from tilesplat.data.room import intrinsics as room_intrinsics
from tilesplat.data.room import render_view
from tilesplat.data.sfm import scan_photos, stage_photos


def _fails(capsys, args: list[str], *needles: str) -> str:
    assert main(["prepare", *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tilesplat prepare: error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _noise_photos(folder, n: int, size=(160, 120), seed: int = 0) -> None:
    """Independent noise images: full of SIFT features, none shared."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):
        coarse = rng.integers(0, 256, (size[1] // 4, size[0] // 4, 3), dtype=np.uint8)
        Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC).save(folder / f"n{i}.png")


def test_missing_and_empty_folders(tmp_path, capsys):
    _fails(capsys, [str(tmp_path / "nope"), str(tmp_path / "out")], "images folder not found")
    (tmp_path / "empty").mkdir()
    _fails(capsys, [str(tmp_path / "empty"), str(tmp_path / "out")], "no images", "it is empty")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("not a photo")
    _fails(capsys, [str(tmp_path / "docs"), str(tmp_path / "out")], "no images", "1 other")
    assert not (tmp_path / "out").exists()


def test_unreadable_files_are_named(tmp_path, capsys):
    photos = tmp_path / "photos"
    _noise_photos(photos, 4)
    (photos / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a JPEG")
    good = (photos / "n0.png").read_bytes()
    (photos / "truncated.png").write_bytes(good[: len(good) // 2])
    line = _fails(capsys, [str(photos), str(tmp_path / "out")], "2 of 6 images", "cannot be read")
    assert "broken.jpg" in line and "truncated.png" in line
    assert not (tmp_path / "out").exists()


def test_too_few_and_too_small_images(tmp_path, capsys):
    _noise_photos(tmp_path / "two", 2)
    _fails(capsys, [str(tmp_path / "two"), str(tmp_path / "o")], "at least 3")
    _noise_photos(tmp_path / "tiny", 3, size=(20, 16))
    _fails(capsys, [str(tmp_path / "tiny"), str(tmp_path / "o")], "smaller than 32 px")


def test_bad_options_and_a_used_output_folder(tmp_path, capsys):
    _noise_photos(tmp_path / "p", 3)
    _fails(capsys, [str(tmp_path / "p"), str(tmp_path / "o"), "--max-size", "10"], "max size")
    _fails(capsys, [str(tmp_path / "p"), str(tmp_path / "o"), "--min-registered", "0"], "min")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    _fails(capsys, [str(tmp_path / "p"), str(tmp_path / "used")], "not empty")
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"


def test_images_that_share_no_features(tmp_path, capsys):
    _noise_photos(tmp_path / "p", 5)
    _fails(capsys, [str(tmp_path / "p"), str(tmp_path / "o")], "share", "try:")
    assert not (tmp_path / "o").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["p"]  # the staging folder is gone


def test_blank_images(tmp_path, capsys):
    (tmp_path / "p").mkdir()
    for i in range(4):
        Image.new("RGB", (120, 90), (128, 128, 128)).save(tmp_path / "p" / f"b{i}.jpg")
    _fails(capsys, [str(tmp_path / "p"), str(tmp_path / "o")], "almost no features", "try:")


def test_too_few_registered(tmp_path, capsys):
    """4 room views (26 degrees apart) among 5 noise images: a model of under half is refused."""
    photos = tmp_path / "p"
    _noise_photos(photos, 5, size=(200, 150))
    K = room_intrinsics(240, 180)
    for i, viewmat in enumerate(room_poses(14)[:4]):
        img = render_view(viewmat, K, 240, 180)
        Image.fromarray((img * 255).round().astype(np.uint8)).save(photos / f"room{i}.png")
    line = _fails(capsys, [str(photos), str(tmp_path / "o")], "9 images", "try:")
    assert "registered only" in line or "no pair" in line


def test_missing_pycolmap_gives_the_install_line(tmp_path, capsys, monkeypatch):
    _noise_photos(tmp_path / "p", 3)
    monkeypatch.setitem(sys.modules, "pycolmap", None)  # import pycolmap -> ImportError
    _fails(capsys, [str(tmp_path / "p"), str(tmp_path / "o")], 'pip install "tilesplat[sfm]"')


def test_staging_applies_exif_orientation_and_keeps_the_focal_length(tmp_path):
    import pycolmap

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x010F], exif[0x0110] = "Canon", "Canon EOS 5D"
    exif[0x0112] = 6  # orientation: rotate 90 degrees clockwise to view
    exif.get_ifd(0x8769)[0xA405] = 28  # focal length in 35 mm film, as phones write it
    img.save(src / "rotated.jpg", exif=exif, quality=95)
    img.save(src / "plain.jpg", quality=95)
    img.save(src / "other.webp")
    photos = scan_photos(src)
    assert [(p.name, p.exif_focal) for p in photos] == [
        ("other.webp", None),
        ("plain.jpg", None),
        ("rotated.jpg", 28.0),
    ]
    out = tmp_path / "staged"
    out.mkdir()
    stage_photos(photos, out, max_size=200)
    staged = {p.name: (p.staged, p.staged_size) for p in photos}
    assert staged == {
        "other.webp": ("other.webp.png", (200, 150)),
        "plain.jpg": ("plain.jpg", (200, 150)),
        "rotated.jpg": ("rotated.jpg", (150, 200)),  # upright: portrait
    }
    with Image.open(out / "rotated.jpg") as pil:
        assert pil.size == (150, 200) and pil.getexif().get(0x0112, 1) == 1
    camera = pycolmap.infer_camera_from_image(out / "rotated.jpg")
    assert camera.has_prior_focal_length  # the EXIF focal length seeds the intrinsics
    assert camera.params[0] != pytest.approx(1.2 * 200)  # not COLMAP's guess without EXIF
    assert not pycolmap.infer_camera_from_image(out / "plain.jpg").has_prior_focal_length
    # a photo that needs no change is copied byte for byte
    (tmp_path / "copy").mkdir()
    stage_photos(photos[1:2], tmp_path / "copy", max_size=0)
    assert (tmp_path / "copy" / "plain.jpg").read_bytes() == (src / "plain.jpg").read_bytes()


@pytest.mark.parametrize("mode", ["RGBA", "P", "I;16"])
def test_staging_converts_other_modes(tmp_path, mode):
    src = tmp_path / "src"
    src.mkdir()
    rgb = np.random.default_rng(2).integers(0, 256, (64, 80, 3), dtype=np.uint8)
    if mode == "I;16":
        img = Image.fromarray(rgb[:, :, 0].astype(np.uint16) * 257)
    else:
        img = Image.fromarray(rgb).convert(mode)
    for i in range(3):
        img.save(src / f"im{i}.png")
    photos = scan_photos(src)
    out = tmp_path / "out"
    out.mkdir()
    stage_photos(photos, out, max_size=0)
    for p in photos:
        with Image.open(out / p.staged) as pil:
            assert pil.mode == "RGB" and pil.size == (80, 64)
            if mode == "I;16":  # the top byte, not clipped to white
                assert np.abs(np.asarray(pil)[:, :, 0].astype(int) - rgb[:, :, 0]).max() <= 1


def test_train_images_that_fail_leave_no_run_folder(tmp_path, capsys):
    _noise_photos(tmp_path / "p", 4)
    run = tmp_path / "run"
    assert main(["train", "--images", str(tmp_path / "p"), "--set", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilesplat train: error: structure-from-motion")
    assert not run.exists()
