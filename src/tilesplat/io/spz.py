"""``.spz`` files: Niantic's compressed Gaussian splat layout (version 3, as its spec defines).

A gzip stream of a 16-byte little-endian header, then one array per attribute::

    uint32 magic 0x5053474e ("NGSP")   uint32 version (3; 2 is read too)   uint32 N
    uint8 SH degree (0-4)   uint8 fractional bits   uint8 flags (0x1 antialiased)   uint8 0

    positions  N x 3 x 24-bit signed fixed point, ``fractional bits`` after the point
    alphas     N x uint8   round(sigmoid(logit) * 255)
    colours    N x 3 uint8 round(dc * 0.15 * 255 + 127.5)   (a scale below SH_C0 keeps room
                           for base colours outside [0, 1] that higher bands bring back)
    scales     N x 3 uint8 round((log scale + 10) * 16)
    rotations  v3: N x uint32, "smallest three": the index of the largest component of the
               unit quaternion (x, y, z, w) in the top 2 bits, then the other three in index
               order, each a sign bit and a 9-bit magnitude of |q_i| / sqrt(1/2); the largest
               is positive and recomputed. v2: N x 3 uint8 (x, y, z) * 127.5 + 127.5, w >= 0.
    SH         N x (K - 1) x 3 uint8 round(x * 128) + 128, coefficient-major, colour inner;
               degree-1 values kept to 5 bits, higher bands to 4 (zeros fill the low bits).

SPZ stores right-up-back axes (three.js); tilesplat's splats live in the 3DGS/PLY frame
(right-down-front), so y and z flip on write and back on read: positions (1, -1, -1),
quaternion vector part (1, -1, -1) and each SH coefficient by the parity of its basis
function under that flip. A file with the extension flag (0x2, vendor records of no stated
length) is refused rather than misread.
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from ._checks import as_arrays, check_count, check_finite, to_tensors
from .atomic import atomic_writer

MAGIC = 0x5053474E
VERSION = 3
READ_VERSIONS = (2, 3)  # 1 (float16 positions) was never released
HEADER = struct.Struct("<IIIBBBB")
FLAG_ANTIALIASED = 0x1
FLAG_EXTENSIONS = 0x2
COLOR_SCALE = 0.15
FRACTIONAL_BITS = 12  # ~0.24 mm steps for positions within +-2048 units; fewer when larger
SH1_BUCKET = 1 << (8 - 5)  # 5 bits for degree 1
SH_REST_BUCKET = 1 << (8 - 4)  # 4 bits for degrees 2-4
_ALPHA_EPS = 0.5 / 255.0
_SQRT1_2 = math.sqrt(0.5)
_MAG = (1 << 9) - 1
# (x, y, z) sign of the RDF -> RUB change of axes (a half turn about x, its own inverse)
_FX, _FY, _FZ = 1.0, -1.0, -1.0
FLIP_POSITION = np.array([_FX, _FY, _FZ], np.float32)
FLIP_QUAT_XYZ = np.array([_FY * _FZ, _FX * _FZ, _FX * _FY], np.float32)
# Parity of the real SH basis functions 1..24 (degrees 1-4, gsplat's order) under the flip.
FLIP_SH = np.array(
    [_FY, _FZ, _FX,
     _FX * _FY, _FY * _FZ, 1, _FX * _FZ, 1,
     _FY, _FX * _FY * _FZ, _FY, _FZ, _FX, _FZ, _FX,
     _FX * _FY, _FY * _FZ, _FX * _FY, _FY * _FZ, 1, _FX * _FZ, 1, _FX * _FZ, _FY],
    np.float32,
)  # fmt: skip
# For each index of the largest component, the other three in increasing order.
_OTHERS = np.array([[j for j in range(4) if j != i] for i in range(4)])


def _bytes_per_gaussian(version: int, degree: int) -> int:
    return 9 + 1 + 3 + 3 + (4 if version >= 3 else 3) + 3 * ((degree + 1) ** 2 - 1)


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


def encode_spz(
    means: torch.Tensor,  # [N, 3]
    quats: torch.Tensor,  # [N, 4] (w, x, y, z), any norm
    log_scales: torch.Tensor,  # [N, 3]
    opacity_logits: torch.Tensor,  # [N]
    sh: torch.Tensor,  # [N, K, 3], K <= 25
    version: int = VERSION,
    antialiased: bool = False,
) -> bytes:
    """The gzip-compressed ``.spz`` bytes of the Gaussians (see the module docstring)."""
    if version not in READ_VERSIONS:
        raise ValueError(f"SPZ version must be one of {list(READ_VERSIONS)}, got {version}")
    a = as_arrays(means, quats, log_scales, opacity_logits, sh)
    n, k = a["sh"].shape[:2]
    degree = math.isqrt(k) - 1
    if degree > 4:
        raise ValueError(f"sh: SPZ holds SH degree 0-4, got {degree}")
    check_count(Path("Gaussians"), n)
    check_finite(Path("Gaussians"), a)
    bits = fractional_bits_for(a["means"])
    fixed = np.round(a["means"].astype(np.float64) * FLIP_POSITION * (1 << bits)).astype(np.int64)
    positions = (fixed[..., None] >> np.array([0, 8, 16])) & 0xFF  # [N, 3, 3] little endian
    q = a["quats"][:, [1, 2, 3, 0]].astype(np.float64)  # (x, y, z, w)
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q[:, :3] *= FLIP_QUAT_XYZ
    if version >= 3:
        rotations = pack_quats_v3(q).astype("<u4").view(np.uint8).reshape(n, 4)
    else:
        q = np.where(q[:, 3:] < 0, -q, q)
        rotations = _u8(q[:, :3] * 127.5 + 127.5)
    alphas = _u8(255.0 / (1.0 + np.exp(-a["opacity_logits"].astype(np.float64))))
    colors = _u8(a["sh"][:, 0, :].astype(np.float64) * (COLOR_SCALE * 255.0) + 127.5)
    scales = _u8((a["log_scales"].astype(np.float64) + 10.0) * 16.0)
    rest = a["sh"][:, 1:, :] * FLIP_SH[: k - 1, None]  # [N, K - 1, 3]
    shq = np.empty(rest.shape, np.uint8)
    shq[:, :3] = _quantise_sh(rest[:, :3], SH1_BUCKET)
    shq[:, 3:] = _quantise_sh(rest[:, 3:], SH_REST_BUCKET)
    flags = FLAG_ANTIALIASED if antialiased else 0
    body = b"".join(
        arr.astype(np.uint8).tobytes()
        for arr in (positions, alphas, colors, scales, rotations, shq)
    )
    raw = HEADER.pack(MAGIC, version, n, degree, bits, flags, 0) + body
    return _gzip(raw)


def _gzip(raw: bytes) -> bytes:
    # mtime 0 and no file name: the same Gaussians always give the same bytes.
    comp = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return comp.compress(raw) + comp.flush()


def save_spz(
    path: str | Path,
    means: torch.Tensor,  # [N, 3]
    quats: torch.Tensor,  # [N, 4] (w, x, y, z)
    log_scales: torch.Tensor,  # [N, 3]
    opacity_logits: torch.Tensor,  # [N]
    sh: torch.Tensor,  # [N, K, 3]
    version: int = VERSION,
    antialiased: bool = False,
) -> Path:
    """Write Gaussians as an ``.spz`` file, atomically; returns the path."""
    data = encode_spz(means, quats, log_scales, opacity_logits, sh, version, antialiased)
    path = Path(path)
    with atomic_writer(path) as f:
        f.write(data)
    return path


def _inflate(path: Path, raw: bytes) -> tuple[tuple[int, ...], bytes]:
    """(header fields, Gaussian bytes) of a gzip stream, never inflating more than the
    header's count needs (a small file cannot expand into gigabytes)."""
    if raw[:2] != b"\x1f\x8b":
        raise ValueError(f"{path}: not an .spz file (SPZ files are gzip streams)")
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)

    def take(count: int, data: bytes) -> bytes:
        out = bytearray()
        try:
            while len(out) < count:
                chunk = d.decompress(data, count - len(out))
                data = d.unconsumed_tail
                if not chunk:
                    break
                out += chunk
        except zlib.error as exc:
            raise ValueError(f"{path}: corrupt gzip stream ({exc})") from None
        return bytes(out)

    head = take(HEADER.size, raw)
    if len(head) < HEADER.size:
        raise ValueError(f"{path}: truncated .spz: no complete {HEADER.size}-byte header")
    magic, version, n, degree, bits, flags, _ = fields = HEADER.unpack(head)
    if magic != MAGIC:
        raise ValueError(f"{path}: not an .spz file (magic {magic:#010x}, expected {MAGIC:#x})")
    if version not in READ_VERSIONS:
        raise ValueError(f"{path}: SPZ version {version} is not supported (2 and 3 are)")
    if degree > 4:
        raise ValueError(f"{path}: SH degree {degree} in the header; SPZ allows 0-4")
    if bits > 23:
        raise ValueError(f"{path}: {bits} fractional bits in the header; at most 23 make sense")
    if flags & FLAG_EXTENSIONS:
        raise ValueError(f"{path}: SPZ extensions (header flag 0x2) are not supported")
    check_count(path, n)
    need = n * _bytes_per_gaussian(version, degree)
    body = take(need, d.unconsumed_tail)
    if len(body) < need:
        raise ValueError(
            f"{path}: truncated .spz: {n} Gaussians of SH degree {degree} need {need} bytes, "
            f"the stream holds {len(body)}"
        )
    return fields, body


