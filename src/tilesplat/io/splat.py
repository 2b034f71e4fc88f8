"""``.splat`` files: antimatter15's WebGL splat viewer layout, 32 bytes per Gaussian.

Each Gaussian, little endian, no header::

    float32 x, y, z                      position
    float32 sx, sy, sz                   scales (linear: exp of the log-scales)
    uint8   r, g, b, a                   base colour (sh0_to_rgb of sh0) and opacity, x 255
    uint8   qw, qx, qy, qz               unit quaternion, round(q * 128 + 128) clipped to 0..255

Only the degree-0 colour survives (view-dependent colour is dropped); colour, opacity and
rotation are quantised to 8 bits. Gaussians are written largest first (volume x opacity), the
order the web viewers stream them in. Positions are in the PLY's frame, as that viewer's
converter writes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..sh_rgb import rgb_to_sh0, sh0_to_rgb
from ._checks import SplatData, as_arrays, check_count, decoded, read_file
from .atomic import atomic_writer

RECORD = np.dtype(
    [("position", "<f4", 3), ("scale", "<f4", 3), ("rgba", "u1", 4), ("rot", "u1", 4)]
)
assert RECORD.itemsize == 32
_ALPHA_EPS = 0.5 / 255.0  # alpha 0 or 255 decodes to this far inside (0, 1): a finite logit


def splat_order(scales: np.ndarray, opacities: np.ndarray) -> np.ndarray:
    """Indices largest first by volume x opacity of log-scales [N, 3] and opacity logits [N]:
    [N] int64 (stable for ties)."""
    key = scales.astype(np.float64).sum(axis=1) - np.logaddexp(0.0, -opacities)
    return np.argsort(-key, kind="stable")


def save_splat(
    path: str | Path, splats: dict[str, torch.Tensor], antialiased: bool = False
) -> Path:
    """Write Gaussians (:data:`~._checks.SPLAT_KEYS`; only ``sh0`` of the colours is kept) as
    a ``.splat`` file, atomically; returns the path. The layout has no antialiased flag:
    ``antialiased`` is accepted and not recorded."""
    a = as_arrays(splats)
    norms = np.linalg.norm(a["quats"], axis=1, keepdims=True)
    if not np.all(norms > 0):
        raise ValueError("quats: a quaternion is zero")
    order = splat_order(a["scales"], a["opacities"])
    rec = np.empty(len(order), RECORD)
    rec["position"] = a["means"][order]
    rec["scale"] = np.exp(a["scales"][order])
    rgb = sh0_to_rgb(a["sh0"][order, 0, :])
    alpha = 1.0 / (1.0 + np.exp(-a["opacities"][order].astype(np.float64)))
    rec["rgba"][:, :3] = np.clip(np.round(rgb * 255.0), 0, 255)
    rec["rgba"][:, 3] = np.clip(np.round(alpha * 255.0), 0, 255)
    q = (a["quats"] / norms)[order]
    rec["rot"] = np.clip(np.round(q * 128.0 + 128.0), 0, 255)
    path = Path(path)
    with atomic_writer(path) as f:
        f.write(rec.tobytes())
    return path


def read_splat(path: str | Path) -> SplatData:
    """Read a ``.splat`` file (see the module docstring): Gaussians of SH degree 0.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): a size that is not a multiple of 32 bytes, no
            Gaussians, non-finite values, scales <= 0 or a zero quaternion.
    """
    path = Path(path)
    raw = read_file(path, ".splat")
    if len(raw) % RECORD.itemsize:
        raise ValueError(
            f"{path}: not a .splat file: {len(raw)} bytes is not a multiple of the "
            f"{RECORD.itemsize}-byte record"
        )
    check_count(path, len(raw) // RECORD.itemsize, len(raw), RECORD.itemsize)
    rec = np.frombuffer(raw, dtype=RECORD)
    scales = rec["scale"].astype(np.float32)
    if not np.all(scales > 0):  # also catches NaN
        i = int(np.argmax(~(scales > 0).all(axis=1)))
        raise ValueError(f"{path}: the scale of Gaussian {i} is not a positive number")
    rgba = rec["rgba"].astype(np.float32) / 255.0
    alpha = np.clip(rgba[:, 3], _ALPHA_EPS, 1.0 - _ALPHA_EPS)
    with np.errstate(over="ignore"):
        log_scales = np.log(scales)
    arrays = {
        "means": rec["position"].astype(np.float32),
        "scales": log_scales,
        "quats": (rec["rot"].astype(np.float32) - 128.0) / 128.0,
        "opacities": np.log(alpha / (1.0 - alpha)).astype(np.float32),
        "sh0": rgb_to_sh0(rgba[:, None, :3]).astype(np.float32),
        "shN": np.zeros((len(rec), 0, 3), np.float32),
    }
    return decoded(path, arrays)


def load_splat(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a ``.splat`` file (see :func:`read_splat`)."""
    return read_splat(path).gaussians
