"""Large CPU buffers kept after use and handed out again (``alloc``'s pool).

A buffer of more than glibc's largest ``mmap`` threshold (32 MiB) is mapped fresh at every
allocation and unmapped when freed, so the kernel zeroes every page of it again at its first
write. A training step at 1 M Gaussians allocates two such buffers each time: the SH
backward's ``v_shN`` (180 MB, which becomes the parameter's gradient until the optimizer's
``zero_grad``) and the rasterizer backward's per-intersection rows (~120 MB); the page faults
and zeroing cost the SH backward ~35 of its ~85 ms of CPU (docs/benchmarks.md).

The pool keeps each such buffer when its last user lets go of it and gives it to the next
allocation of the same size class. A buffer is handed out again only when nothing but the pool
holds its storage (PyTorch's count of references to the storage: every tensor, view and NumPy
array of it holds one), so nothing a caller still holds is ever written. Sizes are rounded up
to eight classes per power of two (at most 12.5 % unused). The idle buffers are bounded:
``TILESPLAT_BUFFER_POOL_MB`` (default 1024; 0 turns the pool off), the oldest idle ones freed
first; a buffer that does not fit is allocated and freed as before.
"""

from __future__ import annotations

import os
import threading

import torch

from .hugepages import MIN_BYTES, advise_huge_pages

DEFAULT_MB = 1024


def _use_count_fn():
    """PyTorch's storage reference count, or None where this PyTorch lacks it (no pool)."""
    return getattr(torch._C, "_storage_Use_Count", None)


_use_count = _use_count_fn()
_lock = threading.Lock()
_buffers: list[torch.Tensor] = []  # flat uint8 tensors, oldest first


def limit_bytes() -> int:
    """The most bytes the pool keeps (``TILESPLAT_BUFFER_POOL_MB``; invalid values: the
    default)."""
    raw = os.environ.get("TILESPLAT_BUFFER_POOL_MB", "")
    try:
        mb = int(raw) if raw.strip() else DEFAULT_MB
    except ValueError:
        mb = DEFAULT_MB
    return max(mb, 0) << 20


def size_class(nbytes: int) -> int:
    """nbytes rounded up to the next of eight sizes per power of two."""
    step = 1 << max(nbytes.bit_length() - 4, 0)
    return -(-nbytes // step) * step


def _idle(buf: torch.Tensor) -> bool:
    # held by the pool's list and by the temporary storage object of this call only
    return _use_count(buf.untyped_storage()._cdata) <= 2


def take(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """An uninitialised contiguous tensor of ``shape`` and ``dtype`` on a pooled buffer, or
    None (too small to pool, the pool off or full): the caller allocates as usual."""
    numel = 1
    for n in shape:
        numel *= int(n)
    nbytes = numel * dtype.itemsize
    if nbytes < MIN_BYTES or _use_count is None:
        return None
    cap = size_class(nbytes)
    limit = limit_bytes()
    if cap > limit:
        return None
    with _lock:
        buf = next((b for b in _buffers if b.numel() == cap and _idle(b)), None)
        if buf is None:
            held = sum(b.numel() for b in _buffers)
            freed: set[int] = set()
            for old in [b for b in _buffers if _idle(b)]:  # oldest first
                if held + cap <= limit:
                    break
                freed.add(id(old))
                held -= old.numel()
            # by identity: ``list.remove`` would compare the tensors before it element-wise
            _buffers[:] = [b for b in _buffers if id(b) not in freed]
            if held + cap > limit:
                return None
            buf = torch.empty(cap, dtype=torch.uint8)
            advise_huge_pages(buf)
            _buffers.append(buf)
        # the view holds the storage before the lock goes: no other thread takes it meanwhile
        return buf[:nbytes].view(dtype).view(shape)


def held_bytes() -> int:
    """Bytes the pool holds, idle or in use."""
    with _lock:
        return sum(b.numel() for b in _buffers)


def clear() -> None:
    """Lets go of every buffer (those in use stay alive with their users)."""
    with _lock:
        _buffers.clear()
