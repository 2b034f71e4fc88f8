"""The CPU backend's large output buffers are asked for huge pages before their first write
(backends/cpu/hugepages.py): advice only, so no value changes and poison mode still fills."""

from __future__ import annotations

import math
import resource
import sys

import pytest
import torch

from tilesplat.backends.cpu import _common
from tilesplat.backends.cpu.hugepages import HUGE_PAGE, MIN_BYTES, advise_huge_pages


def test_small_buffers_and_other_platforms_are_left_alone():
    assert not advise_huge_pages(torch.empty(MIN_BYTES // 4 - 1))
    assert not advise_huge_pages(torch.empty(0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_a_large_buffer_is_advised_and_keeps_its_values():
    t = torch.empty(MIN_BYTES // 4 + 12345)
    advised = advise_huge_pages(t)
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
        if "[never]" not in f.read():
            assert advised  # a kernel with transparent huge pages takes the advice
    t.copy_(torch.arange(t.numel(), dtype=torch.float32))
    assert torch.equal(t, torch.arange(t.numel(), dtype=torch.float32))
    assert HUGE_PAGE == 2 * 1024 * 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_alloc_of_a_large_buffer_still_poisons(monkeypatch):
    """The SH backward's v_shN of 1 M Gaussians in miniature: 48 MiB. With 4 KiB pages its
    first write faults 12,288 times; with the advice ~1,000 here (printed, not asserted: the
    kernel gives huge pages only where it has them free). Poison mode fills it all."""
    shape = (MIN_BYTES // 4 // 45 * 3 // 2, 15, 3)
    pages = math.prod(shape) * 4 // 4096
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = _common.alloc(shape, torch.float32)
    t.fill_(1.0)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    print(f"{faults} faults for {pages} pages of 4 KiB")
    monkeypatch.setattr(_common, "_poison", {"on": True})
    poisoned = _common.alloc(shape, torch.float32)
    assert torch.isnan(poisoned).all()
