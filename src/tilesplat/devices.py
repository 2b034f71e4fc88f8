"""Device names, the CPUs this process may use, and moving nested tensor structures between
devices: the bench's arms, the trainer's state.

A bottom-layer module (torch only), so that the bench's kernel checks, which a bare GPU
machine runs with no more than torch and numba (``scripts/gpu_check.py``), need nothing of the
trainer or the data readers.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

CUDA_INDEX = re.compile(r"^cuda:(\d+)$")


def is_cuda_name(device: str) -> bool:
    """Whether ``device`` names a GPU (``cuda`` or ``cuda:N``)."""
    return device == "cuda" or bool(CUDA_INDEX.match(device))


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the system has one, else the
    machine's count; at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def to_device(obj: Any, device: torch.device | str) -> Any:
    """``obj`` with every tensor in it moved to ``device``: nested dicts, lists and tuples are
    copied with the same structure, anything else is returned as it is. A tensor already on
    ``device`` is returned itself (no copy)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj
