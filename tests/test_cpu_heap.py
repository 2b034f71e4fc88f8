"""``backends/cpu/heap.py``: freed heap memory stays mapped, so a training step does not fault
the previous step's tensors in again; a user's own glibc settings win."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# glibc's malloc, free and memset through ctypes, for the probes below
LIBC = r"""
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
"""

# Three 20 MiB blocks (under the 32 MiB mmap threshold) written, freed, four times over; prints
# keep_freed_heap()'s result and each round's minor page faults.
PROBE = LIBC + r"""
import resource
from tilesplat.backends.cpu.heap import keep_freed_heap
kept = keep_freed_heap()
n = 20 << 20
faults = []
for _ in range(4):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(n) for _ in range(3)]
    for b in blocks:
        libc.memset(b, 1, n)
    for b in reversed(blocks):
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
print(kept, *faults)
"""


def _probe(**env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, "PYTHONPATH": str(SRC),
                                                            **env},
                         capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.split()


def _glibc() -> bool:
    if "CS_GNU_LIBC_VERSION" not in getattr(os, "confstr_names", {}):
        return False
    return sys.platform.startswith("linux") and bool(os.confstr("CS_GNU_LIBC_VERSION"))


glibc_only = pytest.mark.skipif(not _glibc(), reason="mallopt's thresholds are glibc's")


@glibc_only
def test_freed_blocks_are_not_faulted_in_again():
    kept, first, *later = _probe()
    assert kept == "True"
    assert int(first) > 0  # the first round maps the memory
    # later rounds reuse it: no page of the 60 MiB is faulted in again. A few faults may be
    # ctypes' own, and with huge pages the first round is only ~30 faults: a fixed allowance
    # of 16, far below the ~15,000 (4 KiB pages) of memory faulted in again
    assert all(int(f) <= int(first) // 20 + 16 for f in later), (first, later)


@glibc_only
def test_a_users_malloc_settings_win():
    kept, *_ = _probe(MALLOC_TRIM_THRESHOLD_="0")
    assert kept == "False"


# Sixty 1 MiB blocks written and freed but for the last (which pins the heap's top, as a
# long-lived tensor does), then return_freed_heap(); prints the resident heap before and after.
TRIM_PROBE = LIBC + r"""
from tilesplat.backends.cpu.heap import keep_freed_heap, return_freed_heap
def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
keep_freed_heap()
n = 1 << 20
blocks = [libc.malloc(n) for _ in range(60)]
for b in blocks:
    libc.memset(b, 1, n)
for b in blocks[:-1]:
    libc.free(b)
before = rss_mib()
returned = return_freed_heap()
print(returned, before, rss_mib())
"""


@glibc_only
def test_the_freed_heap_goes_back_to_the_system():
    """What ``keep_freed_heap`` keeps is returned on request (a run at the end of its
    training, or whose step changes sizes): the 59 free MiB below a block still in use."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", TRIM_PROBE], env={**clean, "PYTHONPATH": str(SRC)},
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    returned, before, after = out[0], float(out[1]), float(out[2])
    assert returned == "True"
    assert before - after > 50, (before, after)
