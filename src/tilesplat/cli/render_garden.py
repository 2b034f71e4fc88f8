"""``tilesplat render-garden``: render the bundled Mip-NeRF 360 garden scene to PNG files."""

from __future__ import annotations

import argparse

COMMAND = "render-garden"
HELP = "Render the bundled garden scene (real point cloud, 3 cameras) to PNG files."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="renders/garden", help="output folder (created)")
    p.add_argument("--backend", default="auto", choices=["auto", "torch", "cpu", "cuda"],
                   help="rendering backend (default: auto)")
    p.add_argument("--max-points", type=int, default=None,
                   help="use an evenly spaced subset of at most this many points")
    p.add_argument("--cameras", type=int, nargs="*", default=None,
                   help="camera indices to render (default: all 3)")


def run(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    import torch

    from ..data.scenes import load_garden
    from ..io.images import write_png
    from ..rendering import rasterization

    scene = load_garden(max_points=args.max_points)
    cams = list(range(scene.viewmats.shape[0])) if args.cameras is None else args.cameras
    n_cams = scene.viewmats.shape[0]
    for c in cams:
        if not 0 <= c < n_cams:
            raise ValueError(f"--cameras: expected indices in [0, {n_cams}), got {c}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with torch.no_grad():
        colors, alphas, _ = rasterization(
            scene.means, scene.quats, scene.scales, scene.opacities, scene.colors,
            scene.viewmats[cams], scene.Ks[cams], scene.width, scene.height,
            backend=args.backend,
        )
    seconds = time.perf_counter() - start
    for i, c in enumerate(cams):
        path = write_png(out / f"garden_cam{c}.png", colors[i])
        print(f"wrote {path} ({scene.width}x{scene.height}, mean alpha "
              f"{float(alphas[i].mean()):.3f})")
    print(f"{scene.num_gaussians} Gaussians, {len(cams)} cameras rendered in {seconds:.2f} s")
    return 0
