"""Backward by recomputation: the reference's gradients are autograd's, by definition."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def leaf(t: Tensor | None) -> Tensor | None:
    """A fresh leaf that requires grad (None and non-float tensors pass through)."""
    if t is None or not t.is_floating_point():
        return t
    return t.detach().requires_grad_(True)


def vjp(
    outputs: Sequence[Tensor | None],
    grad_outputs: Sequence[Tensor | None],
    inputs: Sequence[Tensor | None],
) -> list[Tensor | None]:
    """Vector-Jacobian product of ``outputs`` w.r.t. ``inputs``; unused inputs get zeros.

    Inputs that are None or do not require grad get None.
    """
    pairs = [
        (o, g)
        for o, g in zip(outputs, grad_outputs, strict=True)
        if o is not None and g is not None and o.requires_grad
    ]
    wanted = [x for x in inputs if x is not None and x.requires_grad]
    grads: Sequence[Tensor | None] = ()
    if pairs and wanted:
        grads = torch.autograd.grad(
            [o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True
        )
    else:
        grads = [None] * len(wanted)
    it = iter(grads)
    result: list[Tensor | None] = []
    for x in inputs:
        if x is None or not x.requires_grad:
            result.append(None)
        else:
            g = next(it)
            result.append(torch.zeros_like(x) if g is None else g)
    return result


def recompute(fn: Callable[..., Sequence[Tensor | None]], inputs: Sequence[Tensor | None],
              grad_outputs: Sequence[Tensor | None], *args, **kwargs) -> list[Tensor | None]:
    """Re-runs ``fn(*inputs, *args, **kwargs)`` with grad and returns the VJP for ``inputs``."""
    with torch.enable_grad():
        leaves = [leaf(x) for x in inputs]
        outs = fn(*leaves, *args, **kwargs)
        return vjp(outs, grad_outputs, leaves)
