"""PLY files of Gaussians in the original 3DGS layout (what splat viewers open).

One ``vertex`` element with these properties (any order, any PLY number type)::

    x y z [nx ny nz] f_dc_0 f_dc_1 f_dc_2 f_rest_0 .. f_rest_{R-1} opacity
    scale_0 scale_1 scale_2 rot_0 rot_1 rot_2 rot_3

``R = 3 * ((degree + 1)^2 - 1)`` (45 for degree 3, none for degree 0). ``f_rest`` is
channel-major as in 3DGS: all red higher-band coefficients, then green, then blue. The stored
values are the trainer's parameters (:data:`~._checks.SPLAT_KEYS`): opacity as a logit, scales
as logs, the quaternion (w, x, y, z) unnormalised; ``f_dc`` is ``sh0``, ``f_rest`` ``shN``.
tilesplat writes binary little endian float32 (normals as zeros) and the comment
``SplatRenderMode: mip`` for antialiased models, as Brush and splat-transform do; it reads
ascii and both binary byte orders, ignores (with a note) properties and elements it does not
use, and reads SuperSplat's compressed layout when the vertex element holds
``packed_position`` (:mod:`.compressed_ply`). The Gaussian count is limited only by the file:
a header whose count needs more bytes than the file holds is refused before anything is
allocated.

A small NumPy structured-dtype reader/writer rather than the ``plyfile`` package: the layout is
fixed, and reading it with one ``np.frombuffer`` after checking the header gives exact error
messages for truncated or malformed files with no extra dependency.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ._checks import SplatData, as_arrays, check_count, decoded, malformed, read_file
from .atomic import atomic_writer
from .ply_header import MAX_HEADER, MIP_COMMENT, Element, Header, parse_header

_NORMALS = ("nx", "ny", "nz")
BLOCK = 1 << 16  # Gaussians per block written or read: ~16 MB of records at SH degree 3


def sh_rest_count(degree: int) -> int:
    """Number of ``f_rest_*`` properties for SH ``degree``."""
    return 3 * ((degree + 1) ** 2 - 1)


def _property_names(num_rest: int) -> list[str]:
    return (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(num_rest)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )


def save_ply(
    path: str | Path, splats: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write Gaussians (:data:`~._checks.SPLAT_KEYS`: means [N, 3], scales [N, 3] log, quats
    [N, 4] raw, opacities [N] logits, sh0 [N, 1, 3], shN [N, K - 1, 3]) as a 3DGS PLY,
    atomically (temp file in the same folder, then rename).

    Values are stored as float32: float32 inputs round-trip bitwise through :func:`load_ply`.
    ``antialiased`` adds the ``SplatRenderMode: mip`` comment.
    """
    a = as_arrays(splats)
    n, rest = len(a["means"]), a["shN"].shape[1]
    names = _property_names(3 * rest)
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        + (f"comment {MIP_COMMENT}\n" if antialiased else "")
        + f"element vertex {n}\n"
        + "".join(f"property float {p}\n" for p in names)
        + "end_header\n"
    )
    path = Path(path)
    r = 9 + 3 * rest
    data = np.empty((min(n, BLOCK), len(names)), "<f4")  # one block of records, reused
    with atomic_writer(path) as f:
        f.write(header.encode("ascii"))
        for s in range(0, n, BLOCK):
            e = min(n, s + BLOCK)
            d = data[: e - s]
            d[:, 0:3] = a["means"][s:e]
            d[:, 3:6] = 0.0
            d[:, 6:9] = a["sh0"][s:e, 0, :]
            for c in range(3):  # channel-major in the file
                d[:, 9 + c * rest : 9 + (c + 1) * rest] = a["shN"][s:e, :, c]
            d[:, r] = a["opacities"][s:e]
            d[:, r + 1 : r + 4] = a["scales"][s:e]
            d[:, r + 4 : r + 8] = a["quats"][s:e]
            f.write(memoryview(d).cast("B"))
    return path


