"""A training run from start to end, as the CLI calls it: start, resume, evaluate, render.

Layout of ``runs/<name>/``::

    config.toml           the full config (tilesplat train --config accepts it)
    checkpoints/          step_NNNNNNN.pt, the newest ``keep_checkpoints``
    history.json          loss, PSNR, Gaussian count and seconds per logged step
    metrics.json          test PSNR / SSIM (/ LPIPS), colour-corrected PSNR / SSIM, per view,
                          Gaussian count, train time
    renders/test/*.png    the test views rendered by the model (model = "2dgs": also
                          normal/, normal_from_depth/ and depth/ PNGs of the same views)
    curve.png             loss, PSNR and Gaussian count against the step
    point_cloud.ply       the model in the original 3DGS PLY layout
    appearance.json       post_processing on: each training image's learned colour transform
    poses.json            pose_opt on: the refined training poses
    tensorboard/          TensorBoard's events, with tensorboard = true
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from ...backends.cpu import buffer_pool
from ...backends.cpu.heap import return_freed_heap
from ...data.dataset import SceneDataset
from ...keys import Key
from .. import seams
from ..config import TrainConfig, apply_overrides, load_config, save_config
from ..features.averaging import served_params
from ..features.base import checkpoint_features, trained_dataset
from ..features.camera_mode import pinhole_mode
from ..parallel import for_ranks, parallel_mode
from ..rundir.checkpoint import latest_checkpoint, list_checkpoints, open_checkpoint
from ..rundir.evaluate import evaluate
from ..rundir.outputs import write_outputs
from ..rundir.scene import load_scene, scene_name
from .trainer import Trainer

Log = Callable[[str], None]


def checked_config(path: str | Path, overrides: list[str] | None = None) -> tuple[TrainConfig, str]:
    """The config of a TOML file with ``--set`` overrides, validated as ``tilesplat check``
    does (keys, types, ranges, the dataset folder's layout, and a ``run_dir`` that can be a
    folder); (config, layout).

    Raises:
        FileNotFoundError: no such config file or dataset folder.
        ValueError: an invalid key or value (the message names the file), or a ``run_dir``
            where a file is.
    """
    from ...data.dataset import detect_layout

    cfg = apply_overrides(load_config(path), list(overrides or []))
    layout = detect_layout(cfg.data) if cfg.data else "built-in synthetic scene"
    problem = run_dir_problem(Path(cfg.run_dir)) if cfg.run_dir else None
    if problem:
        raise ValueError(f"{path}: {problem}")
    return cfg, layout


KEYS = (Key("run_dir", "", "output folder of the run; empty: runs/<scene name> (numbered when "
            "it exists)"),)
seams.register_keys("the run folder (train/loop/run.py)", KEYS)


def run_dir_problem(path: Path) -> str | None:
    """Why ``path`` cannot become a run folder, or None: something other than a folder is
    there or where one of its parents would be made, or the folder it would be made in is
    not writable."""
    if path.is_symlink() or path.exists():
        return None if path.is_dir() else f"run_dir {path}: expected a folder, found a file"
    above = path.parent
    while not (above.is_symlink() or above.exists()):  # ends at "/" or "."
        above = above.parent
    if not above.is_dir():
        return f"run_dir {path}: expected a folder, but {above} is a file"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"run_dir {path}: the folder {above} it would be made in is not writable"
    return None


def new_run_dir(cfg: TrainConfig) -> Path:
    """``run_dir`` if given (refused when it holds a run, or cannot be a folder: a file is
    there), else a fresh ``runs/<scene>[-k]``; nothing is made yet."""
    if cfg.run_dir:
        path = Path(cfg.run_dir)
        problem = run_dir_problem(path)
        if problem:
            raise ValueError(problem)
        if list_checkpoints(path):
            raise ValueError(
                f"{path} already holds a run: continue it with --resume {path} "
                "or choose another run_dir"
            )
        return path
    base = Path("runs") / scene_name(cfg)
    path, k = base, 1
    while path.is_symlink() or path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    problem = run_dir_problem(path)  # runs/ itself may be a file, or not writable
    if problem:
        raise ValueError(problem)
    return path


def train_run(cfg: TrainConfig, log: Log = print) -> tuple[Path, dict[str, Any]]:
    """Train a new run from ``cfg``; returns (run folder, metrics)."""
    cfg.validate()
    par = parallel_mode(cfg)
    # rank 0 names the folder and writes the built-in scene's cache first
    run_dir = Path(par.from_rank0(str(new_run_dir(cfg)) if par.rank == 0 else None))
    if par.rank == 0:
        dataset = load_scene(cfg, log)
    par.barrier()
    if par.rank != 0:
        dataset = load_scene(cfg, log)
    log(f"run folder {run_dir}: {len(dataset.train)} train / {len(dataset.test)} test views")
    trainer = Trainer(cfg, dataset, run_dir, log=log)
    if par.writes:  # after the trainer's own checks: a refused run leaves no folder
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.toml")
    log(f"{trainer.n_gaussians} initial Gaussians, {cfg.steps} steps")
    trainer.train()
    trained = _trained(trainer, dataset)
    del trainer  # what only another step would read goes before the evaluation
    return run_dir, _finish(trained, run_dir, cfg, log)


@dataclass
class _Trained:
    """What the run's outputs are made of, once the training has ended: the served
    parameters (detached), the dataset as trained (e.g. the refined training poses), the
    history, the last step and the training's seconds."""

    params: dict[str, Tensor]
    dataset: SceneDataset
    history: dict[str, list[float]]
    step: int
    elapsed: float


