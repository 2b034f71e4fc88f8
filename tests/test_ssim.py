"""The ``ssim`` op beyond its parity with the reference (``tests/ops/test_ssim.py``): the
reference and the CPU kernel against finite differences, the CPU kernel across thread counts,
the errors."""

import numba
import numpy as np
import pytest
import torch

from tilesplat.ops import ssim


def _pair(shape, dtype, seed):
    """An image and a noisy copy in [0, 1] (SSIM well inside (0, 1))."""
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(shape, generator=g, dtype=torch.float64)
    b = (a + 0.1 * torch.randn(shape, generator=g, dtype=torch.float64)).clamp(0.0, 1.0)
    return a.to(dtype), b.to(dtype)


def _value_and_grads(backend, a, b, v, grad_b=True):
    a = a.clone().requires_grad_(True)
    b = b.clone().requires_grad_(grad_b)
    s = ssim(a, b, backend=backend)
    s.backward(v)
    return s.detach(), a.grad, b.grad


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_gradcheck_float64(backend):
    a, b = _pair((13, 12, 2), torch.float64, seed=7)
    a.requires_grad_(True)
    b.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, y: ssim(x, y, backend=backend), (a, b))


def test_cpu_bit_identical_across_threads_and_runs():
    a, b = _pair((1, 100, 90, 3), torch.float32, seed=9)
    v = torch.tensor(1.0)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _value_and_grads("cpu", a, b, v)
        numba.set_num_threads(before)
        many = [_value_and_grads("cpu", a, b, v) for _ in range(2)]
    finally:
        numba.set_num_threads(before)
    for run in many:
        for x, y in zip(one, run, strict=True):
            assert torch.equal(x, y)


def test_identity_and_errors():
    a, _ = _pair((16, 16, 3), torch.float64, seed=1)
    assert abs(float(ssim(a, a, backend="cpu")) - 1.0) < 1e-12
    with pytest.raises(ValueError, match="smaller than the 11x11 window"):
        ssim(a[:8], a[:8], backend="cpu")
    with pytest.raises(ValueError, match="differ in shape"):
        ssim(a, a[:, :15], backend="cpu")
    with pytest.raises(ValueError, match="odd window_size"):
        ssim(a, a, window_size=4)
    with pytest.raises(ValueError, match="sigma"):
        ssim(a, a, sigma=0.0)


def test_other_windows():
    a, b = _pair((1, 20, 19, 1), torch.float64, seed=3)
    for k, sigma in ((3, 0.8), (7, 2.0)):
        ref = ssim(a, b, k, sigma, backend="torch")
        got = ssim(a, b, k, sigma, backend="cpu")
        assert abs(float(got) - float(ref)) < 1e-13


def test_eleven_tap_filters_are_the_general_filters():
    """The unrolled 11-tap filters of the CPU kernel sum in the general filters' order, and the
    backward's full transposed column is the column filter with the window reversed: the
    same bits, in both dtypes."""
    from tilesplat.backends.cpu import ssim as kernels

    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.float64):
        w = torch.rand(11, generator=g, dtype=dtype).numpy()
        src = (torch.rand(50, generator=g, dtype=dtype) - 0.5).numpy()
        rows = torch.rand(11, 40, generator=g, dtype=dtype).numpy()
        maps = torch.rand(2, 3, 30, 40, generator=g, dtype=dtype).numpy()
        w7 = w[:7].copy()  # any other window: the same order through the general filter
        r10, r7 = w[::-1].copy(), w7[::-1].copy()
        pairs = (  # (the general filter, its arguments), (the other, its arguments)
            ((kernels._filter_row_any, (src, w)), (kernels._filter_row11, (src, w))),
            ((kernels._filter_column_any, (rows, w)), (kernels._filter_column11, (rows, w))),
            ((kernels._transposed_column, (maps, 1, 2, 20, 0, 10, w)),  # the backward's
             (kernels._filter_column11, (maps[1, 2, 10:21], r10))),
            ((kernels._transposed_column, (maps, 1, 2, 20, 0, 6, w7)),
             (kernels._filter_column_any, (maps[1, 2, 14:21], r7))),
        )
        for (general, g_args), (other, o_args) in pairs:
            want, got = np.full(40, np.nan, src.dtype), np.full(40, np.nan, src.dtype)
            general(*g_args, want)
            other(*o_args, got)
            assert (want == got).all()
