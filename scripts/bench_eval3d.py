"""Cost of 3DGUT's eval3d rasterizer on the CPU against the 2D rasterizer: forward + backward
of ``rasterize_to_pixels_eval3d`` and of ``rasterize_to_pixels`` on the ``cpu`` backend, one
scene, one pinhole camera, both on the box tile lists of their own projection
(``fully_fused_projection_with_ut`` and ``fully_fused_projection``, ``isect_tiles``),
measured in one run, interleaved; ratios per call and per intersection; then the
projections (``fully_fused_projection_with_ut`` on cpu and on the reference,
``fully_fused_projection`` on cpu). A parity gate of the
eval3d kernels against the torch reference runs first (``--gate-gaussians``, a smaller scene:
the reference holds a tile's pixels x Gaussians in memory); no ratio on a red gate.

    .venv/bin/python scripts/bench_eval3d.py [--gaussians 1000 10000] [--size 320x240]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch

import tilesplat

TILE = 16


def scene(n: int, width: int, height: int, seed: int = 0):
    """n Gaussians in front of one pinhole camera (about 70 degrees across)."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([2.5, 1.9, 1.0])
    means[:, 2] += 4.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.08 + 0.01
    opac = torch.rand(n, generator=g) * 0.8 + 0.1
    rgb = torch.rand(n, 3, generator=g)
    view = torch.eye(4)[None]
    focal = 0.7 * width
    K = torch.tensor([[[focal, 0, width / 2], [0, focal, height / 2], [0, 0, 1]]])
    return means, quats, scales, opac, rgb, view, K


def lists(radii, m2d, depths, width, height):
    tw, th = math.ceil(width / TILE), math.ceil(height / TILE)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, TILE, tw, th,
                                                      backend="torch")
    return tilesplat.isect_offset_encode(isect_ids, 1, tw, th, backend="torch"), flatten_ids


def eval3d_inputs(raw, width, height):
    means, quats, scales, opac, rgb, view, K = raw
    radii, m2d, depths, _, _ = tilesplat.fully_fused_projection_with_ut(
        means, quats, scales, opac, view, K, width, height, backend="torch")
    offsets, flatten_ids = lists(radii, m2d, depths, width, height)
    leaves = (means, quats, scales, rgb[None], opac[None])
    return leaves, (view, K, width, height, TILE, offsets, flatten_ids)


def twod_inputs(raw, width, height):
    means, quats, scales, opac, rgb, view, K = raw
    radii, m2d, depths, conics, _ = tilesplat.fully_fused_projection(
        means, None, quats, scales, view, K, width, height, backend="torch")
    offsets, flatten_ids = lists(radii, m2d, depths, width, height)
    leaves = (m2d, conics, rgb[None].expand(1, -1, -1).contiguous(), opac[None])
    return leaves, (width, height, TILE, offsets, flatten_ids)


def run_eval3d(backend, inputs, bg, ups):
    leaves = [t.clone().requires_grad_() for t in inputs[0]]
    t0 = time.perf_counter()
    out = tilesplat.rasterize_to_pixels_eval3d(*leaves, *inputs[1], backgrounds=bg,
                                               backend=backend)
    grads = torch.autograd.grad(out, leaves, grad_outputs=ups)
    return time.perf_counter() - t0, [*out, *grads]


def run_2d(inputs, bg, ups):
    leaves = [t.clone().requires_grad_() for t in inputs[0]]
    t0 = time.perf_counter()
    out = tilesplat.rasterize_to_pixels(*leaves, *inputs[1], backgrounds=bg, backend="cpu")
    grads = torch.autograd.grad(out, leaves, grad_outputs=ups)
    return time.perf_counter() - t0, [*out, *grads]


def upstream(width, height, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, height, width, 3, generator=g),
            torch.randn(1, height, width, 1, generator=g))


