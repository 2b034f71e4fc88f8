"""The parity-then-time scaffolding of ``scripts/gpu_check.py``'s items that check a native
backend against the torch reference on one device (``bench/ut.py``: 3DGUT,
``bench/twodgs.py``: 2DGS): one render function, forward + backward under one random upstream
gradient, every image and every gradient behind a parity gate, then the two arms timed
interleaved (no ratio on a red gate).

The gate: a float32 tensor passes when it is within ``TOL`` (abs or rel) of the float32
reference, or no further from the float64 reference than twice the float32 reference is (the
references' float32 math is ill-conditioned in places the native kernels compute in float64:
near a Gaussian's axis for eval3d, near edge-on surfels for 2DGS).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

TOL = 1e-4

# render(backend, leaves, rest) -> the images [Tensor, ...] of one forward pass, where leaves
# are the scene's first tensors (the differentiated ones) and rest the others, in the pass's
# dtype
Render = Callable[[str, list[Tensor], list[Tensor]], list[Tensor]]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_pass(render: Render, backend: str, scene: tuple, n_leaves: int, ups: list | None,
               dtype: torch.dtype) -> tuple[float, list[Tensor], list[Tensor], list[Tensor]]:
    """One forward + backward of ``render`` on ``scene`` in ``dtype``: (seconds, images,
    gradients of the first ``n_leaves`` tensors, upstream gradients); ``ups`` None draws
    them (seed 1)."""
    leaves = [t.to(dtype).clone().requires_grad_() for t in scene[:n_leaves]]
    rest = [t.to(dtype) for t in scene[n_leaves:]]
    device = scene[0].device
    _sync(device)
    t0 = time.perf_counter()
    images = render(backend, leaves, rest)
    if ups is None:
        g = torch.Generator().manual_seed(1)
        ups = [torch.randn(o.shape, generator=g).to(o.device) for o in images]
    grads = torch.autograd.grad(images, leaves, grad_outputs=[u.to(dtype) for u in ups])
    _sync(device)
    return time.perf_counter() - t0, [o.detach() for o in images], list(grads), ups


def gated_check(render: Render, backend: str, scene: tuple, images: tuple[str, ...],
                leaves: tuple[str, ...], repeats: int) -> dict[str, Any]:
    """Parity of ``backend`` against the torch reference (float32, arbitrated by the float64
    reference) per image and per gradient (``v_`` + leaf), then the median seconds of a
    forward + backward of each, interleaved (only on a green gate): {passed, tensors,
    seconds, speedup, repeats}."""
    n = len(leaves)
    _, ref, ref_g, ups = timed_pass(render, "torch", scene, n, None, torch.float32)
    _, got, got_g, _ = timed_pass(render, backend, scene, n, ups, torch.float32)  # compiles
    _, exact, exact_g, _ = timed_pass(render, "torch", scene, n, ups, torch.float64)
    names = [*images, *(f"v_{x}" for x in leaves)]
    tensors = []
    for name, a, r, e in zip(names, got + got_g, ref + ref_g, exact + exact_g, strict=True):
        a, r, e = a.double(), r.double(), e.double()
        diff = (a - r).abs()
        within = bool(((diff <= TOL) | (diff <= TOL * r.abs())).all())
        err, ref_err = float((a - e).abs().max()), float((r - e).abs().max())
        tensors.append({"name": name, "max_abs": float(diff.max()), "vs_float64": err,
                        "reference_vs_float64": ref_err,
                        "passed": within or err <= 2 * ref_err})
    passed = all(t["passed"] for t in tensors)
    times: dict[str, list[float]] = {"torch": [], backend: []}
    if passed:
        for _ in range(repeats):
            for arm in times:
                times[arm].append(timed_pass(render, arm, scene, n, ups, torch.float32)[0])
    med = {arm: statistics.median(ts) if ts else None for arm, ts in times.items()}
    ratio = med["torch"] / med[backend] if passed and med[backend] else None
    return {"passed": passed, "tensors": tensors, "seconds": med, "speedup": ratio,
            "repeats": repeats}


def format_check(res: dict[str, Any], what: str) -> str:
    """One paragraph: ``what`` (the item and its scene), the gate, the worst tensor, the
    times and the ratio."""
    worst = max(res["tensors"], key=lambda t: t["max_abs"])
    line = (f"{what}: parity {'PASS' if res['passed'] else 'FAIL'} (worst {worst['name']}: "
            f"max abs {worst['max_abs']:.3g}, {worst['vs_float64']:.3g} from float64 against "
            f"the reference's {worst['reference_vs_float64']:.3g})")
    if res["speedup"] is not None:
        s = res["seconds"]
        line += (f"; median of {res['repeats']}: torch {s['torch'] * 1e3:.2f} ms, "
                 f"{res['backend']} {s[res['backend']] * 1e3:.2f} ms, {res['speedup']:.1f}x")
    return line
