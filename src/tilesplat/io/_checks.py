"""Checks every splat file format shares: the Gaussians a writer takes, and the untrusted-input
discipline of every reader.

Every reader returns, and every writer takes, the Gaussians as the trainer holds them, by
gsplat's ``splats`` names (:data:`SPLAT_KEYS`): ``means`` [N, 3], ``scales`` [N, 3] (logs),
``quats`` [N, 4] (w, x, y, z), ``opacities`` [N] (logits), ``sh0`` [N, 1, 3] and ``shN``
[N, K - 1, 3] with K = (degree + 1)^2, float32 in the 3DGS / COLMAP frame. A format converts
between these and its file's fields itself. The format modules import these checks; the
suffix table of :mod:`.gaussians` finds the format modules, so nothing here imports either.

A file a user hands us is untrusted. Readers follow four rules, with the helpers below:

- every count and size is checked against the bytes the file holds *before* anything of that
  size is allocated (:func:`check_count`, :class:`Cursor`): there is no fixed Gaussian limit,
  the file's length is the limit;
- decompression never produces more than the header says is needed, and a header claiming
  more than :data:`MAX_EXPANSION` times the file's size is refused as a bomb
  (:func:`check_expansion`, :func:`inflate`, :func:`unzstd`);
- decoded values are finite and quaternions non-zero, or the error names the field and the
  Gaussian (:func:`check_finite`);
- any failure is a ``ValueError`` naming the file; :func:`malformed` turns the errors of the
  decoders underneath (zlib, zstd, JSON, zip, WebP) into one.
"""

from __future__ import annotations

import contextlib
import json
import math
import struct
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

# gsplat's names of a model's tensors (its checkpoints' ``splats``), the trainer's parameters
SPLAT_KEYS = ("means", "scales", "quats", "opacities", "sh0", "shN")
# Refuse a compressed stream whose header claims more than this many bytes per compressed
# byte. Deflate cannot exceed ~1032:1; Niantic's SPZ library bounds its point count with the
# same 1024 (a zstd stream of one repeated byte can go further, but no Gaussian file does: its
# positions alone do not compress that far).
MAX_EXPANSION = 1024
_CHUNK = 1 << 22  # decompress in 4 MiB steps: memory follows what the stream really holds
_ROWS = 1 << 18  # Gaussians checked at a time


@dataclass
class SplatData:
    """What a reader found: the Gaussians (:data:`SPLAT_KEYS`, float32 tensors), whether the
    model was trained antialiased (the file says so: PLY comment, SPZ flag, SOG meta), and
    notes on what it ignored."""

    gaussians: dict[str, torch.Tensor]
    antialiased: bool = False
    notes: list[str] = field(default_factory=list)


def as_arrays(splats: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, np.ndarray]:
    """The Gaussians a writer was given (:data:`SPLAT_KEYS`, tensors or arrays) as float32
    NumPy, keys and shapes checked (``ValueError`` naming the key)."""
    if not isinstance(splats, Mapping):
        raise TypeError(f"splats: expected a dict of {', '.join(SPLAT_KEYS)}, got "
                        f"{type(splats).__name__}")  # fmt: skip
    missing = [k for k in SPLAT_KEYS if k not in splats]
    unknown = [k for k in splats if k not in SPLAT_KEYS]
    if missing or unknown:
        raise ValueError(f"splats: expected the keys {', '.join(SPLAT_KEYS)}; "
                         + (f"missing {missing}" if missing else f"unknown {unknown}"))
    out = {}
    for name in SPLAT_KEYS:
        value = splats[name]
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu").numpy()
        out[name] = np.asarray(value, dtype=np.float32)
    if out["means"].ndim != 2 or out["shN"].ndim != 3:
        raise ValueError(
            f"expected means [N, 3] and shN [N, K - 1, 3], got {list(out['means'].shape)}, "
            f"{list(out['shN'].shape)}"
        )
    n, k = out["means"].shape[0], out["shN"].shape[1] + 1
    want = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,),
            "sh0": (n, 1, 3), "shN": (n, k - 1, 3)}  # fmt: skip
    for name, shape in want.items():
        if out[name].shape != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(out[name].shape)}")
    if math.isqrt(k) ** 2 != k:
        raise ValueError(f"shN: {k - 1} coefficients per colour; (degree + 1)^2 - 1 expected")
    return out


