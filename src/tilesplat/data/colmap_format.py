"""Readers of COLMAP's sparse model files, binary and text, as documented at
https://colmap.github.io/format.html. Every malformed or truncated file raises a ValueError
naming the file and what was expected.

Written here rather than depending on ``pycolmap``: the reader is ~250 lines of ``struct``, and
pycolmap is a large compiled wheel (with its own ceres / OpenCV-style stack) that is not built
for every platform and Python we support; loading a model needs none of it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# COLMAP's camera models: model_id -> (name, number of parameters), from its
# src/colmap/sensor/models.h
COLMAP_MODELS_BY_ID: dict[int, tuple[str, int]] = {
    0: ("SIMPLE_PINHOLE", 3),
    1: ("PINHOLE", 4),
    2: ("SIMPLE_RADIAL", 4),
    3: ("RADIAL", 5),
    4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8),
    6: ("FULL_OPENCV", 12),
    7: ("FOV", 5),
    8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5),
    10: ("THIN_PRISM_FISHEYE", 12),
    11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
    12: ("SIMPLE_DIVISION", 4),
    13: ("DIVISION", 5),
    14: ("SIMPLE_FISHEYE", 3),
    15: ("FISHEYE", 4),
    16: ("EUCM", 6),
    17: ("EQUIRECTANGULAR", 2),
}
COLMAP_MODELS_BY_NAME = {name: (mid, n) for mid, (name, n) in COLMAP_MODELS_BY_ID.items()}


@dataclass
class ColmapCamera:
    camera_id: int
    model: str
    width: int
    height: int
    params: np.ndarray  # [num_params] float64


@dataclass
class ColmapImage:
    image_id: int
    qvec: np.ndarray  # [4] float64 (w, x, y, z), world-to-camera rotation
    tvec: np.ndarray  # [3] float64, world-to-camera translation
    camera_id: int
    name: str


class _Reader:
    """A cursor over a byte buffer whose reads fail with a message naming the file."""

    def __init__(self, path: Path):
        self.path = path
        self.buf = path.read_bytes()
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError(
                f"{self.path}: truncated or corrupt file: needed {n} bytes for {what} at "
                f"offset {self.pos}, but the file has {len(self.buf)} bytes"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def count(self, what: str, item_size: int) -> int:
        """A uint64 count that must fit in the rest of the file at ``item_size`` bytes each."""
        (n,) = self.unpack("Q", f"the number of {what}")
        if n * item_size > len(self.buf) - self.pos:
            raise ValueError(
                f"{self.path}: truncated or corrupt file: it declares {n} {what} "
                f"(>= {n * item_size} bytes) but only {len(self.buf) - self.pos} bytes follow"
            )
        return n

    def cstring(self, what: str) -> str:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ValueError(f"{self.path}: truncated file: unterminated {what}")
        raw = self.take(end - self.pos + 1, what)[:-1]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{self.path}: {what} is not valid UTF-8") from e

    def finish(self) -> None:
        if self.pos != len(self.buf):
            raise ValueError(
                f"{self.path}: corrupt file: {len(self.buf) - self.pos} unexpected bytes after "
                f"the last record (offset {self.pos})"
            )


def read_cameras_bin(path: Path) -> dict[int, ColmapCamera]:
    r = _Reader(path)
    cams = {}
    for _ in range(r.count("cameras", 24)):
        cam_id, model_id, w, h = r.unpack("iiQQ", "a camera record")
        if model_id not in COLMAP_MODELS_BY_ID:
            raise ValueError(f"{path}: camera {cam_id} has unknown camera model id {model_id}")
        name, n = COLMAP_MODELS_BY_ID[model_id]
        params = np.array(r.unpack(f"{n}d", f"the {n} parameters of camera {cam_id}"))
        cams[cam_id] = ColmapCamera(cam_id, name, int(w), int(h), params)
    r.finish()
    return cams


def read_images_bin(path: Path) -> dict[int, ColmapImage]:
    r = _Reader(path)
    images = {}
    for _ in range(r.count("images", 64 + 1 + 8)):
        vals = r.unpack("i7di", "an image record")
        name = r.cstring(f"the name of image {vals[0]}")
        n2d = r.count(f"2D points of image {vals[0]}", 24)
        r.take(24 * n2d, f"the 2D points of image {vals[0]}")
        images[vals[0]] = ColmapImage(
            vals[0], np.array(vals[1:5]), np.array(vals[5:8]), vals[8], name
        )
    r.finish()
    return images


@dataclass
class Tracks:
    """Which images see which 3D points: one entry per track element of points3D.

    Attributes:
        point: [T] int64, the point's row in the model's xyz (0-based, file order).
        image: [T] int64, the IMAGE_ID that observes it.
    """

    point: np.ndarray
    image: np.ndarray

    def of_image(self) -> dict[int, np.ndarray]:
        """IMAGE_ID -> the sorted unique rows of the points it sees."""
        if len(self.image) == 0:
            return {}
        order = np.argsort(self.image, kind="stable")
        ids, starts = np.unique(self.image[order], return_index=True)
        parts = np.split(self.point[order], starts[1:])
        return {int(i): np.unique(p) for i, p in zip(ids, parts, strict=True)}


def _tracks(points: list[np.ndarray], images: list[np.ndarray]) -> Tracks:
    empty = np.zeros(0, dtype=np.int64)
    return Tracks(np.concatenate(points).astype(np.int64) if points else empty,
                  np.concatenate(images).astype(np.int64) if images else empty)


def read_points3d_bin_tracks(path: Path) -> tuple[np.ndarray, np.ndarray, Tracks]:
    """(xyz [P, 3] float64, rgb [P, 3] uint8, the tracks); every array is bounded by the
    file's size (the counts are checked against the bytes that follow)."""
    r = _Reader(path)
    n = r.count("3D points", 43 + 8)
    xyz = np.empty((n, 3))
    rgb = np.empty((n, 3), dtype=np.uint8)
    ids = np.empty(n, dtype=np.uint64)
    rows, seen = [], []
    for i in range(n):
        vals = r.unpack("Q3d3Bd", f"3D point record {i}")
        ids[i] = vals[0]
        xyz[i] = vals[1:4]
        rgb[i] = vals[4:7]
        track = r.count(f"track entries of 3D point {vals[0]}", 8)
        raw = r.take(8 * track, f"the track of 3D point {vals[0]}")
        if track:  # (IMAGE_ID int32, POINT2D_IDX int32) pairs
            seen.append(np.frombuffer(raw, dtype="<i4")[0::2])
            rows.append(np.full(track, i, dtype=np.int64))
    r.finish()
    _check_finite_points(xyz, lambda i: f"{path}: 3D point {i} (POINT3D_ID {ids[i]})")
    return xyz, rgb, _tracks(rows, seen)


