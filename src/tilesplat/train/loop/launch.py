"""Starting a training job: in this process, in ``--nproc`` local ranks, or as this process's
rank of a ``torchrun`` job (docs/distributed.md).

A job is ``(cfg, resume, overrides)``: the config of a new run, or the run folder to resume
with ``--set`` overrides. Where the run trains decides the ranks' process group
(:func:`job_plan`): on GPUs NCCL with one rank per GPU (``--nproc`` without a number: one per
visible GPU; more ranks than GPUs are refused), on CPUs gloo; ``dist_backend = "gloo"`` also
takes GPUs (ranks may then share one). Each rank binds ``cuda:LOCAL_RANK`` before its group
starts (``tilesplat.ranks``), shares the machine's cores with the other local ranks, and only
rank 0 logs and prints the closing summary.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from ...ranks import (
    check_local_ranks,
    choose_backend,
    end_rank_process,
    join_torchrun,
    launch_local,
    torchrun_world_size,
)

if TYPE_CHECKING:
    from ..config import TrainConfig

Job = tuple["TrainConfig | None", "str | None", "list[str]"]


def torchrun_world() -> int:
    """The world size of the torchrun job this process is a rank of (1 outside one)."""
    return max(1, torchrun_world_size())


def job_config(job: Job) -> TrainConfig:
    """The config a job's ranks train with: the new run's, or a resumed run's
    ``config.toml`` with the overrides (its parallel mode as ``resume_run`` gives it)."""
    from ..config import TrainConfig, apply_overrides, load_config
    from ..parallel import for_ranks

    cfg, resume, overrides = job
    if cfg is not None:
        return cfg
    saved = Path(resume or "") / "config.toml"
    base = load_config(saved) if saved.is_file() else TrainConfig()
    cfg = apply_overrides(base, overrides)
    return for_ranks(cfg)


def job_plan(cfg: TrainConfig, nproc: int | None) -> tuple[int, str, bool]:
    """(local ranks, process group backend, whether each rank binds a GPU) of a job of
    ``cfg`` started with ``--nproc nproc`` (None: one rank per visible GPU).

    Raises:
        ValueError: ``--nproc`` without a number and no GPU; more ranks than GPUs with NCCL
            (naming ``--nproc`` and the count); ``cuda:N`` for several ranks;
            ``dist_backend = 'nccl'`` on the CPU.
    """
    import torch

    from ..step.device import training_device

    device = training_device(cfg)
    backend = choose_backend(cfg.dist_backend, device.type)
    gpus = device.type == "cuda"
    n_gpus = torch.cuda.device_count() if gpus else 0
    if nproc is None:
        if not gpus:
            raise ValueError("--nproc without a number starts one rank per GPU, and this run "
                             f"trains on {device.type!r}: give --nproc N")
        nproc = n_gpus
    if gpus:
        check_local_ranks(nproc, n_gpus, backend)
        if nproc > 1 and cfg.device not in ("auto", "cuda"):
            raise ValueError(f"device = {cfg.device!r} with --nproc {nproc}: set device = "
                             "'cuda' (or 'auto'); each rank trains on cuda:LOCAL_RANK")
    return nproc, backend, gpus


def train_job(job: Job, nproc: int | None = 1) -> None:
    """Run ``job``: as this process's rank when it is one of a torchrun job of several
    (then the process ends here), in ``nproc`` new local processes when ``nproc`` > 1 (or
    None: one per visible GPU; a rank that fails ends the job with its error), else in this
    process. Prints the closing summary."""
    if torchrun_world() > 1:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", torchrun_world()))
        _, backend, gpus = job_plan(job_config(job), local)  # this machine's ranks
        join_torchrun(train_rank, job, backend, gpus=gpus)
        end_rank_process()  # the rank's work is written: skip gloo's racy finalization
    if nproc is None or nproc > 1:
        nproc, backend, gpus = job_plan(job_config(job), nproc)
        if nproc > 1:
            launch_local(nproc, train_rank, job, backend=backend, gpus=gpus)
            return
    from ..rundir.outputs import summary
    from .run import resume_run, train_run

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

    from ..config import apply_overrides
    from ..rundir.outputs import summary
    from .run import resume_run, train_run

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
