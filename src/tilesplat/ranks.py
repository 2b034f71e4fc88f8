"""Starting the ranks of a ``torch.distributed`` job on this machine (:func:`launch_local`,
gsplat's :func:`cli`) or joining a ``torchrun`` job (:func:`join_torchrun`), and what each
rank takes: its process group's backend and its GPU.

- Backend (:func:`choose_backend`): ``auto`` is NCCL for ranks on GPUs and gloo on CPUs;
  NCCL needs CUDA tensors; gloo takes CPU and CUDA tensors (ranks that share one GPU, which
  NCCL refuses: ``tilesplat.distributed`` then stages the bytes through the host).
- GPU (:func:`rank_gpu`): the rank whose ``LOCAL_RANK`` is r binds ``cuda:r``
  (``torch.cuda.set_device``, and NCCL's ``device_id``). NCCL takes one GPU per rank, so a
  job of more local ranks than GPUs is refused before it starts (:func:`check_local_ranks`);
  gloo ranks beyond the GPUs share them in turn (``cuda:r % GPUs``).
- Failure: a rank that raises ends the job; the other ranks are terminated and the first
  error in time (the cause: the others then fail on the lost peer) is raised, naming its
  rank.

The spawned ranks get ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` in their environment as
``torchrun`` gives them, so a rank finds its GPU the same way under both.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as dist

DIST_BACKENDS = ("auto", "nccl", "gloo")
# how long a collective may wait for a peer before the job fails
TIMEOUT = datetime.timedelta(minutes=10)


def choose_backend(choice: str, device_type: str) -> str:
    """The process group backend for ranks whose tensors are on ``device_type`` (``cpu``,
    ``cuda``): ``choice`` (``auto``, ``nccl`` or ``gloo``) resolved.

    Raises:
        ValueError: an unknown ``choice``, or ``nccl`` for ranks that are not on GPUs.
    """
    if choice not in DIST_BACKENDS:
        raise ValueError(f"dist_backend must be one of {list(DIST_BACKENDS)}, got {choice!r}")
    if choice == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if choice == "nccl" and device_type != "cuda":
        raise ValueError(f"dist_backend = 'nccl' takes CUDA tensors, but the ranks train on "
                         f"{device_type!r}: set dist_backend = 'gloo' (or 'auto')")
    return choice


def rank_gpu(local_rank: int, n_gpus: int, backend: str) -> int:
    """The GPU index of the local rank ``local_rank`` on a machine with ``n_gpus`` GPUs:
    ``local_rank`` itself; with gloo, ranks beyond the GPUs share them in turn.

    Raises:
        ValueError: no GPU, or (NCCL: one GPU per rank) ``local_rank >= n_gpus``.
    """
    if n_gpus < 1:
        raise ValueError("a rank on a GPU needs one, and torch sees none "
                         "(torch.cuda.device_count() is 0)")
    if local_rank < n_gpus:
        return local_rank
    if backend == "nccl":
        raise ValueError(f"local rank {local_rank} has no GPU of its own: torch sees {n_gpus} "
                         f"GPU(s) and NCCL takes one per rank (dist_backend = 'gloo' lets "
                         "ranks share a GPU)")
    return local_rank % n_gpus


def check_local_ranks(nproc: int, n_gpus: int, backend: str) -> None:
    """Refuses ``--nproc nproc`` local ranks on GPUs that NCCL cannot give one GPU each.

    Raises:
        ValueError: naming ``--nproc`` and the GPU count.
    """
    if backend == "nccl" and nproc > n_gpus:
        raise ValueError(f"--nproc {nproc} needs {nproc} GPUs with NCCL (one per rank), and "
                         f"torch sees {n_gpus}: give --nproc {n_gpus} or less, or set "
                         "dist_backend = 'gloo' to share the GPUs")


def local_rank() -> int:
    """This process's rank on its machine (``LOCAL_RANK``, as torchrun and
    :func:`launch_local` set it; 0 outside a job)."""
    raw = os.environ.get("LOCAL_RANK", "0")
    if not raw.isdigit():
        raise ValueError(f"LOCAL_RANK must be an integer >= 0, got {raw!r}")
    return int(raw)


def _bind_gpu(local: int, backend: str) -> torch.device:
    """This rank's GPU (:func:`rank_gpu`), made the current device."""
    index = rank_gpu(local, torch.cuda.device_count(), backend)
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _init_group(backend: str, gpu: torch.device | None, **kwargs: Any) -> None:
    if backend == "nccl" and gpu is not None:
        kwargs["device_id"] = gpu  # NCCL's communicator is bound to the rank's GPU
    dist.init_process_group(backend, timeout=TIMEOUT, **kwargs)