def _ascii_values(path: Path, raw: bytes, header: Header, vertex: Element) -> np.ndarray:
    """The vertex values [N, P] float64 of an ascii PLY (elements before it skipped)."""
    skip = 0
    for e in header.elements:
        if e is vertex:
            break
        if e.has_lists:
            raise ValueError(f"{path}: element {e.name!r} before 'vertex' has list properties")
        skip += e.count * len(e.props)
    n, p = vertex.count, len(vertex.props)
    body = raw[header.offset :]
    # every value takes at least two bytes (a digit and a separator)
    check_count(path, n, len(body) // 2 - skip, p, "'element vertex'")
    tokens = body.split(maxsplit=skip + n * p)[skip : skip + n * p]
    if len(tokens) < n * p:
        raise ValueError(
            f"{path}: truncated ascii PLY: {n} vertices need {n * p} values, found {len(tokens)}"
        )
    try:
        values = np.array(tokens).astype(np.float64)
    except ValueError:
        bad = next(t for t in tokens if not _is_number(t))
        raise ValueError(f"{path}: ascii PLY value {bad[:40]!r} is not a number") from None
    return values.reshape(n, p)


def _is_number(token: bytes) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


_FIELDS = {"means": ("x", "y", "z"), "scales": ("scale_0", "scale_1", "scale_2"),
           "quats": ("rot_0", "rot_1", "rot_2", "rot_3"),
           "sh0": ("f_dc_0", "f_dc_1", "f_dc_2")}  # fmt: skip


def _empty(n: int, coeffs: int) -> dict[str, np.ndarray]:
    """Uninitialised float32 Gaussians (:data:`~._checks.SPLAT_KEYS`) of ``n`` rows and
    ``coeffs`` higher SH coefficients per colour."""
    return {"means": np.empty((n, 3), np.float32), "scales": np.empty((n, 3), np.float32),
            "quats": np.empty((n, 4), np.float32), "opacities": np.empty(n, np.float32),
            "sh0": np.empty((n, 1, 3), np.float32),
            "shN": np.empty((n, coeffs, 3), np.float32)}  # fmt: skip


def _fill(out: dict[str, np.ndarray], s: int, col: Callable[[str], np.ndarray]) -> None:
    """Rows ``s .. s + M`` of ``out`` from ``col(property)`` [M] of a block of vertices."""
    m = len(col("x"))
    for key, props in _FIELDS.items():
        dst = out[key].reshape(len(out[key]), -1)
        for i, p in enumerate(props):
            dst[s : s + m, i] = col(p)
    out["opacities"][s : s + m] = col("opacity")
    coeffs = out["shN"].shape[1]
    for i in range(3 * coeffs):  # channel-major in the file
        out["shN"][s : s + m, i % coeffs, i // coeffs] = col(f"f_rest_{i}")


def read_ply(path: str | Path) -> SplatData:
    """Read a Gaussian PLY (3DGS layout, or SuperSplat's compressed one): its Gaussians
    (:data:`~._checks.SPLAT_KEYS`), its antialiased comment and notes on what was ignored.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): a malformed header, a missing property, an f_rest
            count that is not 3 * ((degree + 1)^2 - 1), a count the file cannot hold,
            truncated data, or a value that is not finite.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"PLY file not found: {path}")
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = parse_header(path, f.read(MAX_HEADER))
    vertex = header.element("vertex")
    if vertex is None:
        raise ValueError(f"{path}: no 'element vertex' in the PLY header")
    names = [p for p, _ in vertex.props]
    if "packed_position" in names:
        from .compressed_ply import decode_compressed_ply

        return decode_compressed_ply(path, read_file(path, "PLY"), header)
    if vertex.has_lists:
        raise ValueError(f"{path}: list properties are not supported in a Gaussian PLY's vertices")
    num_rest = sum(1 for p in names if p.startswith("f_rest_"))
    degree = math.isqrt(num_rest // 3 + 1) - 1
    if sh_rest_count(degree) != num_rest:
        raise ValueError(
            f"{path}: {num_rest} f_rest properties; expected 3 * ((degree + 1)^2 - 1) "
            "(0, 9, 24, 45 or 72)"
        )
    used = [p for p in _property_names(num_rest) if p not in _NORMALS]
    missing = [p for p in used if p not in names]
    if missing:
        raise ValueError(f"{path}: missing vertex properties {missing}")
    notes = []
    extra = [p for p in names if p not in used and p not in _NORMALS]
    if extra:
        notes.append(f"{path}: ignored vertex properties {', '.join(extra)}")
    others = [e.name for e in header.elements if e is not vertex]
    if others:
        notes.append(f"{path}: ignored PLY elements {', '.join(others)}")
    n = vertex.count
    with malformed(path, "PLY"):
        if header.fmt == "ascii":
            values = _ascii_values(path, read_file(path, "PLY"), header, vertex)
            index = {p: i for i, p in enumerate(names)}
            out = _empty(n, num_rest // 3)
            _fill(out, 0, lambda p: values[:, index[p]])
        else:
            dtype = vertex.dtype(header.order)
            start = header.offset_of(path, "vertex")
            check_count(path, n, size - start, dtype.itemsize, "'element vertex'")
            out = _empty(n, num_rest // 3)  # only now: the file holds n vertices
            with open(path, "rb") as f:  # block by block: the file is never whole in memory
                f.seek(start)
                for s in range(0, n, BLOCK):
                    v = np.fromfile(f, dtype=dtype, count=min(BLOCK, n - s))
                    _fill(out, s, lambda p, v=v: v[p])
    return decoded(path, out, header.antialiased(), notes)


def load_ply(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a 3DGS PLY (see :func:`read_ply`).

    Returns:
        ``means`` [N, 3], ``scales`` [N, 3], ``quats`` [N, 4], ``opacities`` [N], ``sh0``
        [N, 1, 3], ``shN`` [N, K - 1, 3] (K = (degree + 1)^2), all float32.
    """
    return read_ply(path).gaussians
