"""The trainer's steps in order: each queued without waiting, checked one step late, redone
when needed.

:class:`StepRunner` runs :func:`.optimization.optimization_step` for the trainer and keeps the
promise of issue 21's sync-free step:

- each step is *queued* (render, loss, backward, Adam: an :class:`Attempt`), eagerly or as a
  replay of its CUDA graph (``cuda_graph.py``), then *finished* (the strategy's
  ``step_post_backward``, the parallel mode's ``after_step``, the spatial sort, the averaged
  model, on the CPU the heap's free memory returned where the edits changed the count) and
  its flag's host copy started;
- the flag of a step is read when the next step has been queued: a NaN or Inf raises, naming
  the step (its update was skipped on the device); an overflow of the intersection capacity
  (``capacity.py``) grows it and redoes the skipped steps, in order, with their batches;
- before a strategy step that changes the model, the pending flags are read at once.

Everything it works on is given to it: the model's state, the step's plan, the strategy,
the averaged model, the capacity and the CUDA graph (both None on the CPU).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from ...backends.cpu.heap import return_freed_heap
from ...ops.deferred_checks import FiniteFlag, FlagRead
from ...ops.intersect_capacity import OVERFLOW, intersection_capacity
from ...strategy import Strategy
from ..features.averaging import AverageSchedule, ParamAverage
from ..features.spatial_order import SpatialOrder
from ..models.base import sh_degree_at
from ..models.splats import Optimizers, Params, means_rate, set_learning_rates
from .batch import Batch
from .capacity import BLOCKED, StepCapacity, overflowed
from .cuda_graph import StepGraph, use_rate_tensors
from .metrics import squared_error as masked_error
from .optimization import StepPlan, optimization_step


@dataclasses.dataclass
class ModelState:
    """The model the steps change, in place: ``params`` and their ``optimizers`` (one Adam
    each), and the strategy's running ``strategy_state``."""

    params: Params
    optimizers: Optimizers
    strategy_state: dict[str, Any]


@dataclasses.dataclass
class Attempt:
    """One queued run of a step: its batch (kept for a redo), its flag and its result."""

    step: int
    batch: Batch | None  # None once only the flag waits (:meth:`flag_only`)
    finite: FiniteFlag
    res: Any
    replayed: bool = False  # res holds a CUDA graph's tensors, rewritten by its next replay
    read: FlagRead | None = None  # the host copy of the flag, started when it is queued

    def result(self) -> tuple[Tensor, Tensor]:
        """(loss [], squared error [] float64) of the step, on the device."""
        res, batch = self.res, self.batch
        assert batch is not None, "the result of an attempt whose batch was let go"
        loss = res.loss.clone() if self.replayed else res.loss
        return loss, masked_error(res.colors.clamp(0.0, 1.0), batch.target, batch.masks)

    def flag_only(self) -> Attempt:
        """This attempt without its batch and its render, which a step that cannot be redone
        no longer needs (its target and render: two images at the step's size, 0.13 GiB at
        3000x2000), for the flag read after the next step."""
        return dataclasses.replace(self, batch=None, res=None)


