"""A bench scene at a real size: a scene's Gaussians multiplied to a count, seen by its first
camera at a larger image size (issue 36: 1 M Gaussians at 1,297×840, Mip-NeRF 360's training
size).

Each Gaussian of the scene becomes ``ceil(n / N)`` Gaussians jittered around it by its own
scale (deterministic for a seed), each smaller by the cube root of that factor, so that the
scene keeps its look and its density of overlaps grows like a trained model's; the first
``n`` are kept. One camera: a trainer's step renders one view. The intrinsics are scaled
from the scene's size to the new one.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from ..data.scenes import Scene

_SIZE = re.compile(r"^(\d+)x(\d+)$")


def parse_size(text: str) -> tuple[int, int]:
    """``"WxH"`` -> (W, H), both >= 1.

    Raises:
        ValueError: not of the form WxH with positive integers.
    """
    m = _SIZE.match(text)
    if m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(f"resolution must be WxH with positive integers, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def scaled_scene(scene: Scene, gaussians: int | None = None,
                 size: tuple[int, int] | None = None, seed: int = 0) -> Scene:
    """``scene`` with ``gaussians`` Gaussians (None: as many as it has) seen by its first
    camera at ``size`` = (W, H) (None: its own size; other cameras are dropped either way).

    Raises:
        ValueError: ``gaussians`` < 1.
    """
    if gaussians is not None and gaussians < 1:
        raise ValueError(f"gaussians must be >= 1, got {gaussians}")
    n0 = scene.num_gaussians
    n = n0 if gaussians is None else int(gaussians)
    copies = max(1, math.ceil(n / n0))
    rng = np.random.default_rng(seed)
    means = scene.means.double().numpy()
    scales = scene.scales.double().numpy()
    if copies > 1:
        # copy c of every Gaussian, then the next copy: the first n keep the scene's spread
        reach = scales.max(axis=1, keepdims=True)  # [N0, 1]
        jitter = rng.normal(size=(copies, n0, 3)) * reach[None]
        means = (means[None] + jitter).reshape(-1, 3)[:n]
        scales = np.tile(scales / np.cbrt(copies), (copies, 1))[:n]
        idx = np.tile(np.arange(n0), copies)[:n]
    else:  # an evenly spaced subset
        idx = np.linspace(0, n0 - 1, n).round().astype(np.int64)
        means, scales = means[idx], scales[idx]
    quats = scene.quats.double().numpy()[idx] if copies == 1 else _random_quats(n, rng)
    w0, h0 = scene.width, scene.height
    w, h = (w0, h0) if size is None else size
    Ks = scene.Ks[:1].clone()
    Ks[:, 0, :] *= w / w0
    Ks[:, 1, :] *= h / h0
    dtype = scene.means.dtype

    def t(a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)

    name = f"{scene.name}*{n}@{w}x{h}"
    return Scene(name, t(means), t(quats), t(scales), scene.opacities[idx].clone(),
                 scene.colors[idx].clone(), scene.viewmats[:1].clone(), Ks, int(w), int(h))


def _random_quats(n: int, rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)
