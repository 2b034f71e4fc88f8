"""One optimisation step: render, loss, backward, the ranks' gradients, Adam, in that order.

:func:`optimization_step` is the step ``tilesplat train`` runs (through
:class:`.runner.StepRunner`) and the bench replays (``tilesplat bench --scene run:RUN_DIR``), so
that the replay measures the trainer's own code. Every behaviour is an argument or a field of
its :class:`StepPlan`: the model kind that renders and regularises, the features around the
render, the parallel mode that weighs the loss and combines the gradients, the strategy's hook
before backward. Densification stays outside: the runner calls the strategy's
``step_post_backward`` on the result.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch import Tensor

from ...keys import Key
from ...ops import elementwise
from ...ops.deferred_checks import FiniteFlag, deferred_finite_checks
from .. import seams
from ..config import TrainConfig
from ..features.base import Feature
from ..features.resolution import downscale_factor
from ..models import ModelKind
from ..models.base import sh_degree_at
from ..models.splats import Optimizers, Params, means_rate, set_learning_rates
from ..parallel.base import Parallel, SingleProcess
from .batch import Batch
from .masks import exclude_masked, photometric_loss

KEYS = (
    Key("ssim_lambda", 0.2, "loss = (1 - l) * L1 + l * (1 - SSIM)", ge=0.0, le=1.0),
    Key("opacity_reg", 0.0, "weight of mean(opacity) in the loss (strategy = mcmc sets 0.01)",
        ge=0.0),
    Key("scale_reg", 0.0, "weight of mean(scale) in the loss (strategy = mcmc sets 0.01)",
        ge=0.0),
)
seams.register_keys("the loss (train/step/optimization.py)", KEYS)

# Called with the step and the rasterizer's meta dict (``means2d``, ``conics``, ``radii``, ...).
InfoHook = Callable[[int, dict[str, Any]], None]


class StageClock(Protocol):
    """Anything with a ``stage(name)`` context manager (the bench's ``StageTimer``)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class _NoClock:
    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


STEP_STAGES = ("render", "loss", "backward", "adam")


@dataclass
class StepPlan:
    """What a step does besides the model it changes; made once per run (or replay).

    Attributes:
        cfg: the run's config (rates, loss weights, SH schedule, render settings).
        model: the model kind that renders and regularises.
        scene_scale: the scale the means' learning rate is relative to.
        features: act around the render, in order (``train/features/base.py``): on the cameras
            before it, on the colours after it, with loss terms, with their own optimiser steps
            after the Gaussians'.
        parallel: this process's rank: whether it renders a shard of a model-parallel job
            (``rasterization(distributed=True)``), how its loss is weighed, how the ranks'
            gradients are combined.
        absgrad: whether the render computes ``absgrad`` (the strategy grows by it).
        absgrad_stop: the first step whose render leaves ``absgrad`` out, because the strategy
            reads it no more (:meth:`~tilesplat.strategy.base.Strategy.gradients_read_until`:
            its densification has ended); None: every step computes it.
        image_pixels: the pixels of the largest training image (the resolution schedule's
            span follows it: ``train/features/resolution.py``).
        before_backward: ``(step, info)`` after the loss, before backward (the strategy's
            ``step_pre_backward``, or the bench's hook that retains gradients).
        after_backward: ``(step, info)`` once the gradients are combined, before Adam (the
            bench captures them).
    """

    cfg: TrainConfig
    model: ModelKind
    scene_scale: float
    features: Sequence[Feature] = ()
    parallel: Parallel = field(default_factory=SingleProcess)
    absgrad: bool = False
    absgrad_stop: int | None = None
    image_pixels: int = 0
    before_backward: InfoHook | None = None
    after_backward: InfoHook | None = None

    def downscale_factor(self, step: int) -> int:
        """The resolution schedule's factor at ``step`` for this run's images (1: full size)."""
        return downscale_factor(self.cfg, step, self.image_pixels)


def training_loss(
    params: Params,
    colors: Tensor,
    target: Tensor,
    cfg: TrainConfig,
    share: tuple[float, int] | None = None,
    masks: Tensor | None = None,
) -> Tensor:
    """The photometric loss of ``colors`` [C, H, W, 3] over the pixels ``masks`` [C, H, W]
    keeps (all for None) plus the opacity / scale terms.

    ``share`` = (fraction of the batch's cameras, total Gaussian count) for one shard of a
    model-parallel job: the photometric loss is weighted by the fraction and the terms are
    sums over the shard divided by the total, so the ranks' losses add up to the whole
    batch's loss over the whole model.
    """
    loss, _ = photometric_loss(colors, target, masks, cfg.ssim_lambda, cfg.backend)
    views, n_total = (1.0, None) if share is None else share
    if views != 1.0:
        loss = loss * views

    def mean(t: Tensor) -> Tensor:  # [N, ...] -> the mean over the whole model
        return t.mean() if n_total is None else t.sum() / (n_total * math.prod(t.shape[1:]))

    if cfg.opacity_reg > 0.0:
        loss = loss + cfg.opacity_reg * mean(elementwise.sigmoid(params["opacities"]))
    if cfg.scale_reg > 0.0:
        loss = loss + cfg.scale_reg * mean(elementwise.exp(params["scales"]))
    return loss


@dataclass
class StepResult:
    """What one step leaves: ``loss`` [] and ``colors`` [C, H, W, 3] (detached), the
    rasterizer's meta ``info``, and the means' learning rate the step used."""

    loss: Tensor
    colors: Tensor
    info: dict[str, Any]
    means_lr: float


def optimization_step(
    params: Params,
    optimizers: Optimizers,
    batch: Batch,
    plan: StepPlan,
    step: int,
    *,
    finite: FiniteFlag | None = None,
    set_rates: bool = True,
    clock: StageClock | None = None,
) -> StepResult:
    """Render ``batch``, take the training loss, backward, combine the ranks' gradients, one
    Adam step per parameter, then the features' optimiser steps.

    ``clock`` times the stages ``render``, ``loss``, ``backward`` and ``adam``. The result's
    ``colors`` are what the loss compared with the targets (the render after the features'
    colour transforms). With ``finite`` the ops' NaN/Inf checks record into that flag instead
    of reading their result (``ops/deferred_checks.py``), and the Gaussians' Adam steps take
    it as ``found_inf``: a step with a non-finite input changes no parameter and no moment,
    and the caller reads the flag later. ``set_rates=False`` leaves the learning rates as
    they are (a CUDA graph's capture: the caller fills the rate tensors before each replay).
    """
    cfg, features = plan.cfg, plan.features
    clock = clock if clock is not None else _NoClock()
    checks = contextlib.nullcontext() if finite is None else deferred_finite_checks(finite)
    with checks:
        share = plan.parallel.loss_share(plan.parallel.n_gaussians(len(params["means"])))
        with clock.stage("render"):
            cams = batch
            for f in features:
                cams = f.cameras(cams, step)
            absgrad = plan.absgrad and (plan.absgrad_stop is None or step < plan.absgrad_stop)
            out = plan.model.render(
                params, cams, cfg, sh_degree_at(cfg, step), step=step, absgrad=absgrad,
                distributed=plan.parallel.render_distributed,
                expected_depth=any(f.needs_expected_depth for f in features))
        if plan.before_backward is not None:
            plan.before_backward(step, out.info)
        with clock.stage("loss"):
            seen = out.colors
            for f in features:
                seen = f.colors(seen, cams, step)
            loss = training_loss(params, seen, batch.target, cfg, share, batch.masks)
            extra = plan.model.regularisation(out, cfg, step)
            if extra is not None:
                loss = loss + extra
            for f in features:
                term = f.loss(out, cams, step)
                if term is not None:
                    loss = loss + term
        with clock.stage("backward"):
            loss.backward()
        plan.parallel.reduce_gradients([*params.values(), *(t for f in features
                                                            for t in f.parameters())])
        if plan.after_backward is not None:
            plan.after_backward(step, out.info)
        info = exclude_masked(out.info, batch.masks, plan.model.gradient_key)  # hidden: unseen
        with clock.stage("adam"):
            means_lr = (set_learning_rates(optimizers, cfg, plan.scene_scale, step) if set_rates
                        else means_rate(cfg, plan.scene_scale, step))
            _adam_steps(optimizers, None if finite is None
                        else finite.found_inf(params["means"].device))
            for f in features:
                f.optimizer_step(step)
        return StepResult(loss.detach(), seen.detach(), info, means_lr)


def _adam_steps(optimizers: Optimizers, found_inf: Tensor | None) -> None:
    """One step of each Adam; with ``found_inf`` (a device flag) fused Adam skips the step on
    the device when it is set."""
    for opt in optimizers.values():
        if found_inf is not None:
            opt.found_inf = found_inf  # type: ignore[attr-defined]
        opt.step()
        if found_inf is not None:
            del opt.found_inf  # type: ignore[attr-defined]
        opt.zero_grad(set_to_none=True)
