"""CPU kernels: Gaussian–tile intersections (``isect_tiles``, and ``isect_tiles_tight``: the
same lists less the tiles a Gaussian's alpha-threshold ellipse does not reach,
``shared.tiles``) and tile offsets (``isect_offset_encode``), giving exactly the reference's
order.

The reference lists intersections by Gaussian then tile row-major and sorts them stably by
``image << (32 + tile_bits) | tile << 32 | depth bits``: each tile lists its Gaussians by
(depth bits, index). Here the Gaussians with a radius (the culled ones have no tiles; at 1 M
Gaussians in a real view about half) are put in that order once (a stable radix sort of
their depth bits on the threads, ``radix``), and a stable counting sort by (image, tile) in
that order — a count pass, a prefix sum and a fill pass, over fixed chunks of the order on a
pool of threads — writes every tile's segment already sorted. (Sorting each tile's segment
instead cost ~28 ns per intersection with Numba's sort: 36 of the 72 ms of CPU of the
garden's 1.3 M.)

A gather pass first stores what the others need of each Gaussian (its box of tiles, its key
but the tile, the tight lists' bound) at its position in that order, so that they read
memory in order: the random reads in depth order had cost more than the passes' work. The
tight lists then decide each (Gaussian, tile of its box) once, in order (``reach_kernel``:
a span per tile row, ``shared.tiles``), list the tiles reached and count them for the sort;
the fill reads those lists, not the boxes again.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import njit

from ..shared.typed import like
from ._common import alloc, parallel_for, prefetch, sm, view
from .radix import depth_order

# ---------------------------------------------------------------------------------------------
# kernels


@njit(cache=True, error_model="numpy")
def _tile_range(mx, my, r0, r1, tile_size, tile_width, tile_height):
    """[x0, x1) x [y0, y1) tile bounds of a Gaussian at (mx, my) with radii (r0, r1), as the
    reference computes them, in the dtype of mx. Scalars only: a compiled call that takes an
    array argument updates its reference count (an atomic) on every call."""
    rx = like(mx, r0)
    ry = like(mx, r1)
    ts = like(mx, tile_size)
    tmx = mx / ts
    tmy = my / ts
    trx = rx / ts
    try_ = ry / ts
    x0 = min(max(np.int64(math.floor(tmx - trx)), 0), tile_width)
    x1 = min(max(np.int64(math.ceil(tmx + trx)), 0), tile_width)
    y0 = min(max(np.int64(math.floor(tmy - try_)), 0), tile_height)
    y1 = min(max(np.int64(math.ceil(tmy + try_)), 0), tile_height)
    return x0, x1, y0, y1


@njit(cache=True, error_model="numpy")
def visible_rows(radii):
    """The Gaussians g of radii [G, 2] with both radii > 0, increasing: the only ones with
    tiles (the others' boxes are empty), so the passes below skip the culled ones."""
    n = radii.shape[0]
    m = 0
    for g in range(n):
        if radii[g, 0] > 0 and radii[g, 1] > 0:
            m += 1
    rows = np.empty(m, np.int64)
    m = 0
    for g in range(n):
        if radii[g, 0] > 0 and radii[g, 1] > 0:
            rows[m] = g
            m += 1
    return rows


GATHER_AHEAD = 16  # Gaussians of depth order fetched ahead by gather_kernel


@njit(nogil=True, cache=True, error_model="numpy")
def gather_kernel(first, step, order, means2d, radii, image_of, per_image, depth_bits, conics,
                  opacities, tight, tile_size, tile_width, tile_height, tile_bits, chunk, box,
                  box_n, high, ell):
    """Chunks first, first + step, ... of ``chunk`` positions i of ``order`` (Gaussian
    g = order[i]): what the later passes need of g, stored at i so that they read memory in
    order. Gaussian g's image: image_of[g] (packed), else g // per_image (0 where
    per_image covers every Gaussian). box [G, 4] int32: its tiles [x0, x1) x [y0, y1) (none
    unless both radii > 0); box_n [G] int64: how many; high [G] int64: its key but the tile,
    image << (32 + tile_bits) | depth bits; with ``tight``, ell [G, 8] float64: its
    alpha-threshold ellipse (``shared.tiles.alpha_ellipse``: a', b, c', level, x_half,
    y_half) and mean (mx, my), where its box is not empty."""
    n = order.shape[0]
    n_all = means2d.shape[0]
    f_means = means2d.reshape(means2d.size)
    f_radii = radii.reshape(radii.size)
    f_conics = conics.reshape(conics.size)
    for ch in range(first, (n + chunk - 1) // chunk, step):
        end = min(n, (ch + 1) * chunk)
        for i in range(ch * chunk, end):
            if i + GATHER_AHEAD < end:  # depth order is random in memory: fetch ahead
                h = order[i + GATHER_AHEAD]
                prefetch(f_means, 2 * h)
                prefetch(f_radii, 2 * h)
                if image_of.shape[0] > 0:
                    prefetch(image_of, h)
                prefetch(depth_bits, h)
                if tight:
                    prefetch(f_conics, 3 * h)
                    prefetch(opacities, h)
            g = order[i]
            if image_of.shape[0] > 0:
                img = np.int64(image_of[g])
            else:
                img = g // per_image if per_image < n_all else np.int64(0)
            high[i] = (img << (32 + tile_bits)) | (
                np.int64(depth_bits[g]) & np.int64(0xFFFFFFFF))
            x0 = x1 = y0 = y1 = 0
            if radii[g, 0] > 0 and radii[g, 1] > 0:
                x0, x1, y0, y1 = _tile_range(means2d[g, 0], means2d[g, 1], radii[g, 0],
                                             radii[g, 1], tile_size, tile_width, tile_height)
            box[i, 0] = x0
            box[i, 1] = x1
            box[i, 2] = y0
            box[i, 3] = y1
            box_n[i] = (x1 - x0) * (y1 - y0)
            if tight and box_n[i] > 0:
                # the bound's arithmetic here, where the loads of the scattered Gaussians
                # wait on memory anyway
                ell[i, 0], ell[i, 1], ell[i, 2], ell[i, 3], ell[i, 4], ell[i, 5] = (
                    sm.alpha_ellipse(np.float64(conics[g, 0]), np.float64(conics[g, 1]),
                                     np.float64(conics[g, 2]), np.float64(opacities[g])))
                ell[i, 6] = means2d[g, 0]
                ell[i, 7] = means2d[g, 1]


@njit(nogil=True, cache=True, error_model="numpy")
def reach_kernel(first, step, box, box_n, ell, width, height, tile_size, chunk, box_first, high,
                 tile_width, tile_height, tile_bits, tiles, kept, per_chunk):
    """Chunks first, first + step, ... of positions: the tiles of box[i] (row-major) that the
    alpha-threshold ellipse of ell[i] (:func:`gather_kernel`) reaches (``shared.tiles``, in
    float64: a span per tile row, two comparisons per tile), listed as tile indices
    ty * tile_width + tx at tiles[box_first[i]:box_first[i] + kept[i]]; kept [G] int64: how
    many. Where per_chunk [n_chunks, I*T] has rows (sorted lists), it counts them as
    :func:`count_kernel` does, so that no pass walks the boxes again."""
    n = box.shape[0]
    n_tiles = tile_width * tile_height
    count = per_chunk.shape[0] > 0
    for ch in range(first, (n + chunk - 1) // chunk, step):
        if count:
            per_chunk[ch, :] = 0
        for i in range(ch * chunk, min(n, (ch + 1) * chunk)):
            kept[i] = 0
            if box_n[i] == 0:
                continue
            a, b, c, level, x_half, y_half = (ell[i, 0], ell[i, 1], ell[i, 2], ell[i, 3],
                                              ell[i, 4], ell[i, 5])
            mx = ell[i, 6]
            my = ell[i, 7]
            j = box_first[i]
            hits = 0
            for ty in range(box[i, 2], box[i, 3]):
                xl, xr = sm.row_span(a, b, c, level, x_half, y_half, my, ty, tile_size, height)
                for tx in range(box[i, 0], box[i, 1]):
                    # written always, kept by advancing: no branch (hits <= the tile's place
                    # in the box, so the slot is the Gaussian's)
                    tiles[j + hits] = ty * tile_width + tx
                    hits += sm.tile_in_span(xl, xr, mx, tx, tile_size, width)
            kept[i] = hits
            if count:
                row = (high[i] >> (32 + tile_bits)) * n_tiles
                for h in range(j, j + hits):
                    per_chunk[ch, row + tiles[h]] += 1


@njit(nogil=True, cache=True, error_model="numpy")
def count_kernel(first, step, box, high, tile_width, tile_height, tile_bits, chunk, per_chunk):
    """Chunks first, first + step, ... of positions: per_chunk [n_chunks, I*T] int64, how many
    of the chunk's intersections fall in each (image, tile): every tile of box[i]."""
    n = box.shape[0]
    n_tiles = tile_width * tile_height
    for ch in range(first, (n + chunk - 1) // chunk, step):
        per_chunk[ch, :] = 0
        for i in range(ch * chunk, min(n, (ch + 1) * chunk)):
            base = (high[i] >> (32 + tile_bits)) * n_tiles
            for ty in range(box[i, 2], box[i, 3]):
                for tx in range(box[i, 0], box[i, 1]):
                    per_chunk[ch, base + ty * tile_width + tx] += 1


@njit(cache=True, error_model="numpy")
def chunk_starts(per_chunk, tile_first):
    """Turns per_chunk [n_chunks, I*T] counts into each chunk's first slot in every (image,
    tile) segment (segments in order, chunks in order within one); tile_first [I*T + 1]
    gets the segment starts."""
    run = np.int64(0)
    for t in range(per_chunk.shape[1]):
        tile_first[t] = run
        for ch in range(per_chunk.shape[0]):
            cnt = per_chunk[ch, t]
            per_chunk[ch, t] = run
            run += cnt
    tile_first[per_chunk.shape[1]] = run


@njit(nogil=True, cache=True, error_model="numpy")
def fill_kernel(first, step, order, box, high, tight, tiles, box_first, kept, tile_width,
                tile_height, tile_bits, chunk, cursor, flatten_ids, isect_ids):
    """Counting sort by (image, tile) of the Gaussians in depth order, chunks first,
    first + step, ... of positions of ``order``: each chunk writes from its own slots
    cursor[ch] (``chunk_starts``), so every segment lists its Gaussians by (depth bits,
    index), the reference's stable sort, whatever the thread count. Lists every tile of
    box[i], or with ``tight`` those :func:`reach_kernel` listed. Writes flatten_ids [n] and
    isect_ids [n] (image << (32 + tile_bits) | tile << 32 | depth bits)."""
    n = box.shape[0]
    n_tiles = tile_width * tile_height
    for ch in range(first, (n + chunk - 1) // chunk, step):
        for i in range(ch * chunk, min(n, (ch + 1) * chunk)):
            g = order[i]
            base = (high[i] >> (32 + tile_bits)) * n_tiles
            if tight:
                for h in range(box_first[i], box_first[i] + kept[i]):
                    tile = np.int64(tiles[h])
                    j = cursor[ch, base + tile]
                    cursor[ch, base + tile] = j + 1
                    flatten_ids[j] = g
                    isect_ids[j] = high[i] | (tile << 32)
                continue
            for ty in range(box[i, 2], box[i, 3]):
                for tx in range(box[i, 0], box[i, 1]):
                    tile = np.int64(ty * tile_width + tx)
                    j = cursor[ch, base + tile]
                    cursor[ch, base + tile] = j + 1
                    flatten_ids[j] = g
                    isect_ids[j] = high[i] | (tile << 32)


@njit(nogil=True, cache=True, error_model="numpy")
def unsorted_kernel(order, box, high, tight, tiles, box_first, kept, tile_width, slot,
                    flatten_ids, isect_ids):
    """Listing order (by Gaussian, then tile row-major) for sort=False, positions i being the
    Gaussians order[i] in increasing order: each from its first slot ``slot`` [M]; every tile
    of box[i], or with ``tight`` those :func:`reach_kernel` listed."""
    for i in range(box.shape[0]):
        j = slot[i]
        if tight:
            for h in range(box_first[i], box_first[i] + kept[i]):
                flatten_ids[j] = order[i]
                isect_ids[j] = high[i] | (np.int64(tiles[h]) << 32)
                j += 1
            continue
        for ty in range(box[i, 2], box[i, 3]):
            for tx in range(box[i, 0], box[i, 1]):
                flatten_ids[j] = order[i]
                isect_ids[j] = high[i] | (np.int64(ty * tile_width + tx) << 32)
                j += 1


@njit(cache=True, error_model="numpy")
def offset_kernel(isect_ids, tile_bits, n_tiles, offsets):
    """offsets [I*T]: where each (image, tile)'s keys start in the sorted isect_ids (after the
    keys -1, the unused slots of lists at a capacity, sorted first): a binary search per
    tile for its first key, image << (32 + tile_bits) | tile << 32 (~0.1 ms where a count
    pass over 1.5 M keys took 10)."""
    n_all = offsets.shape[0]
    starts = np.empty(n_all, np.int64)
    for t in range(n_all):
        img = t // n_tiles
        starts[t] = ((np.int64(img) << tile_bits) | np.int64(t - img * n_tiles)) << 32
    found = np.searchsorted(isect_ids, starts)
    for t in range(n_all):
        offsets[t] = found[t]


# ---------------------------------------------------------------------------------------------
# launchers

CHUNK_MIN = 2048  # Gaussians per chunk of the counting sort, at least
CHUNK_CELLS = 1 << 20  # at most this many (chunk, image-tile) counters: chunks grow to fit


def _chunk_size(n_gauss: int, n_segments: int) -> int:
    """Gaussians per chunk: a function of the sizes only (never of the thread count)."""
    most_chunks = max(1, CHUNK_CELLS // max(n_segments, 1))
    return max(CHUNK_MIN, -(-n_gauss // most_chunks))


def _isect(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    conics: torch.Tensor | None,  # [I, N, 3] or [nnz, 3]; None: every tile of the box
    opacities: torch.Tensor | None,  # [I, N] or [nnz]
    width: int,
    height: int,
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    n_images: int,
    image_ids: torch.Tensor | None,  # [nnz] (packed)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both ops' lists: tiles_per_gauss [I, N] or [nnz] int32, isect_ids [n] int64,
    flatten_ids [n] int32."""
    lead = means2d.shape[:-1]
    m = view(means2d.reshape(-1, 2))
    r = view(radii.reshape(-1, 2))
    n_gauss = m.shape[0]
    per_image = max(means2d.shape[-2] if means2d.dim() == 3 else n_gauss, 1)
    if image_ids is not None:
        image_of = view(image_ids.to(torch.int64))
    else:
        image_of = np.empty(0, np.int64)  # g // per_image, in the kernel (no [G] array)
    bits = view(depths.reshape(-1).to(torch.float32).contiguous().view(torch.int32))
    n_tiles = tile_width * tile_height
    t_bits = n_tiles.bit_length()
    # the culled Gaussians (a radius 0) have no tiles: only the others are ordered and
    # listed, which gives the same lists (a tile's order is (depth bits, index) either way)
    rows = visible_rows(r)
    n_vis = rows.shape[0]
    chunk = _chunk_size(n_vis, n_images * n_tiles)
    n_chunks = (n_vis + chunk - 1) // chunk
    order = depth_order(bits, rows) if sort else rows
    tight = conics is not None
    # what the passes below read of each Gaussian, at its position in ``order``
    box = np.empty((n_vis, 4), np.int32)
    box_n = np.empty(n_vis, np.int64)
    high = np.empty(n_vis, np.int64)
    # the two large scratch arrays (~35 and ~20 MB at 1 M) come from the backend's pool: mapped
    # afresh at every call, their pages cost ~15 ms of faults and zeroing a step
    ell = view(alloc((n_vis if tight else 0, 8), torch.float64))
    con = view(conics.reshape(-1, 3)) if tight else np.empty((0, 3), m.dtype)
    opa = view(opacities.reshape(-1)) if tight else np.empty(0, m.dtype)
    parallel_for(gather_kernel, n_chunks, order, m, r, image_of, per_image, bits, con, opa,
                 tight, tile_size, tile_width, tile_height, t_bits, chunk, box, box_n, high, ell)
    tiles = np.empty(0, np.int32)
    box_first = np.empty(0, np.int64)
    kept = box_n
    per_chunk = np.empty((n_chunks if sort else 0, n_images * n_tiles), np.int64)
    if tight:  # each (Gaussian, tile of its box) decided once, the sorted lists counted
        box_first = np.cumsum(box_n) - box_n
        tiles = view(alloc((int(box_n.sum()),), torch.int32))
        kept = np.empty(n_vis, np.int64)
        parallel_for(reach_kernel, n_chunks, box, box_n, ell, width, height, tile_size, chunk,
                     box_first, high, tile_width, tile_height, t_bits, tiles, kept, per_chunk)
    elif sort:
        parallel_for(count_kernel, n_chunks, box, high, tile_width, tile_height, t_bits, chunk,
                     per_chunk)
    n = int(kept.sum())
    flatten_ids = alloc((n,), torch.int32)
    isect_ids = alloc((n,), torch.int64)
    if sort:
        tile_first = np.empty(n_images * n_tiles + 1, np.int64)
        chunk_starts(per_chunk, tile_first)
        parallel_for(fill_kernel, n_chunks, order, box, high, tight, tiles, box_first, kept,
                     tile_width, tile_height, t_bits, chunk, per_chunk, view(flatten_ids),
                     view(isect_ids))
    else:
        unsorted_kernel(order, box, high, tight, tiles, box_first, kept, tile_width,
                        np.cumsum(kept) - kept, view(flatten_ids), view(isect_ids))
    counts = np.zeros(n_gauss, np.int32)
    counts[order] = kept  # by Gaussian; the culled ones 0
    return torch.from_numpy(counts).reshape(lead), isect_ids, flatten_ids


def isect_tiles(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    n_images: int,
    image_ids: torch.Tensor | None,  # [nnz] (packed)
    gaussian_ids: torch.Tensor | None,  # [nnz] (packed; unused: flatten_ids are rows)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """gsplat's lists (every tile of the box): tiles_per_gauss [I, N] or [nnz] int32,
    isect_ids [n] int64, flatten_ids [n]."""
    del gaussian_ids
    return _isect(means2d, radii, depths, None, None, 0, 0, tile_size, tile_width, tile_height,
                  sort, n_images, image_ids)


def isect_tiles_tight(
    means2d: torch.Tensor,  # [I, N, 2] or [nnz, 2]
    radii: torch.Tensor,  # [I, N, 2] or [nnz, 2] int32
    depths: torch.Tensor,  # [I, N] or [nnz]
    conics: torch.Tensor,  # [I, N, 3] or [nnz, 3]
    opacities: torch.Tensor,  # [I, N] or [nnz]
    tile_size: int,
    tile_width: int,
    tile_height: int,
    width: int,
    height: int,
    sort: bool,
    n_images: int,
    image_ids: torch.Tensor | None,  # [nnz] (packed)
    gaussian_ids: torch.Tensor | None,  # [nnz] (packed; unused)
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rasterization()'s lists (the tiles the alpha-threshold ellipse reaches, in the order of
    :func:`isect_tiles`): tiles_per_gauss, isect_ids, flatten_ids as there."""
    del gaussian_ids
    return _isect(means2d, radii, depths, conics, opacities, width, height, tile_size,
                  tile_width, tile_height, sort, n_images, image_ids)


def isect_offset_encode(
    isect_ids: torch.Tensor,  # [n] int64, sorted
    n_images: int,
    tile_width: int,
    tile_height: int,
) -> torch.Tensor:
    """Returns offsets [I, TH, TW] int32: each tile's first intersection."""
    n_tiles = tile_width * tile_height
    offsets = alloc((n_images, tile_height, tile_width), torch.int32)
    offset_kernel(view(isect_ids), n_tiles.bit_length(), n_tiles, view(offsets).reshape(-1))
    return offsets
