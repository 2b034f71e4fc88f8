"""A flythrough of a trained run: ``tilesplat render RUN --path ellipse|spiral|interp``.

The camera path comes from the run's training cameras (``data/trajectory.py``); the frames
take the first training camera's intrinsics, size, camera model and lens (a run trained with
``camera_mode = "native"`` flies through the capture's lens; ``pinhole``, ``tilesplat render
--path ... --pinhole``, through the pinhole that the undistortion makes of it instead). They
are rendered in batches of ``batch`` cameras at once on the run's backend and device (as
``tilesplat eval`` renders), quantised as the PNG renders are (``io.images.to_uint8``), and
written as they come: PNG files ``frame_00000.png``, ... and/or an H.264 mp4 (yuv420p, the
pixel format every player opens), encoded by the ffmpeg binary of the imageio-ffmpeg wheel,
into a temporary file renamed over the destination at the end. No more than one batch of
frames is held in memory.

H.264's 4:2:0 chroma needs even sides: a frame of odd width or height loses its last column or
row in the mp4 (the PNGs keep the full size).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...data.lens import stacked
from ...data.trajectory import camera_path, check_path_request
from ...io.atomic import atomic_path
from ...io.images import to_uint8, write_png
from ..features.base import checkpoint_features, trained_dataset
from ..features.camera_mode import pinhole_mode
from ..models import Cameras, model_kind
from ..models.base import lens_to
from ..step.device import training_device
from .progress import Progress

VIDEO_INSTALL = 'pip install "tilesplat[video]"'
MAX_FPS = 240
MAX_BATCH = 256
MP4_QUALITY = 8  # imageio-ffmpeg's 0-10 scale (libx264's CRF from it); 5, its default, blurs


@dataclasses.dataclass
class Flythrough:
    """What :func:`render_flythrough` wrote: the frame count and size, the mp4 (or None),
    the PNG folder (or None), and the cameras [F, 4, 4] (world-to-camera, float32)."""

    frames: int
    width: int
    height: int
    mp4: Path | None
    png_dir: Path | None
    viewmats: torch.Tensor


def _imageio_ffmpeg() -> Any:
    try:
        import imageio_ffmpeg
    except ImportError:
        raise ValueError(f"--mp4 needs the imageio-ffmpeg package: {VIDEO_INSTALL}") from None
    return imageio_ffmpeg


def check_request(path: str, frames: int, mp4: str | Path | None, png_dir: str | Path | None,
                  fps: float, batch: int) -> None:
    """Checks the arguments of :func:`render_flythrough` before anything is loaded.

    Raises:
        ValueError: naming the argument, what it must be and what it is.
    """
    check_path_request(path, frames)
    if mp4 is None and png_dir is None:
        raise ValueError("--path needs --mp4 FILE or --png-dir DIR (or both): where frames go")
    if mp4 is not None:
        if Path(mp4).suffix.lower() != ".mp4":
            raise ValueError(f"--mp4 must name a .mp4 file, got {str(mp4)!r}")
        if Path(mp4).is_dir():
            raise ValueError(f"--mp4 {mp4} is a folder")
        _imageio_ffmpeg()
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 < fps <= MAX_FPS:
        raise ValueError(f"--fps must be a number in (0, {MAX_FPS}], got {fps!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_BATCH:
        raise ValueError(f"--batch must be an integer in 1..{MAX_BATCH}, got {batch!r}")


@contextlib.contextmanager
def _mp4_writer(path: Path, width: int, height: int, fps: float
                ) -> Iterator[Callable[[np.ndarray], None]]:
    """A function taking frames [H, W, 3] uint8 into the mp4 ``path`` (written atomically)."""
    ffmpeg = _imageio_ffmpeg()
    w, h = width - width % 2, height - height % 2
    if w < 2 or h < 2:
        raise ValueError(f"an mp4 needs frames of at least 2 x 2 pixels, got {width} x {height}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        gen = ffmpeg.write_frames(str(tmp), (w, h), fps=fps, codec="libx264",
                                  pix_fmt_out="yuv420p", quality=MP4_QUALITY,
                                  macro_block_size=2, ffmpeg_log_level="error")
        gen.send(None)  # starts ffmpeg
        try:
            yield lambda frame: gen.send(np.ascontiguousarray(frame[:h, :w]))
        finally:
            gen.close()  # waits for ffmpeg to finish the file


@torch.no_grad()
def render_flythrough(
    run_dir: str | Path,
    path: str = "ellipse",
    frames: int = 120,
    mp4: str | Path | None = None,
    png_dir: str | Path | None = None,
    fps: float = 30.0,
    batch: int = 8,
    progress: bool = True,
    log: Callable[[str], None] = print,
    pinhole: bool = False,
) -> Flythrough:
    """Render ``frames`` views of a run's newest checkpoint along camera path ``path`` into an
    mp4 and/or a folder of PNGs, through the first training camera's lens (with ``pinhole``:
    through its undistorted camera, :func:`..features.camera_mode.pinhole_mode`).

    Raises:
        FileNotFoundError: no run folder, or one without a checkpoint (no model).
        ValueError: a bad argument (:func:`check_request`), a dataset without training views.
    """
    from ..rundir.scene import load_scene
    from .run import load_run

    check_request(path, frames, mp4, png_dir, fps, batch)
    cfg, params, ckpt = load_run(run_dir)
    # the training cameras as the run learned them (pose_opt: their refined poses)
    scene = load_scene(cfg, log, pinhole_mode(cfg) if pinhole else None)
    dataset = trained_dataset(checkpoint_features(cfg, scene, ckpt), scene)
    if not dataset.train:
        raise ValueError(f"{run_dir}: the run's dataset has no training views to fly around")
    first = dataset.train[0]
    viewmats = torch.stack([f.viewmat for f in dataset.train]).double().numpy()
    points = dataset.points.double().numpy() if dataset.points is not None else None
    path_viewmats = torch.from_numpy(camera_path(path, viewmats, frames, points)).float()

    device = training_device(cfg)
    params = {k: v.to(device) for k, v in params.items()}
    model = model_kind(cfg)
    K = first.K.float().to(device)
    lens = lens_to(stacked([first.lens]), device)
    background = torch.tensor(dataset.background, dtype=torch.float32, device=device)
    folder = Path(png_dir) if png_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    bar = Progress(frames, enabled=progress, unit="frames")
    with contextlib.ExitStack() as stack:
        write_video = (stack.enter_context(_mp4_writer(Path(mp4), first.width, first.height, fps))
                       if mp4 is not None else None)
        for start in range(0, frames, batch):
            views = path_viewmats[start:start + batch].to(device)
            c = len(views)
            cams = Cameras(viewmats=views, Ks=K[None].expand(c, 3, 3).contiguous(),
                           width=first.width, height=first.height,
                           backgrounds=background[None].expand(c, 3).contiguous(),
                           camera_model=first.camera_model,
                           lens=None if lens is None else {k: v.expand(c, -1).contiguous()
                                                           for k, v in lens.items()})
            colors = model.render(params, cams, cfg, sh_degree=cfg.sh_degree).colors
            for i, image in enumerate(colors.clamp(0.0, 1.0).cpu()):
                pixels = to_uint8(image)
                if folder is not None:
                    write_png(folder / f"frame_{start + i:05d}.png", pixels)
                if write_video is not None:
                    write_video(pixels)
            bar.update(start + c)
        bar.close()
    return Flythrough(frames, first.width, first.height, Path(mp4) if mp4 else None, folder,
                      path_viewmats)
