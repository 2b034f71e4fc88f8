"""Dataset folders: layout detection and loading (Blender / NeRF-synthetic or COLMAP).

A data source is one reader module in ``data/`` returning a :class:`SceneDataset` of the same
frames, and one :class:`Layout` line in :data:`LAYOUTS` (docs/README.md, "where things go").
The types (:class:`Frame`, :class:`SceneDataset`) and the loaders' shared helpers live in
:mod:`.frames`; they are re-exported here, where the trainer has always imported them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .blender import load_blender
from .colmap import load_colmap
from .frames import (
    Frame,
    SceneDataset,
    cameras_extent,
    image_to_tensors,
    look_at_point,
    split_every,
)

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
    and its reader ``load(path, *, downscale, white_background, test_every)``."""

    name: str
    matches: Callable[[Path], bool]
    expects: str
    load: Callable[..., SceneDataset]


# in the order they are tried
LAYOUTS = (
    Layout("blender", lambda p: (p / "transforms_train.json").is_file(),
           "transforms_train.json (Blender / NeRF-synthetic)", load_blender),
    Layout("colmap", lambda p: (p / "sparse").is_dir(),
           "sparse/0/ with cameras, images, points3D (COLMAP)", load_colmap),
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
    """The name of a dataset folder's layout (:data:`LAYOUTS`: ``"blender"``, ``"colmap"``).

    Raises:
        FileNotFoundError: the folder does not exist or holds no known layout.
    """
    return _layout(Path(path)).name


def load_dataset(
    path: str | Path,
    *,
    downscale: int = 1,
    white_background: bool = True,
    test_every: int = 8,
) -> SceneDataset:
    """Load a Blender / NeRF-synthetic or COLMAP dataset, detecting the layout.

    Args:
        path: dataset folder.
        downscale: integer factor dividing the image size (and the intrinsics).
        white_background: composite RGBA images on white (else black) where the layout has
            them (Blender).
        test_every: COLMAP (and Blender without transforms_test.json): every ``test_every``-th
            image, sorted by name, starting with the first, goes to the test split;
            0 puts every image in train.
    """
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(test_every, int) or test_every < 0:
        raise ValueError(f"test_every must be an integer >= 0, got {test_every!r}")
    return _layout(Path(path)).load(
        path, downscale=downscale, white_background=white_background, test_every=test_every
    )
