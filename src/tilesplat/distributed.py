"""Collectives of gsplat 1.5.3 (``gsplat.distributed``) under its names and signatures.

Not implemented yet: the collectives for ``rasterization(distributed=True)`` (model-parallel
Gaussians over ``torch.distributed``, ``all_to_all_single`` with split sizes, since gloo
rejects uneven ``all_to_all`` / ``all_gather``) are issue 10's work. Each name raises
``NotImplementedError`` when called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import torch
from torch import Tensor

ISSUE_10 = (
    "tilesplat's collectives for distributed rendering are not implemented yet (issue 10: "
    "all_to_all_single with split sizes over torch.distributed)"
)


def _missing(name: str) -> NoReturn:
    raise NotImplementedError(f"tilesplat.distributed.{name}(): {ISSUE_10}")


def all_gather_int32(
    world_size: int, value: int | Tensor, device: torch.device | None = None
) -> list[int]:
    """One int from every rank. Not implemented: raises NotImplementedError."""
    _missing("all_gather_int32")


def all_to_all_int32(
    world_size: int, values: list[int | Tensor], device: torch.device | None = None
) -> list[int]:
    """Ints exchanged rank to rank. Not implemented: raises NotImplementedError."""
    _missing("all_to_all_int32")


def all_gather_tensor_list(world_size: int, tensor_list: list[Tensor]) -> list[Tensor]:
    """Tensors gathered from every rank. Not implemented: raises NotImplementedError."""
    _missing("all_gather_tensor_list")


def all_to_all_tensor_list(
    world_size: int,
    tensor_list: list[Tensor],
    splits: list[int | Tensor],
    output_splits: list[int | Tensor] | None = None,
) -> list[Tensor]:
    """Rows of tensors exchanged by split sizes. Not implemented: raises
    NotImplementedError."""
    _missing("all_to_all_tensor_list")


def cli(fn: Callable, args: Any, verbose: bool = False) -> bool:
    """gsplat's launcher of ``fn`` on every local GPU. Not implemented: raises
    NotImplementedError."""
    _missing("cli")
