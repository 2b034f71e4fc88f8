"""Data-parallel training over ``torch.distributed`` (``parallel = "data"``).

Every rank holds all the Gaussians and renders its slice of each step's batch (the same
seeded batch on every rank, so a run does not depend on how many ranks it used beyond float
rounding):

- the gradients are all-reduced (one flat tensor) and averaged before Adam, which makes them
  the gradients of the whole batch's mean loss;
- densification sees every rank's cameras: the per-camera ``means2d`` gradients (and
  ``absgrad``) and radii are gathered, so every rank makes the same decisions;
- after each step a checksum of the parameters is compared across ranks and a divergence
  raises at once, naming the step;
- rank 0 alone writes (checkpoints, history, renders, the PLY).

Started by ``tilesplat train --nproc N`` or under ``torchrun``: on CPUs over gloo, on GPUs
one per rank over NCCL (``dist_backend``); every exchange moves tensors on the rank's device
(``tilesplat.distributed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from ...distributed import all_gather_equal, all_gather_tensor_list, all_reduce
from .. import seams
from .base import Parallel

if TYPE_CHECKING:
    from ...strategy import Strategy
    from ..config import TrainConfig


@seams.register("parallel", "data")
class DataParallel(Parallel):
    """The data-parallel rank of the current process group."""

    @classmethod
    def current(cls) -> DataParallel | None:
        """The process group's rank, or None outside a job of several ranks."""
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return cls(dist.get_rank(), dist.get_world_size())
        return None

    def attach(self, cfg: TrainConfig, params: dict[str, Tensor], optimizers: dict,
               state: dict[str, Any], strategy: Strategy) -> Strategy:
        """Every rank holds the whole model: refuses a batch the ranks cannot share and a
        packed render (the densification exchange gathers unpacked metadata)."""
        self.check_batch(cfg.batch_size)
        if cfg.packed:
            raise ValueError("parallel = 'data' renders unpacked: set packed = false")
        return super().attach(cfg, params, optimizers, state, strategy)

    def barrier(self) -> None:
        dist.barrier()

    def from_rank0(self, value: object) -> object:
        """Rank 0's ``value`` on every rank (a run folder name: between this job's ranks)."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (a one-number all-reduce)."""
        box = torch.tensor([1.0 if flag else 0.0], device=self.device)
        return bool(all_reduce(box, "max").item() > 0)

    def check_batch(self, batch_size: int) -> None:
        if batch_size % self.world_size:
            raise ValueError(
                f"batch_size={batch_size} must be a multiple of the {self.world_size} ranks "
                "(every rank renders batch_size / ranks cameras of each step)"
            )

    def my_cameras(self, indices: list[int]) -> list[int]:
        """This rank's share of the step's batch (:meth:`my_slice`)."""
        return self.my_slice(indices)

    def densify_info(self, info: dict, key: str, batch_size: int) -> dict:
        """Every rank's cameras (:meth:`gather_info`): the ranks densify identically."""
        return self.gather_info(info, key)

    def after_step(self, params: dict[str, Tensor], optimizers: dict, state: dict[str, Any],
                   step: int) -> None:
        """Raises when the ranks' parameters diverged (:meth:`check_in_sync`)."""
        self.check_in_sync(params, step)

    def my_slice(self, indices: list[int]) -> list[int]:
        """This rank's share of the step's batch (contiguous, equal for every rank)."""
        per = len(indices) // self.world_size
        return indices[self.rank * per:(self.rank + 1) * per]

    def reduce_gradients(self, tensors: Sequence[Tensor]) -> None:
        """Every tensor's gradient averaged over the ranks, in one all-reduce."""
        grads = [t.grad for t in tensors if t.grad is not None]
        if not grads:
            return
        flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]))
        flat /= self.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def gather_info(self, info: dict, key: str) -> dict:
        """The rasterizer's ``info`` of every rank's cameras (unpacked): ``info[key]`` with its
        ``.grad`` (and ``.absgrad``) [C_all, N, 2] as one process rendering the whole batch
        would have them, ``radii`` [C_all, N, 2] and ``n_cameras``."""
        if info.get("camera_ids") is not None:
            raise ValueError("parallel = 'data' renders unpacked (set packed = false)")
        src = info[key]
        parts = [src.detach(), info["radii"]]
        has_grad, has_abs = src.grad is not None, getattr(src, "absgrad", None) is not None
        if has_grad:
            # each rank's loss is the mean over its slice: 1 / ranks of the batch's
            parts.append(src.grad / self.world_size)
        if has_abs:
            parts.append(src.absgrad / self.world_size)
        got = all_gather_tensor_list(self.world_size, parts)
        merged = got[0].clone()
        if has_grad:
            merged.grad = got[2]
        if has_abs:
            merged.absgrad = got[3 if has_grad else 2]
        out = dict(info)
        out[key] = merged
        out["radii"] = got[1]
        out["n_cameras"] = int(got[1].shape[0])
        return out

    def check_in_sync(self, params: dict[str, Tensor], step: int) -> None:
        """Raises when the ranks' parameters differ (a cheap checksum per parameter)."""
        count = torch.tensor(float(len(params["means"])), dtype=torch.float64,
                             device=self.device)
        sums = torch.stack([p.detach().double().sum() for p in params.values()] + [count])
        got = all_gather_equal(sums)
        for r, other in enumerate(got):
            if not torch.equal(other, sums):
                raise RuntimeError(
                    f"data-parallel ranks diverged at step {step}: rank {r}'s parameters "
                    f"differ from rank {self.rank}'s (checksums {other.tolist()} vs "
                    f"{sums.tolist()})"
                )
