"""Size of ``PngCompression``'s files for the garden model, with and without the grid sort
(docs/formats.md's PngCompression table).

The model is scripts/format_sizes.py's (the garden point cloud as Gaussians, SH degree 3),
or ``--model FILE_OR_RUN``; ``--sweeps`` sets the sort's swap sweeps per radius. For each
``use_sort`` the directory is written once (its time printed), every file's size is printed,
and it is read back to print the largest error of each attribute against the input (the
rows matched through a lossless index column).

    cd scripts && PYTHONPATH=../src python png_sizes.py
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from format_sizes import garden_model

from tilesplat.compression import PngCompression, grid_sort


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a splat file or run instead of the garden model")
    parser.add_argument("--sweeps", type=int, help="grid_sort's swap sweeps per radius "
                        f"(default {grid_sort.SWEEPS}; 0: the Morton start only)")
    args = parser.parse_args()
    if args.sweeps is not None:
        grid_sort.SWEEPS = args.sweeps
    if args.model:
        from tilesplat.cli._model import open_model

        g = open_model(args.model).gaussians
    else:
        g = garden_model()
    n = len(g["means"])
    g = {**g, "row": torch.arange(n)}  # lossless (npz): which input row each output row is
    print(f"{n} Gaussians, SH degree {int((g['shN'].shape[1] + 1) ** 0.5) - 1}")
    sizes = {}
    for use_sort in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            PngCompression(use_sort=use_sort, verbose=False).compress(tmp, g)
            took = time.perf_counter() - start
            files = {p.name: p.stat().st_size for p in sorted(Path(tmp).iterdir())}
            files.pop("row.npz")  # the index column is the measurement's, not the model's
            back = PngCompression().decompress(tmp)
        rows = back.pop("row")
        errors = {k: float((v.float() - g[k][rows].float()).abs().max()) for k, v in back.items()
                  if k != "quats"}
        sizes[use_sort] = files
        print(f"use_sort={use_sort}: {took:.1f} s, {sum(files.values()) / 1e6:.3f} MB; "
              f"max error {', '.join(f'{k} {e:.2g}' for k, e in errors.items())}")
    print("| file | use_sort=False (bytes) | use_sort=True (bytes) | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for name in sizes[False]:
        a, b = sizes[False][name], sizes[True][name]
        print(f"| `{name}` | {a} | {b} | {b / a:.2f} |")
    a, b = sum(sizes[False].values()), sum(sizes[True].values())
    print(f"| total | {a} | {b} | {b / a:.2f} |")


if __name__ == "__main__":
    main()
