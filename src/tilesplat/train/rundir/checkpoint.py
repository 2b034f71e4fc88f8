"""Checkpoints: atomic writes, safe loads, and the run folder's checkpoint list.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so that it loads
with ``torch.load(weights_only=True)`` (no pickled code runs). It holds everything the next
step depends on: the Gaussians, the Adam states, the densification state, the RNG state, the
step, and the training log, so that ``--resume`` continues bit for bit on CPU.
"""

from __future__ import annotations

import dataclasses
import io
import re
from pathlib import Path
from typing import Any

import torch

# One atomic writer for every file a run writes (mode from the umask): io/atomic.py.
from ...io.atomic import atomic_write_bytes
from ..config import TrainConfig, config_from_dict
from ..features.averaging import served_params
from ..models.splats import check_params

CHECKPOINT_FORMAT = "tilesplat-train-1"

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step_(\d+)\.pt$")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Serialise ``state`` with ``torch.save`` and write it atomically to ``path``."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return atomic_write_bytes(Path(path), buf.getvalue())


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, with ``weights_only=True``.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a readable checkpoint (truncated, corrupt, foreign).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        raise ValueError(
            f"{path}: not a readable checkpoint ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(state, dict) or "step" not in state or "params" not in state:
        raise ValueError(f"{path}: not a tilesplat training checkpoint")
    return state


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint after ``step`` completed steps lives."""
    return Path(run_dir) / CHECKPOINT_DIR / f"step_{step:07d}.pt"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir: str | Path) -> Path:
    """The newest checkpoint of a run folder.

    Raises:
        FileNotFoundError: the folder does not exist or holds no checkpoint.
        ValueError: ``run_dir`` is a file.
    """
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"{run_dir}: expected a run folder, found a file")
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder not found: {run_dir}")
    found = list_checkpoints(run_dir)
    if not found:
        raise FileNotFoundError(f"no checkpoint in {run_dir / CHECKPOINT_DIR}")
    return found[-1]


def prune_checkpoints(run_dir: str | Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints."""
    for old in list_checkpoints(run_dir)[:-keep]:
        old.unlink(missing_ok=True)


def checkpoint_config(ckpt: dict[str, Any]) -> TrainConfig:
    """The config stored in a checkpoint."""
    return config_from_dict(ckpt["config"], where="checkpoint config")


@dataclasses.dataclass
class RunCheckpoint:
    """One checkpoint of a run, checked: what a replay of the run needs besides the data.

    Attributes:
        run_dir: the run folder; path: the checkpoint file; step: steps it completed.
        cfg: the run's config as stored in the checkpoint; ckpt: the checkpoint dict.
        n_gaussians: the number of Gaussians.
    """

    run_dir: Path
    path: Path
    step: int
    cfg: TrainConfig
    ckpt: dict[str, Any]
    n_gaussians: int


def open_checkpoint(target: str | Path) -> RunCheckpoint:
    """A run folder's newest checkpoint, or one checkpoint file, loaded and checked.

    The file is loaded with ``weights_only=True`` (no pickled code runs), its format, config
    (unknown keys rejected), parameters (names, shapes, finite) and Adam states checked.

    Raises:
        FileNotFoundError: no such folder or file, or no checkpoint in the folder.
        ValueError: not a tilesplat training checkpoint, or a malformed one.
    """
    target = Path(target)
    path = target if target.is_file() else latest_checkpoint(target)
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    ckpt = load_checkpoint(path)
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(
            f"{path}: checkpoint format {ckpt.get('format')!r} is not {CHECKPOINT_FORMAT!r}"
        )
    if not isinstance(ckpt.get("config"), dict):
        raise ValueError(f"{path}: the checkpoint holds no config")
    cfg = checkpoint_config(ckpt)
    step = ckpt.get("step")
    scale = ckpt.get("scene_scale")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"{path}: step must be an int >= 0, got {step!r}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ValueError(f"{path}: scene_scale must be a number > 0, got {scale!r}")
    try:
        n = check_params(ckpt["params"], cfg.sh_degree)
        served = served_params(ckpt)
        if served is not ckpt["params"] and check_params(served, cfg.sh_degree) != n:
            raise ValueError("the averaged model (ema_decay) has another Gaussian count")
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if not isinstance(ckpt.get("optimizers"), dict):
        raise ValueError(f"{path}: the checkpoint holds no optimizer states")
    return RunCheckpoint(run_dir, path, step, cfg, ckpt, n)
