"""OpenMP's wait policy for the ``tilesplat`` command: ``PASSIVE`` unless the user chose one.

PyTorch's OpenMP workers (libgomp) spin for a while after every parallel region before they
sleep. On a CPU the trainer alternates short torch ops (Adam, the losses, autograd's glue)
with the CPU backend's own kernel threads, so the spinning workers take the cores those
kernels need: the built-in scene trained 1.17x faster with ``OMP_WAIT_POLICY=PASSIVE`` on a
quiet 2-core machine, and far faster on a loaded one (docs/benchmarks.md, issue 14). The
policy is read once, when the OpenMP runtime loads with torch, so it must be in the
environment before ``import torch``: ``tilesplat/__init__.py`` imports this module first, and
it sets the policy when the process is the ``tilesplat`` command (``tilesplat ...`` or
``python -m tilesplat.cli ...``). Library users set it themselves, before torch loads:
``OMP_WAIT_POLICY=PASSIVE python train.py``. Child processes (``--nproc``) inherit it.
"""

from __future__ import annotations

import os
import sys

POLICY = "PASSIVE"
_FLAGS_WITH_VALUE = ("-X", "-W", "-Q")


def is_tilesplat_command(argv: list[str]) -> bool:
    """True when the interpreter's command line ``argv`` (``sys.orig_argv``) runs the
    ``tilesplat`` console script or ``-m tilesplat.cli``."""
    args = argv[1:]
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m":
            return i + 1 < len(args) and args[i + 1] in ("tilesplat.cli", "tilesplat")
        if a == "-c":
            return False
        if a in _FLAGS_WITH_VALUE:
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        name = os.path.basename(a)
        return name in ("tilesplat", "tilesplat.exe", "tilesplat-script.py")
    return False


def set_for_command(name: str, value: str) -> bool:
    """Sets the environment variable ``name`` to ``value`` when the process is the tilesplat
    command, torch has not loaded and the user set no value; returns whether it did."""
    if name in os.environ or "torch" in sys.modules:
        return False
    if not is_tilesplat_command(list(getattr(sys, "orig_argv", sys.argv))):
        return False
    os.environ[name] = value
    return True


def apply() -> bool:
    """Sets ``OMP_WAIT_POLICY=PASSIVE`` for the tilesplat command (:func:`set_for_command`)."""
    return set_for_command("OMP_WAIT_POLICY", POLICY)


apply()
