"""The steps ``rasterization`` (Gaussians) and ``rasterization_2dgs`` (surfels) share, between
their projection and their rasterizer: the colours (plain or from SH), the depth channel of the
render mode, the tile lists, and the expected-depth division.

Shapes follow gsplat: leading batch dims ``...`` (B = their product), C cameras, N Gaussians;
a packed projection gives ``nnz`` visible (camera, Gaussian) pairs with their ids.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ..ops import isect_offset_encode, isect_tiles, isect_tiles_tight, spherical_harmonics
from ..ops.deferred_checks import current_flag
from ..ops.intersect_capacity import IntersectionCounts, counting
from ..ops.sh import spherical_harmonics_split


@dataclass
class PackedIds:
    """The ids of a packed projection's pairs, [nnz] each (None when unpacked)."""

    batch_ids: Tensor | None
    camera_ids: Tensor | None
    gaussian_ids: Tensor | None


def gather_rows(x: Tensor, rows: Tensor) -> Tensor:
    """``x[rows]`` (rows of dim 0) by ``index_select``, for the per-pair copies of per-Gaussian
    tensors.

    Not advanced indexing: the backward of ``x[ids]`` is ``index_put_(accumulate=True)``,
    which on the CPU (float32, 32768 elements or more, more than one torch thread) adds the
    pairs' gradients into their Gaussian's row with atomics from several threads, so a
    Gaussian seen by three cameras sums them in an order that changes from run to run (garden:
    ``v_means``, ``v_opacities`` and the SH gradients differed between processes).
    ``index_select``'s backward (``index_add_``) sums each row in index order: the same bits
    for any torch thread count.
    """
    return x.index_select(0, rows)


def colors_per_pair(
    colors: Tensor,  # [..., (C,) N, D] or [..., (C,) N, K, 3]
    sh_degree: int | None,
    per_view: bool,
    means: Tensor,  # [..., N, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    radii: Tensor,  # [..., C, N, 2] or [nnz, 2]
    ids: PackedIds,
    packed: bool,
    B: int,
    C: int,
    N: int,
    backend: str | None,
    viewmats_rs: Tensor | None = None,  # [..., C, 4, 4]
    sh_rest: Tensor | None = None,  # [..., (C,) N, K1, 3]
) -> Tensor:
    """The colour each (camera, Gaussian) pair composites: [..., C, N, D] ([nnz, D] packed).

    Plain colours are gathered (or broadcast over the cameras); SH coefficients are evaluated
    in the direction from each camera centre (masked to the visible pairs), + 0.5, clamped at
    0, as gsplat. A rolling shutter's camera (``viewmats_rs`` at the end of the exposure) looks
    from the middle of its two centres, as gsplat's. ``sh_rest``: the coefficients after
    ``colors``' along K (``rasterization``'s pair), read by the op without a concatenation
    (gathered after one when packed).
    """
    batch_dims = means.shape[:-2]
    b_ids, c_ids, g_ids = ids.batch_ids, ids.camera_ids, ids.gaussian_ids
    if packed:
        image_rows = b_ids * C + c_ids  # rows of [B * C, ...]
        pair_rows = image_rows * N + g_ids  # rows of [B * C * N, ...]
        gauss_rows = b_ids * N + g_ids  # rows of [B * N, ...]
    if sh_degree is None:
        D = colors.shape[-1]
        if packed:
            return (gather_rows(colors.reshape(B * C * N, D), pair_rows) if per_view
                    else gather_rows(colors.reshape(B * N, D), gauss_rows))
        if not per_view:
            return torch.broadcast_to(colors[..., None, :, :], (*batch_dims, C, N, D))
        return colors
    campos = camera_centres(viewmats)  # [..., C, 3]
    if viewmats_rs is not None:
        campos = 0.5 * (campos + camera_centres(viewmats_rs))
    if packed and sh_rest is not None:
        colors, sh_rest = torch.cat([colors, sh_rest], dim=-2), None
    K = colors.shape[-2]
    if packed:
        dirs = (gather_rows(means.reshape(B * N, 3), gauss_rows)
                - gather_rows(campos.reshape(B * C, 3), image_rows))
        shs = (gather_rows(colors.reshape(B * C * N, K, 3), pair_rows) if per_view
               else gather_rows(colors.reshape(B * N, K, 3), gauss_rows))
    else:
        dirs = means[..., None, :, :] - campos[..., None, :]  # [..., C, N, 3]
        # [..., 1, N, K, 3]: the cameras share the coefficients, which are not copied
        shs = colors if per_view else colors[..., None, :, :, :]
    if sh_rest is not None:  # the visible pairs, + 0.5 and the clamp inside the op's kernels
        rest = sh_rest if per_view else sh_rest[..., None, :, :, :]
        return spherical_harmonics_split(sh_degree, dirs, shs, rest, radii=radii, rgb=True,
                                         backend=backend)
    masks = (radii > 0).all(dim=-1)
    colors = spherical_harmonics(sh_degree, dirs, shs, masks=masks, backend=backend)
    return torch.clamp_min(colors + 0.5, 0.0)


