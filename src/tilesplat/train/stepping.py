"""The trainer's step: queued without waiting, checked one step late, redone when needed.

:class:`StepRunner` is the part of :class:`.trainer.Trainer` that runs one optimisation step
(``train_step``) and keeps the promise of issue 21's sync-free step:

- each step is *queued* (render, loss, backward, Adam: an :class:`Attempt`), eagerly or as a
  replay of its CUDA graph (``cuda_graph.py``), then *finished* (the strategy, the parallel
  mode) and its flag's host copy started;
- the flag of a step is read when the next step has been queued: a NaN or Inf raises, naming
  the step (its update was skipped on the device); an overflow of the intersection capacity
  (``capacity.py``) grows it and redoes the skipped steps, in order, with their batches;
- before a strategy step that changes the model, the pending flags are read at once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from ..ops.deferred_checks import FiniteFlag, FlagRead
from ..ops.intersect_capacity import OVERFLOW, intersection_capacity
from .averaging import ParamAverage
from .capacity import BLOCKED, StepCapacity, count_views, overflowed
from .cuda_graph import StepGraph, use_rate_tensors
from .masks import squared_error as masked_error
from .resolution import downscale_factor
from .splats import means_rate, set_learning_rates
from .step import make_batch, optimization_step, sh_degree_at


@dataclasses.dataclass
class Attempt:
    """One queued run of a step: its batch (kept for a redo), its flag and its result."""

    step: int
    batch: Any
    finite: FiniteFlag
    res: Any
    replayed: bool = False  # res holds a CUDA graph's tensors, rewritten by its next replay
    read: FlagRead | None = None  # the host copy of the flag, started when it is queued

    def result(self) -> tuple[Tensor, Tensor]:
        """(loss [], squared error [] float64) of the step, on the device."""
        res, batch = self.res, self.batch
        loss = res.loss.clone() if self.replayed else res.loss
        return loss, masked_error(res.colors.clamp(0.0, 1.0), batch.target, batch.masks)


class StepRunner:
    """The step of :class:`.trainer.Trainer` (a mixin: it uses the trainer's model,
    parameters, optimisers, strategy, parallel mode, capacity and graph)."""

    capacity: StepCapacity | None
    average: ParamAverage | None
    graph: StepGraph | None
    _unchecked: Attempt | None

    def _step_graph(self, maker: Any) -> StepGraph:
        """The step as a CUDA graph made by ``maker``; the Adams take their rates from
        device tensors from now on."""
        use_rate_tensors(self.optimizers, self.device)

        def state() -> list[Tensor]:
            tensors = list(self.params.values())
            for opt in self.optimizers.values():
                for moments in opt.state.values():
                    tensors += [t for t in moments.values() if isinstance(t, Tensor)]
            return tensors

        return StepGraph(
            lambda step, batch, set_rates: self._queue(step, batch, set_rates),
            lambda step: set_learning_rates(self.optimizers, self.cfg, self.scene_scale, step),
            state, maker)

    def _count_views(self, params: dict[str, Tensor], factor: int) -> Tensor:
        """[V] int64: the tile-intersection count of every training view at ``factor``."""
        def render(views: list[int]) -> None:
            frames = [self.coarse.frame(i, factor) for i in views]
            cams = make_batch(frames, self.background, False, views=views).to(self.device)
            self.model.render(params, cams, self.cfg, 0)

        return count_views(render, len(self.train_frames), self.cfg.batch_size, self.device)

    def train_step(self, step: int) -> tuple[Tensor, Tensor]:
        """One optimisation step (render, loss, backward, Adam, densify).

        Returns:
            (loss [], squared error [] float64: the mean over the batch's pixels of the
            clamped render against the target), on the training device, not read back.
        """
        indices = self.parallel.my_cameras(self.batch_indices(step))
        frames = [self.coarse.frame(i, downscale_factor(self.cfg, step)) for i in indices]
        batch = make_batch(frames, self.background, self.cfg.random_background,
                           views=indices).to(self.device)
        attempt = self._attempt(step, batch)
        if self.capacity is not None and self.strategy.acts_at(step):
            # a densification or a reset reads the device anyway: first make sure that no
            # step before it, nor this one, is to be redone (train/capacity.py)
            attempt, finished = self._settle(attempt)
            if finished:
                return attempt.result()
        self._finish(attempt)
        pending, self._unchecked = self._unchecked, attempt
        if pending is not None and self._check(pending):
            # the previous step overflowed its capacity, and this one was skipped after it
            self._unchecked = None
            attempt = self._redo([pending, attempt])
        return attempt.result()

    def _attempt(self, step: int, batch: Any) -> Attempt:
        """Queue the render, loss, backward and Adam of ``step`` on ``batch``: a replay of
        the step's CUDA graph where one is in use and captured, else eagerly."""
        if self.graph is None:
            return self._queue(step, batch)
        assert self.capacity is not None
        size = self.capacity.for_step(self.params, downscale_factor(self.cfg, step)).size
        key = (size, sh_degree_at(self.cfg, step), self.model.phase(self.cfg, step))
        attempt, replayed = self.graph.step(step, batch, key)
        if replayed:  # the graph's result, of the step it was captured at
            attempt = Attempt(step, batch, attempt.finite, attempt.res, replayed=True)
        return attempt

    def _queue(self, step: int, batch: Any, set_rates: bool = True) -> Attempt:
        """The eager step (or what a CUDA graph captures, ``set_rates=False``)."""
        cfg, strategy = self.cfg, self.strategy
        finite = FiniteFlag()  # the step's NaN/Inf checks, read after the next step is queued
        capacity = None
        if self.capacity is not None:
            capacity = self.capacity.for_step(self.params, downscale_factor(cfg, step))
            self.capacity.begin_step(finite)
        with intersection_capacity(capacity):
            res = optimization_step(
                self.params,
                self.optimizers,
                batch,
                cfg,
                step,
                self.scene_scale,
                model=self.model,
                absgrad=strategy.wants_absgrad(),
                before_backward=lambda info: strategy.step_pre_backward(
                    self.params, self.optimizers, self.strategy_state, step, info
                ),
                after_backward=lambda info: self.parallel.reduce_gradients(self.params),
                distributed=self.parallel.render_distributed,
                loss_share=self.parallel.loss_share(self.n_gaussians),
                features=self.features,
                finite=finite,
                set_rates=set_rates,
            )
        if self.capacity is not None:
            self.capacity.end_step()
        return Attempt(step, batch, finite, res)

    def _finish(self, attempt: Attempt) -> None:
        """The strategy's and the parallel mode's part of a queued step, and the start of
        its flag's read."""
        cfg, step = self.cfg, attempt.step
        info = self.parallel.densify_info(attempt.res.info, self.model.gradient_key,
                                          cfg.batch_size)
        if self.capacity is not None:  # a skipped step adds nothing to the statistics
            info = self.capacity.mask_info(info, attempt.finite, self.device)
        # the hooks take gsplat's arguments, as its simple_trainer.py passes them
        self.strategy.post_backward(self.params, self.optimizers, self.strategy_state, step,
                                    info, packed=cfg.packed,
                                    lr=means_rate(cfg, self.scene_scale, step))
        self.parallel.after_step(self.params, self.optimizers, self.strategy_state, step)
        if self.average is not None:  # after the strategy's edits, which restart it
            # where a step can be skipped on the device and redone (an overflow of the
            # capacity), the skipped one leaves the average as it is
            skipped = None if self.capacity is None else attempt.finite.found_inf(self.device)
            self.average.update(self.params, skipped)
        attempt.read = attempt.finite.start_read()

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

    def _check_finite_step(self) -> None:
        """Settle the last step not yet checked: raise if it met NaN or Inf (its Adam update
        was skipped on the device), redo it if it overflowed its intersection capacity;
        called one step late, before a checkpoint and at the end."""
        pending, self._unchecked = self._unchecked, None
        if pending is not None and self._check(pending):
            self._redo([pending])

