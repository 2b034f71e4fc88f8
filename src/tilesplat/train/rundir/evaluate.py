"""Evaluation of a trained model on posed frames: renders, PSNR, SSIM and optional LPIPS, and
PSNR and SSIM after a least-squares colour fit of the render to the image (``cc_psnr``,
``cc_ssim``: ``metrics.color_correct``).

The colour-corrected numbers are computed for every run, whether ``post_processing`` is on or
not, so that runs with and without appearance compensation compare on one scale (a model
trained with per-image transforms has the colours of no photo in particular; one trained
without has the average's); the fit costs a 10 x 10 solve per channel and view.

The views are rendered, scored and written one at a time (a view's render, image and
temporaries are freed before the next is rendered); a view of more pixels than
``eval_tile_pixels`` is scored in strips (:mod:`.tiled_view`), so that the scores need the
largest view's render and image in float32 (24 bytes a pixel) plus a strip's float64 work,
not the whole view's float64 temporaries (~180 bytes a pixel, ~1 GB at 3000x2000). The
render itself is whole (what a training step of that view renders), or in crops of
``eval_crop_pixels``. During training ``eval_max_views`` bounds the views scored
(:func:`spaced_views`)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...backends.cpu import buffer_pool
from ...data.dataset import Frame
from ...data.lens import stacked
from ...io.images import RENDER_PNG_LEVEL, write_png
from ...keys import Key
from .. import seams
from ..config import TrainConfig
from ..features.pose_align import aligned_frame
from ..models import Cameras, Render, model_kind
from ..models.base import ModelKind, lens_to
from ..step.device import training_device
from ..step.masks import masks_to, view_metrics
from ..step.metrics import color_correct, psnr, ssim_metric
from .tiled_view import render_in_crops, strip_scores

METRICS = ("psnr", "ssim", "cc_psnr", "cc_ssim", "masked_psnr", "masked_ssim", "lpips")

KEYS = (
    Key("eval_tile_pixels", 1 << 18, "evaluation: a view of more pixels is scored in strips of "
        "at most this many (the whole view's numbers within float64 rounding; the float64 "
        "SSIM and colour fit of a whole view take ~180 bytes a pixel: this bounds them at "
        "real size, train/rundir/tiled_view.py)", ge=4096),
    Key("eval_crop_pixels", 0, "evaluation: a view of more pixels is rendered in crops of the "
        "camera of at most this many (0: every view renders whole, as a training step "
        "renders it). A crop's pixels equal the whole render's except near Gaussians centred "
        "beyond the crop's field of view widened by 15% (the projection's Jacobian is clamped "
        "there, as gsplat's)", ge=0),
)
seams.register_keys("evaluation (train/rundir/evaluate.py)", KEYS)


def render_view(
    params: dict[str, Tensor], frame: Frame, cfg: TrainConfig, background: Sequence[float]
) -> Render:
    """The model seen from ``frame``'s camera at the full SH degree, as the model kind renders
    it for evaluation (C = 1), on the parameters' device."""
    device = params["means"].device
    cams = Cameras(
        viewmats=frame.viewmat[None].float().to(device),
        Ks=frame.K[None].float().to(device),
        width=frame.width,
        height=frame.height,
        backgrounds=torch.tensor([list(background)], dtype=torch.float32, device=device),
        camera_model=frame.camera_model,
        lens=lens_to(stacked([frame.lens]), device),
    )
    return model_kind(cfg).render(params, cams, cfg, sh_degree=cfg.sh_degree)


def render_frame(
    params: dict[str, Tensor], frame: Frame, cfg: TrainConfig, background: Sequence[float]
) -> Tensor:
    """The model seen from ``frame``'s camera at the full SH degree: [H, W, 3] in [0, 1], on
    the parameters' device."""
    return render_view(params, frame, cfg, background).colors[0].clamp(0.0, 1.0)


