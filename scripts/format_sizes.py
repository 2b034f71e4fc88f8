"""File size, write time and load time of every splat format for the garden model
(docs/formats.md's table).

The model: the packaged garden point cloud made into Gaussians (``load_garden``: one Gaussian
per point, scales from the local density, random rotations, opacities 0.5-0.9, the points'
colours as the DC band) with SH degree 3 (``Scene.sh_coeffs(3)``: bands 1-3 small random
values, so that no format gets an all-zero SH for free). With ``--model FILE`` any splat file
or run (what ``tilesplat view`` opens) is measured instead.

Each format is written once with ``save_gaussians`` (the write time; a gsplat checkpoint with
``save_gsplat_checkpoint``), then loaded ``--repeats`` times with ``read_gaussians`` (parse,
decode, checks, float32 tensors); the median load time is printed. What each format keeps,
and the bound of every field, are in docs/formats.md and the tests.

    python scripts/format_sizes.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tilesplat.io.gaussians import FORMATS, read_gaussians, save_gaussians
from tilesplat.io.gsplat_ckpt import read_gsplat_checkpoint, save_gsplat_checkpoint


def garden_model() -> dict[str, torch.Tensor]:
    """The garden scene's Gaussians as the trainer's parameters, SH degree 3."""
    from tilesplat.data.scenes import load_garden

    scene = load_garden()
    sh = scene.sh_coeffs(3)
    return {
        "means": scene.means,
        "scales": scene.scales.log(),
        "quats": scene.quats,
        "opacities": torch.logit(scene.opacities),
        "sh0": sh[:, :1],
        "shN": sh[:, 1:],
    }


def file_bytes(path: Path) -> int:
    """Bytes of a file, or of a SOG folder (meta.json and its textures)."""
    if path.name == "meta.json":
        return sum(p.stat().st_size for p in path.parent.iterdir() if p.is_file())
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a splat file or run instead of the garden model")
    parser.add_argument("--repeats", type=int, default=3, help="loads per format (median)")
    args = parser.parse_args()
    if args.model:
        from tilesplat.cli._model import open_model

        g = open_model(args.model).gaussians
    else:
        g = garden_model()
    n, k = len(g["means"]), g["shN"].shape[1] + 1
    print(f"{n} Gaussians, SH degree {int(k ** 0.5) - 1}, torch threads "
          f"{torch.get_num_threads()}, CPUs {os.cpu_count()}")  # fmt: skip
    print("| format | file | size (MB) | bytes / Gaussian | write (s) | load (s) |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    rows = [(fmt.name, "meta.json" if suffix == "meta.json" else f"garden{suffix}",
             lambda p: save_gaussians(p, g), lambda p: read_gaussians(p).gaussians)
            for suffix, fmt in FORMATS.items()]  # fmt: skip
    rows.append(("gsplat-ckpt", "ckpts/ckpt_0_rank0.pt",
                 lambda p: save_gsplat_checkpoint(p, g),
                 lambda p: read_gsplat_checkpoint(p)[0].gaussians))  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name, file, save, load in rows:
            path = Path(tmp) / name / file
            path.parent.mkdir(parents=True)
            start = time.perf_counter()
            save(path)
            write = time.perf_counter() - start
            loads = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                back = load(path)
                loads.append(time.perf_counter() - start)
            assert back["means"].shape == g["means"].shape, name
            size = file_bytes(path)
            print(f"| {name} | `{path.name}` | {size / 1e6:.2f} | {size / n:.1f} | "
                  f"{write:.2f} | {statistics.median(loads):.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
