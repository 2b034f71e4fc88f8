#!/usr/bin/env python
"""The CPU rasterizer alone at a real size, in two checkouts alternately, outputs compared bitwise
(issue 36: the rasterizer at 1 M Gaussians).

    PYTHONPATH=src python scripts/raster_1m.py --src /tmp/rows-base/src src \\
        [--gaussians 1000000] [--resolution 1297x840] [--rounds 2] [--iters 2] [--json F]

The parent makes the rasterizer's inputs once with the checkout on its own PYTHONPATH (the
garden multiplied to ``--gaussians``, its first camera at ``--resolution``, SH degree 3:
projection, SH and the tight tile lists on the cpu backend) and a random upstream gradient, and
counts the contract's forward and backward pairs (``bench.counts``). Then ``--rounds`` rounds;
in each, a child per (checkout, scheme) in turn runs ``rasterize_to_pixels`` forward and
backward ``--iters`` times after one untimed pass, timing each launcher in process CPU time
(all threads: on a shared machine, wall time is mostly the other engineers' load) and wall
time. Every child's render and gradients are compared as integers with the first checkout's:
any differing bit fails the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from arm_args import arm_parser, child_env

OUTS = ("render_colors", "render_alphas", "v_means2d", "v_conics", "v_colors", "v_opacities")


def make_inputs(gaussians: int, resolution: str, path: str) -> dict:
    import math

    import torch

    from tilesplat.bench.counts import count_pairs
    from tilesplat.bench.scale import parse_size, scaled_scene
    from tilesplat.data.scenes import load_garden
    from tilesplat.ops import (
        fully_fused_projection,
        isect_offset_encode,
        isect_tiles_tight,
        spherical_harmonics,
    )

    sc = scaled_scene(load_garden(), gaussians, parse_size(resolution))
    W, H, ts = sc.width, sc.height, 16
    with torch.no_grad():
        radii, means2d, depths, conics, _ = fully_fused_projection(
            sc.means, None, sc.quats, sc.scales, sc.viewmats, sc.Ks, W, H, packed=False,
            opacities=sc.opacities, backend="cpu")
        campos = torch.linalg.inv(sc.viewmats)[:, :3, 3]
        dirs = sc.means[None] - campos[:, None]
        colors = spherical_harmonics(3, dirs, sc.sh_coeffs(3)[None],
                                     masks=(radii > 0).all(dim=-1), backend="cpu")
        colors = torch.clamp_min(colors + 0.5, 0.0)
        opacities = sc.opacities[None].contiguous()
        tw, th = math.ceil(W / ts), math.ceil(H / ts)
        _, isect_ids, flatten_ids = isect_tiles_tight(
            means2d, radii, depths, conics, opacities, ts, tw, th, W, H, packed=False,
            n_images=1, backend="cpu")
        offsets = isect_offset_encode(isect_ids, 1, tw, th, backend="cpu")
    g = torch.Generator().manual_seed(0)
    v_colors = torch.randn((1, H, W, 3), generator=g)
    v_alphas = torch.randn((1, H, W, 1), generator=g)
    pairs = count_pairs(means2d, conics, opacities, offsets, flatten_ids, W, H, ts)
    torch.save({"means2d": means2d, "conics": conics, "colors": colors,
                "opacities": opacities, "offsets": offsets, "flatten_ids": flatten_ids,
                "v_colors": v_colors, "v_alphas": v_alphas, "width": W, "height": H,
                "tile_size": ts}, path)
    return {"name": sc.name, "width": W, "height": H, **pairs}


def child(path: str, scheme: str, iters: int, out_path: str) -> dict:
    import torch

    from tilesplat.ops import rasterize_to_pixels

    d = torch.load(path)
    rows = []
    for i in range(iters + 1):
        leaves = [d[k].detach().clone().requires_grad_(True)
                  for k in ("means2d", "conics", "colors", "opacities")]
        t0, c0 = time.perf_counter(), time.process_time()
        rc, ra = rasterize_to_pixels(*leaves, d["width"], d["height"], d["tile_size"],
                                     d["offsets"], d["flatten_ids"], backend="cpu",
                                     backward_scheme=scheme)
        t1, c1 = time.perf_counter(), time.process_time()
        torch.autograd.backward([rc, ra], [d["v_colors"], d["v_alphas"]])
        t2, c2 = time.perf_counter(), time.process_time()
        if i:
            rows.append({"fwd": (t1 - t0) * 1e3, "bwd": (t2 - t1) * 1e3,
                         "cpu:fwd": (c1 - c0) * 1e3, "cpu:bwd": (c2 - c1) * 1e3})
    outs = [rc, ra, *(x.grad for x in leaves)]
    np.savez(out_path, **{k: v.detach().numpy() for k, v in zip(OUTS, outs, strict=True)})
    return {"rows": rows}


def same_bits(a: np.lib.npyio.NpzFile, b: np.lib.npyio.NpzFile) -> list[str]:
    """Names of the outputs whose bits differ."""
    return [k for k in OUTS
            if a[k].shape != b[k].shape or not np.array_equal(a[k].view(np.int32),
                                                              b[k].view(np.int32))]


def main(argv: list[str] | None = None) -> int:
    p = arm_parser(__doc__.split("\n\n")[0], rounds=2)
    p.add_argument("--iters", type=int, default=2)
    p.add_argument("--inputs", default=None, help="reuse (or keep) the inputs at this path")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.scheme, args.iters, args.out)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        path = args.inputs or os.path.join(tmp, "inputs.pt")
        info_path = path + ".json"
        if os.path.exists(path) and os.path.exists(info_path):
            with open(info_path) as f:
                info = json.load(f)
        else:
            info = make_inputs(args.gaussians, args.resolution, path)
            with open(info_path, "w") as f:
                json.dump(info, f)
        print(f"inputs {info}", flush=True)
        rows: dict[str, list[dict]] = {}
        bad = []
        for r in range(args.rounds):
            for scheme in args.schemes:
                for i, src in enumerate(args.src):
                    out = os.path.join(tmp, f"{i}-{scheme}.npz")
                    env = child_env(src)
                    cmd = [sys.executable, os.path.abspath(__file__), "--child", path,
                           "--scheme", scheme, "--iters", str(args.iters), "--out", out]
                    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if res.returncode:
                        print(res.stderr, file=sys.stderr)
                        return 1
                    got = json.loads(res.stdout.strip().splitlines()[-1])["rows"]
                    rows.setdefault(f"{src}|{scheme}", []).extend(got)
                    if i:
                        diff = same_bits(np.load(os.path.join(tmp, f"0-{scheme}.npz")),
                                         np.load(out))
                        if diff:
                            bad.append(f"{src} {scheme}: {diff}")
                    print(f"round {r} {scheme} {src}: "
                          + ", ".join(f"fwd {s['cpu:fwd']:.0f} bwd {s['cpu:bwd']:.0f} CPU ms"
                                      for s in got), flush=True)
    table = {}
    for arm, got in rows.items():
        table[arm] = {k: {"min": min(s[k] for s in got),
                          "median": statistics.median(s[k] for s in got)} for k in got[0]}
    print("\n| arm | fwd CPU ms min / median | bwd CPU ms min / median | fwd wall | bwd wall "
          "| M pairs/s CPU (fwd / bwd, min) |")
    print("|---|---|---|---|---|---|")
    for arm, v in table.items():
        print(f"| {arm} | {v['cpu:fwd']['min']:.0f} / {v['cpu:fwd']['median']:.0f} "
              f"| {v['cpu:bwd']['min']:.0f} / {v['cpu:bwd']['median']:.0f} "
              f"| {v['fwd']['min']:.0f} / {v['fwd']['median']:.0f} "
              f"| {v['bwd']['min']:.0f} / {v['bwd']['median']:.0f} "
              f"| {info['forward'] / v['cpu:fwd']['min'] / 1e3:.1f} / "
              f"{info['backward'] / v['cpu:bwd']['min'] / 1e3:.1f} |")
    if len(args.src) == 2:
        for scheme in args.schemes:
            a, b = (table[f"{s}|{scheme}"] for s in args.src)
            for k in ("cpu:fwd", "cpu:bwd"):
                print(f"{scheme} {k} {args.src[0]} / {args.src[1]}: "
                      f"min {a[k]['min'] / b[k]['min']:.2f}x, "
                      f"median {a[k]['median'] / b[k]['median']:.2f}x")
    print("bitwise: " + ("every output identical" if not bad else "DIFFERS: " + "; ".join(bad)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inputs": info, "rows": rows, "table": table, "differs": bad}, f,
                      indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
