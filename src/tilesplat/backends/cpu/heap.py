"""glibc's heap kept for a training process: freed memory stays mapped for the next step.

glibc adjusts two thresholds as a process runs. A freed block larger than the ``mmap``
threshold raises it (up to 32 MiB), and the heap's free top is returned to the kernel once it
exceeds twice that threshold. A training step at 1 M Gaussians frees ~100 MB of tensors of
1-30 MB each (projection and rasterizer outputs, their gradients): in some steps the top is
trimmed, the next step faults the same memory in again page by page, and that step costs
~20,000 page faults and ~100 ms more (docs/benchmarks.md). :func:`keep_freed_heap` fixes the
thresholds: blocks up to 32 MiB come from the heap (larger ones are ``mmap``'d as before and
pooled by ``buffer_pool``), and up to :data:`TRIM_BYTES` of free heap stay mapped. No value
changes. The memory kept is memory the process had already taken and freed, handed out again
by the next allocations, and bounded by :data:`TRIM_BYTES`.

What is kept is given back with :func:`return_freed_heap` when the training ends, and after
each step whose edits changed the number of Gaussians: an edit replaces every per-Gaussian
tensor by one of another size, and the freed ones fit none of the later steps' buffers (the
room at 512x384, fast recipe: a 576-605 MiB peak instead of 658-708; docs/training.md, "The
edits' freed heap"). Returning it at every change of a step's sizes (the resolution
schedule's next size, an evaluation as well) cost 1.4-2.7 % more CPU for 0.6-1.6 % less peak
memory, and is not done (docs/training.md, "The object's memory").
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_BYTES = 32 << 20  # glibc's largest dynamic mmap threshold (64-bit)
# free heap kept before glibc returns its top to the kernel: a step at 1 M Gaussians frees
# and takes back ~90 MB; more would be memory a bounded run (``image_cache_mb``) never asked for
TRIM_BYTES = 128 << 20
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                 "MALLOC_MMAP_MAX_")


@functools.cache
def keep_freed_heap() -> bool:
    """Sets glibc's ``mmap`` threshold to :data:`MMAP_BYTES` and its trim threshold to
    :data:`TRIM_BYTES`, once per process. Returns whether they were set: not on a system
    without glibc's ``mallopt`` (macOS, Windows, musl), and not where the user set one of
    glibc's ``MALLOC_*_`` variables (theirs win)."""
    if not sys.platform.startswith("linux") or any(os.environ.get(k) for k in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # both, in this order: setting either one stops glibc's adjustment of the other, and the
    # mmap threshold would stay at its 128 KiB start
    return mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1 and mallopt(M_TRIM_THRESHOLD,
                                                                   TRIM_BYTES) == 1


def return_freed_heap() -> bool:
    """Returns the heap's free memory to the kernel (glibc's ``malloc_trim``: the free top
    and the free pages inside it), for a process that has freed much and will not take it
    back soon: a run whose training has ended (its optimizer state freed) before its
    evaluation and export. Returns whether memory was returned; False where glibc's
    ``malloc_trim`` is missing (macOS, Windows, musl)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim(0) == 1
