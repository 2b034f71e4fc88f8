"""The 3DGS densification (Kerbl et al. 2023) with gsplat 1.5.3's ``DefaultStrategy`` fields.

Between ``refine_start_iter`` and ``refine_stop_iter``, every ``refine_every`` steps:
- Gaussians whose view-space gradient, averaged over the steps that saw them, exceeds
  ``grow_grad2d`` grow: small ones (max scale <= ``grow_scale3d`` x scene scale) are cloned,
  large ones split in two (before ``refine_scale2d_stop_iter`` also those whose screen radius
  exceeds ``grow_scale2d`` of the image);
- Gaussians with opacity below ``prune_opa`` are removed, and after the first opacity reset
  also those larger than ``prune_scale3d`` x scene scale (or, before
  ``refine_scale2d_stop_iter``, ``prune_scale2d`` of the image).
Every ``reset_every`` steps (while densifying) opacities are clamped to 2 x ``prune_opa``.
With ``absgrad`` the gradient is the sum of absolute per-pixel gradients (AbsGS).

One difference from gsplat 1.5.3: its opacity reset never fires (``step % reset_every == 0 &
step > 0`` parses as a chained comparison that is always false); here it fires as 3DGS
and gsplat's documentation say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from ..keys import Key
from ..ops import elementwise
from .base import SCHEDULE_KEYS, Optimizers, Params, Strategy, check_required
from .ops import duplicate, remove, reset_opacity, split


@dataclass
class DefaultStrategy(Strategy):
    """Clone / split by view-space gradient, prune by opacity and size, reset opacity."""

    prune_opa: float = 0.005
    grow_grad2d: float = 0.0002
    grow_scale3d: float = 0.01
    grow_scale2d: float = 0.05
    prune_scale3d: float = 0.1
    prune_scale2d: float = 0.15
    refine_scale2d_stop_iter: int = 0
    refine_start_iter: int = 500
    refine_stop_iter: int = 15_000
    reset_every: int = 3000
    refine_every: int = 100
    pause_refine_after_reset: int = 0
    absgrad: bool = False
    revised_opacity: bool = False
    verbose: bool = False
    key_for_gradient: Literal["means2d", "gradient_2dgs"] = "means2d"

    POST_BACKWARD_ARGS: ClassVar[tuple[str, ...]] = ("packed",)
    KEYS: ClassVar[tuple[Key, ...]] = (
        *SCHEDULE_KEYS,
        Key("reset_every", 3000, "default: reset opacities to 2 x prune_opacity every n steps",
            ge=1),
        Key("pause_refine_after_reset", 0, "default: skip densification for n steps after an "
            "opacity reset", ge=0),
        Key("grow_grad2d", 2e-4, "default: clone/split Gaussians whose mean view-space gradient "
            "exceeds this (about 8e-4 with absgrad)", ge=0.0),
        Key("grow_scale3d", 0.01, "default: clone below, split above this size (x scene scale)",
            ge=0.0),
        Key("absgrad", False, "default: grow by the absolute view-space gradient (AbsGS)"),
        Key("prune_scale3d", 0.1, "default: prune Gaussians larger than this (x scene scale) "
            "after a reset", ge=0.0),
        Key("revised_opacity", False, "default: a split's two children get opacity "
            "1 - sqrt(1 - o), so that the pair composites like the parent (arXiv:2404.06109; "
            "gsplat's DefaultStrategy(revised_opacity=True))"),
    )

    @classmethod
    def from_config(cls, cfg: Any, key_for_gradient: str = "means2d") -> DefaultStrategy:
        """The strategy with the config's thresholds, densifying on the gradient of
        ``key_for_gradient``."""
        return cls(prune_opa=cfg.prune_opacity, grow_grad2d=cfg.grow_grad2d,
                   grow_scale3d=cfg.grow_scale3d, prune_scale3d=cfg.prune_scale3d,
                   refine_start_iter=cfg.refine_start, refine_stop_iter=cfg.refine_stop,
                   reset_every=cfg.reset_every, refine_every=cfg.refine_every,
                   pause_refine_after_reset=cfg.pause_refine_after_reset, absgrad=cfg.absgrad,
                   revised_opacity=cfg.revised_opacity, key_for_gradient=key_for_gradient)

    def wants_absgrad(self) -> bool:
        """With ``absgrad`` it grows by the absolute screen-space gradient (AbsGS)."""
        return self.absgrad

    def gradients_read_until(self) -> int | None:
        """``refine_stop_iter``: ``step_post_backward`` returns at once from there."""
        return self.refine_stop_iter

    def initialize_state(self, scene_scale: float = 1.0) -> dict[str, Any]:
        """State: ``grad2d`` [N] summed gradient norms, ``count`` [N] views, ``scene_scale``,
        and with ``refine_scale2d_stop_iter > 0`` ``radii`` [N] (largest screen radius / image
        size). The tensors are created on the first step, on the gradients' device."""
        state: dict[str, Any] = {"grad2d": None, "count": None, "scene_scale": float(scene_scale)}
        if self.refine_scale2d_stop_iter > 0:
            state["radii"] = None
        return state

    def check_sanity(self, params: Params, optimizers: Optimizers) -> None:
        """The base checks, and that ``means``, ``scales``, ``quats``, ``opacities`` exist."""
        super().check_sanity(params, optimizers)
        check_required(params)

    def step_pre_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
    ) -> None:
        """Keep the gradient of ``info[key_for_gradient]`` (the 2D means) for densification."""
        if self.key_for_gradient not in info:
            raise ValueError(
                f"render meta lacks {self.key_for_gradient!r}, needed for densification"
            )
        info[self.key_for_gradient].retain_grad()

    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        packed: bool = False,
        *,
        means_lr: float | None = None,
    ) -> None:
        """Accumulate the step's view-space gradients, then densify / prune / reset on schedule.

        ``packed`` says how ``info`` was rendered (``rasterization(packed=...)``).
        ``means_lr`` is accepted for tilesplat 0.1 callers and unused.
        """
        if step >= self.refine_stop_iter:
            return
        self._accumulate(params, state, info, packed)
        if self._refines_at(step):
            n_dup, n_split = self._grow(params, optimizers, state, step)
            n_prune = self._prune(params, optimizers, state, step)
            if self.verbose:
                print(
                    f"Step {step}: {n_dup} GSs duplicated, {n_split} GSs split, "
                    f"{n_prune} GSs pruned. Now having {len(params['means'])} GSs."
                )
            state["grad2d"].zero_()
            state["count"].zero_()
            if self.refine_scale2d_stop_iter > 0:
                state["radii"].zero_()
        if self._resets_at(step):
            reset_opacity(params, optimizers, value=self.prune_opa * 2.0)

    def _refines_at(self, step: int) -> bool:
        """Whether a step before ``refine_stop_iter`` densifies and prunes (not in the pause
        after an opacity reset)."""
        return (step > self.refine_start_iter and step % self.refine_every == 0
                and step % self.reset_every >= self.pause_refine_after_reset)

    def _resets_at(self, step: int) -> bool:
        """Whether a step before ``refine_stop_iter`` resets the opacities."""
        return step > 0 and step % self.reset_every == 0

    def acts_at(self, step: int) -> bool:
        """Only the refinement and opacity-reset steps change the model, the steps
        ``step_post_backward`` refines or resets at (both stop at ``refine_stop_iter``); the
        others add the step's gradients to the statistics (none once a view shows no
        Gaussian)."""
        return step < self.refine_stop_iter and (self._refines_at(step) or self._resets_at(step))

    @torch.no_grad()
    def _accumulate(self, params: Params, state: dict, info: dict, packed: bool) -> None:
        for key in ("width", "height", "n_cameras", "radii", self.key_for_gradient):
            if key not in info:
                raise ValueError(f"render meta lacks {key!r}, needed for densification")
        means2d = info[self.key_for_gradient]
        grads = means2d.absgrad if self.absgrad else means2d.grad
        if grads is None:
            raise ValueError(
                f"{self.key_for_gradient} has no "
                + (
                    "absgrad: render with absgrad=True"
                    if self.absgrad
                    else "gradient: was step_pre_backward called?"
                )
            )
        # To normalised device coordinates; the loss averages over cameras, undo that.
        grads = grads.clone()
        grads[..., 0] *= info["width"] / 2.0 * info["n_cameras"]
        grads[..., 1] *= info["height"] / 2.0 * info["n_cameras"]
        n = len(params["means"])
        if state["grad2d"] is None:
            state["grad2d"] = torch.zeros(n, device=grads.device)
        if state["count"] is None:
            state["count"] = torch.zeros(n, device=grads.device)
        if self.refine_scale2d_stop_iter > 0 and state.get("radii") is None:
            state["radii"] = torch.zeros(n, device=grads.device)
        if packed:
            ids = info["gaussian_ids"]  # [nnz]
            radii = info["radii"].max(dim=-1).values  # [nnz]
            state["grad2d"].index_add_(0, ids, grads.norm(dim=-1).float())
            state["count"].index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))
            if self.refine_scale2d_stop_iter > 0:
                size = float(max(info["width"], info["height"]))
                state["radii"][ids] = torch.maximum(state["radii"][ids], radii.float() / size)
            return
        # by mask, camera after camera (no index list: no host read of how many are visible),
        # in the order and with the sums the index_add of the visible pairs would give
        visible = (info["radii"] > 0).all(dim=-1).reshape(-1, n)  # [C, N]
        norms = grads.norm(dim=-1).float().reshape(-1, n)
        radii = info["radii"].max(dim=-1).values.reshape(-1, n).float()
        size = float(max(info["width"], info["height"]))
        for c in range(visible.shape[0]):
            seen = visible[c]
            state["grad2d"] += torch.where(seen, norms[c], 0.0)
            state["count"] += seen.float()
            if self.refine_scale2d_stop_iter > 0:
                state["radii"] = torch.maximum(state["radii"],
                                               torch.where(seen, radii[c] / size, 0.0))

    @torch.no_grad()
    def _grow(
        self, params: Params, optimizers: Optimizers, state: dict, step: int
    ) -> tuple[int, int]:
        grads = state["grad2d"] / state["count"].clamp_min(1)
        high = grads > self.grow_grad2d
        largest = elementwise.exp(params["scales"]).max(dim=-1).values
        small = largest <= self.grow_scale3d * state["scene_scale"]
        is_dup = high & small
        is_split = high & ~small
        if step < self.refine_scale2d_stop_iter:
            is_split |= state["radii"] > self.grow_scale2d
        is_dup, is_split = self._limit_growth(is_dup, is_split, grads, step, state)
        n_dup, n_split = int(is_dup.sum()), int(is_split.sum())
        if n_dup > 0:
            duplicate(params, optimizers, state, is_dup)
        # clones are not split
        is_split = torch.cat(
            [is_split, torch.zeros(n_dup, dtype=torch.bool, device=is_split.device)]
        )
        if n_split > 0:
            split(params, optimizers, state, is_split, revised_opacity=self.revised_opacity)
        return n_dup, n_split

    def _limit_growth(
        self, is_dup: torch.Tensor, is_split: torch.Tensor, grads: torch.Tensor, step: int,
        state: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The Gaussians that clone and split at ``step`` (masks [N]) out of the candidates;
        ``grads`` [N] is their mean screen-space gradient. Here all of them; a strategy with a
        budget keeps the best."""
        return is_dup, is_split

    @torch.no_grad()
    def _prune(self, params: Params, optimizers: Optimizers, state: dict, step: int) -> int:
        prune = elementwise.sigmoid(params["opacities"].flatten()) < self.prune_opa
        if step > self.reset_every:
            too_big = (
                elementwise.exp(params["scales"]).max(dim=-1).values
                > self.prune_scale3d * state["scene_scale"]
            )
            if step < self.refine_scale2d_stop_iter:
                too_big |= state["radii"] > self.prune_scale2d
            prune |= too_big
        n_prune = int(prune.sum())
        if n_prune > 0:
            remove(params, optimizers, state, prune)
        return n_prune
