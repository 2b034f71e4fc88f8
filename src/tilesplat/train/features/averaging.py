"""The averaged model (``ema_decay``): the run evaluates, renders and exports an exponential
moving average of the Gaussians' parameters instead of the last step's.

Adam on one view a step leaves the parameters jittering around the point the loss would have
them at, by about the learning rate; the average over the last ``1 / (1 - ema_decay)`` steps
sits nearer that point (Polyak averaging, as the field keeps an EMA of the weights of
diffusion models). On the built-in scene, at the fast recipe's rates, the average of
``ema_decay = 0.98`` is 0.2-0.4 dB above the parameters of the same step. It feeds nothing
back: the training, its gradients and its Adam states are those of a run without it.

The average is of the parameters as they are stored (log-scales, opacity logits, raw
quaternions), after each step's Adam update and the strategy's edits. An edit of the
Gaussians (a densification, a prune, an opacity reset, an MCMC relocation) builds new
Parameters (``strategy/ops.py``), and the rows of the average no longer mean the same
Gaussians, so the average restarts from the parameters whenever one of them is not the tensor
it followed a step earlier. A step whose update was skipped on the device (an intersection
capacity's overflow, redone later) leaves the average unchanged. Checkpoints keep the average
(``averaged``), so a resumed run averages as the uninterrupted one does.

The average restarts at every step whose strategy call may edit the model (``acts_at``), an
edit or not, and an update the run would throw away is not made (:class:`AverageSchedule`):
where the strategy may edit the Gaussians before the run next reads the average (an
evaluation, a checkpoint, the last step), the edit restarts it, so the average is dropped
instead. The fast recipe densifies every 50 steps to step 650 and evaluates every 220:
590 of its 1,100 updates are of that kind. Each read sees the average it saw before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...keys import Key
from .. import seams
from ..parallel.base import needs_whole_model

if TYPE_CHECKING:
    from ..config import TrainConfig


KEYS = (Key("ema_decay", 0.0, "evaluate, render and export an exponential moving average of "
            "the Gaussians' parameters, keeping this share of it each step (restarted whenever "
            "the strategy edits the Gaussians; train/features/averaging.py); 0: the parameters "
            "of the last step", ge=0.0, lt=1.0),)


def averaging_errors(cfg: TrainConfig) -> list[str]:
    """Why the average cannot be kept in ``cfg``'s parallel mode (empty when it can)."""
    if cfg.ema_decay == 0.0:
        return []
    return needs_whole_model(cfg, f"ema_decay = {cfg.ema_decay}", "a rank holds a shard of the "
                             "Gaussians, which its rebalancing moves between ranks")


seams.register_keys("the averaged model (train/features/averaging.py)", KEYS, averaging_errors)


def served_params(ckpt: dict[str, Any]) -> dict[str, Tensor]:
    """The parameters a checkpoint's run evaluates, renders and exports: its averaged model
    (``ema_decay``, the average above) where it keeps one, else the trained parameters.

    Raises:
        ValueError: the averaged model's names or shapes differ from the parameters'.
    """
    params = ckpt["params"]
    averaged = ckpt.get("averaged")
    if averaged is None or (isinstance(averaged, dict) and not averaged):  # none (yet) kept
        return params
    saved = averaged.get("params") if isinstance(averaged, dict) else None
    if not isinstance(saved, dict) or not isinstance(params, dict):
        raise ValueError("the checkpoint's averaged model (ema_decay) is malformed")
    if saved.keys() != params.keys():
        raise ValueError(f"the checkpoint's averaged model (ema_decay) has {sorted(saved)}, "
                         f"its parameters are {sorted(params)}")
    for k, p in params.items():
        v = saved[k]
        want = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
        if not isinstance(v, Tensor) or tuple(v.shape) != want:
            got = tuple(v.shape) if isinstance(v, Tensor) else type(v).__name__
            raise ValueError(f"the checkpoint's averaged {k} (ema_decay) is {got}, its "
                             f"parameter is {want}")
    return saved


