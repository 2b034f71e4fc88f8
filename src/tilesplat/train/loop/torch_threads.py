"""Torch's intra-op threads while a run trains on the CPU (``torch_threads``).

On the CPU a step's heavy work is the backend's kernels, which run on their own threads
(``backends/cpu/_common.parallel_for``, Numba's thread count). What torch computes itself is
glue: the loss on the images, Adam, the strategy's edits, the gathers around the kernels. Under
the passive OpenMP wait policy that ``tilesplat`` sets for itself (``command_env``), torch's
workers sleep between ops, and each op over torch's grain (32,768 elements) wakes them: on a
2-core machine a 200x200x3 image's ``sgn`` took 50 us on two threads against 9 us on one. One
torch thread in the steps was faster at every size measured there: whole runs of the built-in
scene 0.92 (fast recipe) and 0.90 (3DGS recipe) of the wall time, garden-views' 3DGS run ~2 %
less, the step at 1 M Gaussians and 1297x840 0.87-0.92 (Adam 27 ms against 31-49)
(docs/training.md, "Where the built-in run's steps go"). Machines with more cores were not
measured, so there torch keeps its own count unless the key says otherwise.

The count applies to the steps and the evaluations inside the loop; the caller's count is
restored when the loop ends (the final evaluation and the exports use it). Torch's ops give
the same bits with any thread count in the trainer (``ops/elementwise``), so the choice
changes no result.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from ...devices import usable_cpus
from ...keys import Key
from .. import seams

if TYPE_CHECKING:
    from ..config import TrainConfig

SMALL_MACHINE_CORES = 2  # the largest core count one torch thread was measured faster on

KEYS = (
    Key("torch_threads", 0, "torch's intra-op threads during the training steps on the CPU "
        "(the kernels keep their own threads); 0: one on a machine of at most 2 cores, where "
        "it was measured faster, else torch's own count (train/loop/torch_threads.py)", ge=0),
)

seams.register_keys("torch's threads (train/loop/torch_threads.py)", KEYS)


def step_thread_count(cfg: TrainConfig, device: torch.device,
                      cores: int | None = None) -> int | None:
    """Torch's intra-op thread count for the steps of a run of ``cfg`` on ``device``, or None
    to leave it as the caller set it: the key's value when given; with 0, one on the CPU of a
    machine of at most :data:`SMALL_MACHINE_CORES` cores (``cores``, default: the cores this
    process may run on) unless ``OMP_NUM_THREADS`` is set (the user's choice); None on a GPU."""
    if device.type != "cpu":
        return None
    if cfg.torch_threads > 0:
        return cfg.torch_threads
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = usable_cpus() if cores is None else cores
    return 1 if cores <= SMALL_MACHINE_CORES else None


@contextlib.contextmanager
def step_threads(cfg: TrainConfig, device: torch.device) -> Iterator[None]:
    """Runs the block with :func:`step_thread_count` torch threads, then restores the
    caller's count."""
    count = step_thread_count(cfg, device)
    before = torch.get_num_threads()
    if count is None or count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
