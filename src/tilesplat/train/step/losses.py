"""Photometric losses: L1 and SSIM (11x11 Gaussian window, sigma 1.5, as Wang et al. 2004).

Images are channel-last, as the rasterizer returns them: ``[..., H, W, C]``. The SSIM is the
op ``tilesplat.ops.ssim`` (a fused kernel with an analytic backward on the CPU backend, the
reference's convolutions elsewhere); ``ssim_map`` is the reference's per-pixel map.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...backends.torch.ssim import ssim_map as _reference_map
from ...constants import SSIM_C1, SSIM_C2, SSIM_SIGMA, SSIM_WINDOW
from ...ops.ssim import ssim as ssim_op

__all__ = ["SSIM_C1", "SSIM_C2", "SSIM_SIGMA", "SSIM_WINDOW", "l1_loss", "photometric_loss",
           "ssim", "ssim_map"]


def l1_loss(render: Tensor, target: Tensor) -> Tensor:
    """Mean absolute error. render, target: [..., H, W, C]. Returns a scalar."""
    return _L1.apply(render, target)


class _L1(torch.autograd.Function):
    """``(render - target).abs().mean()`` with autograd's gradient, bit for bit (``sgn(d) *
    (g / numel)``), in one pass over the image instead of three full-size temporaries
    (the expanded mean's quotient, the signs, their product)."""

    @staticmethod
    def forward(ctx, render: Tensor, target: Tensor) -> Tensor:
        diff = render - target
        ctx.save_for_backward(diff)
        return diff.abs().mean()

    @staticmethod
    def backward(ctx, v_loss: Tensor) -> tuple[Tensor | None, Tensor | None]:
        (diff,) = ctx.saved_tensors
        v_render = torch.sgn(diff).mul_(v_loss / diff.numel())
        return (v_render if ctx.needs_input_grad[0] else None,
                -v_render if ctx.needs_input_grad[1] else None)


def ssim_map(
    img1: Tensor,  # [..., H, W, C]
    img2: Tensor,  # [..., H, W, C]
    window_size: int = SSIM_WINDOW,
    sigma: float = SSIM_SIGMA,
) -> Tensor:
    """Per-pixel SSIM over the 'valid' region: [B, C, H-10, W-10] for the 11x11 window.

    Uses population (not sample) statistics, data range 1, and no padding, so its mean is
    what scikit-image's ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1)`` reports (the torch reference's map).
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
    return _reference_map(img1.reshape(-1, h, w, c), img2.reshape(-1, h, w, c), window_size,
                          sigma)


def ssim(img1: Tensor, img2: Tensor, backend: str | None = None) -> Tensor:
    """Mean SSIM of two images [..., H, W, C] (values near [0, 1]); differentiable.

    ``backend`` as for every op (default: the current backend; ``auto`` runs the CPU kernel
    for CPU tensors)."""
    return ssim_op(img1, img2, backend=backend)


def photometric_loss(
    render: Tensor, target: Tensor, ssim_lambda: float, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """The 3DGS loss ``(1 - lambda) * L1 + lambda * (1 - SSIM)``.

    Args:
        render, target: [C, H, W, 3] images.
        ssim_lambda: weight of the SSIM term (0.2 in 3DGS).
        backend: the SSIM's backend (default: the current one).

    Returns:
        (loss, l1): the scalar loss and its L1 term (detached), for logging.
    """
    l1 = l1_loss(render, target)
    if ssim_lambda == 0.0:
        return l1, l1.detach()
    loss = (1.0 - ssim_lambda) * l1 + ssim_lambda * (1.0 - ssim(render, target, backend))
    return loss, l1.detach()
