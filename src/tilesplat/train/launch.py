"""Starting a training job: in this process, in ``--nproc`` local ranks, or as this process's
rank of a ``torchrun`` job (docs/distributed.md).

A job is ``(cfg, resume, overrides)``: the config of a new run, or the run folder to resume
with ``--set`` overrides. Each rank shares the machine's cores with the other local ranks,
and only rank 0 logs and prints the closing summary.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..distributed import end_rank_process, join_torchrun, launch_local, torchrun_world_size

if TYPE_CHECKING:
    from .config import TrainConfig

Job = tuple["TrainConfig | None", "str | None", "list[str]"]


def torchrun_world() -> int:
    """The world size of the torchrun job this process is a rank of (1 outside one)."""
    return max(1, torchrun_world_size())


def train_job(job: Job, nproc: int = 1) -> None:
    """Run ``job``: as this process's rank when it is one of a torchrun job of several
    (then the process ends here), in ``nproc`` new local processes when ``nproc`` > 1 (gloo
    on 127.0.0.1; a rank that fails ends the job with its error), else in this process.
    Prints the closing summary."""
    if torchrun_world() > 1:
        # distributed training keeps its tensors on the CPU (train/device.py refuses a GPU)
        join_torchrun(train_rank, job, "gloo")
        end_rank_process()  # the rank's work is written: skip gloo's racy finalization
    if nproc > 1:
        launch_local(nproc, train_rank, job, backend="gloo")
        return
    from .run import resume_run, summary, train_run

    cfg, resume, overrides = job
    if resume:
        run_dir, metrics = resume_run(resume, overrides)
    else:
        run_dir, metrics = train_run(cfg)
    print(summary(run_dir, metrics))


def train_rank(local_rank: int, world_rank: int, world_size: int, job: Job) -> None:
    """One rank of a data- or model-parallel training (the process group is up): the cores are
    shared between the local ranks, and only rank 0 logs and writes."""
    import numba
    import torch

    from .config import apply_overrides
    from .run import resume_run, summary, train_run

    local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    threads = max(1, (os.cpu_count() or 1) // local)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    cfg, resume, overrides = job
    quiet = world_rank != 0
    log = (lambda msg: None) if quiet else print
    if quiet:
        overrides = [*overrides, "progress=false"]
        if cfg is not None:
            cfg = apply_overrides(cfg, ["progress=false"])
    if resume:
        run_dir, metrics = resume_run(resume, overrides, log=log, several_ranks=True)
    else:
        run_dir, metrics = train_run(cfg, log=log)
    if not quiet:
        print(summary(run_dir, metrics))
