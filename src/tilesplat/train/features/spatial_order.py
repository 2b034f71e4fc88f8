"""The Gaussians kept in the order of their centres in space (``spatial_order``).

The kernels read each tile's Gaussians through the tile's list of indices: the projection's
outputs, the colours and the bounds of every Gaussian the tile sees, in depth order. Gaussians
near each other on the screen are near each other in space, so when the model's rows follow a
space-filling curve a tile's reads fall on few cache lines; in the order that densification
leaves (clones and splits appended at the end, a point cloud's own order before that) they fall
on a line each. At 1 M Gaussians and 1,297 x 840 the CPU training step takes 0.92x the time
in Morton order that it takes in the scaled garden's own order, and 0.86x that of a shuffled
model (the rasterizer's backward 0.88x and 0.84x; docs/benchmarks.md, "The Gaussians in space
order").

With ``spatial_order = true`` (the default) the trainer sorts its initial Gaussians by the
Morton code of their centres, and sorts them again after every step in which the strategy
replaced the parameters (a densification, a prune, a relocation, an opacity reset), with their
Adam moments and the strategy's per-Gaussian statistics, in place (one temporary copy of one
tensor at a time: less memory than the strategy's edit took). A sort permutes the rows: the
renders and each Gaussian's gradients are the same (up to the order of Gaussians at exactly
the same depth). The strategies' random draws follow the row order, so a run is as
reproducible as before but not the same run as one without the sort. In a model-parallel job
each rank sorts its own shard (the initial model is sorted whole, before it is split).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...keys import Key
from ...strategy.ops import reorder
from .. import seams

if TYPE_CHECKING:
    from ...strategy import Strategy
    from ..config import TrainConfig

KEYS = (
    Key("spatial_order", True, "keep the Gaussians sorted by the Morton code of their centres "
        "(at the start and after every edit of the strategy), so that the kernels' reads of a "
        "tile's Gaussians are near in memory; the same renders, rows permuted"),
)

seams.register_keys("spatial order (train/features/spatial_order.py)", KEYS)

BITS = 21  # per axis: a 63-bit code in an int64
# the box the codes span: these quantiles of the centres per axis (far outliers, as a
# capture's background points, are clamped to its faces instead of squeezing the rest)
BOX_QUANTILES = (0.005, 0.995)
# torch.quantile's input limit is 2**24 elements: the box is taken from every k-th centre
BOX_SAMPLES = 1 << 20


def _spread(v: Tensor) -> Tensor:
    """[N] int64 of BITS bits -> the same bits at every third position (bit i at 3 i)."""
    v = v & 0x1FFFFF
    v = (v | (v << 32)) & 0x1F00000000FFFF
    v = (v | (v << 16)) & 0x1F0000FF0000FF
    v = (v | (v << 8)) & 0x100F00F00F00F00F
    v = (v | (v << 4)) & 0x10C30C30C30C30C3
    return (v | (v << 2)) & 0x1249249249249249


def morton_codes(means: Tensor) -> Tensor:
    """The Morton codes [N] int64 of centres ``means`` [N, 3] on a 2**21 grid per axis over the
    box of their 0.5 % and 99.5 % quantiles (centres outside it on its faces; non-finite
    ones at its low corner)."""
    x = torch.nan_to_num(means.detach().float(), nan=0.0, posinf=0.0, neginf=0.0)
    sample = x[:: max(1, len(x) // BOX_SAMPLES)]
    # float quantiles: a tensor of them would be range-checked by a read of the device
    lo, hi = (torch.quantile(sample, q, dim=0) for q in BOX_QUANTILES)
    extent = torch.where(hi > lo, hi - lo, torch.ones_like(hi))
    top = (1 << BITS) - 1
    grid = ((x - lo) / extent).clamp(0.0, 1.0).mul(top).to(torch.int64)
    return _spread(grid[:, 0]) | (_spread(grid[:, 1]) << 1) | (_spread(grid[:, 2]) << 2)


def morton_order(means: Tensor) -> Tensor:
    """The permutation [N] int64 that sorts ``means`` [N, 3] by :func:`morton_codes` (ties in
    row order): row i of the sorted model is row ``order[i]`` of this one."""
    if len(means) < 2:
        return torch.arange(len(means), device=means.device)
    return torch.argsort(morton_codes(means), stable=True)


def sorted_start(params: dict[str, Tensor]) -> dict[str, Tensor]:
    """The initial parameters (each [N, ...], ``means`` [N, 3]) put in :func:`morton_order`
    in the dict itself, one tensor at a time (a model read from a file of millions of
    Gaussians is not held twice); returns the dict."""
    order = morton_order(params["means"])
    for k in list(params):
        params[k] = params[k][order]
    return params


class SpatialOrder:
    """Sorts a model again after the strategy replaced its parameters.

    Args:
        params: the model's parameters as the trainer starts with them (already in order:
            sorted at the start, or as a checkpoint holds them).
        strategy: the strategy, which says which entries of its state are per Gaussian
            (``Strategy.row_state``).
    """

    def __init__(self, params: dict[str, Tensor], strategy: Strategy) -> None:
        self._seen = dict(params)
        self.strategy = strategy
        self.sorts = 0

    def after_edits(self, params: Any, optimizers: Any, state: dict[str, Any]) -> bool:
        """Sort ``params`` (with their Adam moments and the strategy's per-Gaussian ``state``)
        when one of them is not the tensor seen last; returns whether it sorted."""
        if self._seen.keys() == params.keys() and all(params[k] is v
                                                      for k, v in self._seen.items()):
            return False
        self._seen = dict(params)
        order = morton_order(params["means"].detach())
        reorder(params, optimizers, state, order, self.strategy.row_state(state))
        self.sorts += 1
        return True


def spatial_order(cfg: TrainConfig, params: dict[str, Tensor],
                  strategy: Strategy) -> SpatialOrder | None:
    """The sort of ``params`` after the strategy's edits, or None when ``spatial_order`` is
    off."""
    return SpatialOrder(params, strategy) if cfg.spatial_order else None
