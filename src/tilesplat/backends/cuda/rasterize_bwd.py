"""Backward rasterization kernels: the ``per_pixel`` and the ``per_splat`` scheme.

``per_pixel`` (as gsplat): one block per tile, one thread per pixel. Batches of the tile's
splats are loaded into shared memory back to front; each pixel starts at its ``last_id`` and
the transmittance the forward kept, and recovers the transmittance before each splat by
dividing by ``1 - alpha``. Each splat's gradient is summed over the warp with shuffles and
added with one atomic per component. With ``warp_skip`` a warp starts a batch at its largest
``last_id`` and skips a splat that none of its lanes needs.

``per_splat`` (brush PR #401): one block per tile with one thread per splat of a batch of
``splat_batch`` splats. The pixels' state lives in shared memory and is replayed front to
back: at step ``i`` thread ``j`` handles pixel ``i - j``, so every pixel sees the splats in
order and no two threads touch one pixel. Each thread keeps its splat's gradient in
registers and adds it once per batch. A pixel's state is its transmittance and, per
channel, the colour still to come, which starts from the forward's colour sum (kept as
``hi + lo``) and loses each splat's colour through the same :func:`add_product` the forward
added it with: near saturation it is a difference of nearly equal numbers, which one
float32 would hold to ~1e-7 of the pixel's colour only (the CPU backend keeps it in float64).

Colour arrays (``per_pixel``: the batch's splat colours; ``per_splat``: the colour still to
come) live in shared memory while they fit 48 KB, else in global memory
(``raster_limits.colors_in_shared``).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda

from ...constants import ALPHA_CLAMP, ALPHA_SKIP, PIXEL_CENTER, TRANSMITTANCE_STOP
from . import raster_limits
from .rasterize_fwd import device_add_product
from .runtime import jit


def _constants(ft: type):
    return (
        ft(0.0), ft(1.0), ft(0.5), ft(PIXEL_CENTER), ft(ALPHA_CLAMP), ft(ALPHA_SKIP),
        ft(TRANSMITTANCE_STOP),
    )  # fmt: skip


def make_bwd_per_pixel(ft: type, tile_size: int, channels: int, det: bool = False):
    """The Python body of the ``per_pixel`` backward kernel; with ``det`` (the
    ``deterministic`` option) each warp's sum goes to the row ``intersection * n_warps +
    warp`` of the outputs ([n * n_warps, ...]) instead of the Gaussian's row (:mod:`.segment`
    reduces them)."""
    block = tile_size * tile_size
    batch = raster_limits.batch_size(tile_size)
    n_warps = (block + 31) // 32
    fb = np.dtype(ft).itemsize
    shared_rgb = raster_limits.colors_in_shared("per_pixel", fb, tile_size, channels)
    rgb_rows = batch if shared_rgb else 1
    zero, one, half, center, clamp, skip, _ = _constants(ft)

    def rasterize_bwd_per_pixel(
        means2d, conics, colors, opacities,  # [G, 2], [G, 3], [G, D], [G]
        backgrounds, has_bg, masks, has_mask,  # [I, D], [I, TH, TW]
        width, height, offsets, flatten_ids, n_isects,  # [I*TH*TW], [n]
        image0, n_images,  # first image of this launch, all images
        render_alphas, extra, has_t,  # [I, H, W, 1], [I, H, W, E] (T_final at 0)
        last_ids,  # [I, H, W]
        v_render_colors, v_render_alphas,  # [I, H, W, D], [I, H, W, 1]
        warp_skip, absgrad,
        v_means2d, v_conics, v_colors, v_opacities, v_abs,  # outputs, zero-filled
    ):  # fmt: skip
        s_id = cuda.shared.array(batch, np.int32)
        s_xyo = cuda.shared.array((batch, 3), ft)
        s_conic = cuda.shared.array((batch, 3), ft)
        s_rgb = cuda.shared.array((rgb_rows, channels), ft)
        s_warp_bin = cuda.shared.array(n_warps, np.int32)
        buf = cuda.local.array(channels, ft)
        v_out = cuda.local.array(channels, ft)
        v_rgb = cuda.local.array(channels, ft)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = image0 + cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        if has_mask and not masks[image, tile_y, tile_x]:
            return  # uniform per block
        rank = cuda.threadIdx.y * tile_size + cuda.threadIdx.x
        lane = rank % 32
        # the last warp of a block of tile_size**2 threads may be partial (tile_size 12: 144)
        lanes = min(32, block - (rank - lane))
        mask = np.uint32((np.uint64(1) << np.uint64(lanes)) - np.uint64(1))
        px = tile_x * tile_size + cuda.threadIdx.x
        py = tile_y * tile_size + cuda.threadIdx.y
        inside = px < width and py < height
        pxc = min(px, width - 1)
        pyc = min(py, height - 1)
        fx = ft(px) + center
        fy = ft(py) + center

        tile = (image * th + tile_y) * tw + tile_x
        start = offsets[tile]
        end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]

        if has_t:
            t_final = extra[image, pyc, pxc, 0]
        else:
            t_final = one - render_alphas[image, pyc, pxc, 0]
        T = t_final
        bin_final = last_ids[image, pyc, pxc] if inside else -1
        bg_dot = zero
        for k in range(channels):
            buf[k] = zero
            v_out[k] = v_render_colors[image, pyc, pxc, k]
            if has_bg:
                bg_dot += backgrounds[image, k] * v_out[k]
        v_alpha_out = v_render_alphas[image, pyc, pxc, 0]
        # the warp's largest last_id (through shared memory: any warp shape, uniform result)
        if lane == 0:
            s_warp_bin[rank // 32] = -1
        cuda.syncthreads()
        cuda.atomic.max(s_warp_bin, rank // 32, bin_final)
        cuda.syncthreads()
        warp_bin = s_warp_bin[rank // 32]

        n_batches = (end - start + batch - 1) // batch
        for b in range(n_batches):
            cuda.syncthreads()
            batch_end = end - 1 - batch * b
            size = min(batch, batch_end + 1 - start)
            idx = batch_end - rank
            if rank < batch and idx >= start:
                g = flatten_ids[idx]
                s_id[rank] = g
                s_xyo[rank, 0] = means2d[g, 0]
                s_xyo[rank, 1] = means2d[g, 1]
                s_xyo[rank, 2] = opacities[g]
                s_conic[rank, 0] = conics[g, 0]
                s_conic[rank, 1] = conics[g, 1]
                s_conic[rank, 2] = conics[g, 2]
                if shared_rgb:
                    for k in range(channels):
                        s_rgb[rank, k] = colors[g, k]
            cuda.syncthreads()
            t0 = max(0, batch_end - warp_bin) if warp_skip else 0
            for t in range(t0, size):
                valid = inside and batch_end - t <= bin_final
                alpha = zero
                gauss = zero
                opac = zero
                dx = zero
                dy = zero
                if valid:
                    opac = s_xyo[t, 2]
                    dx = s_xyo[t, 0] - fx
                    dy = s_xyo[t, 1] - fy
                    sigma = half * (s_conic[t, 0] * dx * dx + s_conic[t, 2] * dy * dy) + (
                        s_conic[t, 1] * dx * dy
                    )
                    gauss = math.exp(-sigma)
                    alpha = min(clamp, opac * gauss)
                    if sigma < zero or alpha < skip:
                        valid = False
                if warp_skip and not cuda.any_sync(mask, valid):
                    continue
                g = s_id[t]
                v_x = zero
                v_y = zero
                v_ca = zero
                v_cb = zero
                v_cc = zero
                v_op = zero
                for k in range(channels):
                    v_rgb[k] = zero
                if valid:
                    ra = one / (one - alpha)
                    T *= ra
                    fac = alpha * T
                    v_alpha = zero
                    for k in range(channels):
                        c = s_rgb[t, k] if shared_rgb else colors[g, k]
                        v_rgb[k] = fac * v_out[k]
                        v_alpha += (c * T - buf[k] * ra) * v_out[k]
                        buf[k] += c * fac
                    v_alpha += t_final * ra * (v_alpha_out - bg_dot)
                    if opac * gauss <= clamp:
                        v_sigma = -opac * gauss * v_alpha
                        v_ca = half * v_sigma * dx * dx
                        v_cb = v_sigma * dx * dy
                        v_cc = half * v_sigma * dy * dy
                        v_x = v_sigma * (s_conic[t, 0] * dx + s_conic[t, 1] * dy)
                        v_y = v_sigma * (s_conic[t, 1] * dx + s_conic[t, 2] * dy)
                        v_op = gauss * v_alpha
                a_x = abs(v_x)
                a_y = abs(v_y)
                off = 16
                while off > 0:
                    # a lane whose source is past a partial warp's end adds nothing
                    ok = lane + off < lanes
                    for k in range(channels):
                        o = cuda.shfl_down_sync(mask, v_rgb[k], off)
                        v_rgb[k] += o if ok else zero
                    o = cuda.shfl_down_sync(mask, v_x, off)
                    v_x += o if ok else zero
                    o = cuda.shfl_down_sync(mask, v_y, off)
                    v_y += o if ok else zero
                    o = cuda.shfl_down_sync(mask, v_ca, off)
                    v_ca += o if ok else zero
                    o = cuda.shfl_down_sync(mask, v_cb, off)
                    v_cb += o if ok else zero
                    o = cuda.shfl_down_sync(mask, v_cc, off)
                    v_cc += o if ok else zero
                    o = cuda.shfl_down_sync(mask, v_op, off)
                    v_op += o if ok else zero
                    if absgrad:
                        o = cuda.shfl_down_sync(mask, a_x, off)
                        a_x += o if ok else zero
                        o = cuda.shfl_down_sync(mask, a_y, off)
                        a_y += o if ok else zero
                    off //= 2
                if lane == 0:
                    if det:  # this warp's own row: the add is a store into a zero
                        g = (batch_end - t) * n_warps + rank // 32
                    for k in range(channels):
                        cuda.atomic.add(v_colors, (g, k), v_rgb[k])
                    cuda.atomic.add(v_means2d, (g, 0), v_x)
                    cuda.atomic.add(v_means2d, (g, 1), v_y)
                    cuda.atomic.add(v_conics, (g, 0), v_ca)
                    cuda.atomic.add(v_conics, (g, 1), v_cb)
                    cuda.atomic.add(v_conics, (g, 2), v_cc)
                    cuda.atomic.add(v_opacities, g, v_op)
                    if absgrad:
                        cuda.atomic.add(v_abs, (g, 0), a_x)
                        cuda.atomic.add(v_abs, (g, 1), a_y)

    return rasterize_bwd_per_pixel


def make_bwd_per_splat(ft: type, tile_size: int, channels: int, splat_batch: int,
                       det: bool = False):
    """The Python body of the ``per_splat`` backward kernel (``splat_batch`` threads); with
    ``det`` (the ``deterministic`` option) a splat's gradient over the tile goes to the row of
    its intersection in the outputs ([n, ...]) instead of the Gaussian's row."""
    pixels = tile_size * tile_size
    fb = np.dtype(ft).itemsize
    shared_rest = raster_limits.colors_in_shared("per_splat", fb, tile_size, channels)
    rest_rows = pixels if shared_rest else 1
    zero, one, half, center, clamp, skip, stop = _constants(ft)

    def rasterize_bwd_per_splat(
        means2d, conics, colors, opacities,  # [G, 2], [G, 3], [G, D], [G]
        backgrounds, has_bg, masks, has_mask,  # [I, D], [I, TH, TW]
        width, height, offsets, flatten_ids, n_isects,  # [I*TH*TW], [n]
        image0, n_images,  # first image of this launch, all images
        extra,  # [I, H, W, 1 + 2D]: T_final, colour sum hi [D], lo [D] (rasterize_fwd);
        # when the colour still to come does not fit shared memory it lives here (a copy)
        v_render_colors, v_render_alphas,  # [I, H, W, D], [I, H, W, 1]
        absgrad,
        v_means2d, v_conics, v_colors, v_opacities, v_abs,  # outputs, zero-filled
    ):  # fmt: skip
        s_T = cuda.shared.array(pixels, ft)  # transmittance; 0 once the pixel stopped
        s_vw = cuda.shared.array(pixels, ft)  # (v_alpha - bg . v_colour) * T_final
        s_hi = cuda.shared.array((rest_rows, channels), ft)  # colour still to come, high
        s_lo = cuda.shared.array((rest_rows, channels), ft)  # and low part
        rgb = cuda.local.array(channels, ft)
        g_rgb = cuda.local.array(channels, ft)

        tile_x = cuda.blockIdx.x
        tile_y = cuda.blockIdx.y
        image = image0 + cuda.blockIdx.z
        tw = cuda.gridDim.x
        th = cuda.gridDim.y
        if has_mask and not masks[image, tile_y, tile_x]:
            return  # uniform per block
        tid = cuda.threadIdx.x
        x0 = tile_x * tile_size
        y0 = tile_y * tile_size

        for p in range(tid, pixels, splat_batch):
            px = x0 + p % tile_size
            py = y0 + p // tile_size
            if px < width and py < height:
                bg_dot = zero
                for k in range(channels):
                    if has_bg:
                        bg_dot += backgrounds[image, k] * v_render_colors[image, py, px, k]
                    if shared_rest:
                        s_hi[p, k] = extra[image, py, px, 1 + k]
                        s_lo[p, k] = extra[image, py, px, 1 + channels + k]
                t_final = extra[image, py, px, 0]
                s_vw[p] = (v_render_alphas[image, py, px, 0] - bg_dot) * t_final
                s_T[p] = one
            else:
                s_T[p] = zero

        tile = (image * th + tile_y) * tw + tile_x
        start = offsets[tile]
        end = n_isects if tile == n_images * th * tw - 1 else offsets[tile + 1]
        n_batches = (end - start + splat_batch - 1) // splat_batch
        for b in range(n_batches):
            live = np.int32(0)
            for p in range(tid, pixels, splat_batch):
                if s_T[p] > zero:
                    live = np.int32(1)
            if cuda.syncthreads_or(live) == 0:
                break  # every pixel of the tile has stopped
            idx = start + b * splat_batch + tid
            active = idx < end
            g = 0
            mx = zero
            my = zero
            opac = zero
            ca = zero
            cb = zero
            cc = zero
            if active:
                g = flatten_ids[idx]
                mx = means2d[g, 0]
                my = means2d[g, 1]
                opac = opacities[g]
                ca = conics[g, 0]
                cb = conics[g, 1]
                cc = conics[g, 2]
            for k in range(channels):
                rgb[k] = colors[g, k] if active else zero
                g_rgb[k] = zero
            v_x = zero
            v_y = zero
            v_ca = zero
            v_cb = zero
            v_cc = zero
            v_op = zero
            a_x = zero
            a_y = zero
            count = min(splat_batch, end - start - b * splat_batch)
            for i in range(count + pixels - 1):
                p = i - tid
                if active and p >= 0 and p < pixels:
                    T = s_T[p]
                    if T > zero:
                        px = x0 + p % tile_size
                        py = y0 + p // tile_size
                        dx = mx - (ft(px) + center)
                        dy = my - (ft(py) + center)
                        sigma = half * (ca * dx * dx + cc * dy * dy) + cb * dx * dy
                        if sigma >= zero:
                            gauss = math.exp(-sigma)
                            alpha = min(clamp, opac * gauss)
                            if alpha >= skip:
                                t_next = T * (one - alpha)
                                if t_next <= stop:
                                    s_T[p] = zero
                                else:
                                    w = alpha * T
                                    # d loss / d alpha = (sum_k (T (1 - alpha) rgb_k - rest_k)
                                    # v_k + vw) / (1 - alpha), rest: after this splat
                                    v_alpha = s_vw[p]
                                    for k in range(channels):
                                        if shared_rest:
                                            hi = s_hi[p, k]
                                            lo = s_lo[p, k]
                                        else:
                                            hi = extra[image, py, px, 1 + k]
                                            lo = extra[image, py, px, 1 + channels + k]
                                        hi, lo = device_add_product(hi, lo, rgb[k], -w)
                                        if shared_rest:
                                            s_hi[p, k] = hi
                                            s_lo[p, k] = lo
                                        else:
                                            extra[image, py, px, 1 + k] = hi
                                            extra[image, py, px, 1 + channels + k] = lo
                                        v = v_render_colors[image, py, px, k]
                                        g_rgb[k] += w * v
                                        v_alpha += (t_next * rgb[k] - (hi + lo)) * v
                                    v_alpha = v_alpha / (one - alpha)
                                    if opac * gauss <= clamp:
                                        v_sigma = -opac * gauss * v_alpha
                                        v_ca += half * v_sigma * dx * dx
                                        v_cb += v_sigma * dx * dy
                                        v_cc += half * v_sigma * dy * dy
                                        gx = v_sigma * (ca * dx + cb * dy)
                                        gy = v_sigma * (cb * dx + cc * dy)
                                        v_x += gx
                                        v_y += gy
                                        a_x += abs(gx)
                                        a_y += abs(gy)
                                        v_op += gauss * v_alpha
                                    s_T[p] = t_next
                cuda.syncthreads()
            if active:
                if det:  # the intersection's own row: the add is a store into a zero
                    g = idx
                for k in range(channels):
                    cuda.atomic.add(v_colors, (g, k), g_rgb[k])
                cuda.atomic.add(v_means2d, (g, 0), v_x)
                cuda.atomic.add(v_means2d, (g, 1), v_y)
                cuda.atomic.add(v_conics, (g, 0), v_ca)
                cuda.atomic.add(v_conics, (g, 1), v_cb)
                cuda.atomic.add(v_conics, (g, 2), v_cc)
                cuda.atomic.add(v_opacities, g, v_op)
                if absgrad:
                    cuda.atomic.add(v_abs, (g, 0), a_x)
                    cuda.atomic.add(v_abs, (g, 1), a_y)

    return rasterize_bwd_per_splat


@cache
def per_pixel_kernel(ft: type, tile_size: int, channels: int, det: bool = False):
    return jit(make_bwd_per_pixel(ft, tile_size, channels, det), tile_size * tile_size)


@cache
def per_splat_kernel(ft: type, tile_size: int, channels: int, splat_batch: int,
                     det: bool = False):
    return jit(make_bwd_per_splat(ft, tile_size, channels, splat_batch, det), splat_batch)


def warps_per_intersection(scheme: str, tile_size: int) -> int:
    """W, the rows of the deterministic outputs per intersection: the block's warps for
    ``per_pixel``, 1 for ``per_splat``."""
    return (tile_size * tile_size + 31) // 32 if scheme == "per_pixel" else 1
