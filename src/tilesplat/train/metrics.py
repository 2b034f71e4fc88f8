"""Evaluation metrics: PSNR, SSIM and (when the ``lpips`` package is importable) LPIPS."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from .losses import ssim


@torch.no_grad()
def squared_error(render: Tensor, target: Tensor) -> Tensor:
    """Mean squared error over every element, a float64 [] tensor on the images' device
    (not read back). render, target: [..., H, W, C]."""
    if render.shape != target.shape:
        raise ValueError(
            f"psnr: images differ in shape, {tuple(render.shape)} vs {tuple(target.shape)}"
        )
    return ((render.double() - target.double()) ** 2).mean()


def psnr_of_mse(mse: float) -> float:
    """PSNR in dB of a mean squared error of images in [0, 1]; ``inf`` for 0."""
    return math.inf if mse == 0.0 else -10.0 * math.log10(mse)


@torch.no_grad()
def psnr(render: Tensor, target: Tensor) -> float:
    """Peak signal-to-noise ratio in dB for images in [0, 1]. render, target: [..., H, W, C].

    The mean squared error is taken over every element; identical images give ``inf``.
    """
    return psnr_of_mse(float(squared_error(render, target)))


@torch.no_grad()
def ssim_metric(render: Tensor, target: Tensor) -> float:
    """Mean SSIM (11x11 Gaussian window, sigma 1.5, data range 1) as a float."""
    return float(ssim(render.double(), target.double()))


def make_lpips(net: str = "alex") -> Callable[[Tensor, Tensor], float] | None:
    """An LPIPS scorer ``(render, target) -> float`` for [H, W, 3] images in [0, 1], or None.

    None when the ``lpips`` package is not installed or its network weights cannot be loaded
    (they come from torchvision's model store; an offline machine may not have them), with a
    warning in the second case.
    """
    try:
        import lpips  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        model = lpips.LPIPS(net=net, verbose=False).eval()
    except Exception as exc:  # any failure to fetch weights disables the metric
        warnings.warn(f"LPIPS disabled: cannot load the {net} network ({exc})", stacklevel=2)
        return None

    @torch.no_grad()
    def score(render: Tensor, target: Tensor) -> float:  # on the CPU, where the network is
        render, target = render.cpu(), target.cpu()
        to_nchw = lambda im: im.float().permute(2, 0, 1)[None] * 2.0 - 1.0  # [-1, 1] expected
        return float(model(to_nchw(render), to_nchw(target)).mean())

    return score
