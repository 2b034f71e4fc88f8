"""glTF 2.0 binary files (``.glb``) with Khronos's ``KHR_gaussian_splatting`` extension.

A point primitive (``mode`` 0) of one mesh carries the Gaussians as vertex attributes::

    POSITION                                     VEC3 float  the mean
    KHR_gaussian_splatting:ROTATION              VEC4        unit quaternion (x, y, z, w)
    KHR_gaussian_splatting:SCALE                 VEC3        linear scales (not logs), >= 0
    KHR_gaussian_splatting:OPACITY               SCALAR      in [0, 1] (the sigmoid applied)
    KHR_gaussian_splatting:SH_DEGREE_0_COEF_0    VEC3 float  dc coefficients, as in a PLY
    KHR_gaussian_splatting:SH_DEGREE_l_COEF_m    VEC3 float  degrees 1-3, m = 0 .. 2l
    COLOR_0                                      VEC4 ubyte  optional point-cloud fallback

and the primitive's extension object names the kernel (``ellipse``) and colour space
(``srgb_rec709_display``). ROTATION, SCALE and OPACITY may be normalised integers as the
spec allows; tilesplat writes float32 everywhere, so the file keeps every value but the
logs and logits (float32 ``exp`` / ``sigmoid`` of them). glTF's frame is ``LUF`` (+y up,
+z forward, -x right): tilesplat turns its ``RDF`` Gaussians a half turn about z on write and
back on read, as splat-transform's writer does (:mod:`.axes`).

Read: every Gaussian primitive of the file, concatenated; a node transform, a sparse or
external buffer, or a required extension other than this one is refused rather than misread.
"""

from __future__ import annotations

import io
import json
import mmap
import struct
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from ..sh_rgb import rgb_to_sh0, sh0_to_rgb
from ._checks import (
    Cursor,
    SplatData,
    all_sh,
    as_arrays,
    check_writable,
    decoded,
    malformed,
    sh_degree,
    split_sh,
)
from .atomic import atomic_writer
from .axes import GLTF_FRAME, PLY_FRAME, change_frame, frame_matrix

EXT = "KHR_gaussian_splatting"
MAGIC = 0x46546C67  # "glTF"
CHUNK_JSON = 0x4E4F534A
CHUNK_BIN = 0x004E4942
_COMPONENTS = {5120: ("i1", 127.0), 5121: ("u1", 255.0), 5122: ("<i2", 32767.0),
               5123: ("<u2", 65535.0), 5125: ("<u4", None), 5126: ("<f4", None)}  # fmt: skip
_WIDTH = {"SCALAR": 1, "VEC2": 2, "VEC3": 3, "VEC4": 4}
_IDENTITY = {"matrix": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1],
             "translation": [0, 0, 0], "rotation": [0, 0, 0, 1], "scale": [1, 1, 1]}  # fmt: skip
_OPACITY_EPS = 1e-7
_BLOCK = 1 << 16  # Gaussians converted and written at a time


def _sh_names(degree: int) -> list[str]:
    """Attribute names of the SH coefficients 0 .. (degree + 1)^2 - 1, in order."""
    return [f"{EXT}:SH_DEGREE_{d}_COEF_{m}" for d in range(degree + 1) for m in range(2 * d + 1)]


def _attributes(a: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray, int, str, bool]]:
    """(name, values [M, width], component type, type, normalised) of every attribute of the
    Gaussians ``a`` (the 3DGS frame, M rows), in the file's order."""
    a = change_frame(a, PLY_FRAME, GLTF_FRAME)
    q = a["quats"].astype(np.float64)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    opacity = 1.0 / (1.0 + np.exp(-a["opacities"].astype(np.float64)))
    rgba = np.concatenate([sh0_to_rgb(a["sh0"][:, 0, :]), opacity[:, None]], axis=1)
    attrs: list[tuple[str, np.ndarray, int, str, bool]] = [
        ("POSITION", a["means"], 5126, "VEC3", False),
        ("COLOR_0", np.clip(np.round(rgba * 255), 0, 255).astype(np.uint8), 5121, "VEC4", True),
        (f"{EXT}:ROTATION", q[:, [1, 2, 3, 0]], 5126, "VEC4", False),
        (f"{EXT}:SCALE", np.exp(a["scales"].astype(np.float64)), 5126, "VEC3", False),
        (f"{EXT}:OPACITY", opacity[:, None], 5126, "SCALAR", False),
    ]
    sh = all_sh(a)  # one attribute per coefficient, 0 .. K - 1
    for j, name in enumerate(_sh_names(sh_degree(a))):
        attrs.append((name, sh[:, j, :], 5126, "VEC3", False))
    return attrs


