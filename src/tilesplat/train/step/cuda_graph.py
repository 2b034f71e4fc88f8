"""The trainer's step as one CUDA graph (``cuda_graph = true``, the default on ``cuda``).

A steady step on a GPU is ~150 kernel launches and their Python; captured once into a
``torch.cuda.CUDAGraph`` it is replayed with one call, and the host no longer sets the pace.
What is captured: the render (the ``cuda`` kernels launch on PyTorch's current stream, the
capture stream during capture), the loss, the backward and fused Adam (``capturable``, its
learning rates as device tensors, filled before each replay; ``found_inf`` from the step's
finite checks). What runs eagerly between replays: the batch's copy into the graph's static
inputs, the strategy (densification reads the device and changes the shapes), logging,
evaluation, checkpoints.

A graph holds the addresses and shapes of everything it touches, so it is captured again
when one of them changes: the Gaussian count or any parameter or Adam state (densification),
the intersection capacity (``train/step/capacity.py``; a graph needs capacity mode: no count read),
the image size (a resolution level), the SH degree. A new key first runs ``WARMUP`` eager
steps (kernels compiled, the caching allocator warm), then captures and replays.

Where no graph can be captured (a CPU, numba's CUDA simulator, a run in exact intersection
mode) the step runs eagerly, and :func:`graph_unavailable` says why, in the one line the
trainer logs. :class:`StepGraph` takes its graph maker as an argument, so the bookkeeping
(static inputs, keys, recapture, the rates) is tested on the CPU with a recorder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from ...keys import Key
from .. import seams

WARMUP = 2  # eager steps of a new key before it is captured


KEYS = (Key("cuda_graph", True, "on cuda, replay the training step as one CUDA graph (captured "
            "again when the Gaussians, the capacity, the image size or the SH degree change; "
            "needs isect_capacity = auto); where none can be captured the step runs eagerly, "
            "and the log says why (docs/gpu.md)"),)
seams.register_keys("CUDA graph (train/step/cuda_graph.py)", KEYS)


def graph_unavailable(device: torch.device, capacity_mode: bool,
                      lens: bool = False) -> str | None:
    """Why the step cannot run as a CUDA graph on ``device`` (None when it can); ``lens``: the
    batches carry their cameras' lenses (``camera_mode = "native"``)."""
    if lens:  # a captured graph would keep the lens of the batch it was captured with
        return ("camera_mode = 'native': the batches' lens coefficients are not part of the "
                "captured graph (not run on a GPU yet)")
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1":
        return "numba's CUDA simulator runs the kernels on the CPU, where there is no graph"
    if device.type != "cuda":
        return f"the training device is {device}, not a GPU"
    if not capacity_mode:
        return ("the intersection lists are sized exactly (isect_capacity = 'exact', a "
                "training feature or a parallel job): each render reads its count back")
    return None


class CudaGraphMaker:
    """Captures with ``torch.cuda.graph`` into one private memory pool."""

    def __init__(self) -> None:
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        """Capture ``fn`` (nothing runs yet); returns the replay, which runs the captured
        work and returns ``fn``'s result of the capture (static tensors, rewritten by each
        replay)."""
        graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, pool=self.pool):
            out = fn()

        def replay() -> Any:
            graph.replay()
            return out

        return replay


def _batch_tensors(batch: Any) -> dict[str, Tensor]:
    return {k: v for k, v in vars(batch).items() if isinstance(v, Tensor)}


def _key_part(t: Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.dtype)


class StepGraph:
    """Replays the step of one key; captures it after :data:`WARMUP` eager steps.

    Args:
        run_step: ``run_step(step, batch, set_rates)`` queues one step (render, loss,
            backward, Adam) on ``batch`` and returns its attempt; with ``set_rates=False`` it
            leaves the learning rates as they are (a graph reads them from tensors).
        set_rates: ``set_rates(step)`` fills the learning-rate tensors of ``step``.
        state: ``state()`` -> the tensors the graph reads or writes in place (parameters,
            Adam states): their addresses are part of the key.
        maker: the graph maker (:class:`CudaGraphMaker` on a GPU): ``maker.capture(fn)``
            returns the replay, a callable that returns the result of ``fn``.
    """

    def __init__(self, run_step: Callable[[int, Any, bool], Any],
                 set_rates: Callable[[int], None],
                 state: Callable[[], list[Tensor]], maker: Any) -> None:
        self.run_step = run_step
        self.set_rates = set_rates
        self.state = state
        self.maker = maker
        self._key: tuple | None = None
        self._seen: tuple[tuple | None, int] = (None, 0)
        self._static: dict[str, Tensor] | None = None
        self._replay: Callable[[], Any] | None = None
        self.captures = 0
        self.replays = 0

    def key(self, batch: Any, extra: tuple) -> tuple:
        """What a graph depends on: ``extra`` (capacity, SH degree), the batch's shapes, the
        state's addresses and shapes."""
        shapes = tuple((k, tuple(v.shape), v.dtype) for k, v in _batch_tensors(batch).items())
        return (extra, shapes, tuple(_key_part(t) for t in self.state()))

    def step(self, step: int, batch: Any, extra: tuple) -> tuple[Any, bool]:
        """Run ``step`` on ``batch``: replayed when its key is captured, else eagerly (and
        captured once the key has been seen :data:`WARMUP` times). Returns the attempt and
        whether it was replayed (its tensors are the graph's, rewritten by the next replay)."""
        key = self.key(batch, extra)
        if key != self._key:
            self.release()
            seen_key, count = self._seen
            count = count + 1 if seen_key == key else 1
            self._seen = (key, count)
            if count <= WARMUP:
                return self.run_step(step, batch, True), False
            self._capture(step, batch, key)
        assert self._static is not None and self._replay is not None
        for name, t in _batch_tensors(batch).items():
            self._static[name].copy_(t, non_blocking=True)
        self.set_rates(step)
        out = self._replay()
        self.replays += 1
        return out, True

    def _capture(self, step: int, batch: Any, key: tuple) -> None:
        static_batch = type(batch)(**{k: (v.clone() if isinstance(v, Tensor) else v)
                                      for k, v in vars(batch).items()})
        self._static = _batch_tensors(static_batch)
        self._replay = self.maker.capture(lambda: self.run_step(step, static_batch, False))
        self._key = key
        self.captures += 1

    def release(self) -> None:
        """Drop the graph (before a checkpoint, or when the key changed)."""
        self._key = None
        self._static = None
        self._replay = None


def use_rate_tensors(optimizers: dict[str, torch.optim.Optimizer], device: torch.device) -> None:
    """Make every Adam graph-capturable: learning rates as 0-dim device tensors and
    ``capturable`` on (fused Adam keeps its step counts on the device already)."""
    for opt in optimizers.values():
        for group in opt.param_groups:
            if not isinstance(group["lr"], Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), dtype=torch.float32,
                                           device=device)
            group["capturable"] = True


def plain_rates(state: dict[str, Any]) -> dict[str, Any]:
    """An optimiser's ``state_dict()`` with float learning rates and ``capturable`` off, as
    a checkpoint stores it (so that it loads on any device)."""
    groups = []
    for group in state["param_groups"]:
        group = dict(group)
        if isinstance(group.get("lr"), Tensor):
            group["lr"] = float(group["lr"])
        group["capturable"] = False
        groups.append(group)
    return {**state, "param_groups": groups}
