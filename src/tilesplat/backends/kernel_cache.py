"""Numba's on-disk cache of tilesplat's CPU kernels, invalidated by the code compiled into them.

Numba keeps a compiled ``@njit(cache=True)`` function valid as long as the file defining it is
unchanged (Numba 0.68 stamps it with that file's hash). A kernel also contains code from other
files: the shared math (``backends/shared/``) and the helpers it calls are inlined, and module
constants such as ``constants.ALPHA_SKIP`` are frozen into the machine code. Without this
module an upgrade or an edit that changes only those files (``shared/compositing.py``, say)
keeps running the old kernels from the cache, silently: measured 2026-11-30, garden's forward
ran 99 ms from the stale cache against 77 ms freshly compiled.

:func:`install` puts a locator in front of Numba's own ones for the functions defined inside
the tilesplat package. It keeps Numba's cache folder (``NUMBA_CACHE_DIR`` or ``__pycache__``)
and file names, and adds to the source stamp a digest of every file whose code or constants
can end up in a kernel (:data:`COMPILED_IN`). Any change there recompiles every kernel once.
Outside tilesplat, or with a Numba whose cache internals differ, nothing changes.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../tilesplat
# Folders (every .py file below them) and files, relative to the package, that kernels compile in.
COMPILED_IN = ("backends", "constants.py", "bench/ceiling.py", "bench/counts.py")


@functools.lru_cache(maxsize=1)
def dependency_digest() -> str:
    """SHA-256 over the paths and contents of the :data:`COMPILED_IN` files (once a process)."""
    files: list[str] = []
    for entry in COMPILED_IN:
        path = os.path.join(PACKAGE, entry)
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".py")]
        elif os.path.isfile(path):
            files.append(path)
    h = hashlib.sha256()
    for path in files:
        h.update(os.path.relpath(path, PACKAGE).encode())
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _inside_package(py_file: str) -> bool:
    try:
        return os.path.commonpath([os.path.abspath(py_file), PACKAGE]) == PACKAGE
    except ValueError:  # another drive
        return False


def _with_dependencies(base: type) -> type:
    """``base`` (one of Numba's locators) for tilesplat's files, with the digest in its stamp."""

    class Locator(base):  # type: ignore[misc, valid-type]
        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if not _inside_package(py_file):
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self) -> Any:
            return (super().get_source_stamp(), dependency_digest())

    Locator.__name__ = Locator.__qualname__ = f"Tilesplat{base.__name__}"
    return Locator


@functools.lru_cache(maxsize=1)
def install() -> bool:
    """Puts the dependency-aware locators first in Numba's list (once; before any kernel of
    the package is decorated). Returns False, changing nothing, if Numba's cache internals
    are not the ones this was written for."""
    try:
        from numba.core import caching
    except ImportError:
        return False
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    names = ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
    bases = [getattr(caching, n, None) or getattr(caching, f"_{n}", None) for n in names]
    classes = getattr(impl, "_locator_classes", None)
    if not isinstance(classes, list) or any(b is None for b in bases):
        return False
    for base in reversed(bases):
        classes.insert(0, _with_dependencies(base))
    return True
