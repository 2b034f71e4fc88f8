"""CPU kernels: the Gaussians in depth order, by a stable radix sort on the kernels' threads
(``intersect`` lists every tile's Gaussians in this order).

An LSD radix sort of (32-bit key, Gaussian) pairs, eight bits a pass. The pairs are cut into
parts, one per thread: a pass counts each part's digits, turns the counts into each part's
first slot per digit (digits in order, parts in order within a digit), and every part moves
its pairs to its own slots in order. The result is the one stable order whatever the number of
parts, so it does not depend on the thread count. A pass whose digit is the same for every
key moves nothing and is skipped; the pairs alternate between two buffers instead of being
copied back after each pass.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._common import num_threads, parallel_for

MIN_PART = 1 << 16  # pairs per part at least: below that, one thread sorts them


@njit(inline="always")
def _part(n, parts, p):
    """Part p of ``parts`` of n pairs: [lo, hi)."""
    return n * p // parts, n * (p + 1) // parts


@njit(nogil=True, cache=True, error_model="numpy")
def load_kernel(first, step, depth_bits, rows, parts, keys, values):
    """keys[i] = the unsigned depth bits of Gaussian rows[i], values[i] = rows[i]; parts first,
    first + step, ... ."""
    for p in range(first, parts, step):
        lo, hi = _part(rows.shape[0], parts, p)
        for i in range(lo, hi):
            g = rows[i]
            keys[i] = np.uint32(np.int64(depth_bits[g]) & np.int64(0xFFFFFFFF))
            values[i] = g


@njit(nogil=True, cache=True, error_model="numpy")
def count_kernel(first, step, keys, shift, counts):
    """counts[p, b]: the keys of part p whose digit at ``shift`` is b; parts first, first +
    step, ... ."""
    parts = counts.shape[0]
    for p in range(first, parts, step):
        lo, hi = _part(keys.shape[0], parts, p)
        for b in range(256):
            counts[p, b] = 0
        for i in range(lo, hi):
            counts[p, (keys[i] >> shift) & np.uint32(0xFF)] += 1


@njit(cache=True, error_model="numpy")
def first_slots(counts):
    """Turns counts [parts, 256] into each part's first slot per digit, in place. Returns
    False when one digit holds every key (the pass would move nothing)."""
    parts = counts.shape[0]
    n = 0
    widest = 0
    for b in range(256):
        total = 0
        for p in range(parts):
            total += counts[p, b]
        widest = max(widest, total)
        n += total
    if widest == n:
        return False
    run = 0
    for b in range(256):
        for p in range(parts):
            c = counts[p, b]
            counts[p, b] = run
            run += c
    return True


@njit(nogil=True, cache=True, error_model="numpy")
def scatter_kernel(first, step, keys, values, shift, slots, out_keys, out_values):
    """Each pair of part p to its digit's next slot of slots[p] (in order: stable); parts
    first, first + step, ... ."""
    parts = slots.shape[0]
    for p in range(first, parts, step):
        lo, hi = _part(keys.shape[0], parts, p)
        for i in range(lo, hi):
            k = keys[i]
            b = (k >> shift) & np.uint32(0xFF)
            j = slots[p, b]
            out_keys[j] = k
            out_values[j] = values[i]
            slots[p, b] = j + 1


def depth_order(depth_bits: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The Gaussians rows [M] (int64, increasing) by their unsigned depth bits depth_bits
    [G] (int32 views of positive float32 depths), ties in index order: int64 [M]."""
    n = rows.shape[0]
    parts = max(1, min(num_threads(), n // MIN_PART))
    keys = np.empty(n, np.uint32)
    values = np.empty(n, np.int64)
    parallel_for(load_kernel, parts, depth_bits, rows, parts, keys, values)
    spare_keys = np.empty_like(keys)
    spare_values = np.empty_like(values)
    counts = np.empty((parts, 256), np.int64)
    for shift in range(0, 32, 8):
        parallel_for(count_kernel, parts, keys, np.uint32(shift), counts)
        if not first_slots(counts):
            continue
        parallel_for(scatter_kernel, parts, keys, values, np.uint32(shift), counts,
                     spare_keys, spare_values)
        keys, spare_keys = spare_keys, keys
        values, spare_values = spare_values, values
    return values
