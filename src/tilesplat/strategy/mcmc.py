"""3D Gaussian Splatting as Markov Chain Monte Carlo (Kheradmand et al. 2024).

Between ``refine_start`` and ``refine_stop``, every ``refine_every`` steps: Gaussians with
opacity at most ``min_opacity`` are relocated onto live ones sampled by opacity, then 5% more
Gaussians are added the same way, up to ``cap_max``. Every step the means receive noise shaped
by their covariance, scaled by the means' learning rate times ``noise_lr``, mostly where
opacity is low. The count never shrinks, so ``cap_max`` bounds the cost of a step.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..keys import Key
from ..ops import elementwise
from .base import SCHEDULE_KEYS, Optimizers, Params, Strategy, check_required
from .ops import inject_noise, relocate, relocation_table, sample_add

CAP_MAX = Key("cap_max", 100_000, "mcmc, budget: the most Gaussians it grows to", ge=1)
N_MAX = 51  # largest number of copies equation 9 is evaluated for (as gsplat)


@dataclass
class MCMCStrategy(Strategy):
    """Relocate dead Gaussians, add 5% per refinement up to ``cap_max``, perturb the means."""

    cap_max: int = 1_000_000
    noise_lr: float = 5e5
    refine_start_iter: int = 500
    refine_stop_iter: int = 25_000
    refine_every: int = 100
    min_opacity: float = 0.005
    verbose: bool = False

    POST_BACKWARD_ARGS: ClassVar[tuple[str, ...]] = ("lr",)
    # 3DGS-MCMC's recipe (Kheradmand et al. 2024, as gsplat's MCMC config): what choosing it
    # sets of the trainer's initialisation and loss keys
    PRESET: ClassVar[dict[str, Any]] = {
        "init_opacity": 0.5,
        "init_scale": 0.1,
        "opacity_reg": 0.01,
        "scale_reg": 0.01,
    }
    KEYS: ClassVar[tuple[Key, ...]] = (*SCHEDULE_KEYS, CAP_MAX, Key(
        "noise_lr", 5e5, "mcmc: position noise, times the means' learning rate", ge=0.0))

    @classmethod
    def from_config(cls, cfg: Any, key_for_gradient: str = "means2d") -> MCMCStrategy:
        """The strategy with the config's cap, noise and schedule."""
        return cls(cap_max=cfg.cap_max, noise_lr=cfg.noise_lr, refine_start_iter=cfg.refine_start,
                   refine_stop_iter=cfg.refine_stop, refine_every=cfg.refine_every,
                   min_opacity=cfg.prune_opacity)

    def share(self, rank: int, world_size: int) -> MCMCStrategy:
        """A copy whose ``cap_max`` is rank ``rank``'s part of the even split of the whole
        model's cap between ``world_size`` shards (the first ranks take the remainder)."""
        base, extra = divmod(self.cap_max, world_size)
        return dataclasses.replace(self, cap_max=base + (1 if rank < extra else 0))

    def initialize_state(self, *, scene_scale: float = 1.0) -> dict[str, Any]:
        """State: ``binoms`` [51, 51] binomial coefficients C(n, k) (gsplat's layout, kept for
        code that reads it; the relocation uses an exact float64 table of equation 9) and
        ``scene_scale`` (unused by MCMC)."""
        binoms = torch.zeros(N_MAX, N_MAX)
        for n in range(N_MAX):
            for k in range(n + 1):
                binoms[n, k] = math.comb(n, k)
        return {"binoms": binoms, "scene_scale": float(scene_scale)}

    def row_state(self, state: dict[str, Any]) -> list[str]:
        """None of MCMC's state is per Gaussian (``binoms`` is a constant table)."""
        return []

    def check_sanity(self, params: Params, optimizers: Optimizers) -> None:
        """The base checks, and that ``means``, ``scales``, ``quats``, ``opacities`` exist."""
        super().check_sanity(params, optimizers)
        check_required(params)

    def step_post_backward(
        self,
        params: Params,
        optimizers: Optimizers,
        state: dict[str, Any],
        step: int,
        info: dict[str, Any],
        lr: float | None = None,
        *,
        means_lr: float | None = None,
    ) -> None:
        """Relocate and add on schedule, then add noise to the means.

        ``lr`` is the means' current learning rate (gsplat's argument; ``means_lr`` is its
        tilesplat 0.1 name). One of them is required.
        """
        if lr is None:
            lr = means_lr
        if lr is None:
            raise TypeError("MCMCStrategy.step_post_backward needs lr= (the means' learning rate)")
        if self.refine_start_iter < step < self.refine_stop_iter and step % self.refine_every == 0:
            table = _table()
            dead = elementwise.sigmoid(params["opacities"].flatten()) <= self.min_opacity
            n_dead = int(dead.sum())
            if n_dead:
                relocate(params, optimizers, dead, table, self.min_opacity)
            n = len(params["means"])
            n_add = max(0, min(self.cap_max, int(1.05 * n)) - n)
            if n_add > 0:
                sample_add(params, optimizers, n_add, table, self.min_opacity)
            if self.verbose:
                print(
                    f"Step {step}: relocated {n_dead} GSs, added {n_add} GSs. "
                    f"Now having {len(params['means'])} GSs."
                )
        inject_noise(params, float(lr) * self.noise_lr)


_TABLE: list[torch.Tensor] = []


def _table() -> torch.Tensor:
    if not _TABLE:
        _TABLE.append(relocation_table(N_MAX))
    return _TABLE[0]
