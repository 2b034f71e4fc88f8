"""The batch of one step: its cameras, target images, masks and training-image indices, and the
order in which the steps see the training images."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ...data.dataset import Frame
from ...data.lens import stacked
from ...keys import Key
from .. import seams
from ..models import Cameras
from ..models.base import lens_to
from .masks import batch_masks, masks_to

KEYS = (Key("random_background", False, "render on a random background each step (the target is "
            "recomposited when the images have alpha) to discourage transparency"),)
seams.register_keys("the batch (train/step/batch.py)", KEYS)


@dataclass
class Batch(Cameras):
    """The cameras and images of one step, on one device.

    Attributes:
        viewmats: [C, 4, 4] world-to-camera; Ks: [C, 3, 3] intrinsics.
        backgrounds: [C, 3] the colour each render is composited on.
        target: [C, H, W, 3] images in [0, 1], composited on ``backgrounds``.
        masks: [C, H, W] bool, the pixels the loss counts (``train/step/masks.py``), or None.
        views: [C] long, the training-image index of each camera (what per-image features,
            ``train/features/base.py``, index), or None where the batch is not of training images.
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
            lens=lens_to(self.lens, device),
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
    pixels = [f.image_and_alpha() for f in frames]  # one decode each, as f.image alone
    target = torch.stack([image for image, _ in pixels]).float()  # [C, H, W, 3]
    background = background.to(target.device)
    n_cams = len(frames)
    if random_background:
        bg = torch.rand(n_cams, 3).to(target.device)
        alphas = [alpha for _, alpha in pixels]
        if all(a is not None for a in alphas):
            alpha = torch.stack(alphas).float()  # [C, H, W, 1]
            target = recomposite(target, alpha, background, bg)
    else:
        bg = background.expand(n_cams, 3)
    models = {f.camera_model for f in frames}
    if len(models) > 1:
        raise ValueError(f"a batch needs frames of one camera model, got {sorted(models)}")
    return Batch(viewmats=viewmats, Ks=Ks, width=frames[0].width, height=frames[0].height,
                 backgrounds=bg.contiguous(), target=target, camera_model=models.pop(),
                 masks=batch_masks([f.mask for f in frames]),
                 lens=stacked([f.lens for f in frames]),
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
