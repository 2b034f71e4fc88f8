"""Run folders: start, resume, evaluate, render and export a training run (what the CLI calls).

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
    tensorboard/          TensorBoard's events, with tensorboard = true (train/tensorboard.py)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.dataset import SceneDataset, load_dataset
from .checkpoint import (
    atomic_write_bytes,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    served_params,
)
from .config import TrainConfig, apply_overrides, load_config, save_config
from .evaluate import METRICS, evaluate
from .features import checkpoint_features, trained_dataset
from .metrics import make_lpips
from .models import model_kind
from .parallel import parallel_mode
from .plots import save_curve
from .trainer import Trainer, checkpoint_config

Log = Callable[[str], None]


def summary(run_dir: object, metrics: dict) -> str:
    """The closing line of a run: test PSNR first, since it is what the README promises."""
    parts = [f"{metrics['split']} PSNR {metrics['psnr']:.2f} dB", f"SSIM {metrics['ssim']:.4f}"]
    if "cc_psnr" in metrics:  # after a colour fit of each render to its image (evaluate.py)
        parts.append(f"cc_psnr {metrics['cc_psnr']:.2f} dB  cc_ssim {metrics['cc_ssim']:.4f}")
    if "lpips" in metrics:
        parts.append(f"LPIPS {metrics['lpips']:.4f}")
    if "masked_psnr" in metrics:
        parts.append(f"masked PSNR {metrics['masked_psnr']:.2f} dB")
    secs = metrics.get("train_seconds") or 0.0
    parts.append(
        f"{metrics['n_views']} views, {metrics['n_gaussians']} Gaussians, "
        f"{metrics['step']} steps in {secs:.0f} s"
    )
    return "  ".join(parts) + f"\nrun folder: {run_dir}"


def cache_root(cfg: TrainConfig) -> Path:
    """Where generated data goes: ``cache_dir``, else $XDG_CACHE_HOME/tilesplat or ~/.cache."""
    if cfg.cache_dir:
        return Path(cfg.cache_dir)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tilesplat"


def resolve_data(cfg: TrainConfig, log: Log = print) -> Path:
    """The dataset folder: ``data``, or the built-in scene written once into the cache."""
    if cfg.data:
        return Path(cfg.data).expanduser()
    views = cfg.synthetic_train + cfg.synthetic_test
    if cfg.synthetic_scene == "garden":
        from ..data.garden_views import MARKER, write_garden_views_dataset

        folder = cache_root(cfg) / f"garden-views-{views}"
        if not (folder / MARKER).is_file():
            log(f"writing the built-in garden scene to {folder} (once)")
        return write_garden_views_dataset(folder, n_views=views)
    from ..data import exposure, synthetic

    # the exposure scene: the ray-cast views with a gain and offset on each training photo
    module = exposure if cfg.synthetic_scene == "exposure" else synthetic
    folder = cache_root(cfg) / (
        f"{scene_name(cfg)}-{cfg.synthetic_size}px-{cfg.synthetic_train}-{cfg.synthetic_test}"
    )
    if not (folder / module.MARKER).is_file():
        log(f"writing the built-in {cfg.synthetic_scene} scene to {folder} (once)")
    write = exposure.write_exposure_dataset if module is exposure else (
        synthetic.write_synthetic_dataset)
    return write(
        folder,
        n_train=cfg.synthetic_train,
        n_test=cfg.synthetic_test,
        size=cfg.synthetic_size,
        seed=0,
    )


def load_scene(cfg: TrainConfig, log: Log = print) -> SceneDataset:
    """The dataset the config names, loaded."""
    return load_dataset(
        resolve_data(cfg, log),
        downscale=cfg.downscale,
        white_background=cfg.white_background,
        test_every=cfg.test_every,
        masks_dir=cfg.masks_dir,
        log=log,
    )


def scene_name(cfg: TrainConfig) -> str:
    """``synthetic`` (``garden-views``, ``synthetic-exposure``) for the built-in scenes, else
    the dataset folder's name."""
    if cfg.data:
        return Path(cfg.data).expanduser().resolve().name
    return {"garden": "garden-views", "exposure": "synthetic-exposure"}.get(
        cfg.synthetic_scene, "synthetic")


def checked_config(path: str | Path, overrides: list[str] | None = None) -> tuple[TrainConfig, str]:
    """The config of a TOML file with ``--set`` overrides, validated as ``tilesplat check``
    does (keys, types, ranges, and the dataset folder's layout); (config, layout).

    Raises:
        FileNotFoundError: no such config file or dataset folder.
        ValueError: an invalid key or value (the message names the file).
    """
    from ..data.dataset import detect_layout

    cfg = apply_overrides(load_config(path), list(overrides or []))
    layout = detect_layout(cfg.data) if cfg.data else "built-in synthetic scene"
    return cfg, layout


def new_run_dir(cfg: TrainConfig) -> Path:
    """``run_dir`` if given (refused when it holds a run), else a fresh ``runs/<scene>[-k]``."""
    if cfg.run_dir:
        path = Path(cfg.run_dir)
        if list_checkpoints(path):
            raise ValueError(
                f"{path} already holds a run: continue it with --resume {path} "
                "or choose another run_dir"
            )
        return path
    base = Path("runs") / scene_name(cfg)
    path, k = base, 1
    while path.exists():
        k += 1
        path = base.with_name(f"{base.name}-{k}")
    return path


