"""3DGUT parity and speed of a native backend against the torch reference on one device:
``rasterization(with_ut=True, with_eval3d=True)`` (the unscented projection, tile lists, the
eval3d rasterizer) through a distorted (OpenCV) camera under a rolling shutter, forward +
backward, every image and every gradient, measured in one run, interleaved, behind a parity
gate (no ratio on a red gate). ``scripts/gpu_check.py`` runs it for ``cuda``.

The gate: a float32 tensor passes when it is within 1e-4 (abs or rel) of the float32
reference, or no further from the float64 reference than twice the float32 reference is (the
reference's float32 cross product cancels near a Gaussian's axis; the native kernels compute
the pair's power in float64, see ``backends/cpu/ut_rasterize_fwd.py``).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from ..ops.camera import RollingShutterType
from ..rendering import rasterization

TOL = 1e-4
IMAGES = ("colors", "alphas")
LEAVES = ("means", "quats", "scales", "opacities", "colors")


def ut_scene(n: int, size: int, device: torch.device, seed: int = 0) -> tuple:
    """n random Gaussians in front of one OpenCV camera (90 degree field of view, mild radial
    and tangential distortion, a rolling shutter that moves and turns it a little) of size x
    size pixels, on ``device``: (means, quats, scales, opacities, colours, viewmats, Ks,
    viewmats_rs, radial, tangential)."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([2.5, 2.5, 1.0])
    means[:, 2] += 4.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.15 + 0.02
    opac = torch.rand(n, generator=g) * 0.8 + 0.1
    rgb = torch.rand(n, 3, generator=g)
    focal = 0.5 * size / math.tan(math.pi / 4)
    K = torch.tensor([[[focal, 0, size / 2], [0, focal, size / 2], [0, 0, 1]]])
    view = torch.eye(4)[None]
    view_rs = view.clone()
    view_rs[0, 0, 3] = 0.05
    c, s = math.cos(0.03), math.sin(0.03)
    view_rs[0, :3, :3] = torch.tensor([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    radial = torch.tensor([[-0.05, 0.01, 0.0, 0.0, 0.0, 0.0]])
    tangential = torch.tensor([[1e-3, -2e-3]])
    return tuple(t.to(device) for t in (means, quats, scales, opac, rgb, view, K, view_rs,
                                        radial, tangential))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pass(backend: str, scene: tuple, size: int, ups: list | None, dtype: torch.dtype):
    """One forward + backward: (seconds, images, gradients); ``ups`` None draws them."""
    leaves = [t.to(dtype).clone().requires_grad_() for t in scene[:5]]
    view, K, view_rs, radial, tangential = (t.to(dtype) for t in scene[5:])
    _sync(scene[0].device)
    t0 = time.perf_counter()
    colors, alphas, _ = rasterization(
        *leaves, view, K, size, size, packed=False, with_ut=True, with_eval3d=True,
        radial_coeffs=radial, tangential_coeffs=tangential,
        rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, viewmats_rs=view_rs,
        backend=backend)
    images = [colors, alphas]
    if ups is None:
        g = torch.Generator().manual_seed(1)
        ups = [torch.randn(o.shape, generator=g).to(o.device) for o in images]
    grads = torch.autograd.grad(images, leaves, grad_outputs=[u.to(dtype) for u in ups])
    _sync(scene[0].device)
    return time.perf_counter() - t0, [o.detach() for o in images], list(grads), ups


def run_ut_check(backend: str = "cuda", n: int = 3000, size: int = 128, repeats: int = 5,
                 device: torch.device | None = None) -> dict[str, Any]:
    """Parity of ``backend`` against the torch reference (float32, arbitrated by the float64
    reference) and the median seconds of a forward + backward of each, interleaved."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    scene = ut_scene(n, size, device)
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
    return {"backend": backend, "device": str(device), "gaussians": n, "size": size,
            "passed": passed, "tensors": tensors, "seconds": med, "speedup": ratio,
            "repeats": repeats}


def format_ut_check(res: dict[str, Any]) -> str:
    """One paragraph: the gate, the worst tensor, the times and the ratio."""
    worst = max(res["tensors"], key=lambda t: t["max_abs"])
    line = (f"3DGUT {res['backend']} vs torch on {res['device']} ({res['gaussians']} Gaussians, "
            f"{res['size']}x{res['size']}, OpenCV camera, rolling shutter, rasterization("
            f"with_ut, with_eval3d) forward + backward): parity "
            f"{'PASS' if res['passed'] else 'FAIL'} (worst {worst['name']}: max abs "
            f"{worst['max_abs']:.3g}, {worst['vs_float64']:.3g} from float64 against the "
            f"reference's {worst['reference_vs_float64']:.3g})")
    if res["speedup"] is not None:
        s = res["seconds"]
        line += (f"; median of {res['repeats']}: torch {s['torch'] * 1e3:.2f} ms, "
                 f"{res['backend']} {s[res['backend']] * 1e3:.2f} ms, {res['speedup']:.1f}x")
    return line
