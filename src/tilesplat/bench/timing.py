"""Stage timers, summary statistics, peak-memory probes and launch counters of the bench.

CPU stages are timed with ``time.perf_counter()``. On CUDA each stage is bracketed by
synchronisations and CUDA events: ``ms`` is the host wall time of the stage, ``gpu_ms`` the time
the GPU was busy between the events, and their difference the host overhead. For ``cuda``
arms, :class:`LaunchCounter` adds the kernel launches of a training step and the Python time
the backend's launchers spend around them.
"""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch


class StageTimer:
    """Collects one time per stage of one pass; ``times[name] = (ms, gpu_ms | None)``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.times: dict[str, tuple[float, float | None]] = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if self.cuda:
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start.record()
            yield
            end.record()
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            self.times[name] = (wall * 1e3, float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            yield
            self.times[name] = ((time.perf_counter() - t0) * 1e3, None)


class NullTimer(StageTimer):
    """A timer that records nothing and never synchronises (parity and self-noise passes)."""

    def __init__(self) -> None:
        self.cuda = False
        self.times = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield


def summarize(samples: list[float]) -> dict[str, Any]:
    """median, mean and σ (sample standard deviation, 0 for one sample) of ``samples``."""
    return {
        "median": statistics.median(samples),
        "mean": statistics.fmean(samples),
        "std": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "samples": list(samples),
    }


_VM = re.compile(r"^(VmHWM|VmRSS):\s+(\d+)\s+kB", re.MULTILINE)


def _proc_status() -> dict[str, int]:
    """VmHWM and VmRSS of this process in bytes ({} where /proc is not available)."""
    try:
        with open("/proc/self/status") as f:
            text = f.read()
    except OSError:
        return {}
    return {k: int(v) * 1024 for k, v in _VM.findall(text)}


def _trim_heap() -> None:
    """Returns freed heap pages to the OS (glibc ``malloc_trim``), so that a step's allocations
    show in the resident size instead of reusing pages kept from earlier steps."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_hwm() -> bool:
    """Resets the process's peak RSS (``echo 5 > /proc/self/clear_refs``); False if refused."""
    _trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory of a block of code.

    CPU: the process's resident-set high-water mark (VmHWM), reset before the block when the
    kernel allows it (``/proc/self/clear_refs``); ``delta_bytes`` is the peak minus the resident
    size at the start. Where the reset is refused, the peak is the process's lifetime peak and
    ``reset`` is False. CUDA: ``torch.cuda.max_memory_allocated`` after a reset of the stats.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.result: dict[str, Any] = {}

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
        else:
            self._reset = _reset_hwm()
            self._base = _proc_status().get("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated()
            self.result = {
                "kind": "cuda max_memory_allocated",
                "peak_bytes": int(peak),
                "delta_bytes": int(peak - self._base),
                "reset": True,
            }
            return
        peak = _proc_status().get("VmHWM")
        if peak is None or self._base is None:
            self.result = {"kind": "unavailable (no /proc/self/status)", "peak_bytes": None,
                           "delta_bytes": None, "reset": False}
            return
        self.result = {
            "kind": "process VmHWM" + (" (reset before the step)" if self._reset else
                                       " (lifetime peak: reset refused)"),
            "peak_bytes": int(peak),
            "delta_bytes": int(peak - self._base) if self._reset else None,
            "reset": bool(self._reset),
        }


class LaunchCounter:
    """Kernel launches and launcher time per training step of a ``cuda`` arm, from
    ``tilesplat.backends.cuda.launch_stats``; counts nothing for the other backends."""

    def __init__(self, backend: str) -> None:
        self.steps: list[dict[str, float]] = []
        self._api = None
        if backend == "cuda":
            from ..backends.cuda import launch_stats, reset_launch_stats

            self._api = (launch_stats, reset_launch_stats)

    @contextlib.contextmanager
    def count(self) -> Iterator[None]:
        """Counts the launches of the block (one training step)."""
        if self._api is None:
            yield
            return
        self._api[1]()
        yield
        self.steps.append(self._api[0]())

    def result(self) -> dict[str, Any] | None:
        """Per step: ``launches`` and ``launcher_calls`` (medians), ``host_ms`` (Python in the
        launchers outside the kernel calls) and ``kernel_call_ms`` (inside them: numba's
        dispatch) as summaries; None for a backend that is not ``cuda``."""
        if not self.steps:
            return None
        return {
            "steps": len(self.steps),
            "launches": statistics.median(s["launches"] for s in self.steps),
            "launcher_calls": statistics.median(s["launcher_calls"] for s in self.steps),
            "host_ms": summarize([s["host_s"] * 1e3 for s in self.steps]),
            "kernel_call_ms": summarize([s["kernel_s"] * 1e3 for s in self.steps]),
        }


def cpu_threads() -> dict[str, int]:
    """Threads that the CPU work may use: Numba's, torch's and the CPUs of the affinity mask."""
    out = {"torch": torch.get_num_threads(), "cpus": os.cpu_count() or 0}
    with contextlib.suppress(AttributeError):
        out["affinity"] = len(os.sched_getaffinity(0))
    try:
        import numba

        out["numba"] = numba.get_num_threads()
    except ImportError:
        pass
    return out
