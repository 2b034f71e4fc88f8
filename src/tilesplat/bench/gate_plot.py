"""The gate's ``time_to_psnr.png``: every run's test PSNR against its training time, the base's
runs in one colour and the candidate's in another, and the target PSNR as a line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from ..io.images import write_png
from ..train.rundir.plots import PANEL_H, PANEL_W, Series, panel

ARM_COLORS = {"base": (31, 119, 180), "cand": (214, 39, 40), "target": (120, 120, 120)}


def time_to_psnr_image(result: dict[str, Any]) -> np.ndarray:
    """The chart of a gate's result (:func:`.gate.run_gate`) as a uint8 [270, 360, 3] image."""
    img = Image.new("RGB", (PANEL_W, PANEL_H), (255, 255, 255))
    series: list[Series] = []
    named = set()
    for r in result.get("runs", []):
        curve = r.get("curve") or []
        if not r.get("ok") or not curve:
            continue
        arm = r["arm"]
        # one legend entry per arm: its first run carries the name
        name = "" if arm in named else Path(result["arms"][arm].get("name", arm)).stem[-16:]
        named.add(arm)
        series.append(([c[0] for c in curve], [c[2] for c in curve], ARM_COLORS[arm], name))
    target = result.get("target_psnr_db")
    times = [t for xs, _, _, _ in series for t in xs]
    if target is not None and times:
        series.append(([min(times), max(times)], [target, target], ARM_COLORS["target"],
                       f"{target:.2f} dB"))
    panel(ImageDraw.Draw(img), 0, "test PSNR (dB)", series, log_y=False,
          x_label="training s")
    return np.asarray(img, dtype=np.uint8)


def save_time_to_psnr(result: dict[str, Any], path: str | Path) -> Path:
    """Write :func:`time_to_psnr_image` of ``result`` as a PNG at ``path`` (atomically)."""
    return write_png(path, time_to_psnr_image(result))
