"""SOG files: PlayCanvas's "spatially ordered Gaussians", lossless WebP textures and a
``meta.json`` (version 2), loose in a folder or bundled in one ``.sog`` zip.

Texel ``i`` of every W x H texture (W = 4 ceil(sqrt(N) / 4), H = 4 ceil(N / W / 4)) holds
Gaussian ``i``, in Morton order of the centres::

    means_l.webp, means_u.webp  low and high bytes of 16-bit x, y, z over [mins, maxs] of
                                sign(v) ln(|v| + 1) (meta.means.mins / maxs)
    quats.webp                  the quaternion (w, x, y, z) with its largest |component| made
                                positive: the other three as 255 (q sqrt(2) / 2 + 0.5), alpha
                                252 + the index of the largest
    scales.webp                 log-scales as indices into meta.scales.codebook (256 floats)
    sh0.webp                    dc coefficients as indices into meta.sh0.codebook, alpha
                                255 sigmoid(opacity)
    shN_labels.webp             (degree >= 1) a 16-bit palette index (r low, g high)
    shN_centroids.webp          the palette: 64 entries a row, entry j of a row spans
                                coefficients j * C .. j * C + C - 1 (C = 3, 8 or 15 per
                                colour), each texel's r, g, b an index into meta.shN.codebook

The palette is a k-means of the Gaussians' higher SH (:mod:`.kmeans`, on the CPU) of as
many entries as splat-transform writes (:func:`palette_size`, up to 65536). Pillow encodes
and decodes lossless WebP (``exact``: the colours of texels whose opacity is 0 are kept).
The frame is the PLY's.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from ._checks import (
    MAX_EXPANSION,
    SplatData,
    as_arrays,
    check_count,
    check_writable,
    decoded,
    malformed,
    sh_degree,
)
from .atomic import atomic_writer
from .compressed_ply import sort_centers
from .kmeans import kmeans, kmeans_1d

SH_ITERATIONS = 10
SH_COEFFS = (0, 3, 8, 15)  # per colour, by degree
_ALPHA_EPS = 0.5 / 255.0
_MAX_META = 1 << 24  # meta.json of a valid file is a few KB
_OTHERS = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])  # by the largest's index


def _log_transform(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.log1p(np.abs(v))


def _inv_log_transform(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.expm1(np.abs(v))


def _webp(rgba: np.ndarray) -> bytes:
    """Lossless WebP of ``rgba`` [H, W, 4] uint8 (transparent texels keep their colour)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(rgba), "RGBA").save(
        buf, "WEBP", lossless=True, exact=True, quality=80, method=4
    )
    return buf.getvalue()


def palette_size(n: int) -> int:
    """SH palette entries for ``n`` Gaussians, splat-transform's rule: 1024 times a power of
    two near n / 1024, at most 64 (65536 entries from 2 M Gaussians up; at most ``n``)."""
    return int(min(n, min(64.0, 2.0 ** math.floor(math.log2(max(n, 1) / 1024))) * 1024))