class StepRunner:
    """Runs the training steps of one model (see the module docs).

    Args:
        model: the parameters, optimisers and strategy state the steps change.
        plan: what each step does (:class:`.optimization.StepPlan`).
        strategy: densifies after each step; ``acts_at`` says when it may change the model.
        average: the averaged model (``ema_decay``), updated after each step, or None.
        device: where the model lives.
        capacity: the capacity of the intersection lists (capacity mode, ``capacity.py``),
            or None (exact sizes).
        order: sorts the Gaussians in space again after the strategy's edits
            (``spatial_order``), or None.
    """

    def __init__(self, model: ModelState, plan: StepPlan, strategy: Strategy,
                 average: ParamAverage | None, device: torch.device,
                 capacity: StepCapacity | None = None,
                 order: SpatialOrder | None = None) -> None:
        self.model, self.plan, self.strategy = model, plan, strategy
        self.average, self.device, self.capacity = average, device, capacity
        self.order = order
        cfg = plan.cfg
        self.average_reads = AverageSchedule(strategy.acts_at, cfg.steps,
                                             (cfg.eval_every, cfg.checkpoint_every))
        self.graph: StepGraph | None = None  # the step as one CUDA graph (use_graph)
        self._unchecked: Attempt | None = None  # the last step whose flag is not read yet

    def use_graph(self, maker: Any) -> None:
        """Replay the step as a CUDA graph made by ``maker`` from now on; the Adams take their
        rates from device tensors."""
        model, plan = self.model, self.plan
        use_rate_tensors(model.optimizers, self.device)

        def state() -> list[Tensor]:
            tensors = list(model.params.values())
            for opt in model.optimizers.values():
                for moments in opt.state.values():
                    tensors += [t for t in moments.values() if isinstance(t, Tensor)]
            return tensors

        self.graph = StepGraph(
            lambda step, batch, set_rates: self._queue(step, batch, set_rates),
            lambda step: set_learning_rates(model.optimizers, plan.cfg, plan.scene_scale, step),
            state, maker)

    def run(self, step: int, batch: Batch) -> tuple[Tensor, Tensor]:
        """One optimisation step on ``batch`` (render, loss, backward, Adam, densify).

        Returns:
            (loss [], squared error [] float64: the mean over the batch's pixels of the
            clamped render against the target), on the training device, not read back.
        """
        attempt = self._attempt(step, batch)
        if self.capacity is not None and self.strategy.acts_at(step):
            # a densification or a reset reads the device anyway: first make sure that no
            # step before it, nor this one, is to be redone (train/step/capacity.py)
            attempt, finished = self._settle(attempt)
            if finished:
                return attempt.result()
        self._finish(attempt)
        pending, self._unchecked = self._unchecked, attempt
        if pending is not None and self._check(pending):
            # the previous step overflowed its capacity, and this one was skipped after it
            self._unchecked = None
            attempt = self._redo([pending, attempt])
        result = attempt.result()
        if self.capacity is None and self._unchecked is attempt:
            self._unchecked = attempt.flag_only()  # only a capacity's overflow redoes a step
        return result

    def settle(self) -> None:
        """Settle the last step not yet checked: raise if it met NaN or Inf (its Adam update
        was skipped on the device), redo it if it overflowed its intersection capacity;
        called before a checkpoint and at the end."""
        pending, self._unchecked = self._unchecked, None
        if pending is not None and self._check(pending):
            self._redo([pending])

    def _attempt(self, step: int, batch: Batch) -> Attempt:
        """Queue the render, loss, backward and Adam of ``step`` on ``batch``: a replay of
        the step's CUDA graph where one is in use and captured, else eagerly."""
        if self.graph is None:
            return self._queue(step, batch)
        assert self.capacity is not None
        cfg = self.plan.cfg
        size = self.capacity.for_step(self.model.params, self.plan.downscale_factor(step)).size
        key = (size, sh_degree_at(cfg, step), self.plan.model.phase(cfg, step))
        attempt, replayed = self.graph.step(step, batch, key)
        if replayed:  # the graph's result, of the step it was captured at
            attempt = Attempt(step, batch, attempt.finite, attempt.res, replayed=True)
        return attempt

    def _queue(self, step: int, batch: Batch, set_rates: bool = True) -> Attempt:
        """The eager step (or what a CUDA graph captures, ``set_rates=False``)."""
        # the step's NaN/Inf checks, read after the next step is queued; on the CPU (no
        # device to wait for) they may read values back
        finite = FiniteFlag(reads_free=self.device.type == "cpu"
                            and self.plan.cfg.backend != "cuda")
        capacity = None
        if self.capacity is not None:
            capacity = self.capacity.for_step(self.model.params,
                                              self.plan.downscale_factor(step))
            self.capacity.begin_step(finite)
        with intersection_capacity(capacity):
            res = optimization_step(self.model.params, self.model.optimizers, batch, self.plan,
                                    step, finite=finite, set_rates=set_rates)
        if self.capacity is not None:
            self.capacity.end_step()
        return Attempt(step, batch, finite, res)

    def _finish(self, attempt: Attempt) -> None:
        """The strategy's and the parallel mode's part of a queued step, the average, the
        heap's free memory returned after an edit of the count (on the CPU), and the start of
        its flag's read."""
        model, plan, step = self.model, self.plan, attempt.step
        count = model.params["means"].shape[0]
        info = plan.parallel.densify_info(attempt.res.info, plan.model.gradient_key,
                                          plan.cfg.batch_size)
        if self.capacity is not None:  # a skipped step adds nothing to the statistics
            info = self.capacity.mask_info(info, attempt.finite, self.device)
        # the hooks take gsplat's arguments, as its simple_trainer.py passes them
        self.strategy.post_backward(model.params, model.optimizers, model.strategy_state, step,
                                    info, packed=plan.cfg.packed,
                                    lr=means_rate(plan.cfg, plan.scene_scale, step))
        plan.parallel.after_step(model.params, model.optimizers, model.strategy_state, step)
        if self.order is not None:  # the rows the edits appended, sorted into place
            self.order.after_edits(model.params, model.optimizers, model.strategy_state)
        if self.average is not None:
            self._update_average(step, attempt)
        if self.device.type == "cpu" and model.params["means"].shape[0] != count:
            # the edit replaced every per-Gaussian tensor (the parameters, Adam's moments, the
            # average) by larger or smaller ones: the freed ones fit none of the next steps'
            # sizes and stayed resident (docs/training.md, "The edits' freed heap")
            return_freed_heap()
        attempt.read = attempt.finite.start_read()

    def _update_average(self, step: int, attempt: Attempt) -> None:
        """The averaged model after ``step`` and the strategy's edits: dropped when an edit
        restarts it before the run reads it, restarted when this step's strategy call may
        have edited the model, else updated."""
        assert self.average is not None
        if self.average_reads.wasted(step):
            self.average.drop()
            return
        if self.strategy.acts_at(step):
            self.average.drop()  # the next update restarts it from the edited model
        # where a step can be skipped on the device and redone (an overflow of the
        # capacity), the skipped one leaves the average as it is
        skipped = None if self.capacity is None else attempt.finite.found_inf(self.device)
        self.average.update(self.model.params, skipped)

    def _check(self, attempt: Attempt) -> bool:
        """Read a step's flag: False when it was clean, True when it only overflowed its
        intersection capacity (or followed a step that did): it must be redone. Raises on
        NaN or Inf (the step's update was skipped on the device)."""
        read = attempt.read if attempt.read is not None else attempt.finite.start_read()
        bad = read.bad_names()
        if not bad:
            return False
        if overflowed(bad):
            return True
        named = sorted(set(bad) - {OVERFLOW, BLOCKED})
        raise ValueError(
            f"step {attempt.step + 1}: NaN or Inf in {', '.join(named)} (what the step "
            "renders from: the model's parameters, the cameras, or the images); its update "
            "was skipped. Lower the learning rates or check the data"
        )

    def _settle(self, attempt: Attempt) -> tuple[Attempt, bool]:
        """Read the flags of the unchecked step and of ``attempt`` (not finished) now; redo
        from the first that overflowed. Returns the attempt of ``attempt.step`` and whether
        it is finished (redone)."""
        chain = [a for a in (self._unchecked, attempt) if a is not None]
        self._unchecked = None
        for i, a in enumerate(chain):
            if self._check(a):
                return self._redo(chain[i:]), True
        return attempt, False

    def _redo(self, chain: list[Attempt]) -> Attempt:
        """Grow the capacity and run the skipped steps of ``chain`` again, in order, each
        checked at once (their batches are kept: a random background is not drawn again)."""
        assert self.capacity is not None
        redone = chain[-1]
        for a in chain:
            assert a.batch is not None, "a step to redo kept its batch"
            redone = self._attempt(a.step, a.batch)
            tries = 0
            while self._check(redone):
                tries += 1
                if tries > 4:
                    raise RuntimeError(f"step {a.step + 1}: the intersection capacity kept "
                                       "overflowing after growing")
                self.capacity.grow()
                redone = self._attempt(a.step, a.batch)
            self._finish(redone)
        return redone
