"""The undistorted images of a dataset, kept beside it so that a capture is undistorted once.

Layout: ``<dataset>/tilesplat_cache/undistorted-<key>/`` holds ``NNNNNN.png`` (the undistorted
image of the N-th remapped frame, 8-bit RGB, what :class:`.undistort.Remap` gives),
``NNNNNN.mask.png`` (its training mask, when it has one) and ``cache.json`` (the frames' names
in order, and ``complete`` once every file is written). File names are numbers, never the
dataset's image names, which come from untrusted model files.

The key is a hash of what the result depends on: the format version, the downscale factor,
each frame's camera (model and parameters) and undistorted camera, and the name, size and
modification time of each image and mask file read. Any change gives a new key, hence a new
folder; a complete new folder removes the older ``undistorted-*`` folders beside it. When the
dataset folder is not writable the images are undistorted in memory on every load; a load
that fails half-way (a bad mask, an unreadable image) removes the folder it started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..io.atomic import atomic_write_bytes
from ..io.images import decode_image, read_image, to_float, write_png

VERSION = 1
FOLDER = "tilesplat_cache"
PREFIX = "undistorted-"
INDEX = "cache.json"
# zlib level of the cached PNGs: level 6 (Pillow's default) made the first load of 100 images
# of 670x491 take 25.6 s, most of it encoding; level 1 encodes ~5x faster (docs/data.md)
CACHE_PNG_LEVEL = 1


def file_stamp(path: Path | None, root: Path) -> list[Any] | None:
    """[name relative to ``root``, size, mtime_ns] of a file (what the key depends on; a
    dataset moved or named by another path keeps its cache), None for no file."""
    if path is None:
        return None
    st = path.stat()
    return [os.path.relpath(path, root), st.st_size, st.st_mtime_ns]


class UndistortCache:
    """The cache folder of one key, under ``root``'s ``tilesplat_cache``.

    Args:
        root: the dataset folder.
        parts: JSON-serialisable description of everything the images depend on.
        names: the cached frames' keys, in order (frame i is file ``i``).
        log: one-line messages (the folder used, or why there is none).
    """

    def __init__(self, root: Path, parts: Any, names: list[str],
                 log: Callable[[str], None]) -> None:
        blob = json.dumps({"version": VERSION, "parts": parts}, sort_keys=True).encode()
        self.key = hashlib.sha256(blob).hexdigest()[:16]
        self.folder = root / FOLDER / f"{PREFIX}{self.key}"
        self.names = names
        self.index = {n: i for i, n in enumerate(names)}
        self.log = log
        self.hit = self._complete()
        self.writable = self.hit or self._open()

    def _complete(self) -> bool:
        try:
            meta = json.loads((self.folder / INDEX).read_text())
        except (OSError, ValueError):
            return False
        return meta.get("complete") is True and meta.get("names") == self.names

    def _open(self) -> bool:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.folder / INDEX,
                               json.dumps({"names": self.names, "complete": False}).encode(),
                               fsync=False)
        except OSError as e:
            self.log(f"undistortion cache not written ({self.folder}: {e.strerror or e}); "
                     "undistorting in memory")
            return False
        return True

    def _files(self, name: str) -> tuple[Path, Path]:
        i = self.index[name]
        return self.folder / f"{i:06d}.png", self.folder / f"{i:06d}.mask.png"

    def read(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """The cached (image [H, W, 3] float32, mask [H, W] bool or None) of frame ``name``."""
        image, mask = self.read_stored(name)
        return to_float(image), mask

    def read_stored(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """The cached (image [H, W, 3] uint8, mask [H, W] bool or None) of frame ``name``."""
        image_file, mask_file = self._files(name)
        mask = read_image(mask_file)[:, :, 0] > 0.5 if mask_file.is_file() else None
        return np.ascontiguousarray(decode_image(image_file)[:, :, :3]), mask

    def write(self, name: str, image: np.ndarray, mask: np.ndarray | None) -> None:
        """Keep frame ``name``'s undistorted image and mask (nothing when not writable)."""
        if not self.writable:
            return
        image_file, mask_file = self._files(name)
        try:
            write_png(image_file, image, compress_level=CACHE_PNG_LEVEL)
            if mask is not None:
                write_png(mask_file, mask.astype(np.uint8) * 255, compress_level=CACHE_PNG_LEVEL)
        except OSError as e:
            self.log(f"undistortion cache not written ({image_file}: {e}); undistorting in memory")
            self.writable = False

    def abandon(self) -> None:
        """Remove this key's unfinished folder (a load that failed leaves nothing behind), and
        ``tilesplat_cache`` itself when that leaves it empty."""
        if self.hit or not self.writable:
            return
        shutil.rmtree(self.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.folder.parent.rmdir()  # only when empty

    def finish(self) -> None:
        """Mark the folder complete and remove the stale folders of other keys."""
        if self.hit or not self.writable:
            return
        atomic_write_bytes(self.folder / INDEX,
                           json.dumps({"names": self.names, "complete": True}).encode(),
                           fsync=False)
        for old in self.folder.parent.glob(f"{PREFIX}*"):
            if old != self.folder and old.is_dir() and (old / INDEX).is_file():
                shutil.rmtree(old, ignore_errors=True)
        self.log(f"undistorted images cached in {self.folder}")
