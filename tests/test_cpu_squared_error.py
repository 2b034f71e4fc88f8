"""``backends/cpu/squared_error.py``: the one-pass float64 sum of squared differences behind
``train.step.metrics.squared_error`` on the CPU, against numpy's float64 sum and torch's
parts, over several work items and thread counts."""

import math

import numba
import numpy as np
import pytest
import torch

from tilesplat.backends.cpu.squared_error import BLOCK_PIXELS, squared_error_sum
from tilesplat.train.step import metrics


def _by_hand(r, t, keep):
    d = r.numpy().astype(np.float64) - t.numpy().astype(np.float64)
    sq = (d * d).sum(axis=1)
    return float(sq.sum() if keep is None else sq[keep.numpy()].sum())


@pytest.mark.parametrize("pixels", [0, 1, 4099, 2 * BLOCK_PIXELS + 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_is_numpys_float64_sum_for_any_thread_count(pixels, dtype):
    gen = torch.Generator().manual_seed(pixels)
    r = torch.rand(pixels, 3, generator=gen, dtype=dtype)
    t = torch.rand(pixels, 3, generator=gen, dtype=dtype)
    keep = torch.rand(pixels, generator=gen) > 0.3
    t_nan = t.clone()
    t_nan[~keep] = math.nan  # hidden pixels are skipped, not multiplied
    before = numba.get_num_threads()
    try:
        for k in (None, keep):
            got = {}
            for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
                numba.set_num_threads(threads)
                got[threads] = squared_error_sum(r, t if k is None else t_nan, k)
            assert len(set(got.values())) == 1  # the same bits on every thread count
            assert got[1] == pytest.approx(_by_hand(r, t, k), rel=1e-12, abs=0.0)
    finally:
        numba.set_num_threads(before)


def test_nan_in_a_kept_pixel_gives_nan_and_strided_inputs_are_read_as_values():
    r = torch.zeros(5, 3)
    t = torch.zeros(5, 3)
    t[2, 1] = math.nan
    assert math.isnan(squared_error_sum(r, t, None))
    wide = torch.rand(7, 6)
    assert squared_error_sum(wide[:, ::2], torch.zeros(7, 3), None) == pytest.approx(
        float((wide[:, ::2].double() ** 2).sum()), rel=1e-12)


def test_metrics_take_the_kernel_only_where_it_applies(monkeypatch):
    calls = []
    real = metrics.squared_error_sum
    monkeypatch.setattr(metrics, "squared_error_sum", lambda *a: calls.append(1) or real(*a))
    a, b = torch.rand(1, 6, 5, 3), torch.rand(1, 6, 5, 3)
    ref = float(((a.double() - b.double()) ** 2).mean())
    assert float(metrics.squared_error(a, b)) == pytest.approx(ref, rel=1e-12)
    assert calls == [1]
    # half precision takes torch's parts, with the same mean
    half = metrics.squared_error(a.half(), b.half())
    assert float(half) == pytest.approx(
        float(((a.half().double() - b.half().double()) ** 2).mean()), rel=1e-12)
    masks = torch.ones(1, 6, 5, dtype=torch.bool)
    assert float(metrics.squared_error(a, b, masks)) == pytest.approx(ref, rel=1e-12)
    assert calls == [1, 1]