def _trained(trainer: Trainer, dataset: SceneDataset) -> _Trained | None:
    """The trained model of the process that holds the whole model (rank 0 of a job, after
    gathering a model-parallel job's shards); None on the other ranks."""
    params = trainer.served_params()
    if not trainer.writes or params is None:
        return None
    return _Trained({k: v.detach() for k, v in params.items()},
                    trained_dataset(trainer.features, dataset), trainer.history, trainer.step,
                    trainer.elapsed)


def _finish(trained: _Trained | None, run_dir: Path, cfg: TrainConfig, log: Log
            ) -> dict[str, Any]:
    """The run's outputs, written once the trainer is gone; {} on the ranks that write none.

    The trainer's references are dropped by the caller and its cycles collected here, so the
    gradients, Adam's moments, the strategy's state, the step's buffers and, with an averaged
    model (``ema_decay``), the trained parameters are freed before the evaluation and the
    export: at 1 M Gaussians ~0.7 GB of the three per-parameter tensors beside the model.
    The cpu backend's pooled buffers are let go, and the freed heap is returned to the
    system (:func:`.heap.return_freed_heap`)."""
    gc.collect()
    buffer_pool.clear()
    return_freed_heap()
    if trained is None:
        return {}
    return write_outputs(run_dir, cfg, trained.dataset, trained.params, trained.history,
                         trained.step, trained.elapsed, log=log)


def resume_run(
    run_dir: str | Path,
    overrides: list[str] | None = None,
    log: Log = print,
    several_ranks: bool = False,
) -> tuple[Path, dict[str, Any]]:
    """Continue a run from its newest checkpoint; returns (run folder, metrics).

    ``overrides`` (``key=value`` strings, e.g. a larger ``steps``) change the config stored in
    the checkpoint; the run then differs from an uninterrupted one with the new config.
    ``several_ranks``: this process is one rank of a job, which continues a run of one
    process (``parallel = "none"``) in data mode; a data or model run keeps its mode. A
    checkpoint holds the whole model, so the number of ranks may differ from the run's.
    """
    run_dir = Path(run_dir)
    run = open_checkpoint(latest_checkpoint(run_dir))  # every field checked before any work
    cfg, ckpt, path = run.cfg, run.ckpt, run.path
    given = apply_overrides(cfg, list(overrides or []))
    given = for_ranks(given) if several_ranks else given
    changed, cfg = given != cfg, given
    dataset = load_scene(cfg, log)
    trainer = Trainer(cfg, dataset, run_dir, checkpoint=ckpt, log=log)
    if changed and parallel_mode(cfg).writes:  # once the data and the checkpoint are taken
        save_config(cfg, run_dir / "config.toml")
    log(f"resuming {run_dir} from step {trainer.step} ({path.name})")
    trainer.train()
    trained = _trained(trainer, dataset)
    del trainer, run, ckpt  # the checkpoint's tensors became the trainer's
    return run_dir, _finish(trained, run_dir, cfg, log)


def load_run(run_dir: str | Path) -> tuple[TrainConfig, dict[str, Tensor], dict[str, Any]]:
    """(config, parameters, checkpoint) of a run's newest checkpoint, every field checked.

    Raises:
        FileNotFoundError: no such folder, or no checkpoint in it.
        ValueError: ``run_dir`` is a file, or the checkpoint is malformed (naming it).
    """
    run = open_checkpoint(latest_checkpoint(run_dir))
    params = {k: v.float() for k, v in served_params(run.ckpt).items()}
    return run.cfg, params, run.ckpt


def evaluate_run(run_dir: str | Path, log: Log = print) -> dict[str, Any]:
    """Re-evaluate a run's newest checkpoint: metrics.json and the test renders."""
    run_dir = Path(run_dir)
    cfg, params, ckpt = load_run(run_dir)
    dataset = load_scene(cfg, log)
    dataset = trained_dataset(checkpoint_features(cfg, dataset, ckpt), dataset)
    return write_outputs(
        run_dir, cfg, dataset, params, ckpt.get("history"), int(ckpt["step"]), ckpt.get("elapsed"),
        log=log,
    )


def render_run(
    run_dir: str | Path, split: str = "test", out_dir: str | Path | None = None, log: Log = print,
    pinhole: bool = False,
) -> Path:
    """Render a split (``test``, ``train`` or ``all``) of a run's dataset to PNGs, through
    the capture's lens as trained, or with ``pinhole`` through the undistorted cameras
    (:func:`.features.camera_mode.pinhole_mode`; default folder ``renders/SPLIT_pinhole``)."""
    if split not in ("test", "train", "all"):
        raise ValueError(f"split must be test, train or all, got {split!r}")
    run_dir = Path(run_dir)
    cfg, params, ckpt = load_run(run_dir)
    dataset = load_scene(cfg, log, pinhole_mode(cfg) if pinhole else None)
    # the training views as the run learned them (pose_opt: at their refined poses)
    dataset = trained_dataset(checkpoint_features(cfg, dataset, ckpt), dataset)
    frames = {"test": dataset.test, "train": dataset.train, "all": dataset.train + dataset.test}[
        split
    ]
    if not frames:
        raise ValueError(f"the dataset has no {split} views")
    folder = Path(out_dir) if out_dir is not None else (
        run_dir / "renders" / (f"{split}_pinhole" if pinhole else split))
    evaluate(params, frames, cfg, dataset.background, out_dir=folder)
    return folder
