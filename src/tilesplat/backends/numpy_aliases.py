"""NumPy names that an installed numba-cuda still needs, restored where NumPy removed them.

numba-cuda 0.30.4 registers ``overload(np.row_stack)`` for every NumPy >= 2.0, but NumPy 2.5
removed ``row_stack`` (it was an alias of ``vstack``), so the first kernel compilation fails
with ``AttributeError: module 'numpy' has no attribute 'row_stack'``. Seen on the lent H200's
image (NumPy 2.5.2, numba 0.68.0, numba-cuda 0.30.4). The ``cuda`` backend calls
:func:`restore_numpy_aliases` before it imports ``numba.cuda``; it only adds a missing alias
and never replaces a name NumPy has.
"""

from __future__ import annotations

# (removed name, the function it was an alias of)
ALIASES = (("row_stack", "vstack"),)


def restore_numpy_aliases() -> list[str]:
    """Adds each alias of :data:`ALIASES` that NumPy lacks; returns what it added, as
    ``"np.row_stack = np.vstack"`` strings (empty when NumPy has them all)."""
    import numpy as np

    added = []
    for name, target in ALIASES:
        if not hasattr(np, name) and hasattr(np, target):
            setattr(np, name, getattr(np, target))
            added.append(f"np.{name} = np.{target}")
    return added
