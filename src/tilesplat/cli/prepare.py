"""``tilesplat prepare``: a folder of photos, or a video, to a COLMAP dataset
(structure-from-motion)."""

from __future__ import annotations

import argparse

COMMAND = "prepare"
HELP = ("recover camera poses from a folder of photos or a video (pycolmap) and write a COLMAP "
        "dataset")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..data.sfm.pipeline import MATCHERS, SFM_CAMERA_MODELS
    from ..data.sfm.video import DEFAULT_FRAMES

    parser.add_argument(
        "images", metavar="IMAGES_DIR_OR_VIDEO",
        help="folder of photos (JPEG, PNG, ...), or a video file (.mp4, .mov, .mkv, ...)",
    )
    parser.add_argument(
        "out", metavar="OUT_DIR", help="new folder for the dataset (images/, sparse/0/)"
    )
    parser.add_argument(
        "--matcher",
        choices=MATCHERS,
        default=None,
        help="exhaustive: every pair (the default for photos; up to a few hundred); "
        "sequential: neighbours in name order (the default for a video; walks)",
    )
    parser.add_argument(
        "--frames",
        type=int,
        default=DEFAULT_FRAMES,
        metavar="N",
        help=f"video: keep N frames, the sharpest of each of N equal windows (default "
        f"{DEFAULT_FRAMES})",
    )
    parser.add_argument(
        "--camera-model",
        choices=SFM_CAMERA_MODELS,
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
    from pathlib import Path

    from ..data.sfm.pipeline import prepare
    from ..data.sfm.video import VIDEO_SUFFIXES, is_video, prepare_video

    options = {
        "camera_model": args.camera_model,
        "max_size": args.max_size,
        "min_registered": args.min_registered,
        "threads": args.threads,
    }
    if is_video(args.images):
        prepare_video(args.images, args.out, frames=args.frames,
                      matcher=args.matcher or "sequential", **options)
    elif Path(args.images).is_file():
        raise ValueError(f"{args.images} is a file but not a video: expected a folder of photos "
                         f"or a video ({', '.join(VIDEO_SUFFIXES)})")
    else:
        prepare(args.images, args.out, matcher=args.matcher or "exhaustive", **options)
    print(f"dataset: {args.out}  (train it: tilesplat train --data {args.out})")
    return 0
