"""``tilesplat export``: write a trained run as a PLY file other splat viewers open."""

from __future__ import annotations

import argparse

COMMAND = "export"
HELP = "export a trained run as a PLY file in the original 3DGS layout"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run folder written by tilesplat train")
    parser.add_argument("--ply", metavar="OUT", required=True, help="output .ply file")


def run(args: argparse.Namespace) -> int:
    from ..train.run import export_ply, load_run

    _, params, ckpt = load_run(args.run_dir)
    path = export_ply(params, args.ply)
    print(f"{len(params['means'])} Gaussians (step {int(ckpt['step'])}) written to {path}")
    return 0
