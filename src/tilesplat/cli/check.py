"""``tilesplat check``: validate a training config file without running anything."""

from __future__ import annotations

import argparse

COMMAND = "check"
HELP = "validate a training config (TOML) without training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.toml", help="config file to check")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="check with this key overridden (repeatable)",
    )


def run(args: argparse.Namespace) -> int:
    from ..train.config import TrainConfig
    from ..train.loop.run import checked_config
    from ..train.step.device import training_device

    cfg, layout = checked_config(args.config, args.overrides)
    default = TrainConfig().as_dict()
    changed = [name for name, value in cfg.as_dict().items() if value != default[name]]
    try:  # a valid config may ask for a GPU this machine lacks: say so, it is still valid
        device = f"{training_device(cfg)}"
    except ValueError as exc:
        device = f"none on this machine ({exc})"
    print(
        f"{args.config}: valid; data: {layout}; device: {device}; "
        f"differs from the defaults in: {', '.join(changed) or 'nothing'}"
    )
    return 0
