"""Point-cloud PLY files (``x y z`` and optional ``red green blue`` vertices), as nerfstudio's
``ply_file_path`` names them: ASCII or binary little/big endian, any other vertex properties
skipped. The file is untrusted: the header is checked and the vertex count bounded by the
file's size before anything is allocated.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1", "short": "i2", "int16": "i2",
    "ushort": "u2", "uint16": "u2", "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}
MAX_HEADER = 64 * 1024


def read_ply_points(path: str | Path) -> tuple[np.ndarray, np.ndarray | None]:
    """(xyz [P, 3] float64, rgb [P, 3] uint8 or None) of a PLY point cloud.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a PLY of vertices with x, y, z (the message names the file and what
            is wrong), or truncated.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"point cloud not found: {path}")
    raw = path.read_bytes()
    end = raw.find(b"end_header", 0, MAX_HEADER)
    if not raw.startswith(b"ply") or end < 0:
        raise ValueError(f"{path}: not a PLY file (no 'ply' ... 'end_header' header)")
    body = raw.index(b"\n", end) + 1
    lines = raw[:end].decode("ascii", errors="replace").splitlines()
    fmt, count, props, element = None, None, [], None
    for ln in lines[1:]:
        tok = ln.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        if tok[0] == "format" and len(tok) >= 2:
            fmt = tok[1]
        elif tok[0] == "element" and len(tok) == 3:
            if element == "vertex":
                break  # vertex properties end here; later elements (faces) are not read
            element = tok[1]
            if element == "vertex":
                try:
                    count = int(tok[2])
                except ValueError:
                    raise ValueError(f"{path}: bad vertex count {tok[2]!r}") from None
            elif count is None:
                raise ValueError(f"{path}: the vertices must be the first element, got {tok[1]}")
        elif tok[0] == "property" and element == "vertex":
            if len(tok) != 3 or tok[1] not in _TYPES:
                raise ValueError(f"{path}: unsupported vertex property {' '.join(tok[1:])!r}")
            props.append((tok[2], tok[1]))
    names = [n for n, _ in props]
    if count is None or not {"x", "y", "z"} <= set(names):
        raise ValueError(f"{path}: no vertex element with x, y, z properties")
    if fmt not in ("ascii", "binary_little_endian", "binary_big_endian"):
        raise ValueError(f"{path}: unknown PLY format {fmt!r}")
    if fmt == "ascii":
        rows = raw[body:].split(b"\n", count)[:count]
        if len(rows) < count:
            raise ValueError(f"{path}: truncated: {count} vertices declared, {len(rows)} found")
        try:
            data = np.array([r.split()[: len(props)] for r in rows], dtype=np.float64)
        except ValueError as e:
            raise ValueError(f"{path}: malformed vertex line ({e})") from e
        if data.shape != (count, len(props)):
            raise ValueError(f"{path}: vertex lines must hold {len(props)} values")
        col = {n: data[:, i] for i, n in enumerate(names)}
    else:
        order = "<" if fmt == "binary_little_endian" else ">"
        dtype = np.dtype([(n, order + _TYPES[t]) for n, t in props])
        if count < 0 or count * dtype.itemsize > len(raw) - body:
            raise ValueError(
                f"{path}: truncated: {count} vertices of {dtype.itemsize} bytes declared, "
                f"{len(raw) - body} bytes follow the header"
            )
        arr = np.frombuffer(raw, dtype=dtype, count=count, offset=body)
        col = {n: arr[n].astype(np.float64) for n in names}
    xyz = np.stack([col["x"], col["y"], col["z"]], -1)
    _check_finite(path, xyz, "position")
    rgb = None
    if {"red", "green", "blue"} <= set(names):
        rgb = np.stack([col["red"], col["green"], col["blue"]], -1)
        _check_finite(path, rgb, "colour")  # float colours: NaN would cast to any byte
        rgb = np.clip(rgb, 0, 255).astype(np.uint8)
    return xyz, rgb


def _check_finite(path: Path, values: np.ndarray, what: str) -> None:
    """Raises ValueError naming the first vertex of ``values`` [P, 3] with a NaN or infinite
    ``what`` (its position, its colour)."""
    bad = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"{path}: vertex {i} has a non-finite {what} "
                         f"{tuple(values[i].tolist())}; {len(bad)} of the {len(values)} "
                         "vertices do")
