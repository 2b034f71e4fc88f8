"""``SelectiveAdam``: Adam that updates only the visible Gaussians (Taming 3DGS; gsplat 1.5.3).

A Gaussian that no camera of the step sees has a zero gradient; plain Adam would still decay
its moments and move it by the old momentum. This one leaves its parameter and both moments
as they are. The step is gsplat's fused kernel written in PyTorch, with its semantics:

    m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g²;   p -= lr · m / (sqrt(v) + eps)

on the rows where ``visibility`` is true — no bias correction and no step counter (as gsplat).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor


class SelectiveAdam(torch.optim.Adam):
    """Adam over [N, ...] parameters whose ``step(visibility)`` updates only visible rows.

    Args:
        params: parameters or param groups (each group's ``lr`` is used; default 1e-3).
        eps: added to the root of the second moment.
        betas: decay rates of the first and second moments.

    Example:
        >>> opt = SelectiveAdam([{"params": [means], "lr": 1.6e-4}], eps=1e-15, betas=(0.9, 0.999))
        >>> loss.backward()
        >>> opt.step(visibility=(info["radii"] > 0).all(-1).any(0))  # [N] bool
    """

    def __init__(self, params: Iterable[Any], eps: float, betas: tuple[float, float]) -> None:
        super().__init__(params=params, eps=eps, betas=betas)

    @torch.no_grad()
    def step(self, visibility: Tensor) -> None:  # type: ignore[override]
        """One Adam step on the rows ``visibility`` [N] (bool, or nonzero) marks.

        Raises:
            ValueError: a parameter's first dimension is not N.
        """
        if not isinstance(visibility, Tensor):
            raise TypeError(
                f"expected visibility to be a torch.Tensor, got {type(visibility).__name__}"
            )
        visible = visibility.reshape(-1) != 0
        n = visible.numel()
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            b1, b2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.dim() == 0 or param.shape[0] != n:
                    raise ValueError(
                        f"visibility has {n} entries but a parameter has shape "
                        f"{tuple(param.shape)}: its first dimension must be N = {n}"
                    )
                state = self.state[param]
                if len(state) == 0:
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(
                        param, memory_format=torch.preserve_format
                    )
                rows = visible.to(param.device).reshape(n, *([1] * (param.dim() - 1)))
                grad = param.grad
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m_new = b1 * m + (1.0 - b1) * grad
                v_new = b2 * v + (1.0 - b2) * grad * grad
                update = lr * m_new / (v_new.sqrt() + eps)
                m.copy_(torch.where(rows, m_new, m))
                v.copy_(torch.where(rows, v_new, v))
                param.sub_(torch.where(rows, update, torch.zeros_like(update)))
