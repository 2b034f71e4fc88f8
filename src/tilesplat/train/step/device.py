"""Where a training run's tensors live: the ``device`` key resolved, and moves between devices.

``device = "auto"`` is ``cuda`` when the run renders with the ``cuda`` backend, or with
``auto`` while torch sees a GPU (then ``backend = "auto"`` picks the ``cuda`` kernels, as the
registry chooses the native backend of the tensors' device); otherwise ``cpu``. Under numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the ``cuda`` backend runs on CPU tensors, so the
run's device is then the CPU (as :attr:`tilesplat.bench.arms.Arm.torch_device` does for a
bench arm).

The parameters, their Adam states, the batch, the background, the strategy's statistics, the
loss and the evaluation live on that device; checkpoints, PLY files, PNG renders, the viewer's
data and the logged numbers go through the CPU, so a checkpoint does not depend on where it
was written.

A rank of a parallel job (``parallel`` = ``data`` or ``model`` with several ranks) on
``cuda`` trains on ``cuda:LOCAL_RANK`` (``ranks.rank_gpu``: one GPU per rank with NCCL; gloo
ranks beyond the GPUs share them): its collectives, the densification exchange and rank 0's
gathering move tensors on that device (``tilesplat.distributed``), and only the writers
(checkpoints, PLY, renders) copy them to the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ...backends.registry import cuda_simulator
from ...constants import BACKENDS
from ...data.frames import Frame
from ...devices import CUDA_INDEX, is_cuda_name
from ...keys import Key
from ...ranks import local_rank, rank_gpu
from .. import seams
from ..parallel.base import several_ranks

if TYPE_CHECKING:
    from ..config import TrainConfig

DEVICES = ("auto", "cpu", "cuda")
KEYS = (
    Key("backend", "auto", "rasterization backend: auto, torch, cpu or cuda", choices=BACKENDS),
    Key("device", "auto", "where the model, its optimiser and every batch live: cpu, cuda or "
        "cuda:N; auto: cuda with backend = 'cuda', or with backend = 'auto' when torch sees a "
        "GPU, else cpu; the ranks of a parallel job on cuda take cuda:LOCAL_RANK "
        "(docs/training.md, Training on a GPU)"),
)


def device_errors(cfg: TrainConfig) -> list[str]:
    """Why ``device`` is not a device name, or not one the backend renders on."""
    if cfg.device not in DEVICES and not CUDA_INDEX.match(cfg.device):
        return [f"device must be one of {list(DEVICES)} or 'cuda:N' (N >= 0), got "
                f"{cfg.device!r}"]
    if is_cuda_name(cfg.device) and cfg.backend == "cpu":
        return [f"backend = 'cpu' runs on CPU tensors, got device = {cfg.device!r}: set "
                "backend = 'cuda' (or 'auto') to train on the GPU, or device = 'cpu'"]
    return []


seams.register_keys("device and backend (train/step/device.py)", KEYS, device_errors)


def runs_cuda_kernels(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether a run of ``cfg`` training on ``device`` renders with the ``cuda`` backend's
    kernels (``backend = "cuda"``, or ``auto`` on a GPU): the one test of "is this CUDA?" that
    the capacity, the CUDA graph and the determinism options ask."""
    return cfg.backend == "cuda" or (cfg.backend == "auto" and device.type == "cuda")


# The training images are kept on the GPU when they take at most this share of its memory
# (the built-in scene: 48 MB; 300 views of 1.2 MP: 4.3 GB, an eighth of a 40 GB GPU);
# otherwise each batch's images are copied there.
IMAGE_CACHE_SHARE = 1 / 8


