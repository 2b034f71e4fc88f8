#!/usr/bin/env python
"""How many pixel-Gaussian pairs the CPU rasterizer evaluates per tile-slicing choice (issue 36).

    PYTHONPATH=src python scripts/raster_pair_counts.py /tmp/inputs.pt

The inputs are those ``scripts/raster_1m.py --inputs /tmp/inputs.pt`` saves. Each pixel's
stopping pair is found by replaying the forward (``rasterize_fwd.composite_step``), then the
pairs are counted that a forward evaluates with slices of 4, 2 or 1 rows (a slice is skipped
once all its pixels stopped; a Gaussian visits the slices its rows reach, ``cull``), with
4-row slices and each Gaussian on its own rows only, and with 1-row slices and half rows
where the Gaussian's columns stay in one half; and the pixels a backward pass visits per
contributing intersection: whole 4-row or 2-row slices, or rows, from its first contributing
pixel to its last, or those rows' contributing halves. Single-threaded, ~30 s at 1 M.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
from numba import njit

from tilesplat.backends.cpu._common import tile_span
from tilesplat.backends.cpu.cull import gather_tile, max_tile_len, splat_bounds
from tilesplat.backends.cpu.rasterize_fwd import composite_step, init_tile_pixels

NAMES = ("forward, 4-row slices", "forward, 4-row slices, own rows", "forward, 2-row slices",
         "forward, 1-row slices", "forward, 1-row slices, half rows",
         "backward, 4-row slice span", "backward, 2-row slice span", "backward, row span",
         "backward, row span, half rows")


@njit(cache=True)
def count(means2d, conics, colors, opac, offs, fids, bounds, width, height, ts, max_len, out):
    """out [9, 2]: (units: slice-Gaussian visits or contributing intersections, pixels)."""
    n_img, th, tw = offs.shape
    flat = offs.reshape(n_img * th * tw)
    loc = np.empty((max_len, 6 + colors.shape[1]), np.float32)
    r_first = np.empty(max_len, np.int32)
    r_last = np.empty(max_len, np.int32)
    n_pix = ts * ts
    px = np.empty(n_pix, np.float32)
    py = np.empty(n_pix, np.float32)
    live = np.empty(n_pix, np.int32)
    stop_at = np.empty(n_pix, np.int64)
    rows = np.empty((max_len, 4), np.int64)  # contributing rows and columns: min, max
    for t in range(n_img * th * tw):
        img, ty, tx, start, end = tile_span(t, th, tw, flat, fids.shape[0])
        if end <= start:
            continue
        n = gather_tile(means2d, conics, colors, opac, fids, bounds, start, end, tx, ty, ts,
                        loc, r_first, r_last)
        init_tile_pixels(tx, ty, ts, width, height, px, py, live)
        rows[:n, 0] = n_pix
        rows[:n, 1] = -1
        rows[:n, 2] = n_pix
        rows[:n, 3] = -1
        for p in range(n_pix):
            stop_at[p] = -1 if live[p] == 0 else n - 1
            if live[p] == 0:
                continue
            tr = np.float32(1.0)
            for j in range(n):
                _, _, t_next, hit, stop = composite_step(
                    loc[j, 2], loc[j, 3], loc[j, 4], loc[j, 5], loc[j, 0] - px[p],
                    loc[j, 1] - py[p], tr, np.int32(1))
                if stop:
                    stop_at[p] = j
                    break
                if hit:
                    tr = t_next
                    rows[j, 0] = min(rows[j, 0], p // ts)
                    rows[j, 1] = max(rows[j, 1], p // ts)
                    rows[j, 2] = min(rows[j, 2], p % ts)
                    rows[j, 3] = max(rows[j, 3], p % ts)
        half = ts // 2
        x0 = tx * ts + 0.5
        for j in range(n):
            if rows[j, 1] >= 0:
                r0, r1, c0, c1 = rows[j, 0], rows[j, 1], rows[j, 2], rows[j, 3]
                out[5:, 0] += 1
                out[5, 1] += (r1 // 4 - r0 // 4 + 1) * 4 * ts
                out[6, 1] += (r1 // 2 - r0 // 2 + 1) * 2 * ts
                out[7, 1] += (r1 - r0 + 1) * ts
                out[8, 1] += (r1 - r0 + 1) * (half if (c1 < half or c0 >= half) else ts)
            if r_first[j] > r_last[j]:
                continue
            g = fids[start + j]
            lo_x = bounds[g, 0] - x0
            hi_x = bounds[g, 1] - x0
            col_lo = 0 if not lo_x > 0 else int(math.ceil(lo_x))
            col_hi = ts - 1 if not hi_x < ts - 1 else int(math.floor(hi_x))
            one_half = col_hi < half or col_lo >= half
            for rs, v in ((4, 0), (2, 2), (1, 3)):
                for u in range(r_first[j] // rs, min(r_last[j] // rs, (ts - 1) // rs) + 1):
                    alive = False
                    for p in range(u * rs * ts, min(n_pix, (u + 1) * rs * ts)):
                        alive = alive or stop_at[p] >= j
                    if not alive:
                        continue
                    out[v, 0] += 1
                    out[v, 1] += rs * ts
                    if rs == 4:
                        out[1, 0] += 1
                        out[1, 1] += (min(r_last[j], 4 * u + 3) - max(r_first[j], 4 * u) + 1) * ts
                    if rs == 1:
                        out[4, 0] += 1
                        out[4, 1] += half if one_half else ts
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("inputs", help="the rasterizer's inputs saved by scripts/raster_1m.py")
    args = p.parse_args(argv)
    d = torch.load(args.inputs)
    m2, co, cl, op = (d[k].reshape(-1, *d[k].shape[2:]).contiguous()
                      for k in ("means2d", "conics", "colors", "opacities"))
    offs, fids = d["offsets"], d["flatten_ids"]
    out = np.zeros((len(NAMES), 2), np.int64)
    count(m2.numpy(), co.numpy(), cl.numpy(), op.numpy(), offs.numpy(), fids.numpy(),
          splat_bounds(m2, co, op), d["width"], d["height"], d["tile_size"],
          max_tile_len(offs, fids.shape[0]), out)
    for name, (units, pixels) in zip(NAMES, out, strict=True):
        print(f"| {name} | {units / 1e6:.2f} M | {pixels / 1e6:.1f} M |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
