"""Optimizers of gsplat 1.5.3: ``SelectiveAdam``."""

from .selective_adam import SelectiveAdam

__all__ = ["SelectiveAdam"]
