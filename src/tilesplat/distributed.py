"""Collectives of gsplat 1.5.3 (``gsplat.distributed``) under its names and signatures, on
any ``torch.distributed`` backend: gloo on CPUs, NCCL on GPUs.

Every exchange is one ``all_to_all_single`` with split sizes. gloo rejects ``all_to_all``
and ``all_gather`` whose pieces differ in size ("invalid tensor size"), while
``all_to_all_single`` takes uneven and zero splits on both backends; its backward is the
same exchange with the splits swapped (``_AllToAllRows``; torch's deprecated autograd
wrapper in ``torch.distributed.nn`` made a rank abort at exit about one run in three). So:

- a gather of ``n_r`` rows from each rank ``r`` is an all-to-all in which every rank sends
  its rows to every rank (input split sizes ``[n_self] * world_size``, output split sizes
  the gathered ``n_r``); its backward sums each rank's gradient of the copies, as a
  gather's must;
- unlike gsplat's, :func:`all_gather_tensor_list` accepts a different row count per rank
  (gsplat's requires equal ones).

Integers travel as int32 (gsplat's ``all_gather_int32`` / ``all_to_all_int32``), on the
device of the process group's backend (``device`` for Python ints).

Where the tensors are: every collective here takes and returns tensors on the caller's
device (a rank's GPU with NCCL, the CPU with gloo). gloo with CUDA tensors (two ranks sharing
one GPU, which NCCL refuses) is the one case whose bytes go through the host:
:func:`_on_the_wire` copies them there and back, and nothing else in tilesplat's collectives
or the trainer's exchanges copies a tensor to the host.

Starting ranks: :func:`launch_local` (``tilesplat train --nproc``, gsplat's :func:`cli`) and
:func:`join_torchrun`; rank r of a job on GPUs binds ``cuda:LOCAL_RANK`` (:func:`rank_gpu`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

# gsplat's launcher lives beside its collectives (gsplat.distributed.cli): ranks.py
from .ranks import (  # noqa: F401  (re-exported)
    cli,
    end_rank_process,
    join_torchrun,
    launch_local,
    torchrun_world_size,
)


def _check_world(world_size: int) -> None:
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if world_size == 1:
        return
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"world_size={world_size} needs an initialised torch.distributed process group "
            "(torch.distributed.init_process_group, or run under torchrun)"
        )
    if dist.get_world_size() != world_size:
        raise ValueError(
            f"world_size={world_size} but the process group has {dist.get_world_size()} ranks"
        )


def _on_the_wire(collective: Callable[[list[Tensor], list[Tensor]], Any],
                 outputs: list[Tensor], inputs: list[Tensor]) -> None:
    """Runs ``collective(outputs, inputs)`` (a ``torch.distributed`` call writing
    ``outputs``, which may be ``inputs`` themselves for an in-place one) on the tensors'
    device; the one place where a collective's tensors may go through the host.

    NCCL and gloo on CPU tensors take the tensors as they are. gloo with tensors on another
    device (CUDA tensors of ranks that share a GPU) gets host copies of the inputs and host
    buffers for the outputs, and the outputs are copied back onto their device: one copy
    each way, explicit here rather than left to whether this build of gloo stages device
    tensors itself."""
    if not inputs or inputs[0].device.type == "cpu" or dist.get_backend() != "gloo":
        collective(outputs, inputs)
        return
    host: dict[int, Tensor] = {id(t): t.detach().to("cpu") for t in inputs}
    host_out = [host.get(id(t)) if id(t) in host else torch.empty(t.shape, dtype=t.dtype)
                for t in outputs]
    collective(host_out, [host[id(t)] for t in inputs])
    with torch.no_grad():
        for t, h in zip(outputs, host_out, strict=True):
            t.copy_(h)


def _all_to_all_rows(data: Tensor, out_splits: list[int], in_splits: list[int]) -> Tensor:
    out = data.new_empty((sum(out_splits), *data.shape[1:]))
    _on_the_wire(lambda o, i: dist.all_to_all_single(o[0], i[0], out_splits, in_splits),
                 [out], [data.contiguous()])
    return out


def all_reduce(tensor: Tensor, op: str = "sum") -> Tensor:
    """``tensor`` reduced over the ranks in place (``op``: ``sum`` or ``max``), on its device;
    returns it. The process group must be up."""
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    if op not in ops:
        raise ValueError(f"op must be one of {sorted(ops)}, got {op!r}")
    _on_the_wire(lambda o, i: dist.all_reduce(o[0], op=ops[op]), [tensor], [tensor])
    return tensor


def all_gather_equal(tensor: Tensor) -> list[Tensor]:
    """Every rank's ``tensor`` (the same shape on every rank), rank 0's first, on its device.
    Not differentiable."""
    got = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    _on_the_wire(lambda o, i: dist.all_gather(o, i[0]), got, [tensor.contiguous()])
    return got


class _AllToAllRows(torch.autograd.Function):
    """``all_to_all_single`` whose backward sends the gradients back the way the rows came
    (the same collective with the splits swapped), on the thread that runs the backward."""

    @staticmethod
    def forward(ctx, data, out_splits, in_splits):
        ctx.splits = (out_splits, in_splits)
        return _all_to_all_rows(data, out_splits, in_splits)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _all_to_all_rows(grad.contiguous(), in_splits, out_splits), None, None


def _exchange(data: Tensor, out_splits: list[int], in_splits: list[int]) -> Tensor:
    """``all_to_all_single`` of the rows of ``data`` [n, F]: rows ``in_splits[r]`` go to rank
    r; returns [sum(out_splits), F]. Differentiable when ``data`` requires a gradient."""
    if data.requires_grad:
        return _AllToAllRows.apply(data, list(out_splits), list(in_splits))
    return _all_to_all_rows(data, out_splits, in_splits)


def _int_tensor(value: int | Tensor, device: torch.device | None, what: str) -> Tensor:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(f"{what} must hold one integer, got a tensor of shape "
                             f"{tuple(value.shape)}")
        return value.reshape(1).to(torch.int32)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or a one-element tensor, got {value!r}")
    if device is None:
        raise ValueError(f"device is required when {what} is a Python int")
    return torch.tensor([value], dtype=torch.int32, device=device)


def all_gather_int32(
    world_size: int, value: int | Tensor, device: torch.device | None = None
) -> list[int]:
    """One 32-bit integer from every rank: the i-th element is rank i's ``value``.

    ``value`` is an int (then ``device`` is required and ints come back) or a one-element
    tensor (then one-element tensors come back). Not differentiable.
    """
    _check_world(world_size)
    if world_size == 1:
        return [value]
    t = _int_tensor(value, device, "value")
    got = _exchange(t.repeat(world_size), [1] * world_size, [1] * world_size)
    return got.tolist() if isinstance(value, int) else list(got.unbind())


def all_to_all_int32(
    world_size: int, values: list[int | Tensor], device: torch.device | None = None
) -> list[int]:
    """32-bit integers exchanged rank to rank: ``values[r]`` goes to rank r, and element r of
    the result came from rank r. Ints in, ints out; one-element tensors in, tensors out."""
    _check_world(world_size)
    if world_size == 1:
        return values
    if len(values) != world_size:
        raise ValueError(f"values must have world_size={world_size} entries, got "
                         f"{len(values)}")
    dev = device
    for v in values:
        if isinstance(v, Tensor):
            dev = v.device
    t = torch.cat([_int_tensor(v, dev, "values[i]") for v in values])
    got = _exchange(t, [1] * world_size, [1] * world_size)
    return [int(g) if not isinstance(v, Tensor) else g.reshape(v.shape)
            for g, v in zip(got, values, strict=True)]


def _groups(tensor_list: list[Tensor], name: str) -> tuple[dict, int]:
    """Tensors [(N, *), ...] side by side as one [N, F] tensor per dtype (so int32 radii
    travel exactly beside float means); ({dtype: (data, indices, widths)}, N)."""
    if not tensor_list:
        raise ValueError(f"{name} must hold at least one tensor")
    first = tensor_list[0]
    for i, t in enumerate(tensor_list):
        if not isinstance(t, Tensor) or t.dim() == 0 or t.shape[0] != first.shape[0]:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}[{i}] must be a tensor with the rows of {name}[0] "
                             f"({tuple(first.shape)}), got {got}")
        if t.device != first.device:
            raise ValueError(f"{name}: every tensor must be on {name}[0]'s device "
                             f"({first.device}), {name}[{i}] is on {t.device}")
    n = first.shape[0]
    members: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensor_list):
        members.setdefault(t.dtype, []).append(i)
    groups = {}
    for dtype, idx in members.items():
        widths = [math.prod(tensor_list[i].shape[1:]) for i in idx]
        data = torch.cat([tensor_list[i].reshape(n, w) for i, w in zip(idx, widths,
                                                                        strict=True)], dim=-1)
        groups[dtype] = (data, idx, widths)
    return groups, n


def _exchange_list(tensor_list: list[Tensor], groups: dict, out_splits: list[int],
                   in_splits: list[int], repeat: int = 1) -> list[Tensor]:
    """Each dtype group through :func:`_exchange` (rows repeated ``repeat`` times for a
    gather), split back into the shapes of ``tensor_list``."""
    out: list[Tensor | None] = [None] * len(tensor_list)
    for data, idx, widths in groups.values():
        src = data.repeat(repeat, 1) if repeat > 1 else data
        got = _exchange(src, out_splits, in_splits)
        for i, part in zip(idx, torch.split(got, widths, dim=-1), strict=True):
            out[i] = part.reshape(-1, *tensor_list[i].shape[1:])
    return out  # type: ignore[return-value]


def all_gather_tensor_list(world_size: int, tensor_list: list[Tensor]) -> list[Tensor]:
    """Tensors [(N_r, *), ...] gathered from every rank: [(sum N_r, *), ...], rank 0's rows
    first. Differentiable. The trailing shapes must agree across ranks; the row counts may
    differ (gsplat requires them equal)."""
    _check_world(world_size)
    if world_size == 1:
        return tensor_list
    groups, n = _groups(tensor_list, "tensor_list")
    counts = all_gather_int32(world_size, n, device=tensor_list[0].device)
    return _exchange_list(tensor_list, groups, counts, [n] * world_size, repeat=world_size)


def all_to_all_tensor_list(
    world_size: int,
    tensor_list: list[Tensor],
    splits: list[int | Tensor],
    output_splits: list[int | Tensor] | None = None,
) -> list[Tensor]:
    """Rows of tensors [(N, *), ...] exchanged by split sizes: the first ``splits[0]`` rows
    go to rank 0, the next ``splits[1]`` to rank 1, ...; the result holds the rows every
    rank sent here, rank 0's first. ``output_splits`` (what each rank sends here) is
    exchanged when not given. Differentiable; uneven and zero splits are fine."""
    _check_world(world_size)
    if world_size == 1:
        return tensor_list
    groups, n = _groups(tensor_list, "tensor_list")
    if len(splits) != world_size:
        raise ValueError(f"splits must have world_size={world_size} entries, got {len(splits)}")
    send = [int(s) for s in splits]
    if any(s < 0 for s in send) or sum(send) != n:
        raise ValueError(f"splits must be >= 0 and sum to the {n} rows, got {send}")
    if output_splits is None:
        recv = all_to_all_int32(world_size, send, device=tensor_list[0].device)
    else:
        if len(output_splits) != world_size:
            raise ValueError(f"output_splits must have world_size={world_size} entries, "
                             f"got {len(output_splits)}")
        recv = [int(s) for s in output_splits]
    return _exchange_list(tensor_list, groups, recv, send)
