"""3DGUT parity and speed of a native backend against the torch reference on one device:
``rasterization(with_ut=True, with_eval3d=True)`` (the unscented projection, tile lists, the
eval3d rasterizer) through a distorted (OpenCV) camera under a rolling shutter, forward +
backward, every image and every gradient, measured in one run, interleaved, behind a parity
gate (no ratio on a red gate; ``reference_gate.py``). ``scripts/gpu_check.py`` runs it for
``cuda``. The reference's float32 cross product cancels near a Gaussian's axis; the native
kernels compute the pair's power in float64 (``backends/cpu/ut_rasterize_fwd.py``), hence the
gate's float64 arbiter.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import Tensor

from ..ops.camera import RollingShutterType
from ..rendering import rasterization
from .reference_gate import format_check, gated_check

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


def _render(backend: str, leaves: list[Tensor], rest: list[Tensor], size: int
            ) -> list[Tensor]:
    """colors and alphas of the scene's camera (``rest``: viewmats, Ks, viewmats_rs, radial,
    tangential), with_ut and with_eval3d."""
    view, K, view_rs, radial, tangential = rest
    colors, alphas, _ = rasterization(
        *leaves, view, K, size, size, packed=False, with_ut=True, with_eval3d=True,
        radial_coeffs=radial, tangential_coeffs=tangential,
        rolling_shutter=RollingShutterType.ROLLING_TOP_TO_BOTTOM, viewmats_rs=view_rs,
        backend=backend)
    return [colors, alphas]


def run_ut_check(backend: str = "cuda", n: int = 3000, size: int = 128, repeats: int = 5,
                 device: torch.device | None = None) -> dict[str, Any]:
    """Parity of ``backend`` against the torch reference (float32, arbitrated by the float64
    reference) and the median seconds of a forward + backward of each, interleaved."""
    if device is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    res = gated_check(functools.partial(_render, size=size), backend,
                      ut_scene(n, size, device), IMAGES, LEAVES, repeats)
    return {"backend": backend, "device": str(device), "gaussians": n, "size": size, **res}


def format_ut_check(res: dict[str, Any]) -> str:
    """One paragraph: the gate, the worst tensor, the times and the ratio."""
    return format_check(res, f"3DGUT {res['backend']} vs torch on {res['device']} "
                             f"({res['gaussians']} Gaussians, {res['size']}x{res['size']}, "
                             "OpenCV camera, rolling shutter, rasterization(with_ut, "
                             "with_eval3d) forward + backward)")
