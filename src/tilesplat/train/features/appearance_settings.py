"""The settings of ``post_processing`` that depend on the run: the transforms' learning-rate
schedule scaled to the run's length, and the bilateral grid's shape from the image size.

gsplat's settings (rate 2e-3, a 1,000-step warm-up, a 16 x 16 x 8 grid) are those of its
30,000-step runs on images about a thousand pixels across. Taken as they are in a short run
on small images, the transforms barely move and the grid fits texture: on the room capture
(80 x 60, 300 steps) they recovered nothing of the cc-PSNR gap to the clean twin
(docs/training.md, Appearance compensation). Here:

- the rate is that of a run of ``post_processing_lr_steps`` steps (gsplat's 30,000), times
  sqrt(lr_steps / steps) (at most RATE_SCALE_MAX), and the warm-up is the same share of the
  run (1,000 of 30,000: 10 steps of 300). The square root is what was measured on the room:
  the best rates at 300 steps were 1e-2 to 3e-2, at 1,000 steps 3e-3 and 1e-2 did alike (the
  linear rule of ``pose_opt_lr`` gives 0.2 at 300 steps, where 5e-2 already did worse);
- ``bilateral_grid_shape = "auto"`` gives a cell per GRID_PIXELS_PER_CELL pixels across and
  down or more (the whole cells that fit: at least 1, at most gsplat's 16) and half as many
  luminance cells, between 4 and 8: gsplat's 16 x 16 x 8 from 640 pixels up, 3 x 2 x 4 at
  128 x 96, 1 x 1 x 4 at 64 x 64. Cells of fewer pixels (rounding 64 / 40 up to 2) let a
  short run's transforms fit the photos' content: on the exposure scene at 64 x 64 and 600
  steps the grid's cc PSNR gain over no compensation was +0.82 to +2.50 dB over four seeds
  with 2 x 2 x 4, +1.94 to +2.57 with 1 x 1 x 4 (docs/training.md).
"""

from __future__ import annotations

import math

WARMUP_START = 0.01  # the rate's first fraction of its value (gsplat's LinearLR start)
LR_FINAL = 0.01  # the fraction it decays to by the last step (gsplat's ExponentialLR)
RATE_SCALE_MAX = 10.0  # a run under lr_steps / 100 steps gets the rate of that length
GRID_PIXELS_PER_CELL = 40
GRID_CELLS_MAX = 1 << 16  # cells of one grid (the default 16 x 16 x 8 has 2048)


def lr_factor(step: int, warmup: int, steps: int) -> float:
    """The transforms' learning rate at ``step`` as a fraction of its value: a linear warm-up
    from WARMUP_START over ``warmup`` steps, times an exponential decay to LR_FINAL at
    ``steps``."""
    warm = 1.0 if warmup <= 0 else WARMUP_START + (1.0 - WARMUP_START) * min(step / warmup, 1.0)
    return warm * LR_FINAL ** (step / max(steps, 1))


def rate_scale(steps: int, lr_steps: int) -> float:
    """The factor on the transforms' rate in a run of ``steps``: sqrt(lr_steps / steps), at
    most RATE_SCALE_MAX; 1 when ``lr_steps`` is 0 (the rate as given)."""
    if lr_steps <= 0:
        return 1.0
    return min(math.sqrt(lr_steps / max(steps, 1)), RATE_SCALE_MAX)


def warmup_steps(warmup: int, steps: int, lr_steps: int) -> int:
    """The warm-up of a run of ``steps``: ``warmup`` steps of a run of ``lr_steps``, the same
    share of this one (rounded, at least 1 when ``warmup`` > 0); ``warmup`` as given when
    ``lr_steps`` is 0."""
    if lr_steps <= 0 or warmup <= 0:
        return warmup
    return max(1, round(warmup * steps / lr_steps))


def parse_grid_shape(text: str, size: tuple[int, int] | None = None) -> tuple[int, int, int]:
    """``bilateral_grid_shape`` 'X,Y,W' as three ints >= 1, or ``auto``: the shape of
    :func:`auto_grid_shape` for images of ``size`` (width, height; None: only checked).

    Raises:
        ValueError: not ``auto`` nor three positive integers, or more than GRID_CELLS_MAX
            cells.
    """
    if text.strip() == "auto":
        return auto_grid_shape(size) if size is not None else (1, 1, 1)
    parts = [p.strip() for p in text.replace("x", ",").split(",")]
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(
            f"bilateral_grid_shape must be 'auto' or three integers >= 1, 'X,Y,W' (cells "
            f"across, down, in luminance; gsplat's '16,16,8'), got {text!r}"
        )
    if math.prod(shape) > GRID_CELLS_MAX:
        raise ValueError(
            f"bilateral_grid_shape {text!r} has {math.prod(shape)} cells per image, more than "
            f"{GRID_CELLS_MAX}"
        )
    return shape  # type: ignore[return-value]


def auto_grid_shape(size: tuple[int, int]) -> tuple[int, int, int]:
    """(X, Y, W) cells for images of ``size`` (width, height): a cell per
    GRID_PIXELS_PER_CELL pixels across and down or more (the whole cells that fit), 1 to 16,
    and ceil(max(X, Y) / 2) luminance cells, 4 to 8."""
    x, y = (min(max(n // GRID_PIXELS_PER_CELL, 1), 16) for n in size)
    return x, y, min(max(math.ceil(max(x, y) / 2), 4), 8)
