"""``tilesplat train``: train a model (the built-in scene when no data is given)."""

from __future__ import annotations

import argparse
import gc
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
        "--init",
        metavar="FILE",
        help="start from the Gaussians of FILE: any splat file (docs/formats.md) or a gsplat "
        "checkpoint (ckpts/ckpt_N_rank0.pt or its result folder); sets init_file",
    )
    parser.add_argument(
        "--nproc",
        nargs="?",
        const="gpus",
        default="1",
        metavar="N",
        help="train in N local processes (parallel = data unless the config says model): on "
        "GPUs one per rank over NCCL (--nproc alone: one per visible GPU), on CPUs over gloo "
        "on 127.0.0.1; under torchrun the job's ranks are used instead (docs/distributed.md)",
    )
    parser.add_argument(
        "--list-keys",
        action="store_true",
        help="list every config key with its default and help, then exit",
    )


def prepare_images(cfg: TrainConfig, images: str) -> TrainConfig:
    """``cfg`` training the dataset that ``tilesplat prepare`` makes of ``images`` in the run
    folder's ``data/`` (reused when a run_dir given again already holds one)."""
    from ..data.sfm import REPORT_FILE, prepare
    from ..train.config import apply_overrides
    from ..train.loop.run import new_run_dir

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
    from ..train.config import TrainConfig, apply_overrides, describe_keys, load_config
    from ..train.loop.launch import torchrun_world, train_job

    if args.list_keys:
        print(describe_keys())
        return 0
    nproc = None if args.nproc == "gpus" else _nproc(args.nproc)
    if args.resume:
        if args.config or args.data or args.images or args.init:
            raise ValueError("--resume takes the run's own config; use --set to change keys")
        job = (None, args.resume, list(args.overrides))
    else:
        cfg = load_config(args.config) if args.config else TrainConfig()
        if args.data:
            cfg = apply_overrides(cfg, [f"data={args.data}"])
        cfg = apply_overrides(cfg, args.overrides)
        if args.init:
            init = Path(args.init).expanduser()
            if not init.exists():
                raise FileNotFoundError(f"--init {args.init}: no such file or folder")
            cfg = apply_overrides(cfg, [f"init_file={init.resolve()}"])
        if args.images:
            if args.data:
                raise ValueError("give --images (photos) or --data (a dataset), not both")
            if torchrun_world() > 1:  # every rank would run SfM into one folder
                raise ValueError("--images under torchrun: run tilesplat prepare IMAGES OUT "
                                 "once, then train --data OUT")
            cfg = prepare_images(cfg, args.images)
        if nproc != 1 or torchrun_world() > 1:
            from ..train.parallel import for_ranks

            cfg = for_ranks(cfg)
        from ..train.step.device import training_device

        training_device(cfg)  # a device this machine cannot give fails before any work
        job = (cfg, None, [])
    # the ~220,000 objects the imports made (torch's, Numba's) live as long as the process:
    # moved out of the collector's reach for the run, its full collections (five in a fast
    # run on the built-in scene, one of them freeing the trainer before the evaluation) walk
    # only what came after: 0.17-0.22 s in all instead of 0.40. A caller's process (a test
    # calling the CLI in-process) gets them back afterwards
    gc.freeze()
    try:
        train_job(job, nproc)
    finally:
        gc.unfreeze()
    return 0


def _nproc(text: str) -> int:
    """``--nproc N``: an integer >= 1."""
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"--nproc must be an integer >= 1 (or given alone: one rank per "
                         f"GPU), got {text!r}")
    return int(text)
