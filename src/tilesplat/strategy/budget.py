"""The 3DGS densification under a Gaussian budget (after Taming 3DGS, Mallick et al. 2024, which
grows to a set count by a score): the default strategy's clones and splits, but at each
refinement only the candidates with the largest mean screen-space gradient, as many as keep
the count under a budget that grows linearly from the count at ``refine_start_iter`` to
``cap_max`` at ``refine_stop_iter`` (each clone or split adds one Gaussian).

The count then stays near the budget, so a step's cost is bounded from the start: the
default strategy on the built-in scene overshoots to 25,000 Gaussians when it densifies
often, and every later step pays for them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..keys import Key
from .default import DefaultStrategy
from .mcmc import CAP_MAX


@dataclass
class BudgetStrategy(DefaultStrategy):
    """The default strategy, growing by the best candidates under a linear budget."""

    cap_max: int = 1_000_000

    KEYS: ClassVar[tuple[Key, ...]] = (*DefaultStrategy.KEYS, CAP_MAX)

    @classmethod
    def from_config(cls, cfg: Any, key_for_gradient: str = "means2d") -> BudgetStrategy:
        """The default strategy's thresholds and the config's ``cap_max``."""
        made = super().from_config(cfg, key_for_gradient)
        return dataclasses.replace(made, cap_max=cfg.cap_max)

    def initialize_state(self, scene_scale: float = 1.0) -> dict[str, Any]:
        """The default strategy's state, and ``start_count`` (the count when densification
        starts, set then)."""
        state = super().initialize_state(scene_scale)
        state["start_count"] = None
        return state

    def budget_at(self, step: int, start_count: int) -> int:
        """The largest count allowed after the refinement at ``step``."""
        span = max(1, self.refine_stop_iter - self.refine_start_iter)
        frac = min(1.0, max(0.0, (step - self.refine_start_iter) / span))
        return int(round(start_count + frac * (self.cap_max - start_count)))

    def _limit_growth(
        self, is_dup: torch.Tensor, is_split: torch.Tensor, grads: torch.Tensor, step: int,
        state: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidates with the largest ``grads``, as many as the budget allows."""
        n = int(is_dup.shape[0])
        if state.get("start_count") is None:  # the first refinement
            state["start_count"] = min(n, self.cap_max)
        room = max(0, self.budget_at(step, int(state["start_count"])) - n)
        cand = is_dup | is_split
        n_cand = int(cand.sum())
        if n_cand <= room:
            return is_dup, is_split
        score = torch.where(cand, grads, torch.full_like(grads, -1.0))
        keep = torch.zeros_like(cand)
        if room > 0:
            keep[torch.topk(score, room).indices] = True
        return is_dup & keep, is_split & keep
