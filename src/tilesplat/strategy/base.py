"""The densification strategy interface: hooks a training loop calls around ``loss.backward()``.

The loop owns the steps; a strategy owns when and how the Gaussian set changes. Its running
state is a dict of tensors and numbers that a checkpoint stores as it is. The hooks take
gsplat 1.5.3's arguments, so loops written for gsplat run unchanged::

    strategy.step_pre_backward(params, optimizers, state, step, info)
    loss.backward()
    strategy.step_post_backward(params, optimizers, state, step, info, packed=packed)  # default
    strategy.step_post_backward(params, optimizers, state, step, info, lr=means_lr)    # MCMC

tilesplat's trainer builds its strategy from its config and calls it through the same hooks,
never asking which strategy it holds: each class says, as class attributes and methods, what
the trainer needs to know (the tilesplat extension below the gsplat hooks):

- ``CONFIG_DEFAULTS``: the values of the recipe's ``-1`` ("the strategy's") config keys;
- ``from_config(cfg, key_for_gradient)``: the strategy with the config's thresholds;
- ``config_errors(cfg)``: why a config cannot train with it;
- ``wants_absgrad()``: whether the render must compute ``absgrad``;
- ``post_backward(..., packed=, lr=)``: ``step_post_backward`` with the arguments it takes;
- ``share(rank, world_size)``: the strategy for one of ``world_size`` shards of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

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

    # --- what tilesplat's trainer asks (not part of gsplat's interface) -------------------

    # The values of the trainer's config keys left at -1 ("the strategy's"): the recipe's
    # initial opacity and size and its regularisers (TrainConfig.resolved).
    CONFIG_DEFAULTS: ClassVar[dict[str, float]] = {
        "init_opacity": 0.1,
        "init_scale": 1.0,
        "opacity_reg": 0.0,
        "scale_reg": 0.0,
    }

    @classmethod
    def from_config(cls, cfg: Any, key_for_gradient: str = "means2d") -> Strategy:
        """The strategy with the thresholds of a ``tilesplat.train.TrainConfig``;
        ``key_for_gradient`` is the render meta key of the screen-space means."""
        return cls()

    @classmethod
    def config_errors(cls, cfg: Any) -> list[str]:
        """Why ``cfg`` (a ``TrainConfig``) cannot train with this strategy (empty: it can)."""
        return []

    def wants_absgrad(self) -> bool:
        """Whether the render must put ``absgrad`` on the screen-space means."""
        return False

    def post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        *,
        packed: bool,
        lr: float,
    ) -> None:
        """``step_post_backward`` with the arguments this strategy takes, as gsplat's
        simple_trainer passes them: ``packed`` (how ``info`` was rendered) and ``lr`` (the
        means' learning rate of the step)."""
        self.step_post_backward(params, optimizers, state, step, info)

    def share(self, rank: int, world_size: int) -> Strategy:
        """The strategy of rank ``rank``'s shard when ``world_size`` ranks each densify a
        shard of the model (model-parallel training): itself, unless a limit of the whole
        model must be split between the shards."""
        return self
