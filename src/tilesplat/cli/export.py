"""``tilesplat export``: write a model as PLY (3DGS layout), ``.splat`` or ``.spz`` files.

The input is a run folder, a checkpoint or a splat file, so export also converts between
formats (``tilesplat export model.ply --spz model.spz``).
"""

from __future__ import annotations

import argparse

COMMAND = "export"
HELP = "export a run, checkpoint or splat file as .ply (3DGS layout), .splat or .spz"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        metavar="RUN_OR_FILE",
        help="run folder, checkpoint (.pt) or splat file (.ply, .splat, .spz)",
    )
    parser.add_argument("--ply", metavar="OUT", help="write a PLY in the original 3DGS layout")
    parser.add_argument(
        "--splat", metavar="OUT", help="write an antimatter15 .splat (base colour only)"
    )
    parser.add_argument(
        "--spz", metavar="OUT", help="write a Niantic .spz (version 3, gzip, ~10x smaller)"
    )


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..io.gaussians import ARRAY_NAMES
    from ..io.ply import save_ply
    from ..io.splat import save_splat
    from ..io.spz import save_spz
    from ._model import open_model

    outputs = [(flag, getattr(args, flag)) for flag in ("ply", "splat", "spz")]
    outputs = [(flag, Path(out)) for flag, out in outputs if out]
    if not outputs:
        raise ValueError("give at least one output: --ply OUT, --splat OUT or --spz OUT")
    for flag, out in outputs:
        if out.suffix.lower() != f".{flag}":
            raise ValueError(f"--{flag} {out}: the file name must end in .{flag}")
        if not out.parent.is_dir():
            raise FileNotFoundError(f"--{flag} {out}: folder {out.parent} does not exist")
    model = open_model(args.source)
    arrays = [model.gaussians[k] for k in ARRAY_NAMES]
    n = len(model.gaussians["means"])
    for flag, out in outputs:
        if flag == "ply":
            save_ply(out, *arrays)
        elif flag == "splat":
            save_splat(out, *arrays)
        else:
            save_spz(out, *arrays, antialiased=model.antialiased)
        print(f"{n} Gaussians from {model.source} written to {out}")
    return 0
