"""Dataset folders: layout detection and loading (Blender / NeRF-synthetic or COLMAP).

The types (:class:`Frame`, :class:`SceneDataset`) and the loaders' shared helpers live in
:mod:`.frames`; they are re-exported here, where the trainer has always imported them.
"""

from __future__ import annotations

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
    "Frame",
    "SceneDataset",
    "cameras_extent",
    "detect_layout",
    "image_to_tensors",
    "load_dataset",
    "look_at_point",
    "split_every",
]


def detect_layout(path: str | Path) -> str:
    """``"blender"`` or ``"colmap"`` for a dataset folder.

    Raises:
        FileNotFoundError: the folder does not exist or holds neither layout.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"dataset folder not found: {path}")
    if (path / "transforms_train.json").is_file():
        return "blender"
    if (path / "sparse").is_dir():
        return "colmap"
    raise FileNotFoundError(
        f"{path} is not a dataset: expected transforms_train.json (Blender / NeRF-synthetic) "
        "or sparse/0/ with cameras, images, points3D (COLMAP)"
    )


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
        white_background: composite RGBA images on white (else black). Blender only.
        test_every: COLMAP (and Blender without transforms_test.json): every ``test_every``-th
            image, sorted by name, starting with the first, goes to the test split;
            0 puts every image in train.
    """
    if not isinstance(downscale, int) or downscale < 1:
        raise ValueError(f"downscale must be an integer >= 1, got {downscale!r}")
    if not isinstance(test_every, int) or test_every < 0:
        raise ValueError(f"test_every must be an integer >= 0, got {test_every!r}")
    kind = detect_layout(path)
    if kind == "blender":
        return load_blender(
            path, downscale=downscale, white_background=white_background, test_every=test_every
        )
    return load_colmap(path, downscale=downscale, test_every=test_every)
