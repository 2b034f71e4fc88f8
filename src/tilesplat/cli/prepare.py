"""``tilesplat prepare``: a folder of photos to a COLMAP dataset (structure-from-motion)."""

from __future__ import annotations

import argparse

COMMAND = "prepare"
HELP = "recover camera poses from a folder of photos (pycolmap) and write a COLMAP dataset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.sfm.pipeline import CAMERA_MODELS, MATCHERS

    parser.add_argument("images", metavar="IMAGES_DIR", help="folder of photos (JPEG, PNG, ...)")
    parser.add_argument(
        "out", metavar="OUT_DIR", help="new folder for the dataset (images/, sparse/0/)"
    )
    parser.add_argument(
        "--matcher",
        choices=MATCHERS,
        default="exhaustive",
        help="exhaustive: every pair (default; up to a few hundred photos); "
        "sequential: neighbours in name order (video frames, walks)",
    )
    parser.add_argument(
        "--camera-model",
        choices=CAMERA_MODELS,
        default="SIMPLE_RADIAL",
        help="lens model estimated per camera; the output is undistorted to PINHOLE "
        "(default SIMPLE_RADIAL)",
    )
    parser.add_argument(
        "--max-size",
        type=int,
        default=1600,
        metavar="PX",
        help="shrink photos to this long side first (default 1600; 0 keeps the full size)",
    )
    parser.add_argument(
        "--min-registered",
        type=float,
        default=0.5,
        metavar="FRACTION",
        help="fail when fewer photos than this fraction get a pose (default 0.5)",
    )
    parser.add_argument(
        "--threads", type=int, default=-1, help="CPU threads for pycolmap (default: all)"
    )


def run(args: argparse.Namespace) -> int:
    from ..data.sfm.pipeline import prepare

    prepare(
        args.images,
        args.out,
        matcher=args.matcher,
        camera_model=args.camera_model,
        max_size=args.max_size,
        min_registered=args.min_registered,
        threads=args.threads,
    )
    print(f"dataset: {args.out}  (train it: tilesplat train --data {args.out})")
    return 0
