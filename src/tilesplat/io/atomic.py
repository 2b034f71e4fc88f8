"""Atomic file writes with the file mode the user's umask implies.

Every file tilesplat writes (PLY, PNG, checkpoints, JSON, TOML, .splat, .spz) goes through a
temp file in the destination folder, fsync and ``os.replace``: a reader sees the old file or
the new one, never a partial one. ``tempfile.mkstemp`` creates its file ``0600``; the file is
given ``0666 & ~umask`` (``0644`` under umask 022) before the rename, as ``open()`` would have,
so that a viewer, a web server or a colleague can read what a run wrote.

A write that fails because the disk is full (or the user's quota or file-size limit is
reached) raises :class:`DiskFullError`, which names the file and says that it is as it was:
the CLI reports it as one line, not a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows.

    Linux reports it in ``/proc/self/status``; elsewhere ``os.umask`` is set and restored at
    once (a brief window in which another thread's new file would get mode 0666 & ~0o022).
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# no room left: the disk, the user's quota, the file-size limit
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFullError(OSError):
    """A file could not be written for want of space; the file was left as it was."""


def _full(exc: BaseException) -> OSError | None:
    """The out-of-space OSError behind ``exc`` (itself, or one it was raised while handling:
    ``torch.save``'s zip writer raises a RuntimeError then), or None."""
    seen: BaseException | None = exc
    for _ in range(16):  # a chain of causes is short; a cycle must not hang
        if seen is None:
            return None
        if isinstance(seen, OSError) and seen.errno in FULL:
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _full_error(path: Path, full: OSError) -> DiskFullError:
    return DiskFullError(full.errno, f"no room to write {path}: {full.strerror} (the file is "
                         "as it was; free some space and run again, or resume a training "
                         "run from its last checkpoint)")


def _temp_file(path: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """``tempfile.mkstemp`` in ``path``'s folder; a DiskFullError where there is no room even
    for the empty file."""
    try:
        return tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=path.parent)
    except OSError as exc:
        full = _full(exc)
        if full is not None:
            raise _full_error(path, full) from exc
        raise


def _discard(tmp: str, path: Path, exc: BaseException) -> None:
    """Remove the temp file of a write that failed with ``exc``; raise a DiskFullError
    naming ``path`` where the failure was for want of space."""
    Path(tmp).unlink(missing_ok=True)
    full = _full(exc)
    if full is not None and not isinstance(exc, DiskFullError):
        raise _full_error(path, full) from exc


def default_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: ``0o666 & ~umask``."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_writer(path: str | Path, fsync: bool = True) -> Iterator[BinaryIO]:
    """A binary file object whose contents replace ``path`` when the block ends normally.

    The temp file (``.NAME.XXXX.tmp`` in the same folder) is removed on any error, and
    ``path`` is left as it was. The folder must exist.

    Raises:
        DiskFullError: the disk (or quota, or file-size limit) had no room for the file.
    """
    path = Path(path)
    fd, tmp = _temp_file(path, f".{path.name}.", ".tmp")
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _discard(tmp, path, exc)
        raise


def atomic_write_bytes(path: str | Path, data: bytes, fsync: bool = True) -> Path:
    """Write ``data`` to ``path`` atomically (folder created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path, fsync=fsync) as f:
        f.write(data)
    return path


@contextlib.contextmanager
def atomic_path(path: str | Path, fsync: bool = True) -> Iterator[Path]:
    """A temporary path in ``path``'s folder, ending in ``path``'s suffix (for a writer that
    takes a file name and picks the format by its suffix, such as ffmpeg), which replaces
    ``path`` when the block ends normally; removed on any error, ``path`` left as it was.
    The folder must exist."""
    path = Path(path)
    fd, tmp = _temp_file(path, f".{path.stem}.", f".tmp{path.suffix}")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, default_file_mode())
        if fsync:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        _discard(tmp, path, exc)
        raise
