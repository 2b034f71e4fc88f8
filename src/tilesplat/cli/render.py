"""``tilesplat render``: render a trained run's views to PNG files."""

from __future__ import annotations

import argparse

COMMAND = "render"
HELP = "render the test (or train, or all) views of a trained run to PNG files"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run folder written by tilesplat train")
    parser.add_argument(
        "--split",
        choices=("test", "train", "all"),
        default="test",
        help="which views (default: test)",
    )
    parser.add_argument("--out", metavar="DIR", help="output folder (default: RUN/renders/SPLIT)")


def run(args: argparse.Namespace) -> int:
    from ..train.run import render_run

    folder = render_run(args.run_dir, split=args.split, out_dir=args.out)
    print(f"renders written to {folder}")
    return 0
