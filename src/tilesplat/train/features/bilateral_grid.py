"""Per-image colour transforms of a render: bilateral grids of affine colour maps, and one
affine map per image (the maths of ``post_processing``; the training feature that learns them
is ``appearance.py``).

A bilateral grid (Chen et al. 2007; as a per-view ISP model in Wang et al. 2024, "Bilateral
Guided Radiance Field Processing", the design gsplat's ``post_processing = "bilateral_grid"``
follows) holds a 3 x 4 affine colour transform at each cell of a coarse 3D grid over the image:
X cells across, Y cells down and W cells of luminance. A pixel at (x, y) whose rendered colour
has the luminance l reads its transform by trilinear interpolation at (x, y, l) and applies it
to its colour. Neighbouring pixels of similar brightness get similar transforms, so the grid can
model exposure, white balance, vignetting and tone curves, but not texture.

Grid coordinates: a pixel's centre ((i + 0.5) / W_img, (j + 0.5) / H_img) in [0, 1] maps
linearly onto the first to last cell centres (``align_corners=True``), the luminance (BT.601
weights 0.299, 0.587, 0.114 of the rendered colour) likewise from [0, 1]; beyond them the border
cell's value holds. The slice is ``torch.nn.functional.grid_sample`` in its trilinear mode, so
this runs after the render on any device and any rasterization backend, differentiable both in
the grid and in the colours (through the transform and the luminance).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# BT.601 luma weights of (R, G, B): the grid's third axis (as in gsplat's bilateral grid)
LUMA = (0.299, 0.587, 0.114)


def identity_grids(n: int, shape: tuple[int, int, int], device: torch.device | str = "cpu"
                   ) -> Tensor:
    """``n`` bilateral grids holding the identity transform in every cell.

    shape: (X, Y, W) cells across, down and in luminance. Returns [n, 12, W, Y, X] float32:
    channel 4 r + c is row r, column c of the 3 x 4 transform [A | b].
    """
    x, y, w = shape
    eye = torch.eye(3, 4, device=device).reshape(12)
    return eye.view(1, 12, 1, 1, 1).expand(n, 12, w, y, x).contiguous()


def pixel_coords(height: int, width: int, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32) -> Tensor:
    """[H, W, 2] pixel centres (x, y) normalised to [0, 1]."""
    ys = (torch.arange(height, device=device, dtype=dtype) + 0.5) / height
    xs = (torch.arange(width, device=device, dtype=dtype) + 0.5) / width
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([gx, gy], dim=-1)


def luminance(colors: Tensor) -> Tensor:
    """[..., 3] colours -> [...] BT.601 luma."""
    w = torch.tensor(LUMA, dtype=colors.dtype, device=colors.device)
    return colors @ w


def slice_grids(grids: Tensor, colors: Tensor) -> Tensor:
    """The 3 x 4 transform of every pixel, read from its image's grid.

    grids: [C, 12, W, Y, X] (one grid per image of the batch); colors: [C, H, Wi, 3] the
    rendered colours (their luminance is the third coordinate). Returns [C, H, Wi, 3, 4].
    """
    c, h, w = colors.shape[:3]
    xy = pixel_coords(h, w, colors.device, colors.dtype).expand(c, h, w, 2)
    z = luminance(colors)[..., None]
    # grid_sample's coordinates are in [-1, 1], ordered (x: X, y: Y, z: W)
    coords = torch.cat([xy, z], dim=-1) * 2.0 - 1.0  # [C, H, Wi, 3]
    mats = F.grid_sample(grids.to(colors.dtype), coords[:, None], mode="bilinear",
                         padding_mode="border", align_corners=True)  # [C, 12, 1, H, Wi]
    return mats[:, :, 0].permute(0, 2, 3, 1).reshape(c, h, w, 3, 4)


def apply_affine(mats: Tensor, colors: Tensor) -> Tensor:
    """mats [..., 3, 4] = [A | b] applied to colors [..., 3]: A @ rgb + b."""
    return (mats[..., :3] @ colors[..., None])[..., 0] + mats[..., 3]


def apply_grids(grids: Tensor, colors: Tensor) -> Tensor:
    """Colours [C, H, W, 3] through their images' bilateral grids [C, 12, W, Y, X]."""
    return apply_affine(slice_grids(grids, colors), colors)


def total_variation(grids: Tensor) -> Tensor:
    """The grids' total variation: for each of the three grid axes, the mean over the cells
    of the squared difference of neighbouring cells (every channel), summed over the axes and
    averaged over the grids (gsplat's regulariser; an axis of one cell adds 0).

    grids: [N, 12, W, Y, X]. Returns [].
    """
    tv = grids.new_zeros(())
    for axis in (2, 3, 4):
        if grids.shape[axis] > 1:
            d = grids.diff(dim=axis)
            tv = tv + d.pow(2).sum() / (d.numel() / grids.shape[0])
    return tv / grids.shape[0]


def identity_affines(n: int, device: torch.device | str = "cpu") -> Tensor:
    """[n, 3, 4] identity colour transforms [I | 0]."""
    return torch.eye(3, 4, device=device).expand(n, 3, 4).contiguous()
