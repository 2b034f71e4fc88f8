"""A video to a COLMAP dataset: pick sharp frames, then structure-from-motion on them.

The video is decoded by ffmpeg through ``imageio-ffmpeg`` (part of the ``tilesplat[sfm]``
extra; its wheel ships an ffmpeg binary, so nothing else is installed), imported only inside
:func:`extract_frames`. The frames are split into N windows of equal length and each window
keeps its sharpest frame, the one whose grey image has the largest variance of the Laplacian
(a blurred frame has little high-frequency energy), so motion blur is dropped while the picks
stay evenly spread over the clip. The picks are numbered in time order and handed to
:func:`.pipeline.prepare` with the sequential matcher (neighbours in name order), which suits
a walk-through.

Nothing is written unless the whole dataset is: the frames go to a temporary folder beside
the output, removed at the end whatever happens.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...io.atomic import atomic_write_bytes
from ...io.images import write_png
from .photos import MIN_IMAGES, MIN_SIDE
from .pipeline import REPORT_FILE, PrepareReport, prepare

VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm", ".mpg", ".mpeg", ".wmv")
DEFAULT_FRAMES = 120
INSTALL_HINT = 'video input needs imageio-ffmpeg: pip install "tilesplat[sfm]"'
SHARPNESS_SIDE = 960  # frames are scored at most this long (every other pixel beyond it)

Log = Callable[[str], None]


def is_video(path: str | Path) -> bool:
    """Whether ``path`` names a video file (by its suffix)."""
    return Path(path).suffix.lower() in VIDEO_SUFFIXES


def sharpness(frame: np.ndarray) -> float:
    """Variance of the 4-neighbour Laplacian of the grey image of ``frame`` [H, W, 3] uint8."""
    step = 2 if max(frame.shape[:2]) > SHARPNESS_SIDE else 1
    g = frame[::step, ::step].astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
    lap = g[1:-1, :-2] + g[1:-1, 2:] + g[:-2, 1:-1] + g[2:, 1:-1] - 4.0 * g[1:-1, 1:-1]
    return float(lap.var())


def _windows(n_frames: int, n_picks: int) -> np.ndarray:
    """[n_frames] window index of each frame: ``n_picks`` windows of (nearly) equal length."""
    n_picks = min(n_picks, n_frames)
    return (np.arange(n_frames) * n_picks) // n_frames


def _import_ffmpeg() -> Any:
    try:
        import imageio_ffmpeg
    except ImportError as e:
        raise NotImplementedError(INSTALL_HINT) from e
    return imageio_ffmpeg


def extract_frames(video: str | Path, dest: str | Path, n_frames: int = DEFAULT_FRAMES,
                   log: Log = print) -> dict[str, Any]:
    """Write the sharpest frame of each of ``n_frames`` windows of ``video`` into ``dest``
    (an existing folder) as ``frame_NNNNN.png``.

    Returns:
        ``{"video", "decoded", "fps", "size", "picked": [frame indices], "sharpness": [...]}``.

    Raises:
        FileNotFoundError: no such file. ValueError: it does not decode, or gives fewer than
            MIN_IMAGES frames, or frames smaller than MIN_SIDE. NotImplementedError: no
            imageio-ffmpeg.
    """
    video = Path(video)
    if not video.is_file():
        raise FileNotFoundError(f"video not found: {video}")
    if not isinstance(n_frames, int) or n_frames < MIN_IMAGES:
        raise ValueError(f"frames must be an integer >= {MIN_IMAGES}, got {n_frames!r}")
    ffmpeg = _import_ffmpeg()
    try:
        total, _ = ffmpeg.count_frames_and_secs(str(video))
        reader = ffmpeg.read_frames(str(video))
        meta = next(reader)
    except (RuntimeError, OSError, StopIteration, ValueError) as e:
        detail = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(f"{video}: the video does not decode ({detail})") from None
    width, height = (int(v) for v in meta["size"])
    if min(width, height) < MIN_SIDE:
        reader.close()
        raise ValueError(f"{video}: frames of {width}x{height} are too small (at least "
                         f"{MIN_SIDE} px on a side)")
    window = _windows(max(int(total), 1), n_frames)
    log(f"video {video.name}: {total} frames of {width}x{height} at {meta.get('fps', 0):g} "
        f"fps; keeping the sharpest of each of {window[-1] + 1} windows")
    picked: list[int] = []
    scores: list[float] = []
    best: tuple[float, int, np.ndarray] | None = None
    decoded = 0

    def keep(entry: tuple[float, int, np.ndarray]) -> None:
        picked.append(entry[1])
        scores.append(round(entry[0], 3))
        write_png(Path(dest) / f"frame_{len(picked):05d}.png", entry[2])

    try:
        for i, raw in enumerate(reader):
            frame = np.frombuffer(raw, dtype=np.uint8).reshape(height, width, 3)
            w = window[min(i, len(window) - 1)]
            if best is not None and window[min(best[1], len(window) - 1)] != w:
                keep(best)
                best = None
            score = sharpness(frame)
            if best is None or score > best[0]:
                best = (score, i, frame.copy())
            decoded = i + 1
    except (RuntimeError, OSError) as e:
        raise ValueError(f"{video}: decoding failed after {decoded} frames ({e})") from None
    finally:
        reader.close()
    if best is not None:
        keep(best)
    if len(picked) < MIN_IMAGES:
        raise ValueError(
            f"{video}: only {len(picked)} usable frame(s) decoded; structure-from-motion needs "
            f"at least {MIN_IMAGES} (a longer clip, or one that decodes)"
        )
    return {"video": str(video), "decoded": decoded, "fps": meta.get("fps"),
            "size": [width, height], "picked": picked, "sharpness": scores}


def prepare_video(
    video: str | Path,
    out_dir: str | Path,
    *,
    frames: int = DEFAULT_FRAMES,
    matcher: str = "sequential",
    log: Log = print,
    **options: Any,
) -> PrepareReport:
    """``tilesplat prepare clip.mp4 scene/``: :func:`extract_frames`, then
    :func:`.pipeline.prepare` (``matcher`` and ``options`` go to it) on the frames. The
    dataset's ``prepare.json`` gains ``video`` (what :func:`extract_frames` returns).

    Raises:
        as :func:`extract_frames` and :func:`.pipeline.prepare`; nothing is left behind.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not empty; choose a new output folder")
    made_parent = not out.parent.exists()
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.frames-", dir=out.parent))
    try:
        info = extract_frames(video, staged, frames, log)
        report = prepare(staged, out, matcher=matcher, log=log, **options)
        report.options["images_dir"] = str(video)
        written = json.loads((out / REPORT_FILE).read_text())
        written["options"]["images_dir"] = str(video)
        written["video"] = info
        atomic_write_bytes(out / REPORT_FILE, json.dumps(written, indent=1).encode())
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        if made_parent and out.parent.is_dir() and not any(out.parent.iterdir()):
            out.parent.rmdir()
        raise
    shutil.rmtree(staged, ignore_errors=True)
    return report
