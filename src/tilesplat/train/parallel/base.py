"""The parallel seam: how one process takes part in a training step (``parallel`` key).

A mode is a class whose instance is this process's rank in the job; the trainer calls the same
methods in every mode and never asks which one it holds. The base class is the null object:
one process, every method the identity (``parallel = "none"``, and any mode outside a job of
several ranks). A mode registers with ``@register("parallel", NAME)``; ``data`` and ``model``
are :mod:`.data` and :mod:`.model` (docs/distributed.md).

Per step the trainer asks, in this order: :meth:`my_cameras` (this rank's share of the batch),
:attr:`render_distributed` and :meth:`loss_share` (how the rank renders and weighs its loss),
:meth:`reduce_gradients` (after backward, before Adam), :meth:`densify_info` (what the
strategy sees) and :meth:`after_step` (after densification).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ...devices import is_cuda_name
from ...keys import Key
from ...ranks import DIST_BACKENDS
from .. import seams

if TYPE_CHECKING:
    from ...strategy import Strategy
    from ..config import TrainConfig


DIST_BACKEND = Key(
    "dist_backend", "auto", "torch.distributed backend of a job of several ranks: auto (nccl "
    "when the ranks train on GPUs, one GPU each; gloo on CPUs), nccl, or gloo (CPU or CUDA "
    "tensors; lets ranks share a GPU, the bytes staged through the host); docs/distributed.md",
    choices=DIST_BACKENDS)


def dist_backend_errors(cfg: TrainConfig) -> list[str]:
    """Why ``dist_backend`` cannot serve ``cfg``'s device (empty when it can)."""
    cuda = (cfg.device != "cpu" and cfg.backend not in ("cpu", "torch")) or is_cuda_name(cfg.device)
    if cfg.dist_backend == "nccl" and not cuda:
        return [f"dist_backend = 'nccl' takes CUDA tensors, got device = {cfg.device!r} and "
                f"backend = {cfg.backend!r}: set device = 'cuda', or dist_backend = 'gloo'"]
    return []


seams.register_keys("ranks of a job (train/parallel/base.py)", (DIST_BACKEND,),
                    dist_backend_errors)


def shards_model(cfg: TrainConfig) -> bool:
    """Whether ``cfg``'s parallel mode splits the Gaussians between the ranks (each renders a
    shard with ``rasterization(distributed=True)``)."""
    return seams.variant("parallel", cfg.parallel).render_distributed


def needs_whole_model(cfg: TrainConfig, what: str, why: str) -> list[str]:
    """The error of a feature that needs every Gaussian in each rank (``what``: the feature's
    setting, ``why``: what a shard would break) when ``cfg``'s mode shards the model; empty
    otherwise."""
    if not shards_model(cfg):
        return []
    return [f"{what} is not supported with parallel = {cfg.parallel!r} ({why}); use "
            "parallel = 'data' or 'none'"]


def several_ranks(cfg: TrainConfig) -> bool:
    """Whether ``cfg``'s parallel mode trains with several ranks (every mode but ``none``)."""
    return seams.variant("parallel", cfg.parallel).SEVERAL_RANKS


def for_ranks(cfg: TrainConfig) -> TrainConfig:
    """The config a rank of a job of several trains with: one process's run (``parallel =
    "none"``) becomes a data-parallel one; a data or model run keeps its mode."""
    return cfg if several_ranks(cfg) else cfg.replace(parallel="data").validate()


class Parallel:
    """This process's rank of a training job; the base is a job of one process."""

    # whether the mode trains with several ranks (the single process is the only one without)
    SEVERAL_RANKS: ClassVar[bool] = True

    # whether each rank renders its shard with rasterization(distributed=True)
    render_distributed: ClassVar[bool] = False
    # whether writing rank 0's checkpoint needs every rank (gathering the shards)
    collective_checkpoint: ClassVar[bool] = False

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        self.rank, self.world_size = rank, world_size
        # where small collectives put their numbers (NCCL takes CUDA tensors only): the
        # model's device, set by attach()
        self.device = torch.device("cpu")

    @classmethod
    def current(cls) -> Parallel | None:
        """This process's rank of the mode, or None outside a job of several ranks."""
        return cls()

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        """Why ``cfg`` cannot train in this mode: one message per key (empty when it can)."""
        return []

    @property
    def writes(self) -> bool:
        """Whether this process writes the run's files (rank 0)."""
        return self.rank == 0

    # --- the run folder ---------------------------------------------------------------

    def from_rank0(self, value: object) -> object:
        """Rank 0's ``value`` on every rank."""
        return value

    def barrier(self) -> None:
        """Wait for every rank."""

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank."""
        return flag

    # --- the trainer ------------------------------------------------------------------

    def attach(self, cfg: TrainConfig, params: dict[str, Tensor], optimizers: dict,
               state: dict[str, Any], strategy: Strategy) -> Strategy:
        """Take part with the trainer's model (a fresh start or a checkpoint, whole on every
        rank): check what the job needs of the config, keep this rank's part of the model,
        and return the strategy that densifies it."""
        self.device = params["means"].device
        return strategy

    def my_cameras(self, indices: list[int]) -> list[int]:
        """This rank's share of the step's batch (frame indices)."""
        return indices

    def loss_share(self, n_gaussians: int) -> tuple[float, int] | None:
        """(fraction of the batch's cameras, total Gaussian count) that weighs this rank's
        loss (``step.training_loss``), or None for the whole batch and model."""
        return None

    def reduce_gradients(self, tensors: Sequence[Tensor]) -> None:
        """Combine the ranks' gradients in ``tensors[i].grad`` (the Gaussians' parameters and
        the features' learned tensors) before the optimisers step."""

    def densify_info(self, info: dict, key: str, batch_size: int) -> dict:
        """The render meta the strategy densifies on (``key``: the screen-space means)."""
        return info

    def after_step(self, params: dict[str, Tensor], optimizers: dict, state: dict[str, Any],
                   step: int) -> None:
        """After densification: keep the ranks consistent."""

    def n_gaussians(self, n_local: int) -> int:
        """The whole model's Gaussian count, this rank holding ``n_local``."""
        return n_local

    # --- the whole model --------------------------------------------------------------

    def whole_model(self, params: dict[str, Tensor], optimizers: dict, state: dict[str, Any]
                    ) -> tuple[dict, dict, dict] | None:
        """(parameters, optimiser state dicts, strategy state) of the whole model, copied
        (None on the ranks that do not hold it; with :attr:`collective_checkpoint` every rank
        must call it)."""
        return (
            {k: p.detach().clone() for k, p in params.items()},
            {k: opt.state_dict() for k, opt in optimizers.items()},
            dict(state),
        )

    def full_params(self, params: dict[str, Tensor], optimizers: dict,
                    state: dict[str, Any]) -> dict[str, Tensor] | None:
        """The whole model's parameters (``params`` themselves when this rank holds them all;
        None on the ranks that do not hold the gathered model)."""
        return params


@seams.register("parallel", "none")
class SingleProcess(Parallel):
    """One process trains the whole batch on the whole model."""

    SEVERAL_RANKS = False
