"""``.spz`` files: Niantic's compressed Gaussian splat layout, versions 1-4 (written: 4 by
default, 2 and 3 on request).

Version 4 (Niantic's current default, SuperSplat's export) is a plaintext 32-byte header, the
extension records, a table of contents and one zstd stream per attribute::

    uint32 magic 0x5053474e ("NGSP")  uint32 version 4  uint32 N
    uint8 SH degree (0-4)  uint8 fractional bits  uint8 flags  uint8 number of streams
    uint32 byte offset of the TOC  12 reserved bytes
    [32, TOC): extension records, each uint32 type, uint32 length, payload (flag 0x2)
    TOC: per stream uint64 compressed size, uint64 decompressed size
    streams: positions, alphas, colours, scales, rotations, SH (an empty one is left out)

Versions 1-3 are one gzip stream of a 16-byte header (magic, version, N, degree, fractional
bits, flags, a reserved byte) and the same attributes back to back, then (flag 0x2) the
extension records. Each attribute, per Gaussian:

    positions  3 x 24-bit signed fixed point, ``fractional bits`` after the point
               (v1: 3 x float16)
    alphas     uint8 round(sigmoid(logit) * 255)
    colours    3 x uint8 round(dc * 0.15 * 255 + 127.5)   (a scale below SH_C0 keeps room
               for base colours outside [0, 1] that higher bands bring back)
    scales     3 x uint8 round((log scale + 10) * 16)
    rotations  v3, v4: uint32 "smallest three": the index of the largest component of the
               unit quaternion (x, y, z, w) in the top 2 bits, then the other three in index
               order, each a sign bit and a 9-bit magnitude of |q_i| / sqrt(1/2); the largest
               is positive and recomputed. v1, v2: 3 x uint8 (x, y, z) * 127.5 + 127.5, w >= 0.
    SH         (K - 1) x 3 uint8 round(x * 128) + 128, coefficient-major, colour inner;
               degree-1 values kept to 5 bits, higher bands to 4 (zeros fill the low bits).

The frame. Niantic's README calls SPZ's frame right-up-back, but its library converts only
when the caller names both frames: its own ``ply_to_spz`` / ``spz_to_ply`` leave the system
unspecified and copy the PLY's axes as they are, and PlayCanvas's splat-transform writes
through that library with ``from: UNSPECIFIED`` and reads without conversion. So the files in
circulation hold the PLY's own axes, and tilesplat writes and reads them that way: no axis
changes (docs/formats.md has the evidence). A file whose ``SPZ_ADOBE_coordinate_system``
record (0xADBE0003) names the frame it was stored in is converted from that frame to the
3DGS one (:mod:`.axes`), as Niantic's library does for a caller that asks for RDF; other
records are skipped with a note, as the spec says readers do.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from ._checks import (
    Cursor,
    SplatData,
    as_arrays,
    check_expansion,
    check_writable,
    decoded,
    inflate,
    malformed,
    read_file,
    sh_degree,
    unzstd,
    zstd_compress,
)
from .atomic import atomic_writer
from .axes import PLY_FRAME, SPZ_SYSTEMS, change_frame

MAGIC = 0x5053474E
VERSION = 4
WRITE_VERSIONS = (2, 3, 4)
READ_VERSIONS = (1, 2, 3, 4)
HEADER = struct.Struct("<IIIBBBB")  # versions 1-3 (inside the gzip stream)
HEADER_V4 = struct.Struct("<IIIBBBBI12s")
RECORD = struct.Struct("<II")  # extension record: type, payload length
FLAG_ANTIALIASED = 0x1
FLAG_EXTENSIONS = 0x2
EXT_SAFE_ORBIT_CAMERA = 0xADBE0002
EXT_COORDINATE_SYSTEM = 0xADBE0003
COLOR_SCALE = 0.15
FRACTIONAL_BITS = 12  # ~0.24 mm steps for positions within +-2048 units; fewer when larger
SH1_BUCKET = 1 << (8 - 5)  # 5 bits for degree 1
SH_REST_BUCKET = 1 << (8 - 4)  # 4 bits for degrees 2-4
_ALPHA_EPS = 0.5 / 255.0
_SQRT1_2 = math.sqrt(0.5)
_MAG = (1 << 9) - 1
_BLOCK = 1 << 16  # Gaussians packed or decoded at a time
_MAX_LEGACY_EXTENSIONS = 1 << 16  # bytes of extension records read after a v1-v3 body
# For each index of the largest component, the other three in increasing order.
_OTHERS = np.array([[j for j in range(4) if j != i] for i in range(4)])


def _stream_sizes(version: int, n: int, degree: int) -> list[int]:
    """Bytes of each attribute: positions, alphas, colours, scales, rotations, SH."""
    return [n * (6 if version == 1 else 9), n, 3 * n, 3 * n, n * (4 if version >= 3 else 3),
            3 * ((degree + 1) ** 2 - 1) * n]  # fmt: skip


def _u8(x: np.ndarray) -> np.ndarray:
    return np.clip(np.round(x), 0, 255).astype(np.uint8)


def fractional_bits_for(means: np.ndarray) -> int:
    """The most fractional bits (<= 12) whose 24-bit fixed point holds every coordinate."""
    extent = float(np.abs(means).max()) if means.size else 0.0
    limit = (1 << 23) - 1
    for bits in range(FRACTIONAL_BITS, -1, -1):
        if extent * (1 << bits) <= limit:
            return bits
    raise ValueError(f"means: a coordinate of magnitude {extent:.4g} exceeds SPZ's 24-bit range")


def pack_quats_v3(q: np.ndarray) -> np.ndarray:
    """Unit quaternions [N, 4] (x, y, z, w) as smallest-three words: [N] uint32."""
    largest = np.argmax(np.abs(q), axis=1)
    negate = np.take_along_axis(q, largest[:, None], axis=1)[:, 0] < 0
    others = np.take_along_axis(q, _OTHERS[largest], axis=1)  # [N, 3]
    neg = ((others < 0) ^ negate[:, None]).astype(np.uint32)
    mag = np.minimum(np.floor(_MAG * (np.abs(others) / _SQRT1_2) + 0.5), _MAG).astype(np.uint32)
    fields = (neg << 9) | mag
    top = largest.astype(np.uint32) << 30
    return top | (fields[:, 0] << 20) | (fields[:, 1] << 10) | fields[:, 2]


def unpack_quats_v3(words: np.ndarray) -> np.ndarray:
    """Smallest-three words [N] uint32 as unit quaternions [N, 4] (x, y, z, w)."""
    words = words.astype(np.uint32)
    largest = (words >> 30).astype(np.int64)
    fields = np.stack([(words >> s) & 0x3FF for s in (20, 10, 0)], axis=1)
    vals = _SQRT1_2 * (fields & _MAG).astype(np.float32) / _MAG
    vals = np.where((fields >> 9) & 1 == 1, -vals, vals).astype(np.float32)
    q = np.zeros((len(words), 4), np.float32)
    np.put_along_axis(q, _OTHERS[largest], vals, axis=1)
    rest = np.sqrt(np.maximum(0.0, 1.0 - (vals * vals).sum(axis=1)))
    np.put_along_axis(q, largest[:, None], rest[:, None].astype(np.float32), axis=1)
    return q


def _quantise_sh(x: np.ndarray, bucket: int) -> np.ndarray:
    q = np.round(x.astype(np.float64) * 128.0).astype(np.int64) + 128
    q = (q + bucket // 2) // bucket * bucket
    return np.clip(q, 0, 255).astype(np.uint8)


def _pack(a: dict[str, np.ndarray], version: int) -> tuple[int, list[bytes]]:
    """(fractional bits, the six attribute byte strings) of checked arrays, packed a block
    of Gaussians at a time (float64 temporaries of one block only)."""
    n = len(a["means"])
    bits = fractional_bits_for(a["means"])
    sizes = _stream_sizes(version, n, sh_degree(a))
    streams = [np.empty(size, np.uint8) for size in sizes]
    for s in range(0, n, _BLOCK):
        e = min(n, s + _BLOCK)
        block = {k: v[s:e] for k, v in a.items()}
        for out, part in zip(streams, _pack_block(block, version, bits), strict=True):
            width = len(out) // n
            out[s * width : e * width] = part.reshape(-1)
    return bits, [out.tobytes() for out in streams]


def _pack_block(a: dict[str, np.ndarray], version: int, bits: int) -> list[np.ndarray]:
    """The six attributes of the Gaussians ``a`` as uint8 arrays, M rows each."""
    n = len(a["means"])
    fixed = np.round(a["means"].astype(np.float64) * (1 << bits)).astype(np.int64)
    positions = (fixed[..., None] >> np.array([0, 8, 16])) & 0xFF  # [M, 3, 3] little endian
    q = a["quats"][:, [1, 2, 3, 0]].astype(np.float64)  # (x, y, z, w)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    if version >= 3:
        rotations = pack_quats_v3(q).astype("<u4").view(np.uint8).reshape(n, 4)
    else:
        q = np.where(q[:, 3:] < 0, -q, q)
        rotations = _u8(q[:, :3] * 127.5 + 127.5)
    alphas = _u8(255.0 / (1.0 + np.exp(-a["opacities"].astype(np.float64))))
    colors = _u8(a["sh0"][:, 0, :].astype(np.float64) * (COLOR_SCALE * 255.0) + 127.5)
    scales = _u8((a["scales"].astype(np.float64) + 10.0) * 16.0)
    rest = a["shN"]  # [M, K - 1, 3]
    shq = np.empty(rest.shape, np.uint8)
    shq[:, :3] = _quantise_sh(rest[:, :3], SH1_BUCKET)
    shq[:, 3:] = _quantise_sh(rest[:, 3:], SH_REST_BUCKET)
    return [arr.astype(np.uint8) for arr in (positions, alphas, colors, scales, rotations, shq)]


def encode_spz(
    splats: dict[str, torch.Tensor], version: int = VERSION, antialiased: bool = False
) -> bytes:
    """The ``.spz`` bytes of the Gaussians (:data:`~._checks.SPLAT_KEYS`, SH degree <= 4;
    see the module docstring), in their own frame."""
    if version not in WRITE_VERSIONS:
        raise ValueError(f"SPZ version must be one of {list(WRITE_VERSIONS)}, got {version}")
    a = as_arrays(splats)
    check_writable(a, "SPZ", 4)
    n, degree = len(a["means"]), sh_degree(a)
    if n >= 1 << 32:
        raise ValueError(f"SPZ holds fewer than 2^32 Gaussians, got {n}")
    bits, streams = _pack(a, version)
    flags = FLAG_ANTIALIASED if antialiased else 0
    if version < 4:
        raw = HEADER.pack(MAGIC, version, n, degree, bits, flags, 0) + b"".join(streams)
        # mtime 0 and no file name: the same Gaussians always give the same bytes.
        comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return comp.compress(raw) + comp.flush()
    streams = [s for s in streams if s]
    packed = [zstd_compress(s) for s in streams]
    toc = b"".join(struct.pack("<QQ", len(c), len(s)) for c, s in zip(packed, streams,
                                                                       strict=True))
    head = HEADER_V4.pack(MAGIC, 4, n, degree, bits, flags, len(streams), HEADER_V4.size,
                          bytes(12))  # fmt: skip
    return head + toc + b"".join(packed)


def save_spz(
    path: str | Path,
    splats: dict[str, torch.Tensor],
    antialiased: bool = False,
    version: int = VERSION,
) -> Path:
    """Write Gaussians (:data:`~._checks.SPLAT_KEYS`) as an ``.spz`` file (version 4 unless
    asked), atomically."""
    data = encode_spz(splats, version, antialiased)
    path = Path(path)
    with atomic_writer(path) as f:
        f.write(data)
    return path


def _extensions(path: Path, zone: memoryview, notes: list[str]) -> str | None:
    """Parse the extension records; returns the stored frame a coordinate-system record
    names (None without one). Unknown records are skipped with a note, per the spec."""
    cur = Cursor(path, zone)
    frame = None
    while cur.left:
        kind, length = cur.unpack(RECORD, "an SPZ extension record header")
        payload = cur.take(length, f"SPZ extension record {kind:#010x}")
        if kind == EXT_COORDINATE_SYSTEM:
            if length != 4:
                raise ValueError(f"{path}: coordinate-system record of {length} bytes, not 4")
            value = struct.unpack("<I", payload)[0]
            if value == 0:
                notes.append(f"{path}: coordinate-system record says UNSPECIFIED; axes kept")
            elif value not in SPZ_SYSTEMS:
                raise ValueError(f"{path}: unknown SPZ coordinate system {value} (1-16 exist)")
            else:
                frame = SPZ_SYSTEMS[value]
        elif kind == EXT_SAFE_ORBIT_CAMERA:
            notes.append(f"{path}: ignored the safe-orbit camera limits (SPZ extension)")
        else:
            notes.append(f"{path}: skipped unknown SPZ extension record {kind:#010x} "
                         f"({length} bytes)")  # fmt: skip
    return frame


Decoded = tuple[tuple, list[memoryview], "str | None"]  # header fields, streams, stored frame


def _read_v4(path: Path, raw: bytes, notes: list[str]) -> Decoded:
    cur = Cursor(path, raw)
    _, version, n, degree, bits, flags, n_streams, toc, _ = cur.unpack(HEADER_V4, "the header")
    if version < 4:
        raise ValueError(f"{path}: an NGSP header of version {version}; versions 1-3 are gzip")
    _check_header(path, version, degree, bits)
    if n < 1:
        raise ValueError(f"{path}: the file holds no Gaussians")
    sizes = _stream_sizes(version, n, degree)
    # The bomb ratio is the whole file's: one stream of a real model can be one repeated byte
    # (an initialised model's opacities, its zero SH), which zstd shrinks far past 1024x.
    check_expansion(path, sum(sizes), len(raw), f"a header of {n} Gaussians")
    sizes = [s for s in sizes if s]
    if n_streams != len(sizes):
        raise ValueError(f"{path}: {n_streams} streams in the header; SH degree {degree} "
                         f"has {len(sizes)}")  # fmt: skip
    if not HEADER_V4.size <= toc <= len(raw):
        raise ValueError(f"{path}: TOC offset {toc} outside the header zone")
    frame = None
    zone = cur.data[HEADER_V4.size : toc]
    if flags & FLAG_EXTENSIONS:
        frame = _extensions(path, zone, notes)
    elif len(zone):
        notes.append(f"{path}: ignored {len(zone)} bytes before the TOC (no extension flag)")
    cur.pos = toc
    entries = [cur.unpack(struct.Struct("<QQ"), f"TOC entry {i}") for i in range(n_streams)]
    if sum(c for c, _ in entries) != cur.left:
        raise ValueError(f"{path}: the TOC lists {sum(c for c, _ in entries)} compressed bytes, "
                         f"the file holds {cur.left} after it")  # fmt: skip
    names = ("positions", "alphas", "colours", "scales", "rotations", "SH")
    streams = []
    for i, ((comp, size), want) in enumerate(zip(entries, sizes, strict=True)):
        if size != want:
            raise ValueError(f"{path}: stream {names[i]} holds {size} bytes; {n} Gaussians "
                             f"need {want}")  # fmt: skip
        data = unzstd(path, cur.take(comp, f"stream {names[i]}"), size, f"stream {names[i]}")
        streams.append(memoryview(data))
    if degree == 0:
        streams.append(memoryview(b""))
    return (version, n, degree, bits, flags), streams, frame


def _check_header(path: Path, version: int, degree: int, bits: int) -> None:
    if version not in READ_VERSIONS:
        raise ValueError(f"{path}: SPZ version {version} is not supported (1-4 are)")
    if degree > 4:
        raise ValueError(f"{path}: SH degree {degree} in the header; SPZ allows 0-4")
    if bits > 23:
        raise ValueError(f"{path}: {bits} fractional bits in the header; at most 23 make sense")


def _read_legacy(path: Path, raw: bytes, notes: list[str]) -> Decoded:
    head = inflate(path, raw, HEADER.size)
    if len(head) < HEADER.size:
        raise ValueError(f"{path}: truncated .spz: no complete {HEADER.size}-byte header")
    magic, version, n, degree, bits, flags, _ = HEADER.unpack(head)
    if magic != MAGIC:
        raise ValueError(f"{path}: not an .spz file (magic {magic:#010x}, expected {MAGIC:#x})")
    if version == 4:
        raise ValueError(f"{path}: SPZ version 4 inside gzip; version 4 files are NGSP + zstd")
    _check_header(path, version, degree, bits)
    if n < 1:
        raise ValueError(f"{path}: the file holds no Gaussians")
    sizes = _stream_sizes(version, n, degree)
    need = HEADER.size + sum(sizes)
    check_expansion(path, need, len(raw), f"a header of {n} Gaussians")
    extra = _MAX_LEGACY_EXTENSIONS if flags & FLAG_EXTENSIONS else 0
    body = inflate(path, raw, need + extra)
    if len(body) < need:
        raise ValueError(
            f"{path}: truncated .spz: {n} Gaussians of SH degree {degree} need {need - 16} bytes, "
            f"the stream holds {len(body) - 16}"
        )
    view = memoryview(body)
    offsets = np.cumsum([HEADER.size, *sizes])
    streams = [view[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    frame = _extensions(path, view[need:], notes) if flags & FLAG_EXTENSIONS else None
    return (version, n, degree, bits, flags), streams, frame


def read_spz(path: str | Path) -> SplatData:
    """Read an ``.spz`` file (versions 1-4): its Gaussians in the 3DGS frame.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): neither NGSP nor gzip, a wrong magic, an unsupported
            version or degree, a count or stream size the file cannot hold, a corrupt or
            short stream, a malformed extension record.
    """
    path = Path(path)
    raw = read_file(path, ".spz")
    notes: list[str] = []
    with malformed(path, "SPZ"):
        if raw[:4] == b"NGSP":
            fields, parts, frame = _read_v4(path, raw, notes)
        elif raw[:2] == b"\x1f\x8b":
            fields, parts, frame = _read_legacy(path, raw, notes)
        else:
            raise ValueError(f"{path}: not an .spz file (neither an NGSP header nor gzip)")
        arrays = _decode(fields, parts)
    if frame is not None and frame != PLY_FRAME:
        arrays = change_frame(arrays, frame, PLY_FRAME)
    return decoded(path, arrays, bool(fields[4] & FLAG_ANTIALIASED), notes)


def _decode(fields: tuple, parts: list[memoryview]) -> dict[str, np.ndarray]:
    """The Gaussians (float32, :data:`~._checks.SPLAT_KEYS`) of the six attribute streams,
    decoded a block at a time."""
    version, n, degree, bits, _ = fields
    k = (degree + 1) ** 2
    out = {"means": np.empty((n, 3), np.float32), "scales": np.empty((n, 3), np.float32),
           "quats": np.empty((n, 4), np.float32), "opacities": np.empty(n, np.float32),
           "sh0": np.empty((n, 1, 3), np.float32),
           "shN": np.empty((n, k - 1, 3), np.float32)}  # fmt: skip
    for s in range(0, n, _BLOCK):
        e = min(n, s + _BLOCK)
        block = [part[s * (len(part) // n) : e * (len(part) // n)] for part in parts]
        for key, val in _decode_block(fields, e - s, block).items():
            out[key][s:e] = val
    return out


def _decode_block(fields: tuple, n: int, parts: list[memoryview]) -> dict[str, np.ndarray]:
    version, _, degree, bits, _ = fields
    k = (degree + 1) ** 2
    if version == 1:
        means = np.frombuffer(parts[0], "<f2").reshape(n, 3).astype(np.float32)
    else:
        p = np.frombuffer(parts[0], np.uint8).reshape(n, 3, 3).astype(np.int32)
        fixed = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
        fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
        means = fixed.astype(np.float32) / np.float32(1 << bits)
    alpha = np.clip(np.frombuffer(parts[1], np.uint8) / 255.0, _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    dc = (np.frombuffer(parts[2], np.uint8).reshape(n, 3) / 255.0 - 0.5) / COLOR_SCALE
    scales = np.frombuffer(parts[3], np.uint8).reshape(n, 3) / 16.0 - 10.0
    if version >= 3:
        q = unpack_quats_v3(np.frombuffer(parts[4], "<u4"))
    else:
        xyz = np.frombuffer(parts[4], np.uint8).reshape(n, 3).astype(np.float32) / 127.5 - 1.0
        w = np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(axis=1)))
        q = np.concatenate([xyz, w[:, None]], axis=1)
    rest = (np.frombuffer(parts[5], np.uint8).reshape(n, k - 1, 3) - 128.0) / 128.0
    return {
        "means": means,
        "scales": scales,
        "quats": q[:, [3, 0, 1, 2]],
        "opacities": np.log(alpha / (1.0 - alpha)),
        "sh0": dc[:, None, :],
        "shN": rest,
    }


def load_spz(path: str | Path) -> dict[str, torch.Tensor]:
    """Read an ``.spz`` file (see :func:`read_spz`)."""
    return read_spz(path).gaussians