def _write_glb(f: BinaryIO, splats: dict[str, torch.Tensor]) -> None:
    """The ``.glb`` of the Gaussians written to the seekable ``f``: the JSON first, then
    the binary chunk filled a block of Gaussians at a time (one view per attribute)."""
    a = as_arrays(splats)
    check_writable(a, "glTF KHR_gaussian_splatting", 3)
    if (a["scales"] > 88.0).any():
        raise ValueError("scales: a scale above exp(88) does not fit a float32 SCALE")
    n = len(a["means"])
    first = _attributes({k: v[:1] for k, v in a.items()})
    m = frame_matrix(PLY_FRAME, GLTF_FRAME)
    lo, hi = np.full(3, np.inf, np.float32), np.full(3, -np.inf, np.float32)
    for s in range(0, n, _BLOCK):  # POSITION's bounds, as change_frame computes the means
        p = (a["means"][s : s + _BLOCK].astype(np.float64) @ m.T).astype(np.float32)
        lo, hi = np.minimum(lo, p.min(0)), np.maximum(hi, p.max(0))
    views, accessors, attributes, offset = [], [], {}, 0
    for i, (name, _, ctype, kind, norm) in enumerate(first):
        length = n * _WIDTH[kind] * np.dtype(_COMPONENTS[ctype][0]).itemsize
        views.append({"buffer": 0, "byteOffset": offset, "byteLength": length,
                      "target": 34962})  # fmt: skip
        acc = {"bufferView": i, "componentType": ctype, "count": n, "type": kind}
        if norm:
            acc["normalized"] = True
        if name == "POSITION":
            acc["min"], acc["max"] = lo.tolist(), hi.tolist()
        accessors.append(acc)
        attributes[name] = i
        offset += length + (-length % 4)
    gltf = {
        "asset": {"version": "2.0", "generator": "tilesplat"},
        "extensionsUsed": [EXT],
        "scene": 0,
        "scenes": [{"nodes": [0]}],
        "nodes": [{"mesh": 0}],
        "meshes": [{"primitives": [{
            "attributes": attributes, "mode": 0,
            "extensions": {EXT: {"kernel": "ellipse", "colorSpace": "srgb_rec709_display",
                                 "sortingMethod": "cameraDistance",
                                 "projection": "perspective"}},
        }]}],
        "buffers": [{"byteLength": offset}],
        "bufferViews": views,
        "accessors": accessors,
    }  # fmt: skip
    js = json.dumps(gltf, separators=(",", ":")).encode("utf-8")
    js += b" " * (-len(js) % 4)
    total = 12 + 8 + len(js) + 8 + offset
    f.write(struct.pack("<III", MAGIC, 2, total) + struct.pack("<II", len(js), CHUNK_JSON) + js
            + struct.pack("<II", offset, CHUNK_BIN))  # fmt: skip
    base = f.tell()
    for s in range(0, n, _BLOCK):
        block = _attributes({k: v[s : s + _BLOCK] for k, v in a.items()})
        for view, (_, arr, ctype, _, _) in zip(views, block, strict=True):
            data = np.ascontiguousarray(arr, _COMPONENTS[ctype][0])
            f.seek(base + view["byteOffset"] + s * (view["byteLength"] // n))
            f.write(memoryview(data).cast("B"))
    f.seek(base + offset)
    f.truncate()  # the padding of the last view, if any, as zeros


def encode_glb(splats: dict[str, torch.Tensor]) -> bytes:
    """The ``.glb`` bytes of the Gaussians (:data:`~._checks.SPLAT_KEYS`, SH degree <= 3; see
    the module docstring)."""
    buf = io.BytesIO()
    _write_glb(buf, splats)
    return buf.getvalue()


def save_glb(
    path: str | Path, splats: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write Gaussians (:data:`~._checks.SPLAT_KEYS`, SH degree <= 3) as a ``.glb``,
    atomically, a block of Gaussians at a time. The extension has no antialiased flag:
    ``antialiased`` is accepted and not recorded."""
    path = Path(path)
    with atomic_writer(path) as f:
        _write_glb(f, splats)
    return path


class _Gltf:
    def __init__(self, path: Path, doc: dict, binary: memoryview | None) -> None:
        self.path, self.doc, self.bin = path, doc, binary

    def get(self, key: str, i: object) -> dict:
        items = self.doc.get(key)
        if (not isinstance(items, list) or isinstance(i, bool) or not isinstance(i, int)
                or not 0 <= i < len(items) or not isinstance(items[i], dict)):  # fmt: skip
            raise ValueError(f"{self.path}: glTF {key}[{i!r}] does not exist")
        return items[i]

    def accessor(self, index: object, what: str, s: int = 0,
                 e: int | None = None) -> tuple[np.ndarray, int]:
        """(values [e - s, width] float64 of rows ``s .. e`` (all by default), count) of
        accessor ``index``."""
        acc = self.get("accessors", index)
        if "sparse" in acc:
            raise ValueError(f"{self.path}: {what}: sparse accessors are not supported")
        ctype, kind, count = acc.get("componentType"), acc.get("type"), acc.get("count")
        if ctype not in _COMPONENTS or kind not in _WIDTH:
            raise ValueError(f"{self.path}: {what}: component type {ctype!r} / type {kind!r}")
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"{self.path}: {what}: count {count!r}")
        view = self.get("bufferViews", acc.get("bufferView"))
        if view.get("buffer") != 0 or self.bin is None:
            raise ValueError(f"{self.path}: {what}: only the GLB's own binary chunk is read")
        if "uri" in self.get("buffers", 0):
            raise ValueError(f"{self.path}: {what}: external buffers are not supported")
        code, scale = _COMPONENTS[ctype]
        width = _WIDTH[kind]
        item = np.dtype(code).itemsize * width
        stride = view.get("byteStride", item)
        v_off, v_len, a_off = view.get("byteOffset", 0), view.get("byteLength"), acc.get(
            "byteOffset", 0)
        ints = (stride, v_off, v_len, a_off)
        if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in ints) or (
            stride < item
        ):
            raise ValueError(f"{self.path}: {what}: malformed buffer view or offsets")
        if v_off + v_len > len(self.bin) or a_off + stride * (count - 1) + item > v_len:
            raise ValueError(f"{self.path}: {what}: {count} values of {item} bytes do not fit "
                             f"the buffer view ({v_len} bytes)")  # fmt: skip
        start = v_off + a_off
        rows = np.lib.stride_tricks.as_strided(
            np.frombuffer(self.bin, np.uint8, count=stride * (count - 1) + item, offset=start),
            (count, item), (stride, 1))  # fmt: skip
        rows = rows[s:e]
        values = np.ascontiguousarray(rows).view(code).reshape(len(rows), width).astype(np.float64)
        if acc.get("normalized") and scale is not None:
            values = np.maximum(values / scale, -1.0)
        return values, count


def _parse(path: Path, raw: bytes) -> _Gltf:
    cur = Cursor(path, raw)
    magic, version, length = cur.unpack(struct.Struct("<III"), "the GLB header")
    if magic != MAGIC:
        raise ValueError(f"{path}: not a .glb file (magic {magic:#010x})")
    if version != 2:
        raise ValueError(f"{path}: glTF binary version {version}; 2 is read")
    if length > len(raw):
        raise ValueError(f"{path}: truncated .glb: the header says {length} bytes, "
                         f"the file has {len(raw)}")  # fmt: skip
    cur.data = cur.data[:length]
    size, kind = cur.unpack(struct.Struct("<II"), "the JSON chunk header")
    if kind != CHUNK_JSON:
        raise ValueError(f"{path}: the first GLB chunk is not JSON")
    doc = json.loads(bytes(cur.take(size, "the JSON chunk")))
    binary = None
    if cur.left >= 8:
        size, kind = cur.unpack(struct.Struct("<II"), "the BIN chunk header")
        if kind == CHUNK_BIN:
            binary = cur.take(size, "the BIN chunk")
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: the glTF JSON is not an object")
    return _Gltf(path, doc, binary)


def _mapped(path: Path) -> bytes | mmap.mmap:
    """The bytes of ``path``, memory-mapped read-only (empty bytes for an empty file)."""
    if not path.is_file():
        raise FileNotFoundError(f".glb file not found: {path}")
    if path.stat().st_size == 0:
        return b""
    with open(path, "rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def read_glb(path: str | Path) -> SplatData:
    """Read the Gaussians of a ``.glb`` with ``KHR_gaussian_splatting`` primitives
    (:data:`~._checks.SPLAT_KEYS`) in the 3DGS frame.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): not a GLB, no Gaussian primitive, a missing or
            malformed attribute, a node transform, an unsupported required extension, a
            scale below zero or an opacity outside [0, 1], values that are not finite.
    """
    path = Path(path)
    raw = _mapped(path)
    notes: list[str] = []
    with malformed(path, "glTF"):
        g = _parse(path, raw)
        required = [e for e in g.doc.get("extensionsRequired", []) if e != EXT]
        if required:
            raise ValueError(f"{path}: requires glTF extensions {required}, which tilesplat "
                             "does not read")  # fmt: skip
        for i, node in enumerate(g.doc.get("nodes", [])):
            if isinstance(node, dict) and any(
                k in node and node[k] != v for k, v in _IDENTITY.items()
            ):
                raise ValueError(f"{path}: node {i} has a transform; only untransformed "
                                 "Gaussian primitives are read")  # fmt: skip
        parts = []
        for m, mesh in enumerate(g.doc.get("meshes", [])):
            for p, prim in enumerate(mesh.get("primitives", []) if isinstance(mesh, dict) else []):
                if isinstance(prim, dict) and EXT in (prim.get("extensions") or {}):
                    parts.append(_primitive(g, prim, f"mesh {m} primitive {p}", notes))
        if not parts:
            raise ValueError(f"{path}: no primitive with the {EXT} extension")
        k = max(kj for _, kj, _ in parts)
        n = sum(count for count, _, _ in parts)
        out = {"means": np.empty((n, 3), np.float32), "scales": np.empty((n, 3), np.float32),
               "quats": np.empty((n, 4), np.float32), "opacities": np.empty(n, np.float32),
               "sh0": np.empty((n, 1, 3), np.float32),
               "shN": np.empty((n, k - 1, 3), np.float32)}  # fmt: skip
        at = 0
        for count, kj, rows in parts:  # a block at a time, converted to the 3DGS frame
            for s in range(0, count, _BLOCK):
                e = min(count, s + _BLOCK)
                part = rows(s, e)
                sh = part.pop("sh")  # lower SH degrees get zero higher bands
                part |= split_sh(np.concatenate([sh, np.zeros((e - s, k - kj, 3))], 1))
                for key, val in change_frame(part, GLTF_FRAME, PLY_FRAME).items():
                    out[key][at + s : at + e] = val
                if isinstance(raw, mmap.mmap):  # the pages read so far leave this process's RSS
                    raw.madvise(mmap.MADV_DONTNEED)
            at += count
    return decoded(path, out, False, notes)


def _primitive(g: _Gltf, prim: dict, where: str,
               notes: list[str]) -> tuple[int, int, Callable[[int, int], dict]]:
    """(Gaussians, SH coefficients K, ``rows(s, e)``: Gaussians ``s .. e`` of the primitive,
    float64 in the glTF frame, ``sh`` [M, K, 3] for ``sh0`` and ``shN``); its attributes
    checked first, the values of each block when it is read."""
    path = g.path
    attrs = prim.get("attributes")
    if not isinstance(attrs, dict):
        raise ValueError(f"{path}: {where} has no attributes")
    if prim.get("mode", 4) != 0:
        notes.append(f"{path}: {where} is a Gaussian primitive not of mode POINTS; read anyway")
    need = ["POSITION", f"{EXT}:ROTATION", f"{EXT}:SCALE", f"{EXT}:OPACITY"]
    missing = [a for a in need if a not in attrs]
    if missing:
        raise ValueError(f"{path}: {where} lacks the attributes {missing}")
    counts = set()
    for name, width in zip(need, (3, 4, 3, 1), strict=True):
        first, count = g.accessor(attrs[name], f"{where} {name}", 0, 1)
        counts.add(count)
        if first.shape[1] != width:
            raise ValueError(f"{path}: {where} {name} has {first.shape[1]} components, "
                             f"not {width}")  # fmt: skip
    degree = -1
    while all(name in attrs for name in _sh_names(degree + 1)) and degree < 3:
        degree += 1
    sh_names = _sh_names(degree) if degree >= 0 else []
    extra = [a for a in attrs if a.startswith(f"{EXT}:SH_DEGREE_") and a not in sh_names]
    if extra:
        raise ValueError(f"{path}: {where} has SH attributes of an incomplete degree: {extra}")
    if degree < 0:
        if "COLOR_0" not in attrs:
            raise ValueError(f"{path}: {where} has neither SH_DEGREE_0_COEF_0 nor COLOR_0")
        counts.add(g.accessor(attrs["COLOR_0"], f"{where} COLOR_0", 0, 1)[1])
        notes.append(f"{path}: {where} has no SH; its colours come from COLOR_0")
    for name in sh_names:
        first, count = g.accessor(attrs[name], f"{where} {name}", 0, 1)
        if first.shape[1] != 3:
            raise ValueError(f"{path}: {where} {name} is not a VEC3")
        counts.add(count)
    if len(counts) != 1:
        raise ValueError(f"{path}: {where}'s attributes hold different counts {sorted(counts)}")

    def rows(s: int, e: int) -> dict[str, np.ndarray]:
        vals = {name: g.accessor(attrs[name], f"{where} {name}", s, e)[0] for name in need}
        if degree < 0:
            color = g.accessor(attrs["COLOR_0"], f"{where} COLOR_0", s, e)[0]
            sh = rgb_to_sh0(color[:, :3])[:, None, :]
        else:
            sh = np.stack([g.accessor(attrs[name], f"{where} {name}", s, e)[0]
                           for name in sh_names], axis=1)  # fmt: skip
        scale = vals[f"{EXT}:SCALE"]
        if (scale <= 0).any() or not np.isfinite(scale).all():
            i = s + int(np.argmax(~(scale > 0).all(1) | ~np.isfinite(scale).all(1)))
            raise ValueError(f"{path}: {where}: the scale of Gaussian {i} is not a positive "
                             "number")  # fmt: skip
        opacity = vals[f"{EXT}:OPACITY"][:, 0]
        if ((opacity < 0) | (opacity > 1) | ~np.isfinite(opacity)).any():
            i = s + int(np.argmax((opacity < 0) | (opacity > 1) | ~np.isfinite(opacity)))
            raise ValueError(f"{path}: {where}: the opacity of Gaussian {i} is not in [0, 1]")
        opacity = np.clip(opacity, _OPACITY_EPS, 1 - _OPACITY_EPS)
        return {
            "means": vals["POSITION"],
            "scales": np.log(scale),
            "quats": vals[f"{EXT}:ROTATION"][:, [3, 0, 1, 2]],
            "opacities": np.log(opacity / (1 - opacity)),
            "sh": sh,
        }

    return counts.pop(), (degree + 1) ** 2 if degree >= 0 else 1, rows
