"""The packed-colour check of ``rasterize_to_pixels_eval3d`` shared by the backends' 3DGUT
tests (test_ut_reference: torch, test_ut_cpu: cpu, test_ut_cuda: cuda in the simulator): the
same scene through the dense call and through packed rows, in a shuffled order and with a
few rows no tile list reads, gives the same images, last ids and gradients (a packed row's
colour and opacity gradients are its pair's)."""

from __future__ import annotations

import torch

import tilesplat as gsplat
from helpers import assert_close


def packed_rows(flatten_ids: torch.Tensor, n_pairs: int, seed: int = 0):
    """(rows [nnz] dense pair ids in a shuffled order, packed flatten_ids [n]): every pair the
    lists read, plus up to 3 that they do not."""
    g = torch.Generator().manual_seed(seed)
    read = torch.unique(flatten_ids.long())
    unread = torch.ones(n_pairs, dtype=torch.bool)
    unread[read] = False
    extra = unread.nonzero().reshape(-1)[:3]
    rows = torch.cat([read, extra])
    rows = rows[torch.randperm(rows.numel(), generator=g)]
    packed_of_pair = torch.full((n_pairs,), -1, dtype=torch.int64)
    packed_of_pair[rows] = torch.arange(rows.numel())
    return rows, packed_of_pair[flatten_ids.long()].to(torch.int32)


def check_packed_parity(backend: str, inputs: list, view, K, camera: dict, offsets,
                        flatten_ids, backgrounds, width: int, height: int, tile: int,
                        tol: float = 0.0, masks=None, seed: int = 5) -> None:
    """Dense against packed on ``backend``: equal outputs and gradients (within ``tol``
    abs and rel; 0: bitwise)."""
    means, quats, scales, colors, opacities = inputs
    N, D = means.shape[-2], colors.shape[-1]
    rows, packed_flatten = packed_rows(flatten_ids, colors[..., 0].numel())
    gaussian_ids = rows % N

    def run(packed: bool):
        geo = [t.clone().requires_grad_() for t in (means, quats, scales)]
        if packed:
            col = colors.reshape(-1, D)[rows].clone().requires_grad_()
            opa = opacities.reshape(-1)[rows].clone().requires_grad_()
        else:
            col, opa = colors.clone().requires_grad_(), opacities.clone().requires_grad_()
        bg = backgrounds.clone().requires_grad_()
        img, alpha, last = gsplat.rasterize_to_pixels_eval3d(
            *geo, col, opa, view, K, width, height, tile, offsets,
            packed_flatten if packed else flatten_ids, backgrounds=bg, masks=masks,
            gaussian_ids=gaussian_ids if packed else None, return_last_ids=True,
            backend=backend, **camera)
        g = torch.Generator().manual_seed(seed)
        loss = sum((torch.randn(o.shape, generator=g).to(o.dtype) * o).sum()
                   for o in (img, alpha))
        grads = list(torch.autograd.grad(loss, [*geo, col, opa, bg]))
        if not packed:
            grads[3] = grads[3].reshape(-1, D)[rows]
            grads[4] = grads[4].reshape(-1)[rows]
        return [img.detach(), alpha.detach(), *grads], last

    dense, dense_last = run(False)
    packed, packed_last = run(True)
    assert torch.equal(dense_last, packed_last), "last_ids differ"
    names = ("colors", "alphas", "v_means", "v_quats", "v_scales", "v_colors", "v_opacities",
             "v_backgrounds")
    for name, a, e in zip(names, packed, dense, strict=True):
        if tol == 0.0:
            assert torch.equal(a, e), f"{name}: packed differs from dense"
        else:
            assert_close(name, a, e, tol, tol)
    assert float(dense[1].max()) > 0.3, "the scene should cover pixels"