def sh_degree(arrays: dict[str, np.ndarray]) -> int:
    """The SH degree of ``arrays['shN']`` [N, K - 1, 3]."""
    return math.isqrt(arrays["shN"].shape[1] + 1) - 1


def all_sh(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """All K coefficients [N, K, 3] of ``sh0`` and ``shN``, for formats that store them as one
    sequence (the dtype of the inputs)."""
    return np.concatenate([arrays["sh0"], arrays["shN"]], axis=1)


def split_sh(sh: np.ndarray) -> dict[str, np.ndarray]:
    """``sh0`` [N, 1, 3] and ``shN`` [N, K - 1, 3] of all K coefficients ``sh`` [N, K, 3]."""
    return {"sh0": sh[:, :1], "shN": sh[:, 1:]}


def check_writable(arrays: dict[str, np.ndarray], fmt: str, max_degree: int) -> None:
    """What a lossy writer needs: at least one Gaussian, finite values, non-zero quaternions
    and an SH degree the format holds (``ValueError`` naming the format)."""
    if len(arrays["means"]) < 1:
        raise ValueError(f"{fmt}: no Gaussians to write")
    if sh_degree(arrays) > max_degree:
        raise ValueError(f"shN: {fmt} holds SH degree 0-{max_degree}, got {sh_degree(arrays)}")
    check_finite(Path(fmt), arrays, "Gaussians for")


def to_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """float32 contiguous tensors of the Gaussians (:data:`SPLAT_KEYS`)."""
    return {k: torch.from_numpy(np.ascontiguousarray(arrays[k], np.float32)) for k in SPLAT_KEYS}


def read_file(path: Path, what: str) -> bytes:
    """The bytes of ``path`` (``FileNotFoundError`` naming ``what`` when it is missing)."""
    if not path.is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    return path.read_bytes()


def check_count(path: Path, n: int, available: int, bytes_each: float, what: str = "") -> None:
    """A claimed Gaussian count is at least 1 and its ``bytes_each`` bytes apiece fit in the
    ``available`` bytes of the file (the only limit on the count)."""
    if n < 1:
        raise ValueError(f"{path}: the file holds no Gaussians")
    need = n * bytes_each
    if need > available:
        raise ValueError(
            f"{path}: {what or 'the header'} claims {n} Gaussians, which need {need:.0f} bytes; "
            f"the file has {available}"
        )


def check_expansion(path: Path, need: int, compressed: int, what: str) -> None:
    """Refuse a header whose ``need`` decompressed bytes exceed :data:`MAX_EXPANSION` times
    the ``compressed`` bytes it comes from."""
    if need > MAX_EXPANSION * max(compressed, 1):
        raise ValueError(
            f"{path}: {what} claims {need} bytes from {compressed} compressed bytes "
            f"(more than {MAX_EXPANSION}x): refused as a decompression bomb"
        )


class Cursor:
    """Reads an untrusted byte string front to back; every read names what it wanted and
    fails (``ValueError`` naming the file) rather than run past the end."""

    def __init__(self, path: Path, data: bytes | memoryview, offset: int = 0) -> None:
        self.path, self.data, self.pos = path, memoryview(data), offset

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.left:
            raise ValueError(
                f"{self.path}: truncated: {what} needs {n} bytes at offset {self.pos}, "
                f"{self.left} remain"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        return fmt.unpack(self.take(fmt.size, what))


def inflate(path: Path, data: bytes, limit: int, wbits: int = 16 + zlib.MAX_WBITS) -> bytes:
    """At most ``limit`` bytes of a zlib/gzip stream, in bounded steps (a small file cannot
    expand into gigabytes); fewer when the stream ends first."""
    d = zlib.decompressobj(wbits)
    out = bytearray()
    try:
        while len(out) < limit:
            chunk = d.decompress(data, min(_CHUNK, limit - len(out)))
            data = d.unconsumed_tail
            if not chunk:
                break
            out += chunk
    except zlib.error as exc:
        raise ValueError(f"{path}: corrupt gzip stream ({exc})") from None
    return bytes(out)


def unzstd(path: Path, data: bytes | memoryview, size: int, what: str) -> bytes:
    """Exactly ``size`` bytes decompressed from one zstd frame ``data`` (``ValueError`` when
    it holds fewer, more, or is corrupt), produced in bounded steps: one zstd block can expand
    32768-fold, so output is pulled with a size limit rather than input pushed. The caller
    checks the bomb ratio over the whole file (:func:`check_expansion`): a single stream of a
    real model may be one repeated byte."""
    out = bytearray()
    try:  # Python 3.14's standard library
        from compression import zstd  # type: ignore[import-not-found]

        dec, error = zstd.ZstdDecompressor(), zstd.ZstdError

        def pull(n: int, first: list[bytes]) -> bytes:
            if dec.eof:
                return b""
            return dec.decompress(first.pop() if first else b"", max_length=n)

    except ImportError:
        try:
            import zstandard
        except ImportError:  # pragma: no cover - a declared dependency below Python 3.14
            raise ImportError(
                "SPZ version 4 files are zstd streams: pip install zstandard"
            ) from None
        reader = zstandard.ZstdDecompressor().stream_reader(bytes(data))
        error = zstandard.ZstdError

        def pull(n: int, first: list[bytes]) -> bytes:
            return reader.read(n)

    pending = [bytes(data)]
    try:
        while len(out) <= size:
            chunk = pull(min(_CHUNK, size + 1 - len(out)), pending)
            if not chunk:
                break
            out += chunk
    except error as exc:
        raise ValueError(f"{path}: corrupt zstd stream in {what} ({exc})") from None
    if len(out) != size:
        got = "more than " + str(size) if len(out) > size else str(len(out))
        raise ValueError(f"{path}: {what} decompresses to {got} bytes; the header says {size}")
    return bytes(out)


def zstd_compress(data: bytes, level: int = 12) -> bytes:
    """One zstd frame of ``data`` with its content size recorded (level 12, as Niantic's
    library writes)."""
    try:
        from compression import zstd  # type: ignore[import-not-found]

        return zstd.compress(data, level)
    except ImportError:
        pass
    try:
        import zstandard
    except ImportError:  # pragma: no cover - a declared dependency below Python 3.14
        raise ImportError("writing SPZ version 4 needs zstd: pip install zstandard") from None
    return zstandard.ZstdCompressor(level=level, write_content_size=True).compress(data)


def check_finite(path: Path, arrays: dict[str, np.ndarray], prefix: str = "") -> None:
    """Every decoded value is finite and every quaternion non-zero (``ValueError`` naming the
    field and the first Gaussian at fault)."""
    where = f"{prefix} {path}".strip()
    for name, arr in arrays.items():
        for s in range(0, len(arr), _ROWS):  # a block at a time: no model-sized mask
            bad = ~np.isfinite(arr[s : s + _ROWS])
            if bad.any():
                i = s + int(np.argwhere(bad.reshape(len(bad), -1).any(axis=1))[0, 0])
                raise ValueError(f"{where}: {name} of Gaussian {i} is not finite")
    zero = ~np.any(arrays["quats"] != 0.0, axis=1)
    if zero.any():
        raise ValueError(f"{where}: the rotation of Gaussian {int(np.argmax(zero))} is zero")


def decoded(path: Path, arrays: dict[str, np.ndarray], antialiased: bool = False,
            notes: list[str] | None = None) -> SplatData:
    """The reader's result: ``arrays`` (:data:`SPLAT_KEYS`) checked finite, as float32
    tensors."""
    arrays = {k: np.asarray(arrays[k], np.float32) for k in SPLAT_KEYS}
    check_finite(path, arrays)
    return SplatData(to_tensors(arrays), antialiased, list(notes or []))


@contextlib.contextmanager
def malformed(path: Path, fmt: str) -> Iterator[None]:
    """Turn the errors of a decoder underneath (JSON, zip, zlib, struct, a WebP image, a
    bad index) into one ``ValueError`` naming the file and its format."""
    try:
        yield
    except (FileNotFoundError, ImportError):
        raise
    except ValueError as exc:  # ours name the file; NumPy's and JSON's do not
        if str(path) in str(exc):
            raise
        raise ValueError(f"{path}: malformed {fmt} file ({exc})") from None
    except (json.JSONDecodeError, zipfile.BadZipFile, zlib.error, struct.error, OSError,
            KeyError, IndexError, TypeError, OverflowError, UnicodeDecodeError,
            RecursionError, EOFError, NotImplementedError) as exc:  # fmt: skip
        raise ValueError(f"{path}: malformed {fmt} file ({type(exc).__name__}: {exc})") from None
