"""The ``tilesplat`` command. Thin: parse arguments, build a config, call the library.

Each subcommand is a module of this package with ``COMMAND`` (its name), ``HELP`` (one
line), ``add_arguments(parser)`` and ``run(args) -> int``. Modules import heavy packages
inside ``run`` so that ``tilesplat --help`` stays fast.

Errors: what the library raises for a user's input (``ValueError`` naming the argument, key
or file; ``FileNotFoundError``; ``NotImplementedError`` for what is not built) or for a full
disk (``io.atomic.DiskFullError``, naming the file) is one line and exit status 2. Anything
else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ..io.atomic import DiskFullError
from ._exit import exit_now

# what the library raises for bad input (ops/validation.py, train/config.py, the file readers)
USER_ERRORS = (ValueError, FileNotFoundError, NotImplementedError, DiskFullError)


def _commands() -> list:
    mods = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "COMMAND"):
            mods.append(mod)
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tilesplat", description="Differentiable 3D Gaussian Splatting on CPU and GPU."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for mod in _commands():
        p = sub.add_parser(mod.COMMAND, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except USER_ERRORS as exc:
        # A user's mistake: say what was wrong without a traceback.
        print(f"tilesplat {args.command}: error: {exc}", file=sys.stderr)
        return 2


def console() -> None:
    """The ``tilesplat`` program: :func:`main`, then the process ends without the teardown of
    its modules (:func:`._exit.exit_now`)."""
    try:
        code: object = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code
    exit_now(code)


if __name__ == "__main__":
    console()
