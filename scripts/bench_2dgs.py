"""Speed of the 2DGS rasterizer on the CPU: the ``cpu`` kernels against the torch reference,
forward + backward of ``rasterize_to_pixels_2dgs`` (every output, random upstream gradients,
absgrad on), measured in one run, interleaved, after a parity gate (no ratio on a red gate).

    .venv/bin/python scripts/bench_2dgs.py [--surfels 3000] [--size 128] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

import tilesplat


def scene(n: int, size: int, seed: int = 0):
    """n surfels in front of one pinhole camera (90 degree field of view), RGB+D colours."""
    g = torch.Generator().manual_seed(seed)
    means = (torch.rand(n, 3, generator=g) * 2 - 1) * torch.tensor([2.5, 2.5, 1.0])
    means[:, 2] += 4.0
    quats = torch.randn(n, 4, generator=g)
    scales = torch.rand(n, 3, generator=g) * 0.15 + 0.02
    opac = torch.rand(n, generator=g) * 0.8 + 0.1
    rgb = torch.rand(n, 3, generator=g)
    view = torch.eye(4)[None]
    focal = 0.5 * size / math.tan(math.pi / 4)
    K = torch.tensor([[[focal, 0, size / 2], [0, focal, size / 2], [0, 0, 1]]])
    radii, m2d, depths, M, normals = tilesplat.fully_fused_projection_2dgs(
        means, quats, scales, view, K, size, size, backend="torch"
    )
    tiles = math.ceil(size / 16)
    _, isect_ids, flatten_ids = tilesplat.isect_tiles(m2d, radii, depths, 16, tiles, tiles)
    offsets = tilesplat.isect_offset_encode(isect_ids, 1, tiles, tiles)
    colors = torch.cat([rgb[None], depths[..., None]], -1)
    raw = (means, quats, scales, opac, rgb, view, K)
    return (m2d, M, colors, opac[None], normals), offsets, flatten_ids, raw


def pipeline(backend: str, raw, size: int, ups):
    """rasterization_2dgs (projection, tiles, rasterizer; RGB+D), forward + backward."""
    leaves = [t.clone().requires_grad_() for t in raw[:5]]
    t0 = time.perf_counter()
    out = tilesplat.rasterization_2dgs(*leaves, *raw[5:], size, size, render_mode="RGB+D",
                                       backend=backend)
    images = (out[0], out[1], out[2], out[4], out[5])
    grads = torch.autograd.grad(images, leaves, grad_outputs=ups)
    return time.perf_counter() - t0, images, grads


def gate(names, cpu, ref, exact) -> None:
    """Prints each tensor's parity; exits when one fails: within the project's tolerance of
    the float32 reference (abs or rel), or no further than it from the float64 one."""
    failed = []
    print("parity, max |difference| (cpu vs float32 reference; each vs the float64 reference):")
    for name, c, r, e in zip(names, cpu, ref, exact, strict=True):
        c, r, e = c.detach().double(), r.detach().double(), e.detach().double()
        diff, c_err, r_err = ((c - r).abs().max().item(), (c - e).abs().max().item(),
                              (r - e).abs().max().item())
        tol = 1e-5 if name[:2] != "v_" else 1e-4
        ok = bool(((c - r).abs() <= tol * (1 + r.abs())).all()) or c_err <= max(r_err, tol)
        failed += [] if ok else [name]
        print(f"  {name:17s} {diff:9.2e}   cpu {c_err:9.2e}   torch {r_err:9.2e}"
              f"   {'PASS' if ok else 'FAIL'}")
    if failed:
        raise SystemExit(f"parity gate FAILED ({', '.join(failed)}): no timing reported")


def timed(label: str, run, repeats: int) -> None:
    """run(backend) -> seconds, interleaved torch / cpu; prints medians and ratios."""
    times: dict[str, list[float]] = {"torch": [], "cpu": []}
    for _ in range(repeats):
        for backend in times:
            times[backend].append(run(backend))
    med = {b: statistics.median(t) for b, t in times.items()}
    for b, t in times.items():
        print(f"{label} {b:6s} forward+backward: median {med[b]:.3f} s of "
              f"{[round(x, 3) for x in t]}")
    ratios = sorted(t / c for t, c in zip(times["torch"], times["cpu"], strict=True))
    print(f"{label} speed-up cpu vs torch reference: {med['torch'] / med['cpu']:.1f}x (ratio of "
          f"medians; per interleaved pair {ratios[0]:.1f}x .. {ratios[-1]:.1f}x, median "
          f"{statistics.median(ratios):.1f}x)")


def step(backend: str, inputs, offsets, flatten_ids, size: int, ups):
    leaves = [t.clone().requires_grad_() for t in inputs]
    densify = torch.zeros_like(inputs[0], requires_grad=True)
    t0 = time.perf_counter()
    outs = tilesplat.rasterize_to_pixels_2dgs(
        *leaves,
        densify,
        size,
        size,
        16,
        offsets,
        flatten_ids,
        backgrounds=torch.ones(1, 4, dtype=inputs[0].dtype),
        absgrad=True,
        backend=backend,
    )
    grads = torch.autograd.grad(outs, leaves + [densify], grad_outputs=ups)
    return time.perf_counter() - t0, outs, grads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--surfels", type=int, default=3000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    inputs, offsets, flatten_ids, raw = scene(a.surfels, a.size)
    g = torch.Generator().manual_seed(1)
    ups = [torch.randn((1, a.size, a.size, k), generator=g) for k in (4, 1, 3, 1, 1)]
    print(f"{a.surfels} surfels, {a.size}x{a.size}, {len(flatten_ids)} intersections, "
          f"torch threads {torch.get_num_threads()}")
    names = ("colors", "alphas", "normals", "distort", "median")
    v_names = ("v_means2d", "v_ray_transforms", "v_colors", "v_opacities", "v_normals",
               "v_densify")
    print("rasterize_to_pixels_2dgs:")
    runs = [step(b, i, offsets, flatten_ids, a.size, u) for b, i, u in
            (("torch", inputs, ups), ("cpu", inputs, ups),
             ("torch", [t.double() for t in inputs], [u.double() for u in ups]))]
    ref, cpu, exact = ([*r[1], *r[2]] for r in runs)
    gate(names + v_names, cpu, ref, exact)
    timed("raster", lambda b: step(b, inputs, offsets, flatten_ids, a.size, ups)[0], a.repeats)
    print("rasterization_2dgs (projection, tiles, rasterizer):")
    ups = [ups[0][..., :4], ups[1], ups[2], ups[3], ups[4]]
    runs = [pipeline(b, r, a.size, u) for b, r, u in
            (("torch", raw, ups), ("cpu", raw, ups),
             ("torch", [t.double() for t in raw], [u.double() for u in ups]))]
    ref, cpu, exact = ([*r[1], *r[2]] for r in runs)
    gate(names + ("v_means", "v_quats", "v_scales", "v_opacities", "v_colors"), cpu, ref, exact)
    timed("pipeline", lambda b: pipeline(b, raw, a.size, ups)[0], a.repeats)


if __name__ == "__main__":
    main()
