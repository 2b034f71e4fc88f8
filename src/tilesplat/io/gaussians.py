"""Gaussian splat files: one entry point for every format, chosen by the file's name.

Every reader returns, and every writer takes, the raw parameters of the trainer (as
:func:`tilesplat.io.ply.load_ply`): ``means`` [N, 3], ``quats`` [N, 4] (w, x, y, z),
``log_scales`` [N, 3], ``opacity_logits`` [N] and ``sh`` [N, K, 3] with K = (degree + 1)^2,
all float32 in the 3DGS / COLMAP frame (x right, y down, z forward of the cameras). Readers of
formats stored in another frame (glTF) convert; docs/formats.md lists what each keeps.

A file format is a module ``io/<format>.py`` with a reader ``read_<format>(path)`` returning
:class:`~._checks.SplatData` (``load_<format>`` gives its Gaussians) and a writer
``save_<format>(path, means, quats, log_scales, opacity_logits, sh, antialiased=False)`` (its
checks from :mod:`._checks`), and one line in :data:`FORMATS`: the name ending it is chosen
by (the longest match wins: ``x.compressed.ply`` before ``x.ply``), its ``--to`` name and the
reader and writer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

from . import compressed_ply, glb, ply, sog, splat, spz
from ._checks import ARRAY_NAMES, SplatData

Reader = Callable[[Path], SplatData]
Writer = Callable[..., Path]  # (path, means, quats, log_scales, opacity_logits, sh, antialiased)


class Format(NamedTuple):
    name: str  # tilesplat export --to NAME
    read: Reader
    save: Writer


# name ending -> format
FORMATS: dict[str, Format] = {
    ".ply": Format("ply", ply.read_ply, ply.save_ply),  # the 3DGS layout (compressed: read too)
    ".compressed.ply": Format(  # SuperSplat's chunked, quantised PLY
        "compressed-ply", compressed_ply.read_compressed_ply, compressed_ply.save_compressed_ply
    ),
    ".splat": Format("splat", splat.read_splat, splat.save_splat),  # antimatter15's records
    ".spz": Format("spz", spz.read_spz, spz.save_spz),  # Niantic's, version 4 written
    ".sog": Format("sog", sog.read_sog, sog.save_sog),  # PlayCanvas's WebP textures, one zip
    "meta.json": Format("sog-folder", sog.read_sog, sog.save_sog),  # the same, loose files
    ".glb": Format("glb", glb.read_glb, glb.save_glb),  # glTF 2.0 + KHR_gaussian_splatting
}
SUFFIXES = tuple(FORMATS)
BY_NAME = {f.name: suffix for suffix, f in FORMATS.items()}

__all__ = ["ARRAY_NAMES", "BY_NAME", "FORMATS", "SUFFIXES", "SplatData", "format_of",
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
        ``means`` [N, 3], ``quats`` [N, 4], ``log_scales`` [N, 3], ``opacity_logits`` [N],
        ``sh`` [N, K, 3], float32.
    """
    data = read_gaussians(path)
    for note in data.notes:
        warnings.warn(note, stacklevel=2)
    return data.gaussians


def save_gaussians(
    path: str | Path, gaussians: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write ``gaussians`` (the dict :func:`load_gaussians` returns) by ``path``'s name."""
    path = Path(path)
    fmt = format_of(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return fmt.save(path, *[gaussians[k] for k in ARRAY_NAMES], antialiased=antialiased)
