"""The training loop (the 3DGS recipe as gsplat's simple trainer runs it) and its run folder.

A run folder holds ``config.toml`` (the full config), ``checkpoints/step_NNNNNNN.pt``,
``history.json`` (loss, PSNR, Gaussian count and time per logged step), and at the end
``metrics.json``, ``renders/test/*.png``, ``curve.png`` and ``point_cloud.ply``.

The trainer holds three variants chosen by the config (``seams.py``): the model kind
(``models/``), the densification strategy (``tilesplat.strategy``) and this process's part in
a parallel job (``parallel/``, a single process being the null object). It calls each through
its interface and never asks which one it holds. Its step (queued without waiting, checked
one step late, redone after an intersection-capacity overflow, replayed as a CUDA graph on a
GPU) is :class:`.stepping.StepRunner`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.dataset import SceneDataset
from ..devices import to_device
from . import seams
from .averaging import param_average
from .capacity import StepCapacity, capacity_applies
from .checkpoint import checkpoint_path, prune_checkpoints, save_checkpoint
from .config import TrainConfig, config_from_dict
from .cuda_graph import (
    CudaGraphMaker,
    StepGraph,
    graph_unavailable,
    plain_rates,
)
from .determinism import apply_determinism
from .device import device_frames, training_device
from .early_stop import should_stop
from .features import build_features, features_state, load_features_state, trained_dataset
from .history import TrainingLog
from .init import initial_gaussians
from .metrics import psnr_of_mse
from .models import model_kind
from .parallel import parallel_mode
from .progress import Progress
from .resolution import CoarseFrames
from .splats import make_optimizers, make_params
from .step import CameraOrder, restore_model
from .stepping import Attempt, StepRunner
from .stop import StopRequest
from .tensorboard import NO_BOARD, open_board

CHECKPOINT_FORMAT = "tilesplat-train-1"


class Trainer(StepRunner):
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
        apply_determinism(cfg, self.device)  # the cuda backend's option for the key
        self.background = torch.tensor(dataset.background, dtype=torch.float32).to(self.device)
        self.train_frames = device_frames(dataset.train, self.device)
        self.coarse = CoarseFrames(self.train_frames)  # the images at the schedule's sizes
        self.model = model_kind(cfg)
        self.strategy = seams.strategy(cfg, self.model.gradient_key)
        self.scene_scale = float(dataset.scene_radius)
        # the features the config switches on (train/features.py), before a checkpoint's
        # state is loaded into them
        self.features = build_features(cfg, dataset, self.device)
        self.average = param_average(cfg)  # the averaged model (ema_decay), or None
        if checkpoint is None:
            torch.manual_seed(cfg.seed)  # on the CPU and every GPU
            # drawn on the CPU, so that every device starts from the same Gaussians
            start = self.model.init(initial_gaussians(cfg, dataset))
            self.params = make_params(start, device=self.device)
            self.optimizers = make_optimizers(self.params, cfg, self.scene_scale)
            self.strategy_state = to_device(
                self.strategy.initialize_state(scene_scale=self.scene_scale), self.device
            )
            self.step = 0
            self.elapsed = 0.0
            self.training_log = TrainingLog()
        else:
            self._load_state(checkpoint)
        self.strategy.check_sanity(self.params, self.optimizers)
        self.order = CameraOrder(len(dataset.train), cfg.batch_size, cfg.seed)
        # the last step whose NaN/Inf flag is not read yet (train_step reads it a step late)
        self._unchecked: Attempt | None = None
        self.parallel = parallel_mode(cfg)
        self.capacity: StepCapacity | None = None  # the intersection lists' (capacity.py)
        if capacity_applies(cfg, self.device, len(self.features)):
            self.capacity = StepCapacity(self._count_views, cfg.batch_size, self.device)
        self.graph: StepGraph | None = None  # the step as one CUDA graph (cuda_graph.py)
        on_cuda = cfg.backend == "cuda" or (cfg.backend == "auto" and self.device.type == "cuda")
        if cfg.cuda_graph and on_cuda:
            why_not = graph_unavailable(self.device, self.capacity is not None)
            if why_not is not None:
                log(f"cuda_graph: the step runs eagerly ({why_not})")
            else:
                self.graph = self._step_graph(CudaGraphMaker())
        self.strategy = self.parallel.attach(cfg, self.params, self.optimizers,
                                             self.strategy_state, self.strategy)
        self.board = NO_BOARD  # TensorBoard's events while train() runs (tensorboard.py)

    # --- state ---------------------------------------------------------------------------

    @property
    def n_gaussians(self) -> int:
        """The model's Gaussian count (over every shard of a model-parallel job)."""
        return self.parallel.n_gaussians(len(self.params["means"]))

    @property
    def history(self) -> dict[str, list[float]]:
        """The training log's lists (:data:`.history.HISTORY_KEYS`)."""
        return self.training_log.history

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (rank 0 of a job)."""
        return self.parallel.writes

    def full_params(self) -> dict[str, Tensor] | None:
        """The whole model's parameters (gathered on rank 0 of a model-parallel job, None on
        its other ranks; every rank must call it)."""
        return self.parallel.full_params(self.params, self.optimizers, self.strategy_state)

    def served_params(self) -> dict[str, Tensor] | None:
        """The parameters the run evaluates, renders and exports: the averaged model
        (``ema_decay``, ``averaging.py``) when there is one, else :meth:`full_params`."""
        if self.average is not None:  # not model-parallel: this rank holds every Gaussian
            return self.average.served(self.params)
        return self.full_params()

    def state_dict(self) -> dict[str, Any] | None:
        """Everything the next step depends on, loadable with ``weights_only=True`` (the whole
        model; None on the ranks > 0 of a model-parallel job, which must call it too). Its
        tensors are on the CPU whatever the training device; a run on a GPU adds
        ``cuda_rng``, the state of its GPU's generator."""
        self.training_log.flush()
        whole = self.parallel.whole_model(self.params, self.optimizers, self.strategy_state)
        if whole is None:
            return None
        params, optim, strategy_state = to_device(whole, "cpu")
        optim = {k: plain_rates(v) for k, v in optim.items()}  # a graph's rate tensors
        state = {
            "format": CHECKPOINT_FORMAT,
            "step": self.step,
            "params": params,
            "optimizers": optim,
            "strategy_state": strategy_state,
            "rng": torch.get_rng_state(),
            "config": dataclasses.asdict(self.config),
            "history": self.history,
            "window": list(self.training_log.window),
            "elapsed": self.elapsed,
            "scene_scale": self.scene_scale,
            "features": features_state(self.features),
        }
        if self.average is not None:
            state["averaged"] = self.average.state_dict()
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
        self.training_log = TrainingLog(ckpt["history"], ckpt["window"])
        self.elapsed = float(ckpt["elapsed"])
        load_features_state(self.features, ckpt.get("features"))
        if self.average is not None:
            self.average.load_state_dict(ckpt.get("averaged"), self.params)
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

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step and the history; keep the newest few
        (the other ranks of a job write nothing; those of a model-parallel job send their
        shards to rank 0)."""
        self._check_finite_step()  # a checkpoint holds no step past a bad one
        needed = self.writes or self.parallel.collective_checkpoint
        state = self.state_dict() if needed else None
        if not self.writes:
            return checkpoint_path(self.run_dir, self.step)
        path = save_checkpoint(checkpoint_path(self.run_dir, self.step), state)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        for feature in self.features:
            feature.write(self.run_dir)
        self.training_log.write(self.run_dir / "history.json")
        return path

    # --- one step ------------------------------------------------------------------------

    def batch_indices(self, step: int) -> list[int]:
        """Training-frame indices of ``step``: epochs of seeded permutations, no state kept."""
        return self.order.indices(step)

    # --- the loop ------------------------------------------------------------------------

    def test_psnr(self) -> float:
        """Mean PSNR over the test views (train views when there are none); NaN on the ranks
        > 0 of a model-parallel job (rank 0 evaluates the gathered model)."""
        from .evaluate import evaluate

        params = self.served_params()
        if params is None:
            return float("nan")
        frames = self.dataset.test or trained_dataset(self.features, self.dataset).train
        self.board.add_renders(self.step, params, frames, self.cfg, self.dataset.background)
        return evaluate(params, frames, self.cfg, self.dataset.background)["psnr"]

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
        # a run that stopped early (its history says so) and is resumed stops again at once
        done = self.step >= cfg.steps or should_stop(cfg, self.history["test_psnr"])
        with StopRequest() as stop:
            try:
                self.board = open_board(cfg, self.run_dir, self.step, self.history, self.writes)
                while not done:
                    t0 = time.perf_counter()
                    loss, mse = self.train_step(self.step)
                    self.step += 1
                    self.elapsed += time.perf_counter() - t0
                    logged = self.step % cfg.log_every == 0 or self.step == cfg.steps
                    self.training_log.record(self.step, loss, mse, logged, self.elapsed,
                                             self.n_gaussians)
                    done = self.step >= cfg.steps
                    if cfg.eval_every and self.step % cfg.eval_every == 0:
                        self.training_log.record_test(self.step, self.elapsed, self.test_psnr())
                        # every rank stops at the same step (ranks > 0 of a model-parallel
                        # job measure nothing and follow rank 0)
                        if self.parallel.any_rank(should_stop(cfg, self.history["test_psnr"])):
                            progress.close()
                            self.log(
                                f"early stop at step {self.step}: the test PSNR rose less than "
                                f"{cfg.early_stop_min_db} dB in the last "
                                f"{cfg.early_stop_patience} evaluations"
                            )
                            break  # the checkpoint below the loop holds this step
                    self.board.record(self.history, self.optimizers)
                    # every rank stops at the same step, so that a checkpoint is whole
                    if self.parallel.any_rank(stop.requested):
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
                self.board.record(self.history, self.optimizers)  # an early stop's last test
                self.board.close()
                self.board = NO_BOARD
        self.save_checkpoint()


def checkpoint_config(ckpt: dict[str, Any]) -> TrainConfig:
    """The config stored in a checkpoint."""
    return config_from_dict(ckpt["config"], where="checkpoint config")
