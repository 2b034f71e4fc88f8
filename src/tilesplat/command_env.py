"""The ``tilesplat`` command's environment defaults, set before torch loads: OpenMP's wait policy
``PASSIVE`` and huge pages for torch's CPU allocations (``THP_MEM_ALLOC_ENABLE=1``), each only
when the user chose no value.

Both are read once, when torch loads (the OpenMP runtime with it) or first allocates, so they
must be in the environment before ``import torch``: ``tilesplat/__init__.py`` imports this
module first. It uses only the standard library and changes the environment only when the
process is the ``tilesplat`` command (``tilesplat ...`` or ``python -m tilesplat.cli ...``);
library users set the variables themselves, before torch loads:
``OMP_WAIT_POLICY=PASSIVE THP_MEM_ALLOC_ENABLE=1 python train.py``. Child processes
(``--nproc``) inherit them.

- **Wait policy.** PyTorch's OpenMP workers (libgomp) spin for a while after every parallel
  region before they sleep. On a CPU the trainer alternates short torch ops (Adam, the losses,
  autograd's glue) with the CPU backend's own kernel threads, so the spinning workers take the
  cores those kernels need: the built-in scene trained 1.17x faster with
  ``OMP_WAIT_POLICY=PASSIVE`` on a quiet 2-core machine, and far faster on a loaded one
  (docs/benchmarks.md, issue 14).
- **Huge pages.** A training step allocates its large buffers afresh every step (the
  intersection lists and their sort, the rasterizer's outputs and what it keeps for the
  backward, the gradients), and the kernel maps each one page by page on first touch.
  PyTorch's CPU allocator uses 4 KiB pages unless ``THP_MEM_ALLOC_ENABLE=1`` is in the
  environment at its first allocation; it then aligns allocations of 2 MiB and more to 2 MiB
  and asks Linux for transparent huge pages (``madvise``, which is what most distributions
  allow by default). NumPy already does so for its own large arrays. At 1M Gaussians at
  1920x1080 the bench's process took 14.9 M page faults and 40 s of system time against 51 s
  of user time; with huge pages 1.1 M and 24 s, and the training step ran 1.10x faster
  (docs/benchmarks.md, issue 14). On garden (136k Gaussians at 648x420) it changes nothing
  measurable. Elsewhere than Linux the setting is ignored.
"""

from __future__ import annotations

import os
import sys

# variable -> the command's default
DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "THP_MEM_ALLOC_ENABLE": "1"}
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


def apply() -> list[str]:
    """Sets every default of :data:`DEFAULTS` that :func:`set_for_command` allows; returns
    the names it set."""
    return [name for name, value in DEFAULTS.items() if set_for_command(name, value)]


apply()
