"""The resolution schedule: the first steps train on coarse images, full resolution comes later
(DashGaussian, Chen et al. 2025, schedules resolution and primitive count together; here the
resolution, by powers of two).

With ``resolution_start = F`` (a power of two) and ``resolution_full_at = a``, the first
``a * steps`` steps are cut into ``log2 F + 1`` equal parts, at the factors F, F / 2, ..., 1;
the factor stays 1 after them (with F = 4: full size from ``2/3 * a * steps`` on).

With ``resolution_ref_pixels = R`` (0: off), a run whose largest training image has P > R
pixels stretches the span to ``a * P / R`` (at most :data:`SPAN_MAX` of the steps): on large
images a step's cost is mostly per pixel, whatever the Gaussians, and the coarse levels there
still hold many pixels, so they train longer.

A step's images are the frames' area averages at that factor, with the intrinsics scaled to
match (pixel centres stay centres), made for each batch and not kept; the batch renders at
that size. Early steps then rasterize a fraction of the pixels while the Gaussians are still
few and large, which is when coarse images lose nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...data.frames import Frame
from ...keys import Key
from .. import seams

MIN_SIDE = 16  # the smallest side of a coarse image, in pixels
SPAN_MAX = 0.9  # the longest span resolution_ref_pixels stretches the schedule to

if TYPE_CHECKING:
    from ..config import TrainConfig


KEYS = (
    Key("resolution_start", 1, "resolution schedule: downscale factor of the first steps' "
        "images, a power of two (halved at even intervals until full resolution); 1: full "
        "resolution throughout", ge=1),
    Key("resolution_full_at", 0.5, "resolution schedule: fraction of the steps it spans, cut "
        "into equal parts for the factors resolution_start, ..., 2, 1 (with 4: full size from "
        "2/3 of it on)", gt=0.0, le=1.0),
    Key("resolution_ref_pixels", 0, "resolution schedule: a run whose largest training image "
        "has more pixels than this stretches the schedule's span in proportion, to at most "
        "0.9 of the steps (train/features/resolution.py); 0: the span is resolution_full_at "
        "whatever the size", ge=0),
)


def schedule_errors(cfg: TrainConfig) -> list[str]:
    """Why ``resolution_start`` is not a power of two (empty when it is)."""
    f = cfg.resolution_start
    return [f"resolution_start must be a power of two >= 1, got {f}"] if f & (f - 1) else []


seams.register_keys("resolution schedule (train/features/resolution.py)", KEYS, schedule_errors)


def schedule_span(cfg: TrainConfig, pixels: int = 0) -> float:
    """The fraction of the steps the schedule spans for a largest training image of
    ``pixels``: ``resolution_full_at``, stretched by ``pixels / resolution_ref_pixels`` (to
    at most :data:`SPAN_MAX`) when that is above 1."""
    span, ref = cfg.resolution_full_at, cfg.resolution_ref_pixels
    if ref <= 0 or pixels <= ref:
        return span
    return max(span, min(SPAN_MAX, span * pixels / ref))


def downscale_factor(cfg: TrainConfig, step: int, pixels: int = 0) -> int:
    """The images' downscale factor at ``step`` (1: full resolution), for a run whose largest
    training image has ``pixels`` (:func:`schedule_span`)."""
    start = cfg.resolution_start
    if start <= 1:
        return 1
    levels = int(math.log2(start)) + 1  # start, start / 2, ..., 1
    span = schedule_span(cfg, pixels) * cfg.steps
    level = min(int(step * levels // span), levels - 1)
    return start >> level


def _area(image: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[H, W, C] averaged to [height, width, C]."""
    chw = image.permute(2, 0, 1)[None]
    return F.interpolate(chw, size=(height, width), mode="area")[0].permute(1, 2, 0).contiguous()


def _all_kept(mask: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[H, W] bool to [height, width] bool: a coarse pixel is kept when all its fine pixels
    are (an ignored pixel's content must not leak into the coarse target)."""
    kept = F.interpolate(mask[None, None].float(), size=(height, width), mode="area")[0, 0]
    return kept >= 1.0 - 1e-6


def downscaled(frame: Frame, factor: int) -> Frame:
    """``frame`` at 1 / ``factor`` of its size (at least 1 pixel): image and alpha averaged,
    a training mask kept where all its fine pixels are, intrinsics scaled so that each coarse
    pixel's centre sees what its fine pixels saw (a pinhole's or a fisheye's alike)."""
    if factor == 1:
        return frame
    height, width = max(1, frame.height // factor), max(1, frame.width // factor)
    sx, sy = width / frame.width, height / frame.height
    K = frame.K.clone()
    K[0, :] *= sx
    K[1, :] *= sy
    image, alpha = frame.image_and_alpha()
    return dataclasses.replace(
        frame,
        K=K,
        width=width,
        height=height,
        image=_area(image, height, width),
        alpha=None if alpha is None else _area(alpha, height, width),
        mask=None if frame.mask is None else _all_kept(frame.mask, height, width),
    )


class CoarseFrames:
    """The training frames at a step's downscale factor, averaged down for each batch and not
    kept: the schedule adds no memory (a level of 100 images of 1080p at 1/2 would hold 0.6
    GB), and an area average costs a small fraction of a step.

    A factor is capped so that no coarse image is under ``MIN_SIDE`` pixels on a side (the
    SSIM window of the loss is 11 pixels): small images train at a smaller factor, or at full
    size.
    """

    def __init__(self, frames: Sequence[Frame]) -> None:
        self.frames = list(frames)
        side = min((min(f.width, f.height) for f in self.frames), default=MIN_SIDE)
        self.max_factor = 1
        while side // (2 * self.max_factor) >= MIN_SIDE:
            self.max_factor *= 2

    def frame(self, index: int, factor: int) -> Frame:
        """Frame ``index`` at 1 / ``factor`` of its size (the frame itself at 1), the factor
        capped at :attr:`max_factor`."""
        return downscaled(self.frames[index], min(factor, self.max_factor))
