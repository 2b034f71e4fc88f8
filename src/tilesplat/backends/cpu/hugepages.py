"""Transparent huge pages for the CPU backend's large output buffers.

A buffer of more than glibc's largest ``mmap`` threshold (32 MiB) is mapped fresh at every
allocation and unmapped when freed, so the kernel faults it in again page by page at its first
write: the SH backward's ``v_shN`` of 1 M Gaussians (180 MB) is 44,000 faults every training
step, ~100 ms of kernel time. Asked for huge pages before that first write
(``madvise(MADV_HUGEPAGE)``), the same buffer is ~90 faults of 2 MiB (~25 ms). Advice only:
no value changes; where the kernel has no transparent huge pages, or on a system without
``madvise`` (macOS, Windows), nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import sys

import torch

MADV_HUGEPAGE = 14  # Linux, every architecture
HUGE_PAGE = 1 << 21  # 2 MiB: x86-64 and arm64 with 4 KiB pages
MIN_BYTES = 32 << 20  # glibc's largest mmap threshold: smaller buffers are reused from the heap

@functools.cache
def _libc_madvise():
    """libc's ``madvise`` or None (not Linux), resolved at the first large buffer."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Asks the kernel to back the whole 2 MiB pages inside ``t``'s memory (a CPU tensor not
    yet written) with huge pages, when ``t`` has at least :data:`MIN_BYTES`. Returns whether
    the advice was taken."""
    nbytes = t.numel() * t.element_size()
    if nbytes < MIN_BYTES or t.device.type != "cpu":
        return False
    madvise = _libc_madvise()
    if madvise is None:
        return False
    start = t.data_ptr()
    lo = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
    hi = (start + nbytes) & ~(HUGE_PAGE - 1)
    return hi > lo and madvise(lo, hi - lo, MADV_HUGEPAGE) == 0
