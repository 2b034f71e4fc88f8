"""``tilesplat export``: write a model in any splat format of :mod:`tilesplat.io.gaussians`.

The input is a run folder, a checkpoint (tilesplat's or gsplat's) or a splat file, so export
also converts between formats (``tilesplat export model.ply --to spz``). ``--to FORMAT``
with ``--out`` (default: the source's name with the format's ending), or the shorthands
``--ply OUT``, ``--splat OUT``, ``--spz OUT``.
"""

from __future__ import annotations

import argparse

COMMAND = "export"
HELP = ("export a run, checkpoint or splat file as .ply, .compressed.ply, .splat, .spz, .sog, "
        "meta.json (SOG folder), .glb or a gsplat checkpoint")  # fmt: skip
GSPLAT = "gsplat-ckpt"  # a checkpoint gsplat's simple_trainer.py --ckpt loads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..io.gaussians import BY_NAME

    names = [*BY_NAME, GSPLAT]
    parser.add_argument(
        "source",
        metavar="RUN_OR_FILE",
        help="run folder, checkpoint (.pt, tilesplat's or gsplat's) or splat file",
    )
    parser.add_argument(
        "--to",
        action="append",
        default=[],
        choices=names,
        metavar="FORMAT",
        help="write this format (repeatable): " + ", ".join(names) + "; docs/formats.md "
        "says what each keeps",
    )
    parser.add_argument(
        "--out",
        action="append",
        default=[],
        metavar="PATH",
        help="where each --to goes, in order (default: the source's name with the format's "
        "ending, beside it; sog-folder: NAME_sog/meta.json)",
    )
    parser.add_argument("--ply", metavar="OUT", help="write a PLY in the original 3DGS layout")
    parser.add_argument(
        "--splat", metavar="OUT", help="write an antimatter15 .splat (base colour only)"
    )
    parser.add_argument("--spz", metavar="OUT", help="write a Niantic .spz (~10x smaller)")
    parser.add_argument(
        "--spz-version",
        type=int,
        choices=(2, 3, 4),
        default=4,
        help="SPZ version to write (default 4, zstd; 3 and 2 are gzip, for older readers)",
    )


def _default_out(source, suffix: str):
    from pathlib import Path

    from ..io.gaussians import suffix_of

    src = Path(source)
    if src.is_dir():
        base = src / src.resolve().name
    else:
        ending = suffix_of(src) or src.suffix
        base = src.with_name(src.name[: len(src.name) - len(ending)])
    if suffix == "meta.json":
        return base.with_name(base.name + "_sog") / "meta.json"
    return base.with_name(base.name + suffix)


def outputs(args: argparse.Namespace) -> list[tuple[str, object]]:
    """[(format name, output path)] of the command line, checked before any work."""
    from pathlib import Path

    from ..io.gaussians import BY_NAME, suffix_of

    if len(args.out) > len(args.to):
        raise ValueError(f"{len(args.out)} --out for {len(args.to)} --to; give one per --to")
    wanted = [(name, Path(args.out[i]) if i < len(args.out) else None)
              for i, name in enumerate(args.to)]  # fmt: skip
    wanted += [(flag, Path(getattr(args, flag))) for flag in ("ply", "splat", "spz")
               if getattr(args, flag)]  # fmt: skip
    if not wanted:
        raise ValueError("give an output: --to FORMAT [--out PATH], or --ply/--splat/--spz OUT")
    out = []
    for name, path in wanted:
        suffix = ".pt" if name == GSPLAT else BY_NAME[name]
        if path is None:
            path = _default_out(args.source, suffix)
        got = ".pt" if path.name.lower().endswith(".pt") else suffix_of(path)
        if got != suffix:
            raise ValueError(f"{name} output {path}: the file name must end in {suffix}")
        if path.resolve() == Path(args.source).resolve():
            raise ValueError(f"{path}: the output would overwrite the source")
        folder = path.parent
        if not folder.is_dir() and not (suffix == "meta.json" and folder.parent.is_dir()):
            raise FileNotFoundError(f"{name} output {path}: folder {folder} does not exist")
        out.append((name, path))
    return out


def run(args: argparse.Namespace) -> int:
    from ..io.gaussians import BY_NAME, FORMATS
    from ..io.gsplat_ckpt import save_gsplat_checkpoint
    from ._model import open_model

    targets = outputs(args)
    model = open_model(args.source)
    for note in model.notes:
        print(f"note: {note}")
    n = len(model.gaussians["means"])
    for name, out in targets:
        if name == GSPLAT:
            save_gsplat_checkpoint(out, model.gaussians)
        else:
            out.parent.mkdir(exist_ok=True)  # a SOG folder
            options = {"version": args.spz_version} if name == "spz" else {}
            FORMATS[BY_NAME[name]].save(out, model.gaussians, model.antialiased, **options)
        print(f"{n} Gaussians from {model.source} written to {out}")
    return 0
