"""Evaluation of a trained model on posed frames: renders, PSNR, SSIM and optional LPIPS."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..data.dataset import Frame
from ..io.images import write_png
from .config import TrainConfig
from .device import training_device
from .metrics import psnr, ssim_metric
from .splats import render_splats
from .twodgs import SurfelRender, render_surfels, write_surfel_renders


def render_frame(
    params: dict[str, Tensor], frame: Frame, cfg: TrainConfig, background: Sequence[float]
) -> Tensor:
    """The model seen from ``frame``'s camera at the full SH degree: [H, W, 3] in [0, 1], on
    the parameters' device."""
    device = params["means"].device
    bg = torch.tensor([list(background)], dtype=torch.float32, device=device)
    if cfg.model == "2dgs":
        return render_surfel_frame(params, frame, cfg, background).colors[0].clamp(0.0, 1.0)
    colors, _, _ = render_splats(
        params,
        frame.viewmat[None].float().to(device),
        frame.K[None].float().to(device),
        frame.width,
        frame.height,
        cfg,
        sh_degree=cfg.sh_degree,
        backgrounds=bg,
    )
    return colors[0].clamp(0.0, 1.0)


def render_surfel_frame(
    params: dict[str, Tensor], frame: Frame, cfg: TrainConfig, background: Sequence[float]
) -> SurfelRender:
    """A 2DGS model seen from ``frame``'s camera, with normals and expected depth (C = 1), on
    the parameters' device."""
    device = params["means"].device
    return render_surfels(
        params,
        frame.viewmat[None].float().to(device),
        frame.K[None].float().to(device),
        frame.width,
        frame.height,
        cfg,
        sh_degree=cfg.sh_degree,
        backgrounds=torch.tensor([list(background)], dtype=torch.float32, device=device),
        expected_depth=True,
    )


def _file_name(frame: Frame, index: int, used: set[str]) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(frame.name).name) or f"view_{index:04d}"
    name = f"{stem}.png"
    if name in used:
        name = f"{stem}_{index:04d}.png"
    used.add(name)
    return name


@torch.no_grad()
def evaluate(
    params: dict[str, Tensor],
    frames: Sequence[Frame],
    cfg: TrainConfig,
    background: Sequence[float],
    out_dir: str | Path | None = None,
    lpips_fn: Callable[[Tensor, Tensor], float] | None = None,
) -> dict[str, Any]:
    """Render every frame, compare with its image, optionally write the renders as PNG.

    The views render on the config's device (:func:`.device.training_device`; the
    parameters are moved there when they are elsewhere), the PNGs and numbers come back
    to the CPU.

    Args:
        params: model parameters (see ``splats.py``).
        frames: the views to evaluate.
        background: RGB the images were composited on.
        out_dir: folder for ``<frame name>.png`` renders (created); None writes nothing. A
            2DGS model (``cfg.model``) also writes ``normal/``, ``normal_from_depth/`` and
            ``depth/`` PNGs of the same names there.
        lpips_fn: an LPIPS scorer from ``metrics.make_lpips``, or None.

    Returns:
        ``psnr``, ``ssim`` (and ``lpips``) averaged over the views, ``seconds_per_view``,
        ``n_views``, and ``views``: the per-view numbers.
    """
    if not frames:
        raise ValueError("no frames to evaluate")
    device = training_device(cfg)
    params = {k: v.to(device) for k, v in params.items()}  # no copy when they are there
    folder = Path(out_dir) if out_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    used: set[str] = set()
    views = []
    render_time = 0.0
    for i, frame in enumerate(frames):
        t0 = time.perf_counter()
        surfels = None
        if cfg.model == "2dgs":  # also normals and depth, written beside the colours
            surfels = render_surfel_frame(params, frame, cfg, background)
            image = surfels.colors[0].clamp(0.0, 1.0)
        else:
            image = render_frame(params, frame, cfg, background)
        render_time += time.perf_counter() - t0
        target = frame.image.to(device).float()
        view: dict[str, Any] = {
            "name": frame.name,
            "psnr": psnr(image, target),
            "ssim": ssim_metric(image, target),
        }
        if lpips_fn is not None:
            view["lpips"] = lpips_fn(image, target)
        if folder is not None:
            name = _file_name(frame, i, used)
            write_png(folder / name, image)
            if surfels is not None:
                write_surfel_renders(folder, name, surfels)
        views.append(view)
    out: dict[str, Any] = {
        key: sum(v[key] for v in views) / len(views)
        for key in ("psnr", "ssim", "lpips")
        if key in views[0]
    }
    out["n_views"] = len(views)
    out["seconds_per_view"] = render_time / len(views)
    out["views"] = views
    return out
