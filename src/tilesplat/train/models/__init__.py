"""Model kinds behind the trainer's ``model`` key (``seams.variant("model", name)``).

Importing this package registers every kind; :func:`model_kind` gives the one a config names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import seams
from . import gaussians, surfels  # noqa: F401  (each registers its kind)
from .base import Cameras, ModelKind, Render

if TYPE_CHECKING:
    from ..config import TrainConfig


def model_kind(cfg: TrainConfig) -> ModelKind:
    """The model kind of ``cfg.model``."""
    return seams.variant("model", cfg.model)()


__all__ = ["Cameras", "ModelKind", "Render", "model_kind"]