def _check_finite_points(xyz: np.ndarray, where: Callable[[int], str]) -> None:
    """Raises ValueError naming the first point of ``xyz`` [P, 3] (``where(row)``) that has a
    NaN or infinite coordinate: it would reach the initial Gaussians, and the first step."""
    bad = np.flatnonzero(~np.isfinite(xyz).all(axis=1))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{where(i)} has a non-finite position {tuple(xyz[i].tolist())}; "
                         f"{len(bad)} of the {len(xyz)} points do")


def read_points3d_bin(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(xyz [P, 3] float64, rgb [P, 3] uint8)."""
    xyz, rgb, _ = read_points3d_bin_tracks(path)
    return xyz, rgb


def _text_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, line) of a text file, comments removed, empty lines kept."""
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text file ({e})") from e
    return [(i + 1, ln.strip()) for i, ln in enumerate(text.splitlines()) if not ln.startswith("#")]


def _parse(path: Path, lineno: int, tokens: list[str], types: list[type], what: str) -> list:
    if len(tokens) < len(types):
        raise ValueError(
            f"{path}:{lineno}: expected {what} ({len(types)} values), got {len(tokens)} values"
        )
    try:
        return [t(v) for t, v in zip(types, tokens, strict=False)]
    except ValueError as e:
        raise ValueError(f"{path}:{lineno}: malformed {what}: {e}") from e


def read_cameras_txt(path: Path) -> dict[int, ColmapCamera]:
    cams = {}
    for lineno, line in _text_lines(path):
        if not line:
            continue
        tok = line.split()
        cam_id, model, w, h = _parse(path, lineno, tok, [int, str, int, int], "a camera line")
        if model not in COLMAP_MODELS_BY_NAME:
            raise ValueError(f"{path}:{lineno}: unknown camera model {model!r}")
        n = COLMAP_MODELS_BY_NAME[model][1]
        params = _parse(path, lineno, tok[4:], [float] * n, f"{n} parameters of {model}")
        if len(tok) != 4 + n:
            raise ValueError(f"{path}:{lineno}: {model} takes {n} parameters, got {len(tok) - 4}")
        cams[cam_id] = ColmapCamera(cam_id, model, w, h, np.array(params))
    return cams


def read_images_txt(path: Path) -> dict[int, ColmapImage]:
    """Two lines per image: the pose line, then the 2D points line (which may be empty)."""
    lines = _text_lines(path)
    images = {}
    i = 0
    while i < len(lines):
        lineno, line = lines[i]
        i += 1
        if not line:
            continue
        tok = line.split(maxsplit=9)
        vals = _parse(path, lineno, tok, [int] + [float] * 7 + [int, str], "an image line")
        i += 1  # the points line; it is not needed
        images[vals[0]] = ColmapImage(
            vals[0], np.array(vals[1:5]), np.array(vals[5:8]), vals[8], vals[9]
        )
    return images


def read_points3d_txt_tracks(path: Path) -> tuple[np.ndarray, np.ndarray, Tracks]:
    """(xyz [P, 3] float64, rgb [P, 3] uint8, the tracks)."""
    xyz, rgb, rows, seen, linenos = [], [], [], [], []
    for lineno, line in _text_lines(path):
        if not line:
            continue
        tok = line.split()
        v = _parse(path, lineno, tok, [int] + [float] * 3 + [int] * 3 + [float], "a 3D point")
        if (len(tok) - 8) % 2:
            raise ValueError(f"{path}:{lineno}: the track must hold (IMAGE_ID, POINT2D_IDX) pairs")
        if not all(0 <= c <= 255 for c in v[4:7]):
            raise ValueError(f"{path}:{lineno}: colour values must be in 0..255")
        if len(tok) > 8:
            try:
                ids = np.array(tok[8::2], dtype=np.int64)
            except ValueError as e:
                raise ValueError(f"{path}:{lineno}: malformed track: {e}") from e
            seen.append(ids)
            rows.append(np.full(len(ids), len(xyz), dtype=np.int64))
        xyz.append(v[1:4])
        rgb.append(v[4:7])
        linenos.append(lineno)
    points = np.array(xyz, dtype=np.float64).reshape(-1, 3)
    _check_finite_points(points, lambda i: f"{path}:{linenos[i]}: 3D point {i}")
    return points, np.array(rgb, dtype=np.uint8).reshape(-1, 3), _tracks(rows, seen)


def read_model(
    sparse: Path,
) -> tuple[dict[int, ColmapCamera], dict[int, ColmapImage], np.ndarray, np.ndarray]:
    """Read cameras, images, points3D from ``sparse`` (``.bin`` preferred over ``.txt``).

    Returns:
        (cameras, images, xyz [P, 3] float64, rgb [P, 3] uint8)
    """
    cams, images, xyz, rgb, _ = read_model_tracks(sparse)
    return cams, images, xyz, rgb


def read_model_tracks(
    sparse: Path,
) -> tuple[dict[int, ColmapCamera], dict[int, ColmapImage], np.ndarray, np.ndarray, Tracks]:
    """:func:`read_model` and the points' tracks (which images see each point)."""
    readers = {
        "cameras": (read_cameras_bin, read_cameras_txt),
        "images": (read_images_bin, read_images_txt),
        "points3D": (read_points3d_bin_tracks, read_points3d_txt_tracks),
    }
    out = {}
    for stem, (rbin, rtxt) in readers.items():
        if (sparse / f"{stem}.bin").is_file():
            out[stem] = rbin(sparse / f"{stem}.bin")
        elif (sparse / f"{stem}.txt").is_file():
            out[stem] = rtxt(sparse / f"{stem}.txt")
        else:
            raise FileNotFoundError(f"COLMAP model file not found: {sparse / stem}.bin (or .txt)")
    xyz, rgb, tracks = out["points3D"]
    return out["cameras"], out["images"], xyz, rgb, tracks


def qvec_to_rotmat(q: np.ndarray) -> np.ndarray:
    """[4] quaternion (w, x, y, z), normalised here -> [3, 3] rotation matrix."""
    w, x, y, z = q / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )
