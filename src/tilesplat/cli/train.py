"""``tilesplat train``: train a model (the built-in scene when no data is given)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..train.config import TrainConfig

COMMAND = "train"
HELP = "train a Gaussian splatting model; without --data, on the built-in synthetic scene"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data", metavar="PATH", help="dataset folder: Blender / NeRF-synthetic or COLMAP layout"
    )
    parser.add_argument(
        "--images",
        metavar="DIR",
        help="a folder of photos: recover the poses first (tilesplat prepare, into the run "
        'folder\'s data/; pip install "tilesplat[sfm]"), then train',
    )
    parser.add_argument(
        "--config", metavar="FILE.toml", help="TOML config file (keys: tilesplat train --list-keys)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (repeatable)",
    )
    parser.add_argument(
        "--resume", metavar="RUN", help="continue the run in folder RUN from its newest checkpoint"
    )
    parser.add_argument(
        "--list-keys",
        action="store_true",
        help="list every config key with its default and help, then exit",
    )


def summary(run_dir: object, metrics: dict) -> str:
    """The closing line: test PSNR first, since it is what the README promises."""
    parts = [f"{metrics['split']} PSNR {metrics['psnr']:.2f} dB", f"SSIM {metrics['ssim']:.4f}"]
    if "lpips" in metrics:
        parts.append(f"LPIPS {metrics['lpips']:.4f}")
    secs = metrics.get("train_seconds") or 0.0
    parts.append(
        f"{metrics['n_views']} views, {metrics['n_gaussians']} Gaussians, "
        f"{metrics['step']} steps in {secs:.0f} s"
    )
    return "  ".join(parts) + f"\nrun folder: {run_dir}"


def prepare_images(cfg: TrainConfig, images: str) -> TrainConfig:
    """``cfg`` training the dataset that ``tilesplat prepare`` makes of ``images`` in the run
    folder's ``data/`` (reused when a run_dir given again already holds one)."""
    from ..data.sfm import REPORT_FILE, prepare
    from ..train.config import apply_overrides
    from ..train.run import new_run_dir

    folder = Path(images).expanduser()
    named = folder.parent if folder.name.lower() == "images" else folder  # photos/images/
    run_dir = new_run_dir(apply_overrides(cfg, [f"data={named.resolve()}"]))
    data = run_dir / "data"
    if (data / REPORT_FILE).is_file():
        print(f"reusing the poses in {data}")
    else:
        prepare(folder, data)
    return apply_overrides(cfg, [f"data={data}", f"run_dir={run_dir}"])


def run(args: argparse.Namespace) -> int:
    from ..train.config import TrainConfig, apply_overrides, describe_fields, load_config
    from ..train.run import resume_run, train_run

    if args.list_keys:
        print(describe_fields())
        return 0
    if args.resume:
        if args.config or args.data or args.images:
            raise ValueError("--resume takes the run's own config; use --set to change keys")
        run_dir, metrics = resume_run(args.resume, args.overrides)
    else:
        cfg = load_config(args.config) if args.config else TrainConfig()
        if args.data:
            cfg = apply_overrides(cfg, [f"data={args.data}"])
        cfg = apply_overrides(cfg, args.overrides)
        if args.images:
            if args.data:
                raise ValueError("give --images (photos) or --data (a dataset), not both")
            cfg = prepare_images(cfg, args.images)
        run_dir, metrics = train_run(cfg)
    print(summary(run_dir, metrics))
    return 0
