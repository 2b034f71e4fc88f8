"""``ssim``: the value and the gradients of both images against the reference, odd sizes,
batch dims, float32 and float64, one image without gradient. (On cuda the reference's
convolutions run: they are torch's GPU kernels.)"""

import torch

from tilesplat.ops import ssim

from .parity import assert_parity, dtypes, simulated


def _pair(shape, dtype, seed):
    """An image and a noisy copy in [0, 1] (SSIM well inside (0, 1))."""
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g, dtype=torch.float64)
    b = (a + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(0.0, 1.0)
    return a.to(dtype), b.to(dtype)


def _ssim(a, b, *, backend):
    # the mean's gradient is ~1/M per pixel: scaled by M, the tolerances apply to O(1) values
    return ssim(a, b, backend=backend) * a.numel()


def _f64(numel):
    """float64: the value to 1e-13 (of the unscaled mean), the gradients to 1e-10."""
    return {"tol": (1e-13, 1e-10), "per_tensor": {"ssim": (1e-13 * numel, 1e-13)}}


def test_matches_reference(backend, batch):
    # the window's own size, odd sizes, a few windows across
    sizes = [(17, 13)] if simulated(backend) else [(11, 11), (37, 23), (70, 45)]
    for hw in sizes:
        for dtype in dtypes(backend, batch):
            a, b = _pair((*batch, *hw, 3), dtype, seed=hw[0] + len(batch))
            exact = {} if dtype == torch.float32 else _f64(a.numel())
            assert_parity(_ssim, [a, b], backend, dtype, f"ssim {hw} {dtype}", outputs=["ssim"],
                          inputs=["img1", "img2"], **exact)


def test_one_image_without_gradient(backend):
    a, b = _pair((2, 30, 41, 3), torch.float64, seed=5)

    def fn(x, *, backend):
        return _ssim(x, b, backend=backend)

    assert_parity(fn, [a], backend, torch.float64, "ssim", outputs=["ssim"], inputs=["img1"],
                  **_f64(a.numel()))