class ParamAverage:
    """The exponential moving average of a model's parameters.

    Args:
        decay: the share of the average kept at each step, in (0, 1).
    """

    def __init__(self, decay: float) -> None:
        self.decay = float(decay)
        self.average: dict[str, Tensor] | None = None
        self._follows: dict[str, Tensor] = {}  # the parameter tensors it averaged last
        self.steps = 0  # updates since the last restart

    def _restart(self, params: dict[str, Tensor]) -> None:
        self.average = {k: p.detach().clone() for k, p in params.items()}
        self._follows = dict(params)
        self.steps = 0

    def _follows_params(self, params: dict[str, Tensor]) -> bool:
        """Whether the average is of ``params``: the same names, the same tensors."""
        return (self.average is not None and self._follows.keys() == params.keys()
                and all(params[k] is self._follows[k] for k in params))

    def update(self, params: dict[str, Tensor], skipped: Tensor | None = None) -> None:
        """Average in ``params`` (each [N, ...]) after a step; restart from them when the
        strategy replaced one since the last update (or there is no average yet).

        Args:
            params: the model's parameters by name.
            skipped: a 0-dim float tensor on the parameters' device, 1.0 when the step's
                update was skipped there (the average then stays as it is), or None when
                no step is skipped (no host read either way).
        """
        if not self._follows_params(params):
            self._restart(params)
            return
        assert self.average is not None
        avg = list(self.average.values())
        cur = [params[k].detach() for k in self.average]
        with torch.no_grad():
            if skipped is None:
                torch._foreach_lerp_(avg, cur, 1.0 - self.decay)
            else:
                weight = (1.0 - skipped) * (1.0 - self.decay)
                for a, p in zip(avg, cur, strict=True):
                    a.lerp_(p, weight)
        self.steps += 1

    def drop(self) -> None:
        """Forget the average: the next update restarts it (served: the parameters)."""
        self.average, self._follows, self.steps = None, {}, 0

    def served(self, params: dict[str, Tensor]) -> dict[str, Tensor]:
        """The parameters to evaluate, render and export: the average when it follows
        ``params`` (the same tensors), else ``params`` themselves (before the first update,
        or right after an edit of the strategy)."""
        if self.average is None or not self._follows_params(params):
            return params
        return self.average

    def state_dict(self) -> dict[str, Any]:
        """The average on the CPU (empty before the first update), for a checkpoint."""
        if self.average is None:
            return {}
        return {
            "params": {k: v.detach().cpu().clone() for k, v in self.average.items()},
            "steps": self.steps,
        }

    def load_state_dict(self, state: object, params: dict[str, Tensor]) -> None:
        """Restore :meth:`state_dict`, the average following ``params`` (the restored
        model); an empty or missing state restarts from ``params`` at the next update.

        Raises:
            ValueError: the state does not fit ``params`` (names, shapes) or is not finite.
        """
        if state is None or (isinstance(state, dict) and not state):
            self.drop()
            return
        if not isinstance(state, dict):
            raise ValueError("the checkpoint's averaged model (ema_decay) is malformed")
        # the names and shapes, as a render of the checkpoint checks them
        saved = served_params({"params": params, "averaged": state})
        average = {}
        for k, p in params.items():
            if not bool(torch.isfinite(saved[k]).all()):
                raise ValueError(f"the checkpoint's averaged {k} (ema_decay) is not finite")
            average[k] = saved[k].to(device=p.device, dtype=p.dtype).clone()
        steps = state.get("steps", 0)
        self.average, self._follows = average, dict(params)
        self.steps = steps if isinstance(steps, int) and not isinstance(steps, bool) else 0


class AverageSchedule:
    """Which steps' updates of the average the run will read, for a strategy's edits and the
    run's reads (see the module docs).

    Args:
        acts_at: the strategy's ``acts_at``: whether its call at a step may edit the model.
        steps: the run's number of steps.
        reads_every: the periods (in finished steps) of the run's reads of the average (its
            ``eval_every`` and ``checkpoint_every``; 0: none); the last step reads it too.
    """

    def __init__(self, acts_at: Callable[[int], bool], steps: int,
                 reads_every: tuple[int, ...]) -> None:
        self.acts_at, self.steps = acts_at, steps
        self.reads_every = tuple(n for n in reads_every if n > 0)
        # the last scan: no step in [_scanned, _next_edit) acts, _next_edit does (or ends)
        self._scanned, self._next_edit = 0, -1

    def next_edit(self, step: int) -> int:
        """The first step after ``step`` whose strategy call may edit the model (``steps``
        when none does). Asked step after step, each step is asked of the strategy once."""
        if not self._scanned <= step + 1 <= self._next_edit:
            e = self._scanned = step + 1
            while e < self.steps and not self.acts_at(e):
                e += 1
            self._next_edit = e
        return self._next_edit

    def next_read(self, done: int) -> int:
        """The first count of finished steps >= ``done`` after which the run reads the
        average."""
        return min([self.steps, *(-(-done // n) * n for n in self.reads_every)])

    def wasted(self, step: int) -> bool:
        """Whether an edit restarts the average after ``step``'s update and before the run
        reads it: the edit at step e comes after e's update and before the read that follows
        e + 1 finished steps."""
        return self.next_edit(step) < self.next_read(step + 1)


def param_average(cfg: TrainConfig) -> ParamAverage | None:
    """The average ``cfg.ema_decay`` asks for, or None when it is 0."""
    return ParamAverage(cfg.ema_decay) if cfg.ema_decay > 0.0 else None
