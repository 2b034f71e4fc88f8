"""``FusedAdam``: ``torch.optim.Adam(fused=True)`` with a short path from ``step`` to its kernel.

The trainer steps six Adams (one per Gaussian parameter) at every step. On a CPU, with the
small models of a fast run, torch's Python around its fused kernel cost as much as the kernel:

- ``Adam.step``, ``zero_grad``, ``add_param_group`` (the constructor) and ``state_dict`` (a
  checkpoint) pass through ``torch._dynamo``'s wrappers, and the first call imports
  ``torch._dynamo`` (~0.9 s of CPU, once per process);
- each step groups the tensors by device and type, and checks for complex numbers, sparse
  gradients and graph capture, for one tensor.

This class calls the same kernel (``torch._fused_adam_``) with the same arguments, on the same
state (``step``, ``exp_avg``, ``exp_avg_sq``, the names and types of torch's fused Adam), so a
step gives the bits of ``torch.optim.Adam(fused=True)`` and a state dict loads in either
(``tests/test_fused_adam.py``). Everything else (the state dict's format, hooks, schedulers,
``param_groups``) is torch's: ``add_param_group``, ``state_dict`` and ``load_state_dict`` are
torch's own functions, called without their wrapper. ``zero_grad`` is written here, and
``step`` is left unwrapped: torch wraps an optimizer class's ``step`` at construction
(``Optimizer._patch_step_function``) in a profiler range and two loops over the step hooks,
~25 us a call on the CPU, six calls a training step; here ``step`` takes that wrapper only
while a step hook is registered or torch's profiler records. A group whose
tensors are not float32 on the CPU, or whose settings are not plain (an ``lr`` tensor as a CUDA
graph's, ``amsgrad``, ``weight_decay``, ``maximize``), takes torch's own step.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.optim import optimizer as _torch_optimizer

_PLAIN = {"amsgrad": False, "maximize": False, "weight_decay": 0, "capturable": False,
          "differentiable": False, "decoupled_weight_decay": False}  # fmt: skip


def _undecorated(fn: Any) -> Any:
    """``fn`` without the lazy ``torch._dynamo`` wrapper torch puts on some methods (its
    ``functools.wraps`` keeps the original as ``__wrapped__``); ``fn`` when it has none."""
    return getattr(fn, "__wrapped__", fn)


_ADD_PARAM_GROUP = _undecorated(torch.optim.Optimizer.add_param_group)
_STATE_DICT = _undecorated(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = _undecorated(torch.optim.Optimizer.load_state_dict)


class FusedAdam(torch.optim.Adam):
    """Adam with torch's fused kernel, the bits of ``torch.optim.Adam(fused=True)``.

    Args:
        params: parameters or param groups, as ``torch.optim.Adam`` takes them.
        lr: the default rate of a group that gives none.
        betas: decay rates of the first and second moments.
        eps: added to the root of the second moment.

    Example:
        >>> opt = FusedAdam([{"params": [means], "lr": 1.6e-4}], lr=1.6e-4, eps=1e-15)
        >>> loss.backward(); opt.step(); opt.zero_grad()
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, fused=True)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's ``Optimizer.add_param_group``, without importing ``torch._dynamo``."""
        _ADD_PARAM_GROUP(self, param_group)

    def state_dict(self) -> dict[str, Any]:
        """torch's ``Optimizer.state_dict``, without importing ``torch._dynamo``."""
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's ``Optimizer.load_state_dict``, without importing ``torch._dynamo``."""
        _LOAD_STATE_DICT(self, state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop (``set_to_none``) or zero every parameter's gradient."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def _patch_step_function(self) -> None:
        """What torch's constructor calls to wrap ``step``: here only the name of the profiler
        range of ``zero_grad``; :meth:`step` takes torch's wrapper when it is needed."""
        self._zero_grad_profile_name = f"Optimizer.zero_grad#{type(self).__name__}.zero_grad"

    def _hooked(self) -> bool:
        """Whether a step must pass through torch's wrapper: a step hook is registered (on
        this optimizer or on every one) or torch's profiler records."""
        return bool(self._optimizer_step_pre_hooks or self._optimizer_step_post_hooks
                    or _torch_optimizer._global_optimizer_pre_hooks
                    or _torch_optimizer._global_optimizer_post_hooks
                    or torch.autograd._profiler_enabled())

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        """One Adam step of every parameter that has a gradient (``found_inf``, a flag tensor
        set as an attribute, skips it where set, as torch's fused Adam does); the step hooks
        run around it as torch runs them."""
        if self._hooked():
            return _HOOKED_STEP(self, closure)
        return self._step(closure)

    @torch.no_grad()
    def _step(self, closure: Any = None) -> Any:
        """The step itself (:meth:`step`)."""
        if closure is not None or any(not self._plain(g) for g in self.param_groups):
            # torch's Adam.step without the wrapper torch may have put on it: the hooks run
            # once, in step()
            adam_step = torch.optim.Adam.step
            if getattr(adam_step, "hooked", False):
                adam_step = adam_step.__wrapped__
            return adam_step(self, closure)
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            steps = [s["step"] for s in states]
            torch._foreach_add_(steps, 1)
            beta1, beta2 = group["betas"]
            torch._fused_adam_(
                params, [p.grad for p in params], [s["exp_avg"] for s in states],
                [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False, lr=group["lr"],
                beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"], maximize=False,
                grad_scale=None, found_inf=found_inf,
            )
            if found_inf is not None:
                torch._foreach_sub_(steps, [found_inf] * len(steps))
        return None

    @staticmethod
    def _plain(group: dict[str, Any]) -> bool:
        """Whether ``group`` takes the short path: plain settings, a float rate, float32 CPU
        tensors with dense gradients."""
        if any(group.get(k, v) != v for k, v in _PLAIN.items()):
            return False
        if not isinstance(group["lr"], float) or not all(
                isinstance(b, float) for b in group["betas"]):
            return False
        return all(p.device.type == "cpu" and p.dtype == torch.float32
                   and (p.grad is None or not p.grad.is_sparse) for p in group["params"])

    def _state(self, p: Tensor) -> dict[str, Tensor]:
        """``p``'s state, made as torch's fused Adam makes it on the first step."""
        state = self.state[p]
        if len(state) == 0:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state


# torch's wrapper (the profiler range, the hooks) around the step itself, for :meth:`step`
_HOOKED_STEP = torch.optim.Optimizer.profile_hook_step(FusedAdam._step)
