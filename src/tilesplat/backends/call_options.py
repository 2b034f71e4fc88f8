"""Options a single call sets for its own backward pass: ``rasterization(deterministic=)``.

The backends read their options when a kernel launches (``cuda/runtime.get_options``), and a
backward pass launches long after the call that built the graph, often on the autograd
engine's thread. So a call's option is captured by each differentiable op when its forward
runs (:func:`deterministic`) and put back around that op's backward (:func:`scope`): the
gradients of one ``rasterization(..., deterministic=True)`` use the fixed-order scheme
whatever the process-wide option is when ``backward()`` runs, and other calls keep theirs.

``None`` means "no per-call choice": the process-wide option (``set_options``, the
environment) decides, read at backward time as before.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_local = threading.local()


def deterministic() -> bool | None:
    """The per-call ``deterministic`` choice in force on this thread (``None``: none)."""
    return getattr(_local, "deterministic", None)


@contextlib.contextmanager
def scope(deterministic: bool | None) -> Iterator[None]:
    """Within the block, ``deterministic`` (unless ``None``) overrides the process option."""
    if deterministic is None:
        yield
        return
    previous = getattr(_local, "deterministic", None)
    _local.deterministic = bool(deterministic)
    try:
        yield
    finally:
        _local.deterministic = previous

