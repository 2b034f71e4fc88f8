"""Photometric losses: L1 and SSIM (11x11 Gaussian window, sigma 1.5, as Wang et al. 2004).

Images are channel-last, as the rasterizer returns them: ``[..., H, W, C]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_C1 = 0.01**2  # (K1 * data_range)^2 with K1 = 0.01, data_range = 1
SSIM_C2 = 0.03**2  # (K2 * data_range)^2 with K2 = 0.03


def l1_loss(render: Tensor, target: Tensor) -> Tensor:
    """Mean absolute error. render, target: [..., H, W, C]. Returns a scalar."""
    return (render - target).abs().mean()


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2.0
    g = torch.exp(-(x * x) / (2.0 * sigma * sigma))
    return (g / g.sum()).to(dtype=dtype, device=device)  # [size]


def _blur(x: Tensor, window: Tensor) -> Tensor:
    """Separable 'valid' Gaussian filter of x [B, C, H, W] -> [B, C, H-k+1, W-k+1]."""
    c = x.shape[1]
    k = window.numel()
    x = F.conv2d(x, window.view(1, 1, 1, k).expand(c, 1, 1, k), groups=c)
    return F.conv2d(x, window.view(1, 1, k, 1).expand(c, 1, k, 1), groups=c)


def ssim_map(
    img1: Tensor,  # [..., H, W, C]
    img2: Tensor,  # [..., H, W, C]
    window_size: int = SSIM_WINDOW,
    sigma: float = SSIM_SIGMA,
) -> Tensor:
    """Per-pixel SSIM over the 'valid' region: [B, C, H-10, W-10] for the 11x11 window.

    Uses population (not sample) statistics, data range 1, and no padding, so its mean is
    what scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1)`` reports.
    """
    if img1.shape != img2.shape:
        raise ValueError(
            f"ssim: images differ in shape, {tuple(img1.shape)} vs {tuple(img2.shape)}"
        )
    if img1.dim() < 3:
        raise ValueError(f"ssim: expected images [..., H, W, C], got {tuple(img1.shape)}")
    h, w, c = img1.shape[-3:]
    if h < window_size or w < window_size:
        raise ValueError(
            f"ssim: images of {h}x{w} are smaller than the {window_size}x{window_size} window"
        )
    x = img1.reshape(-1, h, w, c).permute(0, 3, 1, 2)
    y = img2.reshape(-1, h, w, c).permute(0, 3, 1, 2)
    win = _gaussian_window(window_size, sigma, x.dtype, x.device)
    # One filter pass over the five moments stacked along the batch.
    moments = _blur(torch.cat([x, y, x * x, y * y, x * y]), win)
    mu_x, mu_y, e_xx, e_yy, e_xy = moments.chunk(5)
    var_x = e_xx - mu_x * mu_x
    var_y = e_yy - mu_y * mu_y
    cov = e_xy - mu_x * mu_y
    num = (2.0 * mu_x * mu_y + SSIM_C1) * (2.0 * cov + SSIM_C2)
    den = (mu_x * mu_x + mu_y * mu_y + SSIM_C1) * (var_x + var_y + SSIM_C2)
    return num / den


def ssim(img1: Tensor, img2: Tensor) -> Tensor:
    """Mean SSIM of two images [..., H, W, C] (values near [0, 1]); differentiable."""
    return ssim_map(img1, img2).mean()


def photometric_loss(render: Tensor, target: Tensor, ssim_lambda: float) -> tuple[Tensor, Tensor]:
    """The 3DGS loss ``(1 - lambda) * L1 + lambda * (1 - SSIM)``.

    Args:
        render, target: [C, H, W, 3] images.
        ssim_lambda: weight of the SSIM term (0.2 in 3DGS).

    Returns:
        (loss, l1): the scalar loss and its L1 term (detached), for logging.
    """
    l1 = l1_loss(render, target)
    if ssim_lambda == 0.0:
        return l1, l1.detach()
    loss = (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim(render, target))
    return loss, l1.detach()
