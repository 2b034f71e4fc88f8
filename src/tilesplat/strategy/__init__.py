"""Densification strategies with gsplat 1.5.3's classes, fields and hooks.

``from tilesplat.strategy import DefaultStrategy, MCMCStrategy`` (or from ``tilesplat``) is
what gsplat's own training loops import; tilesplat's trainer uses the same classes, chosen
by its config's ``strategy`` key through :data:`BY_NAME` (a new strategy: ``strategy/<name>.py``
and its line there).
"""

from .base import Strategy
from .budget import BudgetStrategy
from .default import DefaultStrategy
from .mcmc import MCMCStrategy

# the trainer's ``strategy`` config values
BY_NAME: dict[str, type[Strategy]] = {
    "default": DefaultStrategy,
    "mcmc": MCMCStrategy,
    "budget": BudgetStrategy,
}

__all__ = ["BY_NAME", "BudgetStrategy", "DefaultStrategy", "MCMCStrategy", "Strategy"]
