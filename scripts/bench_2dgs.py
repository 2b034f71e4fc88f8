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
    return (m2d, M, colors, opac[None], normals), offsets, flatten_ids


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
    inputs, offsets, flatten_ids = scene(a.surfels, a.size)
    g = torch.Generator().manual_seed(1)
    shapes = (
        (a.size, a.size, 4),
        (a.size, a.size, 1),
        (a.size, a.size, 3),
        (a.size, a.size, 1),
        (a.size, a.size, 1),
    )
    ups = [torch.randn((1, *s), generator=g) for s in shapes]
    print(
        f"{a.surfels} surfels, {a.size}x{a.size}, {len(flatten_ids)} intersections, "
        f"torch threads {torch.get_num_threads()}"
    )
    _, *ref = step("torch", inputs, offsets, flatten_ids, a.size, ups)
    _, *cpu = step("cpu", inputs, offsets, flatten_ids, a.size, ups)  # compiles
    _, *exact = step("torch", [t.double() for t in inputs], offsets, flatten_ids, a.size,
                     [u.double() for u in ups])
    names = ("colors", "alphas", "normals", "distort", "median", "v_means2d", "v_ray_transforms",
             "v_colors", "v_opacities", "v_normals", "v_densify")
    failed = []
    print("parity, max |difference| (cpu vs float32 reference; each vs the float64 reference):")
    for name, c, r, e in zip(names, [*cpu[0], *cpu[1]], [*ref[0], *ref[1]],
                             [*exact[0], *exact[1]], strict=True):
        c, r, e = c.detach().double(), r.detach().double(), e.detach()
        diff, c_err, r_err = ((c - r).abs().max().item(), (c - e).abs().max().item(),
                              (r - e).abs().max().item())
        tol = 1e-5 if name[:2] != "v_" else 1e-4
        # the project's tolerance, abs or rel, or no further from float64 than the reference
        ok = bool(((c - r).abs() <= tol * (1 + r.abs())).all()) or c_err <= max(r_err, tol)
        failed += [] if ok else [name]
        print(f"  {name:17s} {diff:9.2e}   cpu {c_err:9.2e}   torch {r_err:9.2e}"
              f"   {'PASS' if ok else 'FAIL'}")
    if failed:
        raise SystemExit(f"parity gate FAILED ({', '.join(failed)}): no timing reported")
    times: dict[str, list[float]] = {"torch": [], "cpu": []}
    for _ in range(a.repeats):
        for backend in times:
            times[backend].append(step(backend, inputs, offsets, flatten_ids, a.size, ups)[0])
    med = {b: statistics.median(t) for b, t in times.items()}
    for b, t in times.items():
        print(f"{b:6s} forward+backward: median {med[b]:.3f} s of {[round(x, 3) for x in t]}")
    ratios = sorted(t / c for t, c in zip(times["torch"], times["cpu"], strict=True))
    print(f"speed-up cpu vs torch reference: {med['torch'] / med['cpu']:.1f}x (ratio of medians; "
          f"per interleaved pair {ratios[0]:.1f}x .. {ratios[-1]:.1f}x, median "
          f"{statistics.median(ratios):.1f}x)")


if __name__ == "__main__":
    main()
