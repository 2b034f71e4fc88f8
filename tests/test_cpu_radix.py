"""``backends/cpu/radix.py``: the Gaussians by depth bits, ties by index, whatever the number of
parts (threads), including passes that move nothing and empty input."""

import numba
import numpy as np
import pytest

from tilesplat.backends.cpu import radix


def _expected(bits, rows):
    keys = bits[rows].astype(np.int64) & 0xFFFFFFFF
    return rows[np.argsort(keys, kind="stable")]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_stable_depth_order_for_any_part_count(threads, monkeypatch):
    rng = np.random.default_rng(3)
    n = 3 * radix.MIN_PART + 17  # up to three parts
    depths = rng.random(n, dtype=np.float32) * 40 + 0.01
    depths[::5] = np.float32(2.5)  # many ties
    bits = depths.view(np.int32)
    rows = np.flatnonzero(rng.random(n) < 0.95).astype(np.int64)
    monkeypatch.setattr(radix, "num_threads", lambda: threads)
    got = radix.depth_order(bits, rows)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _expected(bits, rows))


def test_passes_that_move_nothing_and_empty_input():
    bits = np.full(1000, 0x3F800000, np.int32)  # equal keys: every pass is skipped
    bits[::3] = 0x3F800001  # only the lowest byte differs
    rows = np.arange(1000, dtype=np.int64)
    np.testing.assert_array_equal(radix.depth_order(bits, rows), _expected(bits, rows))
    assert radix.depth_order(bits, rows[:0]).shape == (0,)


def test_thread_count_does_not_change_the_order():
    rng = np.random.default_rng(4)
    bits = (rng.random(300_000, dtype=np.float32) + 1).view(np.int32)
    rows = np.arange(300_000, dtype=np.int64)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = radix.depth_order(bits, rows)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = radix.depth_order(bits, rows)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, many)
