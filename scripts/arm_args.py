"""The command-line arguments shared by the scripts that time checkouts side by side at 1 M
Gaussians (``cpu_step_profile.py``, ``raster_1m.py``): the arms, the schemes, the scene's
size, the rounds, the JSON report, and the hidden ones a child process is started with."""

from __future__ import annotations

import argparse
import os


def arm_parser(description: str, rounds: int) -> argparse.ArgumentParser:
    """A parser with the shared arguments (``--rounds`` defaulting to ``rounds``); the
    script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--src", nargs="+", default=["src"], help="checkouts' src folders (arms)")
    p.add_argument("--schemes", nargs="+", default=["per_pixel", "per_splat"])
    p.add_argument("--gaussians", type=int, default=1_000_000)
    p.add_argument("--resolution", default="1297x840")
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--scheme", default=None, help=argparse.SUPPRESS)
    return p


# The environment this script started with: a checkout's tilesplat sets NUMBA_CPU_FEATURES when
# the parent loads it (backends/vector_width.py), and each arm's child must start as a user's
# process of that checkout would, not with the parent's choice.
_START_ENV = dict(os.environ)


def child_env(src: str) -> dict[str, str]:
    """The environment of an arm's child: the script's starting one, ``src`` on PYTHONPATH."""
    return dict(_START_ENV, PYTHONPATH=os.path.abspath(src))