def _quats_bytes(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quaternions [M, 4] as (the three smaller components [M, 3] uint8, the largest's
    index [M])."""
    q = q / np.linalg.norm(q, axis=1, keepdims=True)
    m = np.arange(len(q))
    largest = np.argmax(np.abs(q), axis=1)
    q *= np.where(q[m, largest] < 0, -1.0, 1.0).astype(q.dtype)[:, None] * np.sqrt(q.dtype.type(2))
    three = np.take_along_axis(q, _OTHERS[largest], axis=1)
    return np.clip(np.round(255 * (three * 0.5 + 0.5)), 0, 255).astype(np.uint8), largest


def encode_sog(splats: dict[str, torch.Tensor], antialiased: bool = False) -> dict[str, bytes]:
    """The files of a SOG of the Gaussians (:data:`~._checks.SPLAT_KEYS`, SH degree <= 3):
    ``meta.json`` and the WebP textures, by name. The model is gathered into Morton order
    one attribute at a time (the SH never: its labels are reordered instead)."""
    a = as_arrays(splats)
    check_writable(a, "SOG", 3)
    n, degree = len(a["means"]), sh_degree(a)
    w = math.ceil(math.sqrt(n) / 4) * 4
    h = math.ceil(n / w / 4) * 4
    if w > 16383 or h > 16383:
        raise ValueError(f"SOG textures hold at most 16383 x 16383 Gaussians, got {n}")
    order = sort_centers(torch.from_numpy(a["means"]), torch.arange(n)).numpy()
    # Pillow's WebP encoder releases the GIL: the textures encode on a second core while
    # the next one is built and the SH palette is clustered (on one thread: io/kmeans.py).
    # One encoder at a time: each holds ~100 MB of its own at 3 M Gaussians
    pool = ThreadPoolExecutor(1)

    def texture(*channels: np.ndarray) -> Future:
        img = np.zeros((h * w, 4), np.uint8)
        img[:, 3] = 255
        for i, c in enumerate(channels):
            img[:n, i] = c
        return pool.submit(_webp, img.reshape(h, w, 4))

    files: dict[str, Future | bytes] = {}
    lt = _log_transform(a["means"][order].astype(np.float64))
    mins, maxs = lt.min(0), lt.max(0)
    span = np.where(maxs > mins, maxs - mins, 1.0)
    q16 = np.clip(np.round((lt - mins) / span * 65535), 0, 65535).astype(np.uint32)
    del lt
    files["means_l.webp"] = texture(*(q16 & 0xFF).T)
    files["means_u.webp"] = texture(*(q16 >> 8).T)
    del q16
    qb, largest = _quats_bytes(a["quats"][order].astype(np.float64))
    files["quats.webp"] = texture(qb[:, 0], qb[:, 1], qb[:, 2], 252 + largest)
    del qb, largest

    scale_book, scale_lab = kmeans_1d(a["scales"][order])
    files["scales.webp"] = texture(*scale_lab.T)
    dc_book, dc_lab = kmeans_1d(a["sh0"][order, 0, :])
    alpha = 255.0 / (1.0 + np.exp(-a["opacities"][order].astype(np.float64)))
    files["sh0.webp"] = texture(*dc_lab.T, np.clip(np.round(alpha), 0, 255))
    meta = {
        "version": 2,
        "asset": {"generator": "tilesplat"},
        "count": n,
        **({"model": "antialiased"} if antialiased else {}),
        "means": {"mins": mins.tolist(), "maxs": maxs.tolist(),
                  "files": ["means_l.webp", "means_u.webp"]},
        "scales": {"codebook": scale_book.tolist(), "files": ["scales.webp"]},
        "quats": {"files": ["quats.webp"]},
        "sh0": {"codebook": dc_book.tolist(), "files": ["sh0.webp"]},
    }  # fmt: skip
    if degree:
        c = SH_COEFFS[degree]
        # coefficient-major rows: a view, no copy; the centroids go channel-major below
        # each entry the opacity-weighted mean of its Gaussians: a 10 K random model's
        # render is 1.7 dB nearer the original's than with plain means
        weight = np.maximum(1.0 / (1.0 + np.exp(-a["opacities"].astype(np.float64))), 1e-6)
        centroids, labels = kmeans(a["shN"].reshape(n, 3 * c), palette_size(n), SH_ITERATIONS,
                                   weight)  # fmt: skip
        labels = labels[order]
        book, lab = kmeans_1d(centroids)  # [P, C * 3] indices
        p = len(centroids)
        pal = np.zeros((math.ceil(p / 64) * 64, c, 4), np.uint8)
        pal[..., 3] = 255
        pal[:p, :, :3] = lab.reshape(p, c, 3)
        files["shN_centroids.webp"] = pool.submit(_webp, pal.reshape(-1, 64 * c, 4))
        files["shN_labels.webp"] = texture(labels & 0xFF, labels >> 8)
        meta["shN"] = {"count": p, "bands": degree, "codebook": book.tolist(),
                       "files": ["shN_centroids.webp", "shN_labels.webp"]}  # fmt: skip
    with pool:
        out = {name: f.result() for name, f in files.items()}
    out["meta.json"] = json.dumps(meta).encode("utf-8")
    return out


def save_sog(
    path: str | Path, splats: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write the Gaussians (:data:`~._checks.SPLAT_KEYS`, SH degree <= 3) as a SOG: one
    ``.sog`` zip, or, for a path named ``meta.json``, that file and its textures beside it.
    Each file is written atomically; returns the path."""
    files = encode_sog(splats, antialiased)
    path = Path(path)
    if path.name.lower().endswith("meta.json"):
        for name, data in files.items():
            if name != "meta.json":
                with atomic_writer(path.parent / name) as f:
                    f.write(data)
        with atomic_writer(path) as f:  # last: a reader never sees meta.json without textures
            f.write(files["meta.json"])
        return path
    with atomic_writer(path) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, (1980, 1, 1, 0, 0, 0)), data)
    return path


