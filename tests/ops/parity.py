"""What every op test shares: the backends under test, the tolerances, and gsplat's way of
comparing a backend with the reference (same inputs, one shared random upstream gradient,
every output and every gradient compared, a tolerance per tensor).

The ``cuda`` backend runs here on CPU tensors in numba's CUDA simulator, in its own process
(``tests/ops/test_cuda_simulator.py``); its parameters carry the ``cuda_sim`` mark and its
scenes are tiny, because the simulator runs every GPU thread as a Python thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from helpers import assert_close

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
NATIVE = ("cpu", "cuda")  # the default of the ``backend`` parameter: native vs reference
IDS = {"torch": "torch", "cpu": "cpu", "cuda": "cuda-sim"}
SCHEMES = ("per_pixel", "per_splat")
BATCHES = ((), (2,), (1, 2))
# node ids of the cuda-sim tests this (normal) run deselected: the simulator run must pass them
DESELECTED_FOR_SIMULATOR = pytest.StashKey[list[str]]()


def backend_param(name: str) -> Any:
    """One value of the ``backend`` parameter (``cuda`` is marked ``cuda_sim``)."""
    marks = [pytest.mark.cuda_sim] if name == "cuda" else []
    return pytest.param(name, id=IDS[name], marks=marks)


def batch_id(batch: tuple[int, ...]) -> str:
    return "batch" + ("x".join(map(str, batch)) or "()")


def simulated(backend: str) -> bool:
    """True when ``backend`` runs in the CUDA simulator here: keep its scenes tiny."""
    return backend == "cuda"


def dtypes(backend: str, batch: tuple[int, ...] = ()) -> tuple[torch.dtype, ...]:
    """The dtypes a test runs: float32 and float64; on cuda-sim float64 only without batch
    dims (the simulator's time goes by thread blocks; the batch dims are flattened before
    any kernel, so float64 there adds nothing but time)."""
    if simulated(backend) and batch:
        return (torch.float32,)
    return (torch.float32, torch.float64)


def tolerances(backend: str, dtype: torch.dtype) -> tuple[float, float]:
    """(forward, gradient) tolerance, abs and rel (DESIGN.md: both must fail to fail).

    float32: 1e-5 / 1e-4. float64: the cpu rasterizer's exp is a polynomial with ~1e-8
    relative error (``exp_neg`` of the shared scalar math), so 1e-7 / 1e-6 there; the cuda
    kernels call exp and agree with the reference to rounding.
    """
    if dtype == torch.float32:
        return 1e-5, 1e-4
    return (1e-7, 1e-6) if backend == "cpu" else (1e-10, 1e-10)


@dataclass
class Run:
    """One call of an op and its backward under a fixed random upstream gradient."""

    outputs: list[Tensor]  # every tensor the op returned, in order (None dropped)
    grads: list[Tensor]  # d loss / d each floating-point input tensor, in order (0 if unused)
    leaves: list[Any]  # the inputs as the op got them (float tensors: leaves needing grad)


def upstream(outputs: Sequence[Tensor], seed: int = 7) -> list[Tensor]:
    """One random upstream gradient per floating-point output, the same for every backend."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)
            for o in outputs if o.is_floating_point()]


def run(fn: Callable[..., Any], inputs: Sequence[Any], backend: str, seed: int = 7,
        **kwargs: Any) -> Run:
    """Runs ``fn(*inputs, backend=backend, **kwargs)``; float inputs become leaves.

    The loss is sum(output * upstream) over the floating-point outputs; integer outputs
    (radii, ids, last_ids) are returned for exact comparison.
    """
    leaves = [x.detach().clone().requires_grad_(True)
              if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs]
    outs = fn(*leaves, backend=backend, **kwargs)
    outs = [o for o in (outs if isinstance(outs, tuple | list) else (outs,))
            if torch.is_tensor(o)]
    floats = [o for o in outs if o.is_floating_point() and o.requires_grad]
    wanted = [x for x in leaves if torch.is_tensor(x) and x.requires_grad]
    grads: Sequence[Tensor | None] = [None] * len(wanted)
    if floats:
        loss = sum((o * u).sum() for o, u in zip(floats, upstream(floats, seed), strict=True))
        grads = torch.autograd.grad(loss, wanted, allow_unused=True)
    return Run([o.detach() for o in outs],
               [torch.zeros_like(w) if g is None else g for w, g in zip(wanted, grads,
                                                                        strict=True)],
               leaves)


def names_of(prefix: str, n: int, names: Sequence[str] | None) -> list[str]:
    return list(names) if names is not None else [f"{prefix} {i}" for i in range(n)]


def compare(what: str, got: Run, want: Run, fwd: float, grad: float,
            outputs: Sequence[str] | None = None, inputs: Sequence[str] | None = None,
            per_tensor: dict[str, tuple[float, float]] | None = None) -> None:
    """Every output (integer ones exactly) and every gradient of ``got`` against ``want``.

    ``outputs`` / ``inputs`` name the tensors in the failure message (gradients are
    ``v_<input>``); ``per_tensor`` maps a name to its own (atol, rtol).
    """
    per_tensor = per_tensor or {}
    assert len(got.outputs) == len(want.outputs), f"{what}: number of outputs"
    out_names = names_of("output", len(want.outputs), outputs)
    for name, a, e in zip(out_names, got.outputs, want.outputs, strict=True):
        if not e.is_floating_point():
            assert a.dtype == e.dtype and torch.equal(a, e), f"{what} {name}: not equal"
            continue
        assert a.dtype == e.dtype, f"{what} {name}: {a.dtype} != {e.dtype}"
        atol, rtol = per_tensor.get(name, (fwd, fwd))
        assert_close(f"{what} {name}", a, e, atol, rtol)
    grad_names = [f"v_{n}" for n in names_of("input", len(want.grads), inputs)]
    for name, a, e in zip(grad_names, got.grads, want.grads, strict=True):
        atol, rtol = per_tensor.get(name, (grad, grad))
        assert_close(f"{what} {name}", a, e, atol, rtol)


def assert_parity(fn: Callable[..., Any], args: Sequence[Any], backend: str,
                  dtype: torch.dtype, what: str, tol: tuple[float, float] | None = None,
                  kw: dict[str, Any] | None = None, **names: Any) -> tuple[Run, Run]:
    """``fn`` on ``backend`` against the torch reference at ``tol`` (forward, gradients;
    default :func:`tolerances`), ``kw`` passed to ``fn``; returns (got, want). ``names``:
    ``outputs``, ``inputs`` and ``per_tensor`` of :func:`compare`."""
    want = run(fn, args, "torch", **(kw or {}))
    got = run(fn, args, backend, **(kw or {}))
    compare(what, got, want, *(tol or tolerances(backend, dtype)), **names)
    return got, want
