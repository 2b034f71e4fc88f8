"""Densification strategies with gsplat 1.5.3's classes, fields and hooks.

``from tilesplat.strategy import DefaultStrategy, MCMCStrategy`` (or from ``tilesplat``) is
what gsplat's own training loops import; tilesplat's trainer uses the same classes.
"""

from .base import Strategy
from .default import DefaultStrategy
from .mcmc import MCMCStrategy

__all__ = ["DefaultStrategy", "MCMCStrategy", "Strategy"]
