"""Early stop: training ends when the test PSNR measured during training stops rising.

With ``early_stop_patience = K`` (and ``eval_every`` > 0) a run stops after an evaluation when
the best test PSNR of its last K evaluations is less than ``early_stop_min_db`` above the best
before them. The rule reads the run's history (``test_psnr``, kept in every checkpoint), so it
holds no state of its own: a resumed run decides as the uninterrupted one would, and a run that
stopped early and is resumed stops again at once. A later ``--set steps=...`` does not lift it;
``--set early_stop_patience=0`` does.

The test views serve as the held-out subset, as in every trainer of the field that stops on a
validation metric; they take no part in the gradients.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...keys import Key
from .. import seams

if TYPE_CHECKING:
    from ..config import TrainConfig


KEYS = (
    Key("early_stop_patience", 0, "stop when the test PSNR (measured every eval_every steps) has "
        "not risen by early_stop_min_db in this many evaluations; 0: run all the steps", ge=0),
    Key("early_stop_min_db", 0.02, "early stop: the smallest rise of the best test PSNR that "
        "counts, in dB", ge=0.0),
)


def early_stop_errors(cfg: TrainConfig) -> list[str]:
    """Why the early stop cannot watch the test PSNR (empty when it can or is off)."""
    if cfg.early_stop_patience > 0 and cfg.eval_every <= 0:
        return [f"early_stop_patience = {cfg.early_stop_patience} needs eval_every > 0 "
                "(the test PSNR it watches is measured every eval_every steps)"]
    return []


seams.register_keys("early stop (train/features/early_stop.py)", KEYS, early_stop_errors)


def plateaued(test_psnr: Sequence[float], patience: int, min_db: float) -> bool:
    """Whether the best of the last ``patience`` PSNRs of ``test_psnr`` (in evaluation order)
    is less than ``min_db`` above the best before them; False when ``patience`` is 0, when
    there are not more than ``patience`` of them, or when any is NaN (a rank that does not
    evaluate)."""
    if patience <= 0 or len(test_psnr) <= patience:
        return False
    values = [float(p) for p in test_psnr]
    if any(math.isnan(p) for p in values):
        return False
    return max(values[-patience:]) < max(values[:-patience]) + min_db


def should_stop(cfg: TrainConfig, test_psnr: Sequence[float]) -> bool:
    """:func:`plateaued` with the config's keys."""
    return plateaued(test_psnr, cfg.early_stop_patience, cfg.early_stop_min_db)
