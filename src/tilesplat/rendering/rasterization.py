"""``rasterization()``: the one high-level call for 3D Gaussians, gsplat 1.5.3 compatible.

Projection → (SH colours) → tile intersection → rasterization, returning images, alphas and
the intermediate results in ``meta``; the steps it shares with ``rasterization_2dgs`` are in
``_pipeline.py``, the model-parallel exchange (``distributed=True``) in ``sharding.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..backends import call_options
from ..backends.registry import current_backward_scheme, resolve_name
from ..constants import RASTERIZE_MODES, RENDER_MODES, TILE_SIZE
from ..ops import fully_fused_projection, rasterize_to_pixels
from ..ops.camera import RollingShutterType
from ..ops.sparse_grad import upper_triangle
from ..ops.validation import (
    Shapes,
    check_bool,
    check_choice,
    check_deterministic,
    check_finite,
    check_int_at_least,
    check_positive_int,
    check_tensor,
    internal_call,
)
from . import sharding, ut
from ._pipeline import (
    PackedIds,
    TileLists,
    add_depth_channel,
    colors_per_pair,
    expected_depth,
    gather_rows,
    tile_lists,
)


def rasterization(
    means: Tensor,  # [..., N, 3]
    quats: Tensor | None,  # [..., N, 4]
    scales: Tensor | None,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor | tuple[Tensor, Tensor],  # [..., (C,) N, D] or [..., (C,) N, K, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    packed: bool = True,
    tile_size: int = TILE_SIZE,
    backgrounds: Tensor | None = None,  # [..., C, D]
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: str = "classic",
    channel_chunk: int = 32,
    distributed: bool = False,
    camera_model: str = "pinhole",
    segmented: bool = False,
    covars: Tensor | None = None,  # [..., N, 3, 3]
    with_ut: bool = False,
    with_eval3d: bool = False,
    radial_coeffs: Tensor | None = None,
    tangential_coeffs: Tensor | None = None,
    thin_prism_coeffs: Tensor | None = None,
    ftheta_coeffs: object | None = None,
    rolling_shutter: RollingShutterType = RollingShutterType.GLOBAL,
    viewmats_rs: Tensor | None = None,
    *,
    backward_scheme: str | None = None,
    deterministic: bool | None = None,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, dict]:
    """Rasterizes N 3D Gaussians into C images (gsplat 1.5.3 ``rasterization``).

    Args (as gsplat; see its documentation for the details):
        means: centres. [..., N, 3]
        quats: quaternions (w, x, y, z), not necessarily normalised. [..., N, 4]
        scales: scales. [..., N, 3]
        opacities: opacities in [0, 1]. [..., N]
        colors: post-activation colours [..., (C,) N, D], or SH coefficients
            [..., (C,) N, K, 3] when ``sh_degree`` is set (colour = SH + 0.5, clamped at 0).
            With ``sh_degree``, also the pair (``sh0`` [..., (C,) N, K0, 3], ``shN`` [..., (C,)
            N, K1, 3]) of the coefficients split along K, as a trainer stores them: the same
            render as their concatenation, without that copy and the split of its gradient
            (tilesplat extension).
        viewmats: world-to-camera matrices. [..., C, 4, 4]
        Ks: intrinsics. [..., C, 3, 3]
        width, height: image size in pixels.
        packed: compact the visible (camera, Gaussian) pairs (same images as unpacked).
        sparse_grad: with ``packed=True`` and no batch dims, the gradients of means, quats
            and scales (or covars) from the projection are sparse COO tensors over the visible
            Gaussians, for ``torch.optim.SparseAdam`` (a dense gradient from another path,
            the SH colours' view directions, makes the sum dense, as in gsplat).
        backgrounds: background colours. [..., C, D]
        render_mode: ``RGB``, ``D``, ``ED``, ``RGB+D`` or ``RGB+ED``.
        absgrad: put sum over pixels of |d loss / d means2d| on ``meta["means2d"].absgrad``.
        rasterize_mode: ``classic`` or ``antialiased`` (opacity × compensation).
        channel_chunk: rasterize at most this many channels at a time.
        camera_model: ``pinhole``, ``ortho`` or ``fisheye``; ``ftheta`` with ``with_ut``.
        covars: covariances [..., N, 3, 3] instead of quats and scales.
        with_ut, with_eval3d, radial_coeffs, ..., viewmats_rs: 3DGUT (``rendering/ut.py``): the
            unscented-transform projection through the exact camera, the rasterizer that
            evaluates Gaussians in 3D along the pixels' rays (gsplat asserts
            ``packed=False`` with them; tilesplat renders both, the same images).
        backward_scheme: ``per_pixel`` or ``per_splat`` (tilesplat extension).
        deterministic: this call's backward without float atomics, bitwise reproducible
            (tilesplat extension; ``None``, the default, leaves it to the process-wide
            ``tilesplat.backends.cuda.set_options(deterministic=)``; only the cuda backend
            has atomics to avoid, the cpu one is always bit-exact; ``True`` with the torch
            reference on a GPU is a ``ValueError``).
        backend: ``auto``, ``torch``, ``cpu`` or ``cuda`` (tilesplat extension).
        segmented: accepted for compatibility (no effect).

    Returns:
        render_colors [..., C, H, W, X] (X = D, 1, or D+1 by render_mode), render_alphas
        [..., C, H, W, 1], and meta (radii, means2d, depths, conics, opacities, tile grid,
        isect_ids, flatten_ids, isect_offsets, last_ids, ...).
    """
    tile_size, channel_chunk, width, height = _checked_options(
        render_mode, rasterize_mode, tile_size, channel_chunk, width, height, packed, absgrad,
        distributed)  # fmt: skip
    scheme = current_backward_scheme(backward_scheme)
    colors, sh_rest = _sh_parts(colors, sh_degree)
    g = _checked_inputs(means, quats, scales, opacities, colors, viewmats, Ks, covars,
                        backgrounds, sh_degree, sh_rest)
    deterministic = check_deterministic(
        deterministic, means.device,
        resolve_name("rasterize_to_pixels", means.device, backend) if deterministic else "")
    ut_render = ut.check_arguments(
        g.shapes, Ks, width, height, camera_model, with_ut, with_eval3d, radial_coeffs,
        tangential_coeffs, thin_prism_coeffs, ftheta_coeffs, rolling_shutter, viewmats_rs,
        covars, sparse_grad, absgrad)
    B, N, C = g.B, g.N, g.C
    quats, scales = g.quats, g.scales
    with internal_call(), call_options.scope(deterministic):
        if distributed:  # this rank's Gaussians into every rank's cameras
            mp = _ModelParallel.start(g, absgrad, means, viewmats, Ks,
                                      sharding.render_form(ut_render, packed, colors, g.sh_degree))
            own_cameras = viewmats, Ks, ut_render
            viewmats, Ks, C = mp.viewmats, mp.Ks, mp.n_all_cameras
            if ut_render is not None:
                ut_render = ut.gather_cameras(ut_render, mp.world_size)
        if ut_render is not None:
            viewmats_rs = ut_render.camera["viewmats_rs"]
        proj = _project(g, ut_render, means, opacities, viewmats, Ks, width, height, eps2d,
                        near_plane, far_plane, radius_clip, rasterize_mode == "antialiased",
                        camera_model, packed, sparse_grad, backend)
        pairs = _Pairs.of(proj, packed, opacities, g.batch_dims, B, C, N)
        meta = pairs.meta()
        colors = colors_per_pair(colors, g.sh_degree, g.per_view, means, viewmats, pairs.radii,
                                 PackedIds(pairs.batch_ids, pairs.camera_ids, pairs.gaussian_ids),
                                 packed, B, C, N, backend, viewmats_rs=viewmats_rs,
                                 sh_rest=sh_rest)
        if distributed:  # rasterize this rank's own cameras
            colors = mp.exchange(pairs, colors, packed)
            C = mp.n_cameras[mp.rank]
            viewmats, Ks, ut_render = own_cameras
            if ut_render is not None and ut_render.with_eval3d:
                means, quats, scales = ut.gather_gaussians(mp.world_size, means, quats, scales)
            meta["n_cameras_per_rank"], meta["n_gaussians_per_rank"] = mp.n_cameras, mp.n_gaussians

        colors, backgrounds = add_depth_channel(render_mode, colors, pairs.depths, backgrounds)
        # what the rasterizer composites ([..., C, N, D] or [nnz, D]); its gradient is the
        # rasterizer's colour gradient (the bench's replay of a run compares it across backends)
        meta["colors"] = colors

        tiles = _tiles(pairs, ut_render, g, width, height, tile_size, B, C, packed, backend)
        meta.update(tiles.meta())
        meta.update({
            "width": width, "height": height, "tile_size": tile_size, "n_batches": B,
            "n_cameras": C, "backward_scheme": scheme,
        })
        eval3d = None if ut_render is None or not ut_render.with_eval3d else functools.partial(
            ut.rasterize, ut_render, means, quats, scales, opacities=pairs.opacities,
            viewmats=viewmats, Ks=Ks, width=width, height=height, tile_size=tile_size,
            isect_offsets=tiles.isect_offsets, flatten_ids=tiles.flatten_ids, backend=backend,
            gaussian_ids=pairs.gaussian_ids if packed else None)
        render_colors, render_alphas, meta["last_ids"] = _rasterize_in_chunks(
            pairs, colors, backgrounds, tiles, width, height, tile_size, channel_chunk, packed,
            absgrad, scheme, backend, eval3d,
        )
        return expected_depth(render_mode, render_colors, render_alphas), render_alphas, meta


def _checked_options(render_mode: str, rasterize_mode: str, tile_size: int, channel_chunk: int,
                     width: int, height: int, packed: bool, absgrad: bool,
                     distributed: bool) -> tuple[int, int, int, int]:
    """The options checked (``ValueError`` naming the argument): (tile_size, channel_chunk,
    width, height) as ints."""
    check_choice("render_mode", render_mode, RENDER_MODES)
    check_choice("rasterize_mode", rasterize_mode, RASTERIZE_MODES)
    tile_size = check_positive_int("tile_size", tile_size)
    channel_chunk = check_positive_int("channel_chunk", channel_chunk)
    width = check_positive_int("width", width)
    height = check_positive_int("height", height)
    check_bool("packed", packed)
    check_bool("absgrad", absgrad)
    check_bool("distributed", distributed)
    return tile_size, channel_chunk, width, height


@dataclass
class _Inputs:
    """What ``rasterization`` was given, its shapes checked: the batch dims ``...`` (B their
    product), C cameras, N Gaussians; the covariances' upper triangles [..., N, 6] (None when
    quats and scales are given, which are then None); whether colours are per camera; the
    bound shapes (3DGUT's checks read them)."""

    batch_dims: tuple[int, ...]
    B: int
    N: int
    C: int
    covars: Tensor | None
    quats: Tensor | None
    scales: Tensor | None
    sh_degree: int | None
    per_view: bool
    shapes: Shapes


def _tiles(pairs: _Pairs, ut_render: ut.UTRender | None, g: _Inputs, width: int, height: int,
           tile_size: int, B: int, C: int, packed: bool, backend: str | None) -> TileLists:
    """The render's tile lists: the tiles each pair's alpha-threshold ellipse reaches, or,
    for 3DGUT's eval3d (whose response is not the 2D conic's), every tile of its box."""
    tight = ut_render is None or not ut_render.with_eval3d
    return tile_lists(pairs.means2d, pairs.radii, pairs.depths, width, height, tile_size,
                      g.batch_dims, B, C, packed, pairs.image_ids, pairs.gaussian_ids, backend,
                      conics=pairs.conics if tight else None,
                      opacities=pairs.opacities if tight else None)


def _project(g: _Inputs, ut_render: ut.UTRender | None, means: Tensor, opacities: Tensor,
             viewmats: Tensor, Ks: Tensor, width: int, height: int, eps2d: float,
             near_plane: float, far_plane: float, radius_clip: float, antialiased: bool,
             camera_model: str, packed: bool, sparse_grad: bool, backend: str | None) -> tuple:
    """The projection of the render: 3DGUT's unscented transform with ``with_ut``, else
    ``fully_fused_projection`` (its outputs either way)."""
    if ut_render is not None and ut_render.with_ut:
        return ut.project(ut_render, means, g.quats, g.scales, opacities, viewmats, Ks, width,
                          height, eps2d, near_plane, far_plane, radius_clip, antialiased,
                          packed, backend)
    return fully_fused_projection(
        means, g.covars, g.quats, g.scales, viewmats, Ks, width, height, eps2d=eps2d,
        near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip, packed=packed,
        sparse_grad=sparse_grad, calc_compensations=antialiased, camera_model=camera_model,
        opacities=opacities, backend=backend,
    )


def _sh_parts(colors: Tensor | tuple[Tensor, Tensor],
              sh_degree: int | None) -> tuple[Tensor, Tensor | None]:
    """(colors, None), or the two parts (coefficients, the rest along K) of a pair."""
    if isinstance(colors, Tensor):
        return colors, None
    if sh_degree is None or not isinstance(colors, (tuple, list)) or len(colors) != 2:
        raise ValueError("expected colors a tensor, or with sh_degree a pair of tensors (sh0, "
                         f"shN), got {type(colors).__name__}"
                         + ("" if sh_degree is not None else " without sh_degree"))
    check_tensor("colors[1]", colors[1])
    return colors[0], colors[1]


def _checked_inputs(
    means: Tensor,  # [..., N, 3]
    quats: Tensor | None,  # [..., N, 4]
    scales: Tensor | None,  # [..., N, 3]
    opacities: Tensor,  # [..., N]
    colors: Tensor,  # [..., (C,) N, D] or [..., (C,) N, K, 3]
    viewmats: Tensor,  # [..., C, 4, 4]
    Ks: Tensor,  # [..., C, 3, 3]
    covars: Tensor | None,  # [..., N, 3, 3]
    backgrounds: Tensor | None,  # [..., C, D]
    sh_degree: int | None,
    sh_rest: Tensor | None = None,  # [..., (C,) N, K1, 3]
) -> _Inputs:
    """The tensors' types, shapes and finiteness, checked once (``ValueError`` naming the
    argument); the ops below take only what the kernels made of them."""
    check_tensor("means", means)
    check_tensor("opacities", opacities)
    check_tensor("colors", colors)
    check_tensor("viewmats", viewmats)
    s = Shapes()
    s.check("means", means, "..., N, 3")
    batch_dims = s["..."]
    nb = len(batch_dims)
    s.check("opacities", opacities, "..., N")
    s.check("viewmats", viewmats, "..., C, 4, 4")
    tri = None
    if covars is not None:
        check_tensor("covars", covars)
        s.check("covars", covars, "..., N, 3, 3")
        tri = upper_triangle(covars)
        quats = scales = None
    elif quats is None or scales is None:
        raise ValueError("expected quats and scales, or covars; got neither")

    if sh_degree is None:
        per_view = colors.dim() == nb + 3
        pattern = "..., C, N, D" if per_view else "..., N, D"
    else:
        sh_degree = check_int_at_least("sh_degree", sh_degree, 0)
        per_view = colors.dim() == nb + 4
        pattern = "..., C, N, K, 3" if per_view else "..., N, K, 3"
    s.check("colors", colors, pattern)
    if sh_rest is not None:
        s.check("colors[1]", sh_rest, pattern.replace("K,", "K1,"))
    if backgrounds is not None:
        check_tensor("backgrounds", backgrounds)
        s.check("backgrounds", backgrounds, "..., C, D" if sh_degree is None else "..., C, 3")

    given = {"means": means, "quats": quats, "scales": scales, "covars": tri,
             "opacities": opacities, "colors": colors, "viewmats": viewmats, "Ks": Ks,
             "backgrounds": backgrounds, "colors[1]": sh_rest}
    check_finite({k: v for k, v in given.items() if isinstance(v, Tensor)})
    return _Inputs(batch_dims, math.prod(batch_dims), s["N"], s["C"], tri, quats, scales,
                   sh_degree, per_view, s)


@dataclass
class _Pairs:
    """The projected (camera, Gaussian) pairs: [..., C, N, *] unpacked, [nnz, *] packed with
    their ids (None unpacked; ``image_ids`` = batch * C + camera), and each pair's opacity
    (times the compensation when antialiased)."""

    radii: Tensor
    means2d: Tensor
    depths: Tensor
    conics: Tensor
    opacities: Tensor
    batch_ids: Tensor | None = None
    camera_ids: Tensor | None = None
    gaussian_ids: Tensor | None = None
    image_ids: Tensor | None = None

    @classmethod
    def of(cls, proj: tuple, packed: bool, opacities: Tensor, batch_dims: tuple[int, ...],
           B: int, C: int, N: int) -> _Pairs:
        """The pairs of ``fully_fused_projection``'s outputs ``proj``; ``opacities``
        [..., N] are the Gaussians'."""
        if packed:
            batch_ids, camera_ids, gaussian_ids, radii, means2d, depths, conics, comps = proj
            opac = gather_rows(opacities.reshape(B * N), batch_ids * N + gaussian_ids)
            ids = {"batch_ids": batch_ids, "camera_ids": camera_ids,
                   "gaussian_ids": gaussian_ids, "image_ids": batch_ids * C + camera_ids}
        else:
            radii, means2d, depths, conics, comps = proj
            opac = torch.broadcast_to(opacities[..., None, :], (*batch_dims, C, N))
            ids = {}
        if comps is not None:
            opac = opac * comps
        return cls(radii, means2d, depths, conics, opac, **ids)

    def meta(self) -> dict:
        """gsplat's meta entries of the projection."""
        return {
            "batch_ids": self.batch_ids, "camera_ids": self.camera_ids,
            "gaussian_ids": self.gaussian_ids, "radii": self.radii, "means2d": self.means2d,
            "depths": self.depths, "conics": self.conics, "opacities": self.opacities,
        }  # fmt: skip


@dataclass
class _ModelParallel:
    """``distributed=True``: this rank's Gaussians are projected into every rank's cameras
    (``viewmats`` [C_all, 4, 4], ``Ks``), then the pairs of each rank's cameras go to it."""

    rank: int
    world_size: int
    viewmats: Tensor
    Ks: Tensor
    n_cameras: list[int]
    n_gaussians: list[int]

    @property
    def n_all_cameras(self) -> int:
        return int(self.viewmats.shape[0])

    @classmethod
    def start(cls, g: _Inputs, absgrad: bool, means: Tensor, viewmats: Tensor,
              Ks: Tensor, form: int) -> _ModelParallel:
        """Every rank's cameras, after the checks of what model parallelism supports and that
        every rank renders in the same ``form`` (:func:`.sharding.render_form`)."""
        if g.batch_dims:
            raise ValueError(f"rasterization(distributed=True) takes no batch dims, got means "
                             f"{tuple(means.shape)}")
        if absgrad:
            raise ValueError("rasterization(distributed=True) does not support absgrad")
        if g.per_view:
            raise ValueError("rasterization(distributed=True) needs per-Gaussian colors "
                             "[N, D] or [N, K, 3], not per-camera ones")
        rank, world_size = sharding.world()
        check_tensor("Ks", Ks)
        sharding.check_same_form(world_size, rank, form, means.device)
        viewmats, Ks, n_cams, n_gauss = sharding.gather_cameras(world_size, viewmats, Ks, g.N)
        return cls(rank, world_size, viewmats, Ks, n_cams, n_gauss)

    def exchange(self, pairs: _Pairs, colors: Tensor, packed: bool) -> Tensor:
        """Send each rank the pairs of its cameras and receive those of this rank's cameras,
        in ``pairs`` (in place) and the returned colours."""
        tensors = [pairs.radii, pairs.means2d, pairs.depths, pairs.conics, pairs.opacities,
                   colors]
        if packed:
            pairs.camera_ids, pairs.gaussian_ids, tensors = sharding.exchange_packed(
                self.world_size, self.rank, self.n_cameras, self.n_gaussians, pairs.camera_ids,
                pairs.gaussian_ids, tensors)
            pairs.image_ids = pairs.camera_ids
        else:
            tensors = sharding.exchange_unpacked(self.world_size, self.rank, self.n_cameras,
                                                 self.n_gaussians, tensors)
        pairs.radii, pairs.means2d, pairs.depths, pairs.conics, pairs.opacities, colors = tensors
        return colors


def _rasterize_in_chunks(
    pairs: _Pairs,
    colors: Tensor,  # [..., C, N, D] or [nnz, D]
    backgrounds: Tensor | None,  # [..., C, D]
    tiles: TileLists,
    width: int,
    height: int,
    tile_size: int,
    channel_chunk: int,
    packed: bool,
    absgrad: bool,
    scheme: str,
    backend: str | None,
    eval3d: Callable[..., tuple[Tensor, Tensor, Tensor]] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(render_colors [..., C, H, W, D], render_alphas [..., C, H, W, 1], last_ids) of
    ``rasterize_to_pixels`` (or ``eval3d(colors=, backgrounds=)``, 3DGUT's rasterizer) over at
    most ``channel_chunk`` channels at a time."""
    n_channels = colors.shape[-1]
    chunks_c, chunks_a = [], []
    last_ids = None
    for start in range(0, n_channels, channel_chunk):
        stop = min(start + channel_chunk, n_channels)
        chunk_bg = None if backgrounds is None else backgrounds[..., start:stop]
        if eval3d is not None:
            out_c, out_a, ids = eval3d(colors=colors[..., start:stop], backgrounds=chunk_bg)
        else:
            out_c, out_a, ids = rasterize_to_pixels(
                pairs.means2d, pairs.conics, colors[..., start:stop], pairs.opacities, width,
                height, tile_size, tiles.isect_offsets, tiles.flatten_ids,
                backgrounds=chunk_bg, packed=packed, absgrad=absgrad, backward_scheme=scheme,
                return_last_ids=True, backend=backend,
            )
        chunks_c.append(out_c)
        chunks_a.append(out_a)
        last_ids = ids if last_ids is None else last_ids
    render_colors = chunks_c[0] if len(chunks_c) == 1 else torch.cat(chunks_c, dim=-1)
    return render_colors, chunks_a[0], last_ids
