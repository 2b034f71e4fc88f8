"""``tilesplat eval``: measure a trained run on its test views."""

from __future__ import annotations

import argparse

COMMAND = "eval"
HELP = "evaluate a trained run on its test views (PSNR, SSIM, LPIPS if installed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run folder written by tilesplat train")


def run(args: argparse.Namespace) -> int:
    from ..train.loop.run import evaluate_run
    from ..train.rundir.outputs import summary

    metrics = evaluate_run(args.run_dir)
    print(summary(args.run_dir, metrics))
    print(f"metrics written to {args.run_dir}/metrics.json")
    return 0
