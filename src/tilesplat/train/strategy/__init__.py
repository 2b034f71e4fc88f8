"""Densification strategies: objects with ``step_pre_backward`` / ``step_post_backward`` hooks."""

from .base import Strategy
from .default import DefaultStrategy
from .mcmc import MCMCStrategy

__all__ = ["DefaultStrategy", "MCMCStrategy", "Strategy"]