class _Files:
    """The members of a SOG, bundled (zip) or loose (a folder), read with bounds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.zip = None
        if path.name.lower().endswith("meta.json"):
            self.folder = path.parent
            self.total = sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())
        else:
            self.total = path.stat().st_size
            try:
                self.zip = zipfile.ZipFile(path)
            except zipfile.BadZipFile:
                raise ValueError(f"{path}: not a .sog file (not a zip archive)") from None

    def read(self, name: object, limit: int) -> bytes:
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (
            ".", ".."
        ):
            raise ValueError(f"{self.path}: meta.json names the file {name!r}; expected a "
                             "plain file name")  # fmt: skip
        if self.zip is None:
            member = self.path if name == "meta.json" else self.folder / name
            if not member.is_file():
                raise ValueError(f"{self.path}: the SOG file {name} is missing")
            if member.stat().st_size > limit:
                raise ValueError(f"{self.path}: {name} is larger than {limit} bytes")
            return member.read_bytes()
        try:
            info = self.zip.getinfo(name)
        except KeyError:
            raise ValueError(f"{self.path}: the bundle holds no {name}") from None
        if info.file_size > limit or info.file_size > MAX_EXPANSION * max(info.compress_size, 1):
            raise ValueError(f"{self.path}: {name} claims {info.file_size} bytes from "
                             f"{info.compress_size}: refused")  # fmt: skip
        with self.zip.open(info) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise ValueError(f"{self.path}: {name} is larger than {limit} bytes")
        return data


def _image(files: _Files, name: object, min_texels: int, max_texels: int,
           shape: tuple[int, int] | None = None) -> np.ndarray:
    """The RGBA texels [H * W, 4] uint8 of one WebP, its size checked before decoding."""
    from PIL import Image

    data = files.read(name, files.total)
    try:
        img = Image.open(io.BytesIO(data))
    except (OSError, Image.DecompressionBombError) as exc:
        raise ValueError(f"{files.path}: {name} is not a readable image ({exc})") from None
    if img.format != "WEBP":
        raise ValueError(f"{files.path}: {name} is not a WebP image ({img.format})")
    w, h = img.size
    if shape is not None and (w, h) != shape:
        raise ValueError(f"{files.path}: {name} is {w} x {h}; expected {shape[0]} x {shape[1]}")
    if not min_texels <= w * h <= max_texels:
        raise ValueError(f"{files.path}: {name} is {w} x {h} texels; {min_texels} to "
                         f"{max_texels} expected")  # fmt: skip
    return np.asarray(img.convert("RGBA"), np.uint8).reshape(-1, 4)


def _codebook(path: Path, meta: dict, key: str) -> np.ndarray:
    book = meta.get(key, {}).get("codebook") if isinstance(meta.get(key), dict) else None
    if not isinstance(book, list) or not 1 <= len(book) <= 256 or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in book
    ):
        raise ValueError(f"{path}: meta.json {key}.codebook must be 1 to 256 numbers")
    out = np.array(book, np.float32)  # written from float32: exact
    if not np.isfinite(out).all():
        raise ValueError(f"{path}: meta.json {key}.codebook holds a value that is not finite")
    return out


def _lookup(path: Path, book: np.ndarray, idx: np.ndarray, what: str) -> np.ndarray:
    if idx.size and int(idx.max()) >= len(book):
        raise ValueError(f"{path}: {what} index {int(idx.max())} past its {len(book)}-entry "
                         "codebook")  # fmt: skip
    return book[idx]


def _files_of(meta: dict, key: str, count: int, path: Path) -> list:
    entry = meta.get(key)
    if not isinstance(entry, dict) or not isinstance(entry.get("files"), list) or len(
        entry["files"]
    ) != count:
        raise ValueError(f"{path}: meta.json {key}.files must list {count} file(s)")
    return entry["files"]


def read_sog(path: str | Path) -> SplatData:
    """Read a SOG (a ``.sog`` bundle or a ``meta.json`` with its textures): its Gaussians
    (:data:`~._checks.SPLAT_KEYS`).

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): not a zip or no meta.json, a meta.json that is not
            version 2 or lacks a field, a texture that is missing, not WebP or of the wrong
            size, an index past its codebook or palette, values that are not finite.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SOG file not found: {path}")
    with malformed(path, "SOG"):
        files = _Files(path)
        meta = json.loads(files.read("meta.json", _MAX_META))
        if not isinstance(meta, dict):
            raise ValueError(f"{path}: meta.json is not a JSON object")
        if "version" not in meta:
            raise ValueError(f"{path}: SOG version 1 (no 'version' in meta.json) is not "
                             "supported; rewrite it with splat-transform")  # fmt: skip
        if meta["version"] != 2:
            raise ValueError(f"{path}: SOG version {meta['version']!r} is not supported (2 is)")
        n = meta.get("count")
        if isinstance(n, bool) or not isinstance(n, int):
            raise ValueError(f"{path}: meta.json count must be an integer, got {n!r}")
        # A texel holds at least ~a few bits of a Gaussian after WebP: the file size bounds n.
        check_count(path, n, MAX_EXPANSION * files.total, 1.0, "meta.json count")
        lo, hi = n, 4 * n + 64 * int(math.sqrt(n)) + 64
        notes = []
        model = meta.get("model", "default")
        if model not in ("default", "antialiased"):
            notes.append(f"{path}: model {model!r} read as ordinary Gaussians")
        mm = meta.get("means", {})
        bounds = [mm.get("mins"), mm.get("maxs")] if isinstance(mm, dict) else [None, None]
        if not all(isinstance(b, list) and len(b) == 3 for b in bounds):
            raise ValueError(f"{path}: meta.json means.mins and means.maxs must be 3 numbers")
        mins, maxs = (np.array(b, np.float64) for b in bounds)
        if not (np.isfinite(mins).all() and np.isfinite(maxs).all()):
            raise ValueError(f"{path}: meta.json means.mins / maxs hold a value that is not finite")
        names = _files_of(meta, "means", 2, path)
        lo_t = _image(files, names[0], lo, hi)[:n, :3].astype(np.uint32)
        hi_t = _image(files, names[1], lo, hi)[:n, :3].astype(np.uint32)
        q16 = (lo_t | (hi_t << 8)).astype(np.float64) / 65535
        del lo_t, hi_t  # the decoder's temporaries go as soon as they are used
        with np.errstate(over="ignore"):
            means = _inv_log_transform(mins + (maxs - mins) * q16).astype(np.float32)
        del q16
        qt = _image(files, _files_of(meta, "quats", 1, path)[0], lo, hi)[:n]
        tag = qt[:, 3].astype(np.int64)
        if ((tag < 252) | (tag > 255)).any():
            i = int(np.argmax((tag < 252) | (tag > 255)))
            raise ValueError(f"{path}: quats.webp texel {i} has tag {tag[i]}; 252-255 expected")
        largest = tag - 252
        three = (qt[:, :3].astype(np.float64) / 255 * 2 - 1) / math.sqrt(2)
        quats = np.zeros((n, 4))
        np.put_along_axis(quats, _OTHERS[largest], three, axis=1)
        big = np.sqrt(np.maximum(0.0, 1 - (three * three).sum(1)))
        np.put_along_axis(quats, largest[:, None], big[:, None], axis=1)
        quats = quats.astype(np.float32)
        del qt, tag, largest, three, big
        st = _image(files, _files_of(meta, "scales", 1, path)[0], lo, hi)[:n]
        scales = _lookup(path, _codebook(path, meta, "scales"), st[:, :3], "scales")
        ct = _image(files, _files_of(meta, "sh0", 1, path)[0], lo, hi)[:n]
        dc = _lookup(path, _codebook(path, meta, "sh0"), ct[:, :3], "sh0")
        alpha = np.clip(ct[:, 3] / 255.0, _ALPHA_EPS, 1 - _ALPHA_EPS)
        sh_n = np.zeros((n, 0, 3), np.float32)
        if meta.get("shN") is not None:
            shn = meta["shN"]
            degree = shn.get("bands") if isinstance(shn, dict) else None
            p = shn.get("count") if isinstance(shn, dict) else None
            if degree not in (1, 2, 3) or isinstance(p, bool) or not isinstance(p, int) or not (
                1 <= p <= 65536
            ):
                raise ValueError(f"{path}: meta.json shN needs bands 1-3 and count 1-65536")
            c = SH_COEFFS[degree]
            cen_name, lab_name = _files_of(meta, "shN", 2, path)
            rows = math.ceil(p / 64)
            cen = _image(files, cen_name, 64 * c * rows, 64 * c * rows, (64 * c, rows))
            lab = _image(files, lab_name, lo, hi)[:n, :2].astype(np.int32)
            label = lab[:, 0] | (lab[:, 1] << 8)
            del lab
            if int(label.max()) >= p:
                raise ValueError(f"{path}: SH palette label {int(label.max())} past its {p} "
                                 "entries")  # fmt: skip
            book = _codebook(path, meta, "shN")
            pal = _lookup(path, book, cen[:, :3].reshape(rows * 64, c, 3), "shN")  # [P, C, 3]
            sh_n = pal[label]
    arrays = {"means": means, "scales": scales, "quats": quats,
              "opacities": np.log(alpha / (1 - alpha)), "sh0": dc[:, None, :],
              "shN": sh_n}  # fmt: skip
    return decoded(path, arrays, model == "antialiased", notes)