def spaced_views(frames: Sequence[Frame], most: int) -> list[Frame]:
    """At most ``most`` of ``frames``, evenly spaced from the first (the same ones each
    call); all of them for ``most`` = 0 or at least their number."""
    n = len(frames)
    if most <= 0 or most >= n:
        return list(frames)
    return [frames[i * n // most] for i in range(most)]


def view_scores(image: Tensor, target: Tensor, mask: Tensor | None) -> dict[str, Any]:
    """``psnr``, ``ssim``, ``cc_psnr``, ``cc_ssim`` (and with a mask ``masked_psnr``,
    ``masked_ssim``) of one whole view: image, target [H, W, 3], mask [H, W] bool or None."""
    view: dict[str, Any] = {"psnr": psnr(image, target), "ssim": ssim_metric(image, target)}
    corrected = color_correct(image, target)
    view["cc_psnr"] = psnr(corrected, target)
    view["cc_ssim"] = ssim_metric(corrected, target)
    view.update(view_metrics(image, target, mask))
    return view


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
    psnr_only: bool = False,
) -> dict[str, Any]:
    """Render every frame, compare with its image, optionally write the renders as PNG; one
    view at a time, each PNG written (atomically) as its view finishes. The cpu backend's
    pooled buffers (``backends/cpu/buffer_pool.py``) are let go first.

    The views render on the config's device (:func:`.device.training_device`; the
    parameters are moved there when they are elsewhere), the PNGs and numbers come back
    to the CPU. A view of more than ``eval_tile_pixels`` pixels is scored in strips
    (:mod:`.tiled_view`; the same numbers within float64 rounding), one of more than
    ``eval_crop_pixels`` (when set) rendered in crops, unless the model kind writes pictures
    of its own (2DGS's normals from the depth would differ at a crop's edge). LPIPS, when
    asked, scores the whole view.

    Args:
        params: model parameters (see ``splats.py``).
        frames: the views to evaluate.
        background: RGB the images were composited on.
        out_dir: folder for ``<frame name>.png`` renders (created); None writes nothing. The
            model kind may write its own pictures of the same names there (2DGS:
            ``normal/``, ``normal_from_depth/`` and ``depth/``).
        lpips_fn: an LPIPS scorer from ``metrics.make_lpips``, or None.
        psnr_only: score the PSNR alone (an evaluation during training, whose early stop
            and log read nothing else): the same ``psnr``, without the SSIM and the colour
            fit, which cost more than the render on small views. Views scored in strips
            still get every score.

    Returns:
        ``psnr``, ``ssim``, ``cc_psnr``, ``cc_ssim`` (and ``lpips``) averaged over the views,
        ``masked_psnr`` and ``masked_ssim`` over the views with masks (``train/step/masks.py``;
        over those where they are defined, None where none is),
        ``seconds_per_view``, ``n_views``, and ``views``: the per-view numbers.
    """
    if not frames:
        raise ValueError("no frames to evaluate")
    # the cpu backend's pool keeps the training step's large buffers (the SSIM's maps, the
    # gradients: ~0.3 GiB at 3000x2000) for the next step; an evaluation uses few of them
    # and would stand on the others (docs/benchmarks.md, "Real-size capture")
    buffer_pool.clear()
    device = training_device(cfg)
    params = {k: v.to(device) for k, v in params.items()}  # no copy when they are there
    folder = Path(out_dir) if out_dir is not None else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    model = model_kind(cfg)
    # a kind's own pictures are made from the whole render (the base writes none)
    whole_only = folder is not None and type(model).write_renders is not ModelKind.write_renders
    budget, crop = int(cfg.eval_tile_pixels), int(cfg.eval_crop_pixels)
    used: set[str] = set()
    views = []
    render_time = 0.0
    frozen = {k: v.detach() for k, v in params.items()}  # alignment moves no Gaussian
    for i, frame in enumerate(frames):
        if cfg.test_pose_align_steps > 0:  # test-time pose alignment (train/features/pose_align.py)
            with torch.enable_grad():
                frame = aligned_frame(
                    frame, lambda f: render_view(frozen, f, cfg, background),
                    cfg.test_pose_align_steps, cfg.test_pose_align_lr,
                )
        pixels = frame.width * frame.height
        t0 = time.perf_counter()
        rendered: Render | None = None
        if 0 < crop < pixels and not whole_only:
            image = render_in_crops(
                lambda f: render_view(params, f, cfg, background).colors[0].clamp(0.0, 1.0),
                frame, crop)
        else:
            rendered = render_view(params, frame, cfg, background)
            image = rendered.colors[0].clamp(0.0, 1.0)
        render_time += time.perf_counter() - t0
        target = frame.image.to(device).float()
        mask = masks_to(frame.mask, device)
        view: dict[str, Any] = {"name": frame.name}
        if pixels > budget:
            view.update(strip_scores(image, target, mask, budget))
        elif psnr_only:
            view["psnr"] = psnr(image, target)
        else:
            view.update(view_scores(image, target, mask))
        if lpips_fn is not None:
            view["lpips"] = lpips_fn(image, target)
        if folder is not None:
            name = _file_name(frame, i, used)
            write_png(folder / name, image, compress_level=RENDER_PNG_LEVEL)
            if rendered is not None:  # the kind's own pictures beside it
                model.write_renders(folder, name, rendered)
        views.append(view)
        del rendered, image, target, mask  # freed before the next view renders
    out: dict[str, Any] = {}
    for key in METRICS:  # the masked ones over the views with masks
        have = [v[key] for v in views if key in v]
        defined = [x for x in have if x is not None]  # None: the view counted no pixel
        if have:
            out[key] = sum(defined) / len(defined) if defined else None
    out["n_views"] = len(views)
    out["seconds_per_view"] = render_time / len(views)
    out["views"] = views
    return out
