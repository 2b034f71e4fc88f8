"""The decoded images of the loaded frames, held within a memory budget.

A frame keeps where its pixels come from (:class:`.pixels.LazyPixels`); the pixels themselves
live here, in one least-recently-used cache per process bounded in bytes (the config key
``image_cache_mb``), in their stored form (:class:`StoredImage`): uint8 as the file holds them
where that is exact (a photo at its own size or from an ``images_N`` folder, an undistorted
image read back from ``tilesplat_cache``), float32 where the loader computed them (a
resized or undistorted image; a 16-bit file). The float32 [H, W, 3] a step reads is made from
the stored form on each access, by the very operations the loaders always ran (``/ 255`` in
float32, then the composite on the background), so it is bit for bit what a loader used to
keep: 150 photos of 3000x2000 held 10.8 GB as float32 and hold 2.7 GB as uint8, or what the
budget allows.

Decoding runs in a thread pool (Pillow and NumPy release the GIL): the loaders decode every
image once there (which checks every file before a run starts and fills the cache), and the
trainer asks it to decode the next step's views while the current step runs (:func:`prefetch`).
An image evicted from the cache is decoded again when it is next needed, to the same values.

JPEG draft mode (decoding at 1/2, 1/4 or 1/8 of the size in the DCT) is not used: its scaling
is not the box filter the loaders resize with, so its pixels differ from today's (docs/data.md).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch

from ..devices import usable_cpus
from ..io.images import to_float
from .composite import composite

KEY = "image_cache_mb"
# the automatic budget: this share of the memory available when the first dataset loads,
# at least AUTO_MIN_MB (the optimiser, the renders and the model need the rest)
AUTO_SHARE = 0.25
AUTO_MIN_MB = 256.0
MB = 1 << 20
# at most this many decoding threads (each holds one image being decoded and resized)
MAX_THREADS = 8
PROGRESS_EVERY_S = 2.0
# a held image of this many bytes or more lives in its own memory map, off the malloc heap:
# glibc serves blocks under its (self-raising, up to 32 MB) mmap threshold from the heap,
# where held images between freed decoding buffers kept 40 photos of 3000x2000 at ~700 MB
# of RSS for a 256 MB budget; mapped apart, RSS stays at the budget plus the decoding
OFF_HEAP_BYTES = 1 << 20


def image_to_tensors(
    rgba: np.ndarray, background: tuple[float, float, float]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Split a float [H, W, 3|4] image into (rgb [H,W,3] composited, alpha [H,W,1] | None)
    (float32 RGBA in one compiled pass, :func:`.composite.composite`: the same values)."""
    if rgba.shape[2] == 4 and rgba.dtype == np.float32:
        rgb, alpha = composite(rgba, background)
        return torch.from_numpy(rgb), torch.from_numpy(alpha)
    if rgba.shape[2] == 4:
        alpha = rgba[:, :, 3:4]
        bg = np.asarray(background, dtype=np.float32)
        rgb = rgba[:, :, :3] * alpha + bg * (1.0 - alpha)
        return (
            torch.from_numpy(np.ascontiguousarray(rgb, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(alpha, dtype=np.float32)),
        )
    return torch.from_numpy(np.ascontiguousarray(rgba[:, :, :3], dtype=np.float32)), None


@dataclass(frozen=True)
class StoredImage:
    """One frame's pixels as the cache holds them.

    Attributes:
        data: [H, W, 3|4] uint8 (the file's values) or float32 in [0, 1] (computed).
        background: the colour an alpha channel is composited on when the frame's image is
            made; None when ``data`` is already composited (its 4th channel is then the alpha
            as it is).
    """

    data: np.ndarray
    background: tuple[float, float, float] | None = (0.0, 0.0, 0.0)

    @property
    def nbytes(self) -> int:
        """Bytes held."""
        return int(self.data.nbytes)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return int(self.data.shape[1]), int(self.data.shape[0])

    @property
    def has_alpha(self) -> bool:
        """Whether the frame gets an alpha channel."""
        return self.data.shape[2] == 4

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(image [H, W, 3] float32 composited, alpha [H, W, 1] float32 or None): new tensors,
        never views of the cached array."""
        if self.background is not None and self.has_alpha:  # uint8 / 255 in the same pass
            rgb, alpha = composite(self.data, self.background)
            return torch.from_numpy(rgb), torch.from_numpy(alpha)
        arr = to_float(self.data)
        if arr is self.data:
            arr = arr.copy()  # float data: a caller may write into what it gets
        if self.background is not None:
            return image_to_tensors(arr, self.background)
        rgb = torch.from_numpy(np.ascontiguousarray(arr[:, :, :3]))
        alpha = torch.from_numpy(np.ascontiguousarray(arr[:, :, 3:4])) if self.has_alpha else None
        return rgb, alpha


def off_heap(image: StoredImage) -> StoredImage:
    """``image`` with its pixels copied into an anonymous memory map of their own (unmapped
    when the array is freed), when it holds :data:`OFF_HEAP_BYTES` or more."""
    if image.nbytes < OFF_HEAP_BYTES:
        return image
    buf = mmap.mmap(-1, image.nbytes)
    data = np.frombuffer(buf, dtype=image.data.dtype).reshape(image.data.shape)
    data[...] = image.data
    return StoredImage(data, image.background)


def check_cache_mb(value: object) -> float:
    """``image_cache_mb`` checked: a finite number of megabytes >= 0 (0: automatic).

    Raises:
        ValueError: one line naming the key, what it takes and what it got.
    """
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (0.0 <= float(value) < float("inf")):  # type: ignore[arg-type]
        raise ValueError(f"{KEY} must be a number of megabytes >= 0 (0: automatic, "
                         f"{AUTO_SHARE:.0%} of the available memory), got {value!r}")
    return float(value)  # type: ignore[arg-type]


def available_mb() -> float:
    """The memory available to new allocations, in MB (/proc/meminfo's MemAvailable, else
    the free physical pages)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB
    except (ValueError, OSError, AttributeError):
        return 4096.0


def budget_bytes(mb: float) -> int:
    """The cache's bound in bytes for a checked ``image_cache_mb`` (0: automatic)."""
    if mb == 0:
        mb = max(AUTO_MIN_MB, AUTO_SHARE * available_mb())
    return int(mb * MB)


class ImageCache:
    """Least-recently-used :class:`StoredImage` objects by key, at most ``budget`` bytes.

    An image larger than the whole budget is decoded for its caller and not kept. Safe to use
    from several threads: one key is decoded by one thread at a time, the others wait for it.
    """

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self.held = 0  # bytes of the images held
        self.decodes = 0
        self.hits = 0
        self._items: OrderedDict[int, StoredImage] = OrderedDict()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()

    def __contains__(self, key: int) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def set_budget(self, budget: int) -> None:
        """Bound the cache by ``budget`` bytes, evicting what no longer fits."""
        with self._lock:
            self.budget = int(budget)
            self._evict(0)

    def clear(self) -> None:
        """Drop every image."""
        with self._lock:
            self._items.clear()
            self.held = 0

    def put(self, key: int, image: StoredImage) -> None:
        """Hold ``image`` under ``key`` (the most recently used), when it fits the budget."""
        if image.nbytes <= self.budget:
            image = off_heap(image)
        with self._lock:
            self._insert(key, image)

    def get(self, key: int, decode: Callable[[], StoredImage]) -> StoredImage:
        """The image of ``key``: held, being decoded by another thread, or ``decode()``d now."""
        with self._lock:
            got = self._items.get(key)
            if got is not None:
                self._items.move_to_end(key)
                self.hits += 1
                return got
            pending = self._pending.get(key)
            if pending is None:
                mine: Future = Future()
                self._pending[key] = mine
        if pending is not None:
            return pending.result()
        try:
            image = decode()
        except BaseException as e:
            with self._lock:
                del self._pending[key]
            mine.set_exception(e)
            raise
        held = off_heap(image) if image.nbytes <= self.budget else image
        with self._lock:
            self.decodes += 1
            self._insert(key, held)
            del self._pending[key]
        mine.set_result(image)
        return image

    def _insert(self, key: int, image: StoredImage) -> None:
        old = self._items.pop(key, None)
        if old is not None:
            self.held -= old.nbytes
        if image.nbytes > self.budget:
            return
        self._evict(image.nbytes)
        self._items[key] = image
        self.held += image.nbytes

    def _evict(self, room: int) -> None:
        while self._items and self.held + room > self.budget:
            _, old = self._items.popitem(last=False)
            self.held -= old.nbytes


CACHE = ImageCache(budget_bytes(0.0))
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_next_key = iter(range(1 << 62))
_key_lock = threading.Lock()


def configure(mb: object) -> ImageCache:
    """Bound the process's cache by ``image_cache_mb`` = ``mb`` (checked; 0: automatic)."""
    CACHE.set_budget(budget_bytes(check_cache_mb(mb)))
    return CACHE


def new_key() -> int:
    """A key no other image of the process has."""
    with _key_lock:
        return next(_next_key)


def threads() -> int:
    """The decoding threads: the CPUs this process may use, at most :data:`MAX_THREADS`."""
    return max(1, min(MAX_THREADS, usable_cpus()))


def pool() -> ThreadPoolExecutor:
    """The process's decoding threads (made on first use, and again in a forked child,
    which inherits none of its parent's threads)."""
    global _pool, _pool_pid
    if _pool is None or _pool_pid != os.getpid():
        _pool = ThreadPoolExecutor(threads(), thread_name_prefix="tilesplat-decode")
        _pool_pid = os.getpid()
    return _pool


def decode_all(jobs: Sequence[Callable[[], object]], log: Callable[[str], None] | None = None,
               what: str = "images") -> list:
    """The results of ``jobs``, run in the decoding threads, in order; a progress line every
    :data:`PROGRESS_EVERY_S` seconds and one at the end go to ``log``.

    Raises:
        the first exception of a job, in the jobs' order, once the jobs already running have
        ended (the others are cancelled).
    """
    log = log or (lambda _: None)
    start = last = time.perf_counter()
    futures = [pool().submit(job) for job in jobs]
    out = []
    try:
        for i, fut in enumerate(futures):
            out.append(fut.result())
            now = time.perf_counter()
            if now - last >= PROGRESS_EVERY_S and i + 1 < len(futures):
                last = now
                log(f"{what}: {i + 1}/{len(futures)} decoded ({now - start:.1f} s)")
    except BaseException:
        for fut in futures:
            fut.cancel()
        wait(futures)  # the running ones finish before the caller cleans up after the load
        raise
    if futures:
        log(f"{what}: {len(futures)} decoded in {time.perf_counter() - start:.1f} s on "
            f"{threads()} threads; {CACHE.held / MB:.0f} of {CACHE.budget / MB:.0f} MB held "
            f"({KEY})")
    return out
