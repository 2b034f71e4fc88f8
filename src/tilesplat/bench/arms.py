"""Arms of a benchmark: which backend, backward scheme and device one measured variant uses.

An arm is written ``backend[:scheme][@device]``: ``torch``, ``cpu:per_splat``,
``cuda:per_pixel``, ``torch@cuda``. The scheme defaults to ``per_pixel``; the device defaults
to ``cuda`` for the ``cuda`` backend and ``cpu`` otherwise.

Every tensor an arm gets (its copy of the scene, the upstream gradient, and whatever another
arm's pass feeds it) goes through :func:`tilesplat.devices.to_device` to
:attr:`Arm.torch_device`, the one place that says where an arm's tensors live. Under
numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the ``cuda`` backend runs its kernels
on numpy views of CPU tensors, so a ``cuda``-backend arm keeps the device ``cuda`` in its
name and in the reports but its tensors live on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..backends import registry
from ..constants import BACKENDS, BACKWARD_SCHEMES

ARM_BACKENDS = tuple(b for b in BACKENDS if b != "auto")  # an arm names its backend
DEVICES = ("cpu", "cuda")
# The public ops the bench pipeline calls, by their registry names.
PIPELINE_OPS = (
    "fully_fused_projection",
    "spherical_harmonics",
    "isect_tiles_tight",
    "isect_offset_encode",
    "rasterize_to_pixels",
)


@dataclass(frozen=True)
class Arm:
    """One measured variant. ``spec`` is its canonical name, e.g. ``cpu:per_splat``."""

    backend: str
    scheme: str
    device: str

    @property
    def spec(self) -> str:
        default_device = "cuda" if self.backend == "cuda" else "cpu"
        tail = "" if self.device == default_device else f"@{self.device}"
        return f"{self.backend}:{self.scheme}{tail}"

    @property
    def torch_device(self) -> torch.device:
        """Where this arm's tensors live: ``device``, except a ``cuda``-backend arm under
        numba's simulator, whose kernels run on CPU tensors."""
        if self.backend == "cuda" and registry.cuda_simulator():
            return torch.device("cpu")
        return torch.device(self.device)


def parse_arm(spec: str) -> Arm:
    """Parses ``backend[:scheme][@device]``; raises ValueError naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"arm must be a string 'backend[:scheme][@device]', got {spec!r}")
    text = spec.strip()
    body, _, device = text.partition("@")
    backend, _, scheme = body.partition(":")
    scheme = scheme or "per_pixel"
    if backend not in ARM_BACKENDS:
        raise ValueError(
            f"arm {spec!r}: unknown backend {backend!r}; choose one of {list(ARM_BACKENDS)}"
        )
    if scheme not in BACKWARD_SCHEMES:
        raise ValueError(
            f"arm {spec!r}: unknown backward scheme {scheme!r}; choose one of "
            f"{list(BACKWARD_SCHEMES)}"
        )
    device = device or ("cuda" if backend == "cuda" else "cpu")
    if device not in DEVICES:
        raise ValueError(f"arm {spec!r}: unknown device {device!r}; choose one of {list(DEVICES)}")
    if backend == "cpu" and device != "cpu":
        raise ValueError(f"arm {spec!r}: backend 'cpu' runs on device 'cpu' only")
    if backend == "cuda" and device != "cuda":
        raise ValueError(
            f"arm {spec!r}: backend 'cuda' runs on device 'cuda' only (under numba's "
            "simulator, NUMBA_ENABLE_CUDASIM=1, its tensors are on the CPU by themselves)"
        )
    return Arm(backend, scheme, device)


def check_usable(arm: Arm) -> None:
    """Raises a clear error when ``arm`` cannot run on this machine (before any timing)."""
    if arm.torch_device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"arm {arm.spec!r} needs a CUDA device, and torch sees none")
    implemented = registry.implemented_ops(arm.backend)  # imports only this backend
    missing = [op for op in PIPELINE_OPS if op not in implemented]
    if missing:
        why = registry.available().get(arm.backend)  # the import error, if that was it
        if why is not None:
            raise NotImplementedError(
                f"arm {arm.spec!r}: backend {arm.backend!r} cannot be used: {why}"
            )
        raise NotImplementedError(
            f"arm {arm.spec!r}: backend {arm.backend!r} does not implement {missing}"
        )


def parse_arms(specs: list[str] | tuple[str, ...] | str) -> list[Arm]:
    """Parses and checks a list of arm specs (or one comma-separated string); no duplicates."""
    if isinstance(specs, str):
        specs = [s for s in specs.split(",") if s.strip()]
    if not specs:
        raise ValueError("at least one arm is needed, e.g. 'torch' or 'cpu:per_splat'")
    arms = [parse_arm(s) for s in specs]
    seen: set[str] = set()
    for arm in arms:
        if arm.spec in seen:
            raise ValueError(f"arm {arm.spec!r} is listed twice")
        seen.add(arm.spec)
    for arm in arms:
        check_usable(arm)
    return arms