def _free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _worker(local: int, world_size: int, fn: Callable, args: Any, backend: str,
            gpus: bool, verbose: bool, errors: Any) -> None:
    if verbose:
        print(f"distributed worker {local + 1} / {world_size}", flush=True)
    if world_size > 1:
        os.environ["LOCAL_RANK"] = str(local)
        os.environ["LOCAL_WORLD_SIZE"] = str(world_size)
    try:
        if world_size > 1:
            gpu = _bind_gpu(local, backend) if gpus else None
            _init_group(backend, gpu, rank=local, world_size=world_size)
        fn(local, local, world_size, args)
        if world_size > 1:
            dist.barrier()
    except BaseException as exc:
        # when it happened: a rank's failure makes the others fail too (their peer is
        # gone), and the launcher reports the first failure, the cause
        errors.put((time.time(), local, f"{type(exc).__name__}: {exc}",
                    traceback.format_exc()))
        raise
    finally:
        if world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()
    if world_size > 1:  # a spawned rank: its process is ours to end
        end_rank_process()


def end_rank_process() -> NoReturn:
    """Ends a rank's process now, with exit status 0, after flushing its output.

    On torch 2.13 a gloo worker thread can outlive ``destroy_process_group`` and release its
    last collective's tensors while Python finalizes; taking the GIL then ends the thread
    inside a C++ destructor and the process aborts (SIGABRT, "terminate called without an
    active exception"; seen about once in ten 2-rank runs, in gdb:
    ``ProcessGroupGloo::runLoop`` -> ``~AsyncBarrierWork`` -> ``PyEval_AcquireThread``).
    A rank whose work is done and written skips finalization instead. Only for processes
    tilesplat owns (the ranks it spawns, the ``tilesplat`` command under torchrun)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch_local(world_size: int, fn: Callable, args: Any, backend: str = "gloo",
                 verbose: bool = False, gpus: bool | None = None) -> None:
    """Runs ``fn(local_rank, world_rank, world_size, args)`` in ``world_size`` new processes
    joined in a ``backend`` process group on 127.0.0.1 (1: in this process, no group).
    ``gpus`` (default: with NCCL): each rank binds its GPU first (:func:`rank_gpu`).

    A rank that raises ends the job: the other ranks are terminated and the first error in
    time (the cause; the others then fail on the lost peer) is raised here as a
    RuntimeError naming its rank."""
    gpus = backend == "nccl" if gpus is None else gpus
    errors = torch.multiprocessing.get_context("spawn").SimpleQueue()
    if world_size == 1:
        _worker(0, 1, fn, args, backend, gpus, verbose, errors)
        return
    if gpus:
        check_local_ranks(world_size, torch.cuda.device_count(), backend)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(_free_port())
    context = torch.multiprocessing.spawn(
        _worker, args=(world_size, fn, args, backend, gpus, verbose, errors),
        nprocs=world_size, join=False,
    )
    try:
        while not context.join():  # raises on the first rank that fails, ending the others
            pass
    except Exception as exc:
        reports = []
        while not errors.empty():
            reports.append(errors.get())
        if not reports:
            raise
        _, rank, message, trace = min(reports)
        raise RuntimeError(f"rank {rank} of {world_size} failed: {message}\n{trace}") from exc
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
            process.join()


def torchrun_world_size() -> int:
    """The world size of the torchrun job this process belongs to (``WORLD_SIZE`` with
    ``RANK`` set), else 0."""
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    return 0


def join_torchrun(fn: Callable, args: Any, backend: str, gpus: bool | None = None) -> None:
    """Runs ``fn(local_rank, world_rank, world_size, args)`` as this process's rank of a
    torchrun job, in a ``backend`` process group (none for a job of one); ``gpus`` (default:
    with NCCL): the rank binds ``cuda:LOCAL_RANK`` first."""
    gpus = backend == "nccl" if gpus is None else gpus
    world_size = int(os.environ["WORLD_SIZE"])
    world_rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", world_rank))
    if world_size > 1:
        _init_group(backend, _bind_gpu(local, backend) if gpus else None)
    try:
        fn(local, world_rank, world_size, args)
        if world_size > 1:
            # no rank tears its connections down while a peer still works with them (rank 0
            # writing a gathered model): gloo aborts a process whose pairs close mid-send
            dist.barrier()
    finally:
        if world_size > 1:
            dist.destroy_process_group()


def cli(fn: Callable, args: Any, verbose: bool = False) -> bool:
    """Runs ``fn(local_rank, world_rank, world_size, args)`` on every local rank, as gsplat's
    ``cli``: one process per visible GPU with NCCL, or (tilesplat's addition, no GPU) as many
    processes as ``TILESPLAT_NPROC`` asks (default 1) with gloo, on 127.0.0.1. Under
    ``torchrun`` (``WORLD_SIZE`` and ``RANK`` set) it runs this process's rank of the job.
    A rank that raises ends the job: the other ranks are terminated and the first error
    raised, naming its rank, is raised here as a RuntimeError."""
    if torchrun_world_size() > 0:  # torchrun / several machines
        join_torchrun(fn, args, "nccl" if torch.cuda.is_available() else "gloo")
        return True
    if torch.cuda.is_available():
        world_size, backend = torch.cuda.device_count(), "nccl"
    else:
        raw = os.environ.get("TILESPLAT_NPROC", "1")
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"TILESPLAT_NPROC must be an integer >= 1, got {raw!r}")
        world_size, backend = int(raw), "gloo"
    launch_local(world_size, fn, args, backend, verbose)
    return True