def training_device(cfg: TrainConfig) -> torch.device:
    """The device a run of ``cfg`` trains on (``device`` resolved on this machine).

    Raises:
        ValueError: naming the keys, when the device cannot serve the config here: a GPU
            that torch does not see (or an index beyond its GPUs), ``device = "cuda"`` under
            numba's simulator, ``backend = "cuda"`` on the CPU outside the simulator, or
            ``cuda:N`` for a rank of a job (each rank takes ``cuda:LOCAL_RANK``).
    """
    simulated = cuda_simulator()
    name = cfg.device
    if name == "auto":
        gpu = cfg.backend == "cuda" or (cfg.backend == "auto" and torch.cuda.is_available())
        name = "cuda" if gpu and not simulated else "cpu"
    if is_cuda_name(name):
        _check_gpu(cfg, name, simulated)
        job = _job_backend(cfg)
        if job is not None:
            return _rank_device(cfg, name, job)
    elif cfg.backend == "cuda" and not simulated:
        raise ValueError(
            f"backend = 'cuda' needs device = 'cuda' (or 'auto'), got device = {cfg.device!r}: "
            "the cuda kernels take CUDA tensors"
        )
    return torch.device(name)


def _check_gpu(cfg: TrainConfig, name: str, simulated: bool) -> None:
    via = "" if cfg.device != "auto" else f" (device = 'auto' with backend = {cfg.backend!r})"
    if simulated:
        raise ValueError(
            f"device = {cfg.device!r} under numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): "
            "the simulator runs backend 'cuda' on CPU tensors; set device = 'auto' or 'cpu'"
        )
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r}{via} needs a GPU, and torch sees none "
            "(torch.cuda.is_available() is False): set device = 'cpu' and backend = 'auto' "
            "or 'cpu'"
        )
    index = CUDA_INDEX.match(name)
    count = torch.cuda.device_count()
    if index is not None and int(index.group(1)) >= count:
        raise ValueError(
            f"device = {name!r}: torch sees {count} GPU(s), cuda:0 to cuda:{count - 1}"
        )


def _job_backend(cfg: TrainConfig) -> str | None:
    """The backend of the process group this process is a rank of, when ``cfg`` trains in a
    parallel mode with several ranks; else None."""
    import torch.distributed as dist

    several = several_ranks(cfg)
    if not several or not dist.is_available() or not dist.is_initialized():
        return None
    return str(dist.get_backend()) if dist.get_world_size() > 1 else None


def _rank_device(cfg: TrainConfig, name: str, backend: str) -> torch.device:
    """This rank's GPU: ``cuda:LOCAL_RANK`` (``ranks.rank_gpu``)."""
    if name != "cuda":
        raise ValueError(
            f"device = {name!r} in a job of several ranks: set device = 'cuda' (or 'auto'); "
            "each rank trains on cuda:LOCAL_RANK"
        )
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"the process group's backend {backend!r} is neither nccl nor gloo")
    return torch.device("cuda", rank_gpu(local_rank(), torch.cuda.device_count(), backend))


def device_frames(frames: Sequence[Frame], device: torch.device) -> list[Frame]:
    """``frames`` with their cameras on ``device``, and their images and alphas too when
    they fit in ``IMAGE_CACHE_SHARE`` of its memory (on the CPU: the frames themselves)."""
    if device.type == "cpu":
        return list(frames)
    nbytes = sum(f.pixels.nbytes for f in frames)  # the float32 images, none decoded
    cache = nbytes <= IMAGE_CACHE_SHARE * torch.cuda.get_device_properties(device).total_memory
    return [
        dataclasses.replace(
            f,
            viewmat=f.viewmat.to(device),
            K=f.K.to(device),
            **_on_device(f, device, cache),
        )
        for f in frames
    ]


def _on_device(frame: Frame, device: torch.device, move: bool) -> dict:
    """The image and alpha of ``frame`` on ``device`` (decoded once) when ``move``; else
    nothing (the frame keeps its pixels, decoded on the host for each batch)."""
    if not move:
        return {}
    image, alpha = frame.pixels.tensors()
    return {"image": image.to(device), "alpha": None if alpha is None else alpha.to(device)}

