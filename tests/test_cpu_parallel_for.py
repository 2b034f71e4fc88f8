"""``parallel_for``: every part runs once, the caller runs the first, and no part is still
running when the call returns, also when a part raised."""

import threading
import time

import pytest

from tilesplat.backends.cpu import _common


@pytest.fixture(params=[1, 2, 3])
def threads(request, monkeypatch):
    monkeypatch.setattr(_common, "num_threads", lambda: request.param)
    return request.param


def test_every_part_runs_once_and_the_caller_runs_the_first(threads):
    seen = []
    lock = threading.Lock()

    def part(first, step, tag):
        with lock:
            seen.append((first, step, tag, threading.get_ident()))

    _common.parallel_for(part, 5, "x")
    assert sorted(s[:3] for s in seen) == [(f, threads, "x") for f in range(threads)]
    first_thread = next(s[3] for s in seen if s[0] == 0)
    assert first_thread == threading.get_ident()


def test_fewer_items_than_threads_use_fewer_parts(threads):
    seen = []
    _common.parallel_for(lambda first, step: seen.append((first, step)), 1)
    assert seen == [(0, 1)]


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failing_part_is_raised_after_every_part_ended(monkeypatch, failing):
    monkeypatch.setattr(_common, "num_threads", lambda: 2)
    done = []

    def part(first, step):
        if first == failing:
            raise ValueError(f"part {first}")
        time.sleep(0.05)  # the other part is still running when the failing one raises
        done.append(first)

    with pytest.raises(ValueError, match=f"part {failing}"):
        _common.parallel_for(part, 2)
    assert done == [1 - failing]
