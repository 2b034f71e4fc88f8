"""``ssim`` on the GPU: the reference's separable convolutions, which already run as torch's CUDA
kernels, so this backend has no kernel of its own for it; its launchers are the reference's."""

from __future__ import annotations

from ..torch.ssim import backward, forward

__all__ = ["backward", "forward"]
