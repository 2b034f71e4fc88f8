"""``tilesplat eval``: measure a trained run on its test views."""

from __future__ import annotations

import argparse

COMMAND = "eval"
HELP = "evaluate a trained run on its test views (PSNR, SSIM, LPIPS if installed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run folder written by tilesplat train")
    parser.add_argument(
        "--pinhole", action="store_true",
        help="a run trained with camera_mode = native is scored through each capture's own lens "
        "(the full image); --pinhole scores it through the undistorted cameras against the "
        "undistorted images instead, as camera_mode = undistort loads them, into "
        "RUN/metrics_pinhole.json (metrics.json is kept; docs/data.md)")


def run(args: argparse.Namespace) -> int:
    from ..train.rundir.outputs import summary

    if args.pinhole:
        from ..train.loop.lens_view import METRICS_FILE, evaluate_pinhole

        metrics, name = evaluate_pinhole(args.run_dir), METRICS_FILE
    else:
        from ..train.loop.run import evaluate_run

        metrics, name = evaluate_run(args.run_dir), "metrics.json"
    print(summary(args.run_dir, metrics))
    print(f"metrics written to {args.run_dir}/{name}")
    return 0
