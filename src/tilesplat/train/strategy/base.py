"""The densification strategy interface: hooks the trainer calls around ``loss.backward()``.

The trainer owns the loop; a strategy owns when and how the Gaussian set changes. Its running
state is a dict of tensors and numbers that a checkpoint stores as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Params = dict[str, torch.nn.Parameter]
Optimizers = dict[str, torch.optim.Optimizer]

REQUIRED_PARAMS = ("means", "scales", "quats", "opacities")


@dataclass
class Strategy:
    """Base strategy: changes nothing."""

    def initialize_state(self, scene_scale: float = 1.0) -> dict[str, Any]:
        """The running state passed to every hook; ``scene_scale`` sizes 3D thresholds."""
        return {"scene_scale": float(scene_scale)}

    def check_sanity(self, params: Params, optimizers: Optimizers) -> None:
        """Raise ValueError unless every trainable parameter has its own one-group optimiser."""
        trainable = {name for name, p in params.items() if p.requires_grad}
        if trainable != set(optimizers):
            raise ValueError(
                f"parameters {sorted(trainable)} and optimisers {sorted(optimizers)} differ"
            )
        for name, opt in optimizers.items():
            if len(opt.param_groups) != 1:
                raise ValueError(f"optimiser {name!r} must have exactly one param group")
        missing = [k for k in REQUIRED_PARAMS if k not in params]
        if missing:
            raise ValueError(f"strategy needs parameters {missing}")

    def step_pre_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
    ) -> None:
        """Called after rendering, before ``loss.backward()``; ``info`` is the render meta."""

    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        *,
        means_lr: float,
        packed: bool = False,
    ) -> None:
        """Called after the optimiser step of ``step``; ``means_lr`` is the means' current rate."""
