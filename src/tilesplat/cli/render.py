"""``tilesplat render``: render a trained run's views to PNG files, or a flythrough along a
camera path to an mp4 and/or PNGs (``--path``; ``train/loop/flythrough.py``)."""

from __future__ import annotations

import argparse

COMMAND = "render"
HELP = ("render the test (or train, or all) views of a trained run to PNG files, or a "
        "flythrough (--path) to an mp4")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN", help="run folder written by tilesplat train")
    parser.add_argument(
        "--split",
        choices=("test", "train", "all"),
        default=None,
        help="which views (default: test)",
    )
    parser.add_argument("--out", metavar="DIR", help="output folder (default: RUN/renders/SPLIT, "
                        "with --pinhole RUN/renders/SPLIT_pinhole)")
    parser.add_argument(
        "--pinhole", action="store_true",
        help="a run trained with camera_mode = native renders through each capture's own lens; "
        "--pinhole renders through the undistorted camera instead (a pinhole; an equidistant "
        "fisheye for a lens more than 60 degrees off axis), as camera_mode = undistort loads it "
        "(docs/data.md); also for --path")
    fly = parser.add_argument_group(
        "flythrough", "a camera path computed from the training cameras (docs/training.md)"
    )
    fly.add_argument(
        "--path",
        metavar="ellipse|spiral|interp",
        help="ellipse: one turn around the scene's focus at the cameras' height; spiral: "
        "around the mean camera, for forward-facing captures; interp: through the training "
        "cameras",
    )
    fly.add_argument("--frames", type=int, default=120, help="frames of the path (default 120)")
    fly.add_argument("--mp4", metavar="FILE.mp4",
                     help='write an H.264 mp4 (pip install "tilesplat[video]")')
    fly.add_argument("--png-dir", metavar="DIR", help="write frame_NNNNN.png files here")
    fly.add_argument("--fps", type=float, default=30.0, help="mp4 frame rate (default 30)")
    fly.add_argument("--batch", type=int, default=8,
                     help="frames rendered at once (default 8)")


def run(args: argparse.Namespace) -> int:
    if args.path is None:
        if args.mp4 or args.png_dir:
            raise ValueError("--mp4 and --png-dir write a flythrough: give --path too")
        from ..train.loop.run import render_run

        folder = render_run(args.run_dir, split=args.split or "test", out_dir=args.out,
                            pinhole=args.pinhole)
        print(f"renders written to {folder}")
        return 0
    if args.split or args.out:
        raise ValueError("--path renders a flythrough: use --mp4 / --png-dir, not --split / --out")
    from ..train.loop.flythrough import render_flythrough

    fly = render_flythrough(args.run_dir, path=args.path, frames=args.frames, mp4=args.mp4,
                            png_dir=args.png_dir, fps=args.fps, batch=args.batch,
                            pinhole=args.pinhole)
    where = [str(p) for p in (fly.mp4, fly.png_dir) if p is not None]
    print(f"{fly.frames} frames of {fly.width} x {fly.height} along the {args.path} path "
          f"written to {' and '.join(where)}")
    return 0
