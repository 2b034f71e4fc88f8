"""The training loop (the 3DGS recipe as gsplat's simple trainer runs it) and its run folder.

A run folder holds ``config.toml`` (the full config), ``checkpoints/step_NNNNNNN.pt``,
``history.json`` (loss, PSNR, Gaussian count and time per logged step), and at the end
``metrics.json``, ``renders/test/*.png``, ``curve.png`` and ``point_cloud.ply``.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.dataset import SceneDataset
from ..data.tensors import to_device
from ..strategy import DefaultStrategy, MCMCStrategy, Strategy
from .checkpoint import checkpoint_path, prune_checkpoints, save_checkpoint
from .config import TrainConfig, config_from_dict
from .device import device_frames, training_device
from .init import init_params, random_points, visible_half_width
from .metrics import psnr_of_mse, squared_error
from .model_parallel import ModelParallel, even_counts
from .parallel import DataParallel
from .progress import Progress
from .splats import make_optimizers, make_params
from .step import CameraOrder, make_batch, optimization_step, restore_model
from .twodgs import make_surfels

CHECKPOINT_FORMAT = "tilesplat-train-1"
HISTORY_KEYS = ("step", "time", "loss", "psnr", "gaussians", "test_step", "test_time", "test_psnr")


def make_strategy(cfg: TrainConfig) -> Strategy:
    """The densification strategy the config names, with its thresholds."""
    if cfg.strategy == "mcmc":
        return MCMCStrategy(
            cap_max=cfg.cap_max,
            noise_lr=cfg.noise_lr,
            refine_start_iter=cfg.refine_start,
            refine_stop_iter=cfg.refine_stop,
            refine_every=cfg.refine_every,
            min_opacity=cfg.prune_opacity,
        )
    return DefaultStrategy(
        prune_opa=cfg.prune_opacity,
        grow_grad2d=cfg.grow_grad2d,
        grow_scale3d=cfg.grow_scale3d,
        prune_scale3d=cfg.prune_scale3d,
        refine_start_iter=cfg.refine_start,
        refine_stop_iter=cfg.refine_stop,
        reset_every=cfg.reset_every,
        refine_every=cfg.refine_every,
        pause_refine_after_reset=cfg.pause_refine_after_reset,
        absgrad=cfg.absgrad,
        key_for_gradient="gradient_2dgs" if cfg.model == "2dgs" else "means2d",
    )


def initial_gaussians(cfg: TrainConfig, dataset: SceneDataset) -> dict[str, Tensor]:
    """Initial parameters from the dataset's points, or random in the box the cameras see.

    Draws from the global torch RNG (seeded by the trainer).
    """
    has_points = dataset.points is not None and len(dataset.points) > 0
    if cfg.init == "points" and not has_points:
        raise ValueError("init = 'points' but the dataset has no point cloud; use init = 'random'")
    if cfg.init == "points" or (cfg.init == "auto" and has_points):
        pts = dataset.points.float()
        rgb = dataset.points_rgb if dataset.points_rgb is not None else torch.full_like(pts, 0.5)
    else:
        frames = dataset.train
        half = cfg.init_extent * visible_half_width(
            torch.stack([f.viewmat for f in frames]).float(),
            torch.stack([f.K for f in frames]).float(),
            torch.tensor([f.width for f in frames]),
            dataset.scene_center.float(),
        )
        pts, rgb = random_points(cfg.init_points, dataset.scene_center, half)
    params = init_params(
        pts,
        rgb,
        cfg.sh_degree,
        cfg.init_opacity,
        cfg.init_scale,
        fallback_scale=0.01 * dataset.scene_radius,
    )
    return make_surfels(params) if cfg.model == "2dgs" else params


class _StopRequest:
    """Turns Ctrl-C into a flag the loop checks between steps (so a checkpoint is whole)."""

    def __init__(self) -> None:
        self.requested = False
        self.installed = False
        self.previous: Any = None

    def __enter__(self) -> _StopRequest:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handle)
            self.installed = True
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second Ctrl-C stops at once
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: object) -> None:
        if self.installed:
            # None means a handler not set from Python; the default is the closest.
            previous = self.previous if self.previous is not None else signal.default_int_handler
            signal.signal(signal.SIGINT, previous)


class Trainer:
    """Trains one model on one dataset into one run folder.

    Args:
        cfg: the run's config (validated here).
        dataset: train and test frames.
        run_dir: the run folder (created).
        checkpoint: a checkpoint dict to continue from (``resume``), or None to start.
        log: where one-line messages go.
    """

    def __init__(
        self,
        cfg: TrainConfig,
        dataset: SceneDataset,
        run_dir: str | Path,
        checkpoint: dict[str, Any] | None = None,
        log: Callable[[str], None] = print,
    ) -> None:
        self.config = cfg.validate()  # as given: what checkpoints store
        self.cfg = cfg = cfg.resolved()  # what runs: AUTO fields hold their strategy's values
        self.dataset = dataset
        self.run_dir = Path(run_dir)
        self.log = log
        if not dataset.train:
            raise ValueError("the dataset has no training images")
        sizes = {(f.width, f.height) for f in dataset.train}
        if cfg.batch_size > 1 and len(sizes) > 1:
            raise ValueError(
                f"batch_size > 1 needs training images of one size, got {sorted(sizes)}"
            )
        self.device = training_device(cfg)
        self.background = torch.tensor(dataset.background, dtype=torch.float32).to(self.device)
        self.train_frames = device_frames(dataset.train, self.device)
        self.strategy = make_strategy(cfg)
        self.scene_scale = float(dataset.scene_radius)
        # (loss [], squared error []) of the steps not yet logged, on the device: read back
        # at the log steps, so that a step on the GPU waits for no number
        self._pending: list[tuple[Tensor, Tensor]] = []
        if checkpoint is None:
            torch.manual_seed(cfg.seed)  # on the CPU and every GPU
            # drawn on the CPU, so that every device starts from the same Gaussians
            self.params = make_params(initial_gaussians(cfg, dataset), device=self.device)
            self.optimizers = make_optimizers(self.params, cfg, self.scene_scale)
            self.strategy_state = to_device(
                self.strategy.initialize_state(scene_scale=self.scene_scale), self.device
            )
            self.step = 0
            self.elapsed = 0.0
            self.history: dict[str, list[float]] = {k: [] for k in HISTORY_KEYS}
            self.window = [0.0, 0.0, 0]  # loss sum, PSNR sum, steps since the last log
        else:
            self._load_state(checkpoint)
        self.strategy.check_sanity(self.params, self.optimizers)
        self.order = CameraOrder(len(dataset.train), cfg.batch_size, cfg.seed)
        self.parallel: DataParallel | None = None
        self.sharded: ModelParallel | None = None  # the rank of a model-parallel job
        if cfg.parallel == "data":
            self.parallel = DataParallel.current()
            if self.parallel is not None:
                self.parallel.check_batch(cfg.batch_size)
                if cfg.packed:
                    raise ValueError("parallel = 'data' renders unpacked: set packed = false")
        elif cfg.parallel == "model":
            self.parallel = self.sharded = ModelParallel.current()
        if self.parallel is not None:
            self.parallel.device = self.params["means"].device
        if self.sharded is not None:
            self.sharded.check_config(cfg)
            if isinstance(self.strategy, MCMCStrategy):  # the cap is split between the shards
                self.strategy.cap_max = even_counts(cfg.cap_max, self.sharded.world_size)[
                    self.sharded.rank]
            self.sharded.take_shard(self.params, self.optimizers, self.strategy_state)
        self._counts = self._gaussian_counts()
        self.rebalances: list[tuple[int, list[int], list[int]]] = []  # (step, before, after)

    # --- state ---------------------------------------------------------------------------

    def _counts_now(self, shard: ModelParallel) -> list[int]:
        return shard.counts(len(self.params["means"]))

    def _gaussian_counts(self) -> list[int]:
        n = len(self.params["means"])
        return [n] if self.sharded is None else self.sharded.counts(n)

    @property
    def n_gaussians(self) -> int:
        """The model's Gaussian count (over every shard of a model-parallel job)."""
        return len(self.params["means"]) if self.sharded is None else sum(self._counts)

    def _whole_model(self) -> tuple[dict, dict, dict] | None:
        """(parameters, optimiser state dicts, strategy state) of the whole model: this
        process's own, or gathered on rank 0 of a model-parallel job (None on its other
        ranks; every rank must call it)."""
        if self.sharded is None:
            return (
                {k: p.detach().clone() for k, p in self.params.items()},
                {k: opt.state_dict() for k, opt in self.optimizers.items()},
                dict(self.strategy_state),
            )
        got = self.sharded.gather_model(self.params, self.optimizers, self.strategy_state)
        if got is None:
            return None
        params, moments, stats = got
        optim = {}
        for name, opt in self.optimizers.items():
            sd = opt.state_dict()  # its per-parameter dicts are the live ones: copy them
            sd["state"] = {i: {**st, **{key: moments[f"{name}.{key}"]
                                        for key in ("exp_avg", "exp_avg_sq")}}
                           for i, st in sd["state"].items()}  # one parameter per optimiser
            optim[name] = sd
        state = dict(self.strategy_state)
        state.update(stats)
        return params, optim, state

    def full_params(self) -> dict[str, Tensor] | None:
        """The whole model's parameters (gathered on rank 0 of a model-parallel job, None on
        its other ranks; every rank must call it)."""
        if self.sharded is None:
            return self.params
        got = self._whole_model()
        return None if got is None else got[0]

    def state_dict(self) -> dict[str, Any] | None:
        """Everything the next step depends on, loadable with ``weights_only=True`` (the whole
        model; None on the ranks > 0 of a model-parallel job, which must call it too). Its
        tensors are on the CPU whatever the training device; a run on a GPU adds
        ``cuda_rng``, the state of its GPU's generator."""
        self._flush_pending()
        whole = self._whole_model()
        if whole is None:
            return None
        params, optim, strategy_state = to_device(whole, "cpu")
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "params": params,
            "optimizers": optim,
            "strategy_state": strategy_state,
            "rng": torch.get_rng_state(),
            "config": dataclasses.asdict(self.config),
            "history": self.history,
            "window": list(self.window),
            "elapsed": self.elapsed,
            "scene_scale": self.scene_scale,
        }
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)
        return state

    def _load_state(self, ckpt: dict[str, Any]) -> None:
        if ckpt.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(
                f"checkpoint format {ckpt.get('format')!r} is not {CHECKPOINT_FORMAT!r}"
            )
        self.step = int(ckpt["step"])
        self.scene_scale = float(ckpt["scene_scale"])
        self.params, self.optimizers = restore_model(ckpt, self.cfg, self.device)
        self.strategy_state = to_device(dict(ckpt["strategy_state"]), self.device)
        self.history = {k: list(ckpt["history"].get(k, [])) for k in HISTORY_KEYS}
        self.window = list(ckpt["window"])
        self.elapsed = float(ckpt["elapsed"])
        torch.set_rng_state(ckpt["rng"])
        if self.device.type == "cuda":
            # the GPU's noise (splits, MCMC) continues where it stopped; a checkpoint from the
            # CPU has no such state: the GPU's generator starts from the seed and the step
            rng = ckpt.get("cuda_rng")
            if isinstance(rng, Tensor):
                torch.cuda.set_rng_state(rng, self.device)
            else:
                with torch.cuda.device(self.device):
                    torch.cuda.manual_seed(self.cfg.seed * 1_000_003 + self.step)

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (rank 0 of a data-parallel job)."""
        return self.parallel is None or self.parallel.rank == 0

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step and the history; keep the newest few
        (other ranks of a data-parallel job write nothing: they hold the same state; those of
        a model-parallel job send their shards to rank 0)."""
        state = self.state_dict() if self.writes or self.sharded is not None else None
        if not self.writes:
            return checkpoint_path(self.run_dir, self.step)
        path = save_checkpoint(checkpoint_path(self.run_dir, self.step), state)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        self._write_history()
        return path

    def _write_history(self) -> None:
        from .checkpoint import atomic_write_bytes

        atomic_write_bytes(
            self.run_dir / "history.json", json.dumps(self.history, indent=1).encode("utf-8")
        )

    # --- one step ------------------------------------------------------------------------

    def batch_indices(self, step: int) -> list[int]:
        """Training-frame indices of ``step``: epochs of seeded permutations, no state kept."""
        return self.order.indices(step)

    def train_step(self, step: int) -> tuple[Tensor, Tensor]:
        """One optimisation step (render, loss, backward, Adam, densify).

        Returns:
            (loss [], squared error [] float64: the mean over the batch's pixels of the
            clamped render against the target), on the training device, not read back.
        """
        cfg = self.cfg
        indices = self.batch_indices(step)
        par, shard = self.parallel, self.sharded
        if par is not None:
            indices = par.my_slice(indices)
        frames = [self.train_frames[i] for i in indices]
        batch = make_batch(frames, self.background, cfg.random_background).to(self.device)
        res = optimization_step(
            self.params,
            self.optimizers,
            batch,
            cfg,
            step,
            self.scene_scale,
            absgrad=cfg.absgrad and cfg.strategy == "default",
            before_backward=lambda info: self.strategy.step_pre_backward(
                self.params, self.optimizers, self.strategy_state, step, info
            ),
            after_backward=None if par is None or shard is not None
            else lambda info: par.reduce_gradients(self.params),
            distributed=shard is not None,
            loss_share=None if shard is None else (1.0 / shard.world_size, self.n_gaussians),
        )
        if shard is not None:
            # the pre-exchange means2d [C_all, N_shard, 2] carry 1 / C_all of each camera's
            # loss gradient (the shares add up to the batch's mean): undo over all cameras
            res.info["n_cameras"] = cfg.batch_size
        elif par is not None:  # densify on every rank's cameras, identically on every rank
            res.info = par.gather_info(res.info, getattr(self.strategy, "key_for_gradient",
                                                         "means2d"))
        # the hooks take gsplat's arguments, as its simple_trainer.py passes them
        if isinstance(self.strategy, MCMCStrategy):
            self.strategy.step_post_backward(
                self.params, self.optimizers, self.strategy_state, step, res.info,
                lr=res.means_lr,
            )
        else:
            self.strategy.step_post_backward(
                self.params, self.optimizers, self.strategy_state, step, res.info,
                packed=cfg.packed,
            )
        if shard is not None:
            before = self._counts_now(shard)
            self._counts, moved = shard.rebalance(self.params, self.optimizers,
                                                  self.strategy_state, counts=before)
            if moved:
                self.rebalances.append((step, before, list(self._counts)))
        elif par is not None:
            par.check_in_sync(self.params, step)
        return res.loss, squared_error(res.colors.clamp(0.0, 1.0), batch.target)

    # --- the loop ------------------------------------------------------------------------

    def _flush_pending(self) -> None:
        """Add the pending steps' loss and PSNR to the log window (one read-back)."""
        if not self._pending:
            return
        numbers = torch.stack([torch.stack([loss.double(), mse]) for loss, mse in self._pending])
        self._pending = []
        for loss, mse in numbers.tolist():
            self.window[0] += loss
            self.window[1] += psnr_of_mse(mse)
            self.window[2] += 1

    def _record(self, loss: Tensor, mse: Tensor) -> None:
        self._pending.append((loss, mse))
        if self.step % self.cfg.log_every == 0 or self.step == self.cfg.steps:
            self._flush_pending()
            n = self.window[2]
            self.history["step"].append(self.step)
            self.history["time"].append(round(self.elapsed, 3))
            self.history["loss"].append(self.window[0] / n)
            self.history["psnr"].append(self.window[1] / n)
            self.history["gaussians"].append(self.n_gaussians)
            self.window = [0.0, 0.0, 0]

    def test_psnr(self) -> float:
        """Mean PSNR over the test views (train views when there are none); NaN on the ranks
        > 0 of a model-parallel job (rank 0 evaluates the gathered model)."""
        from .evaluate import evaluate

        params = self.full_params()
        if params is None:
            return float("nan")
        frames = self.dataset.test or self.dataset.train
        return evaluate(params, frames, self.cfg, self.dataset.background)["psnr"]

    def _stop_agreed(self, requested: bool) -> bool:
        """Whether any rank was asked to stop (every rank of a job stops at the same step, so
        that a model-parallel checkpoint gathers every shard)."""
        if self.parallel is None:
            return requested
        return self.parallel.any_rank(requested)

    def _open_viewer(self) -> Any:
        """The live view of ``viewer_port`` (docs/viewer.md), or None when it is 0."""
        if not self.cfg.viewer_port or not self.writes:  # rank 0 alone serves it
            return None
        from ..viewer.live import LiveViewer

        return LiveViewer(self.cfg.viewer_port, log=self.log)

    def train(self) -> None:
        """Run the remaining steps; on Ctrl-C finish the step, checkpoint, re-raise."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        progress = Progress(cfg.steps, self.step, enabled=cfg.progress)
        viewer = self._open_viewer()
        with _StopRequest() as stop:
            try:
                while self.step < cfg.steps:
                    t0 = time.perf_counter()
                    loss, mse = self.train_step(self.step)
                    self.step += 1
                    self.elapsed += time.perf_counter() - t0
                    self._record(loss, mse)
                    if cfg.eval_every and self.step % cfg.eval_every == 0:
                        self.history["test_step"].append(self.step)
                        self.history["test_time"].append(round(self.elapsed, 3))
                        self.history["test_psnr"].append(self.test_psnr())
                    if self._stop_agreed(stop.requested):
                        progress.close()
                        path = self.save_checkpoint()
                        self.log(f"interrupted at step {self.step}; saved {path}")
                        raise KeyboardInterrupt
                    if (
                        cfg.checkpoint_every
                        and self.step % cfg.checkpoint_every == 0
                        and self.step < cfg.steps
                    ):
                        self.save_checkpoint()
                    # read back only when the line is drawn (at most 5 times a second)
                    progress.update(self.step, loss=loss,
                                    psnr=lambda m=mse: psnr_of_mse(float(m)),
                                    gaussians=self.n_gaussians)
                    if viewer is not None:
                        viewer.after_step(self.step, float(loss), psnr_of_mse(float(mse)),
                                          self.params, lambda: stop.requested)
            finally:
                progress.close()
                if viewer is not None:
                    viewer.close()
        self.save_checkpoint()


def checkpoint_config(ckpt: dict[str, Any]) -> TrainConfig:
    """The config stored in a checkpoint."""
    return config_from_dict(ckpt["config"], where="checkpoint config")
