"""The CPU backend's pool of large output buffers (``backends/cpu/buffer_pool.py``): a buffer
is handed out again only when nothing else holds it, the pool stays within its bound, and a
kernel's results do not depend on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tilesplat.backends.cpu import buffer_pool
from tilesplat.backends.cpu._common import alloc
from tilesplat.backends.cpu.hugepages import MIN_BYTES

BIG = (MIN_BYTES // 4 + 1000,)  # float32 elements: just above the pooled size


@pytest.fixture(autouse=True)
def _empty_pool(monkeypatch):
    monkeypatch.delenv("TILESPLAT_BUFFER_POOL_MB", raising=False)
    buffer_pool.clear()
    yield
    buffer_pool.clear()


def _base(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_size_classes_round_up_by_at_most_an_eighth():
    for n in [1, 7, 8, 9, 1000, MIN_BYTES, MIN_BYTES + 1, 180_000_000, 3 * 2**30 + 5]:
        c = buffer_pool.size_class(n)
        assert n <= c <= n + n // 8 + 1
        assert buffer_pool.size_class(c) == c  # a class is its own class
    assert len({buffer_pool.size_class(n) for n in range(2**27 + 1, 2**28 + 1, 2**16)}) == 8


def test_small_buffers_are_not_pooled():
    assert buffer_pool.take((1000,), torch.float32) is None
    assert buffer_pool.held_bytes() == 0


def test_a_buffer_is_reused_only_when_nothing_holds_it():
    a = buffer_pool.take(BIG, torch.float32)
    assert a is not None and a.shape == BIG and a.dtype == torch.float32 and a.is_contiguous()
    base = _base(a)
    b = buffer_pool.take(BIG, torch.float32)  # a is held: another buffer
    assert _base(b) != base
    del b
    holders = [a[10:20], a.numpy(), a.view(torch.int32)]
    del a
    while holders:  # a view, a NumPy array, a reinterpretation: each keeps it taken
        c = buffer_pool.take(BIG, torch.float32)
        assert _base(c) != base
        del c
        holders.pop(0)
    d = buffer_pool.take(BIG, torch.int32)  # the same size class, free now: reused
    assert _base(d) == base and d.dtype == torch.int32
    # a gradient the optimizer holds until zero_grad(set_to_none=True)
    p = torch.nn.Parameter(torch.zeros(BIG))
    p.grad = d.view(torch.float32)
    del d
    e = buffer_pool.take(BIG, torch.float32)
    assert _base(e) != base
    del e
    p.grad = None
    assert _base(buffer_pool.take(BIG, torch.float32)) == base


def test_the_pool_stays_within_its_bound(monkeypatch):
    cap = buffer_pool.size_class(BIG[0] * 4)
    monkeypatch.setenv("TILESPLAT_BUFFER_POOL_MB", str((2 * cap - 1) >> 20))
    limit = buffer_pool.limit_bytes()
    assert 2 * cap > limit >= cap
    a = buffer_pool.take(BIG, torch.float32)
    assert a is not None
    assert buffer_pool.take(BIG, torch.float32) is None  # a in use and no room: not pooled
    del a
    bigger = (BIG[0] * 5 // 4,)
    b = buffer_pool.take(bigger, torch.float32)  # another class: the idle one makes room
    assert b is not None and buffer_pool.held_bytes() <= limit
    assert buffer_pool.take(BIG, torch.float32) is None
    del b
    assert buffer_pool.take(BIG, torch.float32) is not None
    assert buffer_pool.held_bytes() <= limit
    for off in ("0", "-5"):
        monkeypatch.setenv("TILESPLAT_BUFFER_POOL_MB", off)
        buffer_pool.clear()
        assert buffer_pool.take(BIG, torch.float32) is None
    monkeypatch.setenv("TILESPLAT_BUFFER_POOL_MB", "many")
    assert buffer_pool.limit_bytes() == buffer_pool.DEFAULT_MB << 20


def test_an_idle_buffer_behind_one_in_use_makes_room(monkeypatch):
    # the pool's oldest buffer is in use, the next one idle: a third size class frees the
    # idle one alone (found at 1 M Gaussians, where the pool fills: the eviction compared
    # tensors of different sizes and raised)
    cap = buffer_pool.size_class(BIG[0] * 4)
    monkeypatch.setenv("TILESPLAT_BUFFER_POOL_MB", str((3 * cap) >> 20))
    held = buffer_pool.take(BIG, torch.float32)
    other = (BIG[0] * 9 // 8,)
    idle = buffer_pool.take(other, torch.float32)
    assert held is not None and idle is not None
    idle_base = _base(idle)
    del idle
    third = buffer_pool.take((BIG[0] * 5 // 4,), torch.float32)
    assert third is not None and _base(third) not in (idle_base, _base(held))
    assert buffer_pool.held_bytes() <= buffer_pool.limit_bytes()
    del third
    again = buffer_pool.take(BIG, torch.float32)  # another buffer: held is still in use
    assert again is not None and _base(again) != _base(held)


def test_alloc_poisons_pooled_buffers():
    from tilesplat.backends.cpu._common import set_poison

    a = alloc(BIG, torch.float32)
    a.fill_(1.0)
    del a
    set_poison(True)
    try:
        b = alloc(BIG, torch.float32)
        assert torch.isnan(b).all()
    finally:
        set_poison(None)


def test_sh_backward_is_the_same_with_and_without_the_pool(monkeypatch):
    from tilesplat.backends.cpu import sh

    n = MIN_BYTES // (45 * 4) + 64  # v_rest [n, 15, 3] float32 above the pooled size
    g = torch.Generator().manual_seed(0)
    dirs = torch.randn(n, 3, generator=g)
    coeffs = torch.randn(n, 1, 3, generator=g)
    rest = torch.randn(n, 15, 3, generator=g)
    radii = (torch.rand(n, 2, generator=g) * 3).to(torch.int32)
    v = torch.randn(n, 3, generator=g)

    def run():
        return sh.backward(3, dirs, coeffs, rest, radii, (n, 1), v, True, rgb=True)

    monkeypatch.setenv("TILESPLAT_BUFFER_POOL_MB", "0")
    want = run()
    monkeypatch.setenv("TILESPLAT_BUFFER_POOL_MB", "1024")
    first = run()
    base = _base(first[2])
    first[2].fill_(float("nan"))  # what a previous step left in the buffer
    del first
    again = run()
    assert _base(again[2]) == base  # the same memory, written anew
    for w, got in zip(want, again, strict=True):
        assert np.array_equal(w.numpy().view(np.uint8), got.numpy().view(np.uint8))


def test_threads_never_share_a_buffer():
    import threading

    seen: list[str] = []

    def worker(mark: float) -> None:
        for _ in range(20):
            a = buffer_pool.take(BIG, torch.float32)
            if a is None:
                continue
            a[:1024].fill_(mark)
            a[-1024:].fill_(mark)
            if not (bool((a[:1024] == mark).all()) and bool((a[-1024:] == mark).all())):
                seen.append(f"thread {mark}: a buffer written by another thread")
            del a

    threads = [threading.Thread(target=worker, args=(float(k),)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert not seen, seen
    assert buffer_pool.held_bytes() <= 4 * buffer_pool.size_class(BIG[0] * 4)