def load_spz(path: str | Path) -> dict[str, torch.Tensor]:
    """Read an ``.spz`` file (version 2 or 3) as raw parameters in the 3DGS frame.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): not gzip, a wrong magic, an unsupported version,
            degree or flag, a count above :data:`~tilesplat.io._checks.MAX_GAUSSIANS`, or a
            stream shorter than the header promises.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f".spz file not found: {path}")
    (_, version, n, degree, bits, _, _), body = _inflate(path, path.read_bytes())
    buf = np.frombuffer(body, np.uint8)
    k = (degree + 1) ** 2
    sizes = [9 * n, n, 3 * n, 3 * n, (4 if version >= 3 else 3) * n, 3 * (k - 1) * n]
    parts = np.split(buf, np.cumsum(sizes)[:-1])
    p = parts[0].reshape(n, 3, 3).astype(np.int32)
    fixed = p[..., 0] | (p[..., 1] << 8) | (p[..., 2] << 16)
    fixed = np.where(fixed & 0x800000, fixed - (1 << 24), fixed)
    means = fixed.astype(np.float32) / np.float32(1 << bits) * FLIP_POSITION
    alpha = np.clip(parts[1].astype(np.float32) / 255.0, _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    dc = (parts[2].reshape(n, 3).astype(np.float32) / 255.0 - 0.5) / COLOR_SCALE
    log_scales = parts[3].reshape(n, 3).astype(np.float32) / 16.0 - 10.0
    if version >= 3:
        q = unpack_quats_v3(parts[4].view("<u4"))
    else:
        xyz = parts[4].reshape(n, 3).astype(np.float32) / 127.5 - 1.0
        w = np.sqrt(np.maximum(0.0, 1.0 - (xyz * xyz).sum(axis=1)))
        q = np.concatenate([xyz, w[:, None]], axis=1)
    q[:, :3] *= FLIP_QUAT_XYZ
    rest = (parts[5].reshape(n, k - 1, 3).astype(np.float32) - 128.0) / 128.0
    rest *= FLIP_SH[: k - 1, None]
    arrays = {
        "means": means.astype(np.float32),
        "quats": q[:, [3, 0, 1, 2]].astype(np.float32),
        "log_scales": log_scales,
        "opacity_logits": np.log(alpha / (1.0 - alpha)).astype(np.float32),
        "sh": np.concatenate([dc[:, None, :], rest], axis=1).astype(np.float32),
    }
    check_finite(path, arrays)
    return to_tensors(arrays)
