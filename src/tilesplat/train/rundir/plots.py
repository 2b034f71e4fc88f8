"""The training-curve picture: loss, PSNR and Gaussian count against the step, as a PNG.

Drawn with Pillow's ImageDraw (already needed for image I/O) rather than matplotlib, which
would be a large dependency for three line charts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ...io.images import write_png

PANEL_W, PANEL_H = 360, 270
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 58, 14, 26, 40
COLORS = {"train": (31, 119, 180), "test": (214, 39, 40), "axis": (60, 60, 60)}

Series = tuple[Sequence[float], Sequence[float], tuple[int, int, int], str]


def _fmt(v: float) -> str:
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-2):
        return f"{v:.1e}"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"


def panel(
    draw: ImageDraw.ImageDraw, x0: int, title: str, series: list[Series], log_y: bool,
    x_label: str = "step",
) -> None:
    """Draw one chart with its axes into the PANEL_W x PANEL_H cell starting at column x0."""
    left, right = x0 + MARGIN_L, x0 + PANEL_W - MARGIN_R
    top, bottom = MARGIN_T, PANEL_H - MARGIN_B
    draw.text((x0 + MARGIN_L, 6), title, fill=COLORS["axis"])
    draw.rectangle([left, top, right, bottom], outline=COLORS["axis"])
    pts = [
        (x, y)
        for xs, ys, _, _ in series
        for x, y in zip(xs, ys, strict=True)
        if math.isfinite(y) and (y > 0 or not log_y)
    ]
    if not pts:
        draw.text((left + 10, (top + bottom) // 2), "no data", fill=COLORS["axis"])
        return
    tf = (lambda v: math.log10(v)) if log_y else (lambda v: v)
    xs_all = [p[0] for p in pts]
    ys_all = [tf(p[1]) for p in pts]
    xmin, xmax = min(xs_all), max(xs_all)
    ymin, ymax = min(ys_all), max(ys_all)
    if xmax == xmin:
        xmax = xmin + 1
    if ymax == ymin:
        ymin, ymax = ymin - 0.5, ymax + 0.5
    pad = 0.05 * (ymax - ymin)
    ymin, ymax = ymin - pad, ymax + pad

    def to_px(x: float, y: float) -> tuple[float, float]:
        u = left + (x - xmin) / (xmax - xmin) * (right - left)
        v = bottom - (tf(y) - ymin) / (ymax - ymin) * (bottom - top)
        return u, v

    for frac in (0.0, 0.5, 1.0):
        yv = ymin + frac * (ymax - ymin)
        py = bottom - frac * (bottom - top)
        label = _fmt(10**yv if log_y else yv)
        draw.line([left - 4, py, left, py], fill=COLORS["axis"])
        draw.text((x0 + 4, py - 6), label, fill=COLORS["axis"])
        xv = xmin + frac * (xmax - xmin)
        px = left + frac * (right - left)
        draw.line([px, bottom, px, bottom + 4], fill=COLORS["axis"])
        draw.text((px - 12, bottom + 8), _fmt(xv), fill=COLORS["axis"])
    draw.text((right - 6 * len(x_label), bottom + 18), x_label, fill=COLORS["axis"])
    legend_y = bottom - 4 - 12 * sum(1 for s in series if s[3])
    for xs, ys, color, name in series:
        line = [
            to_px(x, y)
            for x, y in zip(xs, ys, strict=True)
            if math.isfinite(y) and (y > 0 or not log_y)
        ]
        if len(line) == 1:
            u, v = line[0]
            draw.ellipse([u - 2, v - 2, u + 2, v + 2], fill=color)
        elif line:
            draw.line(line, fill=color, width=2)
            if len(xs) <= 30:  # sparse series (test PSNR): mark the samples
                for u, v in line:
                    draw.ellipse([u - 2, v - 2, u + 2, v + 2], fill=color)
        if name and line:
            draw.text((right - 6 * len(name) - 4, legend_y), name, fill=color)  # 6 px a char
            legend_y += 12


def curve_image(history: dict[str, list[float]]) -> np.ndarray:
    """The three charts side by side as a uint8 [270, 1080, 3] image.

    Args:
        history: lists ``step``, ``loss``, ``psnr``, ``gaussians`` (training samples) and
            optionally ``test_step``, ``test_psnr`` (test-set evaluations).
    """
    img = Image.new("RGB", (3 * PANEL_W, PANEL_H), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    steps = history.get("step", [])
    train = COLORS["train"]
    panel(
        draw,
        0,
        "loss (log scale)",
        [(steps, history.get("loss", []), train, "")],
        log_y=True,
    )
    psnr_series: list[Series] = [(steps, history.get("psnr", []), train, "train")]
    if history.get("test_step"):
        psnr_series.append((history["test_step"], history["test_psnr"], COLORS["test"], "test"))
    panel(draw, PANEL_W, "PSNR (dB)", psnr_series, log_y=False)
    panel(
        draw,
        2 * PANEL_W,
        "Gaussians",
        [(steps, history.get("gaussians", []), train, "")],
        log_y=False,
    )
    return np.asarray(img, dtype=np.uint8)


def save_curve(history: dict[str, list[float]], path: str | Path) -> Path:
    """Write :func:`curve_image` of ``history`` as a PNG at ``path``."""
    return write_png(path, curve_image(history))
