"""Huge pages for PyTorch's CPU allocations in the ``tilesplat`` command: ``THP_MEM_ALLOC_ENABLE=1``
unless the user chose.

A training step allocates its large buffers afresh every step (the intersection lists and
their sort, the rasterizer's outputs and what it keeps for the backward, the gradients), and
the kernel maps each one page by page on first touch. PyTorch's CPU allocator uses 4 KiB pages
unless ``THP_MEM_ALLOC_ENABLE=1`` is in the environment at its first allocation; it then
aligns allocations of 2 MiB and more to 2 MiB and asks Linux for transparent huge pages
(``madvise``, which is what most distributions allow by default). NumPy already does so for
its own large arrays. At 1M Gaussians at 1920x1080 the bench's process took 14.9 M page
faults and 40 s of system time against 51 s of user time; with huge pages 1.1 M and 24 s,
and the training step ran 1.10x faster (docs/benchmarks.md, issue 14). On garden (136k
Gaussians at 648x420) it changes nothing measurable. Elsewhere than Linux the setting is
ignored.

Like the OpenMP wait policy (``_openmp``) it must be in the environment before torch
allocates, so ``tilesplat/__init__.py`` imports this module before anything loads torch, and
it is set only when the process is the ``tilesplat`` command. Library users set it
themselves: ``THP_MEM_ALLOC_ENABLE=1 python train.py``.
"""

from __future__ import annotations

from ._openmp import set_for_command

VARIABLE = "THP_MEM_ALLOC_ENABLE"


def apply() -> bool:
    """Sets ``THP_MEM_ALLOC_ENABLE=1`` for the tilesplat command (``_openmp.set_for_command``:
    not when torch has loaded or the user set a value); returns whether it did."""
    return set_for_command(VARIABLE, "1")


apply()
