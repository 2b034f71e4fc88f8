"""Gaussian splat files: one entry point for every format, chosen by the file's suffix.

Every reader returns, and every writer takes, the raw parameters of the trainer (as
:func:`tilesplat.io.ply.load_ply`): ``means`` [N, 3], ``quats`` [N, 4] (w, x, y, z),
``log_scales`` [N, 3], ``opacity_logits`` [N] and ``sh`` [N, K, 3] with K = (degree + 1)^2,
all float32 in the 3DGS / COLMAP frame (x right, y down, z forward of the cameras).

A file format is a module ``io/<format>.py`` with a reader ``load_<format>(path)`` and a
writer ``save_<format>(path, means, quats, log_scales, opacity_logits, sh)`` (its checks from
:mod:`._checks`), and one line in :data:`FORMATS`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from . import ply, splat, spz
from ._checks import ARRAY_NAMES

Loader = Callable[[Path], dict[str, torch.Tensor]]
Saver = Callable[..., Path]  # (path, means, quats, log_scales, opacity_logits, sh) -> path

# suffix -> (reader, writer)
FORMATS: dict[str, tuple[Loader, Saver]] = {
    ".ply": (ply.load_ply, ply.save_ply),  # the original 3DGS layout
    ".splat": (splat.load_splat, splat.save_splat),  # antimatter15's 32-byte records
    ".spz": (spz.load_spz, spz.save_spz),  # Niantic's compressed layout
}
SUFFIXES = tuple(FORMATS)

__all__ = ["ARRAY_NAMES", "FORMATS", "SUFFIXES", "load_gaussians", "save_gaussians"]


def _format(path: Path) -> tuple[Loader, Saver]:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(
            f"{path}: unknown splat file type {suffix or '(none)'!r}; expected one of "
            + ", ".join(SUFFIXES)
        )
    return FORMATS[suffix]


def load_gaussians(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a ``.ply`` (3DGS layout), ``.splat`` (antimatter15) or ``.spz`` (Niantic) file.

    Returns:
        ``means`` [N, 3], ``quats`` [N, 4], ``log_scales`` [N, 3], ``opacity_logits`` [N],
        ``sh`` [N, K, 3], float32.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): an unknown suffix, or a malformed file.
    """
    path = Path(path)
    load, _ = _format(path)
    if not path.is_file():
        raise FileNotFoundError(f"splat file not found: {path}")
    return load(path)


def save_gaussians(path: str | Path, gaussians: dict[str, torch.Tensor]) -> Path:
    """Write ``gaussians`` (the dict :func:`load_gaussians` returns) by ``path``'s suffix."""
    path = Path(path)
    _, save = _format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(path, *[gaussians[k] for k in ARRAY_NAMES])
