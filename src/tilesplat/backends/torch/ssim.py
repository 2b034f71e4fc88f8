"""Reference: the structural similarity index (``ssim``), as Wang et al. 2004 define it.

Per-pixel SSIM over the 'valid' region of a separable Gaussian window (no padding), with
population statistics and data range 1, averaged over every image, channel and pixel: what
scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
use_sample_covariance=False, data_range=1)`` reports. Gradients are autograd's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ...constants import SSIM_C1, SSIM_C2
from ._vjp import recompute


def gaussian_window(size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The normalised 1D window [size], computed in float64 and rounded once to ``dtype``."""
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(x * x) / (2.0 * sigma * sigma))
    return (g / g.sum()).to(dtype=dtype, device=device)


def _blur(x: Tensor, window: Tensor) -> Tensor:
    """Separable 'valid' filter of x [B, C, H, W] -> [B, C, H-k+1, W-k+1]."""
    c = x.shape[1]
    k = window.numel()
    x = F.conv2d(x, window.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)
    return F.conv2d(x, window.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)


def ssim_map(img1: Tensor, img2: Tensor, window_size: int, sigma: float) -> Tensor:
    """Per-pixel SSIM [B, C, H-k+1, W-k+1] of img1, img2 [B, H, W, C] (channel last)."""
    x = img1.permute(0, 3, 1, 2)
    y = img2.permute(0, 3, 1, 2)
    win = gaussian_window(window_size, sigma, x.dtype, x.device)
    # one filter pass over the five moments stacked along the batch
    moments = _blur(torch.cat([x, y, x * x, y * y, x * y]), win)
    mu_x, mu_y, e_xx, e_yy, e_xy = moments.chunk(5)
    var_x = e_xx - mu_x * mu_x
    var_y = e_yy - mu_y * mu_y
    cov = e_xy - mu_x * mu_y
    num = (2.0 * mu_x * mu_y + SSIM_C1) * (2.0 * cov + SSIM_C2)
    den = (mu_x * mu_x + mu_y * mu_y + SSIM_C1) * (var_x + var_y + SSIM_C2)
    return num / den


def forward(img1, img2, window_size, sigma, needs_grad):
    """Mean SSIM [] of img1, img2 [B, H, W, C]; nothing is kept for the backward."""
    del needs_grad
    return ssim_map(img1, img2, window_size, sigma).mean(), None


def backward(img1, img2, saved, window_size, sigma, v_ssim, needs_grad):
    """(v_img1, v_img2) [B, H, W, C] (None where not needed) for the upstream v_ssim []."""
    del saved
    inputs = [x if need else None for x, need in zip((img1, img2), needs_grad, strict=True)]

    def fn(a, b):
        a = img1 if a is None else a
        b = img2 if b is None else b
        return (ssim_map(a, b, window_size, sigma).mean(),)

    return tuple(recompute(fn, inputs, [v_ssim]))