def camera_centres(viewmats: Tensor) -> Tensor:
    """The centres [..., C, 3] of the cameras ``viewmats`` [..., C, 4, 4] (world-to-camera).

    ``torch.linalg.inv`` reads the device to raise on a singular matrix (a sync on a GPU). In
    the trainer's step (a flag of ``ops.deferred_checks`` is open) the inverse is taken without
    that check and a singular matrix is recorded in the flag, read a step later; elsewhere a
    singular viewmat raises at once.
    """
    flag = current_flag()
    if flag is None:
        return torch.linalg.inv(viewmats)[..., :3, 3]
    inverse, info = torch.linalg.inv_ex(viewmats)
    flag.record(("viewmats (singular)",), (info == 0).all().reshape(1))
    return inverse[..., :3, 3]


def add_depth_channel(
    render_mode: str,
    colors: Tensor,  # [..., D]
    depths: Tensor,  # [...]
    backgrounds: Tensor | None,  # [..., C, D]
) -> tuple[Tensor, Tensor | None]:
    """(colours, backgrounds) of ``render_mode``: the camera depth appended as a channel
    (``RGB+D``, ``RGB+ED``) or alone (``D``, ``ED``), its background 0; unchanged for ``RGB``."""
    if render_mode in ("RGB+D", "RGB+ED"):
        colors = torch.cat([colors, depths[..., None]], dim=-1)
        if backgrounds is not None:
            backgrounds = torch.cat([backgrounds, torch.zeros_like(backgrounds[..., :1])], -1)
    elif render_mode in ("D", "ED"):
        colors = depths[..., None]
        if backgrounds is not None:
            backgrounds = torch.zeros_like(backgrounds[..., :1])
    return colors, backgrounds


@dataclass
class TileLists:
    """The tile intersection of one render: grid size, the intersections sorted by (image,
    tile, depth) and each tile's first one.

    Attributes:
        tiles_per_gauss: [..., C, N] or [nnz]; isect_ids, flatten_ids: [n_isects];
        isect_offsets: [..., C, tile_height, tile_width].
    """

    tile_width: int
    tile_height: int
    tiles_per_gauss: Tensor
    isect_ids: Tensor
    flatten_ids: Tensor
    isect_offsets: Tensor

    def meta(self) -> dict:
        """The entries gsplat's meta dict has for them."""
        return {
            "tile_width": self.tile_width, "tile_height": self.tile_height,
            "tiles_per_gauss": self.tiles_per_gauss, "isect_ids": self.isect_ids,
            "flatten_ids": self.flatten_ids, "isect_offsets": self.isect_offsets,
        }  # fmt: skip


_BOX_TILES: contextvars.ContextVar[bool] = contextvars.ContextVar("tilesplat_box_tiles",
                                                                  default=False)


