"""Checks every splat file format shares: the five arrays a writer takes, the count and the
values a reader decodes.

Every reader returns, and every writer takes, the raw parameters of the trainer:
``means`` [N, 3], ``quats`` [N, 4] (w, x, y, z), ``log_scales`` [N, 3], ``opacity_logits``
[N] and ``sh`` [N, K, 3] with K = (degree + 1)^2, float32 in the 3DGS / COLMAP frame. The
format modules (``ply``, ``splat``, ``spz``) import these checks; the suffix table of
:mod:`.gaussians` imports the format modules, so nothing here imports either.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

# Refuse files that claim more Gaussians than this before allocating anything (the SPZ
# reference library refuses the same count).
MAX_GAUSSIANS = 10_000_000
ARRAY_NAMES = ("means", "quats", "log_scales", "opacity_logits", "sh")


def as_arrays(
    means: torch.Tensor | np.ndarray,  # [N, 3]
    quats: torch.Tensor | np.ndarray,  # [N, 4] (w, x, y, z), any norm
    log_scales: torch.Tensor | np.ndarray,  # [N, 3]
    opacity_logits: torch.Tensor | np.ndarray,  # [N]
    sh: torch.Tensor | np.ndarray,  # [N, K, 3]
) -> dict[str, np.ndarray]:
    """The five arrays as float32 NumPy, shapes checked (``ValueError`` naming the array)."""
    out = {}
    for name, value in zip(
        ARRAY_NAMES, (means, quats, log_scales, opacity_logits, sh), strict=True
    ):
        if isinstance(value, torch.Tensor):
            value = value.detach().to("cpu").numpy()
        out[name] = np.asarray(value, dtype=np.float32)
    if out["means"].ndim != 2 or out["sh"].ndim != 3:
        raise ValueError(
            f"expected means [N, 3] and sh [N, K, 3], got {list(out['means'].shape)}, "
            f"{list(out['sh'].shape)}"
        )
    n, k = out["means"].shape[0], out["sh"].shape[1]
    want = {"means": (n, 3), "quats": (n, 4), "log_scales": (n, 3),
            "opacity_logits": (n,), "sh": (n, k, 3)}  # fmt: skip
    for name, shape in want.items():
        if out[name].shape != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(out[name].shape)}")
    if k < 1 or math.isqrt(k) ** 2 != k:
        raise ValueError(f"sh: K = {k} is not a square (degree + 1)^2")
    return out


def to_tensors(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """float32 contiguous tensors of the five arrays."""
    return {k: torch.from_numpy(np.ascontiguousarray(arrays[k], np.float32)) for k in ARRAY_NAMES}


def check_count(path: Path, n: int) -> None:
    """A claimed Gaussian count is usable: at least 1 and at most :data:`MAX_GAUSSIANS`."""
    if n < 1:
        raise ValueError(f"{path}: the file holds no Gaussians")
    if n > MAX_GAUSSIANS:
        raise ValueError(f"{path}: {n} Gaussians is more than the {MAX_GAUSSIANS} supported")


def check_finite(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Every decoded value is finite and every quaternion non-zero."""
    for name, arr in arrays.items():
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.argwhere(bad.reshape(len(arr), -1).any(axis=1))[0, 0])
            raise ValueError(f"{path}: {name} of Gaussian {i} is not finite")
    zero = ~np.any(arrays["quats"] != 0.0, axis=1)
    if zero.any():
        raise ValueError(f"{path}: the rotation of Gaussian {int(np.argmax(zero))} is zero")
