"""Checkpoints: atomic writes, safe loads, and the run folder's checkpoint list.

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so that it loads
with ``torch.load(weights_only=True)`` (no pickled code runs). It holds everything the next
step depends on: the Gaussians, the Adam states, the densification state, the RNG state, the
step, and the training log, so that ``--resume`` continues bit for bit on CPU.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

# One atomic writer for every file a run writes (mode from the umask): io/atomic.py.
from ...io.atomic import atomic_writer
from .. import seams
from ..config import TrainConfig, config_from_dict
from ..features.averaging import served_params
from ..models import model_kind
from ..models.splats import PARAM_NAMES, check_optimizer_states, check_params
from .history import HISTORY_KEYS, WINDOW_LENGTHS

CHECKPOINT_FORMAT = "tilesplat-train-1"

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^step_(\d+)\.pt$")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> Path:
    """Serialise ``state`` with ``torch.save`` straight into a temporary file that replaces
    ``path`` when it is whole (the folder is made). Nothing is held in memory on the way:
    serialising to bytes first held the checkpoint once more (2.1 GB for a 3 M-Gaussian
    model's parameters and Adam moments)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:
        torch.save(state, f)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint`, with ``weights_only=True``.

    Its fields are not checked here: :func:`open_checkpoint` checks them.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is not a readable checkpoint (truncated, corrupt, not a dict).
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
    if not isinstance(state, dict):
        raise ValueError(f"{path}: not a tilesplat training checkpoint (a "
                         f"{type(state).__name__}, not a dict)")
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


def _number(ckpt: dict[str, Any], key: str, low: float, low_ok: bool) -> float:
    """``ckpt[key]``, a finite real number above ``low`` (or at it, with ``low_ok``)."""
    value = ckpt.get(key)
    ok = (not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
          and (value >= low if low_ok else value > low))
    if not ok:
        raise ValueError(f"{key} must be a finite number {'>=' if low_ok else '>'} {low}, got "
                         f"{value!r}")
    return float(value)


def _numbers(value: object, what: str) -> list:
    """``value``, checked to be a list of real numbers (NaN allowed: an undefined PSNR)."""
    if not isinstance(value, list) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        raise ValueError(f"{what} must be a list of numbers")
    return value


def _check_history(history: object, window: object) -> None:
    """The training log of a checkpoint: ``history`` lists of numbers of equal lengths (the
    logged steps', the evaluations'), ``window`` the sums since the last logged step."""
    if not isinstance(history, dict):
        raise ValueError(f"history must be a dict of lists, got {type(history).__name__}")
    for keys in (HISTORY_KEYS[:5], HISTORY_KEYS[5:]):
        lengths = {k: len(_numbers(history.get(k, []), f"history[{k!r}]")) for k in keys}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"history lists differ in length: {lengths}")
    if not isinstance(window, list) or len(window) not in WINDOW_LENGTHS:
        raise ValueError(f"window must be a list of {' or '.join(map(str, WINDOW_LENGTHS))} "
                         f"numbers, got {window!r}")
    _numbers(window, "window")


def _check_strategy_state(state: object, fresh: dict[str, Any], n: int) -> None:
    """A checkpoint's strategy state against a new one of the run's strategy: the same keys;
    a tensor where the new state has one (same shape and dtype), a number where it has one;
    where it has None (made on the first steps), None, a number or a tensor of one row per
    Gaussian."""
    if not isinstance(state, dict) or set(state) != set(fresh):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"strategy_state holds {got}, the strategy keeps {sorted(fresh)}")
    for key, new in fresh.items():
        v = state[key]
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if isinstance(new, Tensor):
            ok = isinstance(v, Tensor) and v.shape == new.shape and v.dtype == new.dtype
        elif new is None:
            ok = v is None or number or (isinstance(v, Tensor) and v.dim() >= 1
                                         and v.shape[0] == n)
        else:
            ok = number
        if not ok:
            got = list(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"strategy_state[{key!r}] is {got}, which the run's strategy "
                             "does not keep there")


def _check_rng(ckpt: dict[str, Any]) -> None:
    rng = ckpt.get("rng")
    size = torch.get_rng_state().shape
    if not isinstance(rng, Tensor) or rng.dtype != torch.uint8 or rng.shape != size:
        got = f"{rng.dtype} {list(rng.shape)}" if isinstance(rng, Tensor) else type(rng).__name__
        raise ValueError(f"rng must be torch's CPU generator state (uint8 {list(size)}), got "
                         f"{got}")
    cuda = ckpt.get("cuda_rng")
    if cuda is not None and (not isinstance(cuda, Tensor) or cuda.dtype != torch.uint8
                             or cuda.dim() != 1):
        raise ValueError("cuda_rng must be a GPU generator's state (uint8, one dimension)")


def check_checkpoint(ckpt: object) -> tuple[TrainConfig, int, int]:
    """Checks every field of a training checkpoint before any is used (a file that loads
    safely may still be some other program's dict): the format, the config (unknown keys
    rejected), the step, scene scale and time, the parameters (names, shapes, finite) and
    the averaged model's, the Adam states, the strategy's state, the RNG state, the training
    log. (A feature's state is checked by the feature, when the config switches it on.)

    Returns:
        (the run's config, the step, the number of Gaussians).

    Raises:
        ValueError: what is missing or malformed, and what came instead.
    """
    if not isinstance(ckpt, dict):
        raise ValueError(f"not a tilesplat training checkpoint: a {type(ckpt).__name__}, not "
                         "a dict")
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        keys = ", ".join(sorted(map(str, ckpt))[:8]) or "none"
        raise ValueError(f"not a tilesplat training checkpoint: format "
                         f"{ckpt.get('format')!r}, expected {CHECKPOINT_FORMAT!r} (its keys: "
                         f"{keys})")
    config = ckpt.get("config")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ValueError("the checkpoint holds no config (a dict of key names and values)")
    cfg = checkpoint_config(ckpt)
    step = ckpt.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    scale = _number(ckpt, "scene_scale", 0.0, low_ok=False)
    _number(ckpt, "elapsed", 0.0, low_ok=True)
    n = check_params(ckpt.get("params"), cfg.sh_degree)
    served = served_params(ckpt)
    if served is not ckpt["params"] and check_params(served, cfg.sh_degree) != n:
        raise ValueError("the averaged model (ema_decay) has another Gaussian count")
    check_optimizer_states(ckpt.get("optimizers"),
                           {k: tuple(ckpt["params"][k].shape) for k in PARAM_NAMES})
    strategy = seams.strategy(cfg, model_kind(cfg).gradient_key)
    _check_strategy_state(ckpt.get("strategy_state"),
                          strategy.initialize_state(scene_scale=scale), n)
    _check_rng(ckpt)
    _check_history(ckpt.get("history"), ckpt.get("window"))
    features = ckpt.get("features", {})
    if not isinstance(features, dict) or not all(isinstance(v, dict) for v in features.values()):
        raise ValueError("features must be a dict of each feature's state")
    return cfg, step, n


def open_checkpoint(target: str | Path) -> RunCheckpoint:
    """A run folder's newest checkpoint, or one checkpoint file, loaded and checked.

    The file is loaded with ``weights_only=True`` (no pickled code runs) and every field
    checked (:func:`check_checkpoint`).

    Raises:
        FileNotFoundError: no such folder or file, or no checkpoint in the folder.
        ValueError: not a tilesplat training checkpoint, or a malformed one (naming the file).
    """
    target = Path(target)
    path = target if target.is_file() else latest_checkpoint(target)
    run_dir = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    ckpt = load_checkpoint(path)
    try:
        cfg, step, n = check_checkpoint(ckpt)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    return RunCheckpoint(run_dir, path, step, cfg, ckpt, n)