@contextlib.contextmanager
def box_tile_lists() -> Iterator[None]:
    """Inside, ``rasterization()`` lists each Gaussian in every tile of its box (gsplat's
    ``isect_tiles``) rather than in the tiles its alpha-threshold ellipse reaches. The images
    and gradients are the same (only the lists and ``last_ids`` differ): for comparisons and
    measurements."""
    token = _BOX_TILES.set(True)
    try:
        yield
    finally:
        _BOX_TILES.reset(token)


def tile_lists(
    means2d: Tensor,  # [..., C, N, 2] or [nnz, 2]
    radii: Tensor,  # [..., C, N, 2] or [nnz, 2]
    depths: Tensor,  # [..., C, N] or [nnz]
    width: int,
    height: int,
    tile_size: int,
    batch_dims: tuple[int, ...],
    B: int,
    C: int,
    packed: bool,
    image_ids: Tensor | None,  # [nnz] batch * C + camera, packed
    gaussian_ids: Tensor | None,  # [nnz], packed
    backend: str | None,
    conics: Tensor | None = None,  # [..., C, N, 3] or [nnz, 3]
    opacities: Tensor | None = None,  # [..., C, N] or [nnz]
) -> TileLists:
    """``isect_tiles`` and ``isect_offset_encode`` over the B * C images of the render.

    Given the rasterizer's ``conics`` and ``opacities`` (3DGS), the lists hold only the tiles
    each Gaussian's alpha-threshold ellipse reaches (``isect_tiles_tight``; every tile of the
    box inside :func:`box_tile_lists`); without them (2DGS), every tile of the box.
    Inside ``ops.intersect_capacity.counting_intersections`` it raises ``IntersectionCounts``
    with the [B * C] counts instead (the render stops there)."""
    tile_width = math.ceil(width / tile_size)
    tile_height = math.ceil(height / tile_size)
    if conics is not None and opacities is not None and not _BOX_TILES.get():
        tiles_per_gauss, isect_ids, flatten_ids = isect_tiles_tight(
            means2d, radii, depths, conics, opacities, tile_size, tile_width, tile_height,
            width, height, packed=packed, n_images=B * C, image_ids=image_ids,
            gaussian_ids=gaussian_ids, backend=backend,
        )
    else:
        tiles_per_gauss, isect_ids, flatten_ids = isect_tiles(
            means2d, radii, depths, tile_size, tile_width, tile_height, packed=packed,
            n_images=B * C, image_ids=image_ids, gaussian_ids=gaussian_ids, backend=backend,
        )
    if counting():  # the caller wants the counts of the images only (train/step/capacity.py)
        per_image = torch.zeros(B * C, dtype=torch.int64, device=tiles_per_gauss.device)
        if packed:
            per_image.index_add_(0, image_ids.long(), tiles_per_gauss.long())
        else:
            per_image = tiles_per_gauss.reshape(B * C, -1).sum(-1, dtype=torch.int64)
        raise IntersectionCounts(per_image)
    isect_offsets = isect_offset_encode(isect_ids, B * C, tile_width, tile_height,
                                        backend=backend)
    isect_offsets = isect_offsets.reshape(*batch_dims, C, tile_height, tile_width)
    return TileLists(tile_width, tile_height, tiles_per_gauss, isect_ids, flatten_ids,
                     isect_offsets)


def expected_depth(
    render_mode: str,
    render_colors: Tensor,  # [..., H, W, X]
    render_alphas: Tensor,  # [..., H, W, 1]
) -> Tensor:
    """``ED`` / ``RGB+ED``: the last channel (accumulated depth) divided by alpha; other modes
    unchanged."""
    if render_mode in ("ED", "RGB+ED"):
        return torch.cat(
            [render_colors[..., :-1], render_colors[..., -1:] / render_alphas.clamp(min=1e-10)],
            dim=-1,
        )
    return render_colors
