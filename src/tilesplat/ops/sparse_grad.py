"""``sparse_grad=True`` of the projections (gsplat 1.5.3): the gradients of the Gaussians'
parameters as sparse COO tensors over the Gaussians a packed projection kept.

gsplat's packed backward kernels write one gradient row per visible (camera, Gaussian) pair
and wrap them in an uncoalesced COO tensor over ``gaussian_ids``. tilesplat's backends all
have a dense backward, so the conversion happens here, on top of it, for every backend: an
identity op on each parameter whose backward keeps only the rows of the Gaussians that some
camera sees (a coalesced COO tensor, sorted rows, one per Gaussian: the same sum gsplat's
duplicates coalesce to). The rows are known only once the projection has run, so the
projection hands them to :meth:`SparseRows.set` after its forward. A sparse gradient suits
``torch.optim.SparseAdam``, which then updates only those rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .validation import check_bool


class SparseRows:
    """The rows [nnz] (int64, sorted, unique) of the Gaussians that reach the rasterizer."""

    def __init__(self) -> None:
        self.rows: Tensor | None = None

    def set(self, visible: Tensor) -> None:  # visible: [N] bool
        self.rows = visible.nonzero().squeeze(1)

    def sparse(self, grad: Tensor) -> Tensor:  # grad: [N, ...] -> sparse [N, ...]
        if self.rows is None:
            raise RuntimeError("sparse_grad: the projection never set its rows")
        return torch.sparse_coo_tensor(self.rows[None], grad[self.rows], size=grad.shape,
                                       is_coalesced=True)


class _SparseGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows: SparseRows, *params: Tensor) -> tuple[Tensor, ...]:
        ctx.rows = rows
        return tuple(p.view_as(p) for p in params)

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        return (None, *(None if g is None else ctx.rows.sparse(g) for g in grads))


def check_sparse_grad(sparse_grad: object, packed: bool, batch_dims: tuple[int, ...],
                      op: str) -> bool:
    """gsplat's refusals, as one-line ``ValueError``s naming the argument: ``sparse_grad``
    needs ``packed=True`` and no batch dimensions."""
    check_bool("sparse_grad", sparse_grad)
    if sparse_grad and not packed:
        raise ValueError(f"{op}(sparse_grad=True) needs packed=True (the gradients are sparse "
                         "over the packed Gaussians)")
    if sparse_grad and batch_dims != ():
        raise ValueError(f"{op}(sparse_grad=True) does not support batch dimensions, got "
                         f"means of batch shape {tuple(batch_dims)}")
    return bool(sparse_grad)


def with_sparse_grad(rows: SparseRows, *params: Tensor | None) -> tuple[Tensor | None, ...]:
    """``params`` ([N, ...] each, or None) as identities whose gradients come back sparse over
    ``rows`` (filled by the caller after its forward)."""
    present = [p for p in params if p is not None]
    if not any(p.requires_grad for p in present):
        return params
    out = iter(_SparseGrad.apply(rows, *present))
    return tuple(None if p is None else next(out) for p in params)


_TRIU = ([0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2])


class _UpperTriangle(torch.autograd.Function):
    """covars [..., 3, 3] -> [..., 6] (xx, xy, xz, yy, yz, zz) whose backward also takes the
    sparse gradient of ``sparse_grad`` (indexing's own backward has no sparse kernel)."""

    @staticmethod
    def forward(ctx, covars: Tensor) -> Tensor:
        ctx.shape = covars.shape
        return covars[..., _TRIU[0], _TRIU[1]]

    @staticmethod
    def backward(ctx, v_tri: Tensor) -> Tensor:
        if not v_tri.is_sparse:
            out = v_tri.new_zeros(ctx.shape)
            out[..., _TRIU[0], _TRIU[1]] = v_tri
            return out
        v_tri = v_tri.coalesce()
        values = v_tri.values()  # [nnz, 6]
        full = values.new_zeros((values.shape[0], 3, 3))
        full[:, _TRIU[0], _TRIU[1]] = values
        return torch.sparse_coo_tensor(v_tri.indices(), full, size=ctx.shape,
                                       is_coalesced=True)


def upper_triangle(covars: Tensor) -> Tensor:  # [..., 3, 3] -> [..., 6]
    """The upper triangle gsplat's projection takes, differentiable with sparse gradients."""
    return _UpperTriangle.apply(covars)
