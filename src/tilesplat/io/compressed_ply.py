"""SuperSplat's compressed PLY (``.compressed.ply``): chunks of 256 Gaussians, each Gaussian
four packed 32-bit words, the higher SH bands as bytes. PlayCanvas's layout, as gsplat's
``export_splats(format="ply_compressed")`` and splat-transform write it::

    element chunk C   18 float: min_x min_y min_z max_x max_y max_z, the same of the
                      log-scales (clamped to +-20) and of the colours sh0_to_rgb(sh0)
                      (files without the colour bounds store colours as plain 8-bit)
    element vertex N  uint packed_position  x 11 bits, y 10, z 11 of the chunk's box
                      uint packed_rotation  the index of the largest |component| of
                                            (w, x, y, z) in 2 bits, the other three as
                                            10-bit unorm of q * sqrt(1/2) + 0.5
                      uint packed_scale     log-scales 11-10-11 of the chunk's range
                      uint packed_color     r g b 8 bits of the chunk's range, opacity 8 bits
    element sh N      uchar f_rest_0 .. f_rest_{R-1}   trunc((x / 8 + 0.5) * 256), channel-major

Gaussians are sorted by the Morton code of their centre (so each chunk is a compact box).
The torch packing below is gsplat 1.5.3's, byte for byte (``export_splats`` uses it); one
change: a chunk whose extent along an axis is zero packs 0 there where gsplat divides by
zero and packs garbage. The reader is :func:`decode_compressed_ply`, reached from
:func:`tilesplat.io.ply.read_ply` whenever a vertex element holds ``packed_position``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from ..sh_rgb import rgb_to_sh0, sh0_to_rgb
from ._checks import (
    SplatData,
    as_arrays,
    check_count,
    check_writable,
    decoded,
    malformed,
    read_file,
)
from .atomic import atomic_writer
from .ply_header import MIP_COMMENT, Header, parse_header

CHUNK = 256
CHUNK_PROPS = ("min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
               "min_scale_x", "min_scale_y", "min_scale_z",
               "max_scale_x", "max_scale_y", "max_scale_z",
               "min_r", "min_g", "min_b", "max_r", "max_g", "max_b")  # fmt: skip
VERTEX_PROPS = ("packed_position", "packed_rotation", "packed_scale", "packed_color")
_ALPHA_EPS = 0.5 / 255.0
_BLOCK = CHUNK * 256  # Gaussians packed or unpacked at a time


def part1by2_vec(x: torch.Tensor) -> torch.Tensor:
    """The low 10 bits of each integer spread to every third bit (bit i -> bit 3i). [N]"""
    x = x & 0x3FF
    for shift, mask in ((16, 0xFF0000FF), (8, 0x0300F00F), (4, 0x030C30C3), (2, 0x09249249)):
        x = (x ^ (x << shift)) & mask
    return x


def encode_morton3_vec(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """30-bit Morton codes of 10-bit integer coordinates, z highest. [N] each -> [N]"""
    return (part1by2_vec(z) << 2) + (part1by2_vec(y) << 1) + part1by2_vec(x)


def sort_centers(centers: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """``indices`` [N] reordered by the Morton code of ``centers`` [N, 3] scaled to the
    bounding box on a 1024 grid (the box's far faces wrap to 0, as in gsplat)."""
    lo = centers.min(dim=0).values
    extent = centers.max(dim=0).values - lo
    extent = torch.where(extent == 0, torch.ones_like(extent), extent)
    grid = ((centers - lo) / extent * 1024).floor().to(torch.int32)
    codes = encode_morton3_vec(grid[:, 0], grid[:, 1], grid[:, 2])
    return indices[torch.argsort(codes).to(indices.device)]


def pack_unorm(value: torch.Tensor, bits: int) -> torch.Tensor:
    """Values in [0, 1] rounded to ``bits``-bit unsigned integers (int64), clamped. [N]"""
    top = (1 << bits) - 1
    return torch.clamp((value * top + 0.5).floor(), 0, top).to(torch.int64)


def pack_111011(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Three unit values in one 32-bit word: x 11 bits (high), y 10, z 11. [N] -> [N]"""
    return (pack_unorm(x, 11) << 21) | (pack_unorm(y, 10) << 11) | pack_unorm(z, 11)


def pack_8888(
    x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, w: torch.Tensor
) -> torch.Tensor:
    """Four unit values in one 32-bit word, 8 bits each, x highest. [N] -> [N]"""
    return (
        (pack_unorm(x, 8) << 24) | (pack_unorm(y, 8) << 16) | (pack_unorm(z, 8) << 8)
        | pack_unorm(w, 8)
    )


def pack_rotation(q: torch.Tensor) -> torch.Tensor:
    """Quaternions [N, 4] as 32-bit words: the index of the largest component (2 bits, made
    positive) and the other three, scaled by sqrt(2)/2 into [0, 1], in 10 bits each. [N]"""
    q = q / torch.linalg.norm(q, dim=-1, keepdim=True)
    largest = torch.argmax(q.abs(), dim=-1)  # [N]
    sign = torch.where(q.gather(1, largest[:, None]) < 0, -1.0, 1.0)
    q = q * sign
    others = torch.tensor([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]], device=q.device)
    rest = q.gather(1, others[largest])  # [N, 3]
    packed = pack_unorm(rest * (math.sqrt(2) * 0.5) + 0.5, 10)
    return (largest.to(torch.int64) << 30) | (packed[:, 0] << 20) | (packed[:, 1] << 10) | (
        packed[:, 2]
    )


def _chunk_bounds(x: torch.Tensor, chunk_of: torch.Tensor, n_chunks: int):
    """Per-chunk min and max [n_chunks, D] of rows ``x`` [N, D]."""
    shape = (n_chunks, x.shape[1])
    idx = chunk_of[:, None].expand_as(x)
    lo = torch.full(shape, math.inf, dtype=x.dtype).scatter_reduce(0, idx, x, "amin")
    hi = torch.full(shape, -math.inf, dtype=x.dtype).scatter_reduce(0, idx, x, "amax")
    return lo, hi


def splat2ply_bytes_compressed(
    means: torch.Tensor,  # [N, 3]
    scales: torch.Tensor,  # [N, 3], log
    quats: torch.Tensor,  # [N, 4]
    opacities: torch.Tensor,  # [N], logits
    sh0: torch.Tensor,  # [N, 3]
    shN: torch.Tensor,  # [N, 3 * (K - 1)], channel-major
    chunk_max_size: int = CHUNK,
    opacity_threshold: float | None = 1 / 255,
    *,
    comments: tuple[str, ...] = (),
) -> bytes:
    """SuperSplat's compressed PLY of the Gaussians whose opacity exceeds the threshold
    (all of them when it is None)."""
    if opacity_threshold is not None:
        keep = torch.sigmoid(opacities) > opacity_threshold
        means, scales, quats = means[keep], scales[keep], quats[keep]
        opacities, sh0, shN = opacities[keep], sh0[keep], shN[keep]
    n = means.shape[0]
    order = sort_centers(means, torch.arange(n))
    chunks, words, sh_bytes = _pack_sorted(means[order], scales[order], quats[order],
                                           opacities[order], sh0[order], shN[order],
                                           chunk_max_size)  # fmt: skip
    header = _header(len(chunks), n, shN.shape[1], comments)
    return b"".join([
        header,
        chunks.detach().cpu().numpy().astype("<f4").tobytes(),
        words.cpu().numpy().astype("<u4").tobytes(),
        sh_bytes.cpu().numpy().tobytes(),
    ])


def _pack_sorted(means: torch.Tensor, scales: torch.Tensor, quats: torch.Tensor,
                 opacities: torch.Tensor, sh0: torch.Tensor, shN: torch.Tensor,
                 chunk_max_size: int = CHUNK) -> tuple[torch.Tensor, ...]:
    """Gaussians already in file order (the arguments of :func:`splat2ply_bytes_compressed`,
    ``M`` rows from a chunk boundary) packed: (chunks [C, 18] float32, words [M, 4] int64,
    SH bytes [M, R] uint8)."""
    colors = sh0_to_rgb(sh0)
    n = means.shape[0]
    n_chunks = -(-n // chunk_max_size)
    chunk_of = torch.arange(n) // chunk_max_size

    m_lo, m_hi = _chunk_bounds(means, chunk_of, n_chunks)
    s_lo, s_hi = _chunk_bounds(scales, chunk_of, n_chunks)
    s_lo, s_hi = s_lo.clamp(-20, 20), s_hi.clamp(-20, 20)
    c_lo, c_hi = _chunk_bounds(colors, chunk_of, n_chunks)
    chunks = torch.cat([m_lo, m_hi, s_lo, s_hi, c_lo, c_hi], dim=1)  # [n_chunks, 18]

    def unit(x, lo, hi):
        span = hi[chunk_of] - lo[chunk_of]
        return torch.where(span > 0, (x - lo[chunk_of]) / span, torch.zeros_like(x))

    pos, scl, col = unit(means, m_lo, m_hi), unit(scales, s_lo, s_hi), unit(colors, c_lo, c_hi)
    words = torch.stack([
        pack_111011(pos[:, 0], pos[:, 1], pos[:, 2]),
        pack_rotation(quats),
        pack_111011(scl[:, 0], scl[:, 1], scl[:, 2]),
        pack_8888(col[:, 0], col[:, 1], col[:, 2], torch.sigmoid(opacities)),
    ], dim=1)  # [N, 4]
    sh_bytes = torch.clamp(torch.trunc((shN / 8 + 0.5) * 256), 0, 255).to(torch.uint8)
    return chunks, words, sh_bytes


def _header(n_chunks: int, n: int, rest: int, comments: tuple[str, ...]) -> bytes:
    """The PLY header of a compressed PLY: chunks, vertices, ``rest`` SH bytes each."""
    return (
        "ply\nformat binary_little_endian 1.0\n"
        + "".join(f"comment {c}\n" for c in comments)
        + f"element chunk {n_chunks}\n" + "".join(f"property float {p}\n" for p in CHUNK_PROPS)
        + f"element vertex {n}\n"
        + "".join(f"property uint {p}\n" for p in VERTEX_PROPS)
        + f"element sh {n}\n"
        + "".join(f"property uchar f_rest_{j}\n" for j in range(rest))
        + "end_header\n"
    ).encode("ascii")


def save_compressed_ply(
    path: str | Path, splats: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write every Gaussian (:data:`~._checks.SPLAT_KEYS`, SH degree <= 3) as a compressed
    PLY (Morton order), atomically; antialiased models get the ``SplatRenderMode: mip``
    comment."""
    a = as_arrays(splats)
    check_writable(a, "compressed PLY", 3)
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    n, rest = a["shN"].shape[:2]
    order = sort_centers(t["means"], torch.arange(n))
    n_chunks = -(-n // CHUNK)
    chunks = torch.empty((n_chunks, len(CHUNK_PROPS)))
    words = np.empty((n, 4), "<u4")  # 16 + 3 R bytes a Gaussian: what the file holds
    sh_bytes = np.empty((n, 3 * rest), np.uint8)
    for s in range(0, n, _BLOCK):  # blocks of whole chunks: the same bytes as one pass
        idx = order[s : s + _BLOCK]
        c, w, b = _pack_sorted(
            t["means"][idx], t["scales"][idx], t["quats"][idx], t["opacities"][idx],
            t["sh0"][idx, 0, :], t["shN"][idx].permute(0, 2, 1).reshape(len(idx), 3 * rest),
        )  # fmt: skip
        chunks[s // CHUNK : s // CHUNK + len(c)] = c
        words[s : s + len(idx)] = w.numpy()
        sh_bytes[s : s + len(idx)] = b.numpy()
    comments = (MIP_COMMENT,) if antialiased else ()
    path = Path(path)
    with atomic_writer(path) as f:
        f.write(_header(n_chunks, n, 3 * rest, comments))
        f.write(chunks.numpy().astype("<f4").tobytes())
        f.write(words.reshape(-1).view(np.uint8))
        f.write(sh_bytes.reshape(-1))
    return path


def _unorm(words: np.ndarray, shift: int, bits: int) -> np.ndarray:
    return ((words >> shift) & ((1 << bits) - 1)).astype(np.float64) / ((1 << bits) - 1)


def decode_compressed_ply(path: Path, raw: bytes, header: Header) -> SplatData:
    """The Gaussians of a compressed PLY whose header is ``header`` (the file's bytes
    ``raw``), in file order."""
    order = header.order
    if not order:
        raise ValueError(f"{path}: a compressed PLY must be binary, got {header.fmt}")
    chunk, vertex, sh_el = header.element("chunk"), header.element("vertex"), header.element("sh")
    if chunk is None:
        raise ValueError(f"{path}: compressed PLY (packed_position) without a 'chunk' element")
    n = vertex.count
    vnames = [p for p, _ in vertex.props]
    if [t for p, t in vertex.props if p in VERTEX_PROPS] != ["u4"] * 4 or set(VERTEX_PROPS) - set(
        vnames
    ):
        raise ValueError(f"{path}: compressed PLY vertices need uint {', '.join(VERTEX_PROPS)}")
    cnames = [p for p, _ in chunk.props]
    has_color = "min_r" in cnames
    want = CHUNK_PROPS if has_color else CHUNK_PROPS[:12]
    if any(p not in cnames for p in want) or chunk.has_lists:
        raise ValueError(f"{path}: compressed PLY chunks need float {', '.join(want)}")
    if chunk.count != -(-n // CHUNK):
        raise ValueError(f"{path}: {chunk.count} chunks for {n} Gaussians; expected "
                         f"{-(-n // CHUNK)} of {CHUNK}")  # fmt: skip
    rest = []
    notes = []
    if sh_el is not None:
        rest = [p for p, _ in sh_el.props]
        named = rest == [f"f_rest_{i}" for i in range(len(rest))]
        if sh_el.count != n or not named or len(rest) not in (0, 9, 24, 45):
            raise ValueError(f"{path}: the 'sh' element must hold {n} rows of f_rest_0.. "
                             "(0, 9, 24 or 45 of them)")  # fmt: skip
        if any(t != "u1" for _, t in sh_el.props):
            raise ValueError(f"{path}: compressed PLY SH values must be uchar")
    others = [e.name for e in header.elements if e.name not in ("chunk", "vertex", "sh")]
    if others:
        notes.append(f"{path}: ignored PLY elements {', '.join(others)}")
    with malformed(path, "compressed PLY"), np.errstate(invalid="ignore", over="ignore"):
        elements = {}
        for el in (chunk, vertex, sh_el):
            if el is None:
                continue
            dtype = el.dtype(order)
            start = header.offset_of(path, el.name)
            check_count(path, el.count, len(raw) - start, dtype.itemsize, f"element {el.name}")
            elements[el.name] = np.frombuffer(raw, dtype, count=el.count, offset=start)
        out = {"means": np.empty((n, 3), np.float32), "scales": np.empty((n, 3), np.float32),
               "quats": np.empty((n, 4), np.float32), "opacities": np.empty(n, np.float32),
               "sh0": np.empty((n, 1, 3), np.float32),
               "shN": np.empty((n, len(rest) // 3, 3), np.float32)}  # fmt: skip
        for s in range(0, n, _BLOCK):
            e = min(n, s + _BLOCK)
            sh = elements["sh"][s:e] if rest else None
            part = _decode_block(elements["chunk"], elements["vertex"][s:e], sh, s, has_color)
            for k, val in part.items():
                out[k][s:e] = val
    return decoded(path, out, header.antialiased(), notes)


def _decode_block(c: np.ndarray, v: np.ndarray, sh: np.ndarray | None, s: int,
                  has_color: bool) -> dict[str, np.ndarray]:
    """Gaussians ``s .. s + M`` (float64, :data:`~._checks.SPLAT_KEYS`) of the chunk records
    ``c`` [C], vertex records ``v`` [M] and SH records ``sh`` [M] (or None)."""
    n = len(v)
    ci = (np.arange(n) + s) // CHUNK

    def lerp(prefix_lo: str, prefix_hi: str, t: np.ndarray) -> np.ndarray:
        lo = np.stack([c[p].astype(np.float64) for p in prefix_lo.split()], 1)[ci]
        hi = np.stack([c[p].astype(np.float64) for p in prefix_hi.split()], 1)[ci]
        return lo * (1 - t) + hi * t

    pp, pr, ps, pc = (v[p].astype(np.uint32) for p in VERTEX_PROPS)
    t_pos = np.stack([_unorm(pp, 21, 11), _unorm(pp, 11, 10), _unorm(pp, 0, 11)], 1)
    means = lerp("min_x min_y min_z", "max_x max_y max_z", t_pos)
    t_scl = np.stack([_unorm(ps, 21, 11), _unorm(ps, 11, 10), _unorm(ps, 0, 11)], 1)
    scales = lerp("min_scale_x min_scale_y min_scale_z",
                  "max_scale_x max_scale_y max_scale_z", t_scl)  # fmt: skip
    three = np.stack([_unorm(pr, 20, 10), _unorm(pr, 10, 10), _unorm(pr, 0, 10)], 1)
    three = (three - 0.5) * math.sqrt(2.0)
    largest = (pr >> 30).astype(np.int64)
    others = np.array([[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]])[largest]
    quats = np.zeros((n, 4))
    np.put_along_axis(quats, others, three, axis=1)
    big = np.sqrt(np.maximum(0.0, 1.0 - (three * three).sum(1)))
    np.put_along_axis(quats, largest[:, None], big[:, None], axis=1)
    t_col = np.stack([_unorm(pc, 24, 8), _unorm(pc, 16, 8), _unorm(pc, 8, 8)], 1)
    colors = lerp("min_r min_g min_b", "max_r max_g max_b", t_col) if has_color else t_col
    alpha = np.clip(_unorm(pc, 0, 8), _ALPHA_EPS, 1 - _ALPHA_EPS)
    out = {"means": means, "scales": scales, "quats": quats,
           "opacities": np.log(alpha / (1 - alpha)), "sh0": rgb_to_sh0(colors)[:, None, :]}
    if sh is not None:
        names = sh.dtype.names
        b = np.stack([sh[p] for p in names], 1).astype(np.float64)
        nrm = np.where(b == 0, 0.0, np.where(b == 255, 1.0, (b + 0.5) / 256))
        out["shN"] = ((nrm - 0.5) * 8).reshape(n, 3, len(names) // 3).transpose(0, 2, 1)
    return out


def read_compressed_ply(path: str | Path) -> SplatData:
    """Read a compressed PLY (see the module docstring): its Gaussians
    (:data:`~._checks.SPLAT_KEYS`).

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): not a compressed PLY, counts the file cannot hold,
            truncated data, or values that are not finite.
    """
    path = Path(path)
    raw = read_file(path, "compressed PLY")
    header = parse_header(path, raw)
    vertex = header.element("vertex")
    if vertex is None or "packed_position" not in [p for p, _ in vertex.props]:
        raise ValueError(f"{path}: not a compressed PLY (no vertex property packed_position)")
    return decode_compressed_ply(path, raw, header)
