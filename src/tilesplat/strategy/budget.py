"""The 3DGS densification under a Gaussian budget (after Taming 3DGS, Mallick et al. 2024, which
grows to a set count by a score): the default strategy's clones and splits, but at each
refinement only the candidates with the largest mean screen-space gradient, as many as keep
the count under a budget that grows linearly from the count at ``refine_start_iter`` to
``cap_max`` at ``refine_stop_iter`` (each clone or split adds one Gaussian).

The count then stays near the budget, so a step's cost is bounded from the start: the
default strategy on the built-in scene overshoots to 25,000 Gaussians when it densifies
often, and every later step pays for them.

``cap_per_pixel`` ties the budget to the image size (DashGaussian matches its primitive budget
to its resolution schedule): the cap is at least that many Gaussians per pixel of the
largest training image. A step's cost is about a part that grows with the pixels and a part
that grows with the Gaussians; a cap in proportion to the pixels keeps the second part's
share of the step the same on small and large images.

``budget_score`` chooses the candidates' order: ``gradient`` (the mean screen-space gradient)
or ``views`` (the number of views that asked the Gaussian to grow, ``strategy/views.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..keys import Key
from .default import DefaultStrategy
from .mcmc import CAP_MAX
from .views import add_hot_views, rank_by_views

BUDGET_SCORE = Key("budget_score", "gradient", "budget: the order in which candidates grow "
                   "under the budget: gradient (the mean screen-space gradient) or views (the "
                   "views in which it exceeded grow_grad2d; strategy/views.py)",
                   choices=("gradient", "views"))


CAP_PER_PIXEL = Key("cap_per_pixel", 0.0, "budget: the cap at least this many Gaussians per "
                    "pixel of the largest training image (0: cap_max alone)", ge=0.0)


@dataclass
class BudgetStrategy(DefaultStrategy):
    """The default strategy, growing by the best candidates under a linear budget."""

    cap_max: int = 1_000_000
    budget_score: str = "gradient"
    cap_per_pixel: float = 0.0

    KEYS: ClassVar[tuple[Key, ...]] = (*DefaultStrategy.KEYS, CAP_MAX, BUDGET_SCORE,
                                       CAP_PER_PIXEL)

    @classmethod
    def from_config(cls, cfg: Any, key_for_gradient: str = "means2d") -> BudgetStrategy:
        """The default strategy's thresholds, the config's ``cap_max``, ``budget_score`` and
        ``cap_per_pixel``."""
        made = super().from_config(cfg, key_for_gradient)
        return dataclasses.replace(made, cap_max=cfg.cap_max, budget_score=cfg.budget_score,
                                   cap_per_pixel=cfg.cap_per_pixel)

    def for_images(self, pixels: int) -> BudgetStrategy:
        """The cap raised to ``cap_per_pixel`` x ``pixels`` (the largest training image's)
        where that is more."""
        cap = max(self.cap_max, int(round(self.cap_per_pixel * pixels)))
        return dataclasses.replace(self, cap_max=cap)

    def initialize_state(self, scene_scale: float = 1.0) -> dict[str, Any]:
        """The default strategy's state, ``start_count`` (the count when densification
        starts, set then) and, with ``budget_score = "views"``, ``hot`` [N] (the views since
        the last refinement in which each Gaussian's gradient exceeded ``grow_grad2d``)."""
        state = super().initialize_state(scene_scale)
        state["start_count"] = None
        if self.budget_score == "views":
            state["hot"] = None
        return state

    @torch.no_grad()
    def _accumulate(self, params: Any, state: dict, info: dict, packed: bool) -> None:
        super()._accumulate(params, state, info, packed)
        if self.budget_score != "views":
            return
        if state.get("hot") is None:
            state["hot"] = torch.zeros_like(state["count"])
        add_hot_views(state["hot"], info, self.key_for_gradient, self.absgrad,
                      self.grow_grad2d, packed)

    @torch.no_grad()
    def _grow(self, params: Any, optimizers: Any, state: dict, step: int) -> tuple[int, int]:
        grown = super()._grow(params, optimizers, state, step)
        if state.get("hot") is not None:  # counted again from this refinement on
            state["hot"].zero_()
        return grown

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
        order = rank_by_views(state["hot"], grads) if self.budget_score == "views" else grads
        score = torch.where(cand, order, torch.full_like(grads, -1.0))
        keep = torch.zeros_like(cand)
        if room > 0:
            keep[torch.topk(score, room).indices] = True
        return is_dup & keep, is_split & keep
