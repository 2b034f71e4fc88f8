"""Writers of COLMAP's sparse model files, binary and text (https://colmap.github.io/format.html).

The captures the tests and benchmarks ray cast (:mod:`.captures`) are written with these, in
either format, so that both of :mod:`.colmap_format`'s readers are exercised. Given
``observations`` (which image sees which point, where), images carry their 2D points and points
their tracks, as COLMAP writes them; else neither. Files are written atomically.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..io.atomic import atomic_write_bytes
from .colmap_format import COLMAP_MODELS_BY_NAME, ColmapCamera, ColmapImage


def _f(v: float) -> str:
    return repr(float(v))


def write_model(
    sparse: str | Path,
    cameras: list[ColmapCamera],
    images: list[ColmapImage],
    xyz: np.ndarray,  # [P, 3]
    rgb: np.ndarray,  # [P, 3] uint8
    fmt: str = "bin",
    observations: list[tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Write ``cameras``, ``images`` and ``points3D`` into the folder ``sparse`` (created) as
    ``.bin`` (``fmt = "bin"``) or ``.txt`` files. ``observations``: per image (in the order
    of ``images``) the pixel positions [M, 2] and the rows in ``xyz`` [M] of the points it
    sees, written as its 2D points and as the points' tracks. Returns the folder."""
    if fmt not in ("bin", "txt"):
        raise ValueError(f"fmt must be 'bin' or 'txt', got {fmt!r}")
    out = Path(sparse)
    out.mkdir(parents=True, exist_ok=True)
    xyz = np.asarray(xyz, dtype=np.float64).reshape(-1, 3)
    rgb = np.asarray(rgb, dtype=np.uint8).reshape(-1, 3)
    obs = observations if observations is not None else [(np.zeros((0, 2)),
                                                           np.zeros(0, np.int64))] * len(images)
    if len(obs) != len(images):
        raise ValueError(f"observations: {len(obs)} entries for {len(images)} images")
    tracks: list[list[tuple[int, int]]] = [[] for _ in range(len(xyz))]
    for im, (_, rows) in zip(images, obs, strict=True):
        for k, row in enumerate(np.asarray(rows).tolist()):
            tracks[row].append((im.image_id, k))
    if fmt == "txt":
        cams = "".join(
            f"{c.camera_id} {c.model} {c.width} {c.height} "
            + " ".join(_f(v) for v in c.params) + "\n" for c in cameras
        )
        ims = "".join(
            f"{im.image_id} {' '.join(_f(v) for v in (*im.qvec, *im.tvec))} {im.camera_id} "
            f"{im.name}\n"
            + " ".join(f"{_f(x)} {_f(y)} {row + 1}"
                       for (x, y), row in zip(np.asarray(xy).tolist(), np.asarray(rows).tolist(),
                                              strict=True)) + "\n"
            for im, (xy, rows) in zip(images, obs, strict=True)
        )
        pts = "".join(
            f"{j + 1} {_f(p[0])} {_f(p[1])} {_f(p[2])} {c[0]} {c[1]} {c[2]} 0.5"
            + "".join(f" {i} {k}" for i, k in tracks[j]) + "\n"
            for j, (p, c) in enumerate(zip(xyz.tolist(), rgb.tolist(), strict=True))
        )
        for stem, text in (("cameras", cams), ("images", ims), ("points3D", pts)):
            atomic_write_bytes(out / f"{stem}.txt", text.encode("utf-8"), fsync=False)
        return out
    buf = bytearray(struct.pack("<Q", len(cameras)))
    for c in cameras:
        model_id = COLMAP_MODELS_BY_NAME[c.model][0]
        buf += struct.pack("<iiQQ", c.camera_id, model_id, c.width, c.height)
        buf += struct.pack(f"<{len(c.params)}d", *c.params)
    atomic_write_bytes(out / "cameras.bin", bytes(buf), fsync=False)
    buf = bytearray(struct.pack("<Q", len(images)))
    for im, (xy, rows) in zip(images, obs, strict=True):
        buf += struct.pack("<i7di", im.image_id, *im.qvec, *im.tvec, im.camera_id)
        buf += im.name.encode("utf-8") + b"\0" + struct.pack("<Q", len(rows))
        for (x, y), row in zip(np.asarray(xy).tolist(), np.asarray(rows).tolist(), strict=True):
            buf += struct.pack("<ddq", x, y, row + 1)
    atomic_write_bytes(out / "images.bin", bytes(buf), fsync=False)
    buf = bytearray(struct.pack("<Q", len(xyz)))
    for j, (p, c) in enumerate(zip(xyz, rgb, strict=True)):
        buf += struct.pack("<Q3d3BdQ", j + 1, *p, *c, 0.5, len(tracks[j]))
        for i, k in tracks[j]:
            buf += struct.pack("<ii", i, k)
    atomic_write_bytes(out / "points3D.bin", bytes(buf), fsync=False)
    return out


def rotmat_to_qvec(r: np.ndarray) -> np.ndarray:
    """[4] unit quaternion (w, x, y, z), w >= 0, of a rotation matrix [3, 3] (the inverse of
    :func:`.colmap_format.qvec_to_rotmat`; Bar-Itzhack's symmetric-matrix method)."""
    r = np.asarray(r, dtype=np.float64)
    k = np.array([
        [r[0, 0] - r[1, 1] - r[2, 2], r[1, 0] + r[0, 1], r[2, 0] + r[0, 2], r[2, 1] - r[1, 2]],
        [r[1, 0] + r[0, 1], r[1, 1] - r[0, 0] - r[2, 2], r[2, 1] + r[1, 2], r[0, 2] - r[2, 0]],
        [r[2, 0] + r[0, 2], r[2, 1] + r[1, 2], r[2, 2] - r[0, 0] - r[1, 1], r[1, 0] - r[0, 1]],
        [r[2, 1] - r[1, 2], r[0, 2] - r[2, 0], r[1, 0] - r[0, 1], r[0, 0] + r[1, 1] + r[2, 2]],
    ]) / 3.0
    w, v = np.linalg.eigh(k)
    q = v[[3, 0, 1, 2], np.argmax(w)]
    return q if q[0] >= 0 else -q
