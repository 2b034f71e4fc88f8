"""``export_splats`` (gsplat 1.5.3): a splat model as the bytes of a ``ply``, ``splat`` or
``ply_compressed`` file.

- ``ply``: the 3DGS layout, written by :func:`tilesplat.io.ply.save_ply` (the file
  ``tilesplat export`` writes; it carries zero normals, which gsplat's omits).
- ``splat``: antimatter15's 32-byte records, written by :func:`tilesplat.io.splat.save_splat`
  (largest Gaussians first, rounded colours; gsplat orders by Morton code and truncates).
- ``ply_compressed``: PlayCanvas SuperSplat's compressed PLY, byte for byte as gsplat writes
  it: Gaussians with opacity above 1/255, sorted by the Morton code of their centre, in
  chunks of 256 that store the bounds of position, log-scale and colour as floats and each
  Gaussian as four packed 32-bit words (position 11-10-11, rotation smallest-three 2+10+10+10,
  log-scale 11-10-11, colour+opacity 8-8-8-8), then the higher SH bands as bytes.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Literal

import torch

from .constants import SH_C0
from .io.atomic import atomic_write_bytes
from .io.ply import save_ply
from .io.splat import save_splat

CHUNK = 256


def sh2rgb(sh: torch.Tensor) -> torch.Tensor:
    """Degree-0 SH coefficients to RGB: ``sh · C0 + 0.5`` (any shape)."""
    return sh * SH_C0 + 0.5


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
    chunk_max_size: int = 256,
    opacity_threshold: float = 1 / 255,
) -> bytes:
    """SuperSplat's compressed PLY of the Gaussians whose opacity exceeds the threshold."""
    keep = torch.sigmoid(opacities) > opacity_threshold
    means, scales, quats = means[keep], scales[keep], quats[keep]
    opacities, colors, shN = opacities[keep], sh2rgb(sh0[keep]), shN[keep]
    n = means.shape[0]
    n_chunks = -(-n // chunk_max_size)
    order = sort_centers(means, torch.arange(n))
    means, scales, quats = means[order], scales[order], quats[order]
    opacities, colors, shN = opacities[order], colors[order], shN[order]
    chunk_of = torch.arange(n) // chunk_max_size

    m_lo, m_hi = _chunk_bounds(means, chunk_of, n_chunks)
    s_lo, s_hi = _chunk_bounds(scales, chunk_of, n_chunks)
    s_lo, s_hi = s_lo.clamp(-20, 20), s_hi.clamp(-20, 20)
    c_lo, c_hi = _chunk_bounds(colors, chunk_of, n_chunks)
    chunks = torch.cat([m_lo, m_hi, s_lo, s_hi, c_lo, c_hi], dim=1)  # [n_chunks, 18]

    def unit(x, lo, hi):
        return (x - lo[chunk_of]) / (hi[chunk_of] - lo[chunk_of])

    pos, scl, col = unit(means, m_lo, m_hi), unit(scales, s_lo, s_hi), unit(colors, c_lo, c_hi)
    words = torch.stack([
        pack_111011(pos[:, 0], pos[:, 1], pos[:, 2]),
        pack_rotation(quats),
        pack_111011(scl[:, 0], scl[:, 1], scl[:, 2]),
        pack_8888(col[:, 0], col[:, 1], col[:, 2], torch.sigmoid(opacities)),
    ], dim=1)  # [N, 4]
    sh_bytes = torch.clamp(torch.trunc((shN / 8 + 0.5) * 256), 0, 255).to(torch.uint8)

    bounds = ["min_x", "min_y", "min_z", "max_x", "max_y", "max_z",
              "min_scale_x", "min_scale_y", "min_scale_z",
              "max_scale_x", "max_scale_y", "max_scale_z",
              "min_r", "min_g", "min_b", "max_r", "max_g", "max_b"]
    header = (
        "ply\nformat binary_little_endian 1.0\n"
        f"element chunk {n_chunks}\n" + "".join(f"property float {p}\n" for p in bounds)
        + f"element vertex {n}\n"
        + "".join(f"property uint {p}\n" for p in
                  ("packed_position", "packed_rotation", "packed_scale", "packed_color"))
        + f"element sh {n}\n"
        + "".join(f"property uchar f_rest_{j}\n" for j in range(shN.shape[1]))
        + "end_header\n"
    )
    return b"".join([
        header.encode("ascii"),
        chunks.detach().cpu().numpy().astype("<f4").tobytes(),
        words.cpu().numpy().astype("<u4").tobytes(),
        sh_bytes.cpu().numpy().tobytes(),
    ])


def _via_file(write, suffix: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"splats{suffix}"
        write(path)
        return path.read_bytes()


def _sh(sh0: torch.Tensor, shN: torch.Tensor) -> torch.Tensor:
    """[N, 3] and channel-major [N, 3 (K - 1)] -> [N, K, 3]."""
    n = sh0.shape[0]
    rest = shN.reshape(n, 3, -1).transpose(1, 2)
    return torch.cat([sh0[:, None, :], rest], dim=1)


def splat2ply_bytes(
    means: torch.Tensor,  # [N, 3]
    scales: torch.Tensor,  # [N, 3], log
    quats: torch.Tensor,  # [N, 4]
    opacities: torch.Tensor,  # [N], logits
    sh0: torch.Tensor,  # [N, 3]
    shN: torch.Tensor,  # [N, 3 * (K - 1)], channel-major
) -> bytes:
    """The 3DGS PLY of the Gaussians (:func:`tilesplat.io.ply.save_ply`)."""
    sh = _sh(sh0, shN)
    return _via_file(lambda p: save_ply(p, means, quats, scales, opacities, sh), ".ply")


def splat2splat_bytes(
    means: torch.Tensor,  # [N, 3]
    scales: torch.Tensor,  # [N, 3], log
    quats: torch.Tensor,  # [N, 4]
    opacities: torch.Tensor,  # [N], logits
    sh0: torch.Tensor,  # [N, 3]
) -> bytes:
    """The ``.splat`` file of the Gaussians (:func:`tilesplat.io.splat.save_splat`)."""
    return _via_file(
        lambda p: save_splat(p, means, quats, scales, opacities, sh0[:, None, :]), ".splat"
    )


def export_splats(
    means: torch.Tensor,  # [N, 3]
    scales: torch.Tensor,  # [N, 3], log
    quats: torch.Tensor,  # [N, 4]
    opacities: torch.Tensor,  # [N], logits
    sh0: torch.Tensor,  # [N, 1, 3]
    shN: torch.Tensor,  # [N, K, 3]
    format: Literal["ply", "splat", "ply_compressed"] = "ply",
    save_to: str | None = None,
) -> bytes:
    """A splat model as the bytes of a file; written to ``save_to`` too when given.

    Gaussians with a NaN or Inf in any of their values are left out.

    Args:
        means: centres. [N, 3]
        scales: log-scales. [N, 3]
        quats: quaternions (w, x, y, z), any norm. [N, 4]
        opacities: opacity logits. [N]
        sh0: degree-0 SH coefficients. [N, 1, 3]
        shN: higher SH coefficients. [N, K, 3]
        format: ``ply`` (3DGS layout), ``splat`` (antimatter15) or ``ply_compressed``
            (SuperSplat).
        save_to: a file path to write the bytes to (atomically).

    Raises:
        ValueError: a shape that does not fit, or an unknown format.
    """
    formats = ("ply", "splat", "ply_compressed")
    if format not in formats:
        raise ValueError(f"format must be one of {list(formats)}, got {format!r}")
    tensors = {"means": means, "scales": scales, "quats": quats, "opacities": opacities,
               "sh0": sh0, "shN": shN}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected {name} to be a torch.Tensor, got {type(t).__name__}")
    n = means.shape[0] if means.dim() == 2 else -1
    want = {"means": (n, 3), "scales": (n, 3), "quats": (n, 4), "opacities": (n,),
            "sh0": (n, 1, 3)}
    for name, shape in want.items():
        if n < 0 or tuple(tensors[name].shape) != shape:
            raise ValueError(f"expected {name} of shape {shape} (N, ...), got "
                             f"{tuple(tensors[name].shape)}")
    if shN.dim() != 3 or shN.shape[0] != n or shN.shape[2] != 3:
        raise ValueError(f"expected shN of shape (N, K, 3) with N = {n}, got {tuple(shN.shape)}")
    means, scales, quats, opacities = (t.detach().cpu().float() for t in
                                       (means, scales, quats, opacities))
    sh0 = sh0.detach().cpu().float()[:, 0, :]  # [N, 3]
    shN = shN.detach().cpu().float().permute(0, 2, 1).reshape(n, -1)  # [N, 3 (K - 1)]
    finite = torch.isfinite(torch.cat([means, scales, quats, opacities[:, None], sh0, shN],
                                      dim=1)).all(dim=1)
    means, scales, quats = means[finite], scales[finite], quats[finite]
    opacities, sh0, shN = opacities[finite], sh0[finite], shN[finite]
    if format == "ply":
        data = splat2ply_bytes(means, scales, quats, opacities, sh0, shN)
    elif format == "splat":
        data = splat2splat_bytes(means, scales, quats, opacities, sh0)
    else:
        data = splat2ply_bytes_compressed(means, scales, quats, opacities, sh0, shN)
    if save_to:
        atomic_write_bytes(save_to, data)
    return data
