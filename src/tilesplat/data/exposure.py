"""The exposure scene: the built-in ray-cast scene whose training photos differ in exposure and
white balance, as real photos do (``synthetic_scene = "exposure"``).

The views are those of :mod:`.synthetic` (same cameras, same ray caster). Each training image
is composited on a grey BACKGROUND (0.5) and then gets a gain of its own, log-uniform in
GAIN_RANGE (x0.6 to x1.5), and an offset per channel, uniform in +-OFFSET (0.05), clipped to
[0, 1] as a camera clips, and is written opaque (RGB): the whole photo changed, background
included. The test images are the ray caster's, untouched (RGBA), composited on the same grey
when loaded. The scene is defined on grey whatever ``white_background`` says: on white, the
background of every brighter photo would clip at 1, which no colour transform of the render
undoes, and on black the exposure of the background would be lost (measured: a model trained
with the true transforms gained 3.8 dB of test PSNR on grey, little on black). A model that fits
the training photos as they are learns colours of no view in particular, and floaters;
``post_processing`` (``train/features/appearance.py``) learns a transform per photo instead.
The drawn gains and offsets are in the marker file, ``tilesplat_exposure.json``.

The folder is a Blender-layout dataset (``transforms_train.json``, ``transforms_test.json``),
written once and reused when its marker says it is complete with the same arguments; its
marker makes it a layout of its own (``data/dataset.py``), read by :func:`load_exposure`
(the Blender reader, then the grey background).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import torch

from ..io.atomic import atomic_write_bytes
from ..io.images import write_png
from .blender import load_blender
from .frames import Frame, SceneDataset
from .synthetic import (
    CAMERA_ANGLE_X,
    camera_positions,
    check_scene_size,
    look_at_c2w,
    render_view,
)

FORMAT_VERSION = 1
MARKER = "tilesplat_exposure.json"
GAIN_RANGE = (0.6, 1.5)  # a training photo's gain, log-uniform
OFFSET = 0.05  # its offset per channel, uniform in [-OFFSET, OFFSET]
BACKGROUND = (0.5, 0.5, 0.5)  # what every view is composited on


def exposure_changes(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(gains [n], offsets [n, 3]) of ``n`` training photos, a function of ``seed`` alone."""
    rng = np.random.default_rng([seed, 24])
    lo, hi = math.log(GAIN_RANGE[0]), math.log(GAIN_RANGE[1])
    gains = np.exp(rng.uniform(lo, hi, n))
    offsets = rng.uniform(-OFFSET, OFFSET, (n, 3))
    return gains, offsets


def expose(rgba: np.ndarray, gain: float, offset: np.ndarray) -> np.ndarray:
    """[H, W, 4] straight-alpha image -> [H, W, 3] on BACKGROUND, times ``gain`` plus
    ``offset`` [3], clipped to [0, 1]."""
    alpha = rgba[:, :, 3:4]
    rgb = rgba[:, :, :3] * alpha + np.asarray(BACKGROUND) * (1.0 - alpha)
    return np.clip(rgb * gain + offset, 0.0, 1.0)


def _marker(out: Path) -> dict | None:
    try:
        return json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, obj: object) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode("utf-8"), fsync=False)


def write_exposure_dataset(
    out_dir: str | Path, *, n_train: int = 100, n_test: int = 20, size: int = 200, seed: int = 0
) -> Path:
    """Write (or reuse) the exposure scene as a Blender-layout dataset in ``out_dir``.

    A complete dataset written with the same arguments is reused; one written with others,
    or interrupted, is rewritten; a folder holding anything else is refused.

    Returns:
        ``out_dir`` as a Path.
    """
    check_scene_size(n_train, n_test, size)
    out = Path(out_dir)
    params = {"version": FORMAT_VERSION, "n_train": n_train, "n_test": n_test, "size": size,
              "seed": seed}
    gains, offsets = exposure_changes(n_train, seed)
    done = {**params, "gains": gains.tolist(), "offsets": offsets.tolist(), "complete": True}
    if _marker(out) == done and all(
        (out / split / f"r_{i}.png").is_file()
        for split, n in (("train", n_train), ("test", n_test)) for i in range(n)
    ):
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ValueError(
            f"{out} exists and is not a tilesplat exposure dataset; choose another folder"
        )
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / MARKER, {**done, "complete": False})  # complete once every file is there
    for split, n in (("train", n_train), ("test", n_test)):
        (out / split).mkdir(exist_ok=True)
        frames = []
        for i, eye in enumerate(camera_positions(n, seed, test=split == "test")):
            c2w = look_at_c2w(eye)
            image = render_view(c2w, size)
            if split == "train":
                image = expose(image, float(gains[i]), offsets[i])
            write_png(out / split / f"r_{i}.png", image.astype(np.float32))
            frames.append({"file_path": f"./{split}/r_{i}", "transform_matrix": c2w.tolist()})
        _write_json(out / f"transforms_{split}.json",
                    {"camera_angle_x": CAMERA_ANGLE_X, "frames": frames})
    _write_json(out / MARKER, done)
    return out


def load_exposure(path: str | Path, **kwargs: object) -> SceneDataset:
    """The exposure scene at ``path``, its RGBA views composited on BACKGROUND (the Blender
    reader's keywords; ``white_background`` is not used)."""
    kwargs["white_background"] = False  # on black, then recomposited on grey below
    ds = load_blender(path, **kwargs)  # type: ignore[arg-type]
    bg = torch.tensor(BACKGROUND, dtype=torch.float32)

    def on_grey(frame: Frame) -> Frame:
        if frame.alpha is None:
            return frame
        return dataclasses.replace(frame, image=frame.image + bg * (1.0 - frame.alpha))

    return dataclasses.replace(ds, train=[on_grey(f) for f in ds.train],
                               test=[on_grey(f) for f in ds.test], background=BACKGROUND)
