"""The 3DGS densification (Kerbl et al. 2023), as gsplat's ``DefaultStrategy`` runs it.

Between ``refine_start`` and ``refine_stop``, every ``refine_every`` steps:
- Gaussians whose view-space gradient, averaged over the steps that saw them, exceeds
  ``grow_grad2d`` grow: small ones (max scale <= ``grow_scale3d`` x scene scale) are cloned,
  large ones split in two;
- Gaussians with opacity below ``prune_opacity`` are removed, and after the first opacity
  reset also those larger than ``prune_scale3d`` x scene scale.
Every ``reset_every`` steps (while densifying) opacities are clamped to 2 x ``prune_opacity``.
With ``absgrad`` the gradient is the sum of absolute per-pixel gradients (AbsGS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .base import Optimizers, Params, Strategy
from .ops import duplicate, remove, reset_opacity, split


@dataclass
class DefaultStrategy(Strategy):
    """Clone / split by view-space gradient, prune by opacity and size, reset opacity."""

    prune_opa: float = 0.005
    grow_grad2d: float = 0.0002
    grow_scale3d: float = 0.01
    prune_scale3d: float = 0.1
    refine_start_iter: int = 500
    refine_stop_iter: int = 15_000
    reset_every: int = 3000
    refine_every: int = 100
    pause_refine_after_reset: int = 0
    absgrad: bool = False

    def initialize_state(self, scene_scale: float = 1.0) -> dict[str, Any]:
        """State: ``grad2d`` [N] summed gradient norms, ``count`` [N] views, ``scene_scale``."""
        return {"grad2d": None, "count": None, "scene_scale": float(scene_scale)}

    def step_pre_backward(self, params, optimizers, state, step, info) -> None:
        if "means2d" not in info:
            raise ValueError("render meta lacks 'means2d', needed for densification")
        info["means2d"].retain_grad()

    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        *,
        means_lr: float = 0.0,
        packed: bool = False,
    ) -> None:
        if step >= self.refine_stop_iter:
            return
        self._accumulate(params, state, info, packed)
        if (
            step > self.refine_start_iter
            and step % self.refine_every == 0
            and step % self.reset_every >= self.pause_refine_after_reset
        ):
            self._grow(params, optimizers, state)
            self._prune(params, optimizers, state, step)
            state["grad2d"].zero_()
            state["count"].zero_()
        if step > 0 and step % self.reset_every == 0:
            reset_opacity(params, optimizers, value=self.prune_opa * 2.0)

    @torch.no_grad()
    def _accumulate(self, params: Params, state: dict, info: dict, packed: bool) -> None:
        means2d = info["means2d"]
        grads = means2d.absgrad if self.absgrad else means2d.grad
        if grads is None:
            raise ValueError(
                "means2d has no "
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
            state["count"] = torch.zeros(n, device=grads.device)
        if packed:
            ids = info["gaussian_ids"]  # [nnz]
        else:
            visible = (info["radii"] > 0).all(dim=-1)  # [C, N]
            ids = torch.where(visible)[1]
            grads = grads[visible]  # [nnz, 2]
        state["grad2d"].index_add_(0, ids, grads.norm(dim=-1).float())
        state["count"].index_add_(0, ids, torch.ones_like(ids, dtype=torch.float32))

    @torch.no_grad()
    def _grow(self, params: Params, optimizers: Optimizers, state: dict) -> None:
        grads = state["grad2d"] / state["count"].clamp_min(1)
        high = grads > self.grow_grad2d
        small = (
            params["scales"].exp().max(dim=-1).values <= self.grow_scale3d * state["scene_scale"]
        )
        is_dup = high & small
        is_split = high & ~small
        n_dup = int(is_dup.sum())
        if n_dup > 0:
            duplicate(params, optimizers, state, is_dup)
        # clones are not split
        is_split = torch.cat(
            [is_split, torch.zeros(n_dup, dtype=torch.bool, device=is_split.device)]
        )
        if int(is_split.sum()) > 0:
            split(params, optimizers, state, is_split)

    @torch.no_grad()
    def _prune(self, params: Params, optimizers: Optimizers, state: dict, step: int) -> None:
        prune = torch.sigmoid(params["opacities"]) < self.prune_opa
        if step > self.reset_every:
            too_big = (
                params["scales"].exp().max(dim=-1).values
                > self.prune_scale3d * state["scene_scale"]
            )
            prune |= too_big
        if int(prune.sum()) > 0:
            remove(params, optimizers, state, prune)
