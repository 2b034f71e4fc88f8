"""Appearance compensation (``post_processing``): a learned colour transform per training image.

Photos of one scene differ in exposure and white balance; a model fit to them as they are
learns floaters and view-dependent colour to explain the differences. With ``post_processing``
on, every training image gets a colour transform of its own, applied to the render before the
loss and learned with the model (gsplat's ``post_processing``, after Wang et al. 2024):

- ``bilateral_grid``: a bilateral grid of 3 x 4 affine transforms per image
  (``bilateral_grid.py``; ``bilateral_grid_shape`` cells), with a total-variation loss of
  weight ``bilateral_grid_tv`` on the grids of the step's images;
- ``affine``: one 3 x 4 transform [A | b] per image (12 numbers instead of 12 x X x Y x W).

Both start at the identity and have their own Adam (eps 1e-15, as gsplat's) at ``*_lr`` x
sqrt(batch_size), its rate rising linearly from 1% over ``post_processing_warmup`` steps and
decaying exponentially to 1% by the last step (gsplat's schedule; a function of the step
alone, so a resumed run continues with the same rates). The rate and the warm-up are gsplat's
for a 30,000-step run, scaled to the run's length, and ``bilateral_grid_shape = "auto"``
follows the image size (``appearance_settings.py``). After every step the mean over the images
of the transforms' departure from the identity is removed (``post_processing_zero_mean``): a
change every photo shares is the scene's colour, for the model to hold; without it the
model's colours drift to a scale of no photo (the transforms and the model trade a common
factor freely) and the plain test PSNR falls (the outward capture, 80 x 60, 300 steps: 24.5
-> 17.4 dB). The transforms explain each photo's colours, so the model keeps the colours
common to all of them; the test views, which have no transform, are rendered as the model
is (``evaluate.py``), and scored plainly and after a least-squares colour fit (``cc_psnr``,
``metrics.py``), since the model's colours are those of no photo in particular.

The transforms run after the render in plain PyTorch, on the training device, with every
backend. They are checkpointed with their Adam state, and ``appearance.json`` in the run
folder gives each training image's transform (the grid's mean transform for
``bilateral_grid``). In a data-parallel job (``parallel = "data"``) every rank holds all the
transforms and renders its share of the step's images: the transforms' gradients are averaged
over the ranks before their Adam step, as the Gaussians' are, so that the ranks stay equal and
train as one process does. A model-parallel job is refused (each rank renders a shard of the
Gaussians; the transforms apply to the whole render, not to a shard's part of it).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from ...devices import to_device
from ...io.atomic import atomic_write_bytes
from ...keys import Key
from ..parallel.base import needs_whole_model
from .appearance_settings import lr_factor, parse_grid_shape, rate_scale, warmup_steps
from .base import Feature, register_feature, restore_learned
from .bilateral_grid import (
    apply_affine,
    apply_grids,
    identity_affines,
    identity_grids,
    total_variation,
)

if TYPE_CHECKING:
    from ...data.dataset import SceneDataset
    from ..config import TrainConfig
    from ..models.base import Cameras, Render

ADAM_EPS = 1e-15
FILE = "appearance.json"


# post_processing -> the registered feature of that mode (register_mode)
MODES: dict[str, type[ColourTransforms]] = {}

POST_PROCESSING = Key(
    "post_processing", "none", "appearance compensation of the training images (exposure, white "
    "balance): none, or a registered mode: bilateral_grid (a grid of affine colour transforms "
    "per training image, sliced by pixel position and luminance, as gsplat's); affine (one "
    "3x3 matrix and offset per training image); learned with the model, applied to its "
    "renders before the loss, never to the test views (docs/training.md, Appearance "
    "compensation)", choices=lambda: ("none", *MODES))
WARMUP = Key(
    "post_processing_warmup", 1000, "post_processing: the transforms' learning rate rises "
    "linearly from 1% over this many steps of a run of post_processing_lr_steps (gsplat's "
    "1000 of 30,000; the same share of a run of any length), then decays exponentially to 1% "
    "by the last step", ge=0)
LR_STEPS = Key(
    "post_processing_lr_steps", 30_000, "post_processing: the run length the transforms' rate "
    "and warm-up are meant for (gsplat's 30,000 steps): a run of `steps` gets the rate times "
    "sqrt(post_processing_lr_steps / steps) (at most 10x) and the warm-up's share of the run; "
    "0: both as given", ge=0)
ZERO_MEAN = Key(
    "post_processing_zero_mean", True, "post_processing: after every step, remove the mean over "
    "the training images of the transforms' departure from the identity (the gauge fix: the "
    "model keeps the colours of the average photo, not a drifting scale of them)")


def register_mode(cls: type[ColourTransforms]) -> type[ColourTransforms]:
    """Class decorator: a ``post_processing`` mode (its value ``cls.mode``), registered as a
    feature."""
    MODES[cls.mode] = cls
    return register_feature(cls)


class ColourTransforms(Feature):
    """A learned colour transform per training image (the base of both modes).

    Attributes:
        values: [N, ...] the transforms of the N training images (a leaf tensor).
    """

    mode: ClassVar[str] = ""
    name = "appearance"
    KEYS: ClassVar[tuple[Key, ...]] = (POST_PROCESSING, WARMUP, LR_STEPS, ZERO_MEAN)

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        errors = cls.key_errors(cfg)
        if cfg.post_processing != cls.mode:
            return errors
        return errors + needs_whole_model(cfg, f"post_processing = {cls.mode!r}", "a rank "
                                          "renders a shard of the Gaussians, the transforms "
                                          "apply to the whole render")

    @classmethod
    def key_errors(cls, cfg: TrainConfig) -> list[str]:
        """The errors of the mode's own keys (checked whether it is on or not)."""
        return []

    @classmethod
    def initial(cls, cfg: TrainConfig, n: int, device: torch.device, size: tuple[int, int]
                ) -> Tensor:
        """[n, ...] the identity transforms of ``n`` images of ``size`` (width, height)."""
        raise NotImplementedError

    @classmethod
    def learning_rate(cls, cfg: TrainConfig) -> float:
        raise NotImplementedError

    @classmethod
    def from_config(
        cls, cfg: TrainConfig, dataset: SceneDataset, device: torch.device
    ) -> ColourTransforms | None:
        if cfg.post_processing != cls.mode:
            return None
        size = (max(f.width for f in dataset.train), max(f.height for f in dataset.train))
        return cls(cfg, [f.name for f in dataset.train], device, size)

    def __init__(self, cfg: TrainConfig, names: list[str], device: torch.device,
                 size: tuple[int, int]) -> None:
        self.names = names
        self.values = self.initial(cfg, len(names), device, size).requires_grad_(True)
        self.identity = self.initial(cfg, 1, device, size)
        lr_steps = cfg.post_processing_lr_steps
        self.base_lr = (self.learning_rate(cfg) * math.sqrt(cfg.batch_size)
                        * rate_scale(cfg.steps, lr_steps))
        self.warmup = warmup_steps(cfg.post_processing_warmup, cfg.steps, lr_steps)
        self.steps = cfg.steps
        self.opt = torch.optim.Adam([self.values], lr=self.base_lr, eps=ADAM_EPS)
        self.zero_mean = cfg.post_processing_zero_mean and len(names) > 1

    def views(self, batch: Cameras) -> Tensor:
        """The batch's training-image indices [C]."""
        views = getattr(batch, "views", None)
        if views is None:
            raise ValueError(f"post_processing = {self.mode!r} needs the batch's training views")
        return views.to(self.values.device)

    def parameters(self) -> list[Tensor]:
        """The transforms: each rank of a data-parallel job saw its share of the images, and
        the step's gradient is the mean of the ranks' (each rank's loss is the mean over its
        share)."""
        return [self.values]

    def optimizer_step(self, step: int) -> None:
        for group in self.opt.param_groups:
            group["lr"] = self.base_lr * lr_factor(step, self.warmup, self.steps)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        if self.zero_mean:
            with torch.no_grad():
                # the identity is the mean of the initial values; what the images share moves
                # to the model, which then holds the average photo's colours
                self.values -= self.values.mean(dim=0, keepdim=True) - self.identity

    def state_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "values": self.values.detach().cpu().clone(),
            "adam": to_device(copy.deepcopy(self.opt.state_dict()), "cpu"),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        values = state.get("values")
        if state.get("mode") != self.mode:
            raise ValueError(
                f"the checkpoint's appearance state is of post_processing = "
                f"{state.get('mode')!r}, the config has {self.mode!r}"
            )
        restore_learned(f"post_processing = {self.mode!r}: the transforms", self.values, values,
                        self.opt, state.get("adam"))

    def affines(self) -> Tensor:
        """[N, 3, 4] each image's transform (its mean over the grid for a bilateral grid)."""
        raise NotImplementedError

    def write(self, run_dir: Path) -> None:
        mats = self.affines().detach().cpu().double()
        doc = {
            "post_processing": self.mode,
            "note": "each training image's colour transform [A | b] (rgb -> A @ rgb + b)"
            + (", the mean over its bilateral grid" if self.mode == "bilateral_grid" else ""),
            "views": [{"name": n, "transform": m.tolist()}
                      for n, m in zip(self.names, mats, strict=True)],
        }
        atomic_write_bytes(Path(run_dir) / FILE, json.dumps(doc, indent=1).encode("utf-8"))


