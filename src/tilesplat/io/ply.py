"""PLY files of Gaussians in the original 3DGS layout (what splat viewers open).

One ``vertex`` element, binary little endian, float32 properties in this order::

    x y z nx ny nz f_dc_0 f_dc_1 f_dc_2 f_rest_0 .. f_rest_{R-1} opacity
    scale_0 scale_1 scale_2 rot_0 rot_1 rot_2 rot_3

``R = 3 * ((degree + 1)^2 - 1)`` (45 for degree 3, none for degree 0). ``f_rest`` is
channel-major as in 3DGS: all red higher-band coefficients, then green, then blue. The stored
values are the raw parameters: opacity as a logit, scales as logs, the quaternion (w, x, y, z)
unnormalised; normals are written as zeros.

A small NumPy structured-dtype reader/writer rather than the ``plyfile`` package: the layout is
fixed, and reading it with one ``np.frombuffer`` after checking the header gives exact error
messages for truncated or malformed files with no extra dependency.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ._checks import as_arrays, to_tensors
from .atomic import atomic_writer

_PLY_TYPES = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}  # fmt: skip
_MAX_HEADER = 1 << 16


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
    path: str | Path,
    means: torch.Tensor,  # [N, 3]
    quats: torch.Tensor,  # [N, 4] (w, x, y, z), raw
    log_scales: torch.Tensor,  # [N, 3]
    opacity_logits: torch.Tensor,  # [N]
    sh: torch.Tensor,  # [N, K, 3], K = (degree + 1)^2
) -> Path:
    """Write Gaussians as a 3DGS PLY, atomically (temp file in the same folder, then rename).

    Values are stored as float32: float32 inputs round-trip bitwise through :func:`load_ply`.
    """
    a = as_arrays(means, quats, log_scales, opacity_logits, sh)
    n, k = a["sh"].shape[:2]
    cols = {
        "xyz": a["means"],
        "dc": a["sh"][:, 0, :],
        "rest": a["sh"][:, 1:, :].transpose(0, 2, 1).reshape(n, 3 * (k - 1)),  # channel-major
        "opacity": a["opacity_logits"][:, None],
        "scale": a["log_scales"],
        "rot": a["quats"],
    }
    names = _property_names(3 * (k - 1))
    data = np.concatenate(
        [cols["xyz"], np.zeros((n, 3), "<f4"), cols["dc"], cols["rest"], cols["opacity"],
         cols["scale"], cols["rot"]],
        axis=1,
    ).astype("<f4")  # fmt: skip
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        + f"element vertex {n}\n"
        + "".join(f"property float {p}\n" for p in names)
        + "end_header\n"
    )
    path = Path(path)
    with atomic_writer(path) as f:
        f.write(header.encode("ascii"))
        f.write(np.ascontiguousarray(data).tobytes())
    return path


def _parse_header(path: Path, raw: bytes) -> tuple[int, int, list[tuple[str, str]]]:
    """(data offset, vertex count, [(property, numpy type)]) of the vertex element."""
    end = raw.find(b"end_header\n", 0, _MAX_HEADER)
    if not raw.startswith(b"ply\n") or end < 0:
        raise ValueError(f"{path}: not a PLY file (no 'ply' magic line or no 'end_header')")
    try:
        lines = raw[:end].decode("ascii").splitlines()[1:]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: PLY header is not ASCII") from e
    fmt = None
    elements: list[tuple[str, int, list[tuple[str, str]]]] = []
    for ln in lines:
        tok = ln.split()
        if not tok or tok[0] in ("comment", "obj_info"):
            continue
        if tok[0] == "format" and len(tok) == 3:
            fmt = tok[1]
        elif tok[0] == "element" and len(tok) == 3 and tok[2].isdigit():
            elements.append((tok[1], int(tok[2]), []))
        elif tok[0] == "property" and len(tok) == 3 and elements and tok[1] in _PLY_TYPES:
            elements[-1][2].append((tok[2], _PLY_TYPES[tok[1]]))
        elif tok[0] == "property" and tok[1:2] == ["list"]:
            raise ValueError(f"{path}: list properties are not supported in a Gaussian PLY")
        else:
            raise ValueError(f"{path}: malformed PLY header line {ln!r}")
    if fmt != "binary_little_endian":
        raise ValueError(f"{path}: expected 'format binary_little_endian 1.0', got {fmt!r}")
    if not elements or elements[0][0] != "vertex":
        raise ValueError(f"{path}: expected 'element vertex' as the first element")
    _, count, props = elements[0]
    return end + len(b"end_header\n"), count, props


def load_ply(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a 3DGS PLY.

    Returns:
        ``means`` [N, 3], ``quats`` [N, 4], ``log_scales`` [N, 3], ``opacity_logits`` [N],
        ``sh`` [N, K, 3] (K = (degree + 1)^2), all float32.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): not a binary little-endian PLY, a missing property, an
            f_rest count that is not 3 * ((degree + 1)^2 - 1), or truncated data.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"PLY file not found: {path}")
    raw = path.read_bytes()
    offset, n, props = _parse_header(path, raw)
    names = [p for p, _ in props]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate vertex properties")
    num_rest = sum(1 for p in names if p.startswith("f_rest_"))
    degree = math.isqrt(num_rest // 3 + 1) - 1
    if sh_rest_count(degree) != num_rest:
        raise ValueError(
            f"{path}: {num_rest} f_rest properties; expected 3 * ((degree + 1)^2 - 1) "
            "(0, 9, 24 or 45)"
        )
    required = [p for p in _property_names(num_rest) if p not in ("nx", "ny", "nz")]
    missing = [p for p in required if p not in names]
    if missing:
        raise ValueError(f"{path}: missing vertex properties {missing}")
    dtype = np.dtype([(p, "<" + t) for p, t in props])
    if len(raw) - offset < n * dtype.itemsize:
        raise ValueError(
            f"{path}: truncated PLY: {n} vertices need {n * dtype.itemsize} bytes of data, "
            f"the file has {len(raw) - offset}"
        )
    v = np.frombuffer(raw, dtype=dtype, count=n, offset=offset)

    def cols(*ps: str) -> np.ndarray:
        return np.stack([v[p].astype(np.float32) for p in ps], axis=1) if ps else np.zeros((n, 0))

    k = (degree + 1) ** 2
    rest = cols(*[f"f_rest_{i}" for i in range(num_rest)]).reshape(n, 3, k - 1)
    return to_tensors({
        "means": cols("x", "y", "z"),
        "quats": cols("rot_0", "rot_1", "rot_2", "rot_3"),
        "log_scales": cols("scale_0", "scale_1", "scale_2"),
        "opacity_logits": cols("opacity")[:, 0],
        "sh": np.concatenate([cols("f_dc_0", "f_dc_1", "f_dc_2")[:, None, :],
                              rest.transpose(0, 2, 1)], axis=1),
    })  # fmt: skip
