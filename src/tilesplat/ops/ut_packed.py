"""Packed colours for ``rasterize_to_pixels_eval3d``: rows [nnz, D] of visible (camera,
Gaussian) pairs, as ``rasterize_to_pixels(packed=True)`` takes them, expanded to the
[I * N, D] rows the eval3d kernels read.

The eval3d kernels evaluate a pair's Gaussian in 3D, so they index the Gaussians' means,
quats and scales by the pair's (image, Gaussian), which a packed row does not carry: the
caller gives each row's Gaussian (``gaussian_ids`` [nnz], as a packed projection returns
it), and its image is read from the tile lists (the intersections between two images'
first offsets are that image's). gsplat 1.5.3 declares the packed shapes and raises
``NotImplementedError``; these are the semantics of its packed ``rasterize_to_pixels``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .validation import values_trusted


def image_of_intersections(
    isect_offsets: Tensor,  # [I, TH, TW] int32
    n_isects: int,
) -> Tensor:
    """The image [n] (int64) of each intersection of the sorted lists ``isect_offsets``."""
    I = isect_offsets.shape[0]
    firsts = isect_offsets.reshape(I, -1)[:, 0].long()  # [I] each image's first intersection
    rows = torch.arange(n_isects, device=isect_offsets.device)
    return torch.searchsorted(firsts, rows, right=True) - 1


def expand_packed(
    colors: Tensor,  # [nnz, D]
    opacities: Tensor,  # [nnz]
    gaussian_ids: Tensor,  # [nnz] into the N Gaussians
    isect_offsets: Tensor,  # [I, TH, TW] int32
    flatten_ids: Tensor,  # [n] int32 into the nnz rows
    n_gaussians: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """(colors [I * N, D], opacities [I * N], flatten_ids [n] into the I * N rows): each
    packed row at its (image, Gaussian), zero where no row is; differentiable in colors and
    opacities (a row no intersection reads gets a zero gradient, as it has no effect).

    Raises ``ValueError`` (unless inside ``internal_call``) when a row is read from two images
    or two rows are the same (image, Gaussian)."""
    I = isect_offsets.shape[0]
    nnz, D = colors.shape
    n = flatten_ids.shape[0]
    rows = flatten_ids.long()
    dense_ids = image_of_intersections(isect_offsets, n) * n_gaussians + gaussian_ids.long()[rows]
    dense_of_row = torch.full((nnz,), -1, dtype=torch.int64, device=colors.device)
    dense_of_row[rows] = dense_ids
    used = torch.nonzero(dense_of_row >= 0).reshape(-1)
    targets = dense_of_row.index_select(0, used)
    if not values_trusted() and n:
        if not bool((dense_of_row[rows] == dense_ids).all()):
            raise ValueError("packed colors: flatten_ids read one row of colors from two "
                             "images (each packed row is one (camera, Gaussian) pair)")
        if int(torch.unique(targets).numel()) != int(targets.numel()):
            raise ValueError("packed colors: two rows of colors are the same (image, "
                             "Gaussian) pair (gaussian_ids repeats a Gaussian in one image)")
    dense_colors = colors.new_zeros((I * n_gaussians, D)).index_put(
        (targets,), colors.index_select(0, used))
    dense_opacities = opacities.new_zeros((I * n_gaussians,)).index_put(
        (targets,), opacities.index_select(0, used))
    return dense_colors, dense_opacities, dense_ids.to(torch.int32)