def gate(n, width, height) -> bool:
    """eval3d cpu against the torch reference: every output and gradient within 1e-4 (abs
    or rel) of it, or no further than it from the float64 reference."""
    raw = scene(n, width, height, seed=1)
    inputs = eval3d_inputs(raw, width, height)
    ups = upstream(width, height)
    bg = torch.full((1, 3), 0.25)
    _, cpu = run_eval3d("cpu", inputs, bg, ups)
    _, ref = run_eval3d("torch", inputs, bg, ups)
    exact_inputs = ([t.double() for t in inputs[0]],
                    (inputs[1][0].double(), inputs[1][1].double(), *inputs[1][2:]))
    _, exact = run_eval3d("torch", exact_inputs, bg.double(),
                          tuple(u.double() for u in ups))
    names = ["colors", "alphas", "v_means", "v_quats", "v_scales", "v_colors", "v_opacities"]
    ok = True
    print(f"parity gate ({n} Gaussians, {width}x{height}): max |cpu - ref|, |cpu - f64|, "
          "|ref - f64|")
    for name, c, r, e in zip(names, cpu, ref, exact, strict=True):
        c, r, e = c.detach().double(), r.detach().double(), e.detach().double()
        d = (c - r).abs()
        close = bool(((d <= 1e-4) | (d <= 1e-4 * r.abs())).all())
        near = float((c - e).abs().max()) <= 2 * float((r - e).abs().max())
        ok &= close or near
        print(f"  {name:12s} {float(d.max()):.3g}  {float((c - e).abs().max()):.3g}  "
              f"{float((r - e).abs().max()):.3g}  {'PASS' if close or near else 'FAIL'}")
    return ok


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gaussians", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--size", default="320x240", help="WxH")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--gate-gaussians", type=int, default=300)
    args = p.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    if not gate(args.gate_gaussians, width, height):
        sys.exit("parity gate failed: no ratios")
    bg = torch.full((1, 3), 0.25)
    ups = upstream(width, height)
    for n in args.gaussians:
        raw = scene(n, width, height)
        ev, tw = eval3d_inputs(raw, width, height), twod_inputs(raw, width, height)
        run_eval3d("cpu", ev, bg, ups)  # warm-up (compilation)
        run_2d(tw, bg, ups)
        t_ev, t_2d = [], []
        for _ in range(args.repeats):  # interleaved
            t_ev.append(run_eval3d("cpu", ev, bg, ups)[0])
            t_2d.append(run_2d(tw, bg, ups)[0])
        ratios = sorted(a / b for a, b in zip(t_ev, t_2d, strict=True))
        n_ev, n_2d = ev[1][-1].numel(), tw[1][-1].numel()
        m_ev, m_2d = statistics.median(t_ev), statistics.median(t_2d)
        print(f"{n} Gaussians, {width}x{height}, {args.repeats} repeats, "
              f"{torch.get_num_threads()} torch threads:")
        print(f"  eval3d cpu fwd+bwd median {m_ev * 1e3:.1f} ms ({n_ev} intersections), "
              f"2D cpu {m_2d * 1e3:.1f} ms ({n_2d} intersections)")
        print(f"  eval3d / 2D: {statistics.median(ratios):.2f}x per call "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f}), "
              f"{m_ev / n_ev / (m_2d / n_2d):.2f}x per intersection")
        projection(raw, width, height, args.repeats)


def projection(raw, width, height, repeats) -> None:
    """fully_fused_projection_with_ut on cpu and on the reference, fully_fused_projection on
    cpu (the 3DGS projection with its backward's inputs), interleaved."""
    means, quats, scales, opac, _, view, K = raw
    calls = {
        "ut cpu": lambda: tilesplat.fully_fused_projection_with_ut(
            means, quats, scales, opac, view, K, width, height, backend="cpu"),
        "ut torch": lambda: tilesplat.fully_fused_projection_with_ut(
            means, quats, scales, opac, view, K, width, height, backend="torch"),
        "3DGS cpu": lambda: tilesplat.fully_fused_projection(
            means, None, quats, scales, view, K, width, height, backend="cpu"),
    }
    times: dict[str, list[float]] = {k: [] for k in calls}
    for call in calls.values():
        call()  # warm-up (compilation)
    for _ in range(repeats):
        for name, call in calls.items():
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"  projection: ut cpu {med['ut cpu'] * 1e3:.2f} ms, ut torch "
          f"{med['ut torch'] * 1e3:.2f} ms ({med['ut torch'] / med['ut cpu']:.1f}x), "
          f"3DGS cpu {med['3DGS cpu'] * 1e3:.2f} ms (ut cpu / 3DGS cpu "
          f"{med['ut cpu'] / med['3DGS cpu']:.2f}x)")


if __name__ == "__main__":
    main()
