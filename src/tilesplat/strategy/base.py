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

- ``KEYS``: the trainer's config keys it reads (:class:`tilesplat.keys.Key`, declared here
  beside the fields they set), and ``from_config(cfg, key_for_gradient)``: the strategy with
  the config's thresholds;
- ``PRESET``: the values choosing it sets for keys of the trainer it does not own (its
  recipe's initial opacity and size, its regularisers), before the other keys given with it;
- ``config_errors(cfg)``: why a config cannot train with it;
- ``wants_absgrad()``: whether the render must compute ``absgrad``, and
  ``gradients_read_until()``: the step from which ``step_post_backward`` reads no
  screen-space gradient (the trainer's renders leave ``absgrad`` out from there);
- ``POST_BACKWARD_ARGS``: which of the step's ``packed`` and ``lr`` its
  ``step_post_backward`` takes (``post_backward`` passes them);
- ``share(rank, world_size)``: the strategy for one of ``world_size`` shards of the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..keys import Key

Params = dict[str, torch.nn.Parameter] | torch.nn.ParameterDict
Optimizers = dict[str, torch.optim.Optimizer]

REQUIRED_PARAMS = ("means", "scales", "quats", "opacities")

# the trainer's keys of the densification schedule that every strategy of this package reads
REFINE_START = Key("refine_start", 500, "first step that densifies", ge=0)
REFINE_STOP = Key("refine_stop", 1500, "no densification from this step on", ge=0)
REFINE_EVERY = Key("refine_every", 100, "densify every n steps", ge=1)
PRUNE_OPACITY = Key("prune_opacity", 0.005, "prune (default, budget) or relocate (mcmc) below "
                    "this opacity", ge=0.0, lt=0.5)
SCHEDULE_KEYS = (REFINE_START, REFINE_STOP, REFINE_EVERY, PRUNE_OPACITY)


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

    def acts_at(self, step: int) -> bool:
        """Whether ``step_post_backward`` at ``step`` may change the model or its optimisers
        (densify, prune, relocate, reset, add noise) rather than only accumulate statistics
        from ``info``; True unless the strategy knows better. The trainer settles a step
        whose render may have to be redone (``train/step/capacity.py``) before such a call."""
        return True

    def row_state(self, state: dict[str, Any]) -> list[str]:
        """The keys of ``state`` that hold one row per Gaussian, which an edit of the rows
        (the trainer's spatial sort, ``strategy.ops.reorder``) permutes with them: every
        tensor of at least one dimension, unless the strategy knows better."""
        return [k for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() >= 1]


    # the keyword arguments of step_post_backward among the step's "packed" (how the meta was
    # rendered) and "lr" (the means' learning rate), as gsplat's simple_trainer passes them
    POST_BACKWARD_ARGS: ClassVar[tuple[str, ...]] = ()
    # the trainer's config keys the strategy reads (from_config)
    KEYS: ClassVar[tuple[Key, ...]] = ()
    # what choosing it sets of the trainer's other keys (none: 3DGS's recipe, the defaults)
    PRESET: ClassVar[dict[str, Any]] = {}

    @classmethod
    def from_config(cls, cfg: Any, key_for_gradient: str = "means2d") -> Strategy:
        """The strategy with the thresholds of a ``tilesplat.train.TrainConfig`` (its
        :attr:`KEYS`); ``key_for_gradient`` is the render meta key of the screen-space means,
        for a strategy that reads their gradient."""
        return cls()

    @classmethod
    def config_errors(cls, cfg: Any) -> list[str]:
        """Why ``cfg`` (a ``TrainConfig``) cannot train with this strategy (empty: it can)."""
        return []

    def wants_absgrad(self) -> bool:
        """Whether the render must put ``absgrad`` on the screen-space means."""
        return False

    def gradients_read_until(self) -> int | None:
        """The first step from which ``step_post_backward`` reads no gradient of the
        screen-space means (``.grad``, ``.absgrad``) any more; None: it may at every step."""
        return None

    def post_backward(self, *hook_args: Any, packed: bool, lr: float) -> None:
        """``step_post_backward(params, optimizers, state, step, info)`` (``hook_args``) with
        those of ``packed`` (how ``info`` was rendered) and ``lr`` (the means' learning rate of
        the step) that :attr:`POST_BACKWARD_ARGS` names."""
        given = {"packed": packed, "lr": lr}
        self.step_post_backward(*hook_args, **{k: given[k] for k in self.POST_BACKWARD_ARGS})

    def for_images(self, pixels: int) -> Strategy:
        """The strategy for training images of at most ``pixels`` pixels each: itself, unless
        a limit of it scales with the image size."""
        return self

    def share(self, rank: int, world_size: int) -> Strategy:
        """The strategy of rank ``rank``'s shard when ``world_size`` ranks each densify a
        shard of the model (model-parallel training): itself, unless a limit of the whole
        model must be split between the shards."""
        return self
