"""2DGS parity and speed of a native backend against the torch reference on one device:
``rasterization_2dgs`` (projection, tile lists, rasterizer; RGB+D, the distortion loss)
forward + backward, every image and every gradient, measured in one run, interleaved, behind
a parity gate (no ratio on a red gate; ``reference_gate.py``). ``scripts/gpu_check.py`` runs
it for ``cuda``. The 2DGS gradients are ill-conditioned in float32 for surfels seen near
edge-on; the native kernels intersect in float64 (``backends/cpu/twodgs_rasterize_fwd.py``),
hence the gate's float64 arbiter.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor

from ..rendering import rasterization_2dgs
from .reference_gate import format_check, gated_check

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


def _render(backend: str, leaves: list[Tensor], rest: list[Tensor], size: int
            ) -> list[Tensor]:
    """colors, alphas, normals, the distortion and the median depth of the scene's camera
    (``rest``: viewmats, Ks), RGB+D with the distortion loss."""
    view, K = rest
    out = rasterization_2dgs(*leaves, view, K, size, size, render_mode="RGB+D", distloss=True,
                             backend=backend)
    return [out[0], out[1], out[2], out[4], out[5]]


def run_twodgs_check(backend: str = "cuda", n: int = 3000, size: int = 128, repeats: int = 5,
                     device: torch.device | None = None) -> dict[str, Any]:
    """Parity of ``backend`` against the torch reference (float32, arbitrated by the float64
    reference) and the median seconds of a forward + backward of each, interleaved."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res = gated_check(functools.partial(_render, size=size), backend,
                      surfel_scene(n, size, device), IMAGES, LEAVES, repeats)
    return {"backend": backend, "device": str(device), "surfels": n, "size": size, **res}


def format_twodgs_check(res: dict[str, Any]) -> str:
    """One paragraph: the gate, the worst tensor, the times and the ratio."""
    return format_check(res, f"2DGS {res['backend']} vs torch on {res['device']} "
                             f"({res['surfels']} surfels, {res['size']}x{res['size']}, "
                             "rasterization_2dgs forward + backward)")
