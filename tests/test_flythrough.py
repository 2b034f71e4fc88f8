"""``tilesplat render RUN --path ...``: the flythrough of a tiny trained run.

The mp4 decodes (imageio-ffmpeg's reader) to the asked number of frames of the render's size;
the ``interp`` path's frames at the training cameras equal ``tilesplat render --split train``'s
PNGs exactly in ``--png-dir`` (on the cpu backend, whose render of a camera does not depend on
the batch it is in; the torch reference's batched ops can differ in the last bit, 3e-7, and
so by one level of a PNG), and within the codec's loss in the mp4: every decoded frame is
above MP4_PSNR_DB against its PNG (H.264 at imageio-ffmpeg's quality 8 with 4:2:0 chroma
measured 38-39 dB on these 32-pixel frames). Bad arguments give one line and exit 2, and a
failure leaves no mp4 behind.
"""

import sys

import numpy as np
import pytest

from tilesplat.cli import main
from tilesplat.data.dataset import load_dataset
from tilesplat.data.synthetic import write_synthetic_dataset
from tilesplat.data.trajectory import MAX_FRAMES
from tilesplat.io.images import read_image
from tilesplat.train.config import TrainConfig
from tilesplat.train.loop import flythrough
from tilesplat.train.loop.run import train_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZE = 32
N_TRAIN = 6
MP4_PSNR_DB = 33.0  # measured 38-39 dB: a margin for other ffmpeg builds' encoders


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fly")
    data = write_synthetic_dataset(root / "scene", n_train=N_TRAIN, n_test=2, size=SIZE)
    cfg = TrainConfig(data=str(data), run_dir=str(root / "run"), steps=40, init_points=300,
                      sh_degree=1, refine_start=10, refine_stop=30, refine_every=10,
                      backend="cpu", progress=False, lpips=False, save_renders=False,
                      save_ply=False)
    train_run(cfg, log=lambda _: None)
    return root / "run"


def decode(path) -> tuple[list[np.ndarray], tuple[int, int]]:
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(path))
    meta = next(reader)
    w, h = meta["size"]
    return [np.frombuffer(f, np.uint8).reshape(h, w, 3) for f in reader], (w, h)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) / 255 - b.astype(np.float64) / 255) ** 2)
    return float(10 * np.log10(1 / max(mse, 1e-12)))


def test_interp_mp4_and_pngs_match_the_renders_of_the_training_views(run, tmp_path):
    out, pngs, views = tmp_path / "fly.mp4", tmp_path / "frames", tmp_path / "train"
    frames = 2 * (N_TRAIN - 1) + 1  # every other frame is a training camera
    assert main(["render", str(run), "--path", "interp", "--frames", str(frames), "--mp4",
                 str(out), "--png-dir", str(pngs), "--batch", "4"]) == 0  # batches 4, 4, 3
    assert main(["render", str(run), "--split", "train", "--out", str(views)]) == 0
    decoded, size = decode(out)
    assert len(decoded) == frames and size == (SIZE, SIZE)
    names = sorted(p.name for p in pngs.iterdir())
    assert names == [f"frame_{i:05d}.png" for i in range(frames)]
    as_uint8 = [np.round(read_image(pngs / n) * 255).astype(np.uint8) for n in names]
    for i, (video, png) in enumerate(zip(decoded, as_uint8, strict=True)):
        assert psnr(video, png) > MP4_PSNR_DB, i
    # the frames at the training cameras are those cameras' renders, pixel for pixel
    rendered = {p.stem: read_image(p) for p in views.iterdir()}
    first = load_dataset(run.parent / "scene").train[0].name
    assert np.array_equal(read_image(pngs / names[0]), rendered[first])
    at_cameras = [read_image(pngs / names[i]) for i in range(0, frames, 2)]
    for image in at_cameras:  # each is one training view's render (in the path's order)
        assert any(np.array_equal(image, r) for r in rendered.values())
    assert len({im.tobytes() for im in at_cameras}) == N_TRAIN  # every camera once
    first_video = decoded[0]
    assert psnr(first_video, np.round(rendered[first] * 255).astype(np.uint8)) > MP4_PSNR_DB
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left


