"""Model-parallel training over ``torch.distributed`` (``parallel = "model"``).

Each rank holds a contiguous shard of the Gaussians (rank 0's first in the model's order)
with their Adam moments and densification statistics, and renders its slice of each step's
batch with ``rasterization(distributed=True)``: its shard is projected into every rank's
cameras and the projections travel to the rank that owns each camera (``sharding.py``).

- Each rank's loss is its slice's photometric loss weighted by its share of the batch's
  cameras, and the regularisers are sums over its shard divided by the total count, so the
  ranks' losses add up to the loss one process would take over the whole batch and model.
- Densification is local to the shard (gsplat's default strategy or MCMC, the MCMC cap
  split between the ranks); when the counts drift apart (max / min > ``REBALANCE_RATIO``,
  Grendel's threshold) the Gaussians, their Adam moments and statistics move between ranks
  so that every rank holds an even share again, in the same global order.
- Rank 0 gathers the whole model (and its optimiser state) for checkpoints, evaluation and
  the PLY; a checkpoint is the same whole-model file one process writes, so ``--resume``
  works with any number of ranks (each takes its even share).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...distributed import all_gather_int32, all_to_all_tensor_list
from .. import seams
from .data import DataParallel

if TYPE_CHECKING:
    from ...strategy import Strategy
    from ..config import TrainConfig

# Grendel (arXiv 2406.18533) rebalances its Gaussians when the largest shard exceeds the
# smallest by more than 10 %.
REBALANCE_RATIO = 1.1
# the default strategy's running statistics, one row per Gaussian (None before its first
# accumulation); MCMC keeps none
PER_GAUSSIAN_STATE = ("grad2d", "count", "radii")
MOMENTS = ("exp_avg", "exp_avg_sq")


def even_counts(n_total: int, world_size: int) -> list[int]:
    """The even split of ``n_total`` rows over ``world_size`` ranks (the first ranks take
    the remainder)."""
    base, extra = divmod(n_total, world_size)
    return [base + (1 if r < extra else 0) for r in range(world_size)]


def _starts(counts: list[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out


def transfer_splits(old: list[int], new: list[int], rank: int) -> tuple[list[int], list[int]]:
    """(rows this rank sends to each rank, rows it receives from each rank) when the global
    order of the rows is kept and the shards go from ``old`` to ``new`` counts."""
    o_start, n_start = _starts(old), _starts(new)

    def overlap(a0: int, a1: int, b0: int, b1: int) -> int:
        return max(0, min(a1, b1) - max(a0, b0))

    mine_old = (o_start[rank], o_start[rank] + old[rank])
    mine_new = (n_start[rank], n_start[rank] + new[rank])
    send = [overlap(*mine_old, n_start[d], n_start[d] + new[d]) for d in range(len(new))]
    recv = [overlap(*mine_new, o_start[s], o_start[s] + old[s]) for s in range(len(old))]
    return send, recv


def needs_rebalance(counts: list[int]) -> bool:
    """Whether the shard sizes ``counts`` have drifted apart (max / min > REBALANCE_RATIO;
    an empty shard beside a non-empty one always)."""
    lo, hi = min(counts), max(counts)
    if hi == 0:
        return False
    return lo == 0 or hi > REBALANCE_RATIO * lo


def _moment(opt: torch.optim.Optimizer, param: Tensor, key: str) -> Tensor:
    st = opt.state.get(param, {})
    value = st.get(key)
    return value if isinstance(value, Tensor) else torch.zeros_like(param)


def _state_rows(state: dict[str, Any], n: int) -> list[str]:
    """The strategy state's per-Gaussian keys present as [n, ...] tensors."""
    keys = []
    for key in PER_GAUSSIAN_STATE:
        value = state.get(key)
        if isinstance(value, Tensor) and value.dim() >= 1:
            if value.shape[0] != n:
                raise RuntimeError(f"strategy state {key!r} has {value.shape[0]} rows for "
                                   f"{n} Gaussians")
            keys.append(key)
    return keys


@torch.no_grad()
def replace_rows(
    params: dict[str, torch.nn.Parameter],
    optimizers: dict[str, torch.optim.Optimizer],
    state: dict[str, Any],
    rows: dict[str, Tensor],
) -> None:
    """Swap in new rows: ``rows[name]``, ``rows[name + ".exp_avg"]`` (and ``exp_avg_sq``)
    for every parameter and its Adam moments (``step`` kept), ``rows["state." + key]`` for
    the strategy's per-Gaussian statistics."""
    for name in list(params):
        old = params[name]
        new = torch.nn.Parameter(rows[name].contiguous(), requires_grad=old.requires_grad)
        params[name] = new
        opt = optimizers[name]
        opt.param_groups[0]["params"] = [new]
        st = opt.state.pop(old, None)
        if st is not None:
            st = dict(st)
            for key in MOMENTS:
                st[key] = rows[f"{name}.{key}"].contiguous()
            opt.state[new] = st
    for key, value in rows.items():
        if key.startswith("state."):
            state[key[len("state."):]] = value.contiguous()


