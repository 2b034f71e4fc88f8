"""The densification strategy interface: hooks a training loop calls around ``loss.backward()``.

The loop owns the steps; a strategy owns when and how the Gaussian set changes. Its running
state is a dict of tensors and numbers that a checkpoint stores as it is. The hooks take
gsplat 1.5.3's arguments, so loops written for gsplat run unchanged::

    strategy.step_pre_backward(params, optimizers, state, step, info)
    loss.backward()
    strategy.step_post_backward(params, optimizers, state, step, info, packed=packed)  # default
    strategy.step_post_backward(params, optimizers, state, step, info, lr=means_lr)    # MCMC
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

Params = dict[str, torch.nn.Parameter] | torch.nn.ParameterDict
Optimizers = dict[str, torch.optim.Optimizer]

REQUIRED_PARAMS = ("means", "scales", "quats", "opacities")


def check_required(params: Params, required: tuple[str, ...] = REQUIRED_PARAMS) -> None:
    """Raise ValueError naming the parameters a strategy needs that ``params`` lacks."""
    missing = [k for k in required if k not in params]
    if missing:
        raise ValueError(f"strategy needs parameters {missing}; params has {sorted(params)}")


@dataclass
class Strategy:
    """Base strategy (gsplat's ``Strategy``): its hooks change nothing."""

    def initialize_state(self, scene_scale: float = 1.0) -> dict[str, Any]:
        """The running state passed to every hook; ``scene_scale`` sizes 3D thresholds."""
        return {"scene_scale": float(scene_scale)}

    def check_sanity(self, params: Params, optimizers: Optimizers) -> None:
        """Raise ValueError unless every trainable parameter has its own one-group optimiser."""
        trainable = {name for name, p in params.items() if p.requires_grad}
        if trainable != set(optimizers):
            raise ValueError(
                f"trainable parameters {sorted(trainable)} and optimisers {sorted(optimizers)} "
                "must have the same keys"
            )
        for name, opt in optimizers.items():
            if len(opt.param_groups) != 1:
                raise ValueError(
                    f"optimiser {name!r} must have exactly one param group, "
                    f"got {len(opt.param_groups)}"
                )

    def step_pre_backward(self, *args, **kwargs) -> None:
        """Called after rendering, before ``loss.backward()``."""

    def step_post_backward(self, *args, **kwargs) -> None:
        """Called after ``loss.backward()``."""
