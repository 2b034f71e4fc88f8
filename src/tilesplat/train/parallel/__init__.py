"""Parallel modes behind the trainer's ``parallel`` key (``seams.variant("parallel", name)``).

Importing this package registers every mode; :func:`parallel_mode` gives this process's rank of
the mode a config names (the single process outside a job of several ranks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import seams
from .base import Parallel, SingleProcess, for_ranks, shards_model
from .data import DataParallel
from .model import ModelParallel

if TYPE_CHECKING:
    from ..config import TrainConfig


def parallel_mode(cfg: TrainConfig) -> Parallel:
    """This process's rank in the mode of ``cfg.parallel``: the mode's rank of the current
    process group, or :class:`SingleProcess` outside a job of several ranks."""
    rank = seams.variant("parallel", cfg.parallel).current()
    return rank if rank is not None else SingleProcess()


__all__ = [
    "DataParallel",
    "ModelParallel",
    "Parallel",
    "SingleProcess",
    "for_ranks",
    "parallel_mode",
    "shards_model",
]
