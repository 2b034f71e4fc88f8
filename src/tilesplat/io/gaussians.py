"""Gaussian splat files: one entry point for every format, chosen by the file's name.

Every reader returns, and every writer takes, the Gaussians by gsplat's ``splats`` names, as
the trainer holds them (:data:`SPLAT_KEYS`): ``means`` [N, 3], ``scales`` [N, 3] (logs),
``quats`` [N, 4] (w, x, y, z), ``opacities`` [N] (logits), ``sh0`` [N, 1, 3] and ``shN``
[N, K - 1, 3] with K = (degree + 1)^2, all float32 in the 3DGS / COLMAP frame (x right, y
down, z forward of the cameras). Each format converts between these and its file's fields
itself; readers of formats stored in another frame (glTF) convert that too. docs/formats.md
lists what each keeps.

A file format is a module ``io/<module>.py`` with a reader ``read_<module>(path)`` returning
:class:`~._checks.SplatData` and a writer ``save_<module>(path, splats, antialiased=False)``
(its checks from :mod:`._checks`), and one line in :data:`FORMATS`: the name ending it is
chosen by (the longest match wins: ``x.compressed.ply`` before ``x.ply``), its ``--to`` name
and its module. A module is imported when a file of its format is first read or written.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from ..lookup import module_function
from ._checks import SPLAT_KEYS, SplatData


class Format(NamedTuple):
    """A splat file format: ``tilesplat export --to NAME`` and the module ``io/<module>.py``
    holding ``read_<module>`` and ``save_<module>``."""

    name: str
    module: str

    def _function(self, verb: str) -> Callable:
        return module_function(__package__, self.module, f"{verb}_{self.module}",
                               f"splat format {self.name!r}")

    def read(self, path: Path) -> SplatData:
        """The format's reader on ``path``."""
        return self._function("read")(path)

    def save(self, path: Path, splats: dict[str, torch.Tensor], antialiased: bool = False,
             **options: object) -> Path:
        """The format's writer: ``splats`` (:data:`SPLAT_KEYS`) to ``path``; ``options`` are
        the format's own (``version`` of SPZ)."""
        return self._function("save")(path, splats, antialiased=antialiased, **options)


# name ending -> format, one line each
FORMATS: dict[str, Format] = {
    ".ply": Format("ply", "ply"),  # the 3DGS layout (compressed: read too)
    ".compressed.ply": Format("compressed-ply", "compressed_ply"),  # SuperSplat's chunks
    ".splat": Format("splat", "splat"),  # antimatter15's records
    ".spz": Format("spz", "spz"),  # Niantic's, version 4 written
    ".sog": Format("sog", "sog"),  # PlayCanvas's WebP textures, one zip
    "meta.json": Format("sog-folder", "sog"),  # the same, loose files
    ".glb": Format("glb", "glb"),  # glTF 2.0 + KHR_gaussian_splatting
}
SUFFIXES = tuple(FORMATS)
BY_NAME = {f.name: suffix for suffix, f in FORMATS.items()}

__all__ = ["BY_NAME", "FORMATS", "SPLAT_KEYS", "SUFFIXES", "SplatData", "format_of",
           "load_gaussians", "read_gaussians", "save_gaussians"]  # fmt: skip


def suffix_of(path: str | Path) -> str | None:
    """The key of :data:`FORMATS` that ``path``'s name ends with (longest first), or None."""
    name = Path(path).name.lower()
    return next((s for s in sorted(FORMATS, key=len, reverse=True) if name.endswith(s)), None)


def format_of(path: str | Path) -> Format:
    """The format of ``path`` by its name (``ValueError`` listing the known endings)."""
    suffix = suffix_of(path)
    if suffix is None:
        raise ValueError(
            f"{path}: unknown splat file type {Path(path).suffix or '(none)'!r}; expected a "
            "name ending in one of " + ", ".join(SUFFIXES)
        )
    return FORMATS[suffix]


def read_gaussians(path: str | Path) -> SplatData:
    """Read any splat file of :data:`FORMATS`: its Gaussians, whether it says it was trained
    antialiased, and notes on what the reader ignored.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): an unknown name, or a malformed file.
    """
    path = Path(path)
    fmt = format_of(path)
    if not path.is_file():
        raise FileNotFoundError(f"splat file not found: {path}")
    return fmt.read(path)


def load_gaussians(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a splat file (:func:`read_gaussians`); what the reader ignored becomes a warning.

    Returns:
        ``means`` [N, 3], ``scales`` [N, 3], ``quats`` [N, 4], ``opacities`` [N], ``sh0``
        [N, 1, 3], ``shN`` [N, K - 1, 3], float32.
    """
    data = read_gaussians(path)
    for note in data.notes:
        warnings.warn(note, stacklevel=2)
    return data.gaussians


def save_gaussians(
    path: str | Path, gaussians: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write ``gaussians`` (:data:`SPLAT_KEYS`, the dict :func:`load_gaussians` returns) by
    ``path``'s name."""
    path = Path(path)
    fmt = format_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return fmt.save(path, gaussians, antialiased=antialiased)
