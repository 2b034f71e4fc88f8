"""``tilesplat prepare clip.mp4 scene/``: a video written here through imageio-ffmpeg (the room
on a smooth walk, each frame beside a blurred copy of it) prepares and trains; the sharp frame
of each window is the one kept; a video that does not decode, or gives too few frames, fails
with one line and writes nothing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image, ImageFilter

from tilesplat.cli import main
from tilesplat.data.captures import orbit, pinhole_camera, render
from tilesplat.data.sfm.video import sharpness

W, H = 240, 180
PICKS = 24

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _write_video(path, frames, fps=12):
    import imageio_ffmpeg

    writer = imageio_ffmpeg.write_frames(str(path), (W, H), fps=fps, quality=9,
                                         macro_block_size=1, ffmpeg_log_level="error")
    writer.send(None)
    for f in frames:
        writer.send(np.ascontiguousarray(f))
    writer.close()
    return path


def _blur(frame):
    return np.asarray(Image.fromarray(frame).filter(ImageFilter.BoxBlur(3)))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    cam = pinhole_camera(W, H)
    frames = []
    for w, v in enumerate(orbit(PICKS)):
        img = np.round(render(v, cam)[0] * 255).astype(np.uint8)
        # a window of two frames: a blurred copy first (second in window 5), then the frame
        frames += [img, _blur(img)] if w == 5 else [_blur(img), img]
    return _write_video(tmp_path_factory.mktemp("video") / "clip.mp4", frames)


def test_video_prepares_keeping_the_sharp_frames_and_trains(clip, tmp_path, capsys):
    out = tmp_path / "scene"
    assert main(["prepare", str(clip), str(out), "--frames", str(PICKS), "--max-size", "0",
                 "--threads", "1"]) == 0
    report = json.loads((out / "prepare.json").read_text())
    video = report["video"]
    assert video["decoded"] == 2 * PICKS and len(video["picked"]) == PICKS
    sharp = [2 * w + 1 if w != 5 else 2 * w for w in range(PICKS)]
    assert video["picked"] == sharp
    assert report["options"]["matcher"] == "sequential" and report["options"]["images_dir"] == \
        str(clip)
    assert report["n_registered"] >= PICKS - 2, report["left_out"]
    assert not list(tmp_path.glob(".scene.*"))  # the frames' staging folder is gone
    run = tmp_path / "run"
    assert main(["train", "--data", str(out), "--set", "steps=150", "--set", "downscale=4",
                 "--set", "sh_degree=0", "--set", "refine_start=100000", "--set",
                 f"run_dir={run}", "--set", "progress=false", "--set", "lpips=false",
                 "--set", "save_ply=false"]) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    history = json.loads((run / "history.json").read_text())
    capsys.readouterr()
    assert metrics["psnr"] > 17.0 and history["loss"][-1] < 0.75 * history["loss"][0], metrics


def test_sharpness_ranks_blur_below_the_original():
    img = np.round(render(orbit(1)[0], pinhole_camera(W, H))[0] * 255).astype(np.uint8)
    assert sharpness(_blur(img)) < 0.5 * sharpness(img)


def _fails(args, capsys, out):
    assert main(["prepare", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tilesplat prepare: error: "), err
    assert not out.exists() and not list(out.parent.glob(f".{out.name}.*"))
    return err[0]


def test_bad_videos_fail_with_one_line_and_write_nothing(tmp_path, capsys):
    out = tmp_path / "scene"
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00\x01 not a video" * 100)
    assert "does not decode" in _fails([str(junk), str(out)], capsys, out)
    img = np.zeros((H, W, 3), np.uint8)
    short = _write_video(tmp_path / "short.mp4", [img, img])
    assert "only 2 usable frame(s)" in _fails([str(short), str(out)], capsys, out)
    assert "frames must be an integer >= 3" in _fails([str(short), str(out), "--frames", "2"],
                                                      capsys, out)
    assert "video not found" in _fails([str(tmp_path / "none.mov"), str(out)], capsys, out)
    (tmp_path / "notes.txt").write_text("hello")
    assert "is a file but not a video" in _fails([str(tmp_path / "notes.txt"), str(out)],
                                                 capsys, out)