@register_mode
class BilateralGridFeature(ColourTransforms):
    """``post_processing = "bilateral_grid"``: values [N, 12, W, Y, X]."""

    mode = "bilateral_grid"
    name = "bilateral_grid"
    KEYS = (
        *ColourTransforms.KEYS,
        Key("bilateral_grid_shape", "auto", "bilateral_grid: cells across, down and in "
            "luminance, 'X,Y,W' (gsplat's 16,16,8), or auto: a cell per 40 pixels or more across "
            "and down (the whole cells that fit, 1 to 16) and half as many luminance cells (4 "
            "to 8); 16,16,8 from 640 pixels"),
        Key("bilateral_grid_lr", 2e-3, "bilateral_grid: Adam learning rate of the grids, times "
            "sqrt(batch_size)", ge=0.0),
        Key("bilateral_grid_tv", 10.0, "bilateral_grid: weight of the grids' total-variation "
            "loss (gsplat's 10)", ge=0.0),
    )

    @classmethod
    def key_errors(cls, cfg: TrainConfig) -> list[str]:
        try:
            parse_grid_shape(cfg.bilateral_grid_shape)
        except ValueError as exc:
            return [str(exc)]
        return []

    @classmethod
    def initial(cls, cfg: TrainConfig, n: int, device: torch.device, size: tuple[int, int]
                ) -> Tensor:
        return identity_grids(n, parse_grid_shape(cfg.bilateral_grid_shape, size), device)

    @classmethod
    def learning_rate(cls, cfg: TrainConfig) -> float:
        return cfg.bilateral_grid_lr

    def __init__(self, cfg: TrainConfig, names: list[str], device: torch.device,
                 size: tuple[int, int]) -> None:
        super().__init__(cfg, names, device, size)
        self.tv_weight = cfg.bilateral_grid_tv

    def colors(self, colors: Tensor, batch: Cameras, step: int) -> Tensor:
        return apply_grids(self.values[self.views(batch)], colors)

    def loss(self, out: Render, batch: Cameras, step: int) -> Tensor | None:
        if self.tv_weight == 0.0:
            return None
        # the grids of the step's images: each grid is regularised when its image is seen,
        # which costs the same whatever the number of training images
        return self.tv_weight * total_variation(self.values[self.views(batch)])

    def affines(self) -> Tensor:
        return self.values.mean(dim=(2, 3, 4)).reshape(-1, 3, 4)


@register_mode
class AffineFeature(ColourTransforms):
    """``post_processing = "affine"``: values [N, 3, 4]."""

    mode = "affine"
    name = "affine"
    KEYS = (*ColourTransforms.KEYS, Key(
        "affine_lr", 2e-3, "affine: Adam learning rate of the colour transforms, times "
        "sqrt(batch_size)", ge=0.0))

    @classmethod
    def initial(cls, cfg: TrainConfig, n: int, device: torch.device, size: tuple[int, int]
                ) -> Tensor:
        return identity_affines(n, device)

    @classmethod
    def learning_rate(cls, cfg: TrainConfig) -> float:
        return cfg.affine_lr

    def colors(self, colors: Tensor, batch: Cameras, step: int) -> Tensor:
        return apply_affine(self.values[self.views(batch)][:, None, None], colors)

    def affines(self) -> Tensor:
        return self.values
