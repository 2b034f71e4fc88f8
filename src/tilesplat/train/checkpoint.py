"""Checkpoints: atomic writes, safe loads, and the run folder's checkpoint list.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so that it loads
with ``torch.load(weights_only=True)`` (no pickled code runs). It holds everything the next
step depends on: the Gaussians, the Adam states, the densification state, the RNG state, the
step, and the training log, so that ``--resume`` continues bit for bit on CPU.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# One atomic writer for every file a run writes (mode from the umask): io/atomic.py.
from ..io.atomic import atomic_write_bytes

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
    """
    run_dir = Path(run_dir)
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


def served_params(ckpt: dict[str, Any]) -> dict[str, Tensor]:
    """The parameters a checkpoint's run evaluates, renders and exports: its averaged model
    (``ema_decay``, ``train/averaging.py``) where it keeps one, else the trained parameters.

    Raises:
        ValueError: the averaged model's names or shapes differ from the parameters'.
    """
    params = ckpt["params"]
    averaged = ckpt.get("averaged")
    if not averaged:
        return params
    saved = averaged.get("params") if isinstance(averaged, dict) else None
    if not isinstance(saved, dict) or not isinstance(params, dict):
        raise ValueError("the checkpoint's averaged model (ema_decay) is malformed")
    if saved.keys() != params.keys():
        raise ValueError(f"the checkpoint's averaged model (ema_decay) has {sorted(saved)}, "
                         f"its parameters are {sorted(params)}")
    for k, p in params.items():
        v = saved[k]
        want = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
        if not isinstance(v, Tensor) or tuple(v.shape) != want:
            got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"the checkpoint's averaged {k} (ema_decay) is {got}, its "
                             f"parameter is {want}")
    return saved
