"""Dataset folders: layout detection and loading (Blender / NeRF-synthetic, nerfstudio, COLMAP).

A data source is one reader module ``data/<module>.py`` whose ``load_<module>`` returns a
:class:`SceneDataset` of the same frames, and one :class:`Layout` line in :data:`LAYOUTS`
(docs/README.md, "where things go"); a reader is imported when a folder of its layout is
first loaded.
The types (:class:`Frame`, :class:`SceneDataset`) and the loaders' shared helpers live in
:mod:`.frames`; they are re-exported here, where the trainer has always imported them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..lookup import module_function
from .exposure import MARKER as EXPOSURE_MARKER
from .frames import (
    Frame,
    SceneDataset,
    cameras_extent,
    check_finite_scene,
    image_to_tensors,
    look_at_point,
    split_every,
)
from .image_cache import configure as configure_image_cache
from .native import LOAD_MODES

__all__ = [
    "LAYOUTS",
    "Frame",
    "Layout",
    "SceneDataset",
    "cameras_extent",
    "detect_layout",
    "image_to_tensors",
    "load_dataset",
    "look_at_point",
    "split_every",
]


@dataclass(frozen=True)
class Layout:
    """A dataset layout: how its folder is recognised, what it holds (for the error message),
    and the reader module ``data/<module>.py``, whose ``load_<module>(path, *, downscale,
    white_background, test_every, masks_dir, log)`` loads it; a reader of distorted cameras
    takes ``camera_mode`` too (one without it loads its cameras as they are in every mode)."""

    name: str
    matches: Callable[[Path], bool]
    expects: str
    module: str

    @property
    def load(self) -> Callable[..., SceneDataset]:
        """The reader ``load_<module>`` of ``data/<module>.py``."""
        return module_function(__package__, self.module, f"load_{self.module}",
                               f"data layout {self.name!r}")


# in the order they are tried, one line each
LAYOUTS = (
    Layout("exposure", lambda p: (p / EXPOSURE_MARKER).is_file(),
           "tilesplat_exposure.json (the built-in exposure scene)", "exposure"),
    Layout("blender", lambda p: (p / "transforms_train.json").is_file(),
           "transforms_train.json (Blender / NeRF-synthetic)", "blender"),
    Layout("nerfstudio", lambda p: (p / "transforms.json").is_file(),
           "transforms.json (nerfstudio)", "nerfstudio"),
    Layout("colmap", lambda p: (p / "sparse").is_dir(),
           "sparse/0/ with cameras, images, points3D (COLMAP)", "colmap"),
)


def _layout(path: Path) -> Layout:
    if not path.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {path}")
    for layout in LAYOUTS:
        if layout.matches(path):
            return layout
    raise FileNotFoundError(
        f"{path} is not a dataset: expected " + " or ".join(lay.expects for lay in LAYOUTS)
    )


def detect_layout(path: str | Path) -> str:
    """The name of a dataset folder's layout (:data:`LAYOUTS`: ``"blender"``, ``"nerfstudio"``,
    ``"colmap"``).

    Raises:
        FileNotFoundError: the folder does not exist or holds no known layout.
    """
    return _layout(Path(path)).name


def load_dataset(
    path: str | Path,
    *,
    downscale: int = 1,
    white_background: bool = True,
    test_every: int = -1,
    masks_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    image_cache_mb: float = 0.0,
    camera_mode: str = "undistort",
) -> SceneDataset:
    """Load a Blender / NeRF-synthetic, nerfstudio or COLMAP dataset, detecting the layout.

    Args:
        path: dataset folder.
        downscale: integer factor dividing the image size (and the intrinsics).
        white_background: composite RGBA images on white (else black) where the layout has
            them (Blender).
        test_every: every ``test_every``-th image, sorted by name, starting with the first,
            goes to the test split; 0 puts every image in train; -1 (the default) keeps the
            layout's own split: Blender's transforms_test.json, nerfstudio's file lists or
            its 90/10 split, else every 8th image.
        masks_dir: a folder of training masks (``<image name>.png``, black where a pixel is
            ignored) instead of the dataset's own (COLMAP's ``masks/``, nerfstudio's
            ``mask_path``).
        log: one-line messages (how each camera is trained, the undistortion cache, the
            decoding's progress).
        image_cache_mb: the bound of the process's decoded-image cache in megabytes
            (:mod:`.image_cache`); 0: automatic, a quarter of the available memory. The
            frames' images are decoded again when the cache has dropped them.
        camera_mode: ``undistort`` (distorted cameras undistorted on load, :mod:`.undistort`),
            ``native`` (each keeps its lens and full image, rendered through 3DGUT:
            :mod:`.lens`) or ``pinhole`` (undistorted on load, rendered through 3DGUT:
            :mod:`.native`).
    """
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(test_every, int) or test_every < -1:
        raise ValueError(f"test_every must be an integer >= -1, got {test_every!r}")
    if camera_mode not in LOAD_MODES:
        raise ValueError(f"camera_mode must be one of {list(LOAD_MODES)}, got {camera_mode!r}")
    configure_image_cache(image_cache_mb)
    load = _layout(Path(path)).load
    options: dict[str, Any] = {"downscale": downscale, "white_background": white_background,
                               "test_every": test_every, "masks_dir": masks_dir or None,
                               "log": log}
    if "camera_mode" in inspect.signature(load).parameters:  # readers of distorted cameras
        options["camera_mode"] = camera_mode
    dataset = load(path, **options)
    return check_finite_scene(dataset, path)  # before any run folder is made
