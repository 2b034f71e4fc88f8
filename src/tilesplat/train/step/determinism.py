"""``deterministic = true``: bitwise-reproducible gradients, and so training, on every backend.

The ``cpu`` backend is bit-exact whatever the key (its kernels sum in a fixed order). The
``cuda`` backend adds gradients with float atomics, whose order changes from run to run; the
key turns on its ``deterministic`` option (``backends/cuda/runtime.py``: a row per
intersection and warp, summed in a fixed order by ``backends/cuda/segment.py``). The
``torch`` reference on a GPU uses PyTorch's atomic index ops, so the key refuses it there.
The option is process-wide, as PyTorch's own ``use_deterministic_algorithms``: the trainer
sets it from its config when it starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ...keys import Key
from .. import seams
from .device import runs_cuda_kernels

if TYPE_CHECKING:
    from ..config import TrainConfig


KEYS = (Key("deterministic", False, "bitwise-reproducible gradients and training on the cuda "
            "backend (no float atomics; more memory and time, docs/gpu.md); the cpu backend is "
            "always bit-exact"),)


def determinism_errors(cfg: TrainConfig) -> list[str]:
    """Why ``deterministic`` cannot hold for ``cfg`` (empty when it can or is off)."""
    if cfg.deterministic and cfg.backend == "torch" and cfg.device.startswith("cuda"):
        return [
            f"deterministic = true with backend = 'torch' on device = {cfg.device!r}: the torch "
            "reference adds gradients with PyTorch's atomic index ops on a GPU; use backend = "
            "'cuda' (or 'cpu' on the CPU)"
        ]
    return []


seams.register_keys("determinism (train/step/determinism.py)", KEYS, determinism_errors)


def apply_determinism(cfg: TrainConfig, device: torch.device) -> None:
    """Set the backends' options for ``cfg.deterministic`` in this process (the cuda
    backend's, when a run of ``cfg`` on ``device`` renders with it)."""
    if not runs_cuda_kernels(cfg, device):
        return  # cpu: bit-exact already; torch on the CPU: PyTorch's CPU ops
    from ...backends.cuda import set_options

    set_options(deterministic=bool(cfg.deterministic))
