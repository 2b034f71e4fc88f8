"""The cuda backend's launch path, with numba's CUDA API replaced by fakes (no GPU here):
launches happen in the numba context of the tensors' device (``cuda:1`` on GPU 1, not on
numba's current device 0), views are made inside it and cached, placeholders are cached,
and launches are counted."""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install tilesplat[cuda])",
                allow_module_level=True)
if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("tests the hardware launch path", allow_module_level=True)

import torch  # noqa: E402

from tilesplat.backends.cuda import runtime  # noqa: E402


class FakeGPU:
    """A ``cuda.gpus[i]`` context manager that records which GPU is current."""

    def __init__(self, index: int, current: list) -> None:
        self.index, self.current = index, current

    def __enter__(self):
        self.current.append(self.index)
        return self

    def __exit__(self, *exc):
        self.current.pop()


class FakeCuda:
    def __init__(self) -> None:
        self.current: list[int] = [0]  # numba's current device: 0
        self.gpus = [FakeGPU(i, self.current) for i in range(2)]
        self.views: list[tuple] = []

    def from_cuda_array_interface(self, desc, owner=None, sync=True):
        assert owner is None and sync is False
        self.views.append((desc["data"][0], self.current[-1]))
        return ("view", desc["data"][0], self.current[-1])

    def external_stream(self, handle):
        return ("stream", handle, self.current[-1])


class FakeTensor(torch.Tensor):
    """A CPU tensor that reports ``cuda:1`` and a CUDA array interface."""

    @property
    def device(self):
        return torch.device("cuda", 1)

    @property
    def __cuda_array_interface__(self):
        return {"data": (self.data_ptr(), False), "shape": tuple(self.shape)}


@pytest.fixture
def fake(monkeypatch):
    cuda = FakeCuda()
    monkeypatch.setattr(runtime, "SIMULATOR", False)
    monkeypatch.setattr(runtime, "cuda", cuda)

    class _Stream:
        cuda_stream = 1234

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: _Stream())
    monkeypatch.setattr(runtime, "_views", {})
    monkeypatch.setattr(runtime, "_streams", {})
    return cuda


def test_launch_runs_in_the_tensors_device_context(fake):
    seen = []

    class Kernel:
        def __getitem__(self, config):
            grid, block, stream = config

            def call(*args):
                seen.append((fake.current[-1], stream, args))

            return call

    t = torch.zeros(4).as_subclass(FakeTensor)
    device = torch.device("cuda", 1)
    runtime.reset_launch_stats()
    runtime.launch(Kernel(), 2, 32, device, t, 7, True)
    (gpu, stream, args), = seen
    assert gpu == 1, "the kernel must launch on GPU 1, not numba's current device 0"
    assert stream == ("stream", 1234, 1), "the stream belongs to GPU 1's context"
    assert args[0] == ("view", t.data_ptr(), 1) and args[1:] == (7, True)
    assert fake.views == [(t.data_ptr(), 1)], "the view is made inside GPU 1's context"
    assert fake.current == [0], "the previous context is restored"
    runtime.launch(Kernel(), 2, 32, device, t, 7, True)
    assert len(fake.views) == 1, "the second launch reuses the cached view"
    assert runtime.launch_stats()["launches"] == 2


def test_views_are_keyed_by_layout(fake):
    base = torch.zeros(8)
    a = base[:4].as_subclass(FakeTensor)
    b = base.reshape(2, 4).as_subclass(FakeTensor)  # same pointer, other shape
    runtime.view(a)
    runtime.view(b)
    runtime.view(a)
    assert len(fake.views) == 2


def test_placeholders_are_cached():
    like = torch.zeros(3)
    p1 = runtime.optional(None, like, 2)
    p2 = runtime.optional(None, like, 2)
    assert p1 is p2 and p1.shape == (1, 1)
    assert runtime.optional(None, like, 1, torch.bool).dtype == torch.bool
    t = torch.ones(2)
    assert runtime.optional(t, like, 1) is t


def test_launcher_time_excludes_kernel_calls():
    import time

    @runtime.launcher
    def op():
        t0 = time.perf_counter()
        time.sleep(0.05)  # a "kernel call", booked as launch() books it
        runtime._stats["kernel_s"] += time.perf_counter() - t0
        time.sleep(0.01)  # the launcher's own Python

    runtime.reset_launch_stats()
    op()
    stats = runtime.launch_stats()
    assert stats["launcher_calls"] == 1
    assert 0.009 < stats["host_s"] < 0.045, stats