@pytest.mark.parametrize("path", ["ellipse", "spiral"])
def test_ellipse_and_spiral_videos(run, tmp_path, path):
    out = tmp_path / "sub" / "fly.mp4"  # the folder is made
    assert main(["render", str(run), "--path", path, "--frames", "7", "--mp4", str(out)]) == 0
    decoded, size = decode(out)
    assert len(decoded) == 7 and size == (SIZE, SIZE)
    assert len({f.tobytes() for f in decoded}) == 7  # the camera moves
    assert all(f.std() > 5 for f in decoded)  # the object is in view, not an empty frame


def test_odd_sizes_lose_their_last_column_and_row_in_the_mp4(tmp_path):
    rng = np.random.default_rng(0)
    # blocks of 8 pixels moved by 2: their edges fall between chroma samples (4:2:0)
    base = np.kron(rng.integers(0, 256, (5, 5, 3)), np.ones((8, 8, 1))).astype(np.uint8)
    frames = [np.ascontiguousarray(np.roll(base, 2 * i, axis=1)[:35, :33]) for i in range(3)]
    with flythrough._mp4_writer(tmp_path / "odd.mp4", 33, 35, fps=10) as write:
        for f in frames:
            write(f)
    decoded, size = decode(tmp_path / "odd.mp4")
    assert size == (32, 34) and len(decoded) == 3
    for video, f in zip(decoded, frames, strict=True):
        assert psnr(video, f[:34, :32]) > MP4_PSNR_DB


def test_a_failure_while_rendering_leaves_no_mp4(run, tmp_path, monkeypatch):
    calls = []
    model_kind = flythrough.model_kind

    class Failing:  # the run's model kind, failing on its second batch
        def __init__(self, cfg):
            self.kind = model_kind(cfg)

        def render(self, *args, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("boom")
            return self.kind.render(*args, **kwargs)

    monkeypatch.setattr(flythrough, "model_kind", Failing)
    out = tmp_path / "fly.mp4"
    with pytest.raises(RuntimeError, match="boom"):
        flythrough.render_flythrough(run, "ellipse", 6, mp4=out, batch=3, progress=False,
                                     log=lambda _: None)
    assert len(calls) == 2 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--path", "circle", "--mp4", "x.mp4"], "--path must be one of ['ellipse', 'spiral', "
                                                 "'interp'], got 'circle'"),
        (["--path", "ellipse", "--frames", "0", "--mp4", "x.mp4"], "--frames must be an integer"),
        (["--path", "ellipse", "--frames", str(MAX_FRAMES + 1), "--mp4", "x.mp4"],
         f"in 1..{MAX_FRAMES}"),
        (["--path", "ellipse"], "--path needs --mp4 FILE or --png-dir DIR"),
        (["--path", "ellipse", "--mp4", "x.avi"], "--mp4 must name a .mp4 file"),
        (["--path", "ellipse", "--mp4", "x.mp4", "--fps", "0"], "--fps must be a number"),
        (["--path", "ellipse", "--mp4", "x.mp4", "--batch", "0"], "--batch must be an integer"),
        (["--path", "ellipse", "--mp4", "x.mp4", "--split", "train"], "not --split / --out"),
        (["--mp4", "x.mp4"], "give --path too"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(run, tmp_path, capsys, args, message):
    assert main(["render", str(run), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.mp4").exists()


def test_a_folder_without_a_model_and_a_missing_encoder(tmp_path, capsys, monkeypatch):
    (tmp_path / "empty").mkdir()
    args = ["render", str(tmp_path / "empty"), "--path", "ellipse", "--png-dir", str(tmp_path)]
    assert main(args) == 2
    assert "no checkpoint in" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails as if not installed
    args = ["render", str(tmp_path / "empty"), "--path", "ellipse", "--mp4", "a.mp4"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--mp4 needs the imageio-ffmpeg package" in err and 'tilesplat[video]' in err
