"""``export_splats`` (gsplat 1.5.3): a splat model as the bytes of a ``ply``, ``splat`` or
``ply_compressed`` file.

- ``ply``: the 3DGS layout, written by :func:`tilesplat.io.ply.save_ply` (the file
  ``tilesplat export`` writes; it carries zero normals, which gsplat's omits).
- ``splat``: antimatter15's 32-byte records, written by :func:`tilesplat.io.splat.save_splat`
  (largest Gaussians first, rounded colours; gsplat orders by Morton code and truncates).
- ``ply_compressed``: PlayCanvas SuperSplat's compressed PLY, byte for byte as gsplat writes
  it (:mod:`tilesplat.io.compressed_ply` packs it): Gaussians with opacity above 1/255, sorted
  by the Morton code of their centre, in chunks of 256 that store the bounds of position,
  log-scale and colour as floats and each Gaussian as four packed 32-bit words (position
  11-10-11, rotation smallest-three 2+10+10+10, log-scale 11-10-11, colour+opacity 8-8-8-8),
  then the higher SH bands as bytes. ``tilesplat.io`` reads it back (``load_gaussians``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Literal

import torch

from .io.atomic import atomic_write_bytes
from .io.compressed_ply import (  # noqa: F401 - gsplat.exporter's names
    encode_morton3_vec,
    pack_8888,
    pack_111011,
    pack_rotation,
    pack_unorm,
    part1by2_vec,
    sort_centers,
    splat2ply_bytes_compressed,
)
from .io.ply import save_ply
from .io.splat import save_splat
from .sh_rgb import sh0_to_rgb


def sh2rgb(sh: torch.Tensor) -> torch.Tensor:
    """gsplat.exporter's name (and argument) for :func:`tilesplat.sh_rgb.sh0_to_rgb`: the base
    colour of degree-0 SH coefficients (any shape)."""
    return sh0_to_rgb(sh)


def _via_file(write, suffix: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"splats{suffix}"
        write(path)
        return path.read_bytes()


def splat2ply_bytes(
    means: torch.Tensor,  # [N, 3]
    scales: torch.Tensor,  # [N, 3], log
    quats: torch.Tensor,  # [N, 4]
    opacities: torch.Tensor,  # [N], logits
    sh0: torch.Tensor,  # [N, 3]
    shN: torch.Tensor,  # [N, 3 * (K - 1)], channel-major
) -> bytes:
    """The 3DGS PLY of the Gaussians (:func:`tilesplat.io.ply.save_ply`)."""
    n = means.shape[0]
    splats = {"means": means, "scales": scales, "quats": quats, "opacities": opacities,
              "sh0": sh0[:, None, :], "shN": shN.reshape(n, 3, -1).transpose(1, 2)}  # fmt: skip
    return _via_file(lambda p: save_ply(p, splats), ".ply")


def splat2splat_bytes(
    means: torch.Tensor,  # [N, 3]
    scales: torch.Tensor,  # [N, 3], log
    quats: torch.Tensor,  # [N, 4]
    opacities: torch.Tensor,  # [N], logits
    sh0: torch.Tensor,  # [N, 3]
) -> bytes:
    """The ``.splat`` file of the Gaussians (:func:`tilesplat.io.splat.save_splat`)."""
    splats = {"means": means, "scales": scales, "quats": quats, "opacities": opacities,
              "sh0": sh0[:, None, :], "shN": sh0.new_zeros(means.shape[0], 0, 3)}  # fmt: skip
    return _via_file(lambda p: save_splat(p, splats), ".splat")


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
