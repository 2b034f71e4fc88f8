"""One optimisation step of the trainer: render, photometric loss, backward, fused Adam.

``tilesplat train`` (:meth:`Trainer.train_step`) and the bench's replay of a training run
(``tilesplat bench --scene run:RUN_DIR``) both call :func:`optimization_step`, so that the
replay measures the trainer's own code. Densification stays outside: the trainer passes its
strategy's ``step_pre_backward`` as ``before_backward`` and calls ``step_post_backward`` on
the result; the replay passes hooks that time or capture gradients.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from ..data.dataset import Frame
from ..ops.deferred_checks import FiniteFlag, deferred_finite_checks
from .config import TrainConfig
from .features import Feature
from .masks import batch_masks, exclude_masked, masks_to, photometric_loss
from .models import Cameras, ModelKind, model_kind
from .splats import (
    Optimizers,
    Params,
    make_optimizers,
    make_params,
    means_rate,
    set_learning_rates,
)

# Called with the rasterizer's meta dict (``means2d``, ``conics``, ``radii``, ...).
InfoHook = Callable[[dict[str, Any]], None]


class StageClock(Protocol):
    """Anything with a ``stage(name)`` context manager (the bench's ``StageTimer``)."""

    def stage(self, name: str) -> contextlib.AbstractContextManager[None]: ...


class _NoClock:
    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


STEP_STAGES = ("render", "loss", "backward", "adam")


@dataclass
class Batch(Cameras):
    """The cameras and images of one step, on one device.

    Attributes:
        viewmats: [C, 4, 4] world-to-camera; Ks: [C, 3, 3] intrinsics.
        backgrounds: [C, 3] the colour each render is composited on.
        target: [C, H, W, 3] images in [0, 1], composited on ``backgrounds``.
        masks: [C, H, W] bool, the pixels the loss counts (``train/masks.py``), or None.
        views: [C] long, the training-image index of each camera (what per-image features,
            ``train/features.py``, index), or None where the batch is not of training images.
    """

    backgrounds: Tensor
    target: Tensor
    masks: Tensor | None = None
    views: Tensor | None = None

    def to(self, device: torch.device | str) -> Batch:
        """This batch on ``device``."""
        return dataclasses.replace(
            self,
            viewmats=self.viewmats.to(device),
            Ks=self.Ks.to(device),
            backgrounds=self.backgrounds.to(device),
            target=self.target.to(device),
            masks=masks_to(self.masks, device),
            views=None if self.views is None else self.views.to(device),
        )


def recomposite(image: Tensor, alpha: Tensor, old_bg: Tensor, new_bg: Tensor) -> Tensor:
    """Images composited on ``old_bg`` [3], recomposited on ``new_bg`` [C, 3].

    image: [C, H, W, 3] = rgb * alpha + old_bg * (1 - alpha); alpha: [C, H, W, 1].
    """
    return image + (new_bg - old_bg)[:, None, None, :] * (1.0 - alpha)


def make_batch(
    frames: Sequence[Frame],
    background: Tensor,
    random_background: bool,
    views: Sequence[int] | None = None,
) -> Batch:
    """The batch of ``frames`` (one image size); ``background`` [3] is the dataset's;
    ``views``: the frames' training-image indices (:attr:`Batch.views`).

    With ``random_background`` every camera gets a colour from the global torch RNG (one
    ``torch.rand(C, 3)`` draw on the CPU, whatever the device) and the targets with alpha are
    recomposited on it. The images and backgrounds are on the images' device; the cameras
    on theirs (see :meth:`Batch.to`).
    """
    viewmats = torch.stack([f.viewmat for f in frames]).float()
    Ks = torch.stack([f.K for f in frames]).float()
    target = torch.stack([f.image for f in frames]).float()  # [C, H, W, 3]
    background = background.to(target.device)
    n_cams = len(frames)
    if random_background:
        bg = torch.rand(n_cams, 3).to(target.device)
        if all(f.alpha is not None for f in frames):
            alpha = torch.stack([f.alpha for f in frames]).float()  # [C, H, W, 1]
            target = recomposite(target, alpha, background, bg)
    else:
        bg = background.expand(n_cams, 3)
    models = {f.camera_model for f in frames}
    if len(models) > 1:
        raise ValueError(f"a batch needs frames of one camera model, got {sorted(models)}")
    return Batch(viewmats=viewmats, Ks=Ks, width=frames[0].width, height=frames[0].height,
                 backgrounds=bg.contiguous(), target=target, camera_model=models.pop(),
                 masks=batch_masks([f.mask for f in frames]),
                 views=None if views is None else torch.tensor(list(views), dtype=torch.long))


class CameraOrder:
    """Training-frame indices of each step: epochs of seeded permutations of ``n`` frames.

    A function of (seed, step) only, so a resumed run and a replay see the cameras the
    trainer saw; the permutation of the current epoch is cached.
    """

    def __init__(self, n: int, batch_size: int, seed: int) -> None:
        if n < 1:
            raise ValueError("the dataset has no training images")
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self._epoch = -1
        self._perm: list[int] = []  # a list: a step reads no tensor element

    def indices(self, step: int) -> list[int]:
        """The ``batch_size`` frame indices of ``step``."""
        out = []
        for b in range(self.batch_size):
            flat = step * self.batch_size + b
            epoch = flat // self.n
            if epoch != self._epoch:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._perm = torch.randperm(self.n, generator=gen).tolist()
                self._epoch = epoch
            out.append(self._perm[flat % self.n])
        return out


def sh_degree_at(cfg: TrainConfig, step: int) -> int:
    """The SH degree in use at ``step``: one more every ``sh_degree_interval`` steps."""
    return min(step // cfg.sh_degree_interval, cfg.sh_degree)


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
        loss = loss + cfg.opacity_reg * mean(torch.sigmoid(params["opacities"]))
    if cfg.scale_reg > 0.0:
        loss = loss + cfg.scale_reg * mean(torch.exp(params["scales"]))
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
    cfg: TrainConfig,
    step: int,
    scene_scale: float,
    *,
    model: ModelKind | None = None,
    absgrad: bool = False,
    before_backward: InfoHook | None = None,
    after_backward: InfoHook | None = None,
    clock: StageClock | None = None,
    distributed: bool = False,
    loss_share: tuple[float, int] | None = None,
    features: Sequence[Feature] = (),
    finite: FiniteFlag | None = None,
    set_rates: bool = True,
) -> StepResult:
    """Render ``batch``, take the training loss, backward, one Adam step per parameter.

    ``model`` is the model kind that renders and regularises (default: the config's).
    ``before_backward`` runs after rendering (the strategy's ``step_pre_backward``, or a hook
    that retains intermediate gradients); ``after_backward`` runs when the gradients are in
    ``params[name].grad``, before Adam consumes them. ``clock`` times the stages
    ``render``, ``loss``, ``backward`` and ``adam``. ``distributed`` renders a shard of a
    model-parallel job (``rasterization(distributed=True)``) and ``loss_share`` weighs its
    loss (:func:`training_loss`). ``features`` act around the render, in order
    (``train/features.py``): on the cameras before it, on the colours after it, with loss
    terms, and with their own optimiser steps after the Gaussians'. The result's ``colors``
    are what the loss compared with the targets (the render after the features' colour
    transforms). With ``finite`` the ops' NaN/Inf checks record into that flag instead of
    reading their result (``ops/deferred_checks.py``), and the Gaussians' Adam steps take
    it as ``found_inf``: a step with a non-finite input changes no parameter and no moment,
    and the caller reads the flag later. ``set_rates=False`` leaves the learning rates as
    they are (a CUDA graph's capture: the caller fills the rate tensors before each replay).
    """
    checks = (contextlib.nullcontext() if finite is None
              else deferred_finite_checks(finite))
    with checks:
        clock = clock if clock is not None else _NoClock()
        model = model if model is not None else model_kind(cfg)
        with clock.stage("render"):
            cams = batch
            for f in features:
                cams = f.cameras(cams, step)
            out = model.render(params, cams, cfg, sh_degree_at(cfg, step), step=step,
                               absgrad=absgrad, distributed=distributed,
                               expected_depth=any(f.needs_expected_depth for f in features))
            colors, info = out.colors, out.info
        if before_backward is not None:
            before_backward(info)
        with clock.stage("loss"):
            seen = colors
            for f in features:
                seen = f.colors(seen, cams, step)
            loss = training_loss(params, seen, batch.target, cfg, loss_share, batch.masks)
            extra = model.regularisation(out, cfg, step)
            if extra is not None:
                loss = loss + extra
            for f in features:
                term = f.loss(out, cams, step)
                if term is not None:
                    loss = loss + term
        with clock.stage("backward"):
            loss.backward()
        if after_backward is not None:
            after_backward(info)
        info = exclude_masked(info, batch.masks, model.gradient_key)  # hidden pixels: not seen
        with clock.stage("adam"):
            means_lr = (set_learning_rates(optimizers, cfg, scene_scale, step) if set_rates
                        else means_rate(cfg, scene_scale, step))
            found_inf = None if finite is None else finite.found_inf(params["means"].device)
            for opt in optimizers.values():
                if found_inf is not None:
                    opt.found_inf = found_inf  # fused Adam skips the step on the device
                opt.step()
                if found_inf is not None:
                    del opt.found_inf
                opt.zero_grad(set_to_none=True)
            for f in features:
                f.optimizer_step(step)
        return StepResult(loss.detach(), seen.detach(), info, means_lr)


def restore_model(
    ckpt: dict[str, Any], cfg: TrainConfig, device: torch.device | str = "cpu"
) -> tuple[Params, Optimizers]:
    """Parameters and Adam states of a checkpoint, on ``device``.

    Raises:
        ValueError: the checkpoint lacks a parameter or an optimiser state.
    """
    params = make_params(ckpt["params"], device=device)
    optimizers = make_optimizers(params, cfg, float(ckpt["scene_scale"]))
    states = ckpt.get("optimizers")
    if not isinstance(states, dict):
        raise ValueError("checkpoint has no optimizer states")
    for name, opt in optimizers.items():
        st = states.get(name)
        if not isinstance(st, dict) or not isinstance(st.get("state"), dict):
            raise ValueError(f"checkpoint has no optimizer state for {name!r}")
        for moments in st["state"].values():
            for key in ("exp_avg", "exp_avg_sq"):
                m = moments.get(key) if isinstance(moments, dict) else None
                if m is not None and (not isinstance(m, Tensor) or m.shape != params[name].shape):
                    raise ValueError(f"optimizer state {name}.{key} does not match the parameter")
        try:
            opt.load_state_dict(st)  # moves the moments to the parameter's device
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"optimizer state of {name!r} does not load: {exc}") from None
    return params, optimizers
