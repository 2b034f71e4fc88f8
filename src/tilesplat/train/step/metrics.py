"""Evaluation metrics: PSNR, SSIM, (when the ``lpips`` package is importable) LPIPS, and the
colour fit behind the colour-corrected ones (``cc_psnr``, ``cc_ssim``)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import torch
from torch import Tensor

from ...backends.cpu.squared_error import squared_error_sum
from .losses import ssim

# pixels of one float64 part on the CPU: three temporaries of 1.5 MiB, reused from the heap
CPU_PART_PIXELS = 1 << 16
# pixels of one part of the colour fit on the CPU: its float64 features and temporaries take
# ~180 bytes a pixel, ~1.5 MiB a part
CC_PART_PIXELS = 1 << 13


def _parts(pixels: int, device: torch.device, size: int) -> list[slice]:
    """Slices of at most ``size`` pixels on the CPU (the whole on a GPU) covering ``pixels``
    pixels in order; one empty slice for none (its sums are 0)."""
    step = size if device.type == "cpu" else max(pixels, 1)
    return [slice(i, i + step) for i in range(0, max(pixels, 1), step)]


def _one_pass(r: Tensor, t: Tensor, masks: Tensor | None) -> bool:
    """Whether the CPU kernel takes the sum (``backends/cpu/squared_error.py``): CPU images of
    one float dtype it compiles for, a bool mask or none."""
    return (r.device.type == "cpu" and t.device.type == "cpu" and r.dtype == t.dtype
            and r.dtype in (torch.float32, torch.float64)
            and (masks is None or (masks.device.type == "cpu" and masks.dtype == torch.bool
                                   and masks.numel() == r.shape[0])))


@torch.no_grad()
def squared_error(render: Tensor, target: Tensor, masks: Tensor | None = None) -> Tensor:
    """Mean squared error over the pixels ``masks`` keeps (every pixel for None), a float64
    [] tensor on the images' device (not read back); NaN when the masks keep no pixel (a
    mean over nothing is undefined). render, target: [..., H, W, C]; masks: [..., H, W]
    bool or None.

    The differences are taken in float64 (exact for float32 images). On the CPU they are
    summed in one pass by a kernel (``backends/cpu/squared_error.py``; torch's five passes
    took ~160 us of a 200x200 training step), or, for other dtypes, :data:`CPU_PART_PIXELS`
    pixels at a time: whole float64 copies of a 1920x1080 image are ~150 MB of fresh pages at
    every step (a call took 43-57 ms of a training step, 11-14 ms in parts;
    docs/benchmarks.md). A GPU takes the image in one part."""
    if render.shape != target.shape:
        raise ValueError(
            f"psnr: images differ in shape, {tuple(render.shape)} vs {tuple(target.shape)}"
        )
    channels = render.shape[-1]
    r, t = render.reshape(-1, channels), target.reshape(-1, channels)
    if _one_pass(r, t, masks):
        keep1 = None if masks is None else masks.reshape(-1)
        total = torch.tensor(squared_error_sum(r, t, keep1), dtype=torch.float64)
    else:
        keep = None if masks is None else masks.reshape(-1, 1)
        sums = []
        for part in _parts(r.shape[0], render.device, CPU_PART_PIXELS):
            sq = (r[part].double() - t[part].double()).square_()
            if keep is not None:  # where, not a product: a NaN under a hidden pixel stays out
                sq = torch.where(keep[part], sq, 0.0)
            sums.append(sq.sum())
        total = sums[0] if len(sums) == 1 else torch.stack(sums).sum()
    if masks is None:
        return total / r.numel()
    kept = masks.sum()
    return torch.where(kept > 0, total / (kept.clamp_min(1) * channels), torch.nan)


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


CC_RIDGE = 1e-9  # per pixel: keeps the fit of a flat image near the identity


def quadratic_features(rgb: Tensor) -> Tensor:
    """[M, 3] -> [M, 10]: the products r², rg, rb, g², gb, b², then r, g, b and 1."""
    i, j = torch.triu_indices(3, 3)
    return torch.cat([rgb[:, i] * rgb[:, j], rgb, torch.ones_like(rgb[:, :1])], dim=1)


def colour_weights(gram: Tensor, rhs: Tensor, pixels: int) -> Tensor:
    """The colour fit's weights [10, 3] (float64) from its normal equations summed over
    ``pixels`` pixels: ``gram`` = sum of aᵀa [10, 10] and ``rhs`` = sum of aᵀ(target -
    render) [10, 3], ``a`` the render's :func:`quadratic_features`. Solved for the change from
    the identity, with a ridge of :data:`CC_RIDGE` a pixel that pulls towards it."""
    eye = torch.eye(10, dtype=torch.float64, device=gram.device)
    identity = torch.zeros(10, 3, dtype=torch.float64, device=gram.device)
    identity[6:9] = eye[:3, :3]
    return identity + torch.linalg.solve(gram + CC_RIDGE * pixels * eye, rhs)


@torch.no_grad()
def color_correct(render: Tensor, target: Tensor) -> Tensor:
    """``render`` [H, W, 3] mapped onto ``target``'s colours: each output channel a quadratic
    polynomial of the render's three channels, fitted by least squares (float64) over every
    pixel, then clamped to [0, 1] (the render itself where that does not lower the error).

    The identity is one of the polynomials and clamping to [0, 1] moves no value away from a
    target in [0, 1], so the corrected squared error is never above the plain one, and an
    image that already matches comes back as it is. As gsplat's ``cc_psnr`` (Mip-NeRF 360's
    quadratic colour fit; theirs leaves out the clipped pixels, which here would leave a
    white background unconstrained), it scores the shapes and shading of a model whose
    colours are those of no photo in particular (``post_processing``), and of a model that is
    not compensated, on one scale.

    On the CPU the float64 work is done :data:`CC_PART_PIXELS` pixels at a time (the normal
    equations summed over the parts, then the fit applied part by part): the whole view's
    float64 features and temporaries are ~180 bytes a pixel, 15 MB at 288x288, that the
    final evaluation stood on (docs/training.md). A GPU takes the view in one part.
    """
    if render.shape != target.shape or render.shape[-1] != 3:
        raise ValueError(
            f"color_correct: needs two [H, W, 3] images, got {tuple(render.shape)} and "
            f"{tuple(target.shape)}"
        )
    x_all, y_all = render.reshape(-1, 3), target.reshape(-1, 3)
    pixels = x_all.shape[0]
    parts = _parts(pixels, render.device, CC_PART_PIXELS)
    gram = torch.zeros(10, 10, dtype=torch.float64, device=render.device)
    rhs = torch.zeros(10, 3, dtype=torch.float64, device=render.device)
    for part in parts:
        x, y = x_all[part].double(), y_all[part].double()
        a = quadratic_features(x)  # [part, 10]
        gram += a.T @ a
        rhs += a.T @ (y - x)
    weights = colour_weights(gram, rhs, pixels)
    out = torch.empty_like(x_all)
    fit_sq = torch.zeros((), dtype=torch.float64, device=render.device)
    plain_sq = torch.zeros_like(fit_sq)
    for part in parts:
        x, y = x_all[part].double(), y_all[part].double()
        fitted = (quadratic_features(x) @ weights).clamp_(0.0, 1.0)
        fit_sq += (fitted - y).square_().sum()
        plain_sq += (x - y).square_().sum()
        out[part] = fitted
    if float(fit_sq) >= float(plain_sq):
        return render
    return out.reshape(render.shape)


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
