"""The tight tile lists (issue 37) against gsplat's box lists, in one process: intersections per
render, and ``rasterization()`` forward + backward with either list, alternated (medians, the
ratio), after checking that the images and gradients are the same (bitwise on ``cpu``).

    OMP_WAIT_POLICY=PASSIVE PYTHONPATH=src python scripts/tight_tiles.py garden --backend cpu
    PYTHONPATH=src python scripts/tight_tiles.py run:runs/garden --backend torch --pairs 5

SCENE is a bench scene (``garden``, ``synthetic:N:WxH``) or a training run (``run:RUN_DIR``:
its Gaussians, the cameras of its next step; ``--views K`` also counts over its first K
steps' cameras).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

import torch

import tilesplat
from tilesplat.rendering._pipeline import box_tile_lists


def load(spec: str) -> tuple[Any, torch.Tensor, int, Any]:
    """(scene, SH coefficients [N, K, 3], SH degree, the run's replay or None)."""
    if spec.startswith("run:"):
        from tilesplat.bench.replay import open_run

        replay = open_run(spec)
        scene = replay.scene()
        return scene, scene.coeffs, replay.sh_degree, replay
    from tilesplat.data.scenes import load_scene

    scene = load_scene(spec)
    return scene, scene.sh_coeffs(3), 3, None


def render(scene: Any, coeffs: torch.Tensor, degree: int, viewmats: torch.Tensor,
           Ks: torch.Tensor, box: bool, scheme: str, backend: str,
           upstream: torch.Tensor | None) -> tuple[float, int, list[torch.Tensor]]:
    """(seconds, intersections, [image, gradients...]) of one render (and its backward when
    ``upstream`` is given) with the box lists or the tight ones."""
    leaves = [t.clone().requires_grad_(upstream is not None)
              for t in (scene.means, scene.quats, scene.scales, scene.opacities, coeffs)]
    t0 = time.perf_counter()
    with box_tile_lists() if box else contextlib.nullcontext():
        img, _, meta = tilesplat.rasterization(
            *leaves, viewmats, Ks, scene.width, scene.height, sh_degree=degree,
            backward_scheme=scheme, backend=backend)
    if upstream is not None:
        (img * upstream).sum().backward()
    seconds = time.perf_counter() - t0
    return seconds, int(meta["isect_ids"].numel()), [img.detach()] + [
        t.grad for t in leaves if t.grad is not None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scene")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--pairs", type=int, default=15, help="timed (box, tight) pairs per scheme")
    ap.add_argument("--views", type=int, default=0, help="run scenes: count over K steps")
    args = ap.parse_args()
    scene, coeffs, degree, replay = load(args.scene)
    if replay is not None and args.views:
        counts = {True: 0, False: 0}
        with torch.no_grad():
            for i in range(args.views):
                b = replay.batch(i, "cpu")
                for box in counts:
                    counts[box] += render(scene, coeffs, degree, b.viewmats, b.Ks, box,
                                          "per_pixel", args.backend, None)[1]
        print(f"{args.scene}: {args.views} renders, intersections per render: box "
              f"{counts[True] / args.views:,.0f}, tight {counts[False] / args.views:,.0f} "
              f"({counts[False] / counts[True]:.3f})")
    g = torch.Generator().manual_seed(0)
    upstream = torch.randn(scene.viewmats.shape[0], scene.height, scene.width, 3, generator=g)
    for scheme in ("per_pixel", "per_splat"):
        run = {box: render(scene, coeffs, degree, scene.viewmats, scene.Ks, box, scheme,
                           args.backend, upstream) for box in (True, False)}  # and compile
        same = all(torch.equal(a, b) for a, b in zip(run[True][2], run[False][2], strict=True))
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.pairs):
            for box in (True, False):
                times[box].append(render(scene, coeffs, degree, scene.viewmats, scene.Ks, box,
                                         scheme, args.backend, upstream)[0])
        box_ms, tight_ms = (statistics.median(times[k]) * 1e3 for k in (True, False))
        print(f"{args.scene} {args.backend}:{scheme}: intersections box {run[True][1]:,}, "
              f"tight {run[False][1]:,} ({run[False][1] / run[True][1]:.3f}); render+backward "
              f"box {box_ms:,.0f} ms, tight {tight_ms:,.0f} ms, box/tight "
              f"{box_ms / tight_ms:.3f} ({args.pairs} pairs); images and gradients bitwise "
              f"equal: {same}")


if __name__ == "__main__":
    main()
