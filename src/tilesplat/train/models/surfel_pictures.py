"""The pictures a 2DGS model's test renders add: normals, normals of the depth, depth."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ...io.images import RENDER_PNG_LEVEL, write_png

# Pixels at least this opaque get a depth colour and a unit normal in the PNGs.
OPAQUE = 0.5
# Colour-map anchors (viridis-like, dark = near, bright = far) at 0, 1/4, 1/2, 3/4, 1.
_COLORMAP = np.array(
    [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]], np.float64
) / 255.0
RENDER_FOLDERS = ("normal", "normal_from_depth", "depth")


def colormap(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A colour picture [H, W, 3] in [0, 1] of ``values`` [H, W] where ``mask`` [H, W] holds,
    scaled to their min..max there; black elsewhere."""
    out = np.zeros((*values.shape, 3))
    if not mask.any():
        return out
    v = values[mask]
    lo, hi = float(v.min()), float(v.max())
    t = (v - lo) / (hi - lo) if hi > lo else np.zeros_like(v)
    xs = np.linspace(0.0, 1.0, len(_COLORMAP))
    out[mask] = np.stack([np.interp(t, xs, _COLORMAP[:, c]) for c in range(3)], axis=-1)
    return out


def unit_normals(normals: Tensor, alphas: Tensor) -> Tensor:
    """Rendered normals [..., 3] scaled to unit length where alpha [..., 1] >= ``OPAQUE``,
    zero elsewhere."""
    unit = torch.nn.functional.normalize(normals, dim=-1)
    return torch.where(alphas >= OPAQUE, unit, torch.zeros_like(unit))


def write_surfel_renders(
    folder: Path,
    name: str,
    alphas: Tensor,  # [C, H, W, 1]
    normals: Tensor,  # [C, H, W, 3]
    normals_from_depth: Tensor,  # [C, H, W, 3]
    depths: Tensor,  # [C, H, W, 1]
) -> None:
    """Write camera 0 of a surfel render as ``folder/{normal,normal_from_depth,depth}/name``
    PNGs (atomically): normals as 0.5 + 0.5 n (grey where transparent), the depth
    colour-mapped over the opaque pixels (black elsewhere), at the colour renders' zlib level."""
    alpha = alphas[0].detach()
    mask = (alpha[..., 0] >= OPAQUE).cpu().numpy()
    pictures = {
        "normal": 0.5 + 0.5 * unit_normals(normals[0].detach(), alpha),
        "normal_from_depth": 0.5 + 0.5 * normals_from_depth[0].detach() * (alpha >= OPAQUE),
        "depth": colormap(depths[0, ..., 0].detach().cpu().numpy().astype(np.float64), mask),
    }
    for sub, image in pictures.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        write_png(folder / sub / name, image, compress_level=RENDER_PNG_LEVEL)