@seams.register("parallel", "model")
class ModelParallel(DataParallel):
    """The model-parallel rank of the current process group (a shard of the Gaussians)."""

    render_distributed = True
    collective_checkpoint = True

    def __init__(self, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(rank, world_size)
        self.shard_counts: list[int] = []  # every rank's Gaussian count, after the last step
        self.rebalances: list[tuple[int, list[int], list[int]]] = []  # (step, before, after)

    @classmethod
    def current(cls) -> ModelParallel | None:  # type: ignore[override]
        base = DataParallel.current()
        return None if base is None else cls(base.rank, base.world_size)

    @classmethod
    def config_errors(cls, cfg: TrainConfig) -> list[str]:
        """The data mode's, and what needs the whole model in one process: absgrad
        (``rasterization(distributed=True)`` does not compute it) and the live viewer."""
        errors = super().config_errors(cfg)
        strategy = seams.variant("strategy", cfg.strategy).from_config(cfg)
        if strategy.wants_absgrad():
            errors.append("parallel = 'model' has no absgrad (rasterization(distributed=True) "
                          "does not compute it): set absgrad = false")
        if cfg.viewer_port != 0:
            errors.append("viewer_port needs the whole model in one process: not with "
                          "parallel = 'model'")
        return errors

    def attach(self, cfg: TrainConfig, params: dict[str, Tensor], optimizers: dict,
               state: dict[str, Any], strategy: Strategy) -> Strategy:
        """Keep this rank's even share of the model (:meth:`take_shard`), densified by the
        strategy's share (``Strategy.share``: MCMC splits its cap)."""
        self.check_batch(cfg.batch_size)
        self.device = params["means"].device
        strategy = strategy.share(self.rank, self.world_size)
        self.take_shard(params, optimizers, state)
        self.shard_counts = self.counts(len(params["means"]))
        return strategy

    def loss_share(self, n_gaussians: int) -> tuple[float, int] | None:
        """1 / ranks of the batch's cameras, over the whole model's ``n_gaussians``."""
        return 1.0 / self.world_size, n_gaussians

    def reduce_gradients(self, tensors: Sequence[Tensor]) -> None:
        """Nothing: each rank's gradients are its shard's (the exchange routed them)."""

    def densify_info(self, info: dict, key: str, batch_size: int) -> dict:
        """The shard's own meta: the pre-exchange ``key`` [C_all, N_shard, 2] carry 1 / C_all
        of each camera's loss gradient (the shares add up to the batch's mean), undone over
        all the batch's cameras."""
        info["n_cameras"] = batch_size
        return info

    def after_step(self, params: dict[str, Tensor], optimizers: dict, state: dict[str, Any],
                   step: int) -> None:
        """Rebalance the shards when densification drifted them apart (recorded in
        :attr:`rebalances`)."""
        before = self.counts(len(params["means"]))
        self.shard_counts, moved = self.rebalance(params, optimizers, state, counts=before)
        if moved:
            self.rebalances.append((step, before, list(self.shard_counts)))

    def n_gaussians(self, n_local: int) -> int:
        """The sum of the shards' counts after the last step."""
        return sum(self.shard_counts)

    def whole_model(self, params: dict[str, Tensor], optimizers: dict, state: dict[str, Any]
                    ) -> tuple[dict, dict, dict] | None:
        """The shards gathered on rank 0 (:meth:`gather_model`), with the optimisers' state
        dicts carrying the gathered moments; None on the other ranks. Every rank must call
        it."""
        got = self.gather_model(params, optimizers, state)
        if got is None:
            return None
        whole, moments, stats = got
        optim = {}
        for name, opt in optimizers.items():
            sd = opt.state_dict()  # its per-parameter dicts are the live ones: copy them
            sd["state"] = {i: {**st, **{key: moments[f"{name}.{key}"] for key in MOMENTS}}
                           for i, st in sd["state"].items()}  # one parameter per optimiser
            optim[name] = sd
        merged = dict(state)
        merged.update(stats)
        return whole, optim, merged

    def full_params(self, params: dict[str, Tensor], optimizers: dict,
                    state: dict[str, Any]) -> dict[str, Tensor] | None:
        """The gathered parameters on rank 0, None on the other ranks (every rank must call
        it)."""
        got = self.whole_model(params, optimizers, state)
        return None if got is None else got[0]

    def counts(self, n_local: int) -> list[int]:
        """Every rank's Gaussian count (a small all-gather)."""
        return all_gather_int32(self.world_size, int(n_local), device=self.device)

    def _flat_rows(self, params: dict, optimizers: dict, state: dict) -> dict[str, Tensor]:
        n = len(params["means"])
        rows: dict[str, Tensor] = {}
        for name, p in params.items():
            rows[name] = p.detach()
            for key in MOMENTS:
                rows[f"{name}.{key}"] = _moment(optimizers[name], p, key)
        for key in _state_rows(state, n):
            rows["state." + key] = state[key]
        return rows

    def _state_keys_everywhere(self, state: dict, n: int) -> list[str]:
        """The per-Gaussian state keys every rank holds (a rank that has not accumulated yet
        holds None: those keys are dropped, as the strategy recreates them)."""
        mine = _state_rows(state, n)
        flags = all_gather_int32(self.world_size, sum(1 << i for i, k in
                                                      enumerate(PER_GAUSSIAN_STATE)
                                                      if k in mine), device=self.device)
        common = [k for i, k in enumerate(PER_GAUSSIAN_STATE)
                  if all(f & (1 << i) for f in flags)]
        for key in mine:
            if key not in common:
                state[key] = None
        return common

    @torch.no_grad()
    def rebalance(self, params: dict, optimizers: dict, state: dict,
                  counts: list[int] | None = None, target: list[int] | None = None
                  ) -> tuple[list[int], bool]:
        """Even the shards out when they drifted: moves rows of the parameters, their Adam
        moments and the strategy's statistics so that rank r holds the r-th of
        ``even_counts`` rows of the global order (or ``target[r]`` rows when given: then
        always). ``counts``: every rank's count when the caller has them. Returns (counts
        now, moved)."""
        n = len(params["means"])
        counts = self.counts(n) if counts is None else counts
        if target is None:
            if not needs_rebalance(counts):
                return counts, False
            target = even_counts(sum(counts), self.world_size)
        if len(target) != self.world_size or sum(target) != sum(counts) or min(target) < 0:
            raise ValueError(f"target must be {self.world_size} counts >= 0 summing to "
                             f"{sum(counts)}, got {target}")
        if target == counts:
            return counts, False
        keys = self._state_keys_everywhere(state, n)
        rows = self._flat_rows(params, optimizers, state)
        rows = {k: v for k, v in rows.items() if not k.startswith("state.")
                or k[len("state."):] in keys}
        send, recv = transfer_splits(counts, target, self.rank)
        names = list(rows)
        got = all_to_all_tensor_list(self.world_size, [rows[k] for k in names], send, recv)
        replace_rows(params, optimizers, state, dict(zip(names, got, strict=True)))
        return target, True

    @torch.no_grad()
    def gather_to_rank0(self, tensors: list[Tensor]) -> list[Tensor] | None:
        """Rows [(N_r, *), ...] of every rank concatenated in rank order on rank 0; None on
        the other ranks."""
        n = int(tensors[0].shape[0])
        counts = self.counts(n)
        send = [n if d == 0 else 0 for d in range(self.world_size)]
        recv = counts if self.rank == 0 else [0] * self.world_size
        got = all_to_all_tensor_list(self.world_size, [t.detach() for t in tensors], send,
                                     recv)
        return got if self.rank == 0 else None

    def gather_model(self, params: dict, optimizers: dict, state: dict
                     ) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]] | None:
        """The whole model on rank 0: (parameters, Adam moments keyed ``name.exp_avg`` ...,
        the strategy's per-Gaussian statistics); None on the other ranks."""
        n = len(params["means"])
        keys = self._state_keys_everywhere(state, n)
        rows = self._flat_rows(params, optimizers, state)
        rows = {k: v for k, v in rows.items() if not k.startswith("state.")
                or k[len("state."):] in keys}
        names = list(rows)
        got = self.gather_to_rank0([rows[k] for k in names])
        if got is None:
            return None
        whole = dict(zip(names, got, strict=True))
        model = {k: whole[k] for k in params}
        moments = {k: v for k, v in whole.items() if "." in k and not k.startswith("state.")}
        stats = {k[len("state."):]: v for k, v in whole.items() if k.startswith("state.")}
        return model, moments, stats

    @torch.no_grad()
    def take_shard(self, params: dict, optimizers: dict, state: dict) -> None:
        """Keep this rank's even share of a whole model held by every rank (a fresh start
        or a checkpoint), with its Adam moments and statistics."""
        n = len(params["means"])
        start = _starts(even_counts(n, self.world_size))[self.rank]
        stop = start + even_counts(n, self.world_size)[self.rank]
        rows = self._flat_rows(params, optimizers, state)
        replace_rows(params, optimizers, state, {k: v[start:stop].clone()
                                                 for k, v in rows.items()})
