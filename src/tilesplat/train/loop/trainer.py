"""The training loop (the 3DGS recipe as gsplat's simple trainer runs it) and its run folder.

A run folder holds ``config.toml`` (the full config), ``checkpoints/step_NNNNNNN.pt``,
``history.json`` (loss, PSNR, Gaussian count and time per logged step), and at the end
``metrics.json``, ``renders/test/*.png``, ``curve.png`` and ``point_cloud.ply``.

The trainer holds three variants chosen by the config (``seams.py``): the model kind
(``models/``), the densification strategy (``tilesplat.strategy``) and this process's part in
a parallel job (``parallel/``, a single process being the null object). It calls each through
its interface and never asks which one it holds. It makes the step's plan once
(:class:`..step.optimization.StepPlan`) and hands its steps to a
:class:`..step.runner.StepRunner` (queued without waiting, checked one step late, redone after
an intersection-capacity overflow, replayed as a CUDA graph on a GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...backends.cpu.heap import keep_freed_heap
from ...data.dataset import SceneDataset
from ...devices import to_device
from ...keys import Key
from .. import seams
from ..config import TrainConfig
from ..features.averaging import param_average
from ..features.base import build_features, features_state, load_features_state, trained_dataset
from ..features.early_stop import should_stop
from ..features.resolution import CoarseFrames
from ..features.spatial_order import sorted_start, spatial_order
from ..models import model_kind
from ..models.init import initial_gaussians
from ..models.splats import make_optimizers, make_params, restore_model
from ..parallel import parallel_mode
from ..rundir.checkpoint import (
    CHECKPOINT_FORMAT,
    check_checkpoint,
    checkpoint_path,
    prune_checkpoints,
    save_checkpoint,
)
from ..rundir.history import TrainingLog
from ..rundir.outputs import listed
from ..step.batch import CameraOrder, make_batch
from ..step.capacity import StepCapacity, capacity_applies, count_views
from ..step.cuda_graph import CudaGraphMaker, graph_unavailable, plain_rates
from ..step.determinism import apply_determinism
from ..step.device import device_frames, runs_cuda_kernels, training_device
from ..step.metrics import psnr_of_mse
from ..step.optimization import StepPlan
from ..step.runner import ModelState, StepRunner
from .frames_ahead import FramesAhead
from .progress import Progress
from .stop import StopRequest
from .tensorboard import NO_BOARD, open_board
from .torch_threads import step_threads

KEYS = (
    Key("checkpoint_every", 1000, "write a checkpoint every n steps (0: only at the end)", ge=0),
    Key("keep_checkpoints", 2, "how many of the newest checkpoints to keep (>= 1)", ge=1),
    Key("log_every", 25, "record loss, PSNR and Gaussian count every n steps", ge=1),
    Key("eval_every", 0, "measure the test PSNR every n steps during training (0: only at the "
        "end)", ge=0),
    Key("eval_max_views", 0, "at most this many test views in each evaluation during training, "
        "evenly spaced and the same ones each time (0: all); the end of the run scores every "
        "view", ge=0),
    Key("progress", True, "show a progress line (steps/s, loss, PSNR, Gaussians)"),
    Key("viewer_port", 0, "serve a live view of the training at http://127.0.0.1:PORT while it "
        "runs (pip install \"tilesplat[viewer]\"; docs/viewer.md); 0: off", ge=0, le=65535),
)
seams.register_keys("the loop (train/loop/trainer.py)", KEYS)


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
        self.cfg = cfg = cfg.validate()
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
        keep_freed_heap()  # a step's freed tensors stay mapped for the next step
        apply_determinism(cfg, self.device)  # the cuda backend's option for the key
        self.background = torch.tensor(dataset.background, dtype=torch.float32).to(self.device)
        self.train_frames = device_frames(dataset.train, self.device)
        self.coarse = CoarseFrames(self.train_frames)  # the images at the schedule's sizes
        self.model = model_kind(cfg)
        self.image_pixels = max(w * h for w, h in sizes)  # the budget and schedule follow it
        strategy = seams.strategy(cfg, self.model.gradient_key, image_pixels=self.image_pixels)
        self.scene_scale = float(dataset.scene_radius)
        # the features the config switches on (train/features/), before a checkpoint's
        # state is loaded into them
        self.features = build_features(cfg, dataset, self.device)
        self.average = param_average(cfg)  # the averaged model (ema_decay), or None
        if checkpoint is None:
            torch.manual_seed(cfg.seed)  # on the CPU and every GPU
            # drawn on the CPU, so that every device starts from the same Gaussians
            start = self.model.init(initial_gaussians(cfg, dataset, log=self.log))
            if cfg.spatial_order:  # the whole model, before a model-parallel job splits it
                start = sorted_start(start)
            params = make_params(start, device=self.device)
            self.state = ModelState(params, make_optimizers(params, cfg, self.scene_scale),
                                    to_device(strategy.initialize_state(
                                        scene_scale=self.scene_scale), self.device))
            self.step = 0
            self.elapsed = 0.0
            self.training_log = TrainingLog()
        else:
            self._load_state(checkpoint)
        strategy.check_sanity(self.params, self.optimizers)
        self.order = CameraOrder(len(dataset.train), cfg.batch_size, cfg.seed)
        self._ahead = FramesAhead(self.coarse, self.device)  # this rank's frames of the next step
        self.parallel = parallel_mode(cfg)
        self.strategy = self.parallel.attach(cfg, self.params, self.optimizers,
                                             self.strategy_state, strategy)
        self.plan = StepPlan(cfg, self.model, self.scene_scale, self.features, self.parallel,
                             absgrad=self.strategy.wants_absgrad(),
                             absgrad_stop=self.strategy.gradients_read_until(),
                             image_pixels=self.image_pixels,
                             before_backward=self._pre_backward)
        capacity = None  # the intersection lists' (train/step/capacity.py)
        if capacity_applies(cfg, self.device, len(self.features)):
            capacity = StepCapacity(self.count_views, cfg.batch_size, self.device)
        self.steps = StepRunner(self.state, self.plan, self.strategy, self.average,
                                self.device, capacity,
                                spatial_order(cfg, self.params, self.strategy))
        if cfg.cuda_graph and runs_cuda_kernels(cfg, self.device):
            why_not = graph_unavailable(self.device, capacity is not None,
                                        lens=cfg.camera_mode == "native")
            if why_not is not None:
                log(f"cuda_graph: the step runs eagerly ({why_not})")
            else:  # the step as one CUDA graph (train/step/cuda_graph.py)
                self.steps.use_graph(CudaGraphMaker())
        self.board = NO_BOARD  # TensorBoard's events while train() runs (tensorboard.py)
        self._nulled = 0  # the undefined numbers of history.json the log has named

    def _pre_backward(self, step: int, info: dict[str, Any]) -> None:
        """The strategy's hook after the render (gsplat's ``step_pre_backward``)."""
        self.strategy.step_pre_backward(self.params, self.optimizers, self.strategy_state, step,
                                        info)

    # --- state ---------------------------------------------------------------------------

    @property
    def params(self) -> dict[str, Tensor]:
        """The model's parameters (this rank's shard in a model-parallel job)."""
        return self.state.params

    @property
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """One Adam per parameter."""
        return self.state.optimizers

    @property
    def strategy_state(self) -> dict[str, Any]:
        """The strategy's running state."""
        return self.state.strategy_state

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
            "config": self.cfg.as_dict(),
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
        try:  # every field, before any is used (open_checkpoint has named the file)
            check_checkpoint(ckpt)
        except ValueError as exc:
            raise ValueError(f"checkpoint: {exc}") from None
        self.step = int(ckpt["step"])
        self.scene_scale = float(ckpt["scene_scale"])
        params, optimizers = restore_model(ckpt, self.cfg, self.device)
        self.state = ModelState(params, optimizers,
                                to_device(dict(ckpt["strategy_state"]), self.device))
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
                try:
                    torch.cuda.set_rng_state(rng, self.device)
                except RuntimeError as exc:  # the state of another kind of generator
                    raise ValueError(f"checkpoint: cuda_rng does not fit this GPU's generator "
                                     f"({exc})") from None
            else:
                with torch.cuda.device(self.device):
                    torch.cuda.manual_seed(self.cfg.seed * 1_000_003 + self.step)

    def save_checkpoint(self) -> Path:
        """Write the checkpoint of the current step and the history; keep the newest few
        (the other ranks of a job write nothing; those of a model-parallel job send their
        shards to rank 0)."""
        self.steps.settle()  # a checkpoint holds no step past a bad one
        needed = self.writes or self.parallel.collective_checkpoint
        state = self.state_dict() if needed else None
        if not self.writes:
            return checkpoint_path(self.run_dir, self.step)
        path = save_checkpoint(checkpoint_path(self.run_dir, self.step), state)
        prune_checkpoints(self.run_dir, self.cfg.keep_checkpoints)
        for feature in self.features:
            feature.write(self.run_dir)
        nulled = self.training_log.write(self.run_dir / "history.json")
        if len(nulled) > self._nulled:  # said once for each new undefined number
            self.log(f"history.json: undefined or infinite numbers written as null (a PSNR "
                     f"where no pixel counted, or of a perfect render): {listed(nulled)}")
            self._nulled = len(nulled)
        return path

    # --- one step ------------------------------------------------------------------------

    def batch_indices(self, step: int) -> list[int]:
        """Training-frame indices of ``step``: epochs of seeded permutations, no state kept."""
        return self.order.indices(step)

    def train_step(self, step: int) -> tuple[Tensor, Tensor]:
        """One optimisation step on this rank's share of the step's batch, at the resolution
        schedule's size (:meth:`.StepRunner.run`: render, loss, backward, Adam, densify).

        Returns:
            (loss [], squared error [] float64: the mean over the batch's pixels of the
            clamped render against the target), on the training device, not read back.
        """
        factor = self.plan.downscale_factor(step)
        ahead = self._ahead.take(step, factor)
        if ahead is not None:
            indices, frames = ahead
        else:
            indices = self.parallel.my_cameras(self.batch_indices(step))
            frames = self._ahead.frames(indices, factor)
        batch = make_batch(frames, self.background, self.cfg.random_background,
                           views=indices).to(self.device)
        if step + 1 < self.cfg.steps:  # the next step's frames are made while this one runs
            self._ahead.submit(step + 1, self.parallel.my_cameras(self.batch_indices(step + 1)),
                               self.plan.downscale_factor(step + 1))
        return self.steps.run(step, batch)

    def count_views(self, params: dict[str, Tensor], factor: int) -> Tensor:
        """[V] int64: the tile-intersection count of every training view at ``factor`` (what
        the capacity of the intersection lists is measured on)."""
        def render(views: list[int]) -> None:
            frames = [self.coarse.frame(i, factor) for i in views]
            cams = make_batch(frames, self.background, False, views=views).to(self.device)
            self.model.render(params, cams, self.cfg, 0)

        return count_views(render, len(self.train_frames), self.cfg.batch_size, self.device)

    # --- the loop ------------------------------------------------------------------------

    def test_psnr(self) -> float:
        """Mean PSNR over the test views (train views when there are none), at most
        ``eval_max_views`` of them evenly spaced; NaN on the ranks > 0 of a model-parallel job
        (rank 0 evaluates the gathered model)."""
        from ..rundir.evaluate import evaluate, spaced_views

        params = self.served_params()
        if params is None:
            return float("nan")
        frames = self.dataset.test or trained_dataset(self.features, self.dataset).train
        self.board.add_renders(self.step, params, frames, self.cfg, self.dataset.background)
        frames = spaced_views(frames, self.cfg.eval_max_views)
        return evaluate(params, frames, self.cfg, self.dataset.background,
                        psnr_only=True)["psnr"]

    def _open_viewer(self) -> Any:
        """The live view of ``viewer_port`` (docs/viewer.md), or None when it is 0."""
        if not self.cfg.viewer_port or not self.writes:  # rank 0 alone serves it
            return None
        from ...viewer.live import LiveViewer

        return LiveViewer(self.cfg.viewer_port, log=self.log)

    def train(self) -> None:
        """Run the remaining steps; on Ctrl-C finish the step, checkpoint, re-raise."""
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        progress = Progress(cfg.steps, self.step, enabled=cfg.progress)
        viewer = self._open_viewer()
        # a run that stopped early (its history says so) and is resumed stops again at once
        done = self.step >= cfg.steps or should_stop(cfg, self.history["test_psnr"])
        with StopRequest() as stop, step_threads(cfg, self.device):
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

