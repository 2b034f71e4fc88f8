"""The trainer's densification strategies: :mod:`tilesplat.strategy`, one copy for both.

Kept as a path so that ``tilesplat.train.strategy`` (and ``.ops``) still import.
"""

from ...strategy import DefaultStrategy, MCMCStrategy, Strategy

__all__ = ["DefaultStrategy", "MCMCStrategy", "Strategy"]
