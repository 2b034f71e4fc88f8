"""Public op ``ssim``: the mean structural similarity of two images, differentiable."""

from __future__ import annotations

import torch
from torch import Tensor

from ..backends.registry import resolve
from ..constants import SSIM_SIGMA, SSIM_WINDOW
from .validation import check_finite, check_positive_int, check_real, check_tensor, common_float


class _SSIM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, impl, img1, img2, window_size, sigma):
        needs = (ctx.needs_input_grad[1], ctx.needs_input_grad[2])
        value, saved = impl.forward(img1, img2, window_size, sigma, needs)
        ctx.impl, ctx.params, ctx.needs = impl, (window_size, sigma), needs
        ctx.save_for_backward(img1, img2, saved)
        return value

    @staticmethod
    def backward(ctx, v_ssim):
        img1, img2, saved = ctx.saved_tensors
        v1, v2 = ctx.impl.backward(img1, img2, saved, *ctx.params, v_ssim, ctx.needs)
        return None, v1, v2, None, None


def ssim(
    img1: Tensor,  # [..., H, W, C]
    img2: Tensor,  # [..., H, W, C]
    window_size: int = SSIM_WINDOW,
    sigma: float = SSIM_SIGMA,
    *,
    backend: str | None = None,
) -> Tensor:
    """Mean SSIM of two channel-last images (Wang et al. 2004; values near [0, 1]).

    A separable Gaussian window (``window_size`` taps, ``sigma``) over the 'valid' region
    (no padding), population statistics, data range 1; the mean runs over every image,
    channel and pixel of the [..., H - k + 1, W - k + 1, C] map, as scikit-image's
    ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=1)`` reports. Differentiable in both images.

    Args:
        img1, img2: images of equal shape and dtype. [..., H, W, C] with H, W >= window_size
        window_size: taps of the window (odd). sigma: its standard deviation in pixels.
        backend: ``auto`` | ``torch`` | ``cpu`` | ``cuda`` (on CUDA the reference's
            convolutions run: they are torch's GPU kernels).

    Returns:
        the mean SSIM, a scalar tensor of the images' dtype.
    """
    check_tensor("img1", img1)
    check_tensor("img2", img2)
    if img1.shape != img2.shape:
        raise ValueError(
            f"ssim: images differ in shape, {tuple(img1.shape)} vs {tuple(img2.shape)}"
        )
    if img1.dim() < 3:
        raise ValueError(f"ssim: expected images [..., H, W, C], got {tuple(img1.shape)}")
    window_size = check_positive_int("window_size", window_size)
    if window_size % 2 == 0:
        raise ValueError(f"ssim: expected an odd window_size, got {window_size}")
    sigma = check_real("sigma", sigma, 0.0)
    if not sigma > 0.0:
        raise ValueError(f"ssim: expected sigma > 0, got {sigma}")
    h, w, c = img1.shape[-3:]
    if h < window_size or w < window_size:
        raise ValueError(
            f"ssim: images of {h}x{w} are smaller than the {window_size}x{window_size} window"
        )
    _, device = common_float({"img1": img1, "img2": img2})
    check_finite({"img1": img1, "img2": img2})
    _, impl = resolve("ssim", device, backend)
    return _SSIM.apply(
        impl, img1.reshape(-1, h, w, c).contiguous(), img2.reshape(-1, h, w, c).contiguous(),
        window_size, sigma,
    )
