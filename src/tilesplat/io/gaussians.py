"""Gaussian splat files: one entry point for PLY, ``.splat`` and ``.spz`` by file suffix.

Every reader returns, and every writer takes, the raw parameters of the trainer (as
:func:`tilesplat.io.ply.load_ply`): ``means`` [N, 3], ``quats`` [N, 4] (w, x, y, z),
``log_scales`` [N, 3], ``opacity_logits`` [N] and ``sh`` [N, K, 3] with K = (degree + 1)^2,
all float32 in the 3DGS / COLMAP frame (x right, y down, z forward of the cameras).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

SH_C0 = 0.28209479177387814  # Y_0^0: base colour = 0.5 + SH_C0 * sh[:, 0]
SUFFIXES = (".ply", ".splat", ".spz")
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
    n = out["means"].shape[0] if out["means"].ndim == 2 else -1
    k = out["sh"].shape[1] if out["sh"].ndim == 3 else 0
    want = {"means": (n, 3), "quats": (n, 4), "log_scales": (n, 3),
            "opacity_logits": (n,), "sh": (n, k, 3)}  # fmt: skip
    for name, shape in want.items():
        if n < 0 or out[name].shape != shape:
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


def _suffix(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"{path}: unknown splat file type {suffix or '(none)'!r}; expected one of "
            + ", ".join(SUFFIXES)
        )
    return suffix


def load_gaussians(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a ``.ply`` (3DGS layout), ``.splat`` (antimatter15) or ``.spz`` (Niantic) file.

    Returns:
        ``means`` [N, 3], ``quats`` [N, 4], ``log_scales`` [N, 3], ``opacity_logits`` [N],
        ``sh`` [N, K, 3], float32.

    Raises:
        FileNotFoundError: no such file.
        ValueError (naming the file): an unknown suffix, or a malformed file.
    """
    path = Path(path)
    suffix = _suffix(path)
    if not path.is_file():
        raise FileNotFoundError(f"splat file not found: {path}")
    if suffix == ".ply":
        from .ply import load_ply

        return load_ply(path)
    if suffix == ".splat":
        from .splat import load_splat

        return load_splat(path)
    from .spz import load_spz

    return load_spz(path)


def save_gaussians(path: str | Path, gaussians: dict[str, torch.Tensor]) -> Path:
    """Write ``gaussians`` (the dict :func:`load_gaussians` returns) by ``path``'s suffix."""
    path = Path(path)
    suffix = _suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    args = [gaussians[k] for k in ARRAY_NAMES]
    if suffix == ".ply":
        from .ply import save_ply

        return save_ply(path, *args)
    if suffix == ".splat":
        from .splat import save_splat

        return save_splat(path, *args)
    from .spz import save_spz

    return save_spz(path, *args)