def write_outputs(
    run_dir: Path,
    cfg: TrainConfig,
    dataset: SceneDataset,
    params: dict[str, Tensor],
    history: dict[str, list[float]] | None,
    step: int,
    train_seconds: float | None,
) -> dict[str, Any]:
    """Evaluate on the test views and write metrics.json, renders, curve.png, the PLY."""
    split = "test" if dataset.test else "train"
    frames = dataset.test or dataset.train
    lpips_fn = make_lpips() if cfg.lpips else None
    out_dir = run_dir / "renders" / split if cfg.save_renders else None
    result = evaluate(params, frames, cfg, dataset.background, out_dir=out_dir, lpips_fn=lpips_fn)
    metrics = {
        "step": step,
        "split": split,
        **{k: result[k] for k in METRICS if k in result},
        "n_views": result["n_views"],
        "n_gaussians": len(params["means"]),
        "train_seconds": train_seconds,
        "render_seconds_per_view": result["seconds_per_view"],
        "peak_rss_mib": peak_rss_mib(),
        "views": result["views"],
    }
    atomic_write_bytes(run_dir / "metrics.json", json.dumps(metrics, indent=1).encode("utf-8"))
    if history is not None:
        save_curve(history, run_dir / "curve.png")
    if cfg.save_ply:
        export_ply(model_kind(cfg).export(params), run_dir / "point_cloud.ply", cfg.antialiased)
    return metrics


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far in MiB (the kernel's high-water mark), or
    None where the platform does not report it."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes there, KiB here


def export_ply(params: dict[str, Tensor], path: str | Path, antialiased: bool = False) -> Path:
    """Write the parameters as a 3DGS PLY file (a model kind's ``export`` gives them as the
    file holds them); an antialiased model gets the ``SplatRenderMode: mip`` comment."""
    from ..io.ply import save_ply

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        cpu = {k: v.detach().cpu() for k, v in params.items()}  # the file is written from there
        save_ply(path, cpu, antialiased=antialiased)
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
    if par.writes:
        run_dir.mkdir(parents=True, exist_ok=True)
        save_config(cfg, run_dir / "config.toml")
    log(f"run folder {run_dir}: {len(dataset.train)} train / {len(dataset.test)} test views")
    trainer = Trainer(cfg, dataset, run_dir, log=log)
    log(f"{trainer.n_gaussians} initial Gaussians, {cfg.steps} steps")
    trainer.train()
    return run_dir, _finish(trainer, run_dir, cfg, dataset)


def _finish(trainer: Trainer, run_dir: Path, cfg: TrainConfig, dataset: SceneDataset
            ) -> dict[str, Any]:
    """The run's outputs, written by the process that holds the whole model (rank 0 of a
    job, after gathering a model-parallel job's shards); {} on the other ranks."""
    params = trainer.served_params()
    if not trainer.writes or params is None:
        return {}
    dataset = trained_dataset(trainer.features, dataset)  # e.g. the refined training poses
    return write_outputs(
        run_dir, cfg, dataset, params, trainer.history, trainer.step, trainer.elapsed
    )


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
    path = latest_checkpoint(run_dir)
    ckpt = load_checkpoint(path)
    cfg = checkpoint_config(ckpt)
    overrides = list(overrides or [])
    if several_ranks and apply_overrides(cfg, overrides).parallel == "none":
        overrides.append("parallel=data")
    if overrides:
        cfg = apply_overrides(cfg, overrides)
        if parallel_mode(cfg).writes:
            save_config(cfg, run_dir / "config.toml")
    dataset = load_scene(cfg, log)
    trainer = Trainer(cfg, dataset, run_dir, checkpoint=ckpt, log=log)
    log(f"resuming {run_dir} from step {trainer.step} ({path.name})")
    trainer.train()
    return run_dir, _finish(trainer, run_dir, cfg, dataset)


def load_run(run_dir: str | Path) -> tuple[TrainConfig, dict[str, Tensor], dict[str, Any]]:
    """(config, parameters, checkpoint) of a run's newest checkpoint."""
    ckpt = load_checkpoint(latest_checkpoint(run_dir))
    params = {k: v.float() for k, v in served_params(ckpt).items()}
    return checkpoint_config(ckpt), params, ckpt


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
    from .splats import check_params
    from .trainer import CHECKPOINT_FORMAT

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


def evaluate_run(run_dir: str | Path, log: Log = print) -> dict[str, Any]:
    """Re-evaluate a run's newest checkpoint: metrics.json and the test renders."""
    run_dir = Path(run_dir)
    cfg, params, ckpt = load_run(run_dir)
    dataset = load_scene(cfg, log)
    dataset = trained_dataset(checkpoint_features(cfg, dataset, ckpt), dataset)
    return write_outputs(
        run_dir, cfg, dataset, params, ckpt.get("history"), int(ckpt["step"]), ckpt.get("elapsed")
    )


def render_run(
    run_dir: str | Path, split: str = "test", out_dir: str | Path | None = None, log: Log = print
) -> Path:
    """Render a split (``test``, ``train`` or ``all``) of a run's dataset to PNGs."""
    if split not in ("test", "train", "all"):
        raise ValueError(f"split must be test, train or all, got {split!r}")
    run_dir = Path(run_dir)
    cfg, params, ckpt = load_run(run_dir)
    dataset = load_scene(cfg, log)
    # the training views as the run learned them (pose_opt: at their refined poses)
    dataset = trained_dataset(checkpoint_features(cfg, dataset, ckpt), dataset)
    frames = {"test": dataset.test, "train": dataset.train, "all": dataset.train + dataset.test}[
        split
    ]
    if not frames:
        raise ValueError(f"the dataset has no {split} views")
    folder = Path(out_dir) if out_dir is not None else run_dir / "renders" / split
    evaluate(params, frames, cfg, dataset.background, out_dir=folder)
    return folder
