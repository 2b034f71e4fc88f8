"""2DGS parity and speed of a native backend against the torch reference on one device:
``rasterization_2dgs`` (projection, tile lists, rasterizer; RGB+D, the distortion loss)
forward + backward, every image and every gradient, measured in one run, interleaved, behind
a parity gate (no ratio on a red gate). ``scripts/gpu_check.py`` runs it for ``cuda``.

The gate: a float32 tensor passes when it is within 1e-4 (abs or rel) of the float32
reference, or no further from the float64 reference than twice the float32 reference is (the
2DGS gradients are ill-conditioned in float32 for surfels seen near edge-on; the native
kernels intersect in float64, see ``backends/cpu/twodgs_rasterize_fwd.py``).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from ..rendering import rasterization_2dgs

TOL = 1e-4
IMAGES = ("colors", "alphas", "normals", "distort", "median")
LEAVES = ("means", "quats", "scales", "opacities", "colors")


def surfel_scene(n: int, size: int, device: torch.device, seed: int = 0) -> tuple:
    """n random surfels in front of one pinhole camera (90 degree field of view) of size x
    size pixels, on ``device``: (means, quats, scales, opacities, colours, viewmats, Ks)."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([2.5, 2.5, 1.0])
    means[:, 2] += 4.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.15 + 0.02
    opac = torch.rand(n, generator=g) * 0.8 + 0.1
    rgb = torch.rand(n, 3, generator=g)
    focal = 0.5 * size / math.tan(math.pi / 4)
    K = torch.tensor([[[focal, 0, size / 2], [0, focal, size / 2], [0, 0, 1]]])
    return tuple(t.to(device) for t in (means, quats, scales, opac, rgb, torch.eye(4)[None], K))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pass(backend: str, scene: tuple, size: int, ups: list | None, dtype: torch.dtype):
    """One forward + backward: (seconds, images, gradients); ``ups`` None draws them."""
    leaves = [t.to(dtype).clone().requires_grad_() for t in scene[:5]]
    view, K = (t.to(dtype) for t in scene[5:])
    _sync(scene[0].device)
    t0 = time.perf_counter()
    out = rasterization_2dgs(*leaves, view, K, size, size, render_mode="RGB+D", distloss=True,
                             backend=backend)
    images = [out[0], out[1], out[2], out[4], out[5]]
    if ups is None:
        g = torch.Generator().manual_seed(1)
        ups = [torch.randn(o.shape, generator=g).to(o.device) for o in images]
    grads = torch.autograd.grad(images, leaves, grad_outputs=[u.to(dtype) for u in ups])
    _sync(scene[0].device)
    return time.perf_counter() - t0, [o.detach() for o in images], list(grads), ups


def run_twodgs_check(backend: str = "cuda", n: int = 3000, size: int = 128, repeats: int = 5,
                     device: torch.device | None = None) -> dict[str, Any]:
    """Parity of ``backend`` against the torch reference (float32, arbitrated by the float64
    reference) and the median seconds of a forward + backward of each, interleaved."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    scene = surfel_scene(n, size, device)
    _, ref, ref_g, ups = _pass("torch", scene, size, None, torch.float32)
    _, got, got_g, _ = _pass(backend, scene, size, ups, torch.float32)  # compiles first
    _, exact, exact_g, _ = _pass("torch", scene, size, ups, torch.float64)
    names = [*IMAGES, *(f"v_{x}" for x in LEAVES)]
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
                times[arm].append(_pass(arm, scene, size, ups, torch.float32)[0])
    med = {arm: statistics.median(ts) if ts else None for arm, ts in times.items()}
    ratio = med["torch"] / med[backend] if passed and med[backend] else None
    return {"backend": backend, "device": str(device), "surfels": n, "size": size,
            "passed": passed, "tensors": tensors, "seconds": med, "speedup": ratio,
            "repeats": repeats}


def format_twodgs_check(res: dict[str, Any]) -> str:
    """One paragraph: the gate, the worst tensor, the times and the ratio."""
    worst = max(res["tensors"], key=lambda t: t["max_abs"])
    line = (f"2DGS {res['backend']} vs torch on {res['device']} ({res['surfels']} surfels, "
            f"{res['size']}x{res['size']}, rasterization_2dgs forward + backward): parity "
            f"{'PASS' if res['passed'] else 'FAIL'} (worst {worst['name']}: max abs "
            f"{worst['max_abs']:.3g}, {worst['vs_float64']:.3g} from float64 against the "
            f"reference's {worst['reference_vs_float64']:.3g})")
    if res["speedup"] is not None:
        s = res["seconds"]
        line += (f"; median of {res['repeats']}: torch {s['torch'] * 1e3:.2f} ms, "
                 f"{res['backend']} {s[res['backend']] * 1e3:.2f} ms, {res['speedup']:.1f}x")
    return line
